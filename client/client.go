package client

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// ErrKeyReused matches (errors.Is) a *Problem with code key_reused: the
// request id was already used with other parameters. Pick a new id if the
// new parameters are what you want; never retry the same request.
var ErrKeyReused = errors.New("client: request id already used with other parameters")

// The problem codes the client acts on (the rest are passed on).
const (
	codeKeyReused         = "key_reused"
	codeRequestInProgress = "request_in_progress"
)

// Problem is an error answer, read as application/problem+json (RFC 9457)
// when the body is one.
type Problem struct {
	Status int    `json:"status"`
	Type   string `json:"type"`
	Title  string `json:"title"`
	Detail string `json:"detail"`
	Code   string `json:"code"`
	// Changed names the fields (JSON Pointers) whose values differ from the
	// request that first used the key, when the server can tell (key_reused
	// only; names, never values).
	Changed []string `json:"changed,omitempty"`
	// RetryAfter is the answer's Retry-After (0 if it had none).
	RetryAfter time.Duration `json:"-"`
	// ShouldRetry is the answer's x-should-retry header: "true", "false",
	// or "" when it had none.
	ShouldRetry string `json:"-"`
}

func (p *Problem) Error() string {
	msg := fmt.Sprintf("client: %d %s", p.Status, p.Code)
	if p.Detail != "" {
		msg += ": " + p.Detail
	} else if p.Title != "" {
		msg += ": " + p.Title
	}
	if len(p.Changed) > 0 {
		msg += " (changed: " + strings.Join(p.Changed, ", ") + ")"
	}
	return msg
}

// Is makes errors.Is(err, ErrKeyReused) hold for a key_reused problem.
func (p *Problem) Is(target error) bool {
	return target == ErrKeyReused && p.Code == codeKeyReused
}

// Retryable reports whether sending the same request again, with the same
// id, may succeed: never for key_reused; else as the answer's
// x-should-retry says; else for 409 request_in_progress, 408, 425, 429 and
// 5xx answers.
func (p *Problem) Retryable() bool {
	switch {
	case p.Code == codeKeyReused:
		return false // rule 3: a decision for the caller, whatever a proxy says
	case p.ShouldRetry == "true":
		return true
	case p.ShouldRetry == "false":
		return false
	}
	switch p.Status {
	case http.StatusConflict:
		return p.Code == codeRequestInProgress
	case http.StatusRequestTimeout, http.StatusTooEarly, http.StatusTooManyRequests:
		return true
	}
	return p.Status >= 500
}

// RequestID returns the request id for one business action with these
// parameters: action (say "invoice:7:close", printable ASCII) followed by a
// digest of the parameters as JSON. The same action and parameters give the same id on
// every retry (rule 1); changed parameters give a new id (rule 2). Pass only
// the parameters the server compares: a field that may change between
// retries (a note, a timestamp) must not take part. It panics if a
// parameter cannot be encoded as JSON (a channel, a NaN), as such a request
// could not be sent either.
func RequestID(action string, params ...any) string {
	b, err := json.Marshal(params)
	if err != nil {
		// A parameter JSON cannot encode is a programmer error, like a
		// bad format string.
		panic("client: RequestID: " + err.Error())
	}
	sum := sha256.Sum256(b)
	return action + ":" + hex.EncodeToString(sum[:8])
}

// Config configures a Client.
type Config struct {
	// BaseURL is the API's URL, e.g. "https://api.example.com". Required.
	BaseURL string
	// Header is sent with every request (an Authorization header, say).
	// Optional.
	Header http.Header
	// HTTPClient sends the requests. Optional. Default: a client with a
	// 10 s timeout.
	HTTPClient *http.Client
	// MaxAttempts bounds the attempts of one Send or Get. Optional.
	// Default 6.
	MaxAttempts int
	// MinBackoff is the first retry delay, doubled per attempt. Optional.
	// Default 100ms.
	MinBackoff time.Duration
	// MaxBackoff caps the backoff; a longer Retry-After is still honoured
	// in full (up to a day). Optional. Default 5s.
	MaxBackoff time.Duration
	// Sleep waits for d or until ctx ends. Optional. Default: a timer.
	// Tests inject one to run without real waiting.
	Sleep func(ctx context.Context, d time.Duration) error
	// OnRetry, if set, is called before each retry with the reason; for
	// logs.
	OnRetry func(attempt int, wait time.Duration, reason error)
}

// Client sends requests to one API. It is safe for concurrent use.
type Client struct {
	cfg Config
}

// New returns a Client. It panics if BaseURL is empty.
func New(cfg Config) *Client {
	if cfg.BaseURL == "" {
		panic("client: BaseURL is required")
	}
	cfg.BaseURL = strings.TrimRight(cfg.BaseURL, "/")
	cfg.Header = cfg.Header.Clone() // the caller may reuse its map
	if cfg.HTTPClient == nil {
		cfg.HTTPClient = &http.Client{Timeout: 10 * time.Second}
	}
	if cfg.MaxAttempts <= 0 {
		cfg.MaxAttempts = 6
	}
	if cfg.MinBackoff <= 0 {
		cfg.MinBackoff = 100 * time.Millisecond
	}
	if cfg.MaxBackoff <= 0 {
		cfg.MaxBackoff = 5 * time.Second
	}
	if cfg.Sleep == nil {
		cfg.Sleep = sleep
	}
	return &Client{cfg: cfg}
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Response is a successful (2xx) answer.
type Response struct {
	Status int
	Header http.Header
	Body   []byte
	// Replayed reports that the server answered from its idempotency record
	// (Idempotent-Replayed: true): an earlier attempt already got through.
	Replayed bool
	// Attempts is how many HTTP attempts the call took.
	Attempts int
}

// Decode decodes the answer's JSON body into v.
func (r *Response) Decode(v any) error {
	if err := json.Unmarshal(r.Body, v); err != nil {
		return fmt.Errorf("client: decode answer: %w", err)
	}
	return nil
}

// RetryAfter is the answer's Retry-After: how long the server asks the
// client to wait before it polls (0 if absent).
func (r *Response) RetryAfter() time.Duration { return retryAfter(r.Header) }

// maxBody bounds the body of an answer the client reads.
const maxBody = 64 << 20

// Send sends one business action under the Idempotency-Key requestID:
// method to path with body (JSON-encoded; a []byte is sent as it is, nil
// sends none), retrying transport errors and retryable answers with the same
// id and body. It returns the first 2xx answer — a 202 is the server's
// promise, to be polled with Poll — or the final error: a *Problem for an
// error answer (one matching ErrKeyReused returns at once).
func (c *Client) Send(ctx context.Context, method, path, requestID string, body any) (*Response, error) {
	if err := checkRequestID(requestID); err != nil {
		return nil, err
	}
	var data []byte
	switch b := body.(type) {
	case nil:
	case []byte:
		data = b
	default:
		var err error
		if data, err = json.Marshal(body); err != nil {
			return nil, fmt.Errorf("client: encode request: %w", err)
		}
	}
	return c.do(ctx, method, path, requestID, data, body != nil)
}

// Get reads path, retrying transport errors and retryable answers. An
// error answer is a *Problem.
func (c *Client) Get(ctx context.Context, path string) (*Response, error) {
	return c.do(ctx, http.MethodGet, path, "", nil, false)
}

// Poll reads path until done reports true or an error, and returns the last
// answer: the way to wait for what a 202 promised. It waits first before
// the first read (the 202's RetryAfter, say), then between reads for the
// answer's Retry-After, and never less than a backoff that doubles from
// MinBackoff up to MaxBackoff.
func (c *Client) Poll(ctx context.Context, path string, first time.Duration, done func(*Response) (bool, error)) (*Response, error) {
	wait := first
	backoff := c.cfg.MinBackoff
	for {
		if err := c.cfg.Sleep(ctx, wait); err != nil {
			return nil, fmt.Errorf("client: poll %s: %w", path, err)
		}
		r, err := c.Get(ctx, path)
		if err != nil {
			return nil, err
		}
		ok, err := done(r)
		if err != nil || ok {
			return r, err
		}
		// The backoff is capped; the server's own hint is not: it knows
		// better when the work will have moved on.
		wait = max(r.RetryAfter(), backoff)
		backoff = min(2*backoff, c.cfg.MaxBackoff)
	}
}

// do sends the request until it succeeds, fails for good, or MaxAttempts
// attempts are spent.
func (c *Client) do(ctx context.Context, method, path, requestID string, body []byte, hasBody bool) (*Response, error) {
	backoff := c.cfg.MinBackoff
	for attempt := 1; ; attempt++ {
		r, err := c.once(ctx, method, path, requestID, body, hasBody)
		if err == nil {
			r.Attempts = attempt
			return r, nil
		}
		var hint time.Duration
		retry := false
		var p *Problem
		var t transportError
		switch {
		case errors.As(err, &p):
			hint, retry = p.RetryAfter, p.Retryable()
		case errors.As(err, &t):
			retry = true
		}
		if !retry || attempt >= c.cfg.MaxAttempts || ctx.Err() != nil {
			if errors.As(err, &t) {
				return nil, fmt.Errorf("client: %s %s: gave up after %d attempts: %w", method, path, attempt, t.err)
			}
			return nil, err
		}
		wait := max(hint, backoff)
		backoff = min(2*backoff, c.cfg.MaxBackoff)
		if c.cfg.OnRetry != nil {
			c.cfg.OnRetry(attempt, wait, err)
		}
		if err := c.cfg.Sleep(ctx, wait); err != nil {
			return nil, fmt.Errorf("client: %s %s: %w", method, path, err)
		}
	}
}

// transportError marks an attempt that got no complete answer: worth
// another attempt with the same request id.
type transportError struct{ err error }

func (t transportError) Error() string { return t.err.Error() }
func (t transportError) Unwrap() error { return t.err }

func (c *Client) once(ctx context.Context, method, path, requestID string, body []byte, hasBody bool) (*Response, error) {
	var rd io.Reader
	if hasBody {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.cfg.BaseURL+path, rd)
	if err != nil {
		return nil, fmt.Errorf("client: build request: %w", err)
	}
	for k, vs := range c.cfg.Header {
		req.Header[k] = append([]string(nil), vs...)
	}
	if hasBody {
		req.Header.Set("Content-Type", "application/json")
	}
	if requestID != "" {
		req.Header.Set("Idempotency-Key", keyHeader(requestID))
	}
	resp, err := c.cfg.HTTPClient.Do(req)
	if err != nil {
		return nil, transportError{err}
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return nil, transportError{fmt.Errorf("client: read answer: %w", err)}
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return nil, problemFrom(resp, data)
	}
	return &Response{
		Status:   resp.StatusCode,
		Header:   resp.Header,
		Body:     data,
		Replayed: resp.Header.Get("Idempotent-Replayed") == "true",
	}, nil
}

// checkRequestID refuses an id that no Idempotency-Key can carry: the
// server would answer 400 key_invalid to every attempt.
func checkRequestID(id string) error {
	if id == "" {
		return errors.New("client: Send needs a request id")
	}
	if len(id) > 255 {
		return fmt.Errorf("client: request id of %d bytes; at most 255", len(id))
	}
	for i := 0; i < len(id); i++ {
		if id[i] < 0x20 || id[i] > 0x7e {
			return fmt.Errorf("client: request id %q: only printable ASCII can be sent", id)
		}
	}
	return nil
}

// keyHeader encodes a request id as the Idempotency-Key value: a bare token
// when it is one, else an RFC 8941 sf-string.
func keyHeader(id string) string {
	bare := id != "" && id[0] != '"'
	for i := 0; i < len(id) && bare; i++ {
		bare = id[i] > 0x20 && id[i] < 0x7f
	}
	if bare {
		return id
	}
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(id) + `"`
}

// problemFrom reads an error answer as a *Problem (any body shape).
func problemFrom(resp *http.Response, body []byte) *Problem {
	p := &Problem{}
	if json.Unmarshal(body, p) != nil {
		*p = Problem{Detail: strings.TrimSpace(string(body))}
	}
	p.Status = resp.StatusCode
	if p.Title == "" {
		p.Title = http.StatusText(resp.StatusCode)
	}
	p.RetryAfter = retryAfter(resp.Header)
	p.ShouldRetry = strings.ToLower(strings.TrimSpace(resp.Header.Get("X-Should-Retry")))
	return p
}

// retryAfter parses a Retry-After header given in seconds or as an HTTP
// date (0 if absent or past), capped at a day: a server's typo must not
// park a caller for years, nor overflow a Duration.
func retryAfter(h http.Header) time.Duration {
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0
	}
	if s, err := strconv.ParseInt(v, 10, 64); err == nil {
		if s < 0 {
			return 0
		}
		return time.Duration(min(s, int64(24*time.Hour/time.Second))) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		return min(max(time.Until(t), 0), 24*time.Hour)
	}
	return 0
}
