package client

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestRetryAfter(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name        string
		given       string // Retry-After
		givenMillis string // retry-after-ms
		want        time.Duration
	}{
		{name: "absent", want: 0},
		{name: "seconds", given: "3", want: 3 * time.Second},
		{name: "fractional seconds", given: "1.5", want: 1500 * time.Millisecond},
		{name: "negative", given: "-1", want: 0},
		{name: "negative fraction", given: "-0.5", want: 0},
		{name: "garbage", given: "soon", want: 0},
		{name: "NaN", given: "NaN", want: 0},
		{name: "infinite", given: "Inf", want: 0},
		{name: "out of float range", given: "1e400", want: 0},
		{name: "huge is capped, never overflows", given: "99999999999999999", want: 24 * time.Hour},
		{name: "huge in exponent form is capped", given: "1e300", want: 24 * time.Hour},
		{name: "a past date", given: "Wed, 21 Oct 2015 07:28:00 GMT", want: 0},
		{name: "a far date is capped", given: "Fri, 01 Jan 9999 00:00:00 GMT", want: 24 * time.Hour},
		{name: "milliseconds", givenMillis: "1500", want: 1500 * time.Millisecond},
		{name: "fractional milliseconds", givenMillis: "0.5", want: 500 * time.Microsecond},
		{name: "milliseconds win over seconds", given: "3", givenMillis: "250", want: 250 * time.Millisecond},
		{name: "bad milliseconds leave the seconds", given: "3", givenMillis: "soon", want: 3 * time.Second},
		{name: "negative milliseconds leave the seconds", given: "3", givenMillis: "-5", want: 3 * time.Second},
		{name: "huge milliseconds are capped", givenMillis: "1e18", want: 24 * time.Hour},
	}
	for _, tt := range tests {
		h := http.Header{}
		if tt.given != "" {
			h.Set("Retry-After", tt.given)
		}
		if tt.givenMillis != "" {
			h.Set("Retry-After-Ms", tt.givenMillis)
		}
		if got := retryAfter(h); got != tt.want {
			t.Errorf("%s: retryAfter(Retry-After %q, retry-after-ms %q) = %v, want %v", tt.name, tt.given, tt.givenMillis, got, tt.want)
		}
	}
}

// TestRetriesAreJittered: clients that meet the same failure at the same
// moment do not come back in lock-step. A backoff b is drawn from
// [b/2, b]; a Retry-After h from [h, 1.25h] (never sooner than asked).
func TestRetriesAreJittered(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name             string
		given            answer
		wantMin, wantMax time.Duration
	}{
		{name: "backoff", given: problem(503, "store_unavailable", ""),
			wantMin: 50 * time.Millisecond, wantMax: 100 * time.Millisecond},
		{name: "Retry-After", given: withHeader(problem(503, "store_unavailable", "true"), "Retry-After", "1"),
			wantMin: time.Second, wantMax: 1250 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			const clients = 32
			var script []answer
			for range clients {
				script = append(script, tt.given, answer{status: 201})
			}
			srv := newFakeServer(t, script...)
			var first []time.Duration
			for range clients {
				var waits []time.Duration
				c := New(Config{BaseURL: srv.URL, Sleep: recordSleeps(&waits)})
				if _, err := c.Send(context.Background(), http.MethodPost, "/x", "k", nil); err != nil {
					t.Fatal(err)
				}
				first = append(first, waits[0])
			}
			for _, w := range first {
				if w < tt.wantMin || w > tt.wantMax {
					t.Errorf("a client waited %v, want within [%v, %v]", w, tt.wantMin, tt.wantMax)
				}
			}
			if distinct := len(slices.Compact(slices.Sorted(slices.Values(first)))); distinct < clients/2 {
				t.Errorf("%d clients drew only %d distinct waits: %v", clients, distinct, first)
			}
		})
	}
}

// TestSendGivesUpOnARetryAfterOverMaxRetryAfter: a Retry-After longer than
// MaxRetryAfter ends the Send at once with the answer's *Problem (its
// RetryAfter says what the server asked for), instead of parking the caller
// for up to a day per attempt.
func TestSendGivesUpOnARetryAfterOverMaxRetryAfter(t *testing.T) {
	t.Parallel()
	unavailable := problem(503, "upstream_down", "true")
	tests := []struct {
		name          string
		givenMax      time.Duration
		givenAfter    string
		wantAttempts  int
		wantWaits     []time.Duration
		wantGivenUpOn time.Duration // the *Problem's RetryAfter; 0: success
		tolerance     time.Duration // how much less the RetryAfter may be (a date counts down)
	}{
		{name: "a day, default limit", givenAfter: "86400", wantAttempts: 1, wantGivenUpOn: 24 * time.Hour},
		{name: "a minute and a half, default limit", givenAfter: "90", wantAttempts: 1, wantGivenUpOn: 90 * time.Second},
		{name: "a date two hours ahead, default limit", givenAfter: time.Now().Add(2 * time.Hour).UTC().Format(http.TimeFormat),
			wantAttempts: 1, wantGivenUpOn: 2 * time.Hour, tolerance: time.Minute},
		{name: "a minute is honoured by default", givenAfter: "60", wantAttempts: 2, wantWaits: []time.Duration{time.Minute}},
		{name: "over a lower limit", givenMax: 10 * time.Second, givenAfter: "11", wantAttempts: 1, wantGivenUpOn: 11 * time.Second},
		{name: "at a lower limit", givenMax: 10 * time.Second, givenAfter: "10", wantAttempts: 2, wantWaits: []time.Duration{10 * time.Second}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := newFakeServer(t, withHeader(unavailable, "Retry-After", tt.givenAfter), answer{status: 201})
			var waits []time.Duration
			c := newTestClient(Config{BaseURL: srv.URL, MaxRetryAfter: tt.givenMax, Sleep: recordSleeps(&waits)})

			_, err := c.Send(context.Background(), http.MethodPost, "/x", "k", nil)

			if keys, _, _, _ := srv.seen(); len(keys) != tt.wantAttempts {
				t.Errorf("the server saw %d requests, want %d", len(keys), tt.wantAttempts)
			}
			if !slices.Equal(waits, tt.wantWaits) {
				t.Errorf("waits = %v, want %v", waits, tt.wantWaits)
			}
			if tt.wantGivenUpOn == 0 {
				if err != nil {
					t.Fatalf("Send: %v", err)
				}
				return
			}
			var p *Problem
			if !errors.As(err, &p) || p.Status != 503 {
				t.Fatalf("Send = %v, want the 503's *Problem", err)
			}
			if d := p.RetryAfter - tt.wantGivenUpOn; d < -tt.tolerance || d > 0 {
				t.Errorf("the *Problem's RetryAfter = %v, want %v", p.RetryAfter, tt.wantGivenUpOn)
			}
			if !strings.Contains(err.Error(), "MaxRetryAfter") {
				t.Errorf("Send = %q, want it to name MaxRetryAfter", err)
			}
		})
	}
}

// TestSendDeadlineKeepsTheProblem: when the context ends before the wait
// the server asked for, the error matches the context's error and still
// carries the answer's *Problem; with a deadline the wait cannot beat, Send
// returns at once instead of sleeping into it.
func TestSendDeadlineKeepsTheProblem(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		givenCtx  func() (context.Context, context.CancelFunc)
		givenWait func(cancel context.CancelFunc) func(context.Context, time.Duration) error
		wantErr   error
		wantSleep bool
	}{
		{name: "a deadline before the Retry-After ends",
			givenCtx: func() (context.Context, context.CancelFunc) {
				return context.WithTimeout(context.Background(), time.Minute)
			},
			givenWait: func(context.CancelFunc) func(context.Context, time.Duration) error { return timerSleep },
			wantErr:   context.DeadlineExceeded},
		{name: "cancelled while waiting",
			givenCtx: func() (context.Context, context.CancelFunc) { return context.WithCancel(context.Background()) },
			givenWait: func(cancel context.CancelFunc) func(context.Context, time.Duration) error {
				return func(ctx context.Context, d time.Duration) error {
					cancel()
					return ctx.Err()
				}
			},
			wantErr: context.Canceled, wantSleep: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := newFakeServer(t, withHeader(problem(503, "store_unavailable", "true"), "Retry-After", "300"))
			ctx, cancel := tt.givenCtx()
			defer cancel()
			slept := false
			sleep := tt.givenWait(cancel)
			c := newTestClient(Config{BaseURL: srv.URL, MaxRetryAfter: 10 * time.Minute, Sleep: func(ctx context.Context, d time.Duration) error {
				slept = true
				return sleep(ctx, d)
			}})

			_, err := c.Send(ctx, http.MethodPost, "/x", "k", nil)

			var p *Problem
			if !errors.Is(err, tt.wantErr) || !errors.As(err, &p) || p.Status != 503 || p.Code != "store_unavailable" {
				t.Fatalf("Send = %v, want an error matching %v and the 503's *Problem", err, tt.wantErr)
			}
			if slept != tt.wantSleep {
				t.Errorf("slept = %v, want %v", slept, tt.wantSleep)
			}
		})
	}
}

// timerSleep stands in for a real timer without taking real time: it ends
// with ctx's deadline when d would outlast it, else at once.
func timerSleep(ctx context.Context, d time.Duration) error {
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < d {
		return context.DeadlineExceeded
	}
	return ctx.Err()
}

// FuzzRetryAfter: whatever the headers say, the wait read is between 0
// and a day, and a plain count of seconds is read as itself.
func FuzzRetryAfter(f *testing.F) {
	for _, s := range [][2]string{{"3", ""}, {"1.5", ""}, {"", "1500"}, {"-1", "NaN"}, {"1e400", "Inf"}, {"Fri, 01 Jan 9999 00:00:00 GMT", ""}, {"0x1p4", "+2"}} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, seconds, millis string) {
		h := http.Header{}
		h.Set("Retry-After", seconds)
		h.Set("Retry-After-Ms", millis)
		got := retryAfter(h)
		if got < 0 || got > maxHeaderDelay {
			t.Fatalf("retryAfter(%q, ms %q) = %v, want within [0, 24h]", seconds, millis, got)
		}
		if n, err := strconv.Atoi(seconds); err == nil && n >= 0 && n <= 86400 && strings.TrimSpace(millis) == "" &&
			strings.Trim(seconds, "0123456789") == "" && got != time.Duration(n)*time.Second {
			t.Fatalf("retryAfter(%q) = %v, want %ds", seconds, got, n)
		}
	})
}

// TestBackoffStaysWithinItsBounds: MaxBackoff caps every backoff, the first
// too; a MinBackoff set above the default cap raises that default instead
// (the caller asked for longer waits); a cap too large to double toward
// ("no cap") never overflows into a zero or negative wait.
func TestBackoffStaysWithinItsBounds(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		givenMin  time.Duration
		givenMax  time.Duration
		wantWaits []time.Duration // jitter drawn as 0: the backoffs themselves
	}{
		{name: "MinBackoff over an explicit MaxBackoff is capped", givenMin: 10 * time.Second, givenMax: 2 * time.Second,
			wantWaits: []time.Duration{2 * time.Second, 2 * time.Second, 2 * time.Second}},
		{name: "MinBackoff over the default MaxBackoff raises it", givenMin: 10 * time.Second,
			wantWaits: []time.Duration{10 * time.Second, 10 * time.Second, 10 * time.Second}},
		{name: "a cap too large to double toward", givenMin: 1 << 61, givenMax: 1<<63 - 1,
			wantWaits: []time.Duration{1 << 61, 1 << 62, 1<<63 - 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			unavailable := problem(503, "store_unavailable", "")
			srv := newFakeServer(t, unavailable, unavailable, unavailable, answer{status: 201})
			var waits []time.Duration
			c := newTestClient(Config{BaseURL: srv.URL, MinBackoff: tt.givenMin, MaxBackoff: tt.givenMax, Sleep: recordSleeps(&waits)})

			_, err := c.Send(context.Background(), http.MethodPost, "/x", "k", nil)

			if err != nil || !slices.Equal(waits, tt.wantWaits) {
				t.Errorf("Send = %v after waits %v, want success after %v", err, waits, tt.wantWaits)
			}
		})
	}
}

// TestJitterAtItsTopStaysWithinTheCaps: with the jitter drawn at the far
// end of its range, a backoff b waits b/2 (never 0), a hint h waits 1.25h
// but never past MaxRetryAfter, and a hint of exactly MaxRetryAfter is
// waited as it is.
func TestJitterAtItsTopStaysWithinTheCaps(t *testing.T) {
	t.Parallel()
	unavailable := problem(503, "store_unavailable", "true")
	srv := newFakeServer(t,
		unavailable,
		withHeader(unavailable, "Retry-After", "40"),
		withHeader(unavailable, "Retry-After", "60"),
		withHeader(unavailable, "Retry-After-Ms", "1"),
		answer{status: 201},
	)
	var waits []time.Duration
	c := New(Config{BaseURL: srv.URL, MinBackoff: 3, Sleep: recordSleeps(&waits)})
	c.randN = func(n int64) int64 { return n - 1 }

	_, err := c.Send(context.Background(), http.MethodPost, "/x", "k", nil)

	want := []time.Duration{2, 50 * time.Second, time.Minute, 1250 * time.Microsecond}
	if err != nil || !slices.Equal(waits, want) {
		t.Errorf("Send = %v after waits %v, want success after %v", err, waits, want)
	}
}
