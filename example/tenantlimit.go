package main

import (
	"flag"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"
	echomw "github.com/labstack/echo/v4/middleware"
	"golang.org/x/time/rate"
)

// tenantLimit bounds how many new actions (requests under a key the
// idempotency middleware has not seen) one tenant may start on one route
// group of this process: PerMinute on average, a minute's worth at once.
// Each new action is a record kept for idemRetention (an export's is a
// sheet of up to 440 KiB), so the limit is what bounds what one tenant can
// make the service store; replays and 409s never reach it. Zero PerMinute:
// no limit.
type tenantLimit struct {
	PerMinute float64
	Burst     int // at most this many at once; 0: a minute's worth
}

// Defaults of the limits. An export is a billed, print-sized action;
// generating is cheap to store (a 202 of 150 bytes, a task of a few KiB).
const (
	defaultExportsPerMinute = 6
	defaultSubmitsPerMinute = 120
)

// addTenantLimitFlags registers the per-tenant limits of serve.
func addTenantLimitFlags(fs *flag.FlagSet, getenv func(string) string, exports, submits *tenantLimit) {
	fs.Float64Var(&exports.PerMinute, "exports-per-minute", envFloat(getenv, "EXPORTS_PER_MINUTE", defaultExportsPerMinute),
		"new exports one tenant may start per minute on this node, a minute's worth at once; 0: no limit (env EXPORTS_PER_MINUTE)")
	fs.Float64Var(&submits.PerMinute, "submits-per-minute", envFloat(getenv, "SUBMITS_PER_MINUTE", defaultSubmitsPerMinute),
		"new image and music tasks one tenant may submit per minute on this node, a minute's worth at once; 0: no limit (env SUBMITS_PER_MINUTE)")
}

func envFloat(getenv func(string) string, name string, def float64) float64 {
	if f, err := strconv.ParseFloat(getenv(name), 64); err == nil {
		return f
	}
	return def
}

// middleware returns echo's rate limiter keyed by the caller's tenant, or
// nil without a limit. It goes after the idempotency middleware: a
// request it refuses has claimed its key, and its 429 is not stored
// (DefaultCacheable), so the claim is released and the same key may try
// again later, while a replay is answered before it and costs nothing.
func (l tenantLimit) middleware() echo.MiddlewareFunc {
	if l.PerMinute <= 0 {
		return nil
	}
	burst := l.Burst
	if burst <= 0 {
		burst = max(1, int(math.Ceil(l.PerMinute)))
	}
	retryAfter := strconv.Itoa(max(1, int(math.Ceil(60/l.PerMinute))))
	return echomw.RateLimiterWithConfig(echomw.RateLimiterConfig{
		Store: echomw.NewRateLimiterMemoryStoreWithConfig(echomw.RateLimiterMemoryStoreConfig{
			Rate: rate.Limit(l.PerMinute / 60), Burst: burst, ExpiresIn: 10 * time.Minute,
		}),
		IdentifierExtractor: func(c echo.Context) (string, error) {
			tenant, _, err := identity(c)
			return tenant, err
		},
		ErrorHandler: func(c echo.Context, err error) error { return err },
		DenyHandler: func(c echo.Context, tenant string, err error) error {
			c.Response().Header().Set("Retry-After", retryAfter)
			return &problem{Status: http.StatusTooManyRequests, Code: "rate_limited",
				Detail: "Your tenant started too many new actions; retry the same request after Retry-After."}
		},
	})
}
