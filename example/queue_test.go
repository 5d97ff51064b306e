package main

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/idemgate/idemgate/pgstore"
	"github.com/redis/go-redis/v9"
)

// GET /v1/queue without a valid token is 401, and says nothing of the
// queue.
func TestQueueRouteNeedsAuth(t *testing.T) {
	t.Parallel()
	o := newOpsBench(t)
	rdb := redis.NewClient(&redis.Options{Addr: miniredis.RunT(t).Addr()})
	t.Cleanup(func() { rdb.Close() })
	secret := []byte("s3cret")
	a := &api{store: o.Store, pool: o.Pool, redis: rdb, secret: secret, logger: slog.New(slog.DiscardHandler)}
	e := a.handler()
	other, err := mintToken([]byte("not-the-secret"), "acme", "mallory", time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	expired, err := mintToken(secret, "acme", "mallory", time.Now().Add(-2*time.Hour), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	for _, auth := range []string{"", "Bearer", "Bearer ", "Bearer garbage", "Basic YTpi", "Bearer " + other,
		"Bearer " + expired, "bearer " + other} {
		req := httptest.NewRequest(http.MethodGet, "/v1/queue", nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		rec := httptest.NewRecorder()
		e.ServeHTTP(rec, req)
		body := rec.Body.String()
		if rec.Code != http.StatusUnauthorized || strings.Contains(body, "kinds") || strings.Contains(body, "waiting") {
			t.Errorf("GET /v1/queue with Authorization %q: %d %s; want 401 and no queue", auth, rec.Code, body)
		}
	}
}

// GET /v1/queue reports each kind's running and waiting tasks of the
// caller's tenant (acme: not globex's image task) and its limits.
func TestQueueRoute(t *testing.T) {
	t.Parallel()
	o := newOpsBench(t)
	rdb := redis.NewClient(&redis.Options{Addr: miniredis.RunT(t).Addr()})
	t.Cleanup(func() { rdb.Close() })
	secret := []byte("s3cret")
	a := &api{store: o.Store, pool: o.Pool, redis: rdb, secret: secret, logger: slog.New(slog.DiscardHandler)}
	n := &taskNode{b: &backends{pool: o.Pool, store: o.Store}, e: a.handler(), secret: secret}
	if err := o.Store.SetKindLimits(context.Background(), kindMusic, pgstore.KindLimits{MaxRunning: 2, Paused: true}); err != nil {
		t.Fatal(err)
	}
	code, v := n.do(t, "alice", http.MethodGet, "/v1/queue", "", "")
	if code != http.StatusOK {
		t.Fatalf("GET /v1/queue: %d %v", code, v)
	}
	got, _ := json.Marshal(v["kinds"])
	want := `[{"kind":"images","max_running":0,"max_running_per_tenant":0,"paused":false,"running":0,"starts_per_second":0,"waiting":1},` +
		`{"kind":"music","max_running":2,"max_running_per_tenant":0,"paused":true,"running":0,"starts_per_second":0,"waiting":1}]`
	if string(got) != want {
		t.Fatalf("queue = %s\nwant    %s", got, want)
	}
}

// GET /v1/queue shows the caller's tenant only: another tenant's tasks
// are not in its counts.
func TestQueueShowsOnlyTheCallersTenant(t *testing.T) {
	t.Parallel()
	n := newTaskNode(t) // no workers: submitted tasks wait
	for i, tenant := range []string{"globex", "globex", "acme"} {
		code, v := n.doAs(t, tenant, "u", http.MethodPost, "/v1/images", "queue:"+strconv.Itoa(i), `{"prompt":"a cat"}`)
		if code != http.StatusAccepted {
			t.Fatalf("submit as %s: %d %v", tenant, code, v)
		}
	}
	for _, tt := range []struct {
		tenant string
		want   float64
	}{{"acme", 1}, {"globex", 2}, {"initech", 0}} {
		code, v := n.doAs(t, tt.tenant, "u", http.MethodGet, "/v1/queue", "", "")
		kinds, _ := v["kinds"].([]any)
		if code != http.StatusOK || len(kinds) == 0 {
			t.Fatalf("GET /v1/queue as %s: %d %v", tt.tenant, code, v)
		}
		images, _ := kinds[0].(map[string]any)
		if images["kind"] != kindImages || images["waiting"] != tt.want {
			t.Errorf("%s sees images %v; want %v waiting, its own", tt.tenant, images, tt.want)
		}
	}
}
