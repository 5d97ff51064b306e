package middleware

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/redisstore"
)

// The engine's types and errors moved to the root package idemgate in
// v0.2.0, for every door to share (net/http, gin, Runner.Do). These names
// stay for one release so that code written against v0.1 compiles; new
// code names idemgate's.

type (
	// Store is idemgate.Store, kept here for one release.
	Store = idemgate.Store
	// Token is idemgate.Token, kept here for one release.
	Token = idemgate.Token
	// ClaimRequest is idemgate.ClaimRequest, kept here for one release.
	ClaimRequest = idemgate.ClaimRequest
	// ClaimStatus is idemgate.ClaimStatus, kept here for one release.
	ClaimStatus = idemgate.ClaimStatus
	// ClaimResult is idemgate.ClaimResult, kept here for one release.
	ClaimResult = idemgate.ClaimResult
	// Response is idemgate.Response, kept here for one release.
	Response = idemgate.Response
	// TxStore is idemgate.TxStore, kept here for one release.
	TxStore = idemgate.TxStore
	// Tx is idemgate.Tx, kept here for one release.
	Tx = idemgate.Tx
	// Completion is idemgate.Completion, kept here for one release.
	Completion = idemgate.Completion
	// Inspector is idemgate.Inspector, kept here for one release.
	Inspector = idemgate.Inspector
	// RecordInfo is idemgate.RecordInfo, kept here for one release.
	RecordInfo = idemgate.RecordInfo
	// EventType is idemgate.EventType, kept here for one release.
	EventType = idemgate.EventType
	// Event is idemgate.Event, kept here for one release.
	Event = idemgate.Event
	// Code is idemgate.Code, kept here for one release.
	Code = idemgate.Code
	// Problem is idemgate.Problem, kept here for one release.
	Problem = idemgate.Problem
	// RedisStore is redisstore.Store, kept here for one release.
	RedisStore = redisstore.Store
)

var (
	// ErrLeaseLost is idemgate.ErrLeaseLost, kept here for one release.
	ErrLeaseLost = idemgate.ErrLeaseLost
	// ErrTxAborted is idemgate.ErrTxAborted, kept here for one release.
	ErrTxAborted = idemgate.ErrTxAborted
	// ErrTxRefused is idemgate.ErrTxRefused, kept here for one release.
	ErrTxRefused = idemgate.ErrTxRefused
	// ErrTxConflict is idemgate.ErrTxConflict, kept here for one release.
	ErrTxConflict = idemgate.ErrTxConflict
	// ErrNoRecord is idemgate.ErrNoRecord, kept here for one release.
	ErrNoRecord = idemgate.ErrNoRecord
	// ErrKeyReused is idemgate.ErrKeyReused, kept here for one release.
	ErrKeyReused = idemgate.ErrKeyReused
)

// These are idemgate's constants of the same names, kept here for one
// release.
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
// It is idemgate.TxLease, kept here for one release.
func TxLease(ctx context.Context) (time.Duration, bool) { return idemgate.TxLease(ctx) }

// NewRedisStore returns a Store on client.
//
// It is redisstore.New, kept here for one release.
func NewRedisStore(client redis.UniversalClient) *RedisStore { return redisstore.New(client) }
