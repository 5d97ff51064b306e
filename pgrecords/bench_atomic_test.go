package pgrecords_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/labstack/echo/v4"

	"github.com/idemgate/idemgate/internal/testenv"
	"github.com/idemgate/idemgate/middleware"
	"github.com/idemgate/idemgate/pgrecords"
)

// BenchmarkAtomic compares an Atomic route that writes one ledger row in
// its transaction with the same write on a pgrecords route that is not
// Atomic (autocommit), on a miss (a new key every request) and on a
// replay (one key, finished), requests alternating between the two routes
// (each first in half the pairs) so that both see the same machine:
//
//	go test -run '^$' -bench Atomic -benchtime 3000x ./pgrecords/
//
// It reports each route's time per request and atomic/plain, the Atomic
// route's throughput as a fraction of the plain one's (1 is equal).
func BenchmarkAtomic(b *testing.B) {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, testenv.PostgresDSN(b))
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	s, err := pgrecords.New(ctx, pool)
	if err != nil {
		b.Fatal(err)
	}
	if err := s.Migrate(ctx); err != nil {
		b.Fatal(err)
	}
	if _, err := pool.Exec(ctx, ledgerDDL); err != nil {
		b.Fatal(err)
	}
	scope := func(echo.Context) (string, string, error) { return "acme", "alice", nil }
	e := echo.New()
	e.POST("/atomic", func(c echo.Context) error {
		if _, err := pgrecords.Tx(c).Exec(c.Request().Context(), `INSERT INTO ledger (key, node) VALUES ($1, 'atomic')`, c.Request().Header.Get("Idempotency-Key")); err != nil {
			return err
		}
		return c.JSON(http.StatusCreated, map[string]string{"ok": "atomic"})
	}, middleware.New(middleware.Config{Store: s, Scope: scope, Kind: "atomic", Atomic: true}))
	e.POST("/plain", func(c echo.Context) error {
		if _, err := pool.Exec(c.Request().Context(), `INSERT INTO ledger (key, node) VALUES ($1, 'plain')`, c.Request().Header.Get("Idempotency-Key")); err != nil {
			return err
		}
		return c.JSON(http.StatusCreated, map[string]string{"ok": "plain"})
	}, middleware.New(middleware.Config{Store: s, Scope: scope, Kind: "plain"}))
	send := func(path, key string) {
		r := httptest.NewRequest(http.MethodPost, path, strings.NewReader(`{"report":"q3"}`))
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("Idempotency-Key", key)
		w := httptest.NewRecorder()
		e.ServeHTTP(w, r)
		if w.Code != http.StatusCreated {
			b.Fatalf("%s = %d %s", path, w.Code, w.Body)
		}
	}
	for _, tt := range []struct {
		name string
		key  func(run, i int) string
	}{
		{"miss", func(run, i int) string { return fmt.Sprint("miss-", run, "-", i) }},
		{"replay", func(int, int) string { return "replay" }},
	} {
		run := 0
		b.Run(tt.name, func(b *testing.B) {
			run++
			send("/atomic", tt.key(run, -1)) // warm: connections, statements, the replay's record
			send("/plain", tt.key(run, -1))
			var atomic, plain time.Duration
			timed := func(path string, i int) time.Duration {
				t0 := time.Now()
				send(path, tt.key(run, i))
				return time.Since(t0)
			}
			for i := 0; b.Loop(); i++ {
				if i%2 == 0 { // each goes first in half the pairs
					atomic += timed("/atomic", i)
					plain += timed("/plain", i)
				} else {
					plain += timed("/plain", i)
					atomic += timed("/atomic", i)
				}
			}
			b.ReportMetric(float64(atomic.Nanoseconds())/float64(b.N), "atomic-ns/req")
			b.ReportMetric(float64(plain.Nanoseconds())/float64(b.N), "plain-ns/req")
			b.ReportMetric(float64(plain)/float64(atomic), "atomic/plain")
		})
	}
}
