package cli

import (
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
		})
	}
	l, err := o.Store.KindLimits(context.Background(), "Images")
	if err != nil || l != (pgstore.KindLimits{}) {
		t.Errorf("limits of Images after the refusals: %+v, %v; want none", l, err)
	}
}
