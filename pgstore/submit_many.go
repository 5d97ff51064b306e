package pgstore

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"

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
	// first[i] is the index of the first valid item with ts[i]'s key, or
	// -1 for a refused item; todo holds the first items, in input order.
	first := make([]int, len(ts))
	firstOf := make(map[fullKey]int, len(ts))
	todo := make([]int, 0, len(ts))
	for i, t := range ts {
		if err := t.validate(); err != nil {
			results[i].Err, first[i] = err, -1
			continue
		}
		k := t.fullKey()
		f, ok := firstOf[k]
		if !ok {
			f = i
			firstOf[k] = i
			todo = append(todo, i)
		}
		first[i] = f
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
	stored := make(map[fullKey]Task, len(todo))
	var serialization error // the last try's, when it failed so
	for range submitTries {
		rows, err := s.submitBatch(ctx, ts, todo, notify)
		if sqlState(err) == codeSerializationFailure {
			// Under a REPEATABLE READ or SERIALIZABLE default, a key held
			// by a row committed after the statement's snapshot: the next
			// statement's snapshot sees it.
			serialization = err
			continue
		}
		serialization = nil
		if err != nil {
			return nil, err
		}
		for _, r := range rows {
			k := r.fullKey()
			f, ok := firstOf[k]
			if !ok {
				return nil, fmt.Errorf("pgstore: submit many: unexpected row for key %q", r.IdempotencyKey)
			}
			if _, ok := stored[k]; ok {
				// The key's row was inserted and also read back: its old
				// holder was deleted meanwhile. The inserted row, first,
				// is the answer.
				continue
			}
			stored[k] = r
			if !r.Duplicate && ts[f].RunAfter.IsZero() {
				announced[r.Kind] = true
			}
		}
		// What is left has a holder this snapshot could not see: run
		// those again, like Submit.
		left := todo[:0]
		for _, i := range todo {
			if _, ok := stored[ts[i].fullKey()]; !ok {
				left = append(left, i)
			}
		}
		todo = left
		if len(todo) == 0 {
			break
		}
	}
	if serialization != nil {
		// Every try failed, the last with a serialization failure: the
		// batch's error, which the caller may retry as any 40001.
		return nil, serialization
	}
	for _, k := range notify {
		if announced[k] {
			s.announce.sent(k, now)
		}
	}
	for i, t := range ts {
		if first[i] < 0 {
			continue
		}
		task, ok := stored[t.fullKey()]
		switch {
		case !ok:
			results[i].Err = fmt.Errorf("pgstore: submit many: key is held, but no task with the full key "+
				"(tenant, key, runtime, network) became visible after %d tries", submitTries)
			continue
		case i != first[i]:
			task.Duplicate = true // an earlier item of the batch stored it
		}
		if task.Duplicate && (task.Owner != t.Owner || task.Kind != t.Kind || task.Fingerprint != t.Fingerprint) {
			results[i].Err = ErrConflict
			continue
		}
		results[i].Task = task
	}
	return results, nil
}

// fullKey is the key a task is unique by.
type fullKey struct{ tenant, key, runtime, network string }

func (t NewTask) fullKey() fullKey { return fullKey{t.Tenant, t.IdempotencyKey, t.Runtime, t.Network} }
func (t Task) fullKey() fullKey    { return fullKey{t.Tenant, t.IdempotencyKey, t.Runtime, t.Network} }

// compare orders keys byte-wise, field by field: the order in which a
// batch inserts, the same in every batch.
func (k fullKey) compare(o fullKey) int {
	return cmp.Or(strings.Compare(k.tenant, o.tenant), strings.Compare(k.key, o.key),
		strings.Compare(k.runtime, o.runtime), strings.Compare(k.network, o.network))
}

// submitBatch runs sqlSubmitMany once for the tasks ts[i], i in idx
// (each key once), naming the arbiter that last worked (see arbiter).
func (s *Store) submitBatch(ctx context.Context, ts []NewTask, idx []int, notify []string) ([]Task, error) {
	args := batchArgs(ts, idx, notify)
	onColumns := s.arbiter.columns.Load()
	got, err := s.queryBatch(ctx, submitManyStatement(onColumns), args)
	if missingArbiter(err) {
		got, err = s.queryBatch(ctx, submitManyStatement(!onColumns), args)
		if !missingArbiter(err) {
			s.arbiter.columns.Store(!onColumns)
		}
	}
	if err != nil {
		return nil, interpretError("submit many", err)
	}
	return got, nil
}

// queryBatch runs a SubmitMany statement.
func (s *Store) queryBatch(ctx context.Context, sql string, args pgx.NamedArgs) ([]Task, error) {
	rows, _ := s.pool.Query(ctx, sql, args)
	return pgx.CollectRows(rows, pgx.RowToStructByName[Task])
}

// line is a line of turns: a tenant's tasks of a kind and priority.
type line struct {
	kind     string
	priority int
	tenant   string
}

// batchArgs are the arguments of sqlSubmitMany for the tasks ts[i], i in
// idx (each key once, in input order): each task's line and place in it,
// counted in input order, then every task in key order.
func batchArgs(ts []NewTask, idx []int, notify []string) pgx.NamedArgs {
	n := len(idx)
	var (
		lineOf                   = make(map[line]int32)
		linesOf, nths            = make([]int32, n), make([]int64, n)
		taken                    = make(map[int32]int64)
		order                    = make([]int, n) // positions in idx, in key order
		tenants, owners, kinds   = make([]string, n), make([]string, n), make([]string, n)
		runtimes, networks, keys = make([]string, n), make([]string, n), make([]string, n)
		fingerprints, traces     = make([]string, n), make([]string, n)
		params                   = make([][]byte, n) // nil ⇒ SQL NULL
		runAfters                = make([]pgtype.Timestamptz, n)
		priorities               = make([]int16, n)
		sortedLines, sortedNths  = make([]int32, n), make([]int64, n)
		digests                  = make([][]byte, n)
	)
	for j, i := range idx {
		t := ts[i]
		l := line{t.Kind, t.Priority, t.Tenant}
		li, ok := lineOf[l]
		if !ok {
			li = int32(len(lineOf) + 1) // SQL arrays count from 1
			lineOf[l] = li
		}
		linesOf[j], nths[j] = li, taken[li]
		taken[li]++
		order[j] = j
	}
	slices.SortFunc(order, func(a, b int) int { return ts[idx[a]].fullKey().compare(ts[idx[b]].fullKey()) })
	for j, p := range order {
		t := ts[idx[p]]
		tenants[j], owners[j], kinds[j] = t.Tenant, t.Owner, t.Kind
		runtimes[j], networks[j], keys[j] = t.Runtime, t.Network, t.IdempotencyKey
		fingerprints[j], traces[j] = t.Fingerprint, storableText(t.Trace)
		if len(t.Params) > 0 {
			params[j] = t.Params
		}
		runAfters[j] = runAfterArg(t.RunAfter)
		priorities[j] = int16(t.Priority) // validated
		sortedLines[j], sortedNths[j] = linesOf[p], nths[p]
		digests[j] = t.digest()
	}
	return pgx.NamedArgs{
		"tenants": tenants, "owners": owners, "kinds": kinds, "runtimes": runtimes, "networks": networks,
		"keys": keys, "fingerprints": fingerprints, "params": params, "traces": traces,
		"run_afters": runAfters, "priorities": priorities, "lines_of": sortedLines, "nths": sortedNths,
		"notify_kinds": notify, "key_digests": digests,
	}
}
