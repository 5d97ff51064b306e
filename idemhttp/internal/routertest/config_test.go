package routertest

import (
	"github.com/idemgate/idemgate/idemhttp"
	"github.com/idemgate/idemgate/internal/doortest"
)

// config is idemhttp's Config for the suite's.
func config(c doortest.Config) idemhttp.Config {
	return idemhttp.Config{
		Skipper:          c.Skipper,
		Store:            c.Store,
		Scope:            c.Scope,
		Kind:             c.Kind,
		Fingerprint:      c.Fingerprint,
		Header:           c.Header,
		Required:         c.Required,
		Methods:          c.Methods,
		Retention:        c.Retention,
		Lease:            c.Lease,
		WaitInFlight:     c.WaitInFlight,
		MismatchStatus:   c.MismatchStatus,
		Cacheable:        c.Cacheable,
		MaxBodyBytes:     c.MaxBodyBytes,
		MaxResponseBytes: c.MaxResponseBytes,
		ReplayHeaders:    c.ReplayHeaders,
		FailOpen:         c.FailOpen,
		OnEvent:          c.OnEvent,
		ErrorHandler:     c.ErrorHandler,
		Atomic:           c.Atomic,
	}
}
