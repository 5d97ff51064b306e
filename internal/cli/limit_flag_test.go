package cli

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/idemgate/idemgate/pgstore"
)

// tasks list -limit accepts exactly what its help says, 1 to
// pgstore.MaxListLimit, wherever it is given; anything else is bad usage
// (exit 2) before a database is reached.
func TestListLimitAcceptsWhatItsHelpSays(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		given    []string
		wantCode int // ExitError: the limit passed and the missing DATABASE_URL stopped it
	}{
		{name: "one", given: []string{"tasks", "list", "-limit", "1"}, wantCode: ExitError},
		{name: "the most", given: []string{"tasks", "list", "-limit=1000"}, wantCode: ExitError},
		{name: "before the verb", given: []string{"tasks", "-limit", "1000", "list"}, wantCode: ExitError},
		{name: "one too many", given: []string{"tasks", "list", "-limit", "1001"}, wantCode: ExitUsage},
		{name: "zero", given: []string{"tasks", "list", "-limit", "0"}, wantCode: ExitUsage},
		{name: "negative", given: []string{"tasks", "list", "-limit=-5"}, wantCode: ExitUsage},
		{name: "not a number", given: []string{"tasks", "list", "-limit", "ten"}, wantCode: ExitUsage},
		{name: "exponent", given: []string{"tasks", "list", "-limit", "1e3"}, wantCode: ExitUsage},
		{name: "overflow", given: []string{"tasks", "list", "-limit", "99999999999999999999"}, wantCode: ExitUsage},
		{name: "no value", given: []string{"tasks", "list", "-limit"}, wantCode: ExitUsage},
		{name: "no value, before the verb", given: []string{"tasks", "-limit", "list"}, wantCode: ExitUsage},
	}
	if pgstore.MaxListLimit != 1000 {
		t.Fatalf("MaxListLimit is %d: update the cases", pgstore.MaxListLimit)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var stdout, stderr bytes.Buffer
			env := Env{Prog: "idemgate", Getenv: func(string) string { return "" }, Stdin: strings.NewReader(""), Stdout: &stdout, Stderr: &stderr}
			code := Main(context.Background(), tt.given, env)
			if code != tt.wantCode {
				t.Fatalf("exit %d, want %d\n%s", code, tt.wantCode, stderr.String())
			}
			if code == ExitError && !strings.Contains(stderr.String(), "DATABASE_URL") {
				t.Errorf("stopped for another reason than the missing DATABASE_URL: %s", stderr.String())
			}
		})
	}
}
