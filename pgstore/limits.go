package pgstore

import (
	"context"
	"errors"
	"fmt"
	"math"

	"github.com/jackc/pgx/v5"
)

// KindLimits bind every worker of the database at once; they are stored in
// the database and take effect without a restart. Zero means no limit (and
// not paused).
//
// A limit counts every start of a handler of the kind: first attempts,
// retries and Reconcile calls. An attempt counts from its claim until its
// lease ends or it finishes, so the attempt of a worker that died counts
// until its lease runs out. Claims of a limited kind are serialized by an
// advisory lock, so workers racing for the last slot never exceed a limit;
// a claim that began before SetKindLimits returned is bound by the limits
// it read.
//
// Limits assume handlers honour their context. An attempt that ran past
// its kind's Timeout, or lost its lease, is written off in the database
// (retried, uncertain or rescued) and no longer counts; a handler that
// ignores its cancelled context still runs meanwhile, beside the
// attempts that the freed room lets start.
type KindLimits struct {
	// MaxRunning bounds the attempts of the kind running at once, across
	// all workers.
	MaxRunning int
	// MaxRunningPerTenant bounds the same per tenant.
	MaxRunningPerTenant int
	// StartsPerSecond bounds attempt starts per second across all
	// workers: a token bucket with a burst of one second's worth (at
	// least one start). At most MaxStartsPerSecond; a faster rate would
	// limit nothing a claim can start.
	StartsPerSecond float64
	// Paused stops new attempts from starting; running ones finish, and
	// Submit still accepts tasks.
	Paused bool
}

// MaxStartsPerSecond is the fastest KindLimits.StartsPerSecond: a million
// starts a second, far beyond what one database's claims reach. The limits
// table holds no faster rate (a CHECK since schema v7).
const MaxStartsPerSecond = 1_000_000

func (l KindLimits) validate() error {
	switch {
	case l.MaxRunning < 0 || l.MaxRunning > math.MaxInt32:
		return fmt.Errorf("pgstore: kind limits: MaxRunning %d outside [0, %d]", l.MaxRunning, math.MaxInt32)
	case l.MaxRunningPerTenant < 0 || l.MaxRunningPerTenant > math.MaxInt32:
		return fmt.Errorf("pgstore: kind limits: MaxRunningPerTenant %d outside [0, %d]", l.MaxRunningPerTenant, math.MaxInt32)
	case math.IsNaN(l.StartsPerSecond) || l.StartsPerSecond < 0 || l.StartsPerSecond > MaxStartsPerSecond:
		return fmt.Errorf("pgstore: kind limits: StartsPerSecond %v outside [0, %v]", l.StartsPerSecond, float64(MaxStartsPerSecond))
	}
	return nil
}

// SetKindLimits stores the limits of kind; the zero KindLimits removes
// them. Workers apply them from their next claim on. Negative limits and
// a rate that is NaN or above MaxStartsPerSecond are refused.
func (s *Store) SetKindLimits(ctx context.Context, kind string, l KindLimits) error {
	if kind == "" {
		return errors.New("pgstore: set kind limits: empty kind")
	}
	if err := l.validate(); err != nil {
		return err
	}
	// READ COMMITTED whatever the database's default: the upsert may wait
	// for the row (a claim of a rate-limited kind updates its tokens; an
	// UpdateKindLimits locks it) and must write over the holder's change,
	// where a REPEATABLE READ snapshot would fail with 40001.
	err := pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, sqlSetKindLimits, limitsArgs(kind, l))
		return err
	})
	if err != nil {
		return interpretError("set kind limits", err)
	}
	return nil
}

// UpdateKindLimits changes the limits of kind atomically: in one
// transaction it locks the kind's row (adding one without limits if there
// is none), passes the stored limits to f, and stores what f returns,
// refused as SetKindLimits refuses; it returns the limits stored. So
// concurrent updates of one kind each start from the other's result and
// none is lost, where a KindLimits then SetKindLimits by one operator can
// undo what another set in between: let f change only the fields it
// means to (pause: l.Paused = true; return l).
//
// f runs once, while the row is locked (claims of the kind wait for it):
// it should only compute, and is not called when the row cannot be read.
// Workers apply the limits from their next claim on, as after
// SetKindLimits.
func (s *Store) UpdateKindLimits(ctx context.Context, kind string, f func(KindLimits) KindLimits) (KindLimits, error) {
	if kind == "" {
		return KindLimits{}, errors.New("pgstore: update kind limits: empty kind")
	}
	if f == nil {
		return KindLimits{}, errors.New("pgstore: update kind limits: nil func")
	}
	var l KindLimits
	// READ COMMITTED whatever the database's default: the lock statement
	// waits for a concurrent update of the row and must read its result,
	// where a REPEATABLE READ snapshot would fail with 40001.
	err := pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, func(tx pgx.Tx) error {
		rows, _ := tx.Query(ctx, sqlLockKindLimits, pgx.NamedArgs{"kind": kind})
		old, err := pgx.CollectOneRow(rows, pgx.RowToStructByPos[KindLimits])
		if err != nil {
			return interpretError("update kind limits", err)
		}
		l = f(old)
		if err := l.validate(); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, sqlSetKindLimits, limitsArgs(kind, l)); err != nil {
			return interpretError("update kind limits", err)
		}
		return nil
	})
	if err != nil {
		return KindLimits{}, err
	}
	return l, nil
}

// limitsArgs are the arguments of sqlSetKindLimits.
func limitsArgs(kind string, l KindLimits) pgx.NamedArgs {
	return pgx.NamedArgs{"kind": kind, "max_running": l.MaxRunning, "max_running_per_tenant": l.MaxRunningPerTenant,
		"starts_per_second": l.StartsPerSecond, "paused": l.Paused}
}

// KindLimits returns the limits of kind: the zero value, and no error, for
// a kind whose limits were never set.
func (s *Store) KindLimits(ctx context.Context, kind string) (KindLimits, error) {
	rows, _ := s.pool.Query(ctx, sqlKindLimits, pgx.NamedArgs{"kind": kind})
	l, err := pgx.CollectOneRow(rows, pgx.RowToStructByPos[KindLimits])
	if errors.Is(err, pgx.ErrNoRows) {
		return KindLimits{}, nil
	}
	if err != nil {
		return KindLimits{}, interpretError("kind limits", err)
	}
	return l, nil
}

// allKindLimits returns the limits of every kind that has some.
func (s *Store) allKindLimits(ctx context.Context) (map[string]KindLimits, error) {
	type row struct {
		Kind string
		KindLimits
	}
	rows, _ := s.pool.Query(ctx, sqlAllKindLimits)
	got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (row, error) {
		var x row
		err := r.Scan(&x.Kind, &x.MaxRunning, &x.MaxRunningPerTenant, &x.StartsPerSecond, &x.Paused)
		return x, err
	})
	if err != nil {
		return nil, interpretError("kind limits", err)
	}
	out := make(map[string]KindLimits, len(got))
	for _, r := range got {
		out[r.Kind] = r.KindLimits
	}
	return out, nil
}
