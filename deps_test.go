package idemgate_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestDoorsLinkOnlyWhatTheyNeed: the engine links no web framework, no
// go-redis and no pgx, and idemhttp links nothing outside the standard
// library but this module's own packages, so that a net/http service on
// pgrecords links no echo and no go-redis.
func TestDoorsLinkOnlyWhatTheyNeed(t *testing.T) {
	t.Parallel()
	tests := []struct {
		pkg     string
		allowed func(dep string) bool
	}{
		{".", func(dep string) bool {
			return !strings.Contains(dep, "labstack/echo") && !strings.Contains(dep, "go-redis") && !strings.Contains(dep, "jackc/pgx")
		}},
		{"./idemhttp", func(dep string) bool {
			first, _, _ := strings.Cut(dep, "/")
			return !strings.Contains(first, ".") || strings.HasPrefix(dep, "github.com/idemgate/idemgate")
		}},
	}
	for _, tt := range tests {
		out, err := exec.Command("go", "list", "-deps", tt.pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list -deps %s: %v\n%s", tt.pkg, err, out)
		}
		for _, dep := range strings.Fields(string(out)) {
			if !tt.allowed(dep) {
				t.Errorf("%s links %s", tt.pkg, dep)
			}
		}
	}
}
