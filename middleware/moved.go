package middleware

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/redisstore"
)

// The engine's types and errors moved to the root package idemgate in
// v0.2.0, for every door to share (net/http, gin, Runner.Do), and the
// Redis store to redisstore. These names stay, deprecated, for one
// release so that code written against v0.1 compiles; new code names
// idemgate's and redisstore's.

type (
	// Deprecated: use idemgate.Store, where Store moved in v0.2.0.
	Store = idemgate.Store
	// Deprecated: use idemgate.Token, where Token moved in v0.2.0.
	Token = idemgate.Token
	// Deprecated: use idemgate.ClaimRequest, where ClaimRequest moved in v0.2.0.
	ClaimRequest = idemgate.ClaimRequest
	// Deprecated: use idemgate.ClaimStatus, where ClaimStatus moved in v0.2.0.
	ClaimStatus = idemgate.ClaimStatus
	// Deprecated: use idemgate.ClaimResult, where ClaimResult moved in v0.2.0.
	ClaimResult = idemgate.ClaimResult
	// Deprecated: use idemgate.Response, where Response moved in v0.2.0.
	Response = idemgate.Response
	// Deprecated: use idemgate.TxStore, where TxStore moved in v0.2.0.
	TxStore = idemgate.TxStore
	// Deprecated: use idemgate.Tx, where Tx moved in v0.2.0.
	Tx = idemgate.Tx
	// Deprecated: use idemgate.Completion, where Completion moved in v0.2.0.
	Completion = idemgate.Completion
	// Deprecated: use idemgate.Inspector, where Inspector moved in v0.2.0.
	Inspector = idemgate.Inspector
	// Deprecated: use idemgate.RecordInfo, where RecordInfo moved in v0.2.0.
	RecordInfo = idemgate.RecordInfo
	// Deprecated: use idemgate.EventType, where EventType moved in v0.2.0.
	EventType = idemgate.EventType
	// Deprecated: use idemgate.Event, where Event moved in v0.2.0.
	Event = idemgate.Event
	// Deprecated: use idemgate.Code, where Code moved in v0.2.0.
	Code = idemgate.Code
	// Deprecated: use idemgate.Problem, where Problem moved in v0.2.0.
	Problem = idemgate.Problem
	// Deprecated: use redisstore.Store, where RedisStore moved in v0.2.0.
	RedisStore = redisstore.Store
)

var (
	// Deprecated: use idemgate.ErrLeaseLost, where ErrLeaseLost moved in v0.2.0.
	ErrLeaseLost = idemgate.ErrLeaseLost
	// Deprecated: use idemgate.ErrTxAborted, where ErrTxAborted moved in v0.2.0.
	ErrTxAborted = idemgate.ErrTxAborted
	// Deprecated: use idemgate.ErrTxRefused, where ErrTxRefused moved in v0.2.0.
	ErrTxRefused = idemgate.ErrTxRefused
	// Deprecated: use idemgate.ErrTxConflict, where ErrTxConflict moved in v0.2.0.
	ErrTxConflict = idemgate.ErrTxConflict
	// Deprecated: use idemgate.ErrNoRecord, where ErrNoRecord moved in v0.2.0.
	ErrNoRecord = idemgate.ErrNoRecord
	// Deprecated: use idemgate.ErrKeyReused, where ErrKeyReused moved in v0.2.0.
	ErrKeyReused = idemgate.ErrKeyReused
)

// idemgate's constants of the same names, kept for one release.
const (
	// Deprecated: use idemgate.Claimed.
	Claimed = idemgate.Claimed
	// Deprecated: use idemgate.Running.
	Running = idemgate.Running
	// Deprecated: use idemgate.Finished.
	Finished = idemgate.Finished
	// Deprecated: use idemgate.Mismatch.
	Mismatch = idemgate.Mismatch
	// Deprecated: use idemgate.CodeKeyMissing.
	CodeKeyMissing = idemgate.CodeKeyMissing
	// Deprecated: use idemgate.CodeKeyInvalid.
	CodeKeyInvalid = idemgate.CodeKeyInvalid
	// Deprecated: use idemgate.CodeKeyReused.
	CodeKeyReused = idemgate.CodeKeyReused
	// Deprecated: use idemgate.CodeRequestInProgress.
	CodeRequestInProgress = idemgate.CodeRequestInProgress
	// Deprecated: use idemgate.CodeBodyTooLarge.
	CodeBodyTooLarge = idemgate.CodeBodyTooLarge
	// Deprecated: use idemgate.CodeBodyInvalid.
	CodeBodyInvalid = idemgate.CodeBodyInvalid
	// Deprecated: use idemgate.CodeStoreUnavailable.
	CodeStoreUnavailable = idemgate.CodeStoreUnavailable
	// Deprecated: use idemgate.CodeScopeInvalid.
	CodeScopeInvalid = idemgate.CodeScopeInvalid
	// Deprecated: use idemgate.CodeEncodingNotAcceptable.
	CodeEncodingNotAcceptable = idemgate.CodeEncodingNotAcceptable
	// Deprecated: use idemgate.CodeLeaseLost.
	CodeLeaseLost = idemgate.CodeLeaseLost
	// Deprecated: use idemgate.CodeResponseTooLarge.
	CodeResponseTooLarge = idemgate.CodeResponseTooLarge
	// Deprecated: use idemgate.CodeBodyTimeout.
	CodeBodyTimeout = idemgate.CodeBodyTimeout
	// Deprecated: use idemgate.CodeTxConflict.
	CodeTxConflict = idemgate.CodeTxConflict
	// Deprecated: use idemgate.CodeTxAborted.
	CodeTxAborted = idemgate.CodeTxAborted
	// Deprecated: use idemgate.EventClaimed.
	EventClaimed = idemgate.EventClaimed
	// Deprecated: use idemgate.EventReplayed.
	EventReplayed = idemgate.EventReplayed
	// Deprecated: use idemgate.EventReused.
	EventReused = idemgate.EventReused
	// Deprecated: use idemgate.EventInProgress.
	EventInProgress = idemgate.EventInProgress
	// Deprecated: use idemgate.EventWaited.
	EventWaited = idemgate.EventWaited
	// Deprecated: use idemgate.EventReleased.
	EventReleased = idemgate.EventReleased
	// Deprecated: use idemgate.EventLeaseLost.
	EventLeaseLost = idemgate.EventLeaseLost
	// Deprecated: use idemgate.EventStoreError.
	EventStoreError = idemgate.EventStoreError
	// Deprecated: use idemgate.EventFailOpen.
	EventFailOpen = idemgate.EventFailOpen
)

// TxLease returns the Lease of the route whose transaction TxStore.Begin
// opens.
//
// Deprecated: use idemgate.TxLease, where It moved in v0.2.0.
func TxLease(ctx context.Context) (time.Duration, bool) { return idemgate.TxLease(ctx) }

// NewRedisStore returns a Store on client.
//
// Deprecated: use redisstore.New, where It moved in v0.2.0.
func NewRedisStore(client redis.UniversalClient) *RedisStore { return redisstore.New(client) }
