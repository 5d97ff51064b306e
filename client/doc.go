// Package client is a Go client for HTTP APIs protected by idemgate. It
// follows the client rules that make retries safe:
//
//  1. A request id names one business action ("invoice:7:close") and stays
//     the same across retries: every retry of a Send — after a timeout, a
//     dropped connection, a 5xx — sends the Idempotency-Key it started with.
//  2. Changed parameters need a new id. RequestID derives the id from the
//     action and the parameters that matter, so changed parameters give a new
//     id by construction.
//  3. A key_reused conflict is a decision for the caller: it comes back as a
//     *Problem matching ErrKeyReused and is never retried. A 202 means "poll
//     the task or resource it names" (Poll), never "send again under a new
//     id".
//
// Transport errors and retryable answers are retried with the same id and
// the same bytes, after a capped exponential backoff with jitter; a wait
// honours the server's retry-after-ms or Retry-After when it asks for
// longer, up to Config.MaxRetryAfter (an answer asking for more ends the
// call with its *Problem). An answer's x-should-retry header (which
// idemgate sends with every problem) decides over its status code. The
// policy, beside the OpenAI and Stripe Go SDKs' choices, is a table in
// docs/client.md.
//
// The package uses only the standard library.
package client
