package middleware_test

import (
	"runtime"
	"strconv"
	"sync"
	"testing"

	"github.com/idemgate/idemgate/fingerprint"
	"github.com/idemgate/idemgate/middleware"
)

// TestConfigCopied: New keeps no slice of the caller's Config. Changing
// Methods, Fingerprint.Fields or Fingerprint.Exclude after New changes
// nothing: no request loses its protection, no drifted parameter replays.
func TestConfigCopied(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		given  func(*middleware.Config)
		mutate func(*middleware.Config)
		first  string
		when   string // retry under the same key
		want   want
	}{
		{name: "Methods",
			given:  func(c *middleware.Config) { c.Methods = []string{"POST"} },
			mutate: func(c *middleware.Config) { c.Methods[0] = "GET" },
			first:  imageBody, when: imageBody,
			want: want{status: 201, calls: 1, replayed: true}},
		{name: "Fingerprint.Fields",
			given:  func(c *middleware.Config) { c.Fingerprint = fingerprint.Spec{Fields: []string{"/prompt", "/n"}} },
			mutate: func(c *middleware.Config) { c.Fingerprint.Fields[0] = "/aspect_ratio" },
			first:  `{"prompt":"a dog","n":1}`, when: `{"prompt":"a cat","n":1}`,
			want: want{status: 409, code: "key_reused", calls: 1}},
		{name: "Fingerprint.Exclude",
			given:  func(c *middleware.Config) { c.Fingerprint = fingerprint.Spec{Exclude: []string{"/client_note"}} },
			mutate: func(c *middleware.Config) { c.Fingerprint.Exclude[0] = "/prompt" },
			first:  `{"prompt":"a dog","client_note":"x"}`, when: `{"prompt":"a cat","client_note":"x"}`,
			want: want{status: 409, code: "key_reused", calls: 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var cfg *middleware.Config
			v := newEnv(t, func(c *middleware.Config) { tt.given(c); cfg = c }, nil)
			tt.mutate(cfg)
			if rec := v.do(req{key: "k", body: tt.first}); rec.Code != 201 {
				t.Fatalf("first request = %d %s", rec.Code, rec.Body)
			}
			tt.want.check(t, v, v.do(req{key: "k", body: tt.when}))
		})
	}
}

// TestConfigMutatedConcurrently: the caller rewrites its Config's slices
// while requests run (the race detector finds any sharing); every keyed
// POST stays protected and fingerprinted as configured.
func TestConfigMutatedConcurrently(t *testing.T) {
	t.Parallel()
	var cfg *middleware.Config
	v := newEnv(t, func(c *middleware.Config) {
		c.Methods = []string{"POST", "PATCH"}
		c.Fingerprint = fingerprint.Spec{Fields: []string{"/prompt"}, Exclude: []string{"/client_note"}}
		c.ReplayHeaders = []string{"X-Run", "Content-Type"}
		cfg = c
	}, nil)
	const workers, rounds = 8, 10
	stop := make(chan struct{})
	var mutators sync.WaitGroup
	mutators.Add(1)
	go func() {
		defer mutators.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			cfg.Methods[0], cfg.Methods[1] = "GET", "PUT"
			cfg.Fingerprint.Fields[0] = "/n"
			cfg.Fingerprint.Exclude[0] = "/prompt"
			cfg.ReplayHeaders[0] = "Set-Cookie"
			cfg.Methods[0], cfg.Methods[1] = "POST", "PATCH"
			cfg.Fingerprint.Fields[0] = "/prompt" + strconv.Itoa(i%2)
			runtime.Gosched()
		}
	}()
	var wg sync.WaitGroup
	errs := make(chan string, workers*rounds)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range rounds {
				key := strconv.Itoa(w) + "-" + strconv.Itoa(r)
				if rec := v.do(req{key: key, body: `{"prompt":"a dog","n":1}`}); rec.Code != 201 {
					errs <- "first " + key + ": " + strconv.Itoa(rec.Code)
					continue
				}
				if rec := v.do(req{key: key, body: `{"prompt":"a dog","n":2}`}); rec.Header().Get("Idempotent-Replayed") != "true" {
					errs <- "same prompt, other n " + key + ": not replayed " + strconv.Itoa(rec.Code)
				} else if rec.Header().Get("Set-Cookie") != "" {
					errs <- "replayed a Set-Cookie " + key
				}
				if rec := v.do(req{key: key, body: `{"prompt":"a cat","n":1}`}); rec.Code != 409 {
					errs <- "other prompt " + key + ": " + strconv.Itoa(rec.Code) + ", want 409"
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	mutators.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	if got, want := v.calls.Load(), int64(workers*rounds); got != want {
		t.Errorf("handler ran %d times, want %d", got, want)
	}
}
