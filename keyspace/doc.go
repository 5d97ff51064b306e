// Package keyspace derives idempotency keys from who is asking (tenant, user),
// what they name their action (the client's request id) and what kind of
// action it is.
//
// A [Key] has two text forms. [Key.String] is the store key,
//
//	idem:<tenant>:<kind>:<hex sha256(user)>:<hex sha256(request)>
//
// with the tenant readable, so that operators can find a tenant's records,
// while the user and the request id appear only as digests, never in
// plaintext. [Key.Task] is the fixed-length form for Postgres,
//
//	<kind>:<hex sha256(String())>
//
// Different tenant, user, request id or kind always give a different String
// and a different Task. The tenant is escaped by [NormalizeSegment] rather
// than case-folded or trimmed: any folding would merge two tenants and let
// one replay the other's responses. The escaped tenant contains no ':', so a
// key splits unambiguously, and no '{' or '}', so a Redis Cluster never sees
// a hash tag in it.
//
// [KindFor] derives a kind from an HTTP method and route template
// ("POST /v1/images" is post-v1-images), always valid for Derive and
// different for routes a router tells apart. [MaxTenant], [MaxUser] and
// [MaxRequest] are the length limits Derive enforces, for callers that
// refuse a too-long identity before deriving.
//
// Bad input is rejected with an error wrapping [ErrInvalid]; Derive never
// repairs its input silently.
package keyspace
