// Package sdkretry checks the middleware's retry hints against a real
// generated API client: OpenAI's Go SDK, built by Stainless like the
// Anthropic one and many others, which retries 408, 409, 429 and 5xx by
// itself unless the answer's x-should-retry header says otherwise. Its
// test counts, on the server, how often the SDK sends each request.
//
// It lives in the tools module so that the library's go.mod does not
// carry the SDK.
package sdkretry
