package pgstore

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// txExec is a migration step of one statement run in a transaction of
// its own that gives up after waiting 5s for its table lock, so that a
// catalog-only ALTER TABLE does not queue the table's readers and
// writers behind a long transaction. The statement must be safe to run
// again (IF NOT EXISTS).
func txExec(sql string) func(context.Context, migrator) error {
	return func(ctx context.Context, m migrator) error {
		return pgx.BeginFunc(ctx, m.conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, sqlTxLockTimeout); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, sql)
			return err
		})
	}
}
