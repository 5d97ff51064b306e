package pgrecords_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestImportsNeitherEchoNorGoRedis: a Postgres-only service that uses
// pgrecords links neither a web framework nor the Redis client, nor the
// echo adapter (whose package held the Redis store): the package's
// dependencies, test files aside, hold none of them.
func TestImportsNeitherEchoNorGoRedis(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	deps := strings.Fields(string(out))
	for _, banned := range []string{"github.com/labstack/", "github.com/redis/go-redis/", "github.com/idemgate/idemgate/middleware"} {
		var found []string
		for _, dep := range deps {
			if strings.HasPrefix(dep, banned) {
				found = append(found, dep)
			}
		}
		if len(found) > 0 {
			t.Errorf("pgrecords imports %d packages under %s: %s", len(found), banned, strings.Join(found, " "))
		}
	}
}
