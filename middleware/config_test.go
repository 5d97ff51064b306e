package middleware_test

import (
	"reflect"
	"testing"

	"github.com/idemgate/idemgate/middleware"
)

// TestConfigHasOnlyPublicFields: go doc shows "Has unexported fields" for a
// Config with a test seam in it (the clock was one); tests reach theirs
// another way.
func TestConfigHasOnlyPublicFields(t *testing.T) {
	t.Parallel()
	typ := reflect.TypeFor[middleware.Config]()
	for i := range typ.NumField() {
		if f := typ.Field(i); !f.IsExported() {
			t.Errorf("Config.%s is unexported", f.Name)
		}
	}
}
