package pgstore

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemgate/idemgate/internal/wait"
)

// A database whose defaults are SERIALIZABLE (or REPEATABLE READ) with
// a short statement_timeout and lock_timeout, set with ALTER DATABASE
// as a DBA would: Migrate builds the schema from nothing, Submits,
// SubmitMany and SubmitTx store each key once, and workers of a kind
// with MaxRunning run every task exactly once, within the limit.
func TestTheQueueUnderStrictDatabaseDefaults(t *testing.T) {
	t.Parallel()
	for _, level := range isolationLevels[1:] {
		t.Run(level, func(t *testing.T) {
			t.Parallel()
			db := newTestDB(t)
			ctx := hangBound(t)
			admin := db.pool(t)
			var dbname string
			if err := admin.QueryRow(ctx, `SELECT current_database()`).Scan(&dbname); err != nil {
				t.Fatal(err)
			}
			if _, err := admin.Exec(ctx, `ALTER DATABASE `+pgx.Identifier{dbname}.Sanitize()+
				` SET default_transaction_isolation = '`+level+`'; ALTER DATABASE `+pgx.Identifier{dbname}.Sanitize()+
				` SET statement_timeout = '20s'; ALTER DATABASE `+pgx.Identifier{dbname}.Sanitize()+
				` SET lock_timeout = '2s'`); err != nil {
				t.Fatal(err)
			}
			s := newStore(db.pool(t)) // connections made after the ALTER
			var got string
			if err := s.pool.QueryRow(ctx, `SHOW default_transaction_isolation`).Scan(&got); err != nil || got != level {
				t.Fatalf("the pool's default isolation %q (%v); want %q", got, err, level)
			}
			if err := s.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
			attemptLog(t, s.pool)
			if err := s.SetKindLimits(ctx, "image", KindLimits{MaxRunning: 2, StartsPerSecond: 500}); err != nil {
				t.Fatal(err)
			}
			cfg := WorkerConfig{Concurrency: 4, RescueInterval: 100 * time.Millisecond,
				BackoffBase: time.Millisecond, BackoffMax: time.Millisecond,
				Handler: func(context.Context, Task) Outcome { return Succeeded(json.RawMessage(`1`)) }}
			for range 3 {
				runWorker(t, newWorker(t, newStore(db.pool(t)), cfg))
			}
			const n = 30
			done := make(chan error, 3)
			go func() {
				var err error
				for i := range n {
					// Under SERIALIZABLE, Postgres' own conflict checks may
					// fail a Submit past its own tries (40001): the caller
					// runs it again, as docs/tasks.md says.
					for try := 0; try < 50; try++ {
						if _, err = s.Submit(ctx, tenantTask(fmt.Sprintf("t%d", i%3), fmt.Sprintf("k%d", i))); sqlState(err) != codeSerializationFailure {
							break
						}
					}
					if err != nil {
						break
					}
				}
				done <- err
			}()
			go func() {
				var batch []NewTask
				for i := range n {
					batch = append(batch, tenantTask(fmt.Sprintf("t%d", i%3), fmt.Sprintf("k%d", i)))
				}
				var err error
				for try := 0; try < 50; try++ {
					if _, err = s.SubmitMany(ctx, batch); sqlState(err) != codeSerializationFailure {
						break
					}
				}
				done <- err
			}()
			go func() {
				var err error
				for i := range n {
					for try := 0; try < 50; try++ {
						err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
							_, err := s.SubmitTx(ctx, tx, tenantTask(fmt.Sprintf("t%d", i%3), fmt.Sprintf("k%d", i)))
							return err
						})
						if sqlState(err) != codeSerializationFailure {
							break
						}
					}
					if err != nil {
						break
					}
				}
				done <- err
			}()
			for range 3 {
				if err := <-done; err != nil {
					t.Fatal(err)
				}
			}
			wait.For(t, patience, "every task succeeded", func() bool {
				return countRows(t, s.pool, "state = 'succeeded'") == n
			})
			if got := countRows(t, s.pool, "true"); got != n {
				t.Fatalf("%d tasks; want %d", got, n)
			}
			ivs := attemptIntervals(t, s.pool)
			if len(ivs) != n || maxOverlap(ivs, "") > 2 {
				t.Fatalf("%d attempts, at most %d at once; want %d, at most 2", len(ivs), maxOverlap(ivs, ""), n)
			}
		})
	}
}
