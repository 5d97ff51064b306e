package pgstore

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// listBatch bounds the lines one listing pass reads (listUnlisted): at
// most maxListingBuffersALine buffers each, whatever their backlogs.
const listBatch = 256

// listUnlisted lists in idemgate_waiting_tenants the lines with a placed
// waiting task that it lacks, reading up to listBatch lines with waiting
// tasks after the last line it read (from the first again once it reached
// the end), and returns how many it listed. The triggers list every line
// a statement writes, except when they do not fire: a task written with
// session_replication_role = replica (a data-only restore, a promoted
// logical replica) or with the table's triggers disabled. A claim that
// walks the listed lines past capped tenants would never find such a
// task; a full cycle over L lines takes L/listBatch + 1 passes, one at
// each sweep (sweepEvery).
func (r *rescuer) listUnlisted(ctx context.Context) (int64, error) {
	rows, _ := r.pool.Query(ctx, sqlUnlistedLines, pgx.NamedArgs{"kind": r.listAfter.Kind,
		"priority": r.listAfter.Priority, "tenant": r.listAfter.Tenant, "limit": listBatch})
	type line struct {
		waitingLine
		Unlisted bool
	}
	lines, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (line, error) {
		var l line
		err := row.Scan(&l.Kind, &l.Priority, &l.Tenant, &l.Unlisted)
		return l, err
	})
	if err != nil {
		return 0, interpretError("read unlisted lines", err)
	}
	var listed int64
	for _, l := range lines {
		if !l.Unlisted {
			continue
		}
		tag, err := r.pool.Exec(ctx, sqlListUnlisted, pgx.NamedArgs{"kind": l.Kind, "priority": l.Priority, "tenant": l.Tenant})
		if err != nil {
			return listed, interpretError("list unlisted line", err)
		}
		listed += tag.RowsAffected()
	}
	r.listAfter = waitingLine{}
	if len(lines) == listBatch {
		r.listAfter = lines[len(lines)-1].waitingLine
	}
	return listed, nil
}
