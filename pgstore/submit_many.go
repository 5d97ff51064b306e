package pgstore

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// SubmitResult is what SubmitMany did with one task.
type SubmitResult struct {
	// Task is the task stored, or the one that already held the key
	// (Duplicate set), when Err is nil.
	Task Task
	// Err is this task's own error: ErrConflict, or why the task was
	// refused before it reached the database (an empty field, a priority
	// out of range, params that are not JSON Postgres can store).
	Err error
}

// SubmitMany is Submit for many tasks in one statement: one round trip
// for the batch (more only if a key's holder is not visible yet, as with
// Submit). Each task follows Submit's rules on its own: it is stored, or
// the task holding its key is returned with Duplicate set, or its result
// has ErrConflict. Results come in the order of ts.
//
// A key given twice in ts makes one task: the first of the two stores it,
// and the second gets it back with Duplicate set, or ErrConflict if its
// owner, kind or fingerprint differ. The error returned beside the
// results is the batch's (the database refused the statement); then
// results is nil and the failed statement stored nothing. Submitting the
// batch again is safe: what an earlier statement of the call stored comes
// back as duplicates.
//
// New tasks that may run now wake listening workers, one notification
// per kind per batch.
func (s *Store) SubmitMany(ctx context.Context, ts []NewTask) ([]SubmitResult, error) {
	results := make([]SubmitResult, len(ts))
	todo := make([]int, 0, len(ts)) // indexes into ts still without a result
	for i, t := range ts {
		if err := t.validateForBatch(); err != nil {
			results[i].Err = err
			continue
		}
		todo = append(todo, i)
	}
	if len(todo) == 0 {
		return results, nil
	}
	now := s.elapsed()
	var notify []string
	for _, i := range todo {
		if k := ts[i].Kind; ts[i].RunAfter.IsZero() && !slices.Contains(notify, k) && s.announce.due(k, now) {
			notify = append(notify, k)
		}
	}
	announced := map[string]bool{}
	for range submitTries {
		rows, err := s.submitBatch(ctx, ts, todo, notify)
		if err != nil {
			return nil, err
		}
		done := make([]bool, len(todo))
		for _, r := range rows {
			pos := int(r.Ord) - 1
			if pos < 0 || pos >= len(todo) || done[pos] {
				return nil, fmt.Errorf("pgstore: submit many: unexpected row for item %d", r.Ord)
			}
			done[pos] = true
			t := ts[todo[pos]]
			if r.Duplicate && (r.Owner != t.Owner || r.Kind != t.Kind || r.Fingerprint != t.Fingerprint) {
				results[todo[pos]].Err = ErrConflict
				continue
			}
			results[todo[pos]].Task = r.Task
			if !r.Duplicate && t.RunAfter.IsZero() {
				announced[t.Kind] = true
			}
		}
		// What is left has a holder this snapshot could not see: run
		// those again, like Submit.
		left := todo[:0]
		for pos, i := range todo {
			if !done[pos] {
				left = append(left, i)
			}
		}
		todo = left
		if len(todo) == 0 {
			break
		}
	}
	for _, k := range notify {
		if announced[k] {
			s.announce.sent(k, now)
		}
	}
	for _, i := range todo {
		results[i].Err = fmt.Errorf("pgstore: submit many: key is held, but no task with the full key "+
			"(tenant, key, runtime, network) became visible after %d tries", submitTries)
	}
	return results, nil
}

// batchRow is a row of sqlSubmitMany: a task and the position (from 1)
// of the item it answers in the statement's arrays.
type batchRow struct {
	Ord int64 `db:"ord"`
	Task
}

// submitBatch runs sqlSubmitMany once for the tasks ts[i], i in idx.
func (s *Store) submitBatch(ctx context.Context, ts []NewTask, idx []int, notify []string) ([]batchRow, error) {
	n := len(idx)
	var (
		tenants, owners, kinds   = make([]string, n), make([]string, n), make([]string, n)
		runtimes, networks, keys = make([]string, n), make([]string, n), make([]string, n)
		fingerprints, traces     = make([]string, n), make([]string, n)
		params                   = make([][]byte, n) // nil ⇒ SQL NULL
		runAfters                = make([]pgtype.Timestamptz, n)
		priorities               = make([]int16, n)
	)
	for j, i := range idx {
		t := ts[i]
		tenants[j], owners[j], kinds[j] = t.Tenant, t.Owner, t.Kind
		runtimes[j], networks[j], keys[j] = t.Runtime, t.Network, t.IdempotencyKey
		fingerprints[j], traces[j] = t.Fingerprint, storableText(t.Trace)
		if len(t.Params) > 0 {
			params[j] = t.Params
		}
		runAfters[j] = runAfterArg(t.RunAfter)
		priorities[j] = int16(t.Priority) // validated
	}
	rows, _ := s.pool.Query(ctx, sqlSubmitMany, pgx.NamedArgs{
		"tenants": tenants, "owners": owners, "kinds": kinds, "runtimes": runtimes, "networks": networks,
		"keys": keys, "fingerprints": fingerprints, "params": params, "traces": traces,
		"run_afters": runAfters, "priorities": priorities, "notify_kinds": notify,
	})
	got, err := pgx.CollectRows(rows, pgx.RowToStructByName[batchRow])
	if err != nil {
		return nil, interpretError("submit many", err)
	}
	return got, nil
}

// validateForBatch is validate, plus what would make Postgres refuse the
// whole batch statement: text with NUL or invalid UTF-8, params that are
// not JSON or hold a string jsonb refuses. Such a task gets its own error
// instead.
func (t NewTask) validateForBatch() error {
	if err := t.validate(); err != nil {
		return err
	}
	for _, f := range []struct{ name, v string }{
		{"tenant", t.Tenant}, {"owner", t.Owner}, {"kind", t.Kind}, {"runtime", t.Runtime},
		{"network", t.Network}, {"idempotency key", t.IdempotencyKey}, {"fingerprint", t.Fingerprint},
	} {
		if !utf8.ValidString(f.v) || strings.IndexByte(f.v, 0) >= 0 {
			return fmt.Errorf("pgstore: submit: %s: NUL or invalid UTF-8, which Postgres cannot store", f.name)
		}
	}
	if len(t.Params) > 0 {
		if !json.Valid(t.Params) {
			return errors.New("pgstore: submit: params: not valid JSON")
		}
		if !bytes.Equal(storableJSON(t.Params), t.Params) {
			return errors.New("pgstore: submit: params: a string jsonb cannot store (\\u0000, an unpaired surrogate or invalid UTF-8)")
		}
	}
	return nil
}
