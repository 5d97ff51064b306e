package fingerprint

import (
	"encoding/json"
	"flag"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/golden.json from the current code (never for a released version)")

// A goldenCase pins the fingerprint of one request. The v1 algorithm must
// never change: a changed fingerprint turns every stored key into a
// conflict. A new algorithm is a new version prefix and new golden cases.
type goldenCase struct {
	Name        string `json:"name"`
	Spec        Spec   `json:"spec"`
	ContentType string `json:"content_type"`
	// ContentEncoding, when set, is sent as the Content-Encoding header.
	ContentEncoding string `json:"content_encoding,omitempty"`
	Body            string `json:"body"`
	Fingerprint     string `json:"fingerprint"`
}

func TestGolden(t *testing.T) {
	t.Parallel()
	path := filepath.Join("testdata", "golden.json")
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var cases []goldenCase
	if err := json.Unmarshal(raw, &cases); err != nil {
		t.Fatal(err)
	}
	if len(cases) == 0 {
		t.Fatal("no golden cases")
	}
	for i, c := range cases {
		r := httptest.NewRequest("POST", "/", nil)
		if c.ContentType != "" {
			r.Header.Set("Content-Type", c.ContentType)
		}
		if c.ContentEncoding != "" {
			r.Header.Set("Content-Encoding", c.ContentEncoding)
		}
		got, err := c.Spec.SumRequest(r, []byte(c.Body))
		if err != nil {
			t.Errorf("%s: %v", c.Name, err)
			continue
		}
		if *update {
			cases[i].Fingerprint = string(got)
			continue
		}
		if string(got) != c.Fingerprint {
			t.Errorf("%s: fingerprint %s, golden %s: the v1 algorithm changed", c.Name, got, c.Fingerprint)
		}
	}
	if *update {
		out, err := json.MarshalIndent(cases, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, append(out, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
