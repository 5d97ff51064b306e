package pgrecords_test

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/fingerprint"
	"github.com/idemgate/idemgate/internal/testenv"
	"github.com/idemgate/idemgate/pgrecords"
)

// TestMismatchResponseStaysInDatabase runs the claim statement itself: for
// a request that differs from the record's in fingerprint, owner or kind,
// the row it returns holds no response; and the store hands back changed
// fields only to a request of the record's owner and kind.
func TestMismatchResponseStaysInDatabase(t *testing.T) {
	t.Parallel()
	pool := newPool(t, testenv.PostgresDSN(t))
	s := newStore(t, pool)
	k := key()
	req := request(time.Minute)
	req.Fields = []fingerprint.FieldSum{{1, 2, 3, 4}}
	mustClaim(t, s, k, req, idemgate.Claimed)
	if err := s.Complete(testCtx(t), k, req.Token, sample(), time.Hour); err != nil {
		t.Fatal(err)
	}
	response := func(r idemgate.ClaimRequest) []byte {
		t.Helper()
		vals, err := pool.Query(testCtx(t), pgrecords.SQLClaim, k, [16]byte(token()), pgrecords.Ident(r), []byte(nil), int64(1000000))
		if err != nil {
			t.Fatal(err)
		}
		defer vals.Close()
		if !vals.Next() {
			t.Fatalf("no row: %v", vals.Err())
		}
		raw := vals.RawValues()
		if n := len(raw); n != 8 {
			t.Fatalf("%d columns, want 8", n)
		}
		return raw[6]
	}
	for _, c := range []struct {
		name    string
		edit    func(*idemgate.ClaimRequest)
		changed bool
	}{
		{"fingerprint", func(r *idemgate.ClaimRequest) { r.Fingerprint += "x" }, true},
		{"owner", func(r *idemgate.ClaimRequest) { r.Owner += "x" }, false},
		{"kind", func(r *idemgate.ClaimRequest) { r.Kind = "Image" }, false},
		{"owner and kind shifted", func(r *idemgate.ClaimRequest) { r.Owner, r.Kind = r.Owner+"i", r.Kind[1:] }, false},
	} {
		r := req
		r.Token = token()
		r.Fields = []fingerprint.FieldSum{{9, 9, 9, 9}}
		c.edit(&r)
		if b := response(r); b != nil {
			t.Errorf("%s: the claim statement returned the stored response (%d bytes)", c.name, len(b))
		}
		res := mustClaim(t, s, k, r, idemgate.Mismatch)
		if (res.Changed != nil) != c.changed || res.Response.Status != 0 || res.Response.Body != nil {
			t.Errorf("%s: %+v, want a bare mismatch (changed fields only for the record's owner and kind)", c.name, res)
		}
	}
	if b := response(req); b == nil {
		t.Error("matching request: no response")
	}
	r := req
	r.Token = token()
	if res := mustClaim(t, s, k, r, idemgate.Finished); !bytes.Equal(res.Response.Body, sample().Body) {
		t.Errorf("matching request: body %q, want the replay", res.Response.Body)
	}
}

// TestTableIsBuiltForHOT: the primary key on key is the table's only index,
// so no update touches an index, and claim/complete cycles update in place
// (HOT).
func TestTableIsBuiltForHOT(t *testing.T) {
	t.Parallel()
	pool := newPool(t, testenv.PostgresDSN(t))
	s := newStore(t, pool)
	var indexes []string
	rows, err := pool.Query(testCtx(t), `SELECT pg_get_indexdef(indexrelid) FROM pg_index WHERE indrelid = 'idemgate_records'::regclass`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var d string
		if err := rows.Scan(&d); err != nil {
			t.Fatal(err)
		}
		indexes = append(indexes, d)
	}
	if rows.Err() != nil {
		t.Fatal(rows.Err())
	}
	if len(indexes) != 1 || !bytes.Contains([]byte(indexes[0]), []byte("UNIQUE INDEX idemgate_records_pkey ON public.idemgate_records USING btree (key)")) {
		t.Fatalf("indexes = %q, want only the primary key on key", indexes)
	}
	for range 200 {
		k := key()
		req := request(time.Minute)
		mustClaim(t, s, k, req, idemgate.Claimed)
		if err := s.Extend(testCtx(t), k, req.Token, time.Minute); err != nil {
			t.Fatal(err)
		}
		if err := s.Complete(testCtx(t), k, req.Token, sample(), time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	var upd, hot int64
	if _, err := pool.Exec(testCtx(t), `SELECT pg_stat_force_next_flush()`); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(testCtx(t), `SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relid = 'idemgate_records'::regclass`).Scan(&upd, &hot); err != nil {
		t.Fatal(err)
	}
	if upd < 400 || hot < upd*9/10 {
		t.Errorf("%d updates, %d of them HOT; want at least 400, nine in ten HOT", upd, hot)
	}
}

// TestClaimCopiesOutOfTheReadBuffer: the claim decodes a binary row in
// place, its byte slices aliasing the connection's read buffer, and must
// copy what the result keeps before the rows close. Many goroutines
// replay different keys on a pool of two connections (every claim reads
// into a buffer another claim just used), some claiming new keys in
// between; every replayed response is its key's, checked at once and
// again after all of them ran.
func TestClaimCopiesOutOfTheReadBuffer(t *testing.T) {
	t.Parallel()
	dsn := testenv.PostgresDSN(t)
	newStore(t, newPool(t, dsn)) // migrate once
	rng := rand.New(rand.NewPCG(1, 2))
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeSimpleProtocol} {
		t.Run(mode.String(), func(t *testing.T) {
			pool := poolWith(t, dsn, func(c *pgxpool.Config) { c.MaxConns = 2; c.ConnConfig.DefaultQueryExecMode = mode })
			s, err := pgrecords.New(testCtx(t), pool)
			if err != nil {
				t.Fatal(err)
			}
			type record struct {
				key  string
				req  idemgate.ClaimRequest
				resp idemgate.Response
			}
			records := make([]record, 64)
			for i := range records {
				body := make([]byte, rng.IntN(40000))
				for j := range body {
					body[j] = byte(rng.Uint32())
				}
				r := record{key: key(), req: request(time.Minute), resp: idemgate.Response{Status: 200 + i, Body: body,
					Header: http.Header{"X-Key": {fmt.Sprint(i), strings.Repeat(fmt.Sprint(i%10), i)}, "X-Other": {fmt.Sprint(-i)}}}}
				mustClaim(t, s, r.key, r.req, idemgate.Claimed)
				if err := s.Complete(testCtx(t), r.key, r.req.Token, r.resp, time.Hour); err != nil {
					t.Fatal(err)
				}
				records[i] = r
			}
			const goroutines, claims = 12, 80
			kept := make([][]idemgate.Response, goroutines) // kept[g][n] is records[(g*31+n*7)%64]'s
			var wg sync.WaitGroup
			for g := range goroutines {
				kept[g] = make([]idemgate.Response, claims)
				wg.Go(func() {
					for n := range claims {
						if g%4 == 0 && n%3 == 0 { // a new key: other bytes through the buffer
							if _, err := s.Claim(testCtx(t), key(), request(time.Minute)); err != nil {
								t.Error(err)
								return
							}
							continue
						}
						i := (g*31 + n*7) % len(records)
						again := records[i].req
						again.Token = token()
						res, err := s.Claim(testCtx(t), records[i].key, again)
						if err != nil || res.Status != idemgate.Finished {
							t.Errorf("claim of record %d: %v, %v", i, res.Status, err)
							return
						}
						if d := sameResponse(res.Response, records[i].resp); d != "" {
							t.Errorf("record %d at once: %s", i, d)
						}
						kept[g][n] = res.Response
					}
				})
			}
			wg.Wait()
			for g := range kept {
				for n, resp := range kept[g] {
					if resp.Status == 0 {
						continue // a new key's claim
					}
					i := (g*31 + n*7) % len(records)
					if d := sameResponse(resp, records[i].resp); d != "" {
						t.Fatalf("record %d after all claims: %s", i, d)
					}
				}
			}
		})
	}
}

// TestClaimExecModesAgree: the claim's answer is the same whether its row
// comes in binary format (decoded by the claim itself) or in text format
// (scanned), on pools in every exec mode: a running record's RetryAfter,
// also for a record an operator pinned with expires_at = 'infinity' or
// 300 years ahead (beyond time.Duration: the binary decoding multiplied
// the microseconds left into nanoseconds, which overflowed, and answered
// 0 where the text scan answered math.MaxInt64; both answered 0 for
// 'infinity', now math.MaxInt64, the time left saturated); a
// mismatch's changed fields; and an error, not a panic, for a finished
// record whose response is NULL.
func TestClaimExecModesAgree(t *testing.T) {
	t.Parallel()
	dsn := testenv.PostgresDSN(t)
	admin := newPool(t, dsn)
	w := newStore(t, admin)
	const lease = time.Hour
	req := request(lease)
	req.Fields = []fingerprint.FieldSum{{1, 2, 3, 4}, {5, 6, 7, 8}, {10, 11, 12, 13}}
	running, pinned, far, nullResponse := key(), key(), key(), key()
	for _, k := range []string{running, pinned, far, nullResponse} {
		mustClaim(t, w, k, req, idemgate.Claimed)
	}
	if _, err := admin.Exec(testCtx(t), `UPDATE idemgate_records SET expires_at = 'infinity' WHERE key = $1`, pinned); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(testCtx(t), `UPDATE idemgate_records SET expires_at = now() + interval '300 years' WHERE key = $1`, far); err != nil {
		t.Fatal(err)
	}
	if err := w.Complete(testCtx(t), nullResponse, req.Token, sample(), time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(testCtx(t), `UPDATE idemgate_records SET response = NULL WHERE key = $1`, nullResponse); err != nil {
		t.Fatal(err)
	}
	other := req
	other.Token = token()
	changed := other
	changed.Fingerprint += "x"
	changed.Fields = []fingerprint.FieldSum{{9, 9, 9, 9}, {5, 6, 7, 8}, {10, 11, 12, 13}}
	var pinnedRetry []time.Duration
	for _, mode := range allExecModes {
		s, err := pgrecords.New(testCtx(t), poolWith(t, dsn, func(c *pgxpool.Config) { c.ConnConfig.DefaultQueryExecMode = mode }))
		if err != nil {
			t.Fatal(err)
		}
		if res := mustClaim(t, s, running, other, idemgate.Running); res.RetryAfter < lease/2 || res.RetryAfter > lease {
			t.Errorf("%s: RetryAfter %v for a record with a lease of %v", mode, res.RetryAfter, lease)
		}
		res := mustClaim(t, s, pinned, other, idemgate.Running)
		if res.RetryAfter < 0 {
			t.Errorf("%s: RetryAfter %v for a record pinned to infinity", mode, res.RetryAfter)
		}
		pinnedRetry = append(pinnedRetry, res.RetryAfter)
		if res := mustClaim(t, s, far, other, idemgate.Running); res.RetryAfter != math.MaxInt64 {
			t.Errorf("%s: RetryAfter %v for a record pinned 300 years ahead, want math.MaxInt64", mode, res.RetryAfter)
		}
		if res := mustClaim(t, s, running, changed, idemgate.Mismatch); !slices.Equal(res.Changed, []int{0}) {
			t.Errorf("%s: changed fields %v, want [0]", mode, res.Changed)
		}
		if res, err := s.Claim(testCtx(t), nullResponse, other); err == nil {
			t.Errorf("%s: claim of a finished record with a NULL response = %+v, want an error", mode, res)
		}
	}
	if slices.Min(pinnedRetry) != slices.Max(pinnedRetry) {
		t.Errorf("RetryAfter for a record pinned to infinity differs between exec modes %v: %v", allExecModes, pinnedRetry)
	}
}
