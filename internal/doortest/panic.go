package doortest

import (
	"net/http"
	"testing"
)

// testPanic: a handler's panic releases the claim and goes on up to the
// framework: out of the server (net/http's own recovery, which aborts the
// connection), or to the framework's recovery middleware, which answers
// 500 and is no problem of the middleware's. The retry runs the handler
// again. http.ErrAbortHandler, the panic that aborts a response on
// purpose, does the same.
func testPanic(t *testing.T, b bundle) {
	tests := []struct {
		name  string
		value any
	}{
		{"a value", "doortest: boom"},
		{"http.ErrAbortHandler", http.ErrAbortHandler},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := b.serve(t, nil, func(w http.ResponseWriter, r *http.Request, n int64) {
				if n == 1 {
					panic(tt.value)
				}
				defaultHandler(w, r, n)
			})
			rec, p := s.try(s.h, req{key: "k", body: imageBody}.build(s))
			switch {
			case p != nil:
				if p != tt.value {
					t.Errorf("the server panicked with %v, want the handler's %v", p, tt.value)
				}
			case tt.value == http.ErrAbortHandler:
				t.Errorf("http.ErrAbortHandler did not leave the server: answered %d %s", rec.Code, rec.Body)
			case rec.Code != http.StatusInternalServerError || problemOf(t, rec).Code != "":
				t.Errorf("the panic was answered %d %s, want the framework's 500", rec.Code, rec.Body)
			}
			if got := s.events.String(); got != "claimed,released(panic)" {
				t.Errorf("events = %s, want claimed,released(panic)", got)
			}
			want{status: 201, calls: 2}.check(t, s, s.do(t, req{key: "k", body: imageBody}))
		})
	}
}
