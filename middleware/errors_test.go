package middleware_test

import (
	"context"
	"errors"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/middleware"
)

// TestErrorsNameThePackage: every error the middleware defines, returns
// or panics with starts "idemgate:", so a log line says where it came
// from. The transaction errors said "middleware:".
func TestErrorsNameThePackage(t *testing.T) {
	t.Parallel()
	errs := map[string]error{
		"ErrKeyReused":  idemgate.ErrKeyReused,
		"ErrLeaseLost":  idemgate.ErrLeaseLost,
		"ErrTxAborted":  idemgate.ErrTxAborted,
		"ErrTxRefused":  idemgate.ErrTxRefused,
		"ErrTxConflict": idemgate.ErrTxConflict,
	}
	_, err := middleware.Config{}.ToMiddleware()
	errs["ToMiddleware of an empty Config"] = err
	func() {
		defer func() {
			p := recover()
			err, _ := p.(error)
			errs["New's panic"] = err
		}()
		middleware.New(middleware.Config{Lease: -1})
	}()
	// A client that leaves while its claim is made: the error goes to echo.
	ctx, cancel := context.WithCancel(context.Background())
	mw := middleware.New(middleware.Config{Store: cancelingStore{cancel}, Scope: testScope})
	e := echo.New()
	c := e.NewContext(req{key: "k", body: `{}`}.build().WithContext(ctx), httptest.NewRecorder())
	c.SetPath("/v1/images")
	e.POST("/v1/images", func(echo.Context) error { return nil })
	errs["client gone"] = mw(func(echo.Context) error { return nil })(c)
	for name, err := range errs {
		if err == nil || !strings.HasPrefix(err.Error(), "idemgate: ") {
			t.Errorf("%s: %v, want an error starting \"idemgate: \"", name, err)
		}
	}
	if !errors.Is(errs["client gone"], context.Canceled) {
		t.Errorf("client gone: %v, want it to wrap context.Canceled", errs["client gone"])
	}
}

// cancelingStore cancels the request's context during the claim, as a
// client that leaves would, and claims nothing.
type cancelingStore struct{ cancel context.CancelFunc }

func (s cancelingStore) Claim(context.Context, string, idemgate.ClaimRequest) (idemgate.ClaimResult, error) {
	s.cancel()
	return idemgate.ClaimResult{Status: idemgate.Running}, nil
}

func (cancelingStore) Extend(context.Context, string, idemgate.Token, time.Duration) error {
	return nil
}

func (cancelingStore) Complete(context.Context, string, idemgate.Token, idemgate.Response, time.Duration) error {
	return nil
}

func (cancelingStore) Release(context.Context, string, idemgate.Token) error { return nil }
