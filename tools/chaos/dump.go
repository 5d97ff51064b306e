package main

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// upstreamCalls reads the stand-in upstream's call log, when the example
// keeps one (idemgate_example_upstream_calls: a row per request received,
// written before the generator runs): every generator call at its start,
// durable across kills. When the log has a caller column (the worker's
// name, WORKER_NAME, which the tool sets to the process's name), each call
// names its process; otherwise Proc is "" (any worker). found is false
// when there is no such table.
func upstreamCalls(ctx context.Context, sys *system) (calls []GenCall, found bool, err error) {
	conn, err := pgx.Connect(ctx, sys.pg.DSN("postgres"))
	if err != nil {
		return nil, false, fmt.Errorf("chaos: connect to postgres: %w", err)
	}
	defer conn.Close(context.Background())
	if err := conn.QueryRow(ctx, `SELECT to_regclass('idemgate_example_upstream_calls') IS NOT NULL`).Scan(&found); err != nil || !found {
		return nil, false, err
	}
	var hasCaller bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT FROM information_schema.columns
	WHERE table_name = 'idemgate_example_upstream_calls' AND column_name = 'caller' AND table_schema = current_schema())`).Scan(&hasCaller); err != nil {
		return nil, false, fmt.Errorf("chaos: read the upstream's columns: %w", err)
	}
	caller := `''`
	if hasCaller {
		caller = `COALESCE(caller, '')`
	}
	rows, err := conn.Query(ctx, `SELECT ref, outcome, sent_at, done_at, `+caller+` FROM idemgate_example_upstream_calls ORDER BY id`)
	if err != nil {
		return nil, false, fmt.Errorf("chaos: read the upstream's calls: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		g := GenCall{Phase: "start"}
		var name string
		if err := rows.Scan(&g.Task, &g.Result, &g.At, &g.Done, &name); err != nil {
			return nil, false, fmt.Errorf("chaos: read an upstream call: %w", err)
		}
		// Only a name the tool gave counts: any other could match no
		// fault and condemn a call that a fault did cut off.
		if p := sys.byName(name); p != nil && p.kind == workerProc {
			g.Proc = name
		}
		calls = append(calls, g)
	}
	return calls, true, rows.Err()
}

// dumpTable records every task row, with its results checked for PNGs.
func dumpTable(ctx context.Context, sys *system, rec *recorder) error {
	conn, err := pgx.Connect(ctx, sys.pg.DSN("postgres"))
	if err != nil {
		return fmt.Errorf("chaos: connect to postgres: %w", err)
	}
	defer conn.Close(context.Background())
	rows, err := conn.Query(ctx, `SELECT id::text, tenant, owner, kind, idempotency_key, COALESCE(params, 'null'::jsonb),
	state, attempt, results, error, created_at, recoveries FROM idemgate_tasks ORDER BY created_at`)
	if err != nil {
		return fmt.Errorf("chaos: read tasks: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var w Row
		var params, results []byte
		if err := rows.Scan(&w.ID, &w.Tenant, &w.Owner, &w.Kind, &w.IdemKey, &params, &w.State, &w.Attempt,
			&results, &w.Error, &w.CreatedAt, &w.Recoveries); err != nil {
			return fmt.Errorf("chaos: read task: %w", err)
		}
		var p Params
		_ = json.Unmarshal(params, &p)
		w.ParamsFP = p.FP()
		var items []json.RawMessage
		_ = json.Unmarshal(results, &items)
		w.Results = len(items)
		for _, it := range items {
			var u string
			if json.Unmarshal(it, &u) == nil && isPNGDataURL(u) {
				w.PNGs++
			}
		}
		rec.row(w)
	}
	return rows.Err()
}

// dumpExports records every row of the export route's ledger, each run
// named by the API node that served it. The route creates the ledger on
// its first export: no table, no runs.
func dumpExports(ctx context.Context, sys *system, rec *recorder) error {
	conn, err := pgx.Connect(ctx, sys.pg.DSN("postgres"))
	if err != nil {
		return fmt.Errorf("chaos: connect to postgres: %w", err)
	}
	defer conn.Close(context.Background())
	var found bool
	if err := conn.QueryRow(ctx, `SELECT to_regclass('idemgate_example_exports') IS NOT NULL`).Scan(&found); err != nil || !found {
		return err
	}
	procs := map[string]string{}
	for _, p := range sys.api() {
		procs[p.addr] = p.name
	}
	// The id the API answers with: the row's export_id where the ledger
	// has one (a random id, so that answers count nothing), else its id.
	var hasExportID bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT FROM information_schema.columns
	WHERE table_name = 'idemgate_example_exports' AND column_name = 'export_id' AND table_schema = current_schema())`).Scan(&hasExportID); err != nil {
		return fmt.Errorf("chaos: read the ledger's columns: %w", err)
	}
	id := "id"
	if hasExportID {
		id = "coalesce(export_id, id)"
	}
	rows, err := conn.Query(ctx, `SELECT `+id+`, tenant, owner, idempotency_key, task_id::text, node, started_at, created_at
	FROM idemgate_example_exports ORDER BY id`)
	if err != nil {
		return fmt.Errorf("chaos: read the export ledger: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var e Export
		var node string
		if err := rows.Scan(&e.ID, &e.Tenant, &e.Owner, &e.IdemKey, &e.TaskID, &node, &e.Started, &e.Created); err != nil {
			return fmt.Errorf("chaos: read an export: %w", err)
		}
		e.Proc = procs[node]
		if e.Proc == "" {
			e.Proc = node
		}
		rec.export(e)
	}
	return rows.Err()
}
