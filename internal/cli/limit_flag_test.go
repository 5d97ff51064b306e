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

// A limit out of the range pgstore stores is bad usage (exit 2), found
// before a database is reached, and named by its flag, not by a Go field.
func TestLimitFlagsOutOfRangeAreUsageErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		given    []string
		wantCode int
		wantFlag string
	}{
		{name: "negative max-running", given: []string{"-max-running", "-1"}, wantCode: ExitUsage, wantFlag: "-max-running"},
		{name: "max-running beyond int32", given: []string{"-max-running", "2147483648"}, wantCode: ExitUsage, wantFlag: "-max-running"},
		{name: "negative per tenant", given: []string{"-max-running-per-tenant=-3"}, wantCode: ExitUsage, wantFlag: "-max-running-per-tenant"},
		{name: "rate too fast", given: []string{"-starts-per-second", "1000001"}, wantCode: ExitUsage, wantFlag: "-starts-per-second"},
		{name: "negative rate", given: []string{"-starts-per-second=-0.5"}, wantCode: ExitUsage, wantFlag: "-starts-per-second"},
		{name: "NaN rate", given: []string{"-starts-per-second", "NaN"}, wantCode: ExitUsage, wantFlag: "-starts-per-second"},
		{name: "infinite rate", given: []string{"-starts-per-second", "+Inf"}, wantCode: ExitUsage, wantFlag: "-starts-per-second"},
		{name: "the most", given: []string{"-max-running", "2147483647", "-max-running-per-tenant", "0", "-starts-per-second", "1000000"}, wantCode: ExitError, wantFlag: "DATABASE_URL"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var stdout, stderr bytes.Buffer
			env := Env{Prog: "idemgate", Getenv: func(string) string { return "" }, Stdin: strings.NewReader(""), Stdout: &stdout, Stderr: &stderr}
			code := Main(context.Background(), append([]string{"tasks", "limits", "images", "-new-kind"}, tt.given...), env)
			if code != tt.wantCode || !strings.Contains(stderr.String(), tt.wantFlag) {
				t.Fatalf("exit %d, want %d naming %s\n%s", code, tt.wantCode, tt.wantFlag, stderr.String())
			}
			if strings.Contains(stderr.String(), "MaxRunning") || strings.Contains(stderr.String(), "StartsPerSecond") {
				t.Errorf("names a Go field, not the flag: %s", stderr.String())
			}
		})
	}
}
