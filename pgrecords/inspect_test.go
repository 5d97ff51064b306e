package pgrecords_test

import (
	"testing"

	"github.com/idemgate/idemgate/internal/inspecttest"
	"github.com/idemgate/idemgate/internal/testenv"
)

func TestStoreInspector(t *testing.T) {
	t.Parallel()
	dsn := testenv.PostgresDSN(t)
	newStore(t, newPool(t, dsn)) // migrated once
	inspecttest.Run(t, func(t *testing.T) inspecttest.Store {
		return newStore(t, newPool(t, dsn))
	})
}
