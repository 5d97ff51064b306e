package idemgate

import (
	"testing"
	"time"
)

// A claim's token carries the claim's time and lease for an operator's
// tool, and a token without them (an older idemgate's, random) is told
// apart rather than read as a time.
func TestClaimTokenCarriesClaimTimeAndLease(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 12, 7, 21, 30, 0, 123e6, time.UTC)
	tests := []struct {
		name      string
		given     Token
		wantOK    bool
		wantAt    time.Time
		wantLease time.Duration
	}{
		{name: "30s lease", given: newClaimToken(at, 30*time.Second), wantOK: true, wantAt: at, wantLease: 30 * time.Second},
		{name: "sub-millisecond lease rounds down", given: newClaimToken(at, 1500*time.Microsecond), wantOK: true, wantAt: at, wantLease: time.Millisecond},
		{name: "lease too long to record", given: newClaimToken(at, 60*24*time.Hour), wantOK: true, wantAt: at},
		{name: "random token (version 4 bits)", given: Token{0: 0xde, 6: 0x4a, 8: 0xb1, 9: 0xff}},
		{name: "random token (version 8, wrong variant)", given: Token{6: 0x8a, 8: 0xc1}},
		{name: "random token with the version and variant bits, a time before tokens had one", given: Token{0: 0x01, 6: 0x8a, 8: 0x81, 12: 0x10}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			gotAt, gotLease, ok := tt.given.ClaimTimes()
			if ok != tt.wantOK || !gotAt.Equal(tt.wantAt) || gotLease != tt.wantLease {
				t.Fatalf("ClaimTimes() = %v, %v, %v; want %v, %v, %v", gotAt, gotLease, ok, tt.wantAt, tt.wantLease, tt.wantOK)
			}
		})
	}
	a, b := newClaimToken(at, time.Second), newClaimToken(at, time.Second)
	if a == b {
		t.Fatalf("two tokens of one millisecond and lease are equal: %s", a)
	}
}

func BenchmarkNewToken(b *testing.B) {
	b.Run("random", func(b *testing.B) {
		for b.Loop() {
			_ = newToken()
		}
	})
	b.Run("claim", func(b *testing.B) {
		now := time.Now()
		for b.Loop() {
			_ = newClaimToken(now, 30*time.Second)
		}
	})
}
