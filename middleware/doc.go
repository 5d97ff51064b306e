// Package middleware is idemgate's echo v4 idempotency middleware and its
// stores.
//
// The idempotency key says "is this the same business action"; the
// parameter fingerprint says "are these still the same parameters". A true
// retry (same key, same parameters) gets the original response back, byte
// for byte, with Idempotent-Replayed: true, and the handler does not run
// again. A retry whose parameters drifted (same key, another prompt) gets
// 409 key_reused before anything runs — never the old answer, never a new
// run under the old key.
//
// Use it per route, with that route's Kind and Fingerprint:
//
//	idem := middleware.Config{Store: middleware.NewRedisStore(rdb), Scope: scopeFromJWT}
//	images := idem
//	images.Kind = "image"
//	images.Fingerprint = fingerprint.Spec{Fields: []string{"/prompt", "/aspect_ratio", "/n"}}
//	e.POST("/v1/images", createImage, middleware.New(images))
//
// For each protected request (POST and PATCH by default, carrying the
// Idempotency-Key header) the middleware derives a key from tenant, user,
// kind and request id (package keyspace), fingerprints the body together
// with the method, route template, path parameter values and raw query
// string (package fingerprint), and makes one
// atomic Store.Claim call. Then it replays a finished response, answers 409
// request_in_progress for a running one (or waits, WaitInFlight), answers
// key_reused for other parameters, or runs the handler under a renewed lease
// and stores its response for Retention (statuses Cacheable accepts) or
// releases the claim so a retry runs (5xx, 408, 409, 425, 429, errors,
// panics, responses over MaxResponseBytes). A response the handler wrote in
// full is stored even if the client left and the write to it failed; a
// claim call that failed is released (fenced by its own token) in case the
// store ran it and only its answer was lost.
//
// Put compressing middleware outside this one (e.Use(middleware.Gzip())
// before it): then the stored body is identity and each answer is
// compressed as its request asks. Inside, the first client's encoding is
// stored, and a retry that does not accept it gets it decoded (gzip) or 406
// encoding_not_acceptable.
//
// Errors are application/problem+json (RFC 9457) with a "code" member:
//
//	key_missing          400  no key and Config.Required
//	key_invalid          400  repeated, empty, over 255 bytes, non-printable
//	body_too_large       413  body over MaxBodyBytes
//	body_invalid         400  body the fingerprint cannot parse (reason and byte
//	                          offset in detail, never body content)
//	body_timeout         408  body did not arrive before the server's read
//	                          deadline; Retry-After
//	scope_invalid        400  tenant or user from Scope is empty or over 255 bytes
//	key_reused           409  key used with other parameters (MismatchStatus, e.g. 422);
//	                          with Fingerprint.Fields, "changed" lists the pointers
//	                          of the fields that differ (names, never values)
//	request_in_progress  409  same request still running; Retry-After
//	                          (time left on the lease, at most Lease/3, at least 1 s)
//	store_unavailable    503  store unreachable (unless FailOpen); Retry-After
//	encoding_not_acceptable
//	                     406  stored Content-Encoding the retry does not accept
//	                          and that cannot be decoded for it
//	lease_lost           503  Atomic route: the claim ran out and another request
//	                          took the key over before the commit; rolled back
//	response_too_large   500  Atomic route: answer over MaxResponseBytes; rolled back
//	                          (or the handler's own uncacheable status, hinted as it)
//	transaction_conflict 503  Atomic route: serialization failure or deadlock at the
//	                          commit; rolled back; Retry-After
//	transaction_aborted  500  Atomic route: the handler broke its transaction
//
// The codes are the Code constants (CodeKeyMissing, …): a wire contract
// that clients may compare against. Every problem carries x-should-retry,
// which generated API clients (Stainless: OpenAI's, Anthropic's SDKs, …)
// obey over the status code: true, with Retry-After, for
// request_in_progress, store_unavailable, lease_lost, body_timeout and
// transaction_conflict; false, without Retry-After, for the others, so
// that such a client never resends a key_reused (Code.Retryable;
// Problem.ShouldRetry for a response_too_large that keeps the handler's
// status). Config.ErrorHandler renders problems in the application's own
// error format instead.
//
// With the middleware on the whole app (e.Use) or a group, a request that
// echo matches to no route of its method (a 404, a 405) passes through
// untouched: no store call.
//
// Atomic routes (Config.Atomic, with a Store that implements TxStore such
// as pgrecords.Store): the handler runs inside a transaction the store
// opens after the claim, and the record is completed in that same
// transaction, so the handler's own writes and its stored answer commit
// together or not at all; the answer is held until the commit. See
// docs/atomic-routes.md.
//
// The Store interface is small enough to implement on Postgres or DynamoDB;
// RedisStore implements it on a single Redis, Sentinel or Cluster: a claim
// or a replay is one native SET … NX PX … GET, and every fenced transition
// one Lua script.
package middleware
