package idemgate

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"net/http"
	"time"

	"github.com/idemgate/idemgate/fingerprint"
)

// Store keeps one record per idempotency key. A record is either claimed
// (a request holds it under a lease and a fencing token) or finished (it
// holds the stored response). The middleware makes exactly one Store call
// per state transition, so every method must be atomic on its own: a
// read-then-write across two round trips lets two requests both run.
//
// Implementations must be safe for concurrent use. Context first: every
// method honours ctx for cancellation and deadlines. An error other than
// ErrLeaseLost means "the store could not be reached or answered
// nonsense"; the middleware then fails closed (503) or open (Config.FailOpen).
//
// A Postgres store, for example, is one table keyed by key with columns
// fingerprint, owner, kind, token, lease_until, expires_at, status, headers,
// body: Claim is one INSERT … ON CONFLICT … DO UPDATE … WHERE the old row is
// expired (lease_until or expires_at in the past) RETURNING the row, and
// Extend, Complete and Release are single UPDATE/DELETE statements with
// "WHERE key = $1 AND token = $2". A DynamoDB store does the same with
// conditional writes (attribute_not_exists(pk) OR lease_until < :now, and
// token = :token).
type Store interface {
	// Claim atomically claims key for a request, or reports what holds it.
	//
	// If no live record exists (none ever, or its lease or retention ran
	// out), Claim creates a claimed record holding req's Fingerprint,
	// Owner, Kind and Token that lives for req.Lease, and returns Claimed.
	// A live record claimed with req.Token also returns Claimed: a client
	// library may resend a call whose answer it did not receive, and the
	// resent claim must not find its own claim running.
	//
	// If a live record exists, Claim compares its fingerprint, owner and
	// kind with req's ordinally (byte for byte, ==). Any difference returns
	// Mismatch, and the result must carry nothing of the stored response
	// (the store may read it, but never returns it). A store that keeps
	// req.Fields with the record sets Changed on a Mismatch whose owner and
	// kind are the record's (only the fingerprint differs). Otherwise it
	// returns Running (with the time left on the lease in RetryAfter) or
	// Finished (with the stored Response).
	Claim(ctx context.Context, key string, req ClaimRequest) (ClaimResult, error)

	// Extend pushes the lease of a claimed record to lease from now, if and
	// only if the record is still claimed with token. Otherwise it returns
	// ErrLeaseLost and changes nothing.
	Extend(ctx context.Context, key string, token Token, lease time.Duration) error

	// Complete turns a claimed record into a finished one holding resp for
	// retention from now, if and only if the record is still claimed with
	// token. A record that token already finished returns nil and changes
	// nothing (a resent call whose first attempt succeeded). Otherwise it
	// returns ErrLeaseLost and changes nothing.
	// Complete must not retain resp or its slices after it returns.
	Complete(ctx context.Context, key string, token Token, resp Response, retention time.Duration) error

	// Release deletes a claimed record so that a retry can run, if and only
	// if it is still claimed with token. Otherwise (expired, re-claimed by
	// another token, or finished) it returns ErrLeaseLost and changes nothing.
	// The middleware also calls it after a Claim that returned an error, as
	// the store may have made the claim and lost only its answer; a token
	// whose claim never happened gets ErrLeaseLost.
	Release(ctx context.Context, key string, token Token) error
}

// ErrLeaseLost reports that a record is no longer claimed with the caller's
// fencing token: its lease ran out and perhaps another request claimed it,
// it was released, finished, or the store lost it. The caller must not
// assume it still owns the key.
var ErrLeaseLost = errors.New("idemgate: lease lost")

// Token is a 128-bit fencing token. Each claim gets a fresh one, and only
// its holder can extend, complete or release the claim. The middleware's
// tokens carry the claim's time and lease (see ClaimTimes).
type Token [16]byte

// A claim's token records when the claim was made and for how long, so
// that an operator's tool can tell a claim whose handler still runs (its
// lease renewed every Lease/3) from one nobody renews, with no change to
// a store's record format: a node of an older idemgate carries such a
// token as the opaque bytes it always was. The layout is an RFC 9562
// version 8 UUID (pgrecords keeps the token as a uuid):
//
//	bytes 0–5    the claim's time, Unix milliseconds, big endian
//	byte 6       0x80 | 4 random bits (version 8)
//	byte 7       random
//	byte 8       0x80 | 6 random bits (variant 10)
//	bytes 9–12   the claim's lease in milliseconds, big endian (0: unknown,
//	             or longer than about 49 days)
//	bytes 13–15  random
//
// 42 random bits tell apart two claims of one key in one millisecond; a
// token only fences claims of the same key, one after another.
const (
	tokenVersion = 0x80
	tokenVariant = 0x80
)

// tokenEpoch is when tokens began to carry times: a token whose time is
// older is one of an older idemgate's random tokens that happens to have
// the version and variant bits (1 in 64 of them).
var tokenEpoch = time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC).UnixMilli()

// ClaimTimes returns the time a claim was made and the lease it was made
// for, as the claiming node recorded them in its token; ok is false for a
// token that records neither (an older idemgate's: 128 random bits).
// lease is zero when unknown.
func (t Token) ClaimTimes() (at time.Time, lease time.Duration, ok bool) {
	ms := int64(binary.BigEndian.Uint64(t[:8]) >> 16)
	if t[6]&0xf0 != tokenVersion || t[8]&0xc0 != tokenVariant || ms < tokenEpoch {
		return time.Time{}, 0, false
	}
	return time.UnixMilli(ms), time.Duration(binary.BigEndian.Uint32(t[9:13])) * time.Millisecond, true
}

// String returns the token as 32 lowercase hex digits.
func (t Token) String() string { return hex.EncodeToString(t[:]) }

// ClaimRequest is what a claim records and compares.
type ClaimRequest struct {
	// Fingerprint of the request parameters (including method and route).
	Fingerprint fingerprint.Fingerprint
	// Owner is the digest of the user (keyspace.Key.Owner).
	Owner string
	// Kind is the business action kind (keyspace.Key.Kind).
	Kind string
	// Lease is how long the claim lives unless extended.
	Lease time.Duration
	// Token fences the claim.
	Token Token
	// Fields are short digests of the fingerprint's selected fields, one
	// per pointer of Config.Fingerprint.Fields in that order, or nil. A
	// store may keep them with the record to tell a later Mismatch which
	// fields changed (ClaimResult.Changed); a store that does not ignores
	// them.
	Fields []fingerprint.FieldSum
}

// ClaimStatus is the outcome of Store.Claim.
type ClaimStatus int

const (
	// Claimed: the caller now holds the key and must run the request.
	Claimed ClaimStatus = iota + 1
	// Running: another request with the same parameters holds the key.
	Running
	// Finished: a request with the same parameters finished; the result
	// carries its Response.
	Finished
	// Mismatch: the key is held (running or finished) by a request whose
	// fingerprint, owner or kind differs.
	Mismatch
)

var claimStatusNames = [...]string{"invalid", "claimed", "running", "finished", "mismatch"}

// String returns the lower-case name of s.
func (s ClaimStatus) String() string {
	if s < 0 || int(s) >= len(claimStatusNames) {
		return "invalid"
	}
	return claimStatusNames[s]
}

// ClaimResult is the answer of Store.Claim.
type ClaimResult struct {
	Status ClaimStatus
	// Response is the stored response; set only when Status is Finished.
	Response Response
	// RetryAfter is the time left on the holder's lease; set only when
	// Status is Running (zero if the store cannot tell).
	RetryAfter time.Duration
	// Changed lists, on a Mismatch with the record's owner and kind, the
	// indexes into ClaimRequest.Fields whose digests the record does not
	// hold: the fields the client changed. nil when the store cannot tell
	// (no Fields, on either side) and on every other status.
	Changed []int
}

// Response is a stored response: replayed byte for byte.
type Response struct {
	Status int
	Header http.Header
	Body   []byte
}
