package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/labstack/echo/v4"

	"github.com/idemgate/idemgate/middleware"
	"github.com/idemgate/idemgate/pgrecords"
	"github.com/idemgate/idemgate/pgstore"
)

// kindExport is the idempotency kind of POST /v1/tasks/{id}/export.
const kindExport = "export"

// An export is a billed action whose only protection against running
// twice is the idempotency layer: each run records a charge in the ledger
// (idemgate_example_exports) and answers with a print-ready contact sheet
// of the task's images, hundreds of KiB. Once started, a run finishes and
// records its charge even when its client leaves, as real export handlers
// do; the client's retry under the same key must then get the stored
// answer, not a second charge.
const (
	// exportRenderTime is how long the stand-in print renderer takes, as
	// GEN_TIME is for the generator: long enough that a client with a
	// short timeout gives up mid-run.
	exportRenderTime = 300 * time.Millisecond
	// exportBudget bounds a run that outlived its client: a dead database
	// must not hold it for ever.
	exportBudget = 10 * time.Second
	// Contact sheet geometry: two cells per row. Sheets are stored without
	// compression (print-ready): one row is 384×192 RGB, about 220 KiB,
	// two rows about 440 KiB; as a base64 data URL both stay under the
	// middleware's 1 MiB MaxResponseBytes, so the answer is stored.
	sheetCell = 192
	sheetCols = 2
)

// exportSchema creates the export ledger, once per database (serialized,
// so that processes starting together agree).
const exportSchema = `SELECT pg_advisory_xact_lock(8192, 2);
CREATE TABLE IF NOT EXISTS idemgate_example_exports (
	id              bigserial   PRIMARY KEY,
	tenant          text        NOT NULL, -- the keyspace tenant segment of the caller
	owner           text        NOT NULL, -- the keyspace owner digest of the caller
	idempotency_key text        NOT NULL, -- the request's task key (kind export): one per business action
	task_id         uuid        NOT NULL,
	node            text        NOT NULL, -- the local address of the API node that ran it
	bytes           int         NOT NULL, -- size of the sheet
	started_at      timestamptz NOT NULL, -- when the run began
	created_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS idemgate_example_exports_key ON idemgate_example_exports (tenant, owner, idempotency_key);
-- What the API answers as export_id: random, so that it counts nothing
-- (id counts every tenant's exports). NULL on rows from before it.
ALTER TABLE idemgate_example_exports ADD COLUMN IF NOT EXISTS export_id bigint;
CREATE UNIQUE INDEX IF NOT EXISTS idemgate_example_exports_export_id ON idemgate_example_exports (tenant, export_id)`

// exporter serves POST /v1/tasks/{id}/export.
type exporter struct {
	store  *pgstore.Store
	pool   *pgxpool.Pool
	logger *slog.Logger
	render time.Duration // the stand-in renderer's time
	now    func() time.Time

	mu    sync.Mutex
	ready bool // the ledger exists
}

// newExporter returns the export route of a.
func newExporter(a *api) *exporter {
	render := exportRenderTime
	if a.exportTime > 0 {
		render = a.exportTime
	}
	return &exporter{store: a.store, pool: a.pool, logger: a.logger, render: render, now: time.Now}
}

// prepare creates the ledger on first use; a failure is retried by the
// next export. The example's other tables are made by Migrate; the ledger
// belongs to this route alone.
func (e *exporter) prepare(ctx context.Context) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.ready {
		return nil
	}
	err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, exportSchema)
		return err
	})
	if err != nil {
		return fmt.Errorf("export: create the ledger: %w", err)
	}
	e.ready = true
	return nil
}

// exportView is the body of a 200 answer to an export.
type exportView struct {
	ExportID int64  `json:"export_id"` // random: see newExportID
	TaskID   string `json:"task_id"`
	Images   int    `json:"images"`
	Bytes    int    `json:"bytes"`
	Sheet    string `json:"sheet"` // data:image/png;base64,…
}

// export renders the caller's succeeded task as a contact sheet, records
// the charge and answers with the sheet. It does not stop when its client
// leaves: the middleware stores the complete answer for the retry.
func (e *exporter) export(c echo.Context) error {
	started := e.now()
	tenant, ownerID, err := owner(c)
	if err != nil {
		return err
	}
	req, ok := middleware.FromContext(c)
	if !ok {
		return errors.New("export: no idempotency key in context (middleware missing)")
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(c.Request().Context()), exportBudget)
	defer cancel()
	t, err := e.store.Get(ctx, tenant, ownerID, c.Param("id"))
	if errors.Is(err, pgstore.ErrNotFound) {
		return errTaskNotFound()
	}
	if err != nil {
		return e.unavailable(c, "read the task", err)
	}
	v, err := viewOf(t)
	if err != nil {
		return err
	}
	if v.Status != string(pgstore.StateSucceeded) || len(v.Images) == 0 {
		// 409 is not stored: once the task succeeds, the same key exports it.
		return &problem{Status: http.StatusConflict, Code: "not_exportable",
			Detail: "only a task that succeeded with images can be exported; this one is " + v.Status}
	}
	sheet, err := contactSheet(v.Images)
	if err != nil {
		return fmt.Errorf("export task %s: %w", t.ID, err)
	}
	sleepFor(ctx, e.render)
	if err := e.prepare(ctx); err != nil {
		return e.unavailable(c, "prepare the ledger", err)
	}
	// On an Atomic route (STORE=postgres) the charge commits with the
	// stored answer: a retry finds one or the other, never a second charge.
	var db interface {
		QueryRow(context.Context, string, ...any) pgx.Row
	} = e.pool
	if tx, ok := pgrecords.TxFromContext(c.Request().Context()); ok {
		db = tx
	}
	var id int64
	err = db.QueryRow(ctx, `INSERT INTO idemgate_example_exports
		(tenant, owner, idempotency_key, task_id, node, bytes, started_at, export_id)
		VALUES (@tenant, @owner, @key, @task::uuid, @node, @bytes, @started, @export_id) RETURNING export_id`,
		pgx.NamedArgs{"tenant": tenant, "owner": ownerID, "key": req.Key.Task(), "task": t.ID,
			"node": localAddr(c.Request()), "bytes": len(sheet), "started": started, "export_id": newExportID()}).Scan(&id)
	if err != nil {
		return e.unavailable(c, "record the export", err)
	}
	return c.JSON(http.StatusOK, exportView{ExportID: id, TaskID: t.ID, Images: len(v.Images), Bytes: len(sheet),
		Sheet: "data:image/png;base64," + base64.StdEncoding.EncodeToString(sheet)})
}

// newExportID returns an export's id: random in [1, 2^53], so that it is
// exact as a JSON number in JavaScript too, and tells a tenant nothing of
// other tenants' exports, as a shared sequence would. Two exports of a
// tenant meet on one id once in about 2^26; the unique index then refuses
// the second, answered 503, and its retry draws again.
func newExportID() int64 { return rand.Int64N(1<<53) + 1 }

// unavailable answers 503: the middleware does not store it, so the
// client's retry under the same key runs the export again.
func (e *exporter) unavailable(c echo.Context, what string, err error) error {
	e.logger.Error("export failed", "step", what, "err", err)
	c.Response().Header().Set("Retry-After", "1")
	return &problem{Status: http.StatusServiceUnavailable, Code: "task_store_unavailable",
		Detail: "The task store is unavailable; retry with the same Idempotency-Key."}
}

// localAddr names the API node that serves r: its listening address.
func localAddr(r *http.Request) string {
	if a, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok {
		return a.String()
	}
	return ""
}

// contactSheet lays PNG data URLs out on a grid of sheetCols cells of
// sheetCell pixels, each image scaled to fit its cell on white, and
// encodes the sheet as an uncompressed PNG.
func contactSheet(urls []string) ([]byte, error) {
	rows := (len(urls) + sheetCols - 1) / sheetCols
	sheet := image.NewRGBA(image.Rect(0, 0, sheetCols*sheetCell, rows*sheetCell))
	draw.Draw(sheet, sheet.Bounds(), image.NewUniform(color.White), image.Point{}, draw.Src)
	for i, u := range urls {
		b64, ok := strings.CutPrefix(u, "data:image/png;base64,")
		if !ok {
			return nil, fmt.Errorf("contact sheet: image %d is not a PNG data URL", i)
		}
		raw, err := base64.StdEncoding.DecodeString(b64)
		if err != nil {
			return nil, fmt.Errorf("contact sheet: image %d: %w", i, err)
		}
		img, err := png.Decode(bytes.NewReader(raw))
		if err != nil {
			return nil, fmt.Errorf("contact sheet: image %d: %w", i, err)
		}
		cell := image.Rect(0, 0, sheetCell, sheetCell).Add(image.Pt(i%sheetCols*sheetCell, i/sheetCols*sheetCell))
		fit(sheet, cell, img)
	}
	var buf bytes.Buffer
	if err := (&png.Encoder{CompressionLevel: png.NoCompression}).Encode(&buf, sheet); err != nil {
		return nil, fmt.Errorf("contact sheet: %w", err)
	}
	return buf.Bytes(), nil
}

// fit draws src into cell, scaled (nearest neighbour) to fit and centred.
func fit(dst *image.RGBA, cell image.Rectangle, src image.Image) {
	sb := src.Bounds()
	if sb.Dx() == 0 || sb.Dy() == 0 {
		return
	}
	w, h := cell.Dx(), cell.Dy()
	if sb.Dx()*h > sb.Dy()*w {
		h = max(1, sb.Dy()*w/sb.Dx())
	} else {
		w = max(1, sb.Dx()*h/sb.Dy())
	}
	off := cell.Min.Add(image.Pt((cell.Dx()-w)/2, (cell.Dy()-h)/2))
	for y := range h {
		for x := range w {
			dst.Set(off.X+x, off.Y+y, src.At(sb.Min.X+x*sb.Dx()/w, sb.Min.Y+y*sb.Dy()/h))
		}
	}
}

// sleepFor waits d or until ctx ends.
func sleepFor(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}
