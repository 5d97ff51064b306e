// Package idemgate is the engine of idemgate: the Store, TxStore and
// Inspector interfaces every idempotency record store implements, the
// problems and events every door reports, and the state machine that
// claims a key, runs the work once, renews its lease, completes or
// releases it, and replays it.
//
// The doors are packages of their own: middleware for echo, idemhttp for
// net/http, idemgin for gin, and Runner.Do for work that is not an HTTP
// request. The stores too: redisstore and pgrecords. This package imports
// no web framework, no go-redis and no pgx.
package idemgate
