package pgstore

import (
	"context"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"
)

// Operator is the store as an operator's tools see it: the tasks of every
// tenant, found by ID alone, without the owner check of Store.Get and
// Store.Cancel. Hand it to operator tools (a CLI, an admin endpoint behind
// its own authentication), never to a request path that acts for a user.
type Operator struct{ s *Store }

// Operator returns the operator's view of s.
func (s *Store) Operator() Operator { return Operator{s: s} }

// Filter selects tasks for Operator.List. An empty field matches every
// task; a State that is none of the package's is an error.
type Filter struct {
	State  State
	Tenant string
	Kind   string
	// Limit is the most tasks List returns, newest first. Optional.
	// Default 100; at most MaxListLimit.
	Limit int
}

// knownStates are the states a task can be in.
var knownStates = []State{StatePending, StateRunning, StateRetrying, StateUncertain, StateSucceeded, StateFailed, StateCancelled}

// MaxListLimit bounds Filter.Limit.
const MaxListLimit = 1000

// List returns the tasks f selects, newest first. It is meant for
// people: it may read much of the table.
func (o Operator) List(ctx context.Context, f Filter) ([]Task, error) {
	switch {
	case f.Limit < 0 || f.Limit > MaxListLimit:
		return nil, fmt.Errorf("pgstore: list: limit %d outside [0, %d]", f.Limit, MaxListLimit)
	case f.State != "" && !slices.Contains(knownStates, f.State):
		// A typo must not read as an empty queue.
		return nil, fmt.Errorf("pgstore: list: unknown state %q", f.State)
	case f.Limit == 0:
		f.Limit = 100
	}
	rows, _ := o.s.pool.Query(ctx, sqlList, pgx.NamedArgs{"state": string(f.State), "tenant": f.Tenant,
		"kind": f.Kind, "limit": f.Limit})
	ts, err := pgx.CollectRows(rows, pgx.RowToStructByName[Task])
	if err != nil {
		return nil, interpretError("list", err)
	}
	return ts, nil
}

// Get returns the task with that ID, whoever it belongs to, or
// ErrNotFound.
func (o Operator) Get(ctx context.Context, id string) (Task, error) {
	return o.s.get(ctx, scope{operator: true}, id)
}

// Cancel is Store.Cancel for the task with that ID, whoever it belongs to.
func (o Operator) Cancel(ctx context.Context, id string) (Task, error) {
	return o.s.cancel(ctx, scope{operator: true}, id)
}

// Retry runs a failed task again, on the same task ID, as a controlled
// recovery: its attempts are reset (a fresh MaxAttempts budget), its
// error cleared, and it takes a new turn in its tenant's line; partial
// results it kept stay, for the handler to see. Unlike Store.Recover it
// needs no partial results and is not bounded by MaxRecoveries (it still
// counts in Task.Recoveries): an operator decides. A task that is not
// failed is refused with an error wrapping ErrNotRecoverable.
func (o Operator) Retry(ctx context.Context, id string) (Task, error) {
	if !validID(id) {
		return Task{}, ErrNotFound
	}
	t, found, err := queryTaskAlone(ctx, o.s.pool, sqlOperatorRetry, pgx.NamedArgs{"id": id})
	if err != nil {
		return Task{}, interpretError("retry", err)
	}
	if found {
		return t, nil
	}
	cur, err := o.Get(ctx, id)
	if err != nil {
		return Task{}, fmt.Errorf("pgstore: retry: %w", err)
	}
	return Task{}, fmt.Errorf("%w: task is %s, not failed", ErrNotRecoverable, cur.State)
}
