package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/mod/modfile"
)

// repoRoot is the repository this test clones, seen from its directory.
const repoRoot = "../.."

// git runs git in dir and returns its trimmed output.
func git(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

// throwawayClone clones the repository's HEAD into a temporary directory:
// the release command runs there, never on the repository's own tags.
func throwawayClone(t *testing.T) string {
	t.Helper()
	if _, err := os.Stat(filepath.Join(repoRoot, ".git")); err != nil {
		t.Skip("not in a git checkout")
	}
	dir := filepath.Join(t.TempDir(), "repo")
	git(t, ".", "clone", "-q", "--no-hardlinks", repoRoot, dir)
	git(t, dir, "config", "user.name", "release test")
	git(t, dir, "config", "user.email", "release-test@example.com")
	git(t, dir, "config", "tag.gpgSign", "false")
	git(t, dir, "config", "commit.gpgSign", "false")
	// The repository's releases so far must not decide what this test may
	// release.
	if tags := strings.Fields(git(t, dir, "tag", "-l")); len(tags) > 0 {
		git(t, dir, append([]string{"tag", "-d"}, tags...)...)
	}
	return dir
}

// addChangelogSection commits a CHANGELOG section for version.
func addChangelogSection(t *testing.T, dir, version string) {
	t.Helper()
	name := filepath.Join(dir, "CHANGELOG.md")
	data, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	section := "## [" + strings.TrimPrefix(version, "v") + "] - 2027-01-15\n\n### Fixed\n\n- Something.\n\n"
	data = bytes.Replace(data, []byte("## [0.1.0]"), []byte(section+"## [0.1.0]"), 1)
	if err := os.WriteFile(name, data, 0o644); err != nil {
		t.Fatal(err)
	}
	git(t, dir, "commit", "-q", "-m", "changelog "+version, "--", "CHANGELOG.md")
}

// requires returns what the go.mod at rev:path requires and replaces of the
// repository's own modules.
func requires(t *testing.T, dir, rev, path string) (req map[string]string, repl map[string]string) {
	t.Helper()
	data := git(t, dir, "show", rev+":"+path)
	f, err := modfile.Parse(path, []byte(data), nil)
	if err != nil {
		t.Fatal(err)
	}
	req, repl = map[string]string{}, map[string]string{}
	for _, r := range f.Require {
		if strings.HasPrefix(r.Mod.Path, "github.com/idemgate/idemgate") {
			req[r.Mod.Path] = r.Mod.Version
		}
	}
	for _, r := range f.Replace {
		repl[r.Old.Path] = r.New.Path
	}
	return req, repl
}

// TestReleaseInAThrowawayClone releases v0.2.0 in a clone: every module
// requires its siblings at v0.2.0 in one commit, replace directives stay
// for work in the repository (none in the CLI's go.mod), and the four tags
// name that commit. The repository's own tags are untouched.
func TestReleaseInAThrowawayClone(t *testing.T) {
	tagsBefore := git(t, repoRoot, "tag", "-l")
	dir := throwawayClone(t)
	addChangelogSection(t, dir, "v0.2.0")
	before := git(t, dir, "rev-parse", "HEAD")

	var out bytes.Buffer
	r := releaser{root: dir, version: "v0.2.0", out: &out}
	if err := r.release(false); err != nil {
		t.Fatalf("release: %v\n%s", err, out.String())
	}

	head := git(t, dir, "rev-parse", "HEAD")
	if head == before {
		t.Fatal("release made no commit; the modules required v0.1.0")
	}
	if msg := git(t, dir, "log", "-1", "--format=%s"); !strings.HasPrefix(msg, "release v0.2.0") {
		t.Errorf("commit message = %q", msg)
	}
	wantTags := []string{"client/v0.2.0", "cmd/idemgate/v0.2.0", "otelidem/v0.2.0", "v0.2.0"}
	if got := strings.Fields(git(t, dir, "tag", "-l", "*v0.2.0")); !slices.Equal(got, wantTags) {
		t.Errorf("tags = %v, want %v", got, wantTags)
	}
	for _, tag := range wantTags {
		if c := git(t, dir, "rev-parse", tag+"^{commit}"); c != head {
			t.Errorf("tag %s names %s, want the release commit %s", tag, c, head)
		}
		if typ := git(t, dir, "cat-file", "-t", tag); typ != "tag" {
			t.Errorf("tag %s is a %s, want an annotated tag", tag, typ)
		}
	}
	changed := strings.Fields(git(t, dir, "diff", "--name-only", before, head))
	for _, f := range changed {
		if filepath.Base(f) != "go.mod" {
			t.Errorf("the release commit changed %s; it may change go.mod files only", f)
		}
	}
	for _, mod := range []string{"otelidem/go.mod", "cmd/idemgate/go.mod", "example/go.mod", "tools/go.mod", "otelidem/internal/sdktest/go.mod"} {
		req, repl := requires(t, dir, "v0.2.0", mod)
		if len(req) == 0 {
			t.Errorf("%s requires no sibling", mod)
		}
		for path, v := range req {
			if v != "v0.2.0" {
				t.Errorf("%s requires %s %s, want v0.2.0", mod, path, v)
			}
			_, replaced := repl[path]
			if wantReplace := mod != "cmd/idemgate/go.mod"; replaced != wantReplace {
				t.Errorf("%s: replace of %s = %v, want %v", mod, path, replaced, wantReplace)
			}
		}
		if !slices.Contains(changed, mod) {
			t.Errorf("the release commit did not change %s", mod)
		}
	}
	if !strings.Contains(out.String(), "git push origin HEAD v0.2.0 otelidem/v0.2.0 client/v0.2.0 cmd/idemgate/v0.2.0") {
		t.Errorf("output lacks the push command:\n%s", out.String())
	}
	if after := git(t, repoRoot, "tag", "-l"); after != tagsBefore {
		t.Errorf("the repository's own tags changed: %q -> %q", tagsBefore, after)
	}
}

// TestReleaseRefuses: what the release command must refuse, leaving no tag
// behind.
func TestReleaseRefuses(t *testing.T) {
	dir := throwawayClone(t)
	addChangelogSection(t, dir, "v0.2.0")
	tests := []struct {
		name    string
		version string
		setup   func(t *testing.T)
		want    string
	}{
		{name: "a version that is not canonical", version: "v0.2", want: "not a canonical version"},
		{name: "a major version without a module path suffix", version: "v2.0.0", want: "/v2 module path suffix"},
		{name: "a version the CHANGELOG does not have", version: "v0.3.0", want: "CHANGELOG.md has no section"},
		{name: "a dirty working tree", version: "v0.2.0", want: "the working tree has changes",
			setup: func(t *testing.T) {
				if err := os.WriteFile(filepath.Join(dir, "stray.txt"), []byte("x"), 0o644); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { os.Remove(filepath.Join(dir, "stray.txt")) })
			}},
		{name: "a version older than a tag", version: "v0.2.0", want: "not newer than the tag v0.2.1",
			setup: func(t *testing.T) {
				git(t, dir, "tag", "v0.2.1")
				t.Cleanup(func() { git(t, dir, "tag", "-d", "v0.2.1") })
			}},
		{name: "a tag that exists", version: "v0.2.0", want: "tag v0.2.0 exists already",
			setup: func(t *testing.T) {
				git(t, dir, "tag", "v0.2.0")
				t.Cleanup(func() { git(t, dir, "tag", "-d", "v0.2.0") })
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.setup != nil {
				tt.setup(t)
			}
			head := git(t, dir, "rev-parse", "HEAD")
			tags := git(t, dir, "tag", "-l")
			var out bytes.Buffer
			err := releaser{root: dir, version: tt.version, out: &out}.release(false)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("release(%s) = %v, want an error with %q", tt.version, err, tt.want)
			}
			if git(t, dir, "rev-parse", "HEAD") != head || git(t, dir, "tag", "-l") != tags {
				t.Errorf("a refused release committed or tagged")
			}
			if st := git(t, dir, "status", "--porcelain", "--", "*.mod"); st != "" {
				t.Errorf("a refused release changed go.mod files:\n%s", st)
			}
		})
	}
}
