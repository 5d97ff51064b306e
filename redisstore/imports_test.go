package redisstore_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestImportsNoWebFramework: a service on the Redis store links no web
// framework and not the echo adapter: the package's dependencies, test
// files aside, hold none of them.
func TestImportsNoWebFramework(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	deps := strings.Fields(string(out))
	for _, banned := range []string{"github.com/labstack/", "github.com/gin-gonic/", "github.com/idemgate/idemgate/middleware"} {
		var found []string
		for _, dep := range deps {
			if strings.HasPrefix(dep, banned) {
				found = append(found, dep)
			}
		}
		if len(found) > 0 {
			t.Errorf("redisstore imports %d packages under %s: %s", len(found), banned, strings.Join(found, " "))
		}
	}
}
