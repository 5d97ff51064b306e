package main

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/jackc/pgx/v5"
)

// statements reads pg_stat_statements, for profiling a row: which
// statements each system's database ran, how often and for how long.
type statements struct {
	conn *pgx.Conn
}

// openStatements enables pg_stat_statements through the admin database;
// the server must preload it.
func openStatements(ctx context.Context, admin string) (*statements, error) {
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		return nil, err
	}
	if _, err := conn.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"); err != nil {
		conn.Close(ctx)
		return nil, fmt.Errorf("pg_stat_statements (start the server with it preloaded): %w", err)
	}
	return &statements{conn: conn}, nil
}

func (s *statements) reset(ctx context.Context) error {
	_, err := s.conn.Exec(ctx, "SELECT pg_stat_statements_reset()")
	return err
}

// print writes the top statements of each system's database by total
// execution time since the last reset.
func (s *statements) print(ctx context.Context, w io.Writer, row string, dsns map[string]string, top int) error {
	for _, sys := range systems() {
		cfg, err := pgx.ParseConfig(dsns[sys])
		if err != nil {
			return err
		}
		rows, err := s.conn.Query(ctx, `SELECT calls, total_exec_time, mean_exec_time, rows,
	(shared_blks_hit + shared_blks_read)::float8 / greatest(calls, 1), wal_bytes::float8 / greatest(calls, 1), query
FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
WHERE d.datname = $1 ORDER BY total_exec_time DESC LIMIT $2`, cfg.Database, top)
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "statements %s %s (calls, total ms, mean ms, rows, buffers a call, WAL bytes a call):\n", row, sys)
		for rows.Next() {
			var calls, n int64
			var total, mean, bufs, wal float64
			var query string
			if err := rows.Scan(&calls, &total, &mean, &n, &bufs, &wal, &query); err != nil {
				rows.Close()
				return err
			}
			query = strings.Join(strings.Fields(query), " ")
			if len(query) > 140 {
				query = query[:140] + "…"
			}
			fmt.Fprintf(w, "  %8d %9.1f %7.3f %8d %8.0f %8.0f  %s\n", calls, total, mean, n, bufs, wal, query)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
	}
	return nil
}

func (s *statements) close() { s.conn.Close(context.Background()) }
