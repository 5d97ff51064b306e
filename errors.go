package idemgate

import "errors"

// ErrKeyReused reports an idempotency key held by other parameters. A
// handler whose own store (e.g. pgstore) found the key so returns it, and
// the adapter releases its claim and answers the same key_reused problem
// as for a mismatch it found itself.
var ErrKeyReused = errors.New("idemgate: idempotency key reused with other parameters")
