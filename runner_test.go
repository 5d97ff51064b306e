package idemgate_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/fingerprint"
	"github.com/idemgate/idemgate/internal/proctest"
	"github.com/idemgate/idemgate/internal/testenv"
	"github.com/idemgate/idemgate/internal/wait"
	"github.com/idemgate/idemgate/keyspace"
	"github.com/idemgate/idemgate/pgrecords"
	"github.com/idemgate/idemgate/redisstore"
)

func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// runnerStore is a Store Runner.Do's tests run on. Its lease is the
// shortest the store lets a test sleep through on a loaded machine
// (miniredis' TTLs never run out by themselves: its lease is long).
type runnerStore struct {
	name  string
	store func(t *testing.T) idemgate.Store
}

var runnerStores = []runnerStore{
	{"miniredis", func(t *testing.T) idemgate.Store {
		mr := miniredis.RunT(t)
		c := redis.NewClient(&redis.Options{Addr: mr.Addr()})
		t.Cleanup(func() { c.Close() })
		return redisstore.New(c)
	}},
	{"redis-server", func(t *testing.T) idemgate.Store {
		c := redis.NewClient(testenv.Redis(t))
		t.Cleanup(func() { c.Close() })
		return redisstore.New(c)
	}},
	{"postgres", func(t *testing.T) idemgate.Store {
		_, s := pgStore(t)
		return s
	}},
}

// pgStore returns a pool on a fresh database with the records table and a
// ledger table that fn writes to, and a pgrecords store on it.
func pgStore(t *testing.T) (*pgxpool.Pool, *pgrecords.Store) {
	t.Helper()
	pool, err := pgxpool.New(testCtx(t), testenv.PostgresDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s, err := pgrecords.New(testCtx(t), pool)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(testCtx(t), `CREATE TABLE ledger (message text NOT NULL, amount int NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return pool, s
}

func ledgerRows(t *testing.T, pool *pgxpool.Pool, message string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(testCtx(t), `SELECT count(*) FROM ledger WHERE message = $1`, message).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func scope(id string) keyspace.Scope {
	return keyspace.Scope{Tenant: "acme", User: "billing-worker", Request: id}
}

const charge = `{"amount":100,"currency":"EUR","note":"first"}`

// forEachStore runs test on each store as a subtest.
func forEachStore(t *testing.T, test func(t *testing.T, s idemgate.Store)) {
	for _, rs := range runnerStores {
		t.Run(rs.name, func(t *testing.T) {
			t.Parallel()
			test(t, rs.store(t))
		})
	}
}

func TestDoRunsTheWorkOncePerKeyUnderConcurrentDeliveries(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, s idemgate.Store) {
		r := idemgate.Runner{Store: s, Kind: "charge", WaitInFlight: time.Minute}
		var runs atomic.Int32
		const n = 16
		var wg sync.WaitGroup
		results := make([]idemgate.Result, n)
		errs := make([]error, n)
		start := make(chan struct{})
		for i := range n {
			wg.Go(func() {
				<-start
				results[i], errs[i] = r.Do(testCtx(t), scope("msg-1"), []byte(charge), func(ctx context.Context) ([]byte, error) {
					runs.Add(1)
					time.Sleep(50 * time.Millisecond) // the others find it running
					return []byte("charged 100"), nil
				})
			})
		}
		close(start)
		wg.Wait()
		if got := runs.Load(); got != 1 {
			t.Errorf("fn ran %d times, want 1", got)
		}
		replayed := 0
		for i := range n {
			if errs[i] != nil {
				t.Errorf("delivery %d: %v", i, errs[i])
				continue
			}
			if string(results[i].Value) != "charged 100" {
				t.Errorf("delivery %d: output %q, want %q", i, results[i].Value, "charged 100")
			}
			if results[i].Replayed {
				replayed++
			}
		}
		if replayed != n-1 {
			t.Errorf("%d deliveries replayed, want %d", replayed, n-1)
		}
	})
}

func TestDoReplaysTheStoredOutputWithoutRunningAgain(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, s idemgate.Store) {
		var events []string
		var mu sync.Mutex
		r := idemgate.Runner{Store: s, Kind: "charge", OnEvent: func(_ context.Context, ev idemgate.Event) {
			mu.Lock()
			defer mu.Unlock()
			events = append(events, ev.Type.String()+" route="+strconv.Quote(ev.Route)+" kind="+ev.Kind)
		}}
		runs := 0
		fn := func(ctx context.Context) ([]byte, error) {
			runs++
			req, ok := idemgate.RequestFromContext(ctx)
			if !ok || req.Key.Kind() != "charge" {
				return nil, fmt.Errorf("RequestFromContext = %v, %v", req, ok)
			}
			return []byte(`{"charge":"ch_1"}`), nil
		}
		first, err := r.Do(testCtx(t), scope("msg-1"), []byte(charge), fn)
		if err != nil || first.Replayed || string(first.Value) != `{"charge":"ch_1"}` {
			t.Fatalf("first Do = %+v, %v; want fn's output, not replayed", first, err)
		}
		// The same parameters in another JSON spelling are the same work.
		again, err := r.Do(testCtx(t), scope("msg-1"), []byte(`{ "note":"first", "currency":"EUR", "amount":1e2 }`), fn)
		if err != nil || !again.Replayed || string(again.Value) != `{"charge":"ch_1"}` {
			t.Errorf("second Do = %+v, %v; want the stored output replayed", again, err)
		}
		if runs != 1 {
			t.Errorf("fn ran %d times, want 1", runs)
		}
		other, err := r.Do(testCtx(t), scope("msg-2"), []byte(charge), fn)
		if err != nil || other.Replayed || runs != 2 {
			t.Errorf("another key: %+v, %v, runs %d; want fn to run", other, err, runs)
		}
		mu.Lock()
		defer mu.Unlock()
		want := []string{`claimed route="" kind=charge`, `replayed route="" kind=charge`, `claimed route="" kind=charge`}
		if fmt.Sprint(events) != fmt.Sprint(want) {
			t.Errorf("events = %q, want %q", events, want)
		}
	})
}

func TestDoAnswersDriftedParamsWithKeyReusedNamingTheFields(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, s idemgate.Store) {
		r := idemgate.Runner{Store: s, Kind: "charge"}
		r.Fingerprint.Fields = []string{"/amount", "/currency"}
		runs := 0
		fn := func(context.Context) ([]byte, error) { runs++; return []byte("ok"), nil }
		if _, err := r.Do(testCtx(t), scope("msg-1"), []byte(charge), fn); err != nil {
			t.Fatal(err)
		}
		// A note is not a selected field: the same work.
		if res, err := r.Do(testCtx(t), scope("msg-1"), []byte(`{"amount":100,"currency":"EUR","note":"again"}`), fn); err != nil || !res.Replayed {
			t.Errorf("other note: %+v, %v; want a replay", res, err)
		}
		_, err := r.Do(testCtx(t), scope("msg-1"), []byte(`{"amount":250,"currency":"EUR"}`), fn)
		var reused *idemgate.KeyReusedError
		if !errors.Is(err, idemgate.ErrKeyReused) || !errors.As(err, &reused) {
			t.Fatalf("drifted amount: err = %v, want ErrKeyReused", err)
		}
		if fmt.Sprint(reused.Changed) != "[/amount]" {
			t.Errorf("Changed = %q, want [/amount]", reused.Changed)
		}
		if want := "idemgate: idempotency key reused with other parameters (changed: /amount)"; err.Error() != want {
			t.Errorf("error = %q, want %q", err, want)
		}
		if runs != 1 {
			t.Errorf("fn ran %d times, want 1", runs)
		}
	})
}

func TestDoAnswersInProgressWithTheWaitWhileTheWorkRuns(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, s idemgate.Store) {
		lease := 30 * time.Second
		r := idemgate.Runner{Store: s, Kind: "charge", Lease: lease}
		running, finish := make(chan struct{}), make(chan struct{})
		done := make(chan error, 1)
		go func() {
			_, err := r.Do(testCtx(t), scope("msg-1"), []byte(charge), func(context.Context) ([]byte, error) {
				close(running)
				<-finish
				return []byte("ok"), nil
			})
			done <- err
		}()
		<-running
		_, err := r.Do(testCtx(t), scope("msg-1"), []byte(charge), func(context.Context) ([]byte, error) {
			t.Error("fn ran while another run held the key")
			return nil, nil
		})
		var inProgress *idemgate.InProgressError
		if !errors.Is(err, idemgate.ErrInProgress) || !errors.As(err, &inProgress) {
			t.Fatalf("err = %v, want ErrInProgress", err)
		}
		if inProgress.RetryAfter <= 0 || inProgress.RetryAfter > lease/3 {
			t.Errorf("RetryAfter = %v, want in (0, %v]", inProgress.RetryAfter, lease/3)
		}
		// WaitInFlight waits for the holder and replays its output.
		r.WaitInFlight = time.Minute
		waited := make(chan idemgate.Result, 1)
		go func() {
			res, err := r.Do(testCtx(t), scope("msg-1"), []byte(charge), func(context.Context) ([]byte, error) {
				return nil, errors.New("fn ran while another run held the key")
			})
			if err != nil {
				t.Error(err)
			}
			waited <- res
		}()
		close(finish)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if res := <-waited; !res.Replayed || string(res.Value) != "ok" {
			t.Errorf("waited = %+v, want the holder's output replayed", res)
		}
	})
}

func TestDoReleasesTheKeyWhenFnFailsOrPanics(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, s idemgate.Store) {
		var released []string
		r := idemgate.Runner{Store: s, Kind: "charge", OnEvent: func(_ context.Context, ev idemgate.Event) {
			if ev.Type == idemgate.EventReleased {
				released = append(released, ev.Reason)
			}
		}}
		errDown := errors.New("payment provider down")
		_, err := r.Do(testCtx(t), scope("msg-1"), []byte(charge), func(context.Context) ([]byte, error) {
			return nil, errDown
		})
		if err != errDown {
			t.Fatalf("err = %v, want fn's error as it is", err)
		}
		func() {
			defer func() {
				if p := recover(); p != "boom" {
					t.Errorf("recovered %v, want fn's panic to go on", p)
				}
			}()
			r.Do(testCtx(t), scope("msg-1"), []byte(charge), func(context.Context) ([]byte, error) {
				panic("boom")
			})
			t.Error("Do returned after fn panicked")
		}()
		res, err := r.Do(testCtx(t), scope("msg-1"), []byte(charge), func(context.Context) ([]byte, error) {
			return []byte("ok"), nil
		})
		if err != nil || res.Replayed || string(res.Value) != "ok" {
			t.Errorf("redelivery = %+v, %v; want fn to run", res, err)
		}
		if fmt.Sprint(released) != "[handler_error panic]" {
			t.Errorf("released = %q, want [handler_error panic]", released)
		}
	})
}

// TestDoRenewsTheLeaseWhileFnRuns: fn runs three leases long; the key is
// never free for another delivery meanwhile, and its output is stored.
func TestDoRenewsTheLeaseWhileFnRuns(t *testing.T) {
	t.Parallel()
	for _, rs := range runnerStores[1:] { // miniredis' TTLs never run out by themselves
		t.Run(rs.name, func(t *testing.T) {
			t.Parallel()
			lease := time.Second
			r := idemgate.Runner{Store: rs.store(t), Kind: "charge", Lease: lease}
			var probes, ran atomic.Int32
			res, err := r.Do(testCtx(t), scope("msg-1"), []byte(charge), func(ctx context.Context) ([]byte, error) {
				for end := time.Now().Add(3 * lease); time.Now().Before(end); time.Sleep(lease / 4) {
					_, err := r.Do(ctx, scope("msg-1"), []byte(charge), func(context.Context) ([]byte, error) {
						ran.Add(1)
						return nil, nil
					})
					if !errors.Is(err, idemgate.ErrInProgress) {
						return nil, fmt.Errorf("a delivery during the run: %v, want ErrInProgress", err)
					}
					probes.Add(1)
				}
				return []byte("ok"), ctx.Err()
			})
			if err != nil || string(res.Value) != "ok" {
				t.Fatalf("Do = %+v, %v", res, err)
			}
			if ran.Load() != 0 || probes.Load() < 4 {
				t.Errorf("fn ran again %d times during %d probes; want 0 during at least 4", ran.Load(), probes.Load())
			}
		})
	}
}

// TestDoCancelsFnAndReportsALostLease: an operator frees the key while fn
// runs (idemgate records release); the next renewal finds the claim lost,
// cancels fn's context with ErrLeaseLost, and Do reports it.
func TestDoCancelsFnAndReportsALostLease(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, s idemgate.Store) {
		var lost atomic.Int32
		r := idemgate.Runner{Store: s, Kind: "charge", Lease: 3 * time.Second, OnEvent: func(_ context.Context, ev idemgate.Event) {
			if ev.Type == idemgate.EventLeaseLost {
				lost.Add(1)
			}
		}}
		in := s.(idemgate.Inspector)
		var cause error
		res, err := r.Do(testCtx(t), scope("msg-1"), []byte(charge), func(ctx context.Context) ([]byte, error) {
			req, _ := idemgate.RequestFromContext(ctx)
			info, err := in.Inspect(ctx, req.Key.String())
			if err != nil {
				return nil, err
			}
			if err := in.Forget(ctx, req.Key.String(), info.Token, false); err != nil {
				return nil, err
			}
			select {
			case <-ctx.Done():
				cause = context.Cause(ctx)
			case <-time.After(time.Minute):
			}
			return []byte("late"), nil
		})
		if cause != idemgate.ErrLeaseLost {
			t.Errorf("fn's context cause = %v, want ErrLeaseLost", cause)
		}
		if !errors.Is(err, idemgate.ErrLeaseLost) || string(res.Value) != "late" {
			t.Errorf("Do = %+v, %v; want fn's output and ErrLeaseLost", res, err)
		}
		if lost.Load() == 0 {
			t.Error("no lease_lost event")
		}
	})
}

func TestDoAtomicCommitsFnsWritesWithTheRecord(t *testing.T) {
	t.Parallel()
	pool, s := pgStore(t)
	r := idemgate.Runner{Store: s, Kind: "charge", Atomic: true}
	runs := 0
	fn := func(ctx context.Context) ([]byte, error) {
		runs++
		tx := pgrecords.TxFromContext(ctx)
		if tx == nil {
			return nil, errors.New("no transaction in fn's context")
		}
		if _, err := tx.Exec(ctx, `INSERT INTO ledger VALUES ('msg-1', 100)`); err != nil {
			return nil, err
		}
		return []byte("booked"), nil
	}
	for i := range 3 {
		res, err := r.Do(testCtx(t), scope("msg-1"), []byte(charge), fn)
		if err != nil || string(res.Value) != "booked" || res.Replayed != (i > 0) {
			t.Fatalf("delivery %d = %+v, %v", i, res, err)
		}
	}
	if got := ledgerRows(t, pool, "msg-1"); got != 1 || runs != 1 {
		t.Errorf("ledger rows = %d, fn runs = %d; want 1 and 1", got, runs)
	}
}

func TestDoAtomicRollsFnsWritesBackWithTheRelease(t *testing.T) {
	t.Parallel()
	pool, s := pgStore(t)
	r := idemgate.Runner{Store: s, Kind: "charge", Atomic: true}
	write := func(ctx context.Context, message string) error {
		tx := pgrecords.TxFromContext(ctx)
		_, err := tx.Exec(ctx, `INSERT INTO ledger VALUES ($1, 100)`, message)
		return err
	}
	tests := []struct {
		name string
		fn   func(ctx context.Context) ([]byte, error)
	}{
		{"error", func(ctx context.Context) ([]byte, error) {
			if err := write(ctx, "error"); err != nil {
				return nil, err
			}
			return nil, errors.New("provider down")
		}},
		{"panic", func(ctx context.Context) ([]byte, error) {
			if err := write(ctx, "panic"); err != nil {
				return nil, err
			}
			panic("boom")
		}},
		{"fn's failed statement", func(ctx context.Context) ([]byte, error) {
			if err := write(ctx, "fn's failed statement"); err != nil {
				return nil, err
			}
			tx := pgrecords.TxFromContext(ctx)
			_, err := tx.Exec(ctx, `INSERT INTO ledger VALUES ('x', 'not a number')`)
			return nil, err
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			func() {
				defer func() { recover() }()
				if _, err := r.Do(testCtx(t), scope(tt.name), []byte(charge), tt.fn); err == nil {
					t.Error("Do returned no error")
				}
			}()
			if got := ledgerRows(t, pool, tt.name); got != 0 {
				t.Errorf("ledger rows = %d after the rollback, want 0", got)
			}
			res, err := r.Do(testCtx(t), scope(tt.name), []byte(charge), func(ctx context.Context) ([]byte, error) {
				return []byte("booked"), write(ctx, tt.name)
			})
			if err != nil || res.Replayed {
				t.Errorf("redelivery = %+v, %v; want fn to run", res, err)
			}
			if got := ledgerRows(t, pool, tt.name); got != 1 {
				t.Errorf("ledger rows = %d after the redelivery, want 1", got)
			}
		})
	}
}

func TestRunnerRefusesAtomicOnAStoreWithoutTransactions(t *testing.T) {
	t.Parallel()
	r := idemgate.Runner{Store: runnerStores[0].store(t), Kind: "charge", Atomic: true}
	_, err := r.Do(testCtx(t), scope("msg-1"), nil, func(context.Context) ([]byte, error) {
		t.Error("fn ran")
		return nil, nil
	})
	if err == nil || !regexp.MustCompile(`Atomic needs a Store that implements TxStore`).MatchString(err.Error()) {
		t.Errorf("err = %v, want Atomic refused", err)
	}
	r = idemgate.Runner{Store: r.Store}
	if _, err := r.Do(testCtx(t), scope("msg-1"), nil, nil); err == nil || err.Error() != "idemgate: Runner.Kind is required" {
		t.Errorf("no Kind: err = %v", err)
	}
}

// childEnv names what the worker process of the kill tests runs on (this
// test binary again, running TestDoWorkerProcess): "redis <url>" or
// "postgres <dsn>".
const childEnv = "IDEMGATE_DO_WORKER"

// childLease is the worker's lease: the parent waits it out.
const childLease = 2 * time.Second

// TestDoWorkerProcess is the worker of TestDoAfterTheWorkerWasKilled, not a
// test: it runs Do on msg-killed, and fn (Atomic on postgres) writes its
// ledger row, prints "WROTE", and waits to be killed.
func TestDoWorkerProcess(t *testing.T) {
	spec := os.Getenv(childEnv)
	if spec == "" {
		t.Skip("the worker process of TestDoAfterTheWorkerWasKilled")
	}
	var r idemgate.Runner
	var pool *pgxpool.Pool
	switch kind, addr, _ := strings.Cut(spec, " "); kind {
	case "redis":
		opts, err := redis.ParseURL(addr)
		if err != nil {
			t.Fatal(err)
		}
		r = idemgate.Runner{Store: redisstore.New(redis.NewClient(opts))}
	default:
		var err error
		if pool, err = pgxpool.New(testCtx(t), addr); err != nil {
			t.Fatal(err)
		}
		s, err := pgrecords.New(testCtx(t), pool)
		if err != nil {
			t.Fatal(err)
		}
		r = idemgate.Runner{Store: s, Atomic: true}
	}
	r.Kind, r.Lease = "charge", childLease
	_, err := r.Do(context.Background(), scope("msg-killed"), []byte(charge), func(ctx context.Context) ([]byte, error) {
		if tx := pgrecords.TxFromContext(ctx); tx != nil {
			if _, err := tx.Exec(ctx, `INSERT INTO ledger VALUES ('msg-killed', 100)`); err != nil {
				return nil, err
			}
		}
		fmt.Println("WROTE")
		select {}
	})
	t.Fatal(err)
}

// TestDoAfterTheWorkerWasKilled: a worker killed (SIGKILL) inside fn
// blocks the key until its lease runs out (a redelivery meanwhile gets
// ErrInProgress); then the redelivery runs fn, once, and the effect
// counts once. With Atomic, the killed worker's write never committed.
func TestDoAfterTheWorkerWasKilled(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts a process")
	}
	tests := []struct {
		name  string
		given func(t *testing.T) (spec string, r idemgate.Runner, effects func() int)
	}{
		{"redis-server", func(t *testing.T) (string, idemgate.Runner, func() int) {
			opts := testenv.Redis(t)
			u := url.URL{Scheme: "redis", Host: opts.Addr, Path: "/" + strconv.Itoa(opts.DB)}
			if opts.Password != "" {
				u.User = url.UserPassword(opts.Username, opts.Password)
			}
			c := redis.NewClient(opts)
			t.Cleanup(func() { c.Close() })
			return "redis " + u.String(), idemgate.Runner{Store: redisstore.New(c)}, nil
		}},
		{"postgres atomic", func(t *testing.T) (string, idemgate.Runner, func() int) {
			pool, s := pgStore(t)
			return "postgres " + pool.Config().ConnString(), idemgate.Runner{Store: s, Atomic: true},
				func() int { return ledgerRows(t, pool, "msg-killed") }
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			spec, r, rows := tt.given(t)
			r.Kind, r.Lease = "charge", childLease
			cmd := exec.Command(os.Args[0], "-test.run=^TestDoWorkerProcess$", "-test.count=1")
			cmd.Env = append(os.Environ(), childEnv+"="+spec)
			worker, err := proctest.Start(t, cmd)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := worker.WaitOutput(regexp.MustCompile(`^WROTE$`), time.Minute); err != nil {
				t.Fatal(err)
			}
			if err := worker.Kill(); err != nil {
				t.Fatal(err)
			}
			var runs atomic.Int32
			fn := func(ctx context.Context) ([]byte, error) {
				runs.Add(1)
				if tx := pgrecords.TxFromContext(ctx); tx != nil {
					if _, err := tx.Exec(ctx, `INSERT INTO ledger VALUES ('msg-killed', 100)`); err != nil {
						return nil, err
					}
				}
				return []byte("booked"), nil
			}
			if _, err := r.Do(testCtx(t), scope("msg-killed"), []byte(charge), fn); !errors.Is(err, idemgate.ErrInProgress) {
				t.Errorf("redelivery at once: %v, want ErrInProgress (the killed worker's lease is live)", err)
			}
			var res idemgate.Result
			wait.For(t, time.Minute, "the redelivery runs once the killed worker's lease ran out", func() bool {
				res, err = r.Do(testCtx(t), scope("msg-killed"), []byte(charge), fn)
				return !errors.Is(err, idemgate.ErrInProgress)
			})
			if err != nil || res.Replayed || string(res.Value) != "booked" {
				t.Fatalf("redelivery = %+v, %v; want fn to run", res, err)
			}
			if res, err := r.Do(testCtx(t), scope("msg-killed"), []byte(charge), fn); err != nil || !res.Replayed {
				t.Errorf("a later delivery = %+v, %v; want a replay", res, err)
			}
			if n := runs.Load(); n != 1 {
				t.Errorf("fn ran %d times after the kill, want 1", n)
			}
			if rows != nil {
				if n := rows(); n != 1 {
					t.Errorf("ledger rows = %d, want 1: the redelivery's (the killed worker's write never committed)", n)
				}
			}
		})
	}
}

// TestDoReleasesTheClaimOfACallerThatLeft: ctx ends while Do claims (a
// consumer shutting down): fn does not run, the fresh claim is given
// back, and the redelivery runs at once rather than a lease later.
func TestDoReleasesTheClaimOfACallerThatLeft(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, s idemgate.Store) {
		r := idemgate.Runner{Store: s, Kind: "charge", Lease: time.Hour}
		ctx, cancel := context.WithCancel(testCtx(t))
		cancel()
		_, err := r.Do(ctx, scope("msg-1"), []byte(charge), func(context.Context) ([]byte, error) {
			t.Error("fn ran for a caller that left")
			return nil, nil
		})
		if !errors.Is(err, context.Canceled) {
			t.Errorf("err = %v, want context.Canceled", err)
		}
		res, err := r.Do(testCtx(t), scope("msg-1"), []byte(charge), func(context.Context) ([]byte, error) {
			return []byte("ok"), nil
		})
		if err != nil || res.Replayed {
			t.Errorf("redelivery = %+v, %v; want fn to run at once", res, err)
		}
	})
}

func TestDoFingerprintsParamsThatAreNotJSONAsTheirBytes(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, s idemgate.Store) {
		r := idemgate.Runner{Store: s, Kind: "charge"}
		fn := func(context.Context) ([]byte, error) { return []byte("ok"), nil }
		proto := []byte{0x08, 0x96, 0x01, 0x12, 0x03, 'E', 'U', 'R'} // a protobuf message
		if _, err := r.Do(testCtx(t), scope("msg-1"), proto, fn); err != nil {
			t.Fatal(err)
		}
		if res, err := r.Do(testCtx(t), scope("msg-1"), proto, fn); err != nil || !res.Replayed {
			t.Errorf("the same bytes: %+v, %v; want a replay", res, err)
		}
		other := append([]byte(nil), proto...)
		other[2] = 0x02
		if _, err := r.Do(testCtx(t), scope("msg-1"), other, fn); !errors.Is(err, idemgate.ErrKeyReused) {
			t.Errorf("other bytes: %v, want ErrKeyReused", err)
		}
		r.Fingerprint.Fields = []string{"/amount"}
		if _, err := r.Do(testCtx(t), scope("msg-2"), proto, fn); err == nil {
			t.Error("Fields over params that are not JSON: no error")
		}
	})
}

// TestDoAtomicRollsBackWhenTheLeaseWasLost: the claim is lost while fn
// runs (an operator released it; or the lease ran out and another
// delivery took the key): fn's context ends with ErrLeaseLost, and the
// commit, fenced by the claim's token, rolls fn's write back.
func TestDoAtomicRollsBackWhenTheLeaseWasLost(t *testing.T) {
	t.Parallel()
	pool, s := pgStore(t)
	r := idemgate.Runner{Store: s, Kind: "charge", Atomic: true, Lease: 3 * time.Second}
	_, err := r.Do(testCtx(t), scope("msg-lost"), []byte(charge), func(ctx context.Context) ([]byte, error) {
		tx := pgrecords.TxFromContext(ctx)
		if _, err := tx.Exec(ctx, `INSERT INTO ledger VALUES ('msg-lost', 100)`); err != nil {
			return nil, err
		}
		req, _ := idemgate.RequestFromContext(ctx)
		info, err := s.Inspect(ctx, req.Key.String())
		if err != nil {
			return nil, err
		}
		if err := s.Forget(ctx, req.Key.String(), info.Token, false); err != nil {
			return nil, err
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Minute):
			return nil, errors.New("fn's context did not end when the lease was lost")
		}
		return []byte("booked"), nil
	})
	if !errors.Is(err, idemgate.ErrLeaseLost) {
		t.Errorf("err = %v, want ErrLeaseLost", err)
	}
	if got := ledgerRows(t, pool, "msg-lost"); got != 0 {
		t.Errorf("ledger rows = %d, want 0: the write rolled back with the lost claim", got)
	}
}

// TestDoStoresAnEmptyOutput: work whose result is its effect alone (fn
// returns nil, nil) is finished all the same: a redelivery replays it.
func TestDoStoresAnEmptyOutput(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, s idemgate.Store) {
		r := idemgate.Runner{Store: s, Kind: "notify"}
		runs := 0
		fn := func(context.Context) ([]byte, error) { runs++; return nil, nil }
		for i := range 2 {
			res, err := r.Do(testCtx(t), scope("msg-1"), nil, fn)
			if err != nil || len(res.Value) != 0 || res.Replayed != (i > 0) {
				t.Errorf("delivery %d = %+v, %v", i, res, err)
			}
		}
		if runs != 1 {
			t.Errorf("fn ran %d times, want 1", runs)
		}
	})
}

// TestDoFailsClosedWhenTheStoreIsDown: with its store unreachable, Do
// runs nothing and says why (a store_error event at the claim).
func TestDoFailsClosedWhenTheStoreIsDown(t *testing.T) {
	t.Parallel()
	mr := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: mr.Addr(), MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	var storeErrors []string
	r := idemgate.Runner{Store: redisstore.New(c), Kind: "charge", OnEvent: func(_ context.Context, ev idemgate.Event) {
		if ev.Type == idemgate.EventStoreError {
			storeErrors = append(storeErrors, ev.Reason)
		}
	}}
	mr.Close()
	_, err := r.Do(testCtx(t), scope("msg-1"), []byte(charge), func(context.Context) ([]byte, error) {
		t.Error("fn ran without a claim")
		return nil, nil
	})
	if err == nil || !strings.HasPrefix(err.Error(), "idemgate: do: claim: ") {
		t.Errorf("err = %v, want the claim's failure", err)
	}
	if fmt.Sprint(storeErrors) != "[claim]" {
		t.Errorf("store_error events = %q, want [claim]", storeErrors)
	}
}

// TestDoRunsEachKindOnceOnTheSameScope: the kind is part of the key, so
// two Runners of different kinds on one scope (two consumers of the same
// message) each run their work once; neither is refused as reused.
func TestDoRunsEachKindOnceOnTheSameScope(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, s idemgate.Store) {
		for _, kind := range []string{"charge", "notify", "charge", "notify"} {
			r := idemgate.Runner{Store: s, Kind: kind}
			res, err := r.Do(testCtx(t), scope("msg-1"), []byte(charge), func(context.Context) ([]byte, error) {
				return []byte(kind), nil
			})
			if err != nil || string(res.Value) != kind {
				t.Errorf("kind %s: %+v, %v; want its own output", kind, res, err)
			}
		}
	})
}

// TestDoReleasesTheKeyWhenFnCallsGoexit: fn ends its goroutine
// (runtime.Goexit, as t.FailNow does) instead of returning: the key is
// released, with the atomic transaction rolled back, and Goexit goes on.
func TestDoReleasesTheKeyWhenFnCallsGoexit(t *testing.T) {
	t.Parallel()
	pool, pg := pgStore(t)
	mr := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { c.Close() })
	for _, r := range []idemgate.Runner{
		{Store: redisstore.New(c), Kind: "charge", Lease: time.Hour},
		{Store: pg, Kind: "charge", Lease: time.Hour, Atomic: true},
	} {
		t.Run(fmt.Sprintf("atomic=%v", r.Atomic), func(t *testing.T) {
			returned := make(chan bool, 1)
			go func() {
				defer func() { returned <- false }()
				r.Do(testCtx(t), scope("msg-goexit"), []byte(charge), func(ctx context.Context) ([]byte, error) {
					if r.Atomic {
						if _, err := pgrecords.TxFromContext(ctx).Exec(ctx, `INSERT INTO ledger VALUES ('msg-goexit', 1)`); err != nil {
							return nil, err
						}
					}
					runtime.Goexit()
					return nil, nil
				})
				returned <- true
			}()
			if <-returned {
				t.Fatal("Do returned after fn called runtime.Goexit")
			}
			res, err := r.Do(testCtx(t), scope("msg-goexit"), []byte(charge), func(context.Context) ([]byte, error) {
				return []byte("ok"), nil
			})
			if err != nil || res.Replayed {
				t.Errorf("redelivery = %+v, %v; want fn to run at once", res, err)
			}
			if got := ledgerRows(t, pool, "msg-goexit"); got != 0 {
				t.Errorf("ledger rows = %d, want 0: the write rolled back", got)
			}
		})
	}
}

// TestDoAtomicRollsBackAndReleasesWhenTheConsumerShutsDown: Do's context
// is canceled while fn runs (the consumer shuts down), between fn's
// statements or during one, and fn returns the error: fn's write rolls
// back, Do returns that error, and the key is free for the redelivery at
// once.
func TestDoAtomicRollsBackAndReleasesWhenTheConsumerShutsDown(t *testing.T) {
	t.Parallel()
	pool, s := pgStore(t)
	tests := []struct {
		name string
		// then runs after fn's write, with shutdown.
		then func(ctx context.Context, shutdown func()) error
	}{
		{"between statements", func(ctx context.Context, shutdown func()) error {
			shutdown()
			<-ctx.Done()
			return ctx.Err()
		}},
		{"during a statement", func(ctx context.Context, shutdown func()) error {
			time.AfterFunc(100*time.Millisecond, shutdown)
			_, err := pgrecords.TxFromContext(ctx).Exec(ctx, `SELECT pg_sleep(60)`)
			return err
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var mu sync.Mutex
			var released []string
			r := idemgate.Runner{Store: s, Kind: "charge", Atomic: true, Lease: time.Hour,
				OnEvent: func(_ context.Context, ev idemgate.Event) {
					if ev.Type == idemgate.EventReleased {
						mu.Lock()
						released = append(released, ev.Reason)
						mu.Unlock()
					}
				}}
			ctx, shutdown := context.WithCancel(testCtx(t))
			_, err := r.Do(ctx, scope(tt.name), []byte(charge), func(ctx context.Context) ([]byte, error) {
				if _, err := pgrecords.TxFromContext(ctx).Exec(ctx, `INSERT INTO ledger VALUES ($1, 1)`, tt.name); err != nil {
					return nil, err
				}
				return nil, tt.then(ctx, shutdown)
			})
			if !errors.Is(err, context.Canceled) {
				t.Errorf("err = %v, want context.Canceled", err)
			}
			if got := ledgerRows(t, pool, tt.name); got != 0 {
				t.Errorf("ledger rows = %d, want 0: the write rolled back", got)
			}
			res, err := r.Do(testCtx(t), scope(tt.name), []byte(charge), func(context.Context) ([]byte, error) {
				return []byte("ok"), nil
			})
			if err != nil || res.Replayed {
				t.Errorf("redelivery = %+v, %v; want fn to run at once", res, err)
			}
			mu.Lock()
			defer mu.Unlock()
			if fmt.Sprint(released) != "[handler_error]" {
				t.Errorf("released = %q, want [handler_error]", released)
			}
		})
	}
}

// TestRunnerRefusesAnInvalidConfigWithoutRunning: each mistake is Do's
// error, and fn never runs.
func TestRunnerRefusesAnInvalidConfigWithoutRunning(t *testing.T) {
	t.Parallel()
	s := runnerStores[0].store(t)
	tests := []struct {
		name string
		r    idemgate.Runner
		want string
	}{
		{"no store", idemgate.Runner{Kind: "charge"}, "Store is required"},
		{"kind not a name", idemgate.Runner{Store: s, Kind: "Charge Card"}, `Kind "Charge Card"`},
		{"negative lease", idemgate.Runner{Store: s, Kind: "charge", Lease: -time.Second}, "Lease must not be negative"},
		{"sub-millisecond lease", idemgate.Runner{Store: s, Kind: "charge", Lease: time.Microsecond}, "Lease must be at least 1ms"},
		{"negative wait", idemgate.Runner{Store: s, Kind: "charge", WaitInFlight: -time.Second}, "WaitInFlight must not be negative"},
		{"negative retention", idemgate.Runner{Store: s, Kind: "charge", Retention: -time.Second}, "Retention must not be negative"},
		{"bad field", idemgate.Runner{Store: s, Kind: "charge", Fingerprint: fingerprint.Spec{Fields: []string{"amount"}}}, "Fingerprint"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := tt.r.Do(testCtx(t), scope("msg-1"), []byte(charge), func(context.Context) ([]byte, error) {
				t.Error("fn ran")
				return nil, nil
			})
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err = %v, want one naming %q", err, tt.want)
			}
		})
	}
}

// TestDoRefusesANilFnWithoutClaiming: a nil fn is Do's error before any
// claim; it does not panic, and the key stays free.
func TestDoRefusesANilFnWithoutClaiming(t *testing.T) {
	t.Parallel()
	r := idemgate.Runner{Store: runnerStores[0].store(t), Kind: "charge", Lease: time.Hour}
	var events []string
	r.OnEvent = func(_ context.Context, ev idemgate.Event) { events = append(events, ev.Type.String()) }
	func() {
		defer func() {
			if p := recover(); p != nil {
				t.Errorf("Do panicked: %v", p)
			}
		}()
		if _, err := r.Do(testCtx(t), scope("msg-1"), []byte(charge), nil); err == nil {
			t.Error("Do with a nil fn returned no error")
		}
	}()
	if len(events) != 0 {
		t.Errorf("events = %q, want none: nothing was claimed", events)
	}
}

// TestDoKeepsTheKeyClaimedWhenTheResultCannotBeStored: the store fails
// as fn's result is stored: Do returns the output with the store's error,
// and the key stays claimed (a redelivery is in progress, not run again)
// until the lease runs out.
func TestDoKeepsTheKeyClaimedWhenTheResultCannotBeStored(t *testing.T) {
	t.Parallel()
	mr := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: mr.Addr(), MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	var storeErrors []string
	r := idemgate.Runner{Store: redisstore.New(c), Kind: "charge", Lease: time.Hour,
		OnEvent: func(_ context.Context, ev idemgate.Event) {
			if ev.Type == idemgate.EventStoreError {
				storeErrors = append(storeErrors, ev.Reason)
			}
		}}
	res, err := r.Do(testCtx(t), scope("msg-1"), []byte(charge), func(context.Context) ([]byte, error) {
		mr.SetError("LOADING the store is down")
		return []byte("charged"), nil
	})
	if err == nil || !strings.HasPrefix(err.Error(), "idemgate: do: complete: ") || string(res.Value) != "charged" {
		t.Errorf("Do = %+v, %v; want the output and the completion's failure", res, err)
	}
	if fmt.Sprint(storeErrors) != "[complete]" {
		t.Errorf("store_error events = %q, want [complete]", storeErrors)
	}
	mr.SetError("")
	_, err = r.Do(testCtx(t), scope("msg-1"), []byte(charge), func(context.Context) ([]byte, error) {
		t.Error("fn ran again while the first run's claim was live")
		return nil, nil
	})
	if !errors.Is(err, idemgate.ErrInProgress) {
		t.Errorf("redelivery: %v, want ErrInProgress", err)
	}
}

// TestDoRunsTwiceWhenTheLeaseIsLostMidFn: on a plain store, a claim lost
// while fn runs (here released by an operator's Forget; in life, a lease that ran out while the
// worker was cut off) lets another delivery run fn too: both effects
// happen, and the first Do returns its output with ErrLeaseLost.
// (Atomic on pgrecords rolls the first back instead:
// TestDoAtomicRollsBackWhenTheLeaseWasLost.)
func TestDoRunsTwiceWhenTheLeaseIsLostMidFn(t *testing.T) {
	t.Parallel()
	mr := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { c.Close() })
	var mu sync.Mutex
	var events []string
	rs := redisstore.New(c)
	r := idemgate.Runner{Store: rs, Kind: "charge", Lease: 300 * time.Millisecond,
		OnEvent: func(_ context.Context, ev idemgate.Event) {
			mu.Lock()
			defer mu.Unlock()
			events = append(events, ev.Type.String()+":"+ev.Reason)
		}}
	var runs atomic.Int32
	res, err := r.Do(testCtx(t), scope("msg-1"), []byte(charge), func(ctx context.Context) ([]byte, error) {
		runs.Add(1)
		req, _ := idemgate.RequestFromContext(ctx)
		info, err := rs.Inspect(ctx, req.Key.String())
		if err != nil {
			return nil, err
		}
		if err := rs.Forget(ctx, req.Key.String(), info.Token, false); err != nil {
			return nil, err
		}
		if _, err := r.Do(testCtx(t), scope("msg-1"), []byte(charge), func(context.Context) ([]byte, error) {
			runs.Add(1)
			return []byte("second"), nil
		}); err != nil {
			return nil, err
		}
		<-ctx.Done()
		if !errors.Is(context.Cause(ctx), idemgate.ErrLeaseLost) {
			return nil, fmt.Errorf("fn's context ended with %v, want ErrLeaseLost", context.Cause(ctx))
		}
		return []byte("first"), nil
	})
	if !errors.Is(err, idemgate.ErrLeaseLost) || string(res.Value) != "first" {
		t.Errorf("first Do = %+v, %v; want its output and ErrLeaseLost", res, err)
	}
	if runs.Load() != 2 {
		t.Errorf("fn ran %d times, want 2", runs.Load())
	}
	res, err = r.Do(testCtx(t), scope("msg-1"), []byte(charge), func(context.Context) ([]byte, error) {
		return nil, errors.New("fn ran a third time")
	})
	if err != nil || string(res.Value) != "second" || !res.Replayed {
		t.Errorf("third delivery = %+v, %v; want the second's output, replayed", res, err)
	}
	mu.Lock()
	defer mu.Unlock()
	// One lease_lost per store call that found the claim gone: the
	// renewal's, then the completion's (EventLeaseLost's contract).
	if got := fmt.Sprint(events); got != "[claimed: claimed: lease_lost:extend lease_lost:complete replayed:]" {
		t.Errorf("events = %s", got)
	}
}

// TestDoAtomicSaysFnsOwnCommitMayHaveTakenEffect: fn that ends the
// store's transaction itself (COMMIT as SQL) has committed what it wrote
// before; Do cannot undo that. It says so (ErrTxAborted, "may have
// committed") and releases the key, so a redelivery runs fn again: the
// effect twice, as docs/consumers.md warns.
func TestDoAtomicSaysFnsOwnCommitMayHaveTakenEffect(t *testing.T) {
	t.Parallel()
	pool, s := pgStore(t)
	r := idemgate.Runner{Store: s, Kind: "charge", Atomic: true}
	fn := func(ctx context.Context) ([]byte, error) {
		tx := pgrecords.TxFromContext(ctx)
		if _, err := tx.Exec(ctx, `INSERT INTO ledger VALUES ('msg-own-commit', 1)`); err != nil {
			return nil, err
		}
		_, err := tx.Exec(ctx, `COMMIT`)
		return []byte("booked"), err
	}
	_, err := r.Do(testCtx(t), scope("msg-own-commit"), []byte(charge), fn)
	if !errors.Is(err, idemgate.ErrTxAborted) || !strings.Contains(err.Error(), "may have committed") {
		t.Errorf("err = %v, want ErrTxAborted saying fn's writes may have committed", err)
	}
	if got := ledgerRows(t, pool, "msg-own-commit"); got != 1 {
		t.Errorf("ledger rows = %d, want 1: fn's own COMMIT took effect", got)
	}
	if _, err := r.Do(testCtx(t), scope("msg-own-commit"), []byte(charge), fn); !errors.Is(err, idemgate.ErrTxAborted) {
		t.Errorf("redelivery: %v, want fn to run (and break its transaction) again", err)
	}
	if got := ledgerRows(t, pool, "msg-own-commit"); got != 2 {
		t.Errorf("ledger rows = %d after the redelivery, want 2", got)
	}
}

// TestDoAtomicWritesOncePerKeyUnderManyConcurrentDeliveries: many keys,
// each delivered several times at once to Atomic Do on PostgreSQL: each
// key's write is in the ledger once, and every delivery that did not run
// fn got its output, replayed, or was told the work is in progress.
func TestDoAtomicWritesOncePerKeyUnderManyConcurrentDeliveries(t *testing.T) {
	t.Parallel()
	pool, s := pgStore(t)
	r := idemgate.Runner{Store: s, Kind: "charge", Atomic: true, WaitInFlight: 100 * time.Millisecond}
	const keys, deliveries = 8, 4
	var wg sync.WaitGroup
	var mu sync.Mutex
	outcomes := map[string]int{}
	start := make(chan struct{})
	for k := range keys {
		msg := fmt.Sprintf("msg-%d", k)
		for range deliveries {
			wg.Go(func() {
				<-start
				res, err := r.Do(testCtx(t), scope(msg), []byte(charge), func(ctx context.Context) ([]byte, error) {
					_, err := pgrecords.TxFromContext(ctx).Exec(ctx, `INSERT INTO ledger VALUES ($1, 100)`, msg)
					return []byte("booked " + msg), err
				})
				outcome := "ran"
				switch {
				case errors.Is(err, idemgate.ErrInProgress):
					outcome = "in progress"
				case err != nil:
					outcome = err.Error()
				case string(res.Value) != "booked "+msg:
					outcome = fmt.Sprintf("output %q", res.Value)
				case res.Replayed:
					outcome = "replayed"
				}
				mu.Lock()
				outcomes[outcome]++
				mu.Unlock()
			})
		}
	}
	close(start)
	wg.Wait()
	for k := range keys {
		if got := ledgerRows(t, pool, fmt.Sprintf("msg-%d", k)); got != 1 {
			t.Errorf("msg-%d: ledger rows = %d, want 1", k, got)
		}
	}
	if outcomes["ran"] != keys || outcomes["ran"]+outcomes["replayed"]+outcomes["in progress"] != keys*deliveries {
		t.Errorf("outcomes = %v, want %d ran and the rest replayed or in progress", outcomes, keys)
	}
}

// TestDoReturnsFnsErrorWhenTheReleaseFails: fn fails and the store is
// down as Do releases the key: Do still returns fn's error as it is, a
// store_error event says the release failed, and the key stays claimed
// (a redelivery is in progress) until its lease runs out.
func TestDoReturnsFnsErrorWhenTheReleaseFails(t *testing.T) {
	t.Parallel()
	mr := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: mr.Addr(), MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	var storeErrors []string
	r := idemgate.Runner{Store: redisstore.New(c), Kind: "charge", Lease: time.Hour,
		OnEvent: func(_ context.Context, ev idemgate.Event) {
			if ev.Type == idemgate.EventStoreError {
				storeErrors = append(storeErrors, ev.Reason)
			}
		}}
	errDown := errors.New("payment provider down")
	_, err := r.Do(testCtx(t), scope("msg-1"), []byte(charge), func(context.Context) ([]byte, error) {
		mr.SetError("LOADING the store is down")
		return nil, errDown
	})
	if err != errDown {
		t.Errorf("err = %v, want fn's error as it is", err)
	}
	if fmt.Sprint(storeErrors) != "[release]" {
		t.Errorf("store_error events = %q, want [release]", storeErrors)
	}
	mr.SetError("")
	if _, err := r.Do(testCtx(t), scope("msg-1"), []byte(charge), func(context.Context) ([]byte, error) {
		return nil, errors.New("fn ran while the failed run's claim was live")
	}); !errors.Is(err, idemgate.ErrInProgress) {
		t.Errorf("redelivery: %v, want ErrInProgress", err)
	}
}

// TestDoStopsWaitingWhenItsCallerLeaves: a delivery waiting (WaitInFlight)
// for the run that holds the key returns its context's error as soon as
// its context ends, with a waited event saying so; it never runs fn, and
// the holder's run finishes undisturbed.
func TestDoStopsWaitingWhenItsCallerLeaves(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, s idemgate.Store) {
		var mu sync.Mutex
		var waited []string
		r := idemgate.Runner{Store: s, Kind: "charge", WaitInFlight: time.Hour,
			OnEvent: func(_ context.Context, ev idemgate.Event) {
				if ev.Type == idemgate.EventWaited {
					mu.Lock()
					waited = append(waited, ev.Reason)
					mu.Unlock()
				}
			}}
		running, finish := make(chan struct{}), make(chan struct{})
		holder := make(chan error, 1)
		go func() {
			_, err := r.Do(testCtx(t), scope("msg-1"), []byte(charge), func(context.Context) ([]byte, error) {
				close(running)
				<-finish
				return []byte("charged"), nil
			})
			holder <- err
		}()
		<-running
		ctx, leave := context.WithCancel(testCtx(t))
		time.AfterFunc(50*time.Millisecond, leave)
		_, err := r.Do(ctx, scope("msg-1"), []byte(charge), func(context.Context) ([]byte, error) {
			t.Error("the waiting delivery ran fn")
			return nil, nil
		})
		if !errors.Is(err, context.Canceled) {
			t.Errorf("waiting delivery: %v, want context.Canceled", err)
		}
		close(finish)
		if err := <-holder; err != nil {
			t.Errorf("holder: %v", err)
		}
		mu.Lock()
		defer mu.Unlock()
		if fmt.Sprint(waited) != "[canceled]" {
			t.Errorf("waited events = %q, want [canceled]", waited)
		}
		res, err := r.Do(testCtx(t), scope("msg-1"), []byte(charge), func(context.Context) ([]byte, error) {
			return nil, errors.New("fn ran again")
		})
		if err != nil || !res.Replayed || string(res.Value) != "charged" {
			t.Errorf("redelivery = %+v, %v; want the holder's output, replayed", res, err)
		}
	})
}
