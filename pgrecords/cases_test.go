package pgrecords_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/idemgate/idemgate/fingerprint"
	"github.com/idemgate/idemgate/internal/testenv"
	"github.com/idemgate/idemgate/middleware"
	"github.com/idemgate/idemgate/pgrecords"
)

func token() middleware.Token {
	var tok middleware.Token
	_, _ = rand.Read(tok[:])
	return tok
}

func key() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return "idem:pgrecords:test:" + hex.EncodeToString(b[:])
}

func request(lease time.Duration) middleware.ClaimRequest {
	return middleware.ClaimRequest{
		Fingerprint: "v1:" + fingerprint.Fingerprint(hex.EncodeToString(make([]byte, 32))),
		Owner:       "owner-a",
		Kind:        "image",
		Lease:       lease,
		Token:       token(),
	}
}

func sample() middleware.Response {
	return middleware.Response{
		Status: http.StatusCreated,
		Header: http.Header{"Content-Type": {"application/json"}, "X-Multi": {"one", "", "two"}},
		Body:   []byte("{\"id\":42}\x00\xff"),
	}
}

func mustClaim(t *testing.T, s middleware.Store, key string, req middleware.ClaimRequest, want middleware.ClaimStatus) middleware.ClaimResult {
	t.Helper()
	res, err := s.Claim(testCtx(t), key, req)
	if err != nil {
		t.Fatalf("Claim: %v", err)
	}
	if res.Status != want {
		t.Fatalf("Claim = %v, want %v", res.Status, want)
	}
	return res
}

// TestConcurrentReclaimOfExpired: an expired claim is reclaimed by exactly
// one of many concurrent claims (its UPDATE … WHERE expired re-checks the row).
func TestConcurrentReclaimOfExpired(t *testing.T) {
	t.Parallel()
	dsn := testenv.PostgresDSN(t)
	stores := []*pgrecords.Store{newStore(t, newPool(t, dsn)), newStore(t, newPool(t, dsn))}
	k := key()
	stale := request(100 * time.Millisecond)
	mustClaim(t, stores[0], k, stale, middleware.Claimed)
	time.Sleep(300 * time.Millisecond)
	const n = 32
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		winners []middleware.Token
		running int
	)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := request(time.Minute)
			res, err := stores[i%2].Claim(testCtx(t), k, r)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil:
				t.Errorf("Claim: %v", err)
			case res.Status == middleware.Claimed:
				winners = append(winners, r.Token)
			case res.Status == middleware.Running:
				running++
			default:
				t.Errorf("Claim = %v", res.Status)
			}
		}()
	}
	wg.Wait()
	if len(winners) != 1 || running != n-1 {
		t.Fatalf("%d winners, %d running; want 1 and %d", len(winners), running, n-1)
	}
	if err := stores[1].Complete(testCtx(t), k, stale.Token, sample(), time.Hour); !errors.Is(err, middleware.ErrLeaseLost) {
		t.Errorf("stale Complete = %v, want ErrLeaseLost", err)
	}
	if err := stores[1].Complete(testCtx(t), k, winners[0], sample(), time.Hour); err != nil {
		t.Errorf("winner's Complete: %v", err)
	}
}

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
	mustClaim(t, s, k, req, middleware.Claimed)
	if err := s.Complete(testCtx(t), k, req.Token, sample(), time.Hour); err != nil {
		t.Fatal(err)
	}
	response := func(r middleware.ClaimRequest) []byte {
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
		edit    func(*middleware.ClaimRequest)
		changed bool
	}{
		{"fingerprint", func(r *middleware.ClaimRequest) { r.Fingerprint += "x" }, true},
		{"owner", func(r *middleware.ClaimRequest) { r.Owner += "x" }, false},
		{"kind", func(r *middleware.ClaimRequest) { r.Kind = "Image" }, false},
		{"owner and kind shifted", func(r *middleware.ClaimRequest) { r.Owner, r.Kind = r.Owner+"i", r.Kind[1:] }, false},
	} {
		r := req
		r.Token = token()
		r.Fields = []fingerprint.FieldSum{{9, 9, 9, 9}}
		c.edit(&r)
		if b := response(r); b != nil {
			t.Errorf("%s: the claim statement returned the stored response (%d bytes)", c.name, len(b))
		}
		res := mustClaim(t, s, k, r, middleware.Mismatch)
		if (res.Changed != nil) != c.changed || res.Response.Status != 0 || res.Response.Body != nil {
			t.Errorf("%s: %+v, want a bare mismatch (changed fields only for the record's owner and kind)", c.name, res)
		}
	}
	if b := response(req); b == nil {
		t.Error("matching request: no response")
	}
	r := req
	r.Token = token()
	if res := mustClaim(t, s, k, r, middleware.Finished); !bytes.Equal(res.Response.Body, sample().Body) {
		t.Errorf("matching request: body %q, want the replay", res.Response.Body)
	}
}

// TestSweep: Sweep deletes expired claims and finished records past their
// retention, in batches, from many goroutines on two pools at once, and
// leaves live records alone; on a cancelled context it deletes nothing.
func TestSweep(t *testing.T) {
	t.Parallel()
	dsn := testenv.PostgresDSN(t)
	pool := newPool(t, dsn)
	s := newStore(t, pool)
	s2 := newStore(t, newPool(t, dsn))
	// 2500 expired rows, written directly; a few live records through the store.
	if _, err := pool.Exec(testCtx(t), `INSERT INTO idemgate_records (key, token, finished, expires_at, ident)
		SELECT 'expired-' || i, gen_random_uuid(), i % 2 = 0, now() - interval '1 second', '\x00'
		FROM generate_series(1, 2500) AS i`); err != nil {
		t.Fatal(err)
	}
	live := []string{key(), key()}
	running := request(time.Hour)
	mustClaim(t, s, live[0], running, middleware.Claimed)
	done := request(time.Hour)
	mustClaim(t, s, live[1], done, middleware.Claimed)
	if err := s.Complete(testCtx(t), live[1], done.Token, sample(), time.Hour); err != nil {
		t.Fatal(err)
	}

	// A cancelled context deletes nothing: the sweeps below find all 2500.
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.Sweep(canceled); err == nil {
		t.Errorf("Sweep with a cancelled context succeeded")
	}

	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		total int64
	)
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n, err := []*pgrecords.Store{s, s2}[i%2].Sweep(testCtx(t))
			if err != nil {
				t.Errorf("Sweep: %v", err)
			}
			mu.Lock()
			total += n
			mu.Unlock()
		}()
	}
	wg.Wait()
	if total != 2500 {
		t.Errorf("sweeps deleted %d, want 2500", total)
	}
	var left int
	if err := pool.QueryRow(testCtx(t), `SELECT count(*) FROM idemgate_records`).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 2 {
		t.Errorf("%d records left, want the 2 live ones", left)
	}
	other := running
	other.Token = token()
	mustClaim(t, s, live[0], other, middleware.Running)
	other.Token = token()
	mustClaim(t, s, live[1], other, middleware.Finished)
	if n, err := s.Sweep(testCtx(t)); err != nil || n != 0 {
		t.Errorf("Sweep of a swept table = %d, %v; want 0", n, err)
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
		mustClaim(t, s, k, req, middleware.Claimed)
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
