package cli

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgate/idemgate/internal/migrate"
	"github.com/idemgate/idemgate/pgrecords"
	"github.com/idemgate/idemgate/pgstore"
)

const migrateUsage = `Usage: %[1]s migrate up | status | sql [flags]

  migrate up       apply every pending version of pgstore (the task queue)
                   and pgrecords (idempotency records in Postgres); safe to
                   run from many places at once
  migrate status   each version, applied or not (reads only)
  migrate sql      the SQL of the migrations, for a DBA or a migration tool
                   (psql -v ON_ERROR_STOP=1 -f); needs no database unless
                   -pending. Run with psql, it records the versions that
                   "migrate up" would, so either finds the other's work done.

Flags: -package pgstore|pgrecords (default both), -schema, -json;
status: -check (exit 1 when a version is pending or newer than this
idemgate); sql: -pending.
`

// pkg is one package's migrations as the command sees them.
type pkg struct {
	name   string
	sql    func() string
	status func(context.Context, *pgxpool.Pool) ([]migrate.VersionState, error)
	up     func(context.Context, *pgxpool.Pool) error
}

var packages = []pkg{
	{
		name: "pgstore", sql: pgstore.MigrationSQL,
		status: func(ctx context.Context, pool *pgxpool.Pool) ([]migrate.VersionState, error) {
			s, err := pgstore.New(ctx, pool)
			if err != nil {
				return nil, err
			}
			return s.MigrationStatus(ctx)
		},
		up: func(ctx context.Context, pool *pgxpool.Pool) error {
			s, err := pgstore.New(ctx, pool)
			if err != nil {
				return err
			}
			return s.Migrate(ctx)
		},
	},
	{
		name: "pgrecords", sql: pgrecords.MigrationSQL,
		status: func(ctx context.Context, pool *pgxpool.Pool) ([]migrate.VersionState, error) {
			s, err := pgrecords.New(ctx, pool)
			if err != nil {
				return nil, err
			}
			return s.MigrationStatus(ctx)
		},
		up: func(ctx context.Context, pool *pgxpool.Pool) error {
			s, err := pgrecords.New(ctx, pool)
			if err != nil {
				return err
			}
			return s.Migrate(ctx)
		},
	},
}

func packageNamed(name string) (pkg, bool) {
	for _, p := range packages {
		if p.name == name {
			return p, true
		}
	}
	return pkg{}, false
}

// Migrate runs "migrate up|status|sql".
func Migrate(ctx context.Context, args []string, env Env) error {
	help := fmt.Sprintf(migrateUsage, env.Prog)
	sub, pre, args, err := verb(args, help, env)
	if err != nil {
		return err
	}
	fs := newFlagSet(env, "migrate "+sub, strings.SplitN(help, "\n\n", 2)[1])
	var c common
	c.database(fs, env.Getenv)
	c.jsonFlag(fs)
	only := fs.String("package", "", "only this package's migrations: pgstore or pgrecords")
	var check, pending bool
	switch sub {
	case "up":
	case "status":
		fs.BoolVar(&check, "check", false, "exit 1 when a version is pending, or one is newer than this idemgate knows")
	case "sql":
		fs.BoolVar(&pending, "pending", false, "only the versions DATABASE_URL's schema lacks (reads the database)")
	default:
		fmt.Fprintf(env.Stderr, "migrate: unknown command %s\n\n%s", shown(sub), help)
		return ErrUsage
	}
	if _, err := parse(fs, pre, args, 0); err != nil {
		return err
	}
	pkgs := packages
	if *only != "" {
		p, ok := packageNamed(*only)
		if !ok {
			return usageError(fs, "-package %q: want pgstore or pgrecords", *only)
		}
		pkgs = []pkg{p}
	}
	out := printer{w: env.Stdout, json: c.json}
	if sub == "sql" && !pending {
		return printSQL(out, c.schema, pkgs, nil)
	}

	pool, schema, err := c.openPool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	switch sub {
	case "up":
		for _, p := range pkgs {
			if err := p.up(ctx, pool); err != nil {
				if errors.Is(err, migrate.ErrNoSchema) {
					return fmt.Errorf("schema %s does not exist: %w", schema, err)
				}
				return err
			}
		}
	case "sql":
		states, err := statuses(ctx, pool, pkgs)
		if err != nil {
			return err
		}
		return printSQL(out, c.schema, pkgs, states)
	}
	states, err := statuses(ctx, pool, pkgs)
	if err != nil {
		return err
	}
	if err := printStatus(out, schema, pkgs, states); err != nil {
		return err
	}
	if check {
		for _, p := range pkgs {
			if n := len(migrate.Pending(states[p.name])); n > 0 {
				return fmt.Errorf("schema %s: %s has %d pending version(s)", schema, p.name, n)
			}
			// A newer idemgate migrated further: this binary cannot vouch
			// for the schema, and one deploying it would roll code back.
			if n := countUnknown(states[p.name]); n > 0 {
				return fmt.Errorf("schema %s: %s has %d version(s) newer than this idemgate knows (a newer idemgate applied them): use that idemgate, or check that this one is the version meant to run", schema, p.name, n)
			}
		}
	}
	return nil
}

func statuses(ctx context.Context, pool *pgxpool.Pool, pkgs []pkg) (map[string][]migrate.VersionState, error) {
	m := make(map[string][]migrate.VersionState, len(pkgs))
	for _, p := range pkgs {
		vs, err := p.status(ctx, pool)
		if err != nil {
			return nil, err
		}
		m[p.name] = vs
	}
	return m, nil
}

// statusRow is a version as "migrate status -json" prints it.
type statusRow struct {
	Package string `json:"package"`
	migrate.VersionState
}

func printStatus(p printer, schema string, pkgs []pkg, states map[string][]migrate.VersionState) error {
	var rows []statusRow
	for _, pk := range pkgs {
		for _, v := range states[pk.name] {
			rows = append(rows, statusRow{Package: pk.name, VersionState: v})
		}
	}
	if p.json {
		return p.encode(struct {
			Schema   string      `json:"schema"`
			Versions []statusRow `json:"versions"`
		}{schema, rows})
	}
	fmt.Fprintf(p.w, "schema %s\n", schema)
	tw := tabwriter.NewWriter(p.w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PACKAGE\tVERSION\tAPPLIED\tNAME")
	for _, r := range rows {
		applied := "pending"
		switch {
		case r.Unknown:
			applied = r.AppliedAt.UTC().Format(time.DateTime) + " (unknown to this idemgate: a newer one applied it)"
		case r.Applied:
			applied = r.AppliedAt.UTC().Format(time.DateTime)
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\n", r.Package, r.Version, applied, r.Name)
	}
	return tw.Flush()
}

// sqlChunk is one part of "migrate sql -json": a package's setup or a
// version.
type sqlChunk struct {
	Package     string `json:"package"`
	Version     int    `json:"version,omitempty"` // 0: the setup
	Name        string `json:"name,omitempty"`
	Transaction bool   `json:"transaction"` // false: run each statement on its own
	SQL         string `json:"sql"`
}

// printSQL prints the packages' scripts; with states, only the versions
// not applied.
func printSQL(p printer, schema string, pkgs []pkg, states map[string][]migrate.VersionState) error {
	var b strings.Builder
	b.WriteString("-- idemgate migrations. Run with: psql -X -v ON_ERROR_STOP=1 -f <this file>\n")
	b.WriteString("-- (never psql -1 or --single-transaction: CONCURRENTLY steps cannot run in a transaction).\n")
	setSchema := ""
	if schema != "" {
		setSchema = "SET search_path TO " + pgx.Identifier{schema}.Sanitize() + ";\n"
		b.WriteString(setSchema)
	}
	for _, pk := range pkgs {
		script := pk.sql()
		if states != nil {
			applied := states[pk.name]
			script = migrate.FilterScript(script, func(_ string, v int) bool {
				return !slices.ContainsFunc(applied, func(s migrate.VersionState) bool { return s.Version == v && s.Applied })
			})
		}
		b.WriteString("\n")
		b.WriteString(script)
	}
	if !p.json {
		_, err := fmt.Fprint(p.w, b.String())
		return err
	}
	return p.encode(chunksOf(b.String(), setSchema))
}

// chunksOf splits a script at its setup and version markers. Each chunk
// has setSchema (the script's SET search_path, if any) after its marker
// line, where the script says it once, in its header: a tool applies a chunk in a session of
// its own, or applies only some of them, and each must migrate the
// schema asked for.
func chunksOf(script, setSchema string) []sqlChunk {
	var out []sqlChunk
	var cur *sqlChunk
	var body strings.Builder
	flush := func() {
		if cur != nil {
			cur.SQL = body.String()
			out = append(out, *cur)
		}
		body.Reset()
	}
	for line := range strings.Lines(script) {
		switch {
		case strings.HasPrefix(line, migrate.MarkSetup):
			flush()
			name, _, _ := strings.Cut(strings.TrimPrefix(line, migrate.MarkSetup), ":")
			cur = &sqlChunk{Package: name, Name: "setup"}
			body.WriteString(line + setSchema) // after the marker, which stays the first line
			continue
		case strings.HasPrefix(line, migrate.MarkBegin):
			flush()
			var c sqlChunk
			var mode string
			rest := strings.TrimPrefix(line, migrate.MarkBegin)
			if _, err := fmt.Sscanf(rest, "%s v%d %s", &c.Package, &c.Version, &mode); err == nil {
				c.Transaction = mode == "transaction:"
				_, c.Name, _ = strings.Cut(rest, ": ")
				c.Name = strings.TrimSpace(c.Name)
			}
			cur = &c
			body.WriteString(line + setSchema)
			continue
		case cur == nil:
			continue // the header
		}
		body.WriteString(line)
	}
	flush()
	return out
}

// requireCurrent fails unless the schema has every version of the
// package this build knows: a read-only command never migrates.
func requireCurrent(ctx context.Context, pool *pgxpool.Pool, schema, name string) error {
	p, _ := packageNamed(name)
	vs, err := p.status(ctx, pool)
	if err != nil {
		return err
	}
	pending := migrate.Pending(vs)
	if len(pending) == 0 {
		return nil
	}
	if len(pending) == len(vs) {
		return fmt.Errorf("schema %s has no %s tables (no migration applied): run \"idemgate migrate up\", or apply \"idemgate migrate sql\"; is -schema right? (this command creates nothing)", schema, name)
	}
	newest := 0
	for _, v := range vs {
		if v.Applied && !v.Unknown {
			newest = v.Version
		}
	}
	return fmt.Errorf("schema %s is at %s v%d, older than this command needs (v%d): run \"idemgate migrate up\", or apply \"idemgate migrate sql -pending\" (this command changes no schema)",
		schema, name, newest, vs[len(vs)-1-countUnknown(vs)].Version)
}

func countUnknown(vs []migrate.VersionState) int {
	n := 0
	for _, v := range vs {
		if v.Unknown {
			n++
		}
	}
	return n
}
