// Package imageclient is the Go client of the example image service, built
// on github.com/idemgate/idemgate/client: it is what a team writes for its
// own API on top of that package. RequestID names the business action and
// digests the parameters the server fingerprints; SubmitImages sends the
// action under that id and retries it safely; Wait polls the task the 202
// names.
package imageclient

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/idemgate/idemgate/client"
)

// ErrKeyReused matches (errors.Is) the *Problem of a key_reused answer: the
// request id was already used for different parameters.
var ErrKeyReused = client.ErrKeyReused

// ErrTaskFailed matches (errors.Is) the error Wait returns for a task that
// ended failed. Only then may the caller submit again under a new id.
var ErrTaskFailed = errors.New("imageclient: task failed")

// Problem is an error answer from the service.
type Problem = client.Problem

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
// fingerprinted parameters. ClientNote does not take part.
func RequestID(action string, req ImageRequest) string {
	return client.RequestID(action, req.Prompt, req.AspectRatio, req.N, req.ReferenceImage)
}

// Submission is the server's answer to a submit: the task to poll.
type Submission struct {
	TaskID string
	Status string
	// PollAfter is how long the server asks the client to wait before polling.
	PollAfter time.Duration
	// Location is the task's URL path.
	Location string
	// Replayed reports that the server answered from its idempotency record:
	// an earlier attempt already got through.
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
			return nil, fmt.Errorf("imageclient: image %d is not a PNG data URL", i)
		}
		b, err := base64.StdEncoding.DecodeString(u[len(prefix):])
		if err != nil {
			return nil, fmt.Errorf("imageclient: image %d: %w", i, err)
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
	// HTTPClient, MaxAttempts, MinBackoff, MaxBackoff, Sleep and OnRetry
	// are client.Config's. Optional.
	HTTPClient  *http.Client
	MaxAttempts int
	MinBackoff  time.Duration
	MaxBackoff  time.Duration
	Sleep       func(ctx context.Context, d time.Duration) error
	OnRetry     func(attempt int, wait time.Duration, reason error)
}

// Client talks to the example service. It is safe for concurrent use.
type Client struct {
	c          *client.Client
	sleep      func(ctx context.Context, d time.Duration) error
	minBackoff time.Duration
	maxBackoff time.Duration
}

// New returns a Client. It panics if BaseURL or Token is empty.
func New(cfg Config) *Client {
	if cfg.BaseURL == "" || cfg.Token == "" {
		panic("imageclient: BaseURL and Token are required")
	}
	cc := client.Config{
		BaseURL:     cfg.BaseURL,
		Header:      http.Header{"Authorization": {"Bearer " + cfg.Token}},
		HTTPClient:  cfg.HTTPClient,
		MaxAttempts: cfg.MaxAttempts,
		MinBackoff:  cfg.MinBackoff,
		MaxBackoff:  cfg.MaxBackoff,
		Sleep:       cfg.Sleep,
		OnRetry:     cfg.OnRetry,
	}
	c := &Client{c: client.New(cc), sleep: cfg.Sleep, minBackoff: cfg.MinBackoff, maxBackoff: cfg.MaxBackoff}
	if c.sleep == nil {
		c.sleep = sleep
	}
	if c.minBackoff <= 0 {
		c.minBackoff = 100 * time.Millisecond
	}
	if c.maxBackoff <= 0 {
		c.maxBackoff = 5 * time.Second
	}
	return c
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
	r, err := c.c.Send(ctx, http.MethodPost, "/v1/images", requestID, req)
	if err != nil {
		return Submission{}, err
	}
	var out struct {
		TaskID      string `json:"task_id"`
		Status      string `json:"status"`
		PollAfterMS int64  `json:"poll_after_ms"`
	}
	if err := r.Decode(&out); err != nil {
		return Submission{}, fmt.Errorf("imageclient: submit answer: %w", err)
	}
	return Submission{
		TaskID:    out.TaskID,
		Status:    out.Status,
		PollAfter: max(time.Duration(out.PollAfterMS)*time.Millisecond, r.RetryAfter()),
		Location:  r.Header.Get("Location"),
		Replayed:  r.Replayed,
		Attempts:  r.Attempts,
	}, nil
}

// Task fetches the task's current state once (retrying transport errors).
func (c *Client) Task(ctx context.Context, taskID string) (Task, error) {
	r, err := c.c.Get(ctx, "/v1/tasks/"+url.PathEscape(taskID))
	if err != nil {
		return Task{}, err
	}
	var out struct {
		Task
		PollAfterMS int64 `json:"poll_after_ms"`
	}
	if err := r.Decode(&out); err != nil {
		return Task{}, fmt.Errorf("imageclient: task: %w", err)
	}
	t := out.Task
	t.PollAfter = max(time.Duration(out.PollAfterMS)*time.Millisecond, r.RetryAfter())
	return t, nil
}

// Wait polls the same task until it finishes, first after `first` (the
// submit's PollAfter), then as the server asks (poll_after_ms, Retry-After,
// honoured in full), never faster than a backoff that doubles up to
// MaxBackoff. A failed task returns the task and an error matching
// ErrTaskFailed. (client.Poll does the same with Retry-After alone; the
// service's poll_after_ms is finer than Retry-After's whole seconds.)
func (c *Client) Wait(ctx context.Context, taskID string, first time.Duration) (Task, error) {
	wait := first
	backoff := c.minBackoff
	for {
		if err := c.sleep(ctx, wait); err != nil {
			return Task{}, fmt.Errorf("imageclient: wait for task %s: %w", taskID, err)
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
		wait = max(t.PollAfter, backoff)
		backoff = min(2*backoff, c.maxBackoff)
	}
}
