package pgrecords_test

import (
	"bytes"
	"testing"
	"time"

	"github.com/idemgate/idemgate/fingerprint"
	"github.com/idemgate/idemgate/internal/testenv"
	"github.com/idemgate/idemgate/middleware"
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
