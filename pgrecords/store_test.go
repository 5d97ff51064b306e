package pgrecords_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/fingerprint"
	"github.com/idemgate/idemgate/internal/devserver"
	"github.com/idemgate/idemgate/internal/testenv"
	"github.com/idemgate/idemgate/pgrecords"
	"github.com/idemgate/idemgate/storetest"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

// realLease is long enough for a loaded 2-core machine to answer within
// it, short enough to sleep through.
const realLease = 600 * time.Millisecond

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// newPool returns a pool on a fresh, migrated database.
func newPool(t *testing.T, dsn string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(testCtx(t), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func newStore(t *testing.T, pool *pgxpool.Pool) *pgrecords.Store {
	t.Helper()
	s, err := pgrecords.New(testCtx(t), pool)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	return s
}

// TestStoreConformance runs the store conformance suite on a real
// PostgreSQL server, with a second store on a pool of its own as Other
// (a second node). The cases share one database (their keys are random).
func TestStoreConformance(t *testing.T) {
	t.Parallel()
	dsn := testenv.PostgresDSN(t)
	one, two := newStore(t, newPool(t, dsn)), newStore(t, newPool(t, dsn))
	storetest.Run(t, func(t *testing.T) storetest.Harness {
		return storetest.Harness{Store: one, Other: two, Advance: time.Sleep, Lease: realLease}
	})
}

// TestStoreDurability runs the suite's durability cases on a PostgreSQL
// server of their own, which Restart crashes (SIGKILL) and starts again on
// the same data directory: the start runs crash recovery from the WAL, as
// after a power cut, so a table that skips the WAL (UNLOGGED) comes back
// empty. The throwaway server runs with synchronous_commit off; the pools
// turn it on, as a durable store's database has it, so that a commit the
// store was told of is in the WAL before the crash.
func TestStoreDurability(t *testing.T) {
	t.Parallel()
	srv, err := devserver.StartPostgres(testCtx(t))
	if err != nil {
		if errors.Is(err, devserver.ErrMissing) && (testing.Short() || os.Getenv("TEST_DATABASE_URL") != "") {
			t.Skipf("no PostgreSQL server to restart: %v", err)
		}
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Stop() })
	var pools []*pgxpool.Pool
	for range 2 {
		cfg, err := pgxpool.ParseConfig(srv.DSN("postgres"))
		if err != nil {
			t.Fatal(err)
		}
		cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "on"
		pool, err := pgxpool.NewWithConfig(testCtx(t), cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		pools = append(pools, pool)
	}
	storetest.RunDurability(t, func(t *testing.T) storetest.Harness {
		return storetest.Harness{
			Store: newStore(t, pools[0]), Other: newStore(t, pools[1]), Advance: time.Sleep, Lease: realLease,
			Restart: func(t *testing.T) {
				crash(t, srv)
				for _, p := range pools {
					p.Reset() // drop the connections the crash broke
				}
			},
		}
	})
}

// crash kills the server and starts it again. The killed postmaster's
// backends exit when they notice it is gone; until they have, the new one
// refuses to start (their shared memory is still in use), so the start is
// retried.
func crash(t *testing.T, srv *devserver.Postgres) {
	t.Helper()
	if err := srv.Kill(); err != nil {
		t.Fatalf("kill postgres: %v", err)
	}
	for attempt := 1; ; attempt++ {
		err := srv.Restart(testCtx(t))
		if err == nil {
			return
		}
		if attempt == 20 {
			t.Fatalf("start postgres after a crash: %v", err)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func token() idemgate.Token {
	var tok idemgate.Token
	_, _ = rand.Read(tok[:])
	return tok
}

func key() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return "idem:pgrecords:test:" + hex.EncodeToString(b[:])
}

func request(lease time.Duration) idemgate.ClaimRequest {
	return idemgate.ClaimRequest{
		Fingerprint: "v1:" + fingerprint.Fingerprint(hex.EncodeToString(make([]byte, 32))),
		Owner:       "owner-a",
		Kind:        "image",
		Lease:       lease,
		Token:       token(),
	}
}

func sample() idemgate.Response {
	return idemgate.Response{
		Status: http.StatusCreated,
		Header: http.Header{"Content-Type": {"application/json"}, "X-Multi": {"one", "", "two"}},
		Body:   []byte("{\"id\":42}\x00\xff"),
	}
}

func mustClaim(t *testing.T, s idemgate.Store, key string, req idemgate.ClaimRequest, want idemgate.ClaimStatus) idemgate.ClaimResult {
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
