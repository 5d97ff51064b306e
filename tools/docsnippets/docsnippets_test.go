package docsnippets

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"golang.org/x/mod/modfile"
)

// repoRoot is the repository root, seen from this package's directory.
const repoRoot = "../.."

// stale is a snippet naming an API that does not exist: the check must
// reject it, or it could not catch a renamed one either.
var stale = Snippet{File: "stale.md", Line: 1, Code: "_, err := store.SubmitSomething(ctx, pgstore.NewTask{})\n"}

// TestDocSnippetsCompile builds and vets every Go snippet of README.md
// and docs/*.md, in a module outside the workspace that requires what the
// example requires (the library, otelidem, the client, echo-jwt, the
// OpenTelemetry SDK) from this working tree.
func TestDocSnippetsCompile(t *testing.T) {
	dir := t.TempDir()
	writeModule(t, dir)
	snippets, err := Write(repoRoot, dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(snippets) < 10 {
		t.Fatalf("found %d snippets; the docs have more", len(snippets))
	}
	src, err := Generate(stale, "stale")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "stale"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "stale", "snippet.go"), src, 0o644); err != nil {
		t.Fatal(err)
	}

	cmd := exec.Command("go", "vet", "./...")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod -buildvcs=false", "GOPROXY=off")
	out, _ := cmd.CombinedOutput()

	// vet reports each package's errors and goes on with the others.
	failed := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^(?:# example\.com/snippets/|vet: \./)(\w+)`).FindAllStringSubmatch(string(out), -1) {
		failed[m[1]] = true
	}
	for _, m := range regexp.MustCompile(`(?m)^\./?(\w+)/snippet\.go`).FindAllStringSubmatch(string(out), -1) {
		failed[m[1]] = true
	}
	if !failed["stale"] || !strings.Contains(string(out), "SubmitSomething") {
		t.Errorf("a snippet calling store.SubmitSomething passed; the check catches nothing:\n%s", out)
	}
	delete(failed, "stale")
	for pkg := range failed {
		s, ok := snippets[pkg]
		if !ok {
			t.Errorf("go vet failed outside the snippets (%s):\n%s", pkg, out)
			continue
		}
		gen, _ := os.ReadFile(filepath.Join(dir, pkg, "snippet.go"))
		t.Errorf("the snippet at %s does not compile or vet:\n%s\ngenerated as:\n%s", s, grep(string(out), pkg), gen)
	}
}

// writeModule writes a go.mod and go.sum to dir: the example module's,
// renamed, with its replace directives pointing at this working tree.
func writeModule(t *testing.T, dir string) {
	t.Helper()
	ex := filepath.Join(repoRoot, "example")
	data, err := os.ReadFile(filepath.Join(ex, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	f, err := modfile.Parse("go.mod", data, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.AddModuleStmt("example.com/snippets"); err != nil {
		t.Fatal(err)
	}
	for _, r := range f.Replace {
		abs, err := filepath.Abs(filepath.Join(ex, r.New.Path))
		if err != nil {
			t.Fatal(err)
		}
		if err := f.AddReplace(r.Old.Path, r.Old.Version, abs, ""); err != nil {
			t.Fatal(err)
		}
	}
	out, err := f.Format()
	if err != nil {
		t.Fatal(err)
	}
	sum, err := os.ReadFile(filepath.Join(ex, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), out, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "go.sum"), sum, 0o644); err != nil {
		t.Fatal(err)
	}
}

// grep returns the lines of out that name pkg's directory.
func grep(out, pkg string) string {
	var b strings.Builder
	for line := range strings.Lines(out) {
		if strings.Contains(line, pkg+"/") || strings.Contains(line, "/"+pkg+"\n") {
			b.WriteString(line)
		}
	}
	return b.String()
}

func TestExtract(t *testing.T) {
	t.Parallel()
	md := "text\n\n<!-- snippet: skip -->\n```go\nx := 1\n```\n\n- item\n\n  ```go\n  y := 2\n  ```\n\n```sh\nls\n```\n"
	got := Extract("a.md", md)
	if len(got) != 2 {
		t.Fatalf("Extract = %+v, want 2 snippets", got)
	}
	if got[0].Mark != "skip" || got[0].Code != "x := 1\n" || got[0].Line != 4 {
		t.Errorf("first = %+v", got[0])
	}
	if got[1].Mark != "" || got[1].Code != "y := 2\n" {
		t.Errorf("second (indented) = %+v", got[1])
	}
}

func TestGenerate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		given Snippet
		want  []string // substrings of the generated file
	}{
		{name: "statements become a function body with their imports and prelude",
			given: Snippet{Code: "task, err := store.Submit(ctx, pgstore.NewTask{})\n"},
			want: []string{`pgstore "github.com/idemgate/idemgate/pgstore"`, "var store *pgstore.Store",
				"var ctx = context.Background()", "func _() error {", "_ = task", "_ = err", "return nil"}},
		{name: "declarations stay declarations; what they declare is not preluded",
			given: Snippet{Code: "func scope(c echo.Context) (string, string, error) { return \"\", \"\", nil }\n"},
			want:  []string{"func scope(c echo.Context)", `echo "github.com/labstack/echo/v4"`}},
		{name: "a mirrored type converts to the real one",
			given: Snippet{Code: "type Stats struct {\n\tCounts map[string]map[State]int\n}\n", Mark: "mirrors pgstore.Stats"},
			want:  []string{"type State = pgstore.State", "var _ = pgstore.Stats(Stats{})"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tt.given.File, tt.given.Line = "a.md", 1
			got, err := Generate(tt.given, "p")
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range tt.want {
				if !strings.Contains(string(got), w) {
					t.Errorf("generated file lacks %q:\n%s", w, got)
				}
			}
			if strings.Contains(tt.name, "declarations stay") && strings.Contains(string(got), "func scope(c echo.Context) (tenant") {
				t.Errorf("the prelude's scope was added beside the snippet's:\n%s", got)
			}
		})
	}
}
