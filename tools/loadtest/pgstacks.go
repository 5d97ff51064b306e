package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/labstack/echo/v4"

	"github.com/idemgate/idemgate/internal/pgtrace"
	"github.com/idemgate/idemgate/pgrecords"
	"github.com/idemgate/idemgate/pgstore"
)

const (
	// pgFloorName is the Postgres floor: the fewest statements on a records
	// table of pgrecords' shape (INSERT … ON CONFLICT DO NOTHING, then
	// UPDATE by primary key, for a miss; one SELECT by primary key for a
	// replay or a conflict); idemgatePGName is the middleware on pgrecords.
	pgFloorName    = "pg-floor"
	idemgatePGName = "idemgate-pg"
	// idemgatePGAtomicName is idemgate-pg with Config.Atomic: the same
	// handler write (the task's INSERT, by pgstore.SubmitTx) commits in one
	// transaction with the stored answer. Its ratio is to idemgate-pg,
	// where the same write autocommits.
	idemgatePGAtomicName = "idemgate-pg-atomic"
	// recordsTable is pgrecords' table; pgFloorTable is the floor's copy
	// of its shape (columns, primary key, storage parameters).
	recordsTable = "idemgate_records"
	pgFloorTable = "idemgate_records_floor"
	// expectHeader tells the pg-floor that the client sends a new key
	// ("new"), so that its first statement is the claim, not the read.
	expectHeader = "X-Loadtest-Expect"
)

// newIdemgatePG serves echo + the idempotency middleware on a pgrecords
// Store (a records pool of its own, its round trips counted) + the same
// handler as the idemgate stack; with atomic, on an Atomic route whose
// task goes in with the stored answer (the records pool is then the tasks'
// too: one transaction holds both). With -pg-write ledger the handler
// writes a ledger row on the records pool instead (in the Atomic route's
// transaction, or in autocommit), so both stacks' pools carry the same
// statements but for BEGIN and COMMIT.
func newIdemgatePG(ctx context.Context, e *env, o options, atomic bool) (*stack, error) {
	st := &stack{name: idemgatePGName, floor: pgFloorName, table: tasksTable, keyCol: tasksKeyCol,
		rt: &roundTrips{}, pgrt: &pgtrace.RoundTrips{}, execs: newExecutions()}
	if atomic {
		st.name, st.floor = idemgatePGAtomicName, idemgatePGName
	}
	pool, err := e.newPool(ctx, o.pgConns, st.pgrt)
	if err != nil {
		return nil, err
	}
	h := &idemHandler{execs: st.execs}
	switch {
	case o.pgWrite == pgWriteLedger:
		h.ledger, st.table, st.keyCol = pool, ledgerTable, ledgerKeyCol
	case atomic:
		if h.tasks, err = pgstore.New(ctx, pool); err != nil {
			return nil, fmt.Errorf("pgstore: %w", err)
		}
	default:
		if h.tasks, err = e.taskStore(ctx, o); err != nil {
			return nil, err
		}
	}
	records, err := pgrecords.New(ctx, pool)
	if err != nil {
		return nil, fmt.Errorf("pgrecords: %w", err)
	}
	if err := records.Migrate(ctx); err != nil {
		return nil, fmt.Errorf("pgrecords migrate: %w", err)
	}
	if err := serveMiddleware(st, records, h, atomic); err != nil {
		return nil, err
	}
	return st, nil
}

// The ledger of -pg-write ledger: one row per request that ran, keyed by
// its idempotency key (as the records are), with the tenant to count a
// scenario's rows by. createLedgerTable makes it before the stacks start,
// bench.cleanup drops it.
const (
	ledgerTable     = "loadtest_ledger"
	ledgerKeyCol    = "key"
	sqlCreateLedger = `CREATE TABLE ` + ledgerTable + ` (
	key        text        NOT NULL PRIMARY KEY,
	tenant     text        NOT NULL,
	id         uuid        NOT NULL,
	amount     bigint      NOT NULL,
	created_at timestamptz NOT NULL DEFAULT now()
)`
	sqlLedgerInsert = `INSERT INTO ` + ledgerTable + ` (key, tenant, id, amount) VALUES ($1, $2, $3, $4)`
)

// createLedgerTable (re)creates the ledger table.
func createLedgerTable(ctx context.Context, db *pgxpool.Pool) error {
	if _, err := db.Exec(ctx, `DROP TABLE IF EXISTS `+ledgerTable); err != nil {
		return fmt.Errorf("drop %s: %w", ledgerTable, err)
	}
	if _, err := db.Exec(ctx, sqlCreateLedger); err != nil {
		return fmt.Errorf("create %s: %w", ledgerTable, err)
	}
	return nil
}

// The pg-floor's statements, on pgrecords' columns: ident is the owner,
// kind and fingerprint in one value, response the status, header and body
// in one (see floorIdent and floorResponse), so that a row is as wide as
// idemgate-pg's. The floor neither fences by token nor looks at expiry.
const (
	sqlPGFloorClaim = `INSERT INTO ` + pgFloorTable + ` (key, token, finished, expires_at, ident)
VALUES ($1, $2, false, now() + $3 * interval '1 microsecond', $4) ON CONFLICT DO NOTHING`
	sqlPGFloorRead     = `SELECT finished, ident, response FROM ` + pgFloorTable + ` WHERE key = $1`
	sqlPGFloorComplete = `UPDATE ` + pgFloorTable + ` SET finished = true, expires_at = now() + $2 * interval '1 microsecond',
	response = $3 WHERE key = $1`
	sqlPGFloorRelease = `DELETE FROM ` + pgFloorTable + ` WHERE key = $1`
)

// floorIdent is laid out as pgrecords' ident (uvarint-length-prefixed
// owner and kind, then the fingerprint), so it is as long.
func floorIdent(owner, kind, fp string) []byte {
	b := binary.AppendUvarint(nil, uint64(len(owner)))
	b = append(b, owner...)
	b = binary.AppendUvarint(b, uint64(len(kind)))
	b = append(b, kind...)
	return append(b, fp...)
}

// floorResponse is a 202's status, the headers the middleware would store
// (Location first, so a replay finds it at once) and the body: within a
// few bytes of pgrecords' response column for the same answer.
func floorResponse(location string, body []byte) []byte {
	hdr := "Location: " + location + "\r\nContent-Type: application/json\r\nRetry-After: 1"
	b := binary.BigEndian.AppendUint16(nil, http.StatusAccepted)
	b = binary.AppendUvarint(b, uint64(len(hdr)))
	b = append(b, hdr...)
	return append(b, body...)
}

// parseFloorResponse returns what floorResponse stored.
func parseFloorResponse(b []byte) (status int, location string, body []byte, err error) {
	if len(b) < 2 {
		return 0, "", nil, errors.New("short response")
	}
	n, k := binary.Uvarint(b[2:])
	if k <= 0 || n > uint64(len(b)-2-k) {
		return 0, "", nil, errors.New("bad header length")
	}
	hdr := string(b[2+k : 2+k+int(n)])
	location, _, _ = strings.Cut(strings.TrimPrefix(hdr, "Location: "), "\r\n")
	return int(binary.BigEndian.Uint16(b)), location, b[2+k+int(n):], nil
}

// createPGFloorTable (re)creates the floor's table as a copy of
// pgrecords' table: its columns, primary key and storage parameters
// (fillfactor, autovacuum settings), which LIKE does not copy.
func createPGFloorTable(ctx context.Context, db *pgxpool.Pool) error {
	var opts []string
	if err := db.QueryRow(ctx, `SELECT coalesce(reloptions, '{}') FROM pg_class WHERE oid = $1::regclass`,
		recordsTable).Scan(&opts); err != nil {
		return fmt.Errorf("read %s storage parameters: %w", recordsTable, err)
	}
	create := `CREATE TABLE ` + pgFloorTable + ` (LIKE ` + recordsTable + ` INCLUDING ALL)`
	if len(opts) > 0 {
		create += ` WITH (` + strings.Join(opts, ", ") + `)`
	}
	if _, err := db.Exec(ctx, `DROP TABLE IF EXISTS `+pgFloorTable); err != nil {
		return fmt.Errorf("drop %s: %w", pgFloorTable, err)
	}
	if _, err := db.Exec(ctx, create); err != nil {
		return fmt.Errorf("create %s: %w", pgFloorTable, err)
	}
	return nil
}

// newPGFloor serves the Postgres floor: a bare echo handler that does by
// hand the fewest statements a Postgres records layer needs, on a records
// pool of its own (as large as idemgate-pg's, its round trips counted),
// around the same task work as every other stack.
//
// What makes it a floor rather than a design: the load tool tells it
// (expectHeader) whether the key is new, an oracle no real layer has. So a
// miss costs exactly the INSERT … ON CONFLICT DO NOTHING that claims the
// key and the UPDATE that stores the response, and a replay or a conflict
// exactly one SELECT by primary key, the fingerprint compared in Go. It
// stays correct when the oracle is wrong (a lost INSERT reads the row; a
// SELECT that finds nothing claims), so the dup scenario works too.
func newPGFloor(ctx context.Context, e *env, o options) (*stack, error) {
	tasks, err := e.taskStore(ctx, o)
	if err != nil {
		return nil, err
	}
	st := &stack{name: pgFloorName, table: tasksTable, keyCol: tasksKeyCol, rt: &roundTrips{}, pgrt: &pgtrace.RoundTrips{}, execs: newExecutions()}
	pool, err := e.newPool(ctx, o.pgConns, st.pgrt)
	if err != nil {
		return nil, err
	}
	f := &pgFloor{pool: pool, tasks: tasks, execs: st.execs}
	ec := newEcho()
	ec.POST("/v1/images", f.submit)
	if st.url, st.close, err = serve(ec); err != nil {
		return nil, err
	}
	return st, nil
}

type pgFloor struct {
	pool  *pgxpool.Pool
	tasks *pgstore.Store
	execs *executions
}

func (f *pgFloor) submit(c echo.Context) error {
	r := c.Request()
	ctx := r.Context()
	tenant, user, reqID, body, err := floorRequest(c)
	if err != nil {
		return err
	}
	fpSum := sha256.Sum256(body)
	fp := "v1:" + hex.EncodeToString(fpSum[:])
	// A key as long as keyspace's (idem:<tenant>:<kind>:<hex sha256(user)>:
	// <hex sha256(request)>), so that rows and index entries are as wide
	// as idemgate-pg's.
	userSum, reqSum := sha256.Sum256([]byte(user)), sha256.Sum256([]byte(reqID))
	owner := hex.EncodeToString(userSum[:])
	key := "idem:" + tenant + ":images:" + owner + ":" + hex.EncodeToString(reqSum[:])
	ident := floorIdent(owner, "images", fp)

	if r.Header.Get(expectHeader) != "new" {
		if answered, err := f.answer(c, key, ident); answered || err != nil {
			return err
		}
	}
	var token [16]byte
	rand.Read(token[:])
	tag, err := f.pool.Exec(ctx, sqlPGFloorClaim, key, token, lease.Microseconds(), ident)
	if err != nil {
		return echo.NewHTTPError(http.StatusServiceUnavailable, "store unavailable")
	}
	if tag.RowsAffected() == 0 {
		if answered, err := f.answer(c, key, ident); answered || err != nil {
			return err
		}
		// Released between the two statements: the client may retry.
		c.Response().Header().Set("Retry-After", "1")
		return echo.NewHTTPError(http.StatusConflict, "request in progress")
	}

	f.execs.ran(key)
	release := func() { f.pool.Exec(context.WithoutCancel(ctx), sqlPGFloorRelease, key) }
	var in imageRequest
	err = json.Unmarshal(body, &in)
	if err == nil {
		err = in.validate()
	}
	if err != nil {
		release()
		return echo.NewHTTPError(http.StatusBadRequest, err.Error())
	}
	slowdown(r)
	task, err := f.tasks.Submit(ctx, floorTask(tenant, owner, key, fp, body))
	if err != nil {
		release()
		if errors.Is(err, pgstore.ErrConflict) {
			return echo.NewHTTPError(http.StatusConflict, "key reused with other parameters")
		}
		return err
	}
	if !task.Duplicate {
		f.execs.created.Add(1)
	}
	out, _ := json.Marshal(accepted{TaskID: task.ID, Status: string(task.State), PollAfterMS: 1000})
	location := "/v1/tasks/" + task.ID
	if _, err := f.pool.Exec(context.WithoutCancel(ctx), sqlPGFloorComplete, key, retention.Microseconds(),
		floorResponse(location, out)); err != nil {
		return echo.NewHTTPError(http.StatusServiceUnavailable, "store unavailable")
	}
	c.Response().Header().Set("Location", location)
	c.Response().Header().Set("Retry-After", "1")
	return c.JSONBlob(http.StatusAccepted, out)
}

// answer reads the key's record with one SELECT and answers from it: a
// replay, 409 for other parameters (its ident differs: owner, kind or
// fingerprint) or 409 while in progress. It reports false, having written
// nothing, when there is no record.
func (f *pgFloor) answer(c echo.Context, key string, ident []byte) (bool, error) {
	var (
		finished       bool
		held, response []byte
	)
	err := f.pool.QueryRow(c.Request().Context(), sqlPGFloorRead, key).Scan(&finished, &held, &response)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return false, nil
	case err != nil:
		return true, echo.NewHTTPError(http.StatusServiceUnavailable, "store unavailable")
	case !bytes.Equal(held, ident):
		return true, echo.NewHTTPError(http.StatusConflict, "key reused with other parameters")
	case !finished:
		c.Response().Header().Set("Retry-After", "1")
		return true, echo.NewHTTPError(http.StatusConflict, "request in progress")
	}
	status, location, body, err := parseFloorResponse(response)
	if err != nil {
		return true, fmt.Errorf("pg-floor: stored response: %w", err)
	}
	c.Response().Header().Set("Location", location)
	c.Response().Header().Set("Retry-After", "1")
	c.Response().Header().Set("Idempotent-Replayed", "true")
	return true, c.Blob(status, echo.MIMEApplicationJSON, body)
}
