package middleware_test

import (
	"os"
	"testing"

	"github.com/idemgate/idemgate/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }
