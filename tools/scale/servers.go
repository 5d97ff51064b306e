package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgate/idemgate/internal/devserver"
	"github.com/idemgate/idemgate/pgrecords"
	"github.com/idemgate/idemgate/pgstore"
	"github.com/idemgate/idemgate/tools/internal/pgdsn"
)

// postgres is the run's server: each measured queue or table gets a
// database of its own, dropped once measured (a 1M backlog or 10M
// records would otherwise stay on disk for the rest of the run).
type postgres struct {
	admin  string
	server *devserver.Postgres // nil with DATABASE_URL
	next   atomic.Int64

	once        sync.Once
	templateErr error
}

func startPostgres(ctx context.Context, adminURL string) (*postgres, error) {
	p := &postgres{admin: adminURL}
	if adminURL == "" {
		sctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		srv, err := devserver.StartPostgres(sctx)
		if err != nil {
			return nil, err
		}
		p.server, p.admin = srv, srv.DSN("postgres")
	}
	return p, nil
}

func (p *postgres) close() {
	if p.server != nil {
		_ = p.server.Stop()
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_ = p.admExec(ctx, "DROP DATABASE IF EXISTS "+p.template())
}

// database creates a database with both stores' schemas and returns a
// pool on it and its drop. The schemas are migrated once, into a
// template database that each copies (a migration's index builds cost
// seconds on a loaded machine, as much as a small case's measurement).
func (p *postgres) database(ctx context.Context) (*pgxpool.Pool, func(), error) {
	p.once.Do(func() { p.templateErr = p.migrateTemplate(ctx) })
	if p.templateErr != nil {
		return nil, nil, p.templateErr
	}
	name := fmt.Sprintf("scale_%d_%d", os.Getpid(), p.next.Add(1))
	if err := p.admExec(ctx, "CREATE DATABASE "+name+" TEMPLATE "+p.template()); err != nil {
		return nil, nil, fmt.Errorf("create database: %w", err)
	}
	cfg, err := pgxpool.ParseConfig(pgdsn.WithDatabase(p.admin, name))
	if err != nil {
		return nil, nil, err
	}
	// Room for a worker's 16 handlers' Submits beside its claims,
	// completions and listener: a claim waiting for a connection
	// would time the pool, not the statement.
	cfg.MaxConns = 40
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		_ = p.admExec(context.Background(), "DROP DATABASE "+name)
		return nil, nil, err
	}
	drop := func() {
		pool.Close()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = p.admExec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
	}
	return pool, drop, nil
}

func (p *postgres) template() string { return fmt.Sprintf("scale_%d_template", os.Getpid()) }

// migrateTemplate creates the template database and migrates both
// stores into it with their own Migrate.
func (p *postgres) migrateTemplate(ctx context.Context) error {
	if err := p.admExec(ctx, "CREATE DATABASE "+p.template()); err != nil {
		return fmt.Errorf("create template database: %w", err)
	}
	pool, err := pgxpool.New(ctx, pgdsn.WithDatabase(p.admin, p.template()))
	if err != nil {
		return err
	}
	defer pool.Close()
	tasks, err := pgstore.New(ctx, pool)
	if err != nil {
		return err
	}
	if err := tasks.Migrate(ctx); err != nil {
		return fmt.Errorf("pgstore: %w", err)
	}
	records, err := pgrecords.New(ctx, pool)
	if err != nil {
		return err
	}
	if err := records.Migrate(ctx); err != nil {
		return fmt.Errorf("pgrecords: %w", err)
	}
	return nil
}

func (p *postgres) admExec(ctx context.Context, sql string) error {
	conn, err := pgx.Connect(ctx, p.admin)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, sql)
	return err
}

// loadAvg is the machine's one-minute load average.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Fields(string(b))[0]
}

// describeMachine says when and on what the run measures: the date,
// the checkout's commit (with "+changes" when the stores' code differs
// from it), the cores and the load.
func describeMachine() string {
	commit := "unknown commit"
	if out, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output(); err == nil {
		commit = "commit " + strings.TrimSpace(string(out))
		// The stores' uncommitted changes, which the command measures
		// too (tests excluded: they are not built into it).
		st, _ := exec.Command("git", "status", "--porcelain", "--", ":(top)pgstore", ":(top)pgrecords", ":(top)middleware").Output()
		var changed []string
		for _, l := range strings.Split(strings.TrimSpace(string(st)), "\n") {
			if f := strings.Fields(l); len(f) > 0 && !strings.HasSuffix(f[len(f)-1], "_test.go") {
				changed = append(changed, f[len(f)-1])
			}
		}
		if len(changed) > 0 {
			commit += " with uncommitted " + strings.Join(changed, ", ")
		}
		// The last commit of each store's code (tests aside), which a
		// figure is of.
		var last []string
		for _, dir := range []string{"pgstore", "pgrecords", "middleware"} {
			if out, err := exec.Command("git", "log", "-1", "--format=%h", "--", ":(top)"+dir, ":(top,exclude)"+dir+"/**/*_test.go", ":(top,exclude)"+dir+"/*_test.go").Output(); err == nil {
				last = append(last, dir+" "+strings.TrimSpace(string(out)))
			}
		}
		if len(last) > 0 {
			commit += " (last changed: " + strings.Join(last, ", ") + ")"
		}
	}
	return fmt.Sprintf("%s UTC, %s, %d cores, load %s", time.Now().UTC().Format("2006-01-02 15:04"), commit,
		runtime.NumCPU(), loadAvg())
}
