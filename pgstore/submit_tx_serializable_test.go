package pgstore

import (
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
)

// SubmitTx of the same keys in SERIALIZABLE and REPEATABLE READ
// transactions that have read first, racing each other and plain
// Submits from a pool whose default is SERIALIZABLE: each key makes
// exactly one task; every caller, retrying its transaction on 40001 as
// docs/tasks.md says, gets that task's ID back; a caller whose
// fingerprint drifted gets ErrConflict, never a task; and no error other
// than 40001 (retried) or ErrConflict escapes.
func TestSubmitTxOfTheSameKeysRacesUnderSerializable(t *testing.T) {
	t.Parallel()
	s, db := setup(t)
	ctx := hangBound(t)
	stores := []*Store{db.storeAt(t, "serializable"), db.storeAt(t, "repeatable read")}
	const callers, keys = 8, 12
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		errs  []error
		ids   = map[string]map[string]bool{} // key → IDs returned
		confl int
	)
	record := func(key string, got Task, err error) {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case errors.Is(err, ErrConflict):
			confl++
		case err != nil:
			errs = append(errs, fmt.Errorf("key %s: %w", key, err))
		default:
			if ids[key] == nil {
				ids[key] = map[string]bool{}
			}
			ids[key][got.ID] = true
		}
	}
	for c := range callers {
		wg.Go(func() {
			sl := stores[c%2]
			for k := range keys {
				key := fmt.Sprintf("k%d", (k+c)%keys)
				nt := tenantTask("t", key)
				drifted := c == callers-1 && k%4 == 0
				if drifted {
					nt.Fingerprint = "drifted"
				}
				if c%3 == 2 {
					got, err := stores[0].Submit(ctx, nt)
					record(key, got, err)
					continue
				}
				var got Task
				var err error
				for try := 0; try < 100; try++ {
					err = pgx.BeginTxFunc(ctx, sl.pool, pgx.TxOptions{IsoLevel: pgx.Serializable}, func(tx pgx.Tx) error {
						if _, err := tx.Exec(ctx, `SELECT count(*) FROM idemgate_tasks`); err != nil {
							return err
						}
						var err error
						got, err = sl.SubmitTx(ctx, tx, nt)
						return err
					})
					if sqlState(err) != codeSerializationFailure {
						break
					}
				}
				if drifted && err == nil && got.Fingerprint != "drifted" {
					err = fmt.Errorf("a drifted submit got task %s of fingerprint %q back", got.ID, got.Fingerprint)
				}
				record(key, got, err)
			}
		})
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d calls failed, first: %v", len(errs), errs[0])
	}
	for key, set := range ids {
		if len(set) != 1 {
			t.Errorf("key %s: %d IDs returned: %v", key, len(set), set)
		}
	}
	if n := countRows(t, s.pool, "true"); n != keys {
		t.Fatalf("%d tasks; want %d (one a key)", n, keys)
	}
	if n := orphanLines(t, s); n != 0 {
		t.Fatalf("%d lines with waiting tasks are not listed", n)
	}
	t.Logf("%d conflicts", confl)
}
