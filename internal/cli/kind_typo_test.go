package cli

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/idemgate/idemgate/pgstore"
)

// A kind that differs from a known one only in case or spacing is a typo
// like any other: pause, resume and limits refuse it (exit 1, saying so)
// unless -new-kind, and write no limits row for it.
func TestTasksRefuseAKindThatIsAlmostKnown(t *testing.T) {
	t.Parallel()
	o := newOpsBench(t) // tasks of kinds images and music
	for _, args := range [][]string{
		{"pause", "Images"},
		{"pause", "images "},
		{"resume", " music"},
		{"limits", "IMAGES", "-max-running", "1"},
		{"pause", "imgaes", "-json"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			code, _, stderr := o.run(t, args...)
			if code != ExitError && code != ExitUsage {
				t.Fatalf("exit %d; want a refusal: %s", code, stderr)
			}
			if code == ExitError && !strings.Contains(stderr, "-new-kind") {
				t.Errorf("the refusal does not say how to mean it: %s", stderr)
			}
			if want := strings.TrimSpace(strings.ToLower(args[1])); want != "imgaes" && !strings.Contains(stderr, `did you mean "`+want+`"`) {
				t.Errorf("the refusal does not name the known kind %q: %s", want, stderr)
			}
		})
	}
	l, err := o.Store.KindLimits(context.Background(), "Images")
	if err != nil || l != (pgstore.KindLimits{}) {
		t.Errorf("limits of Images after the refusals: %+v, %v; want none", l, err)
	}
}

// -new-kind allows a kind no task has named yet, not one no task can
// have: a kind is [a-z0-9][a-z0-9_-]{0,63}, as keyspace derives it. Such
// a kind is bad usage (exit 2) before a database is reached, with what
// was likely meant; a kind of the syntax passes on to the database.
func TestTasksNewKindRefusesAKindNoTaskCanHave(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		given    []string
		wantCode int
		wantSay  string
	}{
		{name: "upper case", given: []string{"tasks", "pause", "IMAGES", "-new-kind"}, wantCode: ExitUsage, wantSay: `did you mean "images"`},
		{name: "spaces", given: []string{"tasks", "resume", " Video Encode ", "-new-kind"}, wantCode: ExitUsage, wantSay: `did you mean "video-encode"`},
		{name: "limits", given: []string{"tasks", "limits", "Music", "-new-kind", "-max-running", "2"}, wantCode: ExitUsage, wantSay: `did you mean "music"`},
		{name: "leading dash", given: []string{"tasks", "pause", "-new-kind", "--", "_x"}, wantCode: ExitUsage, wantSay: "[a-z0-9][a-z0-9_-]{0,63}"},
		{name: "too long", given: []string{"tasks", "pause", "-new-kind", strings.Repeat("k", 65)}, wantCode: ExitUsage, wantSay: "[a-z0-9][a-z0-9_-]{0,63}"},
		{name: "good kind", given: []string{"tasks", "pause", "-new-kind", "video-encode_2"}, wantCode: ExitError, wantSay: "DATABASE_URL"},
		{name: "longest", given: []string{"tasks", "pause", "-new-kind", strings.Repeat("k", 64)}, wantCode: ExitError, wantSay: "DATABASE_URL"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var stdout, stderr bytes.Buffer
			env := Env{Prog: "idemgate", Getenv: func(string) string { return "" }, Stdin: strings.NewReader(""), Stdout: &stdout, Stderr: &stderr}
			code := Main(context.Background(), tt.given, env)
			if code != tt.wantCode || !strings.Contains(stderr.String(), tt.wantSay) {
				t.Fatalf("exit %d, want %d saying %q\n%s", code, tt.wantCode, tt.wantSay, stderr.String())
			}
		})
	}
}
