package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemgate/idemgate/internal/devserver"
	"github.com/idemgate/idemgate/tools/internal/pgdsn"
)

// databases are the run's databases, one per system, on one server.
type databases struct {
	admin   string            // URL of the server's maintenance database
	dsns    map[string]string // system → its database
	version string            // the server's version
	server  *devserver.Postgres
	// cpu reads the throwaway server's CPU time so far; nil with
	// DATABASE_URL.
	cpu func() time.Duration
}

// startDatabases starts a throwaway server (or uses the one at adminURL)
// and creates a database for each system. With statements, the throwaway
// server loads pg_stat_statements. The server must allow conns
// connections.
func startDatabases(ctx context.Context, adminURL string, statements bool, conns int) (*databases, error) {
	d := &databases{admin: adminURL, dsns: map[string]string{}}
	if d.admin == "" {
		sctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		defer cancel()
		p, err := devserver.StartPostgres(sctx)
		if err != nil {
			return nil, err
		}
		d.server, d.admin = p, p.DSN("postgres")
		if statements {
			if err := preloadStatements(sctx, p); err != nil {
				d.close()
				return nil, err
			}
		}
		d.cpu = serverCPU(filepath.Join(p.Dir, "data"))
	}
	conn, err := pgx.Connect(ctx, d.admin)
	if err != nil {
		d.close()
		return nil, fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(ctx)
	var maxConns, reserved int
	if err := conn.QueryRow(ctx, `SELECT current_setting('server_version'),
	current_setting('max_connections')::int, current_setting('superuser_reserved_connections')::int`).
		Scan(&d.version, &maxConns, &reserved); err != nil {
		d.close()
		return nil, err
	}
	if maxConns-reserved < conns {
		d.close()
		return nil, fmt.Errorf("the server allows %d connections (max_connections %d less %d reserved); the run needs %d",
			maxConns-reserved, maxConns, reserved, conns)
	}
	for _, sys := range systems() {
		name := fmt.Sprintf("riverbench_%d_%s", os.Getpid(), strings.ReplaceAll(sys, "-", "_"))
		if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
			d.close()
			return nil, fmt.Errorf("create database: %w", err)
		}
		d.dsns[sys] = pgdsn.WithDatabase(d.admin, name)
	}
	return d, nil
}

// preloadStatements restarts p with pg_stat_statements loaded.
func preloadStatements(ctx context.Context, p *devserver.Postgres) error {
	conn, err := pgx.Connect(ctx, p.DSN("postgres"))
	if err != nil {
		return err
	}
	_, err = conn.Exec(ctx, "ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'")
	conn.Close(ctx)
	if err != nil {
		return fmt.Errorf("preload pg_stat_statements: %w", err)
	}
	return p.Restart(ctx)
}

// close drops the databases and stops the throwaway server.
func (d *databases) close() {
	if d.server != nil {
		_ = d.server.Stop()
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, d.admin)
	if err != nil {
		fmt.Fprintln(os.Stderr, "riverbench: drop databases:", err)
		return
	}
	defer conn.Close(ctx)
	for _, dsn := range d.dsns {
		cfg, err := pgx.ParseConfig(dsn)
		if err != nil {
			continue
		}
		if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+cfg.Database+" WITH (FORCE)"); err != nil {
			fmt.Fprintln(os.Stderr, "riverbench: drop database:", err)
		}
	}
}
