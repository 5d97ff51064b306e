package idemgate_test

import (
	"os"
	"testing"

	"github.com/idemgate/idemgate/internal/testenv"
)

// TestMain starts the throwaway PostgreSQL and redis-server that Runner.Do's
// tests use (internal/testenv), and stops them when the tests end.
func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }
