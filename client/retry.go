package client

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// maxHeaderDelay bounds what a retry-after-ms or Retry-After header is read
// as: a server's typo must not overflow a Duration. Whether the client
// waits that long is MaxRetryAfter's decision.
const maxHeaderDelay = 24 * time.Hour

// retryAfter reads how long an answer asks the client to wait: its
// retry-after-ms (milliseconds, the OpenAI API's header), else its
// Retry-After in seconds (fractions allowed: "1.5") or as an HTTP date.
// It is 0 when the answer names no wait, names one past, or one that is no
// number (NaN, infinite, negative); at most a day.
func retryAfter(h http.Header) time.Duration {
	if d, ok := parseDelay(h.Get("Retry-After-Ms"), time.Millisecond); ok {
		return d
	}
	v := strings.TrimSpace(h.Get("Retry-After"))
	if d, ok := parseDelay(v, time.Second); ok {
		return d
	}
	if t, err := http.ParseTime(v); err == nil {
		return min(max(time.Until(t), 0), maxHeaderDelay)
	}
	return 0
}

// parseDelay reads v as a non-negative number of units, at most
// maxHeaderDelay.
func parseDelay(v string, unit time.Duration) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) || f < 0 {
		return 0, false
	}
	if f >= float64(maxHeaderDelay/unit) {
		return maxHeaderDelay, true
	}
	return time.Duration(f * float64(unit)), true
}

// nextBackoff doubles backoff b up to MaxBackoff, without overflowing
// whatever the cap.
func (c *Client) nextBackoff(b time.Duration) time.Duration {
	if b > c.cfg.MaxBackoff/2 {
		return c.cfg.MaxBackoff
	}
	return 2 * b
}

// backoffWait draws the wait for backoff b from [b/2, b]: clients that
// failed together spread out instead of retrying in lock-step, and none
// waits less than half the backoff.
func (c *Client) backoffWait(b time.Duration) time.Duration {
	if b <= 1 {
		return b
	}
	return b - time.Duration(c.randN(int64(b/2)+1))
}

// hintWait draws the wait for a server's hint h (h <= MaxRetryAfter) from
// [h, min(1.25h, MaxRetryAfter)]: never sooner than the server asked, and
// clients told "Retry-After: 1" together do not come back in the same
// instant.
func (c *Client) hintWait(h time.Duration) time.Duration {
	if h <= 0 {
		return 0
	}
	return min(h+time.Duration(c.randN(int64(h/4)+1)), max(h, c.cfg.MaxRetryAfter))
}

// waitPastDeadline returns an error matching context.DeadlineExceeded when
// a wait starting at now would end after ctx's deadline: a call returns at
// once rather than sleep into a deadline it cannot beat.
func waitPastDeadline(ctx context.Context, now time.Time, wait time.Duration) error {
	if dl, ok := ctx.Deadline(); ok && now.Add(wait).After(dl) {
		return fmt.Errorf("a wait of %v would pass the context's deadline: %w", wait.Round(time.Millisecond), context.DeadlineExceeded)
	}
	return nil
}
