package otelidem

import (
	"context"
	"errors"
	"time"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/otelidem/internal/redact"
)

// Store returns s with a span and a duration measurement around each call:
// idemgate.claim, idemgate.extend, idemgate.complete and idemgate.release.
// The spans are children of the request's span (the middleware passes the
// request's values to the store). They carry the operation and its result,
// never the key or the token.
//
// A store that can run Atomic routes (a idemgate.TxStore, such as
// pgrecords.Store) stays one: the wrapper opens and ends the handler's
// transaction through it, with spans idemgate.begin and idemgate.commit
// (the record's completion and the COMMIT) or idemgate.rollback.
func (r *Recorder) Store(s idemgate.Store) idemgate.Store {
	w := &store{next: s, r: r}
	if ts, ok := s.(idemgate.TxStore); ok {
		return &txStore{store: w, next: ts}
	}
	return w
}

// txStore wraps a idemgate.TxStore.
type txStore struct {
	*store
	next idemgate.TxStore
}

var _ idemgate.TxStore = (*txStore)(nil)

func (s *txStore) Begin(ctx context.Context) (idemgate.Tx, error) {
	ctx, span, start := s.start(ctx, "begin")
	tx, err := s.next.Begin(ctx)
	s.end(ctx, span, start, "begin", resultOf(err), "", err)
	if err != nil {
		return nil, err
	}
	return &storeTx{next: tx, s: s.store}, nil
}

// storeTx wraps the transaction of one Atomic request.
type storeTx struct {
	next idemgate.Tx
	s    *store
}

func (t *storeTx) Context(ctx context.Context) context.Context { return t.next.Context(ctx) }

func (t *storeTx) Commit(ctx context.Context, c *idemgate.Completion) error {
	ctx, span, start := t.s.start(ctx, "commit")
	err := t.next.Commit(ctx, c)
	key := ""
	if c != nil {
		key = c.Key
	}
	t.s.end(ctx, span, start, "commit", resultOf(err), key, err)
	return err
}

func (t *storeTx) Rollback(ctx context.Context) error {
	ctx, span, start := t.s.start(ctx, "rollback")
	err := t.next.Rollback(ctx)
	t.s.end(ctx, span, start, "rollback", resultOf(err), "", err)
	return err
}

// store wraps a idemgate.Store.
type store struct {
	next idemgate.Store
	r    *Recorder
}

var _ idemgate.Store = (*store)(nil)

// Results of store calls other than Claim's statuses.
const (
	resultOK        = "ok"
	resultLeaseLost = "lease_lost"
	resultError     = "error"
)

func (s *store) Claim(ctx context.Context, key string, req idemgate.ClaimRequest) (idemgate.ClaimResult, error) {
	ctx, span, start := s.start(ctx, "claim")
	res, err := s.next.Claim(ctx, key, req)
	result := resultError
	if err == nil {
		result = res.Status.String()
	}
	s.end(ctx, span, start, "claim", result, key, err)
	return res, err
}

func (s *store) Extend(ctx context.Context, key string, token idemgate.Token, lease time.Duration) error {
	ctx, span, start := s.start(ctx, "extend")
	err := s.next.Extend(ctx, key, token, lease)
	s.end(ctx, span, start, "extend", resultOf(err), key, err)
	return err
}

func (s *store) Complete(ctx context.Context, key string, token idemgate.Token, resp idemgate.Response, retention time.Duration) error {
	ctx, span, start := s.start(ctx, "complete")
	err := s.next.Complete(ctx, key, token, resp, retention)
	s.end(ctx, span, start, "complete", resultOf(err), key, err)
	return err
}

func (s *store) Release(ctx context.Context, key string, token idemgate.Token) error {
	ctx, span, start := s.start(ctx, "release")
	err := s.next.Release(ctx, key, token)
	s.end(ctx, span, start, "release", resultOf(err), key, err)
	return err
}

func (s *store) start(ctx context.Context, op string) (context.Context, trace.Span, time.Time) {
	ctx, span := s.r.tracer.Start(ctx, "idemgate."+op, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(keyOperation.String(op)))
	return ctx, span, time.Now()
}

func (s *store) end(ctx context.Context, span trace.Span, start time.Time, op, result, key string, err error) {
	took := time.Since(start)
	span.SetAttributes(keyResult.String(result))
	if result == resultError {
		span.RecordError(redact.Error(err, key))
		span.SetStatus(codes.Error, "store call failed")
	}
	span.End()
	s.r.storeDur.Record(ctx, took.Seconds(), metric.WithAttributes(
		keyOperation.String(op), keyResult.String(result)))
}

func resultOf(err error) string {
	switch {
	case err == nil:
		return resultOK
	case errors.Is(err, idemgate.ErrLeaseLost):
		return resultLeaseLost
	}
	return resultError
}
