package fingerprint

import (
	"math/big"
	"math/rand/v2"
	"strings"
	"testing"
)

// TestHugeExponentExact checks the exact form of numbers whose exponent
// has more than 15 digits against big.Int arithmetic: carries and borrows
// through long runs of 9s and 0s, leading zeros, mantissas that move the
// exponent up or down.
func TestHugeExponentExact(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(15, 2))
	mantissas := []struct {
		text   string
		digits string // significant digits, no leading or trailing zeros
		lead   int    // the value is 0.digits × 10^(lead + exponent)
	}{
		{"1", "1", 1}, {"10", "1", 2}, {"12345", "12345", 5}, {"1.5", "15", 1},
		{"0.1", "1", 0}, {"0.001", "1", -2}, {"0.00120", "12", -2},
		{strings.Repeat("7", 40), strings.Repeat("7", 40), 40},
		{"0." + strings.Repeat("0", 30) + "3", "3", -30},
		{"9" + strings.Repeat("0", 25), "9", 26},
	}
	exponents := []string{
		"1" + strings.Repeat("0", 15), "1" + strings.Repeat("0", 40), strings.Repeat("9", 16), strings.Repeat("9", 60),
		"0000" + strings.Repeat("9", 20), "1" + strings.Repeat("0", 20) + "1", "10000000000000000000000000000000000000000005",
	}
	for range 200 {
		var e strings.Builder
		e.WriteByte(byte('1' + r.IntN(9)))
		for range 15 + r.IntN(30) {
			c := byte('0' + r.IntN(10))
			if r.IntN(3) > 0 { // runs of 0s and 9s make long carries and borrows
				c = "09"[r.IntN(2)]
			}
			e.WriteByte(c)
		}
		exponents = append(exponents, e.String())
	}
	for _, m := range mantissas {
		for _, e := range exponents {
			for _, neg := range []bool{false, true} {
				given := m.text + "e-" + e
				if neg {
					given = "-" + given
				}
				E, _ := new(big.Int).SetString(e, 10)
				x := new(big.Int).Sub(big.NewInt(int64(m.lead-1)), E) // exponent of the first digit
				want := m.digits[:1]
				if len(m.digits) > 1 {
					want += "." + m.digits[1:]
				}
				want += "e" + x.String()
				if neg {
					want = "-" + want
				}
				if got := exactForm(t, given); got != want {
					t.Fatalf("%s: exact form %s, want %s", given, got, want)
				}
			}
		}
	}
	// Spellings of one number agree across the 15-digit boundary.
	one := exactForm(t, "1e-1000000000000000")
	for _, s := range []string{"10e-1000000000000001", "0.1e-999999999999999", "100e-0001000000000000002", "0.0001e-999999999999996"} {
		if got := exactForm(t, s); got != one {
			t.Errorf("%s: exact form %s, want %s as for 1e-1000000000000000", s, got, one)
		}
	}
}

// TestNumberCost holds Sum to its allocation budget on the adversarial
// bodies of BenchmarkSumWorst: their cost must not come from building big
// numbers (1 MiB of exponent digits made big.Int allocate 15,000 times and
// run for seconds). Time itself is left to the benchmark.
func TestNumberCost(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector drops pooled buffers on purpose")
	}
	for _, w := range worstBodies(worstSize) {
		if !strings.Contains(w.name, "exponent") && !strings.Contains(w.name, "mantissa") && !strings.Contains(w.name, "fraction") && !strings.Contains(w.name, "numbers") {
			continue
		}
		allocs := testing.AllocsPerRun(3, func() {
			if _, err := (Spec{}).Sum(w.body); err != nil {
				t.Fatal(err)
			}
		})
		if allocs > 8 {
			t.Errorf("%s: Sum makes %.0f allocations, want at most 8", w.name, allocs)
		}
	}
}
