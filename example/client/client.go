// Package client is a small Go client for the example image service that
// follows idemgate's three client rules:
//
//  1. The request id names the business action and stays the same across
//     retries: every retry of a submit — after a timeout, a dropped
//     connection, a 5xx — reuses the id it started with.
//  2. Changed parameters need a new id. RequestID derives the id from the
//     business action and the parameters that matter, so rewording a prompt
//     yields a new id by construction.
//  3. A key_reused conflict is a decision for the caller: it comes back as a
//     *Problem matching ErrKeyReused and is never retried. A 202 or a task
//     still in progress means "poll the same task id", honouring the
//     server's Retry-After / poll_after_ms; the client never resubmits under
//     a new id on its own.
//
// Transport errors and retryable answers (5xx, 408, 425, 429 and 409
// request_in_progress) are retried with the same id and a capped
// exponential backoff; every wait honours the server's Retry-After when it
// asks for longer.
package client

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/idemgate/idemgate/middleware"
)

// ErrKeyReused matches (errors.Is) a *Problem with code key_reused: the
// request id was already used for different parameters. Pick a new id if the
// new parameters are what you want; never retry the same request.
var ErrKeyReused = errors.New("client: request id already used with other parameters")

// ErrTaskFailed matches (errors.Is) the error Wait returns for a task that
// ended failed. Only then may the caller submit again under a new id.
var ErrTaskFailed = errors.New("client: task failed")

// Problem is an application/problem+json (RFC 9457) answer from the server.
type Problem struct {
	Status int    `json:"status"`
	Type   string `json:"type"`
	Title  string `json:"title"`
	Detail string `json:"detail"`
	Code   string `json:"code"`
	// Changed names the fields (JSON Pointers) whose values differ from
	// the request that first used the key, when the server can tell
	// (key_reused only; names, never values).
	Changed    []string      `json:"changed,omitempty"`
	RetryAfter time.Duration `json:"-"`
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
	return target == ErrKeyReused && p.Code == string(middleware.CodeKeyReused)
}

// ImageRequest is the body of POST /v1/images. Prompt, AspectRatio, N and
// ReferenceImage are the parameters the server fingerprints; ClientNote is
// not one of them, so it may change between retries.
type ImageRequest struct {
	Prompt         string `json:"prompt"`
	AspectRatio    string `json:"aspect_ratio,omitempty"`
	N              int    `json:"n,omitempty"`
	ReferenceImage string `json:"reference_image,omitempty"`
	ClientNote     string `json:"client_note,omitempty"`
}

// RequestID returns the request id for one business action with these
// parameters: action (say "poster:launch-2026") followed by a digest of the
// fingerprinted parameters. The same action and parameters give the same id
// on every retry (rule 1); changed parameters give a new id (rule 2).
// ClientNote does not take part.
func RequestID(action string, req ImageRequest) string {
	b, _ := json.Marshal([]any{req.Prompt, req.AspectRatio, req.N, req.ReferenceImage})
	sum := sha256.Sum256(b)
	return action + ":" + hex.EncodeToString(sum[:8])
}

// Submission is the server's answer to a submit: the task to poll.
type Submission struct {
	TaskID string
	Status string
	// PollAfter is how long the server asks the client to wait before polling.
	PollAfter time.Duration
	// Location is the task's URL path.
	Location string
	// Replayed reports that the server answered from its idempotency record
	// (the Idempotent-Replayed header): an earlier attempt already got through.
	Replayed bool
	// Attempts is how many HTTP attempts the submit took.
	Attempts int
}

// Task is the state of a task as GET /v1/tasks/{id} projects it.
type Task struct {
	ID     string `json:"task_id"`
	Status string `json:"status"`
	// PollAfter is set while the task is not finished.
	PollAfter time.Duration `json:"-"`
	// Images are data URLs of PNG images; set only when Status is "succeeded".
	Images []string `json:"images,omitempty"`
	// Error is set only when Status is "failed".
	Error string `json:"error,omitempty"`
}

// Done reports whether the task reached a terminal status.
func (t Task) Done() bool { return t.Status == "succeeded" || t.Status == "failed" }

// PNGs decodes the task's image data URLs.
func (t Task) PNGs() ([][]byte, error) {
	out := make([][]byte, 0, len(t.Images))
	for i, u := range t.Images {
		const prefix = "data:image/png;base64,"
		if !strings.HasPrefix(u, prefix) {
			return nil, fmt.Errorf("client: image %d is not a PNG data URL", i)
		}
		b, err := base64.StdEncoding.DecodeString(u[len(prefix):])
		if err != nil {
			return nil, fmt.Errorf("client: image %d: %w", i, err)
		}
		out = append(out, b)
	}
	return out, nil
}

// Config configures a Client.
type Config struct {
	// BaseURL is the service's URL, e.g. "http://localhost:8080". Required.
	BaseURL string
	// Token is the bearer token (an HS256 JWT with tenant and sub). Required.
	Token string
	// HTTPClient sends the requests. Optional. Default: a client with a 10 s timeout.
	HTTPClient *http.Client
	// MaxAttempts bounds the attempts of one submit or one poll. Optional. Default 6.
	MaxAttempts int
	// MinBackoff is the first retry delay, doubled per attempt. Optional. Default 100ms.
	MinBackoff time.Duration
	// MaxBackoff caps a retry or poll delay. Optional. Default 5s.
	MaxBackoff time.Duration
	// Sleep waits for d or until ctx ends. Optional. Default: a timer. Tests
	// inject one to run without real waiting.
	Sleep func(ctx context.Context, d time.Duration) error
	// OnRetry, if set, is called before each retry with the reason; for logs.
	OnRetry func(attempt int, wait time.Duration, reason error)
}

// Client talks to the example service. It is safe for concurrent use.
type Client struct {
	cfg Config
}

// New returns a Client. It panics if BaseURL or Token is empty.
func New(cfg Config) *Client {
	if cfg.BaseURL == "" || cfg.Token == "" {
		panic("client: BaseURL and Token are required")
	}
	cfg.BaseURL = strings.TrimRight(cfg.BaseURL, "/")
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

// GenerateImages submits req under requestID and waits for the task to
// finish: the whole business action, safe to call again with the same
// requestID after any failure (it replays to the same task).
func (c *Client) GenerateImages(ctx context.Context, requestID string, req ImageRequest) (Task, error) {
	sub, err := c.SubmitImages(ctx, requestID, req)
	if err != nil {
		return Task{}, err
	}
	return c.Wait(ctx, sub.TaskID, sub.PollAfter)
}

// SubmitImages sends POST /v1/images with Idempotency-Key: requestID,
// retrying transport errors and retryable answers with the same id. A
// key_reused answer returns at once as a *Problem matching ErrKeyReused.
func (c *Client) SubmitImages(ctx context.Context, requestID string, req ImageRequest) (Submission, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return Submission{}, fmt.Errorf("client: encode request: %w", err)
	}
	var sub Submission
	err = c.retry(ctx, "submit", func(attempt int) error {
		sub.Attempts = attempt
		hreq, err := c.newRequest(ctx, http.MethodPost, "/v1/images", body)
		if err != nil {
			return err
		}
		hreq.Header.Set("Idempotency-Key", keyHeader(requestID))
		resp, err := c.cfg.HTTPClient.Do(hreq)
		if err != nil {
			return retryable{err}
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusAccepted {
			return problemFrom(resp)
		}
		var out struct {
			TaskID      string `json:"task_id"`
			Status      string `json:"status"`
			PollAfterMS int64  `json:"poll_after_ms"`
		}
		if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&out); err != nil {
			return retryable{fmt.Errorf("client: decode submit answer: %w", err)}
		}
		sub.TaskID, sub.Status = out.TaskID, out.Status
		sub.PollAfter = max(time.Duration(out.PollAfterMS)*time.Millisecond, retryAfter(resp.Header))
		sub.Location = resp.Header.Get("Location")
		sub.Replayed = resp.Header.Get("Idempotent-Replayed") == "true"
		return nil
	})
	return sub, err
}

// Task fetches the task's current state once (retrying transport errors).
func (c *Client) Task(ctx context.Context, taskID string) (Task, error) {
	var t Task
	err := c.retry(ctx, "get task", func(int) error {
		hreq, err := c.newRequest(ctx, http.MethodGet, "/v1/tasks/"+url.PathEscape(taskID), nil)
		if err != nil {
			return err
		}
		resp, err := c.cfg.HTTPClient.Do(hreq)
		if err != nil {
			return retryable{err}
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return problemFrom(resp)
		}
		var out struct {
			Task
			PollAfterMS int64 `json:"poll_after_ms"`
		}
		if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(&out); err != nil {
			return retryable{fmt.Errorf("client: decode task: %w", err)}
		}
		t = out.Task
		t.PollAfter = max(time.Duration(out.PollAfterMS)*time.Millisecond, retryAfter(resp.Header))
		return nil
	})
	return t, err
}

// Wait polls the same task until it finishes, first after `first` (the
// submit's PollAfter), then as the server asks (poll_after_ms, Retry-After,
// honoured in full), never faster than a backoff that doubles up to MaxBackoff. A failed task
// returns the task and an error matching ErrTaskFailed.
func (c *Client) Wait(ctx context.Context, taskID string, first time.Duration) (Task, error) {
	wait := first
	backoff := c.cfg.MinBackoff
	for {
		if err := c.cfg.Sleep(ctx, wait); err != nil {
			return Task{}, fmt.Errorf("client: wait for task %s: %w", taskID, err)
		}
		t, err := c.Task(ctx, taskID)
		if err != nil {
			return Task{}, err
		}
		switch t.Status {
		case "succeeded":
			return t, nil
		case "failed":
			return t, fmt.Errorf("%w: %s", ErrTaskFailed, t.Error)
		}
		// The backoff is capped; the server's own hint is not: it knows
		// better when the task will have moved on.
		wait = max(t.PollAfter, backoff)
		backoff = min(2*backoff, c.cfg.MaxBackoff)
	}
}

func (c *Client) newRequest(ctx context.Context, method, path string, body []byte) (*http.Request, error) {
	var r io.Reader
	if body != nil {
		r = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.cfg.BaseURL+path, r)
	if err != nil {
		return nil, fmt.Errorf("client: build request: %w", err)
	}
	req.Header.Set("Authorization", "Bearer "+c.cfg.Token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	return req, nil
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

// retryable marks an error worth another attempt with the same request id.
type retryable struct{ err error }

func (r retryable) Error() string { return r.err.Error() }
func (r retryable) Unwrap() error { return r.err }

// retry runs do until it succeeds, returns a final error, or MaxAttempts
// attempts are spent. The wait before each retry is a backoff that doubles
// from MinBackoff up to MaxBackoff, or the server's Retry-After when longer.
func (c *Client) retry(ctx context.Context, what string, do func(attempt int) error) error {
	backoff := c.cfg.MinBackoff
	for attempt := 1; ; attempt++ {
		err := do(attempt)
		if err == nil {
			return nil
		}
		hint, ok := shouldRetry(err)
		if !ok || attempt >= c.cfg.MaxAttempts || ctx.Err() != nil {
			if r, isTransport := err.(retryable); isTransport {
				return fmt.Errorf("client: %s: gave up after %d attempts: %w", what, attempt, r.err)
			}
			return err
		}
		wait := max(hint, backoff)
		backoff = min(2*backoff, c.cfg.MaxBackoff)
		if c.cfg.OnRetry != nil {
			c.cfg.OnRetry(attempt, wait, err)
		}
		if err := c.cfg.Sleep(ctx, wait); err != nil {
			return fmt.Errorf("client: %s: %w", what, err)
		}
	}
}

// shouldRetry reports whether err is worth another attempt with the same id,
// and the minimum wait the server asked for.
func shouldRetry(err error) (time.Duration, bool) {
	var p *Problem
	if errors.As(err, &p) {
		switch {
		case p.Code == string(middleware.CodeKeyReused):
			return 0, false // rule 3: a decision for the caller
		case p.Status == http.StatusConflict && p.Code == string(middleware.CodeRequestInProgress),
			p.Status >= 500, p.Status == http.StatusRequestTimeout,
			p.Status == http.StatusTooEarly, p.Status == http.StatusTooManyRequests:
			return p.RetryAfter, true
		}
		return 0, false
	}
	var r retryable
	return 0, errors.As(err, &r)
}

// problemFrom reads an error answer as a *Problem (any body shape).
func problemFrom(resp *http.Response) error {
	p := &Problem{Status: resp.StatusCode}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if json.Unmarshal(b, p) != nil || p.Status == 0 {
		p.Status = resp.StatusCode
		p.Detail = strings.TrimSpace(string(b))
	}
	p.Status = resp.StatusCode
	if p.Title == "" {
		p.Title = http.StatusText(resp.StatusCode)
	}
	p.RetryAfter = retryAfter(resp.Header)
	return p
}

// retryAfter parses a Retry-After header given in seconds (0 if absent).
func retryAfter(h http.Header) time.Duration {
	s, err := strconv.Atoi(strings.TrimSpace(h.Get("Retry-After")))
	if err != nil || s < 0 {
		return 0
	}
	return time.Duration(s) * time.Second
}
