package fingerprint

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
)

// worstSize is the size of the adversarial bodies: the middleware's
// default MaxBodyBytes.
const worstSize = 1 << 20

// worstBodies are bodies of about size bytes shaped to make a
// fingerprint expensive: one huge number, deep nesting, many members,
// long escaped strings. Each is valid JSON.
func worstBodies(size int) []struct {
	name string
	body []byte
} {
	digits := func(n int) string { return strings.Repeat("9", n) }
	fillf := func(open string, unit func(i int) string, close string) []byte {
		var b strings.Builder
		b.WriteString(open)
		for i := 0; b.Len() < size-len(close)-len(unit(i)); i++ {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(unit(i))
		}
		b.WriteString(close)
		return []byte(b.String())
	}
	fill := func(open, unit, close string) []byte {
		return fillf(open, func(int) string { return unit }, close)
	}
	deepArray := strings.Repeat("[", maxDepth-1) + strings.Repeat("]", maxDepth-1)
	deepObject := strings.Repeat(`{"b":1,"a":`, maxDepth-1) + "0" + strings.Repeat("}", maxDepth-1)
	var members strings.Builder
	members.WriteByte('{')
	for i := 0; members.Len() < size-64; i++ {
		if i > 0 {
			members.WriteByte(',')
		}
		// A shared 40-byte prefix, names in descending order: every
		// comparison of the sort reads past the prefix.
		fmt.Fprintf(&members, `"%s%08d":%d`, strings.Repeat("p", 40), 1<<26-i, i)
	}
	members.WriteByte('}')
	return []struct {
		name string
		body []byte
	}{
		{"huge negative exponent", []byte(`{"n":1e-` + digits(size-10) + `}`)},
		{"huge mantissa", []byte(`{"n":1.` + digits(size-8) + `}`)},
		{"huge fraction", []byte(`{"n":0.` + strings.Repeat("0", size-10) + `1}`)},
		{"many huge exponents", fill("[", "1e-"+digits(40), "]")},
		{"deep arrays", fill("[", deepArray, "]")},
		{"deep objects out of order", fill("[", deepObject, "]")},
		{"small objects out of order", fill("[", `{"c":[],"b":{},"a":0}`, "]")},
		// Upper-case names make every object check its names for folds.
		{"small upper-case objects out of order", fill("[", `{"C":[],"B":{},"A":0}`, "]")},
		{"small objects, folded names out of order", fill("[", `{"b":0,"B":[],"a":{},"A":0}`, "]")},
		{"many folded members", fillf("{", func(i int) string {
			if i%2 == 0 {
				return fmt.Sprintf(`"Ab%08d":1`, 1<<26-i)
			}
			return fmt.Sprintf(`"aB%08d":1`, 1<<26-i+1)
		}, "}")},
		{"many members in random order", fillf("{", func(i int) string {
			return fmt.Sprintf(`"%s%08d":1`, strings.Repeat("p", 40), uint32(i)*2654435761%100000000)
		}, "}")},
		{"many upper-case members", fillf("{", func(i int) string { return fmt.Sprintf(`"%sP%08d":1`, strings.Repeat("Q", 20), 1<<26-i) }, "}")},
		{"many case variants of one name", fillf("{", func(i int) string {
			name := []byte("abcdefghijklmnopq")
			for j := range name {
				if i>>j&1 == 1 {
					name[j] -= 'a' - 'A'
				}
			}
			return `"` + string(name) + `":1`
		}, "}")},
		{"many members", []byte(members.String())},
		{"long escaped string", []byte(`{"s":"` + strings.Repeat(`\u00e9\n\"\\\ud83d\ude00`, (size-10)/26) + `"}`)},
		{"escaped member names", fillf("{", func(i int) string { return fmt.Sprintf(`"\u0061\n\u00e9%d":1`, 1<<26-i) }, "}")},
		{"many small numbers", fill("[", "1.25e-7", "]")},
	}
}

// BenchmarkSumWorst times Sum on each adversarial body against the floor
// (json.Valid and SHA-256 of the same bytes), and reports the ratio as
// "x-floor". Run it with
//
//	go test -run '^$' -bench SumWorst -benchtime 20x ./fingerprint/
func BenchmarkSumWorst(b *testing.B) {
	for _, w := range worstBodies(worstSize) {
		if _, err := (Spec{}).Sum(w.body); err != nil {
			b.Fatalf("%s: %v", w.name, err)
		}
		b.Run(strings.ReplaceAll(w.name, " ", "-"), func(b *testing.B) {
			b.SetBytes(int64(len(w.body)))
			b.ReportAllocs()
			var sum, floor time.Duration
			for b.Loop() {
				t0 := time.Now()
				if _, err := (Spec{}).Sum(w.body); err != nil {
					b.Fatal(err)
				}
				t1 := time.Now()
				if !json.Valid(w.body) {
					b.Fatal("invalid")
				}
				_ = sha256.Sum256(w.body)
				sum, floor = sum+t1.Sub(t0), floor+time.Since(t1)
			}
			b.ReportMetric(float64(sum.Nanoseconds())/float64(b.N), "sum-ns/op")
			b.ReportMetric(float64(floor.Nanoseconds())/float64(b.N), "floor-ns/op")
			b.ReportMetric(float64(sum)/float64(floor), "x-floor")
		})
	}
}
