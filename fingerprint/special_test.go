package fingerprint

import (
	"encoding/binary"
	"math/bits"
	"math/rand/v2"
	"testing"
)

// TestSpecialLowestLane checks the claim of special: its lowest mark is
// exactly the first byte a string cannot copy as it is, for every pair of
// byte values in every pair of lanes, and for random words.
func TestSpecialLowestLane(t *testing.T) {
	t.Parallel()
	isSpecial := func(c byte) bool { return !plain[c] }
	check := func(b []byte) {
		m := special(binary.LittleEndian.Uint64(b))
		want := -1
		for i, c := range b {
			if isSpecial(c) {
				want = i
				break
			}
		}
		got := -1
		if m != 0 {
			got = bits.TrailingZeros64(m) >> 3
		}
		if got != want {
			t.Fatalf("%q: got %d want %d", b, got, want)
		}
	}
	b := make([]byte, 8)
	for p := 0; p < 8; p++ {
		for q := p + 1; q < 8; q++ {
			for x := 0; x < 256; x++ {
				for y := 0; y < 256; y++ {
					for i := range b {
						b[i] = 'a'
					}
					b[p], b[q] = byte(x), byte(y)
					check(b)
				}
			}
		}
	}
	r := rand.New(rand.NewPCG(3, 4))
	for range 200000 {
		for j := range b {
			b[j] = byte(r.IntN(256))
			if r.IntN(2) == 0 {
				b[j] = byte(0x20 + r.IntN(0x60))
			}
		}
		check(b)
	}
}
