package migrate

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// Markers of a script (Runner.Script). Every chunk of a script starts with
// one: a chunk is what a migration tool runs as one unit.
const (
	// MarkBegin starts a version's chunks: "-- idemgate:begin <package>
	// v<N> transaction|no-transaction: <name>".
	MarkBegin = "-- idemgate:begin "
	// MarkStep starts a chunk of a no-transaction version, or the setup:
	// statements run outside any transaction, each on its own (psql's
	// autocommit), in order.
	MarkStep = "-- idemgate:step "
	// MarkSetup starts a package's setup: the schema to migrate and the
	// version table, statements outside any transaction.
	MarkSetup = "-- idemgate:setup "
	// MarkTransaction starts a version that is one transaction, BEGIN to
	// COMMIT: run the chunk as it is.
	MarkTransaction = "-- idemgate:transaction "
)

// Script returns the SQL of every migration, oldest first, as psql -f or
// a migration tool runs it on the connection's current schema: first the
// version table, then each version, recorded in that table as Run records
// it, so that a schema migrated by the script is one Run finds current.
//
// A version of SQL is one transaction (BEGIN … COMMIT). A version of
// Steps is statements to run each on its own outside any transaction
// (CREATE INDEX CONCURRENTLY cannot run in one); a step that reads an
// index back is a DO block that raises an error unless the index is
// valid, so a failed build stops the script rather than leave a schema
// that enforces nothing. Every version first refuses to run when the
// version table records it already.
//
// Steps write their SQL when run in script mode; a Step that is none of
// this package's (DropIndex, DropIfUnusable, CreateIfAbsent,
// RequireUsable, Exec, TxExec) has no SQL form, and Script returns an
// error naming it.
func (r *Runner) Script() (string, error) {
	w := &script{r: r, table: pgx.Identifier{r.VersionTable}.Sanitize()}
	fmt.Fprintf(&w.b, "%s%s: the schema to migrate, and %s, which records the applied versions\n", MarkSetup, r.Package, r.VersionTable)
	w.statement(sqlScriptPin)
	w.statement(sqlScriptTimeouts)
	w.statement(fmt.Sprintf(sqlVersionTable, w.table))
	for _, m := range r.Migrations {
		if err := w.version(m); err != nil {
			return "", fmt.Errorf("%s: migration v%d (%s): %w", r.Package, m.Version, m.Name, err)
		}
	}
	return w.b.String(), nil
}

const (
	// sqlScriptPin is Run's pin of search_path in a statement a script can
	// hold, for the session (is_local false) or, with %s = true, for a
	// transaction. The schema is the connection's current one.
	sqlScriptPin = `DO $$
BEGIN
	IF pg_catalog.current_schema() IS NULL THEN
		RAISE EXCEPTION 'search_path names no existing schema to migrate';
	END IF;
	PERFORM pg_catalog.set_config('search_path', pg_catalog.quote_ident(pg_catalog.current_schema()::pg_catalog.text) OPERATOR(pg_catalog.||) ', pg_temp', false);
END $$`
	sqlScriptTimeouts = `SET statement_timeout = '15min';
SET lock_timeout = 0;
SET default_transaction_isolation = 'read committed'`
	// sqlScriptGuard refuses a version recorded already, then takes Run's
	// advisory lock without waiting (a session waiting for it would hold
	// a snapshot that Run's CREATE INDEX CONCURRENTLY waits for), so that
	// the script and Run never migrate one schema at once. %[1]s is the
	// version table, %[2]d the version, %[3]s the package, %[4]d the lock
	// class, %[5]s pg_try_advisory_xact_lock (a transaction version) or
	// pg_try_advisory_lock (the steps; "record the version" unlocks).
	sqlScriptGuard = `DO $$
BEGIN
	IF EXISTS (SELECT 1 FROM %[1]s WHERE version = %[2]d) THEN
		RAISE EXCEPTION '%[3]s v%[2]d is applied already: run only the versions after the newest applied one';
	END IF;
	IF NOT pg_catalog.%[5]s(%[4]d, pg_catalog.hashtext(pg_catalog.current_schema()::pg_catalog.text)) THEN
		RAISE EXCEPTION 'another migration of %[3]s is running on this schema (idemgate migrate up, or a service''s Migrate): run v%[2]d again once it is done';
	END IF;
END $$`
	sqlScriptUnlock = `SELECT pg_catalog.pg_advisory_unlock(%d, pg_catalog.hashtext(pg_catalog.current_schema()::pg_catalog.text))`
)

// script is the text a Runner's migrations write in script mode.
type script struct {
	r     *Runner
	table string
	b     strings.Builder
}

func (w *script) version(m Migration) (err error) {
	record := fmt.Sprintf("INSERT INTO %s (version, name) VALUES (%d, %s) ON CONFLICT (version) DO NOTHING",
		w.table, m.Version, quoteLiteral(m.Name))
	if m.SQL != "" {
		guard := fmt.Sprintf(sqlScriptGuard, w.table, m.Version, w.r.Package, w.r.LockClass, "pg_try_advisory_xact_lock")
		fmt.Fprintf(&w.b, "\n%s%s v%d transaction: %s\n", MarkBegin, w.r.Package, m.Version, m.Name)
		w.b.WriteString(MarkTransaction + "one transaction, BEGIN to COMMIT\n")
		w.statement("BEGIN")
		w.statement(strings.Replace(sqlScriptPin, "false)", "true)", 1))
		w.statement("SET LOCAL statement_timeout = '15min';\n" + sqlTxLockTimeout)
		w.statement(guard)
		w.statement(strings.TrimSpace(m.SQL))
		w.statement(record)
		w.statement("COMMIT")
		return nil
	}
	fmt.Fprintf(&w.b, "\n%s%s v%d no-transaction: %s\n", MarkBegin, w.r.Package, m.Version, m.Name)
	w.b.WriteString("-- Outside any transaction: run each statement on its own (psql does), in order.\n")
	w.b.WriteString(MarkStep + "set up the session; refuse an applied version; lock out other migrations\n")
	w.statement(sqlScriptPin)
	w.statement(sqlScriptTimeouts)
	w.statement(fmt.Sprintf(sqlScriptGuard, w.table, m.Version, w.r.Package, w.r.LockClass, "pg_try_advisory_lock"))
	for _, st := range m.Steps {
		w.b.WriteString(MarkStep + st.Name + "\n")
		if err := w.step(st); err != nil {
			return err
		}
	}
	w.b.WriteString(MarkStep + "record the version; unlock\n")
	w.statement(record)
	w.statement(fmt.Sprintf(sqlScriptUnlock, w.r.LockClass))
	return nil
}

// step runs st in script mode. A step of another kind would use the nil
// Conn: its panic is its having no SQL form.
func (w *script) step(st Step) (err error) {
	defer func() {
		if recover() != nil {
			err = fmt.Errorf("step %q has no SQL form", st.Name)
		}
	}()
	return st.Run(context.Background(), Session{script: w})
}

// statement writes one statement and its terminator.
func (w *script) statement(sql string) {
	w.b.WriteString(strings.TrimRight(strings.TrimSpace(sql), ";"))
	w.b.WriteString(";\n")
}

// transaction writes sql as TxExec runs it.
func (w *script) transaction(sql string) {
	w.statement("BEGIN")
	w.statement(sqlTxLockTimeout)
	w.statement(sql)
	w.statement("COMMIT")
}

// createIfAbsent writes create, a CREATE [UNIQUE] INDEX CONCURRENTLY,
// with IF NOT EXISTS: what CreateIfAbsent checks first. An invalid
// leftover of a killed build is refused before it (refuseUnusable) and
// after it (requireUsable).
func (w *script) createIfAbsent(create string) error {
	const c = "CONCURRENTLY "
	if !strings.Contains(create, c) || strings.Contains(create, "IF NOT EXISTS") {
		return fmt.Errorf("cannot add IF NOT EXISTS to %q", create)
	}
	w.statement(strings.Replace(create, c, c+"IF NOT EXISTS ", 1))
	return nil
}

// refuseUnusable writes DropIfUnusable's check. The script cannot drop
// conditionally (DROP INDEX CONCURRENTLY cannot run in a DO block), so it
// stops and says what to run.
func (w *script) refuseUnusable(table, name string) {
	fmt.Fprintf(&w.b, `DO $$
BEGIN
	IF EXISTS (%s) THEN
		RAISE EXCEPTION 'index %% is invalid, left by a killed build: run DROP INDEX CONCURRENTLY %%; then run this version again',
			%s, %s;
	END IF;
END $$;
`, indexStateSQL(table, name, "NOT (i.indisvalid AND i.indisready)"), quoteLiteral(name),
		quoteLiteral(pgx.Identifier{name}.Sanitize()))
}

// requireUsable writes RequireUsable's read-back: a DO block that raises
// unless the index is valid, ready, unique as asked, and on exactly
// columns.
func (w *script) requireUsable(table, name string, unique bool, columns []string) {
	cols := make([]string, len(columns))
	for i, c := range columns {
		cols[i] = quoteLiteral(c)
	}
	fmt.Fprintf(&w.b, `DO $$
BEGIN
	IF NOT EXISTS (%s) THEN
		RAISE EXCEPTION 'index %% is not a valid index (unique=%v) on %% after its build', %s, %s;
	END IF;
END $$;
`, indexStateSQL(table, name, fmt.Sprintf("i.indisvalid AND i.indisready AND i.indisunique = %v\n\t\tAND pg_catalog.array_agg(a.attname::pg_catalog.text ORDER BY k.ord) OPERATOR(pg_catalog.=) ARRAY[%s]::pg_catalog.text[]", unique, strings.Join(cols, ", "))),
		unique, quoteLiteral(name), quoteLiteral(strings.Join(columns, ", ")))
}

// indexStateSQL selects index name of table in the current schema when
// cond (on sqlIndexState's i, and its aggregate) holds.
func indexStateSQL(table, name, cond string) string {
	return fmt.Sprintf(`SELECT FROM pg_catalog.pg_index i
		JOIN pg_catalog.pg_class c ON c.oid = i.indexrelid
		CROSS JOIN LATERAL pg_catalog.unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)
		JOIN pg_catalog.pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
		WHERE i.indrelid = pg_catalog.to_regclass(pg_catalog.format('%%I.%%I', pg_catalog.current_schema()::pg_catalog.text, %s::pg_catalog.text)) AND c.relname = %s
			AND c.relnamespace = (SELECT oid FROM pg_catalog.pg_namespace WHERE nspname = pg_catalog.current_schema())
		GROUP BY i.indisvalid, i.indisready, i.indisunique
		HAVING %s`, quoteLiteral(table), quoteLiteral(name), cond)
}

// quoteLiteral quotes s as an SQL string literal (standard_conforming_strings).
func quoteLiteral(s string) string {
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
}

// FilterScript returns script without the versions keep refuses; each
// package's setup stays. keep sees the package and version of each
// MarkBegin line.
func FilterScript(script string, keep func(pkg string, version int) bool) string {
	var b strings.Builder
	skipping := false
	for line := range strings.Lines(script) {
		if rest, ok := strings.CutPrefix(line, MarkBegin); ok {
			var pkg string
			var v int
			if _, err := fmt.Sscanf(rest, "%s v%d", &pkg, &v); err == nil {
				skipping = !keep(pkg, v)
			}
		} else if strings.HasPrefix(line, MarkSetup) {
			skipping = false
		}
		if !skipping {
			b.WriteString(line)
		}
	}
	return b.String()
}
