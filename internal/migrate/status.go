package migrate

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// VersionState is one version as a schema has it.
type VersionState struct {
	Version int    `json:"version"`
	Name    string `json:"name"`
	// Applied reports that the version table records the version.
	Applied bool `json:"applied"`
	// AppliedAt is when it was recorded; zero when not applied.
	AppliedAt time.Time `json:"applied_at,omitzero"`
	// Unknown reports a version that the schema records and this build
	// does not know: a newer build migrated the schema.
	Unknown bool `json:"unknown,omitempty"`
}

// ErrNoSchema reports that the connection's search_path names no
// existing schema.
var ErrNoSchema = errors.New("search_path names no existing schema")

const (
	sqlCurrentSchema = `SELECT pg_catalog.current_schema(), pg_catalog.to_regclass(pg_catalog.format('%I.%I', pg_catalog.current_schema(), $1::pg_catalog.text)) IS NOT NULL`
	// %s is the version table's quoted name.
	sqlVersionsApplied = `SELECT version, name, applied_at FROM %s ORDER BY version`
)

// Status reports, for each version, whether the pool's current schema
// has it, and returns that schema's name. It only reads: a schema that
// was never migrated has no version applied. A version the schema records
// and the Runner does not know comes last, with Unknown set.
func (r *Runner) Status(ctx context.Context, pool *pgxpool.Pool) (schema string, _ []VersionState, _ error) {
	var name *string
	var hasTable bool
	if err := pool.QueryRow(ctx, sqlCurrentSchema, r.VersionTable).Scan(&name, &hasTable); err != nil {
		return "", nil, r.errorf("status: %w", err)
	}
	if name == nil {
		return "", nil, r.errorf("status: %w", ErrNoSchema)
	}
	out := make([]VersionState, len(r.Migrations))
	at := make(map[int]int, len(r.Migrations))
	for i, m := range r.Migrations {
		out[i] = VersionState{Version: m.Version, Name: m.Name}
		at[m.Version] = i
	}
	if !hasTable {
		return *name, out, nil
	}
	rows, _ := pool.Query(ctx, fmt.Sprintf(sqlVersionsApplied, pgx.Identifier{*name, r.VersionTable}.Sanitize()))
	applied, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (VersionState, error) {
		v := VersionState{Applied: true}
		err := row.Scan(&v.Version, &v.Name, &v.AppliedAt)
		return v, err
	})
	if err != nil {
		return "", nil, r.errorf("status: %w", err)
	}
	for _, v := range applied {
		if i, ok := at[v.Version]; ok {
			out[i].Applied, out[i].AppliedAt = true, v.AppliedAt
			continue
		}
		v.Unknown = true
		out = append(out, v)
	}
	return *name, out, nil
}

// Pending returns the versions of states that are not applied.
func Pending(states []VersionState) []VersionState {
	var p []VersionState
	for _, v := range states {
		if !v.Applied {
			p = append(p, v)
		}
	}
	return p
}
