package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Prompt markers make the stand-in generator misbehave on purpose, so that
// every task state can be reached by hand.
const (
	markerFail    = "#fail"    // the upstream refuses: the task fails
	markerTimeout = "#timeout" // the upstream answers too late: the task becomes uncertain, then is reconciled
	markerEmpty   = "#empty"   // the upstream answers with no images: succeeded, projected as failed
	markerPartial = "#partial" // the upstream fails after the first image: failed with partial results
)

// Errors of the stand-in upstream, as a real client library would return them.
var (
	errUpstreamRefused = errors.New("upstream refused the prompt (#fail)")
	errUpstreamTimeout = errors.New("upstream did not answer in time (#timeout)")
)

// partialError is a failure after some images were made.
type partialError struct {
	made [][]byte
}

func (e *partialError) Error() string {
	return fmt.Sprintf("upstream failed after %d image(s) (#partial)", len(e.made))
}

// imageParams are the validated parameters of an image task, as stored in
// the task row (client_note is not kept).
type imageParams struct {
	Prompt         string `json:"prompt"`
	AspectRatio    string `json:"aspect_ratio"`
	N              int    `json:"n"`
	ReferenceImage string `json:"reference_image,omitempty"`
}

// generator is the stand-in for an image model behind an API: it takes
// a while and answers with real PNGs, deterministic from the parameters.
type generator struct {
	// took is how long one generation takes.
	took time.Duration
}

// wait takes the generator's time, or less if ctx ends.
func (g generator) wait(ctx context.Context) error {
	t := time.NewTimer(g.took)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// generate renders images from..p.N-1 of p after g.took (from > 0 resumes
// a task that kept partial results), or fails as the prompt's markers ask.
func (g generator) generate(ctx context.Context, p imageParams, from int) ([][]byte, error) {
	if err := g.wait(ctx); err != nil {
		return nil, err
	}
	switch {
	case strings.Contains(p.Prompt, markerFail):
		return nil, errUpstreamRefused
	case strings.Contains(p.Prompt, markerTimeout):
		return nil, errUpstreamTimeout
	case strings.Contains(p.Prompt, markerEmpty):
		return nil, nil
	}
	out := make([][]byte, 0, p.N)
	for i := from; i < p.N; i++ {
		b, err := renderPNG(p, i)
		if err != nil {
			return nil, err
		}
		out = append(out, b)
		// #partial fails once, after the first image; a recovered task
		// (from > 0) then completes.
		if from == 0 && strings.Contains(p.Prompt, markerPartial) {
			return nil, &partialError{made: out}
		}
	}
	return out, nil
}

// aspectSizes are the pixel sizes of the supported aspect ratios.
var aspectSizes = map[string]image.Point{
	"1:1":  {128, 128},
	"16:9": {160, 90},
	"9:16": {90, 160},
	"4:3":  {128, 96},
	"3:4":  {96, 128},
}

// renderPNG draws image i of p: a palette and a pattern of rings and bands
// chosen by a SHA-256 of the parameters, so the same parameters always give
// the same bytes and a changed prompt visibly changes the picture.
func renderPNG(p imageParams, i int) ([]byte, error) {
	size, ok := aspectSizes[p.AspectRatio]
	if !ok {
		return nil, fmt.Errorf("render: unsupported aspect ratio %q", p.AspectRatio)
	}
	h := sha256.New()
	fmt.Fprintf(h, "%d:%s|%s|%d|", len(p.Prompt), p.Prompt, p.AspectRatio, i)
	h.Write([]byte(p.ReferenceImage))
	seed := h.Sum(nil)

	pal := make(color.Palette, 8)
	for j := range pal {
		pal[j] = color.RGBA{seed[3*j], seed[3*j+1], seed[3*j+2], 0xff}
	}
	img := image.NewPaletted(image.Rect(0, 0, size.X, size.Y), pal)
	cx := int(seed[24]) % size.X
	cy := int(seed[25]) % size.Y
	ring := 6 + int(seed[26]%10)
	band := 5 + int(seed[27]%12)
	slope := int(binary.BigEndian.Uint16(seed[28:30])%5) - 2
	for y := range size.Y {
		for x := range size.X {
			dx, dy := x-cx, y-cy
			r := isqrt(dx*dx + dy*dy)
			v := r/ring + (y+slope*x+2*size.X)/band
			img.SetColorIndex(x, y, uint8(v%len(pal)))
		}
	}
	var buf bytes.Buffer
	if err := (&png.Encoder{CompressionLevel: png.BestCompression}).Encode(&buf, img); err != nil {
		return nil, fmt.Errorf("render: %w", err)
	}
	return buf.Bytes(), nil
}

func isqrt(n int) int {
	if n <= 0 {
		return 0
	}
	x := n
	y := (x + 1) / 2
	for y < x {
		x = y
		y = (x + n/x) / 2
	}
	return x
}

// dataURL wraps PNG bytes as a data URL.
func dataURL(png []byte) string {
	return "data:image/png;base64," + base64.StdEncoding.EncodeToString(png)
}

// upstream is the stand-in for the image API as a service: a request is
// sent (call) under the caller's reference, the task ID, and the API
// keeps a log of the requests it received, so that it can say later what
// became of one (lookup): what a real API's "get job by client reference"
// endpoint is for, and what makes reconciling an uncertain task real.
// Like a paid API that takes an Idempotency-Key, it charges once per key:
// a request under a key it has seen joins that job (same outcome, same
// images) instead of starting and charging a second one.
// The log lives in the service's database, standing in for the API's
// own: every process of the service sees the same upstream.
type upstream struct {
	gen    generator
	log    *pgxpool.Pool
	caller string // the calling process's name, logged with each call
}

// upstreamSchema creates the stand-in upstream's call log, once per
// database (serialized, so that processes starting together agree).
const upstreamSchema = `SELECT pg_advisory_xact_lock(8192, 1);
CREATE TABLE IF NOT EXISTS idemgate_example_upstream_calls (
	id      bigserial   PRIMARY KEY,
	ref     text        NOT NULL, -- the caller's reference: the task ID
	outcome text        NOT NULL, -- what the upstream will answer: ok, late, refused, empty, partial
	sent_at timestamptz NOT NULL DEFAULT now(),
	done_at timestamptz NOT NULL  -- when the upstream is done with it
);
ALTER TABLE idemgate_example_upstream_calls ADD COLUMN IF NOT EXISTS caller text; -- the worker that called (WORKER_NAME)
CREATE INDEX IF NOT EXISTS idemgate_example_upstream_calls_ref ON idemgate_example_upstream_calls (ref, id);
ALTER TABLE idemgate_example_upstream_calls ADD COLUMN IF NOT EXISTS idem_key text; -- the request's Idempotency-Key, if any
-- The jobs the upstream charged for: one per Idempotency-Key, whatever
-- the number of requests under it; one per request without a key.
CREATE TABLE IF NOT EXISTS idemgate_example_upstream_jobs (
	idem_key   text        PRIMARY KEY, -- the request's key, or none:<uuid>
	ref        text        NOT NULL,
	outcome    text        NOT NULL,
	charged_at timestamptz NOT NULL DEFAULT now(),
	done_at    timestamptz NOT NULL
)`

// Outcomes of a call, as the stand-in upstream logs them.
const (
	callOK      = "ok"      // images after took
	callLate    = "late"    // images, but after the caller stopped waiting (#timeout)
	callRefused = "refused" // #fail
	callEmpty   = "empty"   // #empty
	callPartial = "partial" // #partial: one image, then a failure
)

// prepare creates the call log.
func (u upstream) prepare(ctx context.Context) error {
	return pgx.BeginFunc(ctx, u.log, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, upstreamSchema)
		return err
	})
}

// errNotSent is a call that never reached the upstream.
var errNotSent = errors.New("upstream: request not sent")

// errMaybeSent is a call whose request went out but whose answer was
// lost (the connection broke, the caller's context ended): the upstream
// may have it, so running it again could make a second call.
var errMaybeSent = errors.New("upstream: request sent, answer lost")

// sendError classifies err, the failure of logging a request: never sent
// when nothing reached the server or the server refused it (its
// statement rolled back), maybe sent otherwise.
func sendError(err error) error {
	var pgErr *pgconn.PgError
	if pgconn.SafeToRetry(err) || errors.As(err, &pgErr) {
		return fmt.Errorf("%w: %w", errNotSent, err)
	}
	return fmt.Errorf("%w: %w", errMaybeSent, err)
}

// call sends request ref for p, resuming after from images, under the
// idempotency key key ("" for none), and waits for the answer as the
// stand-in generator gives it. Once the request is logged, the upstream
// does the work whatever becomes of the caller. A key the upstream has
// seen joins its job: no second charge, and the first request's answer
// once that job is done.
func (u upstream) call(ctx context.Context, ref, key string, p imageParams, from int) ([][]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("%w: %w", errNotSent, err) // a cancelled attempt sends nothing
	}
	took := u.gen.took
	outcome := callOK
	switch {
	case strings.Contains(p.Prompt, markerFail):
		outcome = callRefused
	case strings.Contains(p.Prompt, markerTimeout):
		outcome, took = callLate, 2*took
	case strings.Contains(p.Prompt, markerEmpty):
		outcome = callEmpty
	case strings.Contains(p.Prompt, markerPartial) && from == 0:
		outcome = callPartial
	}
	// One statement: the job (new and charged, or the key's earlier one)
	// and the request's line in the log, which carries the job's outcome.
	var (
		charged bool
		wait    time.Duration
	)
	err := u.log.QueryRow(ctx, `WITH job AS (
		INSERT INTO idemgate_example_upstream_jobs (idem_key, ref, outcome, done_at)
		VALUES (COALESCE(NULLIF(@key, ''), 'none:' || gen_random_uuid()), @ref, @outcome,
			now() + @took_us::bigint * interval '1 microsecond')
		ON CONFLICT (idem_key) DO UPDATE SET idem_key = EXCLUDED.idem_key
		RETURNING outcome, done_at, xmax = 0 AS charged
	), logged AS (
		INSERT INTO idemgate_example_upstream_calls (ref, outcome, done_at, caller, idem_key)
		SELECT @ref, outcome, done_at, NULLIF(@caller, ''), NULLIF(@key, '') FROM job
	)
	SELECT outcome, charged, GREATEST(0, extract(epoch FROM done_at - now()) * 1e6)::bigint FROM job`,
		pgx.NamedArgs{"ref": ref, "key": key, "outcome": outcome, "took_us": took.Microseconds(), "caller": u.caller}).
		Scan(&outcome, &charged, &wait)
	if err != nil {
		return nil, sendError(err)
	}
	if charged {
		return u.gen.generate(ctx, p, from)
	}
	// The key's job runs already (or ran): its answer, when it is done.
	wait *= time.Microsecond
	if outcome == callLate {
		wait = min(wait, u.gen.took) // it answers too late, as it did the first time
	}
	if err := (generator{took: wait}).wait(ctx); err != nil {
		return nil, err
	}
	if outcome == callLate {
		return nil, errUpstreamTimeout
	}
	return answerOf(outcome, p, from)
}

// answerOf is what a done request of outcome answers: its images (for ok
// and late), or its error.
func answerOf(outcome string, p imageParams, from int) ([][]byte, error) {
	switch outcome {
	case callRefused:
		return nil, errUpstreamRefused
	case callEmpty:
		return nil, nil
	case callPartial:
		b, err := renderPNG(p, from)
		if err != nil {
			return nil, err
		}
		return nil, &partialError{made: [][]byte{b}}
	}
	out := make([][]byte, 0, p.N)
	for i := from; i < p.N; i++ {
		b, err := renderPNG(p, i)
		if err != nil {
			return nil, err
		}
		out = append(out, b)
	}
	return out, nil
}

// charges counts the jobs the upstream charged for request ref: one per
// idempotency key however often a request under it was sent, one per
// request without a key.
func (u upstream) charges(ctx context.Context, ref string) (int, error) {
	var n int
	err := u.log.QueryRow(ctx, `SELECT count(*) FROM idemgate_example_upstream_jobs WHERE ref = @ref`,
		pgx.NamedArgs{"ref": ref}).Scan(&n)
	return n, err
}

// callState is what the upstream says of a request.
type callState int

const (
	callNever   callState = iota // no such request was received
	callRunning                  // received, not done yet
	callDone                     // done: its outcome tells how
)

// lookup says what became of the latest request ref and, when done,
// what it came to: its images (for ok and late), or its error.
func (u upstream) lookup(ctx context.Context, ref string, p imageParams, from int) (callState, [][]byte, error) {
	var (
		outcome string
		done    bool
	)
	err := u.log.QueryRow(ctx, `SELECT outcome, done_at <= now() FROM idemgate_example_upstream_calls
		WHERE ref = @ref ORDER BY id DESC LIMIT 1`, pgx.NamedArgs{"ref": ref}).Scan(&outcome, &done)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return callNever, nil, nil
	case err != nil:
		return 0, nil, fmt.Errorf("upstream: lookup: %w", err)
	case !done:
		return callRunning, nil, nil
	}
	made, err := answerOf(outcome, p, from)
	return callDone, made, err
}

// calls counts the requests the upstream received for ref.
func (u upstream) calls(ctx context.Context, ref string) (int, error) {
	var n int
	err := u.log.QueryRow(ctx, `SELECT count(*) FROM idemgate_example_upstream_calls WHERE ref = @ref`,
		pgx.NamedArgs{"ref": ref}).Scan(&n)
	return n, err
}
