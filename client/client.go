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
	"math/rand/v2"
	"net/http"
	"net/url"
	"strings"
	"time"
)

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

// ErrAnswerTooLarge matches (errors.Is) the error of a call whose 2xx
// answer is over 64 MiB. The server did what was asked (a Send's action
// took effect); the answer is not returned. Sending the same request again
// under the same id gets the same answer replayed, so it will not help.
var ErrAnswerTooLarge = errors.New("client: answer over 64 MiB")

// maxAnswer bounds the body of an answer the client reads.
const maxAnswer = 64 << 20

// Config configures a Client. The retry policy its defaults make, beside
// the OpenAI and Stripe Go SDKs' choices: docs/client.md.
type Config struct {
	// BaseURL is the API's URL, e.g. "https://api.example.com". Required:
	// an absolute http or https URL, with no query or fragment (a path is
	// joined to it).
	BaseURL string
	// Header is sent with every request (an Authorization header, say),
	// and only to BaseURL's origin. Optional. New panics on a field no
	// request can carry (a token read with its newline), naming the field
	// but not the value.
	Header http.Header
	// HTTPClient sends the requests. Optional. Default: a client with a
	// 10 s timeout. The Client uses a copy whose CheckRedirect follows a
	// redirect only on BaseURL's origin (then as HTTPClient's own
	// CheckRedirect says, by default at most 10): a redirect elsewhere, or
	// past the tenth, is returned as the redirect answer's *Problem, as the
	// request would carry Config.Header, the Idempotency-Key and the body
	// there.
	HTTPClient *http.Client
	// MaxAttempts bounds the attempts of one Send or Get. Optional.
	// Default 6.
	MaxAttempts int
	// MinBackoff is the first retry's backoff, doubled per retry up to
	// MaxBackoff; the wait is drawn at random from [backoff/2, backoff] so
	// that clients that failed together do not retry in lock-step.
	// Optional. Default 100ms.
	MinBackoff time.Duration
	// MaxBackoff caps the backoff, the first too (a MinBackoff above it is
	// cut to it). Optional. Default 5s, or MinBackoff if that is longer.
	MaxBackoff time.Duration
	// MaxRetryAfter is the longest wait a Send or Get takes on an answer's
	// retry-after-ms or Retry-After (when it asks for more than the
	// backoff; the wait is drawn from [hint, 1.25 hint], at most
	// MaxRetryAfter). An answer that asks for longer ends the call at once
	// with its *Problem, whose RetryAfter says how long the server asked
	// for: a wait that long is the caller's to schedule. Poll cuts a 2xx
	// answer's longer Retry-After, and its first wait, to MaxRetryAfter.
	// Optional. Default 1 minute.
	MaxRetryAfter time.Duration
	// PollTimeout bounds one Poll, its waits and reads together: Poll ends
	// with an error matching context.DeadlineExceeded rather than start a
	// wait that would pass it. Optional. Default 10 minutes.
	PollTimeout time.Duration
	// Sleep waits for d or until ctx ends. Optional. Default: a timer.
	// Tests inject one to run without real waiting.
	Sleep func(ctx context.Context, d time.Duration) error
	// OnRetry, if set, is called before each retry with the reason; for
	// logs.
	OnRetry func(attempt int, wait time.Duration, reason error)
}

// Client sends requests to one API. It is safe for concurrent use.
type Client struct {
	cfg  Config
	base *url.URL
	// now and randN are the clock and the jitter's source (a number in
	// [0, n)); tests replace them, and the limits too.
	now                       func() time.Time
	randN                     func(n int64) int64
	maxAnswer, maxRequestBody int
}

// New returns a Client. It panics if BaseURL is not an absolute http or
// https URL, or has a query or a fragment, or if Header holds a field no
// request can carry (a value with a newline, say).
func New(cfg Config) *Client {
	if cfg.BaseURL == "" {
		panic("client: BaseURL is required")
	}
	cfg.BaseURL = strings.TrimRight(cfg.BaseURL, "/")
	base, err := url.Parse(cfg.BaseURL)
	if err != nil || (base.Scheme != "http" && base.Scheme != "https") || base.Host == "" {
		panic(fmt.Sprintf("client: BaseURL %q is no absolute http or https URL", redacted(cfg.BaseURL)))
	}
	if strings.ContainsAny(cfg.BaseURL, "?#") {
		// A path joined to it would land in the query or the fragment.
		panic(fmt.Sprintf("client: BaseURL %q has a query or a fragment; a path is joined to it", redacted(cfg.BaseURL)))
	}
	cfg.Header = cfg.Header.Clone() // the caller may reuse its map
	if err := checkHeader(cfg.Header); err != nil {
		panic(err.Error())
	}
	if cfg.HTTPClient == nil {
		cfg.HTTPClient = &http.Client{Timeout: 10 * time.Second}
	}
	cfg.HTTPClient = onOrigin(cfg.HTTPClient, base)
	if cfg.MaxAttempts <= 0 {
		cfg.MaxAttempts = 6
	}
	if cfg.MinBackoff <= 0 {
		cfg.MinBackoff = 100 * time.Millisecond
	}
	if cfg.MaxBackoff <= 0 {
		cfg.MaxBackoff = max(5*time.Second, cfg.MinBackoff)
	}
	cfg.MinBackoff = min(cfg.MinBackoff, cfg.MaxBackoff)
	if cfg.MaxRetryAfter <= 0 {
		cfg.MaxRetryAfter = time.Minute
	}
	if cfg.PollTimeout <= 0 {
		cfg.PollTimeout = 10 * time.Minute
	}
	if cfg.Sleep == nil {
		cfg.Sleep = sleep
	}
	return &Client{cfg: cfg, base: base, now: time.Now, randN: rand.Int64N, maxAnswer: maxAnswer, maxRequestBody: maxRequestBody}
}

// onOrigin returns a copy of hc that follows a redirect only on base's
// origin, and then as hc's CheckRedirect allows (by default at most 10):
// net/http would copy the request's headers (all but Authorization and Cookie to another
// domain, those too to a subdomain or another port) and its body to any
// Location. A redirect it does not follow is returned as the answer it is.
func onOrigin(hc *http.Client, base *url.URL) *http.Client {
	own := *hc
	check := hc.CheckRedirect
	own.CheckRedirect = func(req *http.Request, via []*http.Request) error {
		switch {
		case !sameOrigin(req.URL, base):
			return http.ErrUseLastResponse
		case check != nil:
			return check(req, via)
		case len(via) >= 10:
			return http.ErrUseLastResponse
		}
		return nil
	}
	return &own
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
	// url is where the answer came from: what a relative Location is
	// resolved against.
	url *url.URL
}

// Decode decodes the answer's JSON body into v.
func (r *Response) Decode(v any) error {
	if err := json.Unmarshal(r.Body, v); err != nil {
		return fmt.Errorf("client: decode answer: %w", err)
	}
	return nil
}

// RetryAfter is the answer's retry-after-ms or Retry-After: how long the
// server asks the client to wait before it polls (0 if absent), at most a
// day.
func (r *Response) RetryAfter() time.Duration { return retryAfter(r.Header) }

// Location is the answer's Location header resolved against the URL the
// answer came from, so an absolute URL ("" if it had none): what Poll and
// Get take, whether the server wrote "https://api.example.com/v1/tasks/t1",
// "/v1/tasks/t1" or "tasks/t1".
func (r *Response) Location() string {
	loc := r.Header.Get("Location")
	if loc == "" || r.url == nil {
		return loc
	}
	u, err := r.url.Parse(loc)
	if err != nil {
		return loc
	}
	return u.String()
}

// Send sends one business action under the Idempotency-Key requestID:
// method to path (a path joined to BaseURL, or an absolute URL on its
// origin, as Get takes it) with body, retrying transport errors
// and retryable answers with the same id and the same bytes. The body is
// sent as it is when a []byte or json.RawMessage, read to its end when an
// io.Reader (at most 64 MiB, held in memory for the retries; the reader is
// not closed, and when ctx ends first Send returns and leaves the reader
// to the Read it is in, as net/http does with a body: close the reader to
// end it), and JSON-encoded otherwise (but a reader passed by value, a
// bytes.Buffer say, is refused: it would encode as {}); nil, an empty
// []byte or json.RawMessage or an empty reader send no body and no
// Content-Type. It returns the first 2xx answer — a 202 is the
// server's promise, to be polled with Poll — or the final error: a *Problem
// for an error answer (one matching ErrKeyReused returns at once), and
// when the context ends or a Retry-After passes MaxRetryAfter, an error
// that wraps the last answer's *Problem too.
func (c *Client) Send(ctx context.Context, method, path, requestID string, body any) (*Response, error) {
	if err := checkRequestID(requestID); err != nil {
		return nil, err
	}
	u, err := c.resolve(path)
	if err != nil {
		return nil, err
	}
	data, err := requestBody(ctx, body, c.maxRequestBody)
	if err != nil {
		return nil, err
	}
	return c.do(ctx, method, u, requestID, data)
}

// Get reads target, retrying transport errors and retryable answers. An
// error answer is a *Problem. target is a path joined to BaseURL
// ("/v1/tasks/t1") or an absolute URL on BaseURL's origin (what
// Response.Location returns); a URL on another origin is refused, as the
// request would carry Config.Header there.
func (c *Client) Get(ctx context.Context, target string) (*Response, error) {
	u, err := c.resolve(target)
	if err != nil {
		return nil, err
	}
	return c.do(ctx, http.MethodGet, u, "", nil)
}

// Poll reads target (as Get takes it) until done reports true or an error,
// and returns the last answer: the way to wait for what a 202 promised
// (Poll(ctx, r.Location(), r.RetryAfter(), done)). It waits first (at most
// MaxRetryAfter) before the first read, then between reads for the
// answer's Retry-After (at most MaxRetryAfter), and never less than a
// jittered backoff that doubles from MinBackoff up to MaxBackoff. It gives
// up with an error matching context.DeadlineExceeded rather than start a
// wait that would pass PollTimeout or the context's deadline. An empty
// target (a 202 without a Location) is refused: Poll does not read BaseURL
// itself.
func (c *Client) Poll(ctx context.Context, target string, first time.Duration, done func(*Response) (bool, error)) (*Response, error) {
	if target == "" {
		return nil, errors.New("client: poll: no target: the answer had no Location header to poll")
	}
	u, err := c.resolve(target)
	if err != nil {
		return nil, err
	}
	end := c.now().Add(c.cfg.PollTimeout)
	ctx, cancel := context.WithTimeout(ctx, c.cfg.PollTimeout) // bounds a read in flight too
	defer cancel()
	wait := min(max(first, 0), c.cfg.MaxRetryAfter) // first is most often a 202's Retry-After
	backoff := c.cfg.MinBackoff
	for {
		now := c.now()
		if now.Add(wait).After(end) {
			return nil, fmt.Errorf("client: poll %s: a wait of %v would pass PollTimeout (%v): %w", redacted(u), wait.Round(time.Millisecond), c.cfg.PollTimeout, context.DeadlineExceeded)
		}
		if err := waitPastDeadline(ctx, now, wait); err != nil {
			return nil, fmt.Errorf("client: poll %s: %w", redacted(u), err)
		}
		if err := c.cfg.Sleep(ctx, wait); err != nil {
			return nil, fmt.Errorf("client: poll %s: %w", redacted(u), err)
		}
		r, err := c.do(ctx, http.MethodGet, u, "", nil)
		if err != nil {
			return nil, err
		}
		ok, err := done(r)
		if err != nil || ok {
			return r, err
		}
		// The backoff is capped by MaxBackoff, the server's hint by
		// MaxRetryAfter: it knows better when the work will have moved on,
		// but a Poll must still come back within reason.
		wait = max(c.hintWait(min(r.RetryAfter(), c.cfg.MaxRetryAfter)), c.backoffWait(backoff))
		backoff = c.nextBackoff(backoff)
	}
}

// resolve returns the URL a call sends to for target: a path ("" for
// BaseURL itself) is joined to BaseURL (its path prefix kept); an absolute
// URL must be on BaseURL's origin.
func (c *Client) resolve(target string) (string, error) {
	if target == "" || (strings.HasPrefix(target, "/") && !strings.HasPrefix(target, "//")) {
		return c.cfg.BaseURL + target, nil
	}
	u, err := url.Parse(target)
	if err != nil {
		// Not a *url.Error itself: it quotes the whole target, a password
		// too.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return "", fmt.Errorf("client: target is neither a path (/...) nor an absolute URL: %w", err)
	}
	if !u.IsAbs() {
		return "", fmt.Errorf("client: %q is neither a path (/...) nor an absolute URL; Response.Location resolves a Location header", u.Redacted())
	}
	if !sameOrigin(u, c.base) {
		return "", fmt.Errorf("client: %s is not on the API's origin %s://%s: Config.Header is sent there only", u.Redacted(), c.base.Scheme, c.base.Host)
	}
	return u.String(), nil
}

// redacted is URL u for an error message: its password, if any, shown as
// "xxxxx" (url.URL.Redacted), as errors end up in logs.
func redacted(u string) string {
	if parsed, err := url.Parse(u); err == nil {
		return parsed.Redacted()
	}
	return u
}

// sameOrigin reports whether a and b share scheme, host and port.
func sameOrigin(a, b *url.URL) bool {
	return strings.EqualFold(a.Scheme, b.Scheme) && strings.EqualFold(a.Hostname(), b.Hostname()) && port(a) == port(b)
}

func port(u *url.URL) string {
	if p := u.Port(); p != "" {
		return p
	}
	if strings.EqualFold(u.Scheme, "https") {
		return "443"
	}
	return "80"
}

// do sends the request until it succeeds, fails for good, or MaxAttempts
// attempts are spent. An error that ends it early (the context, a long
// Retry-After) wraps the last answer's *Problem too.
func (c *Client) do(ctx context.Context, method, u, requestID string, body []byte) (*Response, error) {
	backoff := c.cfg.MinBackoff
	var last *Problem // the last error answer: kept when a later step fails
	for attempt := 1; ; attempt++ {
		r, err := c.once(ctx, method, u, requestID, body)
		if err == nil {
			r.Attempts = attempt
			return r, nil
		}
		gaveUp := func(why error) error {
			if last != nil && !errors.Is(why, last) {
				return fmt.Errorf("client: %s %s: gave up after %d attempts: %w (last answer: %w)", method, redacted(u), attempt, why, last)
			}
			return fmt.Errorf("client: %s %s: gave up after %d attempts: %w", method, redacted(u), attempt, why)
		}
		var hint time.Duration
		retry := false
		var p *Problem
		var t transportError
		switch {
		case errors.As(err, &p):
			hint, retry, last = p.RetryAfter, p.Retryable(), p
		case errors.As(err, &t):
			retry, err = true, t.err
		}
		switch {
		case !retry:
			return nil, err
		case ctx.Err() != nil && p != nil:
			return nil, gaveUp(ctx.Err())
		case ctx.Err() != nil && !errors.Is(err, ctx.Err()):
			return nil, gaveUp(fmt.Errorf("%w (%w)", ctx.Err(), err))
		case ctx.Err() != nil:
			return nil, gaveUp(err)
		case attempt >= c.cfg.MaxAttempts && p != nil:
			return nil, p
		case attempt >= c.cfg.MaxAttempts:
			return nil, gaveUp(err)
		case hint > c.cfg.MaxRetryAfter:
			return nil, fmt.Errorf("client: %s %s: the server asks for a retry after %v, longer than MaxRetryAfter (%v): %w", method, redacted(u), hint.Round(time.Second), c.cfg.MaxRetryAfter, p)
		}
		wait := max(c.hintWait(hint), c.backoffWait(backoff))
		backoff = c.nextBackoff(backoff)
		if why := waitPastDeadline(ctx, c.now(), wait); why != nil {
			if p == nil {
				why = fmt.Errorf("%w, and %w", err, why)
			}
			return nil, gaveUp(why)
		}
		if c.cfg.OnRetry != nil {
			c.cfg.OnRetry(attempt, wait, err)
		}
		if why := c.cfg.Sleep(ctx, wait); why != nil {
			return nil, gaveUp(why)
		}
	}
}

// transportError marks an attempt that got no complete answer: worth
// another attempt with the same request id.
type transportError struct{ err error }

func (t transportError) Error() string { return t.err.Error() }
func (t transportError) Unwrap() error { return t.err }

func (c *Client) once(ctx context.Context, method, u, requestID string, body []byte) (*Response, error) {
	var rd io.Reader
	if len(body) > 0 {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return nil, fmt.Errorf("client: build request: %w", err)
	}
	for k, vs := range c.cfg.Header {
		req.Header[k] = append([]string(nil), vs...)
	}
	if len(body) > 0 {
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
	// One byte past the limit tells a cut answer from one of exactly 64 MiB.
	data, err := io.ReadAll(io.LimitReader(resp.Body, int64(c.maxAnswer)+1))
	if err != nil {
		return nil, transportError{fmt.Errorf("client: read answer: %w", err)}
	}
	ok := resp.StatusCode >= 200 && resp.StatusCode <= 299
	if !ok {
		return nil, problemFrom(resp, data[:min(len(data), c.maxAnswer)])
	}
	if len(data) > c.maxAnswer {
		return nil, fmt.Errorf("client: %s %s: answered %d: %w", method, redacted(u), resp.StatusCode, ErrAnswerTooLarge)
	}
	return &Response{
		Status:   resp.StatusCode,
		Header:   resp.Header,
		Body:     data,
		Replayed: resp.Header.Get("Idempotent-Replayed") == "true",
		url:      resp.Request.URL,
	}, nil
}

// checkHeader refuses a header net/http cannot send: a field name that is
// no token, a value with a control character (but tab). It names the
// field, never the value (a credential, often).
func checkHeader(h http.Header) error {
	for name, values := range h {
		if name == "" || strings.IndexFunc(name, func(r rune) bool { return !isTokenChar(r) }) >= 0 {
			return fmt.Errorf("client: Config.Header field name %q is no token", name)
		}
		for _, v := range values {
			if strings.IndexFunc(v, func(r rune) bool { return (r < ' ' && r != '\t') || r == 0x7f }) >= 0 {
				return fmt.Errorf("client: Config.Header %s has a value with a control character (a newline?), which no request can carry", name)
			}
		}
	}
	return nil
}

// isTokenChar reports whether r may appear in a field name (RFC 9110 tchar).
func isTokenChar(r rune) bool {
	return r < 0x7f && (r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("!#$%&'*+-.^_`|~", r))
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
