package middleware

import (
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/idemgate/idemgate"
)

// Request is what the middleware knows about a protected request.
//
// It is idemgate.Request, kept here for one release.
type Request = idemgate.Request

// FromContext returns the Request of a protected request, for handlers that
// hand the key and fingerprint on to their own store. It reports false when
// the middleware let the request pass through (no key, skipped, other method).
// It reads c's request context: idemgate.RequestFromContext does the same
// from a context.Context.
func FromContext(c echo.Context) (Request, bool) {
	return idemgate.RequestFromContext(c.Request().Context())
}

// door is echo's side of the engine, one per Config. The request's own
// values (idemgate.Door's x and next) are its echo.Context and the next
// echo.HandlerFunc: echo applies the middleware of Echo.Use to every
// request anew, so a Door per chain would cost an allocation each.
type door struct{ cfg *Config }

var _ idemgate.Door = (*door)(nil)

func (*door) Route(_ *http.Request, x any) string { return x.(echo.Context).Path() }

func (*door) Params(_ *http.Request, x any) (names, values []string) {
	c := x.(echo.Context)
	return c.ParamNames(), c.ParamValues()
}

func (*door) Matched(_ *http.Request, x any, template string) bool {
	return matched(x.(echo.Context), template)
}

func (d *door) Scope(_ *http.Request, x any) (tenant, user string, err error) {
	return d.cfg.Scope(x.(echo.Context))
}

// Next runs the handler; echo's Response already writes to w (Swap).
func (*door) Next(_ http.ResponseWriter, r *http.Request, x, next any) error {
	c := x.(echo.Context)
	if r != c.Request() {
		c.SetRequest(r)
	}
	return next.(echo.HandlerFunc)(c)
}

func (d *door) Problem(_ http.ResponseWriter, _ *http.Request, x any, p idemgate.Problem) (bool, error) {
	if d.cfg.ErrorHandler == nil {
		return false, nil
	}
	c := x.(echo.Context)
	err := d.cfg.ErrorHandler(c, p)
	return err != nil || c.Response().Committed, err
}

func (*door) Swap(x any, w http.ResponseWriter) http.ResponseWriter {
	res := x.(echo.Context).Response()
	old := res.Writer
	res.Writer = w
	return old
}

func (*door) Rewound(x any) {
	res := x.(echo.Context).Response()
	res.Committed, res.Status, res.Size = false, 0, 0
}

func (*door) Sent(x any, n int64) { x.(echo.Context).Response().Size = n }
