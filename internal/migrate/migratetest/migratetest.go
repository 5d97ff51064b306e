// Package migratetest applies migration scripts (migrate.Runner.Script)
// as a migration tool would, and describes a schema for comparison, for
// tests of pgstore's and pgrecords' MigrationSQL and of the idemgate
// command.
package migratetest

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/idemgate/idemgate/internal/migrate"
)

// Chunks splits a script at its marker lines: each chunk is what a
// migration tool runs as one unit, a transaction version's BEGIN …
// COMMIT or one step of statements outside a transaction.
func Chunks(script string) []string {
	var chunks []string
	var cur strings.Builder
	flush := func() {
		if strings.TrimSpace(stripComments(cur.String())) != "" {
			chunks = append(chunks, cur.String())
		}
		cur.Reset()
	}
	for line := range strings.Lines(script) {
		if strings.HasPrefix(line, migrate.MarkBegin) || strings.HasPrefix(line, migrate.MarkStep) ||
			strings.HasPrefix(line, migrate.MarkSetup) ||
			strings.HasPrefix(line, migrate.MarkTransaction) {
			flush()
		}
		cur.WriteString(line)
	}
	flush()
	return chunks
}

func stripComments(s string) string {
	var b strings.Builder
	for line := range strings.Lines(s) {
		if !strings.HasPrefix(strings.TrimSpace(line), "--") {
			b.WriteString(line)
		}
	}
	return b.String()
}

// Apply runs script on conn chunk by chunk, each in one simple-protocol
// round trip (so a chunk's statements outside BEGIN … COMMIT each run in
// autocommit only when alone, as the script's steps are).
func Apply(ctx context.Context, conn *pgx.Conn, script string) error {
	for i, c := range Chunks(script) {
		if _, err := conn.PgConn().Exec(ctx, c).ReadAll(); err != nil {
			return fmt.Errorf("chunk %d:\n%s\n: %w", i, c, err)
		}
	}
	return nil
}

// sqlDescribe lists what a schema holds, one line each, comparable
// across databases: columns, constraints, indexes (with validity),
// functions, table options.
const sqlDescribe = `
SELECT 'column ' || c.relname || '.' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod)
	|| CASE WHEN a.attnotnull THEN ' not null' ELSE '' END
	|| coalesce(' default ' || pg_get_expr(d.adbin, d.adrelid), '')
FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
WHERE c.relnamespace = to_regnamespace(current_schema()) AND c.relkind = 'r' AND a.attnum > 0 AND NOT a.attisdropped
UNION ALL
SELECT 'constraint ' || c.relname || '.' || k.conname || ' ' || pg_get_constraintdef(k.oid) || CASE WHEN k.convalidated THEN '' ELSE ' NOT VALIDATED' END
FROM pg_constraint k JOIN pg_class c ON c.oid = k.conrelid
WHERE c.relnamespace = to_regnamespace(current_schema())
UNION ALL
SELECT 'index ' || pg_get_indexdef(i.indexrelid) || CASE WHEN i.indisvalid AND i.indisready THEN '' ELSE ' INVALID' END
FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
WHERE c.relnamespace = to_regnamespace(current_schema())
UNION ALL
SELECT 'function ' || pg_get_functiondef(p.oid)
FROM pg_proc p WHERE p.pronamespace = to_regnamespace(current_schema())
UNION ALL
SELECT 'table ' || c.relname || ' ' || coalesce(array_to_string(c.reloptions, ','), '')
FROM pg_class c WHERE c.relnamespace = to_regnamespace(current_schema()) AND c.relkind = 'r'
UNION ALL
SELECT 'version ' || v::text FROM (SELECT 1) one, LATERAL (
	SELECT %s) AS x(v)
ORDER BY 1`

// Describe returns what the connection's current schema holds, and the
// versions recorded in tables, one line each, sorted. The database's and
// schema's names do not appear, so two databases compare equal.
func Describe(ctx context.Context, conn *pgx.Conn, tables ...string) (string, error) {
	versions := "NULL::text"
	var parts []string
	for _, t := range tables {
		var exists bool
		if err := conn.QueryRow(ctx, "SELECT to_regclass(quote_ident(current_schema()) || '.' || quote_ident($1)) IS NOT NULL", t).Scan(&exists); err != nil {
			return "", err
		}
		if exists {
			parts = append(parts, fmt.Sprintf("(SELECT %s || ':' || string_agg(version::text || ' ' || name, ',' ORDER BY version) FROM %s)",
				quote(t), pgx.Identifier{t}.Sanitize()))
		}
	}
	if len(parts) > 0 {
		versions = strings.Join(parts, " || ' ' || ")
	}
	rows, _ := conn.Query(ctx, fmt.Sprintf(sqlDescribe, versions))
	lines, err := pgx.CollectRows(rows, pgx.RowTo[*string])
	if err != nil {
		return "", err
	}
	var b strings.Builder
	for _, l := range lines {
		if l != nil {
			b.WriteString(*l)
			b.WriteByte('\n')
		}
	}
	return b.String(), nil
}

func quote(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
