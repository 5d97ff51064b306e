package doortest

import (
	"net/http"
	"strings"
	"testing"
)

// testUnmatchedRoutes: a request the router matches to no route of its
// method is the router's to answer (404, or 405 for a path that other
// methods have), even when it carries a key and a body over MaxBodyBytes:
// the middleware claims nothing, reads nothing and answers no problem.
func testUnmatchedRoutes(t *testing.T, b bundle) {
	big := `{"prompt":"` + strings.Repeat("x", 64) + `"}`
	tests := []struct {
		name   string
		when   req
		status int
	}{
		{"a path no route has is 404", req{path: "/v1/nope", key: "k", body: big}, http.StatusNotFound},
		{"a path a wildcard route does not match is 404", req{path: "/v1/orders/1", key: "k", body: big}, http.StatusNotFound},
		{"a protected method the path has no route of is 405", req{method: http.MethodPatch, key: "k", body: big}, http.StatusMethodNotAllowed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := b.serve(t, func(c *Config) { c.MaxBodyBytes = 16 }, nil)
			for try := range 2 {
				rec := s.do(t, tt.when)
				if rec.Code != tt.status {
					t.Errorf("try %d = %d %s, want the router's %d", try, rec.Code, rec.Body, tt.status)
				}
				if p := problemOf(t, rec); p.Code != "" || rec.Header().Get("X-Should-Retry") != "" {
					t.Errorf("try %d answered a problem of the middleware's: %v %s", try, rec.Header(), rec.Body)
				}
			}
			if got := s.events.String(); got != "" {
				t.Errorf("events = %s, want none", got)
			}
			if n := s.calls.Load(); n != 0 {
				t.Errorf("a handler ran %d times", n)
			}
		})
	}
}
