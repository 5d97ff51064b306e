package idemgate

import (
	"context"
	"errors"
	"net/http"
	"time"
)

// Inspector is what operator tools need of a Store: to show the record
// under a key without claiming it, and to free a key that a crashed or
// stuck request holds. It is optional: the middleware never calls it, and
// a Store of one's own need not implement it. redisstore.Store and
// pgrecords.Store do.
//
// Forget is fenced like Release: it deletes the record only if it still
// holds the token Inspect showed, in the state Inspect showed, so a key
// that changed hands in between is left alone. A request whose claim was
// forgotten has lost its lease: its Extend, Complete and Release return
// ErrLeaseLost, and its late answer is never stored over the key's next
// claim.
type Inspector interface {
	// Inspect returns the live record under key, claimed or finished, or
	// an error wrapping ErrNoRecord. It changes nothing.
	Inspect(ctx context.Context, key string) (RecordInfo, error)

	// Forget deletes the live record under key if it holds token and is
	// finished (finished true) or claimed (finished false). Otherwise it
	// returns an error wrapping ErrNoRecord and changes nothing.
	Forget(ctx context.Context, key string, token Token, finished bool) error
}

// ErrNoRecord reports that a key has no live record (none ever, expired,
// released) or, from Forget, none in the state and with the token asked.
var ErrNoRecord = errors.New("idemgate: no live record")

// RecordInfo is a record as an operator sees it: never the user or the
// request id, which a key holds only as digests.
type RecordInfo struct {
	// Finished: the record holds a response; otherwise a request holds it
	// under a lease.
	Finished bool
	// Token is the fencing token of the claim that made the record.
	Token Token
	// Left is the time left on the lease (claimed) or the retention
	// (finished), by the store's clock.
	Left time.Duration
	// ClaimedAt and Lease are when the claim was made, by the claiming
	// node's clock, and the lease it was made for (Config.Lease), from
	// the token (Token.ClaimTimes); zero when the token records them not
	// (an older idemgate's claim). Every renewal sets the lease back to
	// Lease, so a claim was last renewed (or made) Lease - Left ago.
	ClaimedAt time.Time
	Lease     time.Duration
	// Fingerprint is the stored fingerprint: as the middleware computed
	// it, or, where the store keeps only a prefix of its digest
	// (redisstore.Store), "v1:" and that prefix in hex.
	Fingerprint string
	// Owner and Kind are those the record was claimed with; empty when
	// the store keeps them only in the key (redisstore.Store, keyspace keys).
	Owner, Kind string
	// Fields is how many selected fields' digests the record keeps.
	Fields int
	// Status, Header and BodySize describe the stored response (finished
	// records only).
	Status   int
	Header   http.Header
	BodySize int
	// Size is how many bytes the record takes in the store, key aside.
	Size int
}
