package pgrecords_test

// Attacks on pgrecords: what a hostile client, a careless pool default or
// a bad network does to the store. Every test here passes on the current
// code and stays as a regression test.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/labstack/echo/v4"
	"github.com/redis/go-redis/v9"

	"github.com/idemgate/idemgate/fingerprint"
	"github.com/idemgate/idemgate/internal/testenv"
	"github.com/idemgate/idemgate/middleware"
	"github.com/idemgate/idemgate/middleware/storetest"
	"github.com/idemgate/idemgate/pgrecords"
)

// poolWith returns a pool on dsn whose config edit changed.
func poolWith(t *testing.T, dsn string, edit func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	edit(cfg)
	pool, err := pgxpool.NewWithConfig(testCtx(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// TestAttackQueryExecModes: users configure pgx pools in other exec modes
// than the default (describe modes for transaction pooling). The whole
// conformance suite holds in each. (The simple protocol and exec mode do
// not: see the attack17 report.)
func TestAttackQueryExecModes(t *testing.T) {
	t.Parallel()
	runExecModes(t, pgx.QueryExecModeDescribeExec, pgx.QueryExecModeCacheDescribe)
}

// runExecModes runs the conformance suite on stores whose pools use each
// of modes.
func runExecModes(t *testing.T, modes ...pgx.QueryExecMode) {
	dsn := testenv.PostgresDSN(t)
	newStore(t, newPool(t, dsn)) // migrate once
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			var stores []*pgrecords.Store
			for range 2 {
				pool := poolWith(t, dsn, func(c *pgxpool.Config) { c.ConnConfig.DefaultQueryExecMode = mode })
				s, err := pgrecords.New(testCtx(t), pool)
				if err != nil {
					t.Fatal(err)
				}
				stores = append(stores, s)
			}
			storetest.Run(t, func(t *testing.T) storetest.Harness {
				return storetest.Harness{Store: stores[0], Other: stores[1], Advance: time.Sleep, Lease: realLease}
			})
		})
	}
}

// TestAttackKeyNotText: Postgres text holds neither NUL nor invalid UTF-8
// (keys derived by keyspace never carry them, but a store is called
// directly too). Every method answers a clear error: never a panic, never
// a claim, replay or ErrLeaseLost that could be taken as an answer.
func TestAttackKeyNotText(t *testing.T) {
	t.Parallel()
	s := newStore(t, newPool(t, testenv.PostgresDSN(t)))
	for _, k := range []string{"idem:a\x00b", "idem:\xff\xfe", "\x00", "idem:" + string([]byte{0xc3, 0x28})} {
		req := request(time.Minute)
		if res, err := s.Claim(testCtx(t), k, req); err == nil {
			t.Errorf("Claim(%q) = %v, want an error", k, res.Status)
		}
		for name, err := range map[string]error{
			"Extend":   s.Extend(testCtx(t), k, req.Token, time.Minute),
			"Complete": s.Complete(testCtx(t), k, req.Token, sample(), time.Hour),
			"Release":  s.Release(testCtx(t), k, req.Token),
		} {
			if err == nil || errors.Is(err, middleware.ErrLeaseLost) || !strings.HasPrefix(err.Error(), "pgrecords: ") {
				t.Errorf("%s(%q) = %v, want a pgrecords error other than ErrLeaseLost", name, k, err)
			}
		}
	}
	// The key that differs only after a NUL is its own key: no record of
	// "idem:a" answers for "idem:a\x00b".
	req := request(time.Minute)
	mustClaim(t, s, "idem:a", req, middleware.Claimed)
	if res, err := s.Claim(testCtx(t), "idem:a\x00b", request(time.Minute)); err == nil {
		t.Errorf("Claim of a NUL-suffixed key = %v, want an error", res.Status)
	}
}

// TestAttackLongKey: a key longer than a btree entry holds is refused
// with an error (and a key as long as keyspace can derive is accepted).
func TestAttackLongKey(t *testing.T) {
	t.Parallel()
	s := newStore(t, newPool(t, testenv.PostgresDSN(t)))
	// keyspace's longest: idem: + 765 (255 escaped tenant bytes) + : + 64 + : + 64 + : + 64.
	long := "idem:" + strings.Repeat("%FF", 255) + ":" + strings.Repeat("k", 64) + ":" + strings.Repeat("a", 64) + ":" + strings.Repeat("b", 64)
	req := request(time.Minute)
	mustClaim(t, s, long, req, middleware.Claimed)
	if err := s.Complete(testCtx(t), long, req.Token, sample(), time.Hour); err != nil {
		t.Fatal(err)
	}
	r := req
	r.Token = token()
	mustClaim(t, s, long, r, middleware.Finished)
	// Incompressible and too long for a btree entry.
	var b strings.Builder
	for i := range 4000 {
		fmt.Fprintf(&b, "%c", 'A'+rune((i*7919)%26)+rune(i%2)*32)
	}
	huge := key() + b.String() + key() + strings.Repeat(key(), 50)
	if res, err := s.Claim(testCtx(t), huge, request(time.Minute)); err != nil {
		if !strings.HasPrefix(err.Error(), "pgrecords: claim: ") {
			t.Errorf("Claim of a %d-byte key: %v, want a pgrecords error", len(huge), err)
		}
	} else if res.Status != middleware.Claimed {
		t.Errorf("Claim of a %d-byte key = %v", len(huge), res.Status)
	}
}

// TestAttackIdentEdges: empty, huge, non-UTF-8 and NUL-laden owner, kind
// and fingerprint values, and pairs whose naive concatenation collides
// ("ab"+"c" vs "a"+"bc", a kind that ends the owner, a fingerprint that
// carries the kind): each pair is a mismatch, never a replay.
func TestAttackIdentEdges(t *testing.T) {
	t.Parallel()
	s := newStore(t, newPool(t, testenv.PostgresDSN(t)))
	big := strings.Repeat("\xff\x00", 1<<16)
	type ident struct{ owner, kind, fp string }
	pairs := [][2]ident{
		{{"ab", "c", "f"}, {"a", "bc", "f"}},
		{{"a", "bc", "f"}, {"a", "b", "cf"}},
		{{"", "", ""}, {"", "", "\x00"}},
		{{"", "", ""}, {"\x00", "", ""}},
		{{"", "x", ""}, {"x", "", ""}},
		{{"\x01a", "", ""}, {"", "\x01a", ""}},
		{{"o", "k", "\x01k" + "v1:x"}, {"o", "k\x01k", "v1:x"}},
		{{big, "k", "f"}, {big[:len(big)-1], "\x00k", "f"}},
		{{"é", "k", "f"}, {"e\u0301", "k", "f"}},
		{{"\xff", "k", "f"}, {"\xfe", "k", "f"}},
		{{"o", "k", big}, {"o", "k", big + "\x00"}},
	}
	for i, p := range pairs {
		k := key()
		first := request(time.Minute)
		first.Owner, first.Kind, first.Fingerprint = p[0].owner, p[0].kind, fingerprint.Fingerprint(p[0].fp)
		mustClaim(t, s, k, first, middleware.Claimed)
		second := first
		second.Token = token()
		second.Owner, second.Kind, second.Fingerprint = p[1].owner, p[1].kind, fingerprint.Fingerprint(p[1].fp)
		if bytes.Equal(pgrecords.Ident(first), pgrecords.Ident(second)) {
			t.Fatalf("pair %d: idents collide", i)
		}
		res := mustClaim(t, s, k, second, middleware.Mismatch)
		if res.Response.Body != nil || res.Response.Status != 0 || res.RetryAfter != 0 {
			t.Errorf("pair %d running: mismatch carries %+v", i, res)
		}
		if err := s.Complete(testCtx(t), k, first.Token, sample(), time.Hour); err != nil {
			t.Fatal(err)
		}
		res = mustClaim(t, s, k, second, middleware.Mismatch)
		if res.Response.Body != nil || res.Response.Status != 0 || res.Response.Header != nil {
			t.Errorf("pair %d finished: mismatch carries %+v", i, res)
		}
		again := first
		again.Token = token()
		if res := mustClaim(t, s, k, again, middleware.Finished); !bytes.Equal(res.Response.Body, sample().Body) {
			t.Errorf("pair %d: replay body %q", i, res.Response.Body)
		}
	}
}

// TestAttackCorruptRows: rows no store wrote (a finished record without
// a response, bad response bytes, an impossible status, a truncated
// header) make Claim return an error for the matching request, never a
// panic or a replay of garbage; a mismatching request still gets a bare
// Mismatch.
func TestAttackCorruptRows(t *testing.T) {
	t.Parallel()
	pool := newPool(t, testenv.PostgresDSN(t))
	s := newStore(t, pool)
	for name, response := range map[string][]byte{
		"null":             nil,
		"empty":            {},
		"one byte":         {0},
		"status 0":         {0, 0, 0},
		"status 65535":     {0xff, 0xff, 0},
		"names overflow":   {0, 200, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01},
		"names too many":   {0, 200, 0x7f},
		"value overflow":   {0, 200, 1, 1, 'a', 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01},
		"string too long":  {0, 200, 1, 0x7f, 'a'},
		"varint unfinised": {0, 200, 0x80, 0x80},
	} {
		k := key()
		req := request(time.Minute)
		if _, err := pool.Exec(testCtx(t), `INSERT INTO idemgate_records (key, token, finished, expires_at, ident, response)
			VALUES ($1, gen_random_uuid(), true, now() + interval '1 hour', $2, $3)`, k, pgrecords.Ident(req), response); err != nil {
			t.Fatal(err)
		}
		res, err := s.Claim(testCtx(t), k, req)
		if err == nil {
			t.Errorf("%s: Claim = %+v, want an error", name, res)
		}
		other := req
		other.Fingerprint += "x"
		mustClaim(t, s, k, other, middleware.Mismatch)
	}
}

// TestAttackLargeResponse: a response of several MB with many headers
// (binary values, empty values, repeated names) replays byte for byte,
// through the claim statement's single response column.
func TestAttackLargeResponse(t *testing.T) {
	t.Parallel()
	s := newStore(t, newPool(t, testenv.PostgresDSN(t)))
	body := make([]byte, 6<<20)
	for i := range body {
		body[i] = byte(i*31 + i>>8)
	}
	h := http.Header{}
	for i := range 500 {
		name := fmt.Sprintf("X-H%d", i)
		h[name] = []string{strings.Repeat("v", i), "", "\x00\xff" + name}
	}
	h["X-None"] = []string{}
	want := middleware.Response{Status: 299, Header: h, Body: body}
	k := key()
	req := request(time.Minute)
	mustClaim(t, s, k, req, middleware.Claimed)
	if err := s.Complete(testCtx(t), k, req.Token, want, time.Hour); err != nil {
		t.Fatal(err)
	}
	r := req
	r.Token = token()
	got := mustClaim(t, s, k, r, middleware.Finished).Response
	if got.Status != want.Status || !bytes.Equal(got.Body, want.Body) || !reflect.DeepEqual(got.Header, want.Header) {
		t.Errorf("replay differs: status %d, %d body bytes (equal %v), %d headers (equal %v)",
			got.Status, len(got.Body), bytes.Equal(got.Body, want.Body), len(got.Header), reflect.DeepEqual(got.Header, want.Header))
	}
}

// TestAttackFencingSequences: stale and out-of-order calls of a token
// whose claim expired, was reclaimed, released or finished change
// nothing and answer ErrLeaseLost (or nil for a resent Complete).
func TestAttackFencingSequences(t *testing.T) {
	t.Parallel()
	dsn := testenv.PostgresDSN(t)
	s, s2 := newStore(t, newPool(t, dsn)), newStore(t, newPool(t, dsn))
	lost := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, middleware.ErrLeaseLost) {
			t.Errorf("%s = %v, want ErrLeaseLost", what, err)
		}
	}

	// Expired and reclaimed: the stale token can do nothing; the new holder
	// is untouched.
	k := key()
	stale := request(50 * time.Millisecond)
	mustClaim(t, s, k, stale, middleware.Claimed)
	time.Sleep(150 * time.Millisecond)
	lost("Extend of an expired claim", s.Extend(testCtx(t), k, stale.Token, time.Hour))
	fresh := request(time.Hour)
	mustClaim(t, s2, k, fresh, middleware.Claimed)
	lost("stale Extend", s.Extend(testCtx(t), k, stale.Token, time.Hour))
	lost("stale Complete", s.Complete(testCtx(t), k, stale.Token, sample(), time.Hour))
	lost("stale Release", s.Release(testCtx(t), k, stale.Token))
	resent := stale
	resent.Lease = time.Hour
	mustClaim(t, s, k, resent, middleware.Running) // the stale token's resent claim finds the new holder
	if err := s2.Complete(testCtx(t), k, fresh.Token, sample(), time.Hour); err != nil {
		t.Fatalf("fresh Complete: %v", err)
	}
	// Resent Complete (a different response even) succeeds and changes nothing.
	other := sample()
	other.Body = []byte("other")
	if err := s.Complete(testCtx(t), k, fresh.Token, other, time.Hour); err != nil {
		t.Errorf("resent Complete = %v, want nil", err)
	}
	lost("Extend after Complete", s.Extend(testCtx(t), k, fresh.Token, time.Hour))
	lost("Release after Complete", s.Release(testCtx(t), k, fresh.Token))
	lost("stale Complete after Complete", s.Complete(testCtx(t), k, stale.Token, other, time.Hour))
	r := fresh
	r.Token = token()
	if got := mustClaim(t, s, k, r, middleware.Finished).Response; !bytes.Equal(got.Body, sample().Body) {
		t.Errorf("replay %q, want the first Complete's body", got.Body)
	}
	// The finishing token's resent claim replays too.
	mustClaim(t, s, k, fresh, middleware.Finished)

	// Release, then everything of that token is lost; its resent claim
	// claims afresh (the record is gone).
	k = key()
	req := request(time.Hour)
	mustClaim(t, s, k, req, middleware.Claimed)
	if err := s.Release(testCtx(t), k, req.Token); err != nil {
		t.Fatal(err)
	}
	lost("Complete after Release", s.Complete(testCtx(t), k, req.Token, sample(), time.Hour))
	lost("Extend after Release", s.Extend(testCtx(t), k, req.Token, time.Hour))
	lost("Release after Release", s.Release(testCtx(t), k, req.Token))

	// A finished record past its retention: the finishing token's
	// resent Complete is lost (the record is expired), and the key claims.
	k = key()
	req = request(time.Hour)
	mustClaim(t, s, k, req, middleware.Claimed)
	if err := s.Complete(testCtx(t), k, req.Token, sample(), 50*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	time.Sleep(150 * time.Millisecond)
	lost("resent Complete past retention", s.Complete(testCtx(t), k, req.Token, sample(), time.Hour))
	r = req
	r.Token = token()
	mustClaim(t, s, k, r, middleware.Claimed)
}

// TestAttackTinyDurations: a lease or retention of 1µs, zero or negative
// never makes a live record (the store rounds up to 1µs: it expires at
// once), and nothing errors.
func TestAttackTinyDurations(t *testing.T) {
	t.Parallel()
	s := newStore(t, newPool(t, testenv.PostgresDSN(t)))
	for _, d := range []time.Duration{time.Nanosecond, 0, -time.Hour, math.MinInt64} {
		k := key()
		req := request(d)
		mustClaim(t, s, k, req, middleware.Claimed)
		time.Sleep(2 * time.Millisecond)
		r := request(time.Hour)
		mustClaim(t, s, k, r, middleware.Claimed)
		if err := s.Complete(testCtx(t), k, r.Token, sample(), d); err != nil {
			t.Errorf("Complete with retention %v: %v", d, err)
		}
		time.Sleep(2 * time.Millisecond)
		mustClaim(t, s, k, request(time.Hour), middleware.Claimed)
	}
}

// TestAttackSweepRacesClaims: many goroutines on two pools claim,
// complete and release short-lived records while others sweep: every
// claim answers (no "did not settle"), every key has at most one holder at
// a time, and a completed record is never swept while live.
func TestAttackSweepRacesClaims(t *testing.T) {
	t.Parallel()
	dsn := testenv.PostgresDSN(t)
	stores := []*pgrecords.Store{newStore(t, newPool(t, dsn)), newStore(t, newPool(t, dsn))}
	keys := []string{key(), key(), key(), key()}
	ctx, cancel := context.WithTimeout(testCtx(t), 3*time.Second)
	defer cancel()
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		holders = map[string]middleware.Token{}
	)
	for g := range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := stores[g%2]
			for i := 0; ctx.Err() == nil; i++ {
				k := keys[(g+i)%len(keys)]
				req := request(time.Duration(1+i%5) * time.Millisecond)
				res, err := s.Claim(ctx, k, req)
				if ctx.Err() != nil {
					return
				}
				if err != nil {
					t.Errorf("Claim: %v", err)
					return
				}
				if res.Status != middleware.Claimed {
					continue
				}
				mu.Lock()
				holders[k] = req.Token
				mu.Unlock()
				switch i % 3 {
				case 0:
					err = s.Complete(ctx, k, req.Token, sample(), time.Duration(1+i%3)*time.Millisecond)
				case 1:
					err = s.Release(ctx, k, req.Token)
				default:
					err = s.Extend(ctx, k, req.Token, time.Millisecond)
				}
				if err != nil && !errors.Is(err, middleware.ErrLeaseLost) && ctx.Err() == nil {
					t.Errorf("fenced call: %v", err)
				}
			}
		}()
	}
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				if _, err := stores[g%2].Sweep(ctx); err != nil && ctx.Err() == nil {
					t.Errorf("Sweep: %v", err)
				}
			}
		}()
	}
	wg.Wait()
	// A long-lived finished record survives sweeps.
	k := key()
	req := request(time.Hour)
	mustClaim(t, stores[0], k, req, middleware.Claimed)
	if err := stores[0].Complete(testCtx(t), k, req.Token, sample(), time.Hour); err != nil {
		t.Fatal(err)
	}
	for _, s := range stores {
		if _, err := s.Sweep(testCtx(t)); err != nil {
			t.Fatal(err)
		}
	}
	r := req
	r.Token = token()
	mustClaim(t, stores[1], k, r, middleware.Finished)
}

// TestAttackReadOnlyDatabase: a pool whose sessions default to read-only
// transactions (a replica, default_transaction_read_only) cannot claim: a
// clear error, not a false answer; a replay of an existing record still
// reads.
func TestAttackReadOnlyDatabase(t *testing.T) {
	t.Parallel()
	dsn := testenv.PostgresDSN(t)
	rw := newStore(t, newPool(t, dsn))
	k := key()
	req := request(time.Hour)
	mustClaim(t, rw, k, req, middleware.Claimed)
	if err := rw.Complete(testCtx(t), k, req.Token, sample(), time.Hour); err != nil {
		t.Fatal(err)
	}
	ro, err := pgrecords.New(testCtx(t), poolWith(t, dsn, func(c *pgxpool.Config) {
		c.ConnConfig.RuntimeParams["default_transaction_read_only"] = "on"
	}))
	if err != nil {
		t.Fatal(err)
	}
	var pgErr *pgconn.PgError
	res, err := ro.Claim(testCtx(t), key(), request(time.Hour))
	if !errors.As(err, &pgErr) || pgErr.Code != "25006" {
		t.Errorf("Claim on a read-only session = %+v, %v; want SQLSTATE 25006", res, err)
	}
	r := req
	r.Token = token()
	mustClaim(t, ro, k, r, middleware.Finished)
	if err := ro.Migrate(testCtx(t)); err != nil {
		t.Logf("Migrate on a read-only session (already migrated): %v", err)
	}
	if _, err := ro.Sweep(testCtx(t)); !errors.As(err, &pgErr) {
		t.Errorf("Sweep on a read-only session = %v, want a Postgres error", err)
	}
}

// TestAttackTerminatedConnections: pg_terminate_backend of the pool's
// connections between calls makes at most the call that hit a dead
// connection fail; the record and its fencing survive, and the pool
// recovers.
func TestAttackTerminatedConnections(t *testing.T) {
	t.Parallel()
	dsn := testenv.PostgresDSN(t)
	admin := newPool(t, dsn)
	pool := newPool(t, dsn)
	s := newStore(t, pool)
	kill := func() {
		t.Helper()
		if _, err := admin.Exec(testCtx(t), `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
			WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'`); err != nil {
			t.Fatal(err)
		}
	}
	// retry is what a caller (the middleware's retry by the client) does;
	// each dead connection fails one call, and the pool holds at most
	// MaxConns of them.
	retry := func(f func() error) error {
		var err error
		for range int(pool.Config().MaxConns) + 1 {
			if err = f(); err == nil || errors.Is(err, middleware.ErrLeaseLost) {
				return err
			}
		}
		return err
	}
	k := key()
	req := request(time.Hour)
	kill()
	var res middleware.ClaimResult
	if err := retry(func() (err error) { res, err = s.Claim(testCtx(t), k, req); return err }); err != nil || res.Status != middleware.Claimed {
		t.Fatalf("Claim after kill: %+v, %v", res, err)
	}
	kill()
	if err := retry(func() error { return s.Extend(testCtx(t), k, req.Token, time.Hour) }); err != nil {
		t.Fatalf("Extend after kill: %v", err)
	}
	kill()
	if err := retry(func() error { return s.Complete(testCtx(t), k, req.Token, sample(), time.Hour) }); err != nil {
		t.Fatalf("Complete after kill: %v", err)
	}
	kill()
	r := req
	r.Token = token()
	if err := retry(func() (err error) { res, err = s.Claim(testCtx(t), k, r); return err }); err != nil || res.Status != middleware.Finished {
		t.Fatalf("replay after kill: %+v, %v", res, err)
	}
}

// TestAttackSchemas: two stores on one database whose pools have
// different search_paths keep separate tables (Migrate from many
// goroutines at once creates each once) and never see each other's
// records.
func TestAttackSchemas(t *testing.T) {
	t.Parallel()
	dsn := testenv.PostgresDSN(t)
	admin := newPool(t, dsn)
	if _, err := admin.Exec(testCtx(t), `CREATE SCHEMA tenant_a; CREATE SCHEMA tenant_b`); err != nil {
		t.Fatal(err)
	}
	var stores []*pgrecords.Store
	for _, schema := range []string{"tenant_a", "tenant_b", "public"} {
		pool := poolWith(t, dsn, func(c *pgxpool.Config) { c.ConnConfig.RuntimeParams["search_path"] = schema })
		s, err := pgrecords.New(testCtx(t), pool)
		if err != nil {
			t.Fatal(err)
		}
		stores = append(stores, s)
	}
	var wg sync.WaitGroup
	for i := range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := stores[i%3].Migrate(testCtx(t)); err != nil {
				t.Errorf("Migrate: %v", err)
			}
		}()
	}
	wg.Wait()
	var tables int
	if err := admin.QueryRow(testCtx(t), `SELECT count(*) FROM pg_tables WHERE tablename = 'idemgate_records'`).Scan(&tables); err != nil {
		t.Fatal(err)
	}
	if tables != 3 {
		t.Fatalf("%d records tables, want 3", tables)
	}
	k := key()
	req := request(time.Hour)
	mustClaim(t, stores[0], k, req, middleware.Claimed)
	if err := stores[0].Complete(testCtx(t), k, req.Token, sample(), time.Hour); err != nil {
		t.Fatal(err)
	}
	for _, s := range stores[1:] {
		r := req
		r.Token = token()
		mustClaim(t, s, k, r, middleware.Claimed)
	}
}

// e2e is an echo app with the middleware on s, whose handler counts its
// runs and answers with the body it was sent.
func e2e(t *testing.T, s middleware.Store, cfg middleware.Config) (*echo.Echo, *atomic.Int64) {
	t.Helper()
	var runs atomic.Int64
	cfg.Store = s
	cfg.Scope = func(c echo.Context) (string, string, error) { return "acme", c.Request().Header.Get("X-User"), nil }
	e := echo.New()
	e.POST("/v1/images", func(c echo.Context) error {
		n := runs.Add(1)
		body, _ := io.ReadAll(c.Request().Body)
		c.Response().Header().Set("X-Run", fmt.Sprint(n))
		return c.Blob(http.StatusCreated, "application/octet-stream", append([]byte("secret:"), body...))
	}, middleware.New(cfg))
	return e, &runs
}

func send(e *echo.Echo, user, key string, body []byte) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, "/v1/images", bytes.NewReader(body))
	r.Header.Set("Content-Type", "application/octet-stream")
	r.Header.Set("Idempotency-Key", key)
	r.Header.Set("X-User", user)
	w := httptest.NewRecorder()
	e.ServeHTTP(w, r)
	return w
}

// TestAttackMiddlewareEndToEnd: the middleware on pgrecords, as the
// example wires it with STORE=postgres: a retry replays byte for byte
// without running the handler; another body, another user or a body that
// differs in one byte under the same key get 409 key_reused with nothing
// of the stored response; concurrent identical requests run the handler
// once.
func TestAttackMiddlewareEndToEnd(t *testing.T) {
	t.Parallel()
	s := newStore(t, newPool(t, testenv.PostgresDSN(t)))
	e, runs := e2e(t, s, middleware.Config{})
	body := append([]byte("prompt\x00\xff"), bytes.Repeat([]byte{7}, 1000)...)
	first := send(e, "alice", "req-1", body)
	if first.Code != http.StatusCreated {
		t.Fatalf("first: %d %s", first.Code, first.Body)
	}
	again := send(e, "alice", "req-1", body)
	if again.Code != http.StatusCreated || !bytes.Equal(again.Body.Bytes(), first.Body.Bytes()) ||
		again.Header().Get("Idempotent-Replayed") != "true" || again.Header().Get("X-Run") != "1" {
		t.Errorf("retry: %d %q %v, want the replay", again.Code, again.Body, again.Header())
	}
	for name, w := range map[string]*httptest.ResponseRecorder{
		"another body":          send(e, "alice", "req-1", append(bytes.Clone(body), 0)),
		"one byte flipped":      send(e, "alice", "req-1", append([]byte{'P'}, body[1:]...)),
		"another user, same id": send(e, "bob", "req-1", body),
	} {
		switch name {
		case "another user, same id":
			// Another user's key is another key: a fresh claim, a run of its own.
			if w.Code != http.StatusCreated || w.Header().Get("Idempotent-Replayed") != "" {
				t.Errorf("%s: %d %v, want a run of its own", name, w.Code, w.Header())
			}
		default:
			if w.Code != http.StatusConflict || bytes.Contains(w.Body.Bytes(), []byte("secret")) || w.Header().Get("X-Run") != "" ||
				!bytes.Contains(w.Body.Bytes(), []byte("key_reused")) {
				t.Errorf("%s: %d %q %v, want 409 key_reused carrying nothing", name, w.Code, w.Body, w.Header())
			}
		}
	}
	before := runs.Load()
	var wg sync.WaitGroup
	codes := make([]int, 24)
	for i := range codes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			codes[i] = send(e, "carol", "req-concurrent", body).Code
		}()
	}
	wg.Wait()
	if n := runs.Load() - before; n != 1 {
		t.Errorf("24 concurrent identical requests ran the handler %d times (codes %v)", n, codes)
	}
}

// lockExpired claims k with a lease that runs out at once and has another
// session hold the expired row's lock (as a Sweep batch or a concurrent
// reclaim does while it runs); unlock rolls that session back.
func lockExpired(t *testing.T, pool *pgxpool.Pool, s *pgrecords.Store, k string) (unlock func()) {
	t.Helper()
	mustClaim(t, s, k, request(time.Microsecond), middleware.Claimed)
	time.Sleep(5 * time.Millisecond)
	locker, err := pool.Begin(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = locker.Rollback(context.Background()) })
	if _, err := locker.Exec(testCtx(t), `SELECT 1 FROM idemgate_records WHERE key = $1 FOR UPDATE`, k); err != nil {
		t.Fatal(err)
	}
	return func() {
		t.Helper()
		if err := locker.Rollback(testCtx(t)); err != nil {
			t.Fatal(err)
		}
	}
}

// claimsRunning counts the sessions that run the claim statement.
func claimsRunning(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(testCtx(t), `SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND state = 'active' AND query LIKE '%idemgate_records_claim(%' AND pid <> pg_backend_pid()`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// waitClaims waits until claimsRunning is want (for at most 5s).
func waitClaims(t *testing.T, pool *pgxpool.Pool, want int) {
	t.Helper()
	for range 100 {
		if claimsRunning(t, pool) == want {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("after 5s, %d claims run on the server; want %d", claimsRunning(t, pool), want)
}

// TestAttackAbandonedClaimOnLock: a claim whose context ends (or whose
// statement_timeout fires) while it waits on a row lock returns an error,
// and the server abandons the statement too (pgx sends a cancel request
// when a context ends mid-query): once the lock frees, nothing was
// claimed, so the middleware's release after a failed claim and the
// client's retry find the key free, not held for a lease by nobody.
func TestAttackAbandonedClaimOnLock(t *testing.T) {
	t.Parallel()
	dsn := testenv.PostgresDSN(t)
	pool := newPool(t, dsn)
	s := newStore(t, pool)
	timeouts, err := pgrecords.New(testCtx(t), poolWith(t, dsn, func(c *pgxpool.Config) {
		c.ConnConfig.RuntimeParams["statement_timeout"] = "200ms"
	}))
	if err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]struct {
		s   *pgrecords.Store
		ctx func() (context.Context, context.CancelFunc)
	}{
		"context deadline": {s, func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(testCtx(t), 200*time.Millisecond)
		}},
		"statement_timeout": {timeouts, func() (context.Context, context.CancelFunc) { return testCtx(t), func() {} }},
	} {
		k := key()
		unlock := lockExpired(t, pool, s, k)
		req := request(time.Hour)
		ctx, cancel := c.ctx()
		type answer struct {
			res middleware.ClaimResult
			err error
		}
		done := make(chan answer, 1)
		go func() {
			res, err := c.s.Claim(ctx, k, req)
			done <- answer{res, err}
		}()
		waitClaims(t, pool, 1) // the claim waits on the lock
		a := <-done
		cancel()
		res, err := a.res, a.err
		if err == nil {
			t.Fatalf("%s: Claim blocked on a lock = %v, want an error", name, res.Status)
		}
		var pgErr *pgconn.PgError
		if name == "statement_timeout" && (!errors.As(err, &pgErr) || pgErr.Code != "57014") {
			t.Errorf("%s: Claim = %v, want SQLSTATE 57014", name, err)
		}
		waitClaims(t, pool, 0) // the server abandoned it
		unlock()
		if err := s.Release(testCtx(t), k, req.Token); !errors.Is(err, middleware.ErrLeaseLost) {
			t.Errorf("%s: release of the abandoned claim = %v, want ErrLeaseLost (it never claimed)", name, err)
		}
		mustClaim(t, s, k, request(time.Hour), middleware.Claimed)
	}
}

// TestAttackKeysByteExact: keys that a case-folding, trimming or
// normalizing comparison would merge are different records (the primary
// key compares text byte for byte under a deterministic collation).
func TestAttackKeysByteExact(t *testing.T) {
	t.Parallel()
	s := newStore(t, newPool(t, testenv.PostgresDSN(t)))
	base := key()
	for _, k := range []string{base + "k", base + "K", base + "k ", base + " k", base + "\u00e9", base + "e\u0301", base + "\u212a", base + "k\t"} {
		req := request(time.Hour)
		mustClaim(t, s, k, req, middleware.Claimed)
		if err := s.Complete(testCtx(t), k, req.Token, sample(), time.Hour); err != nil {
			t.Fatal(err)
		}
	}
}

// TestAttackConcurrentFencedCalls: the holder's own calls racing each
// other (a resent Complete beside the first, Complete beside Release,
// Extend beside both), on a pool of one connection and a pool of many:
// Complete and Release never both succeed, a record that Complete
// finished holds exactly one of the responses sent, and a released
// record is gone.
func TestAttackConcurrentFencedCalls(t *testing.T) {
	t.Parallel()
	dsn := testenv.PostgresDSN(t)
	one := newStore(t, poolWith(t, dsn, func(c *pgxpool.Config) { c.MaxConns = 1 }))
	many := newStore(t, newPool(t, dsn))
	stores := []*pgrecords.Store{one, many}
	for round := range 30 {
		k := key()
		req := request(time.Hour)
		mustClaim(t, many, k, req, middleware.Claimed)
		var (
			wg        sync.WaitGroup
			completed atomic.Int64
			released  atomic.Int64
		)
		for i := range 12 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				s := stores[i%2]
				var err error
				switch i % 3 {
				case 0:
					resp := sample()
					resp.Body = []byte(fmt.Sprintf("body-%d", i))
					if err = s.Complete(testCtx(t), k, req.Token, resp, time.Hour); err == nil {
						completed.Add(1)
					}
				case 1:
					if round%2 == 1 {
						if err = s.Release(testCtx(t), k, req.Token); err == nil {
							released.Add(1)
						}
					}
				default:
					err = s.Extend(testCtx(t), k, req.Token, time.Hour)
				}
				if err != nil && !errors.Is(err, middleware.ErrLeaseLost) {
					t.Errorf("round %d: %v", round, err)
				}
			}()
		}
		wg.Wait()
		if completed.Load() > 0 && released.Load() > 0 {
			t.Fatalf("round %d: %d completes and %d releases succeeded", round, completed.Load(), released.Load())
		}
		if released.Load() > 1 {
			t.Fatalf("round %d: %d releases succeeded", round, released.Load())
		}
		r := request(time.Hour)
		res := mustClaim(t, one, k, r, map[bool]middleware.ClaimStatus{true: middleware.Finished, false: middleware.Claimed}[completed.Load() > 0])
		if res.Status == middleware.Finished && !bytes.HasPrefix(res.Response.Body, []byte("body-")) {
			t.Fatalf("round %d: replay %q", round, res.Response.Body)
		}
	}
}

// The four below failed before the fixes of the #17 attack pass (seen failing: a
// [16]byte token had no text encoding for the simple protocol and exec mode;
// math.MaxInt64 leases overflowed to 1µs / 1ms; 40001 under REPEATABLE READ
// and SERIALIZABLE session defaults).

// TestAttackHugeDurations: a lease or retention of math.MaxInt64 ("for
// ever", the largest time.Duration) must keep the record live, as any
// other long duration does; a rounding overflow must not turn it into 1µs.
func TestAttackHugeDurations(t *testing.T) {
	t.Parallel()
	pg := newStore(t, newPool(t, testenv.PostgresDSN(t)))
	rc := redis.NewClient(testenv.Redis(t)) // a real server: miniredis TTLs do not count down
	t.Cleanup(func() { rc.Close() })
	for name, s := range map[string]middleware.Store{"postgres": pg, "redis": middleware.NewRedisStore(rc)} {
		for _, d := range []time.Duration{math.MaxInt64, math.MaxInt64 - 1, 200 * 365 * 24 * time.Hour} {
			k := key()
			mustClaim(t, s, k, request(d), middleware.Claimed)
			time.Sleep(5 * time.Millisecond)
			if res, err := s.Claim(testCtx(t), k, request(time.Hour)); err != nil || res.Status != middleware.Running {
				t.Errorf("%s: lease %v: a second claim = %v, %v; want running", name, d, res.Status, err)
			}
			k = key()
			req := request(time.Hour)
			mustClaim(t, s, k, req, middleware.Claimed)
			if err := s.Complete(testCtx(t), k, req.Token, sample(), d); err != nil {
				t.Errorf("%s: Complete with retention %v: %v", name, d, err)
			}
			time.Sleep(5 * time.Millisecond)
			if res, err := s.Claim(testCtx(t), k, request(time.Hour)); err != nil || res.Status != middleware.Finished {
				t.Errorf("%s: retention %v: a retry = %v, %v; want finished (a replay)", name, d, res.Status, err)
			}
		}
	}
}

// TestAttackIsolationDefault: a pool whose sessions default to REPEATABLE
// READ or SERIALIZABLE (default_transaction_isolation, set by a framework
// or a role) still answers concurrent claims of one key: one winner, the
// others running, no error (an error is a 503 to the client).
func TestAttackIsolationDefault(t *testing.T) {
	t.Parallel()
	dsn := testenv.PostgresDSN(t)
	newStore(t, newPool(t, dsn))
	for _, level := range []string{"repeatable read", "serializable"} {
		t.Run(level, func(t *testing.T) {
			var stores []*pgrecords.Store
			for range 2 {
				s, err := pgrecords.New(testCtx(t), poolWith(t, dsn, func(c *pgxpool.Config) {
					c.ConnConfig.RuntimeParams["default_transaction_isolation"] = level
				}))
				if err != nil {
					t.Fatal(err)
				}
				stores = append(stores, s)
			}
			var errs, winners int
			for round := range 20 {
				k := key()
				var (
					wg sync.WaitGroup
					mu sync.Mutex
					w  int
				)
				for i := range 16 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						res, err := stores[(i+round)%2].Claim(testCtx(t), k, request(time.Hour))
						mu.Lock()
						defer mu.Unlock()
						if err != nil {
							if errs == 0 {
								t.Errorf("Claim under %s: %v", level, err)
							}
							errs++
							return
						}
						if res.Status == middleware.Claimed {
							w++
						}
					}()
				}
				wg.Wait()
				if w > 1 {
					t.Errorf("round %d: %d winners", round, w)
				}
				winners += w
			}
			if errs > 0 {
				t.Errorf("%d of 320 concurrent claims failed under %s", errs, level)
			}
		})
	}
}

// TestAttackQueryExecModesWithoutPrepare: a pool in the simple protocol
// or exec mode (what PgBouncer users set, often in the URL:
// ?default_query_exec_mode=exec) must run the store like any other.
func TestAttackQueryExecModesWithoutPrepare(t *testing.T) {
	t.Parallel()
	runExecModes(t, pgx.QueryExecModeSimpleProtocol, pgx.QueryExecModeExec)
}

// TestAttackRetentionForeverEndToEnd: Config.Retention of math.MaxInt64
// passes the middleware's validation; a retry must replay, not run the
// handler again.
func TestAttackRetentionForeverEndToEnd(t *testing.T) {
	t.Parallel()
	s := newStore(t, newPool(t, testenv.PostgresDSN(t)))
	e, runs := e2e(t, s, middleware.Config{Retention: math.MaxInt64})
	for range 3 {
		send(e, "alice", "req-forever", []byte("once"))
		time.Sleep(5 * time.Millisecond)
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("three sends of one request ran the handler %d times, want once (then replays)", n)
	}
}
