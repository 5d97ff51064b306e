package main

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/idemgate/idemgate/internal/opsbench"
	"github.com/idemgate/idemgate/internal/testenv"
)

// newLimitedNode is newTaskNode with per-tenant limits, and the miniredis
// that holds its idempotency records.
func newLimitedNode(t *testing.T, exports, submits tenantLimit) (*taskNode, *miniredis.Miniredis) {
	t.Helper()
	pool, store := opsbench.Migrated(t, testenv.PostgresDSN(t))
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { rdb.Close() })
	secret := []byte("s3cret")
	a := &api{store: store, pool: pool, redis: rdb, secret: secret, logger: slog.New(slog.DiscardHandler),
		exportLimit: exports, submitLimit: submits}
	return &taskNode{b: &backends{pool: pool, store: store}, e: a.handler(), secret: secret}, mr
}

// storedExports counts the export records the middleware keeps for tenant.
func storedExports(mr *miniredis.Miniredis, tenant string) int {
	n := 0
	for _, k := range mr.Keys() {
		if strings.HasPrefix(k, "idem:"+tenant+":"+kindExport+":") {
			n++
		}
	}
	return n
}

// One tenant's burst of exports under new keys, each a sheet of hundreds
// of KiB kept for a day, is cut at the tenant's limit: the rest are 429
// rate_limited with Retry-After and store nothing (not even the 429),
// while replays of its stored exports and another tenant's exports pass.
func TestExportsPerTenantAreBounded(t *testing.T) {
	t.Parallel()
	const burst = 3
	// A refill every 10 hours: none within the test, however slow.
	n, mr := newLimitedNode(t, tenantLimit{PerMinute: 0.1 / 60, Burst: burst}, tenantLimit{})
	n.startWorkers(t, time.Millisecond)
	acme, globex := n.succeededTaskOf(t, "acme", "alice"), n.succeededTaskOf(t, "globex", "gina")

	const tries = 12
	ok, limited := 0, 0
	for i := range tries {
		rec := n.raw(t, "acme", "alice", http.MethodPost, "/v1/tasks/"+acme+"/export", "export:burst:"+strconv.Itoa(i))
		switch {
		case rec.Code == http.StatusOK:
			ok++
		case rec.Code == http.StatusTooManyRequests && strings.Contains(rec.Body.String(), `"rate_limited"`) && rec.Header().Get("Retry-After") != "":
			limited++
		default:
			t.Fatalf("export %d: %d %s %v", i, rec.Code, rec.Body, rec.Header())
		}
	}
	if ok != burst || limited != tries-burst {
		t.Errorf("%d exports ran, %d limited; want %d and %d", ok, limited, burst, tries-burst)
	}
	if got := storedExports(mr, "acme"); got != burst {
		t.Errorf("%d export answers stored for acme; want %d", got, burst)
	}
	// A limited key stored nothing: sent again, it is limited again, not replayed.
	again := n.raw(t, "acme", "alice", http.MethodPost, "/v1/tasks/"+acme+"/export", "export:burst:"+strconv.Itoa(tries-1))
	if again.Code != http.StatusTooManyRequests || again.Header().Get("Idempotent-Replayed") != "" {
		t.Errorf("a limited key again: %d replayed=%q; want 429, not replayed", again.Code, again.Header().Get("Idempotent-Replayed"))
	}
	// A stored export replays: a retry is never limited.
	replay := n.raw(t, "acme", "alice", http.MethodPost, "/v1/tasks/"+acme+"/export", "export:burst:0")
	if replay.Code != http.StatusOK || replay.Header().Get("Idempotent-Replayed") != "true" {
		t.Errorf("replay of a stored export: %d replayed=%q; want 200 replayed", replay.Code, replay.Header().Get("Idempotent-Replayed"))
	}
	// Another tenant has a bucket of its own.
	if rec := n.raw(t, "globex", "gina", http.MethodPost, "/v1/tasks/"+globex+"/export", "export:g"); rec.Code != http.StatusOK {
		t.Errorf("globex's export: %d %s; want 200", rec.Code, rec.Body)
	}
}

// raw sends one request as tenant/user and returns the recorded answer.
func (n *taskNode) raw(t *testing.T, tenant, user, method, path, key string) *httptest.ResponseRecorder {
	t.Helper()
	tok, err := mintToken(n.secret, tenant, user, time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	req := httptest.NewRequest(method, path, nil)
	req.Header.Set("Authorization", "Bearer "+tok)
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	rec := httptest.NewRecorder()
	n.e.ServeHTTP(rec, req)
	return rec
}

// Image and music submits share one bucket per tenant; a replay of a
// stored submit is never limited, and a limited key stores nothing.
func TestSubmitsPerTenantAreBounded(t *testing.T) {
	t.Parallel()
	n, _ := newLimitedNode(t, tenantLimit{}, tenantLimit{PerMinute: 0.1 / 60, Burst: 2})
	tests := []struct {
		name  string
		given string // path
		key   string
		want  int
	}{
		{name: "first image", given: "/v1/images", key: "s:1", want: http.StatusAccepted},
		{name: "music", given: "/v1/music", key: "s:2", want: http.StatusAccepted},
		{name: "over the limit", given: "/v1/images", key: "s:3", want: http.StatusTooManyRequests},
		{name: "music over the limit", given: "/v1/music", key: "s:4", want: http.StatusTooManyRequests},
		{name: "replay of the first", given: "/v1/images", key: "s:1", want: http.StatusAccepted},
		{name: "the limited key again", given: "/v1/images", key: "s:3", want: http.StatusTooManyRequests},
	}
	for _, tt := range tests {
		code, v := n.doAs(t, "acme", "alice", http.MethodPost, tt.given, tt.key, `{"prompt":"a cat"}`)
		if code != tt.want {
			t.Errorf("%s: %d %v; want %d", tt.name, code, v, tt.want)
		}
	}
	if code, _ := n.doAs(t, "globex", "gina", http.MethodPost, "/v1/images", "s:1", `{"prompt":"a cat"}`); code != http.StatusAccepted {
		t.Errorf("another tenant: %d; want 202", code)
	}
}
