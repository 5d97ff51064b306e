package storetest_test

import (
	"testing"

	"github.com/idemgate/idemgate/storetest"
)

// TestRunOnMiniredis runs the suite on the example's harness.
func TestRunOnMiniredis(t *testing.T) {
	t.Run("Run", func(t *testing.T) { storetest.Run(t, newHarness) })
	t.Run("RunDurability", func(t *testing.T) { storetest.RunDurability(t, newHarness) })
}
