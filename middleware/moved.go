package middleware

import (
	"context"
	"time"

	"github.com/idemgate/idemgate"
)

// The engine's types and errors moved to the root package idemgate in
// v0.2.0, for every door to share (net/http, gin, Runner.Do). These names
// stay for one release so that code written against v0.1 compiles; new
// code names idemgate's.

type (
	// Deprecated: use idemgate.Store.
	Store = idemgate.Store
	// Deprecated: use idemgate.Token.
	Token = idemgate.Token
	// Deprecated: use idemgate.ClaimRequest.
	ClaimRequest = idemgate.ClaimRequest
	// Deprecated: use idemgate.ClaimStatus.
	ClaimStatus = idemgate.ClaimStatus
	// Deprecated: use idemgate.ClaimResult.
	ClaimResult = idemgate.ClaimResult
	// Deprecated: use idemgate.Response.
	Response = idemgate.Response
	// Deprecated: use idemgate.TxStore.
	TxStore = idemgate.TxStore
	// Deprecated: use idemgate.Tx.
	Tx = idemgate.Tx
	// Deprecated: use idemgate.Completion.
	Completion = idemgate.Completion
	// Deprecated: use idemgate.Inspector.
	Inspector = idemgate.Inspector
	// Deprecated: use idemgate.RecordInfo.
	RecordInfo = idemgate.RecordInfo
	// Deprecated: use idemgate.EventType.
	EventType = idemgate.EventType
	// Deprecated: use idemgate.Event.
	Event = idemgate.Event
	// Deprecated: use idemgate.Code.
	Code = idemgate.Code
	// Deprecated: use idemgate.Problem.
	Problem = idemgate.Problem
)

var (
	// Deprecated: use idemgate.ErrLeaseLost.
	ErrLeaseLost = idemgate.ErrLeaseLost
	// Deprecated: use idemgate.ErrTxAborted.
	ErrTxAborted = idemgate.ErrTxAborted
	// Deprecated: use idemgate.ErrTxRefused.
	ErrTxRefused = idemgate.ErrTxRefused
	// Deprecated: use idemgate.ErrTxConflict.
	ErrTxConflict = idemgate.ErrTxConflict
	// Deprecated: use idemgate.ErrNoRecord.
	ErrNoRecord = idemgate.ErrNoRecord
	// Deprecated: use idemgate.ErrKeyReused.
	ErrKeyReused = idemgate.ErrKeyReused
)

// Deprecated: use idemgate's constants of the same names.
const (
	Claimed                   = idemgate.Claimed
	Running                   = idemgate.Running
	Finished                  = idemgate.Finished
	Mismatch                  = idemgate.Mismatch
	CodeKeyMissing            = idemgate.CodeKeyMissing
	CodeKeyInvalid            = idemgate.CodeKeyInvalid
	CodeKeyReused             = idemgate.CodeKeyReused
	CodeRequestInProgress     = idemgate.CodeRequestInProgress
	CodeBodyTooLarge          = idemgate.CodeBodyTooLarge
	CodeBodyInvalid           = idemgate.CodeBodyInvalid
	CodeStoreUnavailable      = idemgate.CodeStoreUnavailable
	CodeScopeInvalid          = idemgate.CodeScopeInvalid
	CodeEncodingNotAcceptable = idemgate.CodeEncodingNotAcceptable
	CodeLeaseLost             = idemgate.CodeLeaseLost
	CodeResponseTooLarge      = idemgate.CodeResponseTooLarge
	CodeBodyTimeout           = idemgate.CodeBodyTimeout
	CodeTxConflict            = idemgate.CodeTxConflict
	CodeTxAborted             = idemgate.CodeTxAborted
	EventClaimed              = idemgate.EventClaimed
	EventReplayed             = idemgate.EventReplayed
	EventReused               = idemgate.EventReused
	EventInProgress           = idemgate.EventInProgress
	EventWaited               = idemgate.EventWaited
	EventReleased             = idemgate.EventReleased
	EventLeaseLost            = idemgate.EventLeaseLost
	EventStoreError           = idemgate.EventStoreError
	EventFailOpen             = idemgate.EventFailOpen
)

// TxLease returns the Lease of the route whose transaction TxStore.Begin
// opens.
//
// Deprecated: use idemgate.TxLease.
func TxLease(ctx context.Context) (time.Duration, bool) { return idemgate.TxLease(ctx) }
