// Package storetest is package github.com/idemgate/idemgate/storetest,
// the conformance suite for idemgate.Store, kept here for one release so
// that a store's tests written against v0.1 compile. New code imports
// github.com/idemgate/idemgate/storetest.
package storetest

import (
	"testing"

	"github.com/idemgate/idemgate/keyspace"
	"github.com/idemgate/idemgate/storetest"
)

// Harness is storetest.Harness.
type Harness = storetest.Harness

// Run is storetest.Run.
func Run(t *testing.T, newHarness func(t *testing.T) Harness) { storetest.Run(t, newHarness) }

// RunDurability is storetest.RunDurability.
func RunDurability(t *testing.T, newHarness func(t *testing.T) Harness) {
	storetest.RunDurability(t, newHarness)
}

// Key is storetest.Key.
func Key(t *testing.T) string { t.Helper(); return storetest.Key(t) }

// KeyspaceKey is storetest.KeyspaceKey.
func KeyspaceKey(t *testing.T) keyspace.Key { t.Helper(); return storetest.KeyspaceKey(t) }
