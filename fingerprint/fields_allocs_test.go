package fingerprint

import (
	"net/http"
	"testing"
)

// TestSumRequestFieldsAllocs: the field sums cost no allocation beyond
// SumRequest's.
func TestSumRequestFieldsAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector drops pooled buffers on purpose")
	}
	spec := Spec{Fields: []string{"/prompt", "/n"}}
	body := []byte(`{"prompt":"a lighthouse","n":1}`)
	r, _ := http.NewRequest(http.MethodPost, "/", nil)
	r.Header.Set("Content-Type", "application/json")
	dst := make([]FieldSum, 0, 2)
	allocs := testing.AllocsPerRun(100, func() {
		if _, _, err := spec.SumRequestFields(r, body, dst[:0]); err != nil {
			t.Fatal(err)
		}
	})
	plain := testing.AllocsPerRun(100, func() {
		if _, err := spec.SumRequest(r, body); err != nil {
			t.Fatal(err)
		}
	})
	if allocs > plain {
		t.Errorf("SumRequestFields allocates %.0f times, SumRequest %.0f: the sums must cost no allocation", allocs, plain)
	}
}
