package main

import (
	"context"
	"net"
	"reflect"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/internal/testenv"
)

// TestStorePostgres runs the binary with STORE=postgres and a REDIS_URL
// that nothing listens on: records and tasks live in one database, and a
// request answers 202, its retry replays, and a changed body gets a 409
// naming the changed field, with no Redis at all.
func TestStorePostgres(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end: builds the binary and needs PostgreSQL")
	}
	t.Parallel()
	// A port that was free a moment ago: no Redis there.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadRedis := "redis://" + ln.Addr().String() + "/0"
	ln.Close()

	dsn := testenv.PostgresDSN(t)
	p := startProc(t, []string{"DATABASE_URL=" + dsn, "REDIS_URL=" + deadRedis, "STORE=postgres",
		"JWT_SECRET=" + testSecret, "GEN_TIME=200ms"}, "serve", "-addr", "127.0.0.1:0", "-workers", "1")
	tok := token(t, "acme", "alice")

	const body = `{"prompt":"a lighthouse at dawn","aspect_ratio":"16:9","n":1}`
	first := do(t, "POST", p.url+"/v1/images", tok, "pg:1", body)
	if first.status != 202 {
		t.Fatalf("first: %d %s, want 202", first.status, first.body)
	}
	retry := do(t, "POST", p.url+"/v1/images", tok, "pg:1", body)
	if retry.status != 202 || retry.header.Get("Idempotent-Replayed") != "true" || string(retry.body) != string(first.body) {
		t.Fatalf("retry: %d %v %s, want the replay of %s", retry.status, retry.header, retry.body, first.body)
	}
	drift := do(t, "POST", p.url+"/v1/images", tok, "pg:1", strings.Replace(body, "lighthouse", "harbour", 1))
	m := drift.json(t)
	if drift.status != 409 || m["code"] != string(idemgate.CodeKeyReused) || !reflect.DeepEqual(m["changed"], []any{"/prompt"}) {
		t.Fatalf("drift: %d %s, want 409 key_reused changing /prompt", drift.status, drift.body)
	}
	if h := do(t, "GET", p.url+"/healthz", "", "", ""); h.status != 200 {
		t.Errorf("healthz: %d %s", h.status, h.body)
	}

	// The record is in Postgres, finished.
	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var finished int
	if err := conn.QueryRow(context.Background(), `SELECT count(*) FROM idemgate_records WHERE finished`).Scan(&finished); err != nil {
		t.Fatal(err)
	}
	if finished != 1 {
		t.Errorf("%d finished records in idemgate_records, want 1", finished)
	}
	if out := p.Output(); !strings.Contains(out, "STORE=postgres") {
		t.Errorf("startup lines do not say where records live:\n%s", out)
	}
}
