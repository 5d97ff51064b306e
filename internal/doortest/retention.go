package doortest

import (
	"testing"
	"time"
)

// testRetentionEnds: a stored answer is replayed for Retention, and a
// retry after it runs the handler again.
func testRetentionEnds(t *testing.T, b bundle) {
	const retention = 50 * time.Millisecond
	s := b.serve(t, func(c *Config) { c.Retention = retention }, nil)
	want{status: 201, calls: 1}.check(t, s, s.do(t, req{key: "k", body: imageBody}))
	// The record was stored before the answer came back.
	time.Sleep(retention + 50*time.Millisecond)
	want{status: 201, calls: 2, events: "claimed,claimed"}.check(t, s, s.do(t, req{key: "k", body: imageBody}))
}
