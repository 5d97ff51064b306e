package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgate/idemgate/keyspace"
	"github.com/idemgate/idemgate/pgstore"
)

const tasksUsage = `Usage: %[1]s tasks <command> [flags]

Operator tools on the task queue in DATABASE_URL (every tenant's tasks).

  tasks list [-state S] [-tenant T] [-kind K] [-limit N]   newest first
  tasks show ID
  tasks retry ID [-yes] a failed task runs again on the same ID, attempts reset
  tasks cancel ID [-yes]
  tasks limits KIND [-max-running N] [-max-running-per-tenant N] [-starts-per-second R]
                        with no limit flag: print the kind's limits; a flag sets that
                        limit (0: none) and keeps the others
  tasks pause KIND      no new attempt of KIND starts; running ones finish
  tasks resume KIND

A KIND that no task or limit has named is refused (a typo would pause
nothing) unless -new-kind. Each prints a table, or JSON with -json.
Read-only commands (list, show, limits without a flag) write nothing.
retry and cancel show the task and ask for yes at a terminal; without
one they need -yes.
`

// Tasks runs "tasks list|show|retry|cancel|limits|pause|resume":
// pgstore's Operator view and kind limits.
func Tasks(ctx context.Context, args []string, env Env) error {
	help := fmt.Sprintf(tasksUsage, env.Prog)
	sub, pre, args, err := verb(args, help, env)
	if err != nil {
		return err
	}
	fs := newFlagSet(env, "tasks "+sub, strings.SplitN(help, "\n\n", 2)[1])
	var c common
	c.database(fs, env.Getenv)
	c.jsonFlag(fs)
	var (
		f       pgstore.Filter
		state   string
		limits  limitFlags
		newKind bool
		yes     bool
	)
	operands := 1
	switch sub {
	case "list":
		operands = 0
		fs.StringVar(&state, "state", "", "only tasks in this state: pending, running, retrying, uncertain, succeeded, failed, cancelled")
		fs.StringVar(&f.Tenant, "tenant", "", "only this tenant's tasks (as stored, the normalized segment, or as spelled)")
		fs.StringVar(&f.Kind, "kind", "", "only tasks of this kind")
		fs.IntVar(&f.Limit, "limit", 20, fmt.Sprintf("at most this many tasks (1 to %d)", pgstore.MaxListLimit))
	case "limits":
		fs.Var(&limits.maxRunning, "max-running", "attempts of the kind running at once, across all workers (0: no limit)")
		fs.Var(&limits.perTenant, "max-running-per-tenant", "the same, per tenant (0: no limit)")
		fs.Var(&limits.rate, "starts-per-second", fmt.Sprintf("attempt starts per second across all workers (0: no limit; at most %d)", pgstore.MaxStartsPerSecond))
		fs.BoolVar(&newKind, "new-kind", false, "allow a kind that no task or limit has named yet")
	case "pause", "resume":
		fs.BoolVar(&newKind, "new-kind", false, "allow a kind that no task or limit has named yet")
	case "retry", "cancel":
		fs.BoolVar(&yes, "yes", false, "confirm without asking")
	case "show":
	default:
		fmt.Fprintf(env.Stderr, "tasks: unknown command %s\n\n%s", shown(sub), help)
		return ErrUsage
	}
	ops, err := parse(fs, pre, args, operands)
	if err != nil {
		return err
	}
	var operand string
	if len(ops) == 1 {
		operand = ops[0]
	}
	if newKind {
		if err := checkKind(operand); err != nil {
			return usageError(fs, "%v", err)
		}
	}
	if err := limits.check(); err != nil {
		return usageError(fs, "%v", err)
	}
	if sub == "list" && (f.Limit < 1 || f.Limit > pgstore.MaxListLimit) {
		return usageError(fs, "-limit %d: want 1 to %d", f.Limit, pgstore.MaxListLimit)
	}
	if state != "" {
		if f.State, err = parseState(state); err != nil {
			return usageError(fs, "%v", err)
		}
	}
	pool, schema, err := c.openPool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := requireCurrent(ctx, pool, schema, "pgstore"); err != nil {
		return err
	}
	store, err := pgstore.New(ctx, pool)
	if err != nil {
		return err
	}
	op := store.Operator()
	out := printer{w: env.Stdout, json: c.json}

	switch sub {
	case "list":
		ts, err := op.List(ctx, f)
		if err != nil {
			return err
		}
		// Tenants are stored as keyspace's normalized segment ("Acme Corp"
		// is "Acme%20Corp"); an operator types the name as the customer
		// spells it.
		if seg := keyspace.NormalizeSegment(f.Tenant); len(ts) == 0 && seg != f.Tenant {
			fmt.Fprintf(env.Stderr, "tasks: tenant %q is stored as %q; listing that\n", f.Tenant, seg)
			f.Tenant = seg
			if ts, err = op.List(ctx, f); err != nil {
				return err
			}
		}
		return out.tasks(ts)
	case "show":
		t, err := op.Get(ctx, operand)
		if err != nil {
			return notFound(err, operand)
		}
		return out.task(t)
	case "retry", "cancel":
		if !yes {
			if err := confirmTask(ctx, op, env, out, sub, operand); err != nil {
				return err
			}
		}
		act := op.Cancel
		if sub == "retry" {
			act = op.Retry
		}
		cctx, cancel := confirmed(ctx)
		defer cancel()
		t, err := act(cctx, operand)
		if errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("the %s may or may not have happened (run tasks show): %w", sub, err)
		}
		if err != nil {
			return notFound(err, operand)
		}
		return out.task(t)
	}

	if !newKind {
		known, err := kindKnown(ctx, pool, operand)
		if err != nil {
			return err
		}
		if !known {
			hint := ""
			if s := suggestKind(operand); s != "" && s != operand {
				if known, err := kindKnown(ctx, pool, s); err == nil && known {
					hint = fmt.Sprintf(" did you mean %q?", s)
				}
			}
			return fmt.Errorf("no task or limit has ever named kind %q (a typo?%s); pass -new-kind to set it before its first task", operand, hint)
		}
	}
	l, err := changeLimits(ctx, store, sub, operand, limits)
	if err != nil {
		return err
	}
	return out.limits(ctx, store, operand, l)
}

// confirmTask asks before "retry" or "cancel" changes task id. A task the
// command would refuse anyway (retry of a task that has not failed,
// cancel of a finished one) needs no confirmation: the command says why
// it refuses. What was read can change before the command acts; the
// Operator's own checks decide then.
func confirmTask(ctx context.Context, op pgstore.Operator, env Env, out printer, sub, id string) error {
	t, err := op.Get(ctx, id)
	if err != nil {
		return notFound(err, id)
	}
	var what string
	switch {
	case sub == "retry" && t.State == pgstore.StateFailed:
		what = fmt.Sprintf("retry task %s (a new attempt calls its upstream again; attempts reset)", t.ID)
	case sub == "cancel" && t.State != pgstore.StateSucceeded && t.State != pgstore.StateFailed && t.State != pgstore.StateCancelled:
		what = fmt.Sprintf("cancel task %s (%s; it never runs again, and a running attempt is told to stop)", t.ID, t.State)
	default:
		return nil
	}
	return confirm(ctx, env, what, func(w io.Writer) {
		printer{w: w}.task(t) //nolint:errcheck // the answer below matters more
	})
}

// notFound says which ID was not found.
func notFound(err error, id string) error {
	if errors.Is(err, pgstore.ErrNotFound) {
		return fmt.Errorf("task %q: %w", id, err)
	}
	return err
}

// sqlKindKnown reports whether a task or a limit has named a kind. A
// typo is rare, so the scan of the tasks a typo costs is paid rarely;
// a known kind stops at its first row.
const sqlKindKnown = `SELECT EXISTS (SELECT 1 FROM idemgate_kind_limits WHERE kind = $1)
	OR EXISTS (SELECT 1 FROM idemgate_tasks WHERE kind = $1)`

func kindKnown(ctx context.Context, pool *pgxpool.Pool, kind string) (bool, error) {
	var known bool
	if err := pool.QueryRow(ctx, sqlKindKnown, kind).Scan(&known); err != nil {
		return false, fmt.Errorf("look up kind %q: %w", kind, err)
	}
	return known, nil
}

// changeLimits runs limits, pause or resume on kind and returns the
// kind's limits after it. Each changes only what it names, in one
// transaction on the kind's locked row (Store.UpdateKindLimits): two
// operators changing one kind at once keep both changes (a read of all
// limits then a write of all would let one undo the other's). "limits"
// without a limit flag only reads.
func changeLimits(ctx context.Context, store *pgstore.Store, sub, kind string, limits limitFlags) (pgstore.KindLimits, error) {
	if sub == "limits" && !limits.any() {
		return store.KindLimits(ctx, kind)
	}
	return store.UpdateKindLimits(ctx, kind, func(l pgstore.KindLimits) pgstore.KindLimits {
		switch sub {
		case "pause":
			l.Paused = true
		case "resume":
			l.Paused = false
		case "limits":
			limits.apply(&l)
		}
		return l
	})
}

func parseState(s string) (pgstore.State, error) {
	for _, st := range []pgstore.State{pgstore.StatePending, pgstore.StateRunning, pgstore.StateRetrying,
		pgstore.StateUncertain, pgstore.StateSucceeded, pgstore.StateFailed, pgstore.StateCancelled} {
		if s == string(st) {
			return st, nil
		}
	}
	return "", fmt.Errorf("-state %q: want pending, running, retrying, uncertain, succeeded, failed or cancelled", s)
}

// limitFlags are the limits given on the command line; a flag not given
// keeps the stored value.
type limitFlags struct {
	maxRunning, perTenant intFlag
	rate                  floatFlag
}

func (f limitFlags) any() bool { return f.maxRunning.set || f.perTenant.set || f.rate.set }

func (f limitFlags) apply(l *pgstore.KindLimits) {
	if f.maxRunning.set {
		l.MaxRunning = f.maxRunning.v
	}
	if f.perTenant.set {
		l.MaxRunningPerTenant = f.perTenant.v
	}
	if f.rate.set {
		l.StartsPerSecond = f.rate.v
	}
}

// check refuses, by flag name, a limit that pgstore would refuse (by Go
// field name, after a connection): a command line is checked before any
// database is reached.
func (f limitFlags) check() error {
	switch {
	case f.maxRunning.set && (f.maxRunning.v < 0 || f.maxRunning.v > math.MaxInt32):
		return fmt.Errorf("-max-running %d: want 0 (no limit) to %d", f.maxRunning.v, math.MaxInt32)
	case f.perTenant.set && (f.perTenant.v < 0 || f.perTenant.v > math.MaxInt32):
		return fmt.Errorf("-max-running-per-tenant %d: want 0 (no limit) to %d", f.perTenant.v, math.MaxInt32)
	case f.rate.set && !(f.rate.v >= 0 && f.rate.v <= pgstore.MaxStartsPerSecond): // NaN fails both
		return fmt.Errorf("-starts-per-second %v: want 0 (no limit) to %d", f.rate.v, pgstore.MaxStartsPerSecond)
	}
	return nil
}

// kindSyntax is the syntax of a kind, as keyspace derives it from a route
// (keyspace.KindFor) and checks it: no task submitted through the
// middleware has any other kind.
const kindSyntax = "[a-z0-9][a-z0-9_-]{0,63}"

// checkKind refuses a kind no task can have, with what was likely meant.
func checkKind(kind string) error {
	ok := len(kind) > 0 && len(kind) <= 64
	for i := 0; ok && i < len(kind); i++ {
		c := kind[i]
		ok = 'a' <= c && c <= 'z' || '0' <= c && c <= '9' || i > 0 && (c == '_' || c == '-')
	}
	if ok {
		return nil
	}
	msg := fmt.Sprintf("kind %s: no task can have it (a kind is %s)", shown(kind), kindSyntax)
	if s := suggestKind(kind); s != "" {
		msg += fmt.Sprintf("; did you mean %q?", s)
	}
	return errors.New(msg)
}

// suggestKind returns kind in the kind syntax, if it differs only in case,
// surrounding space or spaces for dashes; else "".
func suggestKind(kind string) string {
	s := strings.Join(strings.Fields(strings.ToLower(kind)), "-")
	if s == "" || s == kind || checkKind(s) != nil {
		return ""
	}
	return s
}

// intFlag and floatFlag remember whether they were given.
type intFlag struct {
	v   int
	set bool
}

// Set reads the whole value: "8abc" or "1e3" is an error, never 8 or 1.
func (f *intFlag) String() string { return fmt.Sprint(f.v) }
func (f *intFlag) Set(s string) error {
	v, err := strconv.Atoi(s)
	if err != nil {
		return errors.New("not a whole number")
	}
	f.v, f.set = v, true
	return nil
}

type floatFlag struct {
	v   float64
	set bool
}

// Set reads the whole value: "0,5" (a decimal comma) is an error, never 0,
// which would remove the limit.
func (f *floatFlag) String() string { return fmt.Sprint(f.v) }
func (f *floatFlag) Set(s string) error {
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return errors.New("not a number")
	}
	f.v, f.set = v, true
	return nil
}

// taskRow is a task as the tools print it.
type taskRow struct {
	ID         string            `json:"task_id"`
	Tenant     string            `json:"tenant"`
	Owner      string            `json:"owner"`
	Kind       string            `json:"kind"`
	State      string            `json:"state"`
	Attempt    int               `json:"attempt"`
	Recoveries int               `json:"recoveries"`
	Priority   int               `json:"priority"`
	RunAfter   time.Time         `json:"run_after"`
	CreatedAt  time.Time         `json:"created_at"`
	UpdatedAt  time.Time         `json:"updated_at"`
	Error      string            `json:"error,omitempty"`
	Params     json.RawMessage   `json:"params,omitempty"`
	Results    []json.RawMessage `json:"-"`
	NResults   int               `json:"results"`
}

func rowOf(t pgstore.Task) taskRow {
	return taskRow{ID: t.ID, Tenant: t.Tenant, Owner: t.Owner, Kind: t.Kind, State: string(t.State),
		Attempt: t.Attempt, Recoveries: t.Recoveries, Priority: t.Priority, RunAfter: t.RunAfter,
		CreatedAt: t.CreatedAt, UpdatedAt: t.UpdatedAt, Error: t.Error, Params: t.Params,
		Results: t.Results, NResults: len(t.Results)}
}

// limitsRow is a kind's limits and what runs of it now.
type limitsRow struct {
	Kind                string  `json:"kind"`
	Paused              bool    `json:"paused"`
	MaxRunning          int     `json:"max_running"`
	MaxRunningPerTenant int     `json:"max_running_per_tenant"`
	StartsPerSecond     float64 `json:"starts_per_second"`
	Running             int     `json:"running"`  // attempts counting against the limits (Stats.Attempts)
	Runnable            int     `json:"runnable"` // pending and retrying
}

func (p printer) tasks(ts []pgstore.Task) error {
	rows := make([]taskRow, len(ts))
	for i, t := range ts {
		rows[i] = rowOf(t)
		rows[i].Params = nil // list stays short; show has them
	}
	if p.json {
		return p.encode(rows)
	}
	tw := tabwriter.NewWriter(p.w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tTENANT\tKIND\tSTATE\tATTEMPT\tPRIORITY\tCREATED\tERROR")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%s\t%s\n", r.ID, r.Tenant, r.Kind, r.State, r.Attempt,
			r.Priority, r.CreatedAt.UTC().Format(time.DateTime), clip(r.Error, 60))
	}
	if len(rows) == 0 {
		fmt.Fprintln(tw, "(no tasks)")
	}
	return tw.Flush()
}

func (p printer) task(t pgstore.Task) error {
	r := rowOf(t)
	if p.json {
		return p.encode(r)
	}
	tw := tabwriter.NewWriter(p.w, 0, 4, 2, ' ', 0)
	for _, kv := range [][2]string{
		{"task", r.ID}, {"tenant", r.Tenant}, {"owner", r.Owner}, {"kind", r.Kind}, {"state", r.State},
		{"attempt", fmt.Sprint(r.Attempt)}, {"recoveries", fmt.Sprint(r.Recoveries)},
		{"priority", fmt.Sprint(r.Priority)}, {"run after", r.RunAfter.UTC().Format(time.RFC3339)},
		{"created", r.CreatedAt.UTC().Format(time.RFC3339)}, {"updated", r.UpdatedAt.UTC().Format(time.RFC3339)},
		{"params", clip(string(r.Params), 200)}, {"results", fmt.Sprint(r.NResults)}, {"error", r.Error},
	} {
		fmt.Fprintf(tw, "%s:\t%s\n", kv[0], kv[1])
	}
	return tw.Flush()
}

func (p printer) limits(ctx context.Context, store *pgstore.Store, kind string, l pgstore.KindLimits) error {
	st, err := store.Stats(ctx)
	if err != nil {
		return err
	}
	c := st.Counts[kind]
	r := limitsRow{Kind: kind, Paused: l.Paused, MaxRunning: l.MaxRunning, MaxRunningPerTenant: l.MaxRunningPerTenant,
		StartsPerSecond: l.StartsPerSecond, Running: st.Attempts[kind],
		Runnable: c[pgstore.StatePending] + c[pgstore.StateRetrying]}
	if p.json {
		return p.encode(r)
	}
	tw := tabwriter.NewWriter(p.w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "KIND\tPAUSED\tRUNNING\tMAX RUNNING\tPER TENANT\tSTARTS/S\tRUNNABLE")
	fmt.Fprintf(tw, "%s\t%v\t%d\t%s\t%s\t%s\t%d\n", r.Kind, r.Paused, r.Running, limitText(float64(r.MaxRunning)),
		limitText(float64(r.MaxRunningPerTenant)), limitText(r.StartsPerSecond), r.Runnable)
	return tw.Flush()
}

// limitText prints a limit, "-" for none.
func limitText(v float64) string {
	if v == 0 {
		return "-"
	}
	return fmt.Sprint(v)
}

// clip shortens s to n runes for a table cell, on one line.
func clip(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}
