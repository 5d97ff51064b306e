package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemgate/idemgate/internal/testenv"
)

// startStacks builds the named stacks on real servers, as a run does.
func startStacks(t *testing.T, ctx context.Context, names ...string) *bench {
	t.Helper()
	return startBench(t, ctx, options{stacks: names, pgWrite: pgWriteTask}, nil)
}

// startBench builds o's stacks on real servers, as a run does, each
// counted pool also traced by tracer when it is not nil.
func startBench(t *testing.T, ctx context.Context, o options, tracer pgx.QueryTracer) *bench {
	t.Helper()
	ro := testenv.Redis(t)
	o.concurrency, o.pgConns = 2, 2
	o.redisURL = fmt.Sprintf("redis://%s/%d", ro.Addr, ro.DB)
	o.databaseURL = testenv.PostgresDSN(t)
	e, err := startEnv(ctx, o, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.close)
	e.tracer = tracer
	b := newBench(e, o, io.Discard)
	if err := b.start(ctx); err != nil {
		t.Fatal(err)
	}
	return b
}

type reply struct {
	status int
	header http.Header
	body   []byte
}

// post sends one POST /v1/images as the load tool's clients do.
func post(t *testing.T, ctx context.Context, st *stack, key string, body []byte, fresh bool) reply {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, st.url+"/v1/images", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("X-Tenant", "lt-pg-"+st.name)
	req.Header.Set("X-User", "user-1")
	if fresh {
		req.Header.Set(expectHeader, "new")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return reply{resp.StatusCode, resp.Header, b}
}

// TestPGStacks: each Postgres stack answers a new key 202, the same
// request again with the same answer marked as a replay, and other
// parameters under that key 409; and its records pool sends the round
// trips the report says: 2 for a miss, 1 for a replay or a conflict. The
// pg-floor stays correct when told wrongly whether a key is new, at the
// cost of one more round trip.
func TestPGStacks(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b := startStacks(t, ctx, pgFloorName, idemgatePGName)
	type step struct {
		name       string
		key        string
		body       []byte
		fresh      bool
		wantStatus int
		wantReplay bool // the first answer for key, marked as replayed
		wantRT     int64
	}
	steps := []step{
		{name: "miss", key: "k1", body: baseBody, fresh: true, wantStatus: 202, wantRT: 2},
		{name: "replay", key: "k1", body: baseBody, wantStatus: 202, wantReplay: true, wantRT: 1},
		{name: "conflict", key: "k1", body: driftBody, wantStatus: 409, wantRT: 1},
		{name: "miss of a key sent before the replays", key: "k2", body: baseBody, fresh: true, wantStatus: 202, wantRT: 2},
		{name: "replay again", key: "k2", body: baseBody, wantStatus: 202, wantReplay: true, wantRT: 1},
	}
	for _, st := range b.stacks {
		t.Run(st.name, func(t *testing.T) {
			first := map[string]reply{}
			for _, s := range steps {
				before := st.pgrt.Load()
				got := post(t, ctx, st, s.key, s.body, s.fresh)
				rt := st.pgrt.Load() - before
				if got.status != s.wantStatus {
					t.Fatalf("%s: status %d, want %d: %s", s.name, got.status, s.wantStatus, got.body)
				}
				if rt != s.wantRT {
					t.Errorf("%s: %d Postgres round trips on the records pool, want %d", s.name, rt, s.wantRT)
				}
				replayed := got.header.Get("Idempotent-Replayed") == "true"
				if replayed != s.wantReplay {
					t.Errorf("%s: Idempotent-Replayed %q", s.name, got.header.Get("Idempotent-Replayed"))
				}
				if f, ok := first[s.key]; !ok {
					first[s.key] = got
				} else if s.wantReplay && (!bytes.Equal(got.body, f.body) || got.header.Get("Location") != f.header.Get("Location")) {
					t.Errorf("%s: replayed %s (Location %q), first answer %s (Location %q)", s.name,
						got.body, got.header.Get("Location"), f.body, f.header.Get("Location"))
				}
			}
			if n := st.execs.total.Load(); n != 2 {
				t.Errorf("the handler ran %d times for 2 keys", n)
			}
		})
	}

	// The floor's rows are as wide as pgrecords' for the same requests.
	width := func(table string) (ident, response float64) {
		t.Helper()
		if err := b.env.db.QueryRow(ctx, `SELECT avg(octet_length(ident)), avg(octet_length(response)) FROM `+table).
			Scan(&ident, &response); err != nil {
			t.Fatal(err)
		}
		return ident, response
	}
	fi, fr := width(pgFloorTable)
	ri, rr := width(recordsTable)
	if fi != ri || math.Abs(fr-rr) > 4 {
		t.Errorf("pg-floor rows hold %v bytes of ident and %v of response, pgrecords' %v and %v", fi, fr, ri, rr)
	}

	floor := b.stacks[slices.IndexFunc(b.stacks, func(st *stack) bool { return st.name == pgFloorName })]
	t.Run("pg-floor told wrongly", func(t *testing.T) {
		for _, s := range []step{
			{name: "a new key said to be known: read, then claim", key: "k3", body: baseBody, wantStatus: 202, wantRT: 3},
			{name: "a known key said to be new: claim lost, then read", key: "k3", body: baseBody, fresh: true, wantStatus: 202, wantReplay: true, wantRT: 2},
			{name: "other parameters said to be new", key: "k3", body: driftBody, fresh: true, wantStatus: 409, wantRT: 2},
		} {
			before := floor.pgrt.Load()
			got := post(t, ctx, floor, s.key, s.body, s.fresh)
			if rt := floor.pgrt.Load() - before; got.status != s.wantStatus || rt != s.wantRT {
				t.Errorf("%s: status %d with %d round trips, want %d with %d: %s", s.name, got.status, rt, s.wantStatus, s.wantRT, got.body)
			}
			if replayed := got.header.Get("Idempotent-Replayed") == "true"; replayed != s.wantReplay {
				t.Errorf("%s: Idempotent-Replayed %q", s.name, got.header.Get("Idempotent-Replayed"))
			}
		}
	})
}

// statementLog is a pgx tracer that keeps each round trip's statements:
// a query on its own, a batch's in order.
type statementLog struct {
	mu    sync.Mutex
	trips [][]string
}

func (l *statementLog) add(sqls ...string) {
	l.mu.Lock()
	l.trips = append(l.trips, sqls)
	l.mu.Unlock()
}

// take returns the round trips so far, each statement named by
// statementName, and forgets them.
func (l *statementLog) take() [][]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([][]string, len(l.trips))
	for i, trip := range l.trips {
		for _, sql := range trip {
			out[i] = append(out[i], statementName(sql))
		}
	}
	l.trips = nil
	return out
}

func (l *statementLog) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	l.add(d.SQL)
	return ctx
}

func (l *statementLog) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (l *statementLog) TraceBatchStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	var sqls []string
	for _, q := range d.Batch.QueuedQueries {
		sqls = append(sqls, q.SQL)
	}
	l.add(sqls...)
	return ctx
}

func (l *statementLog) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (l *statementLog) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// statementName names what a statement does, for comparing round trips:
// begin, set local, commit, ledger insert, records (a statement on
// pgrecords' table: claim or completion), or else the statement itself.
func statementName(sql string) string {
	s := strings.ToLower(strings.TrimSpace(sql))
	switch {
	case s == "begin" || s == "commit":
		return s
	case strings.HasPrefix(s, "set local "):
		return "set local"
	case sql == sqlLedgerInsert:
		return "ledger insert"
	case strings.Contains(s, recordsTable):
		return "records"
	}
	return sql
}

// TestPGStacksLedger: with -pg-write ledger, idemgate-pg and
// idemgate-pg-atomic write one ledger row per new key and nothing for a
// replay or a conflict, and their records pools send the statements the
// comparison rests on. A miss is 3 round trips on either: the claim; the
// INSERT (on the Atomic route with BEGIN and its two SET LOCALs in front,
// the idle limit and the store's transaction mark, in the same round
// trip: pgrecords' lazy transaction); the completion (on the Atomic route
// with the two SET LOCALs that undo a handler's statement and lock
// timeouts in front and COMMIT behind it, in the same round trip). A
// replay or a conflict is the claim alone: no transaction is opened.
func TestPGStacksLedger(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	log := &statementLog{}
	b := startBench(t, ctx, options{stacks: []string{idemgatePGName, idemgatePGAtomicName}, pgWrite: pgWriteLedger}, log)
	plainMiss := [][]string{{"records"}, {"ledger insert"}, {"records"}}
	atomicMiss := [][]string{{"records"}, {"begin", "set local", "set local", "ledger insert"}, {"set local", "set local", "records", "commit"}}
	claimOnly := [][]string{{"records"}}
	type step struct {
		name       string
		key        string
		body       []byte
		wantStatus int
		wantReplay bool
		wantRows   int // the tenant's ledger rows after the step
		wantTrips  map[string][][]string
	}
	steps := []step{
		{name: "miss", key: "k1", body: baseBody, wantStatus: 202, wantRows: 1,
			wantTrips: map[string][][]string{idemgatePGName: plainMiss, idemgatePGAtomicName: atomicMiss}},
		{name: "replay", key: "k1", body: baseBody, wantStatus: 202, wantReplay: true, wantRows: 1,
			wantTrips: map[string][][]string{idemgatePGName: claimOnly, idemgatePGAtomicName: claimOnly}},
		{name: "conflict", key: "k1", body: driftBody, wantStatus: 409, wantRows: 1,
			wantTrips: map[string][][]string{idemgatePGName: claimOnly, idemgatePGAtomicName: claimOnly}},
		{name: "second miss", key: "k2", body: baseBody, wantStatus: 202, wantRows: 2,
			wantTrips: map[string][][]string{idemgatePGName: plainMiss, idemgatePGAtomicName: atomicMiss}},
		{name: "second replay", key: "k2", body: baseBody, wantStatus: 202, wantReplay: true, wantRows: 2,
			wantTrips: map[string][][]string{idemgatePGName: claimOnly, idemgatePGAtomicName: claimOnly}},
	}
	for _, st := range b.stacks {
		t.Run(st.name, func(t *testing.T) {
			if st.table != ledgerTable {
				t.Fatalf("rows counted in %q, want %q", st.table, ledgerTable)
			}
			first := map[string]reply{}
			for _, s := range steps {
				log.take()
				before := st.pgrt.Load()
				got := post(t, ctx, st, s.key, s.body, false)
				rt := st.pgrt.Load() - before
				trips := log.take()
				if got.status != s.wantStatus {
					t.Fatalf("%s: status %d, want %d: %s", s.name, got.status, s.wantStatus, got.body)
				}
				if want := s.wantTrips[st.name]; fmt.Sprint(trips) != fmt.Sprint(want) || rt != int64(len(want)) {
					t.Errorf("%s: %d round trips counted on the records pool, statements %q; want %d: %q",
						s.name, rt, trips, len(want), want)
				}
				if replayed := got.header.Get("Idempotent-Replayed") == "true"; replayed != s.wantReplay {
					t.Errorf("%s: Idempotent-Replayed %q", s.name, got.header.Get("Idempotent-Replayed"))
				}
				if f, ok := first[s.key]; !ok {
					first[s.key] = got
					if taskID(got.body) == "" {
						t.Errorf("%s: no entry id in %s", s.name, got.body)
					}
				} else if s.wantReplay && !bytes.Equal(got.body, f.body) {
					t.Errorf("%s: replayed %s, first answer %s", s.name, got.body, f.body)
				}
				var rows, keys int
				if err := b.env.db.QueryRow(ctx, `SELECT count(*), count(DISTINCT key) FROM `+ledgerTable+` WHERE tenant = $1`,
					"lt-pg-"+st.name).Scan(&rows, &keys); err != nil {
					t.Fatal(err)
				}
				if rows != s.wantRows || keys != rows {
					t.Errorf("%s: %d ledger rows for %d keys, want %d, one per key", s.name, rows, keys, s.wantRows)
				}
			}
			if n, created := st.execs.total.Load(), st.execs.created.Load(); n != 2 || created != 2 {
				t.Errorf("the handler ran %d times and wrote %d rows for 2 keys", n, created)
			}
		})
	}
}

// TestPGFloorTableHasTheRecordsShape: the pg-floor's rows are as wide and
// its table as tuned as pgrecords': same columns, same primary key, same
// storage parameters (fillfactor, autovacuum), which LIKE alone drops.
func TestPGFloorTableHasTheRecordsShape(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b := startStacks(t, ctx, pgFloorName)
	shape := func(table string) string {
		t.Helper()
		var cols, opts, pk string
		err := b.env.db.QueryRow(ctx, `SELECT
	(SELECT string_agg(attname || ' ' || format_type(atttypid, atttypmod) || CASE WHEN attnotnull THEN ' not null' ELSE '' END, ', ' ORDER BY attnum)
		FROM pg_attribute WHERE attrelid = c.oid AND attnum > 0 AND NOT attisdropped),
	coalesce(array_to_string(c.reloptions, ', '), ''),
	(SELECT string_agg(a.attname, ', ') FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
		WHERE i.indrelid = c.oid AND i.indisprimary)
FROM pg_class c WHERE c.oid = $1::regclass`, table).Scan(&cols, &opts, &pk)
		if err != nil {
			t.Fatalf("%s: %v", table, err)
		}
		return fmt.Sprintf("columns (%s) primary key (%s) with (%s)", cols, pk, opts)
	}
	want, got := shape(recordsTable), shape(pgFloorTable)
	if got != want {
		t.Errorf("%s is\n%s\n%s is\n%s", pgFloorTable, got, recordsTable, want)
	}
	var indexes int
	if err := b.env.db.QueryRow(ctx, `SELECT count(*) FROM pg_index WHERE indrelid = $1::regclass`, pgFloorTable).Scan(&indexes); err != nil {
		t.Fatal(err)
	}
	if indexes != 1 {
		t.Errorf("%s has %d indexes, want only its primary key", pgFloorTable, indexes)
	}
}

func FuzzParseFloorResponse(f *testing.F) {
	f.Add("/v1/tasks/0b7e1f9c-3d7a-4c1e-9a53-1f0f6a8d2b11", []byte(`{"task_id":"0b7e"}`))
	f.Add("", []byte{})
	f.Fuzz(func(t *testing.T, location string, body []byte) {
		if strings.Contains(location, "\r\n") {
			t.Skip("a header value has no line break")
		}
		status, loc, got, err := parseFloorResponse(floorResponse(location, body))
		if err != nil || status != http.StatusAccepted || loc != location || !bytes.Equal(got, body) {
			t.Fatalf("parse(floorResponse(%q, %q)) = %d, %q, %q, %v", location, body, status, loc, got, err)
		}
		// Any bytes: an error or a body within them, never a panic.
		if _, _, b, err := parseFloorResponse(body); err == nil && len(b) > len(body) {
			t.Fatalf("parse(%q): body longer than the input", body)
		}
	})
}
