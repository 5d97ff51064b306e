package main

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/labstack/echo/v4"
	"github.com/redis/go-redis/v9"

	"github.com/idemgate/idemgate/middleware"
	"github.com/idemgate/idemgate/pgstore"
	"github.com/idemgate/idemgate/redisstore"
)

// A task scheduled for later is polled at its time, not every second; a
// task to run now keeps the usual hint.
func TestPollHintHonoursRunAfter(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		given    pgstore.Task
		min, max time.Duration
	}{
		{"scheduled in an hour", pgstore.Task{State: pgstore.StatePending, RunAfter: time.Now().Add(time.Hour)},
			59 * time.Minute, time.Hour},
		{"runs now", pgstore.Task{State: pgstore.StatePending, RunAfter: time.Now().Add(-time.Minute)},
			time.Second, time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v, err := viewOf(tt.given)
			if err != nil {
				t.Fatal(err)
			}
			if got := time.Duration(v.PollAfterMS) * time.Millisecond; got < tt.min || got > tt.max {
				t.Fatalf("poll_after_ms = %d, want between %v and %v", v.PollAfterMS, tt.min, tt.max)
			}
		})
	}
}

func TestImageRequestValidate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		given   imageRequest
		want    imageParams
		wantErr bool
	}{
		{name: "defaults", given: imageRequest{Prompt: "a cat"}, want: imageParams{Prompt: "a cat", AspectRatio: "1:1", N: 1}},
		{name: "all fields", given: imageRequest{Prompt: "a cat", AspectRatio: ptr("9:16"), N: ptr(4),
			ReferenceImage: "https://example.com/ref.png", ClientNote: "hi"},
			want: imageParams{Prompt: "a cat", AspectRatio: "9:16", N: 4, ReferenceImage: "https://example.com/ref.png"}},
		{name: "blank prompt", given: imageRequest{Prompt: "  "}, wantErr: true},
		{name: "explicit n 0", given: imageRequest{Prompt: "a cat", N: ptr(0)}, wantErr: true},
		{name: "n 5", given: imageRequest{Prompt: "a cat", N: ptr(5)}, wantErr: true},
		{name: "unknown aspect", given: imageRequest{Prompt: "a cat", AspectRatio: ptr("2:1")}, wantErr: true},
		{name: "reference not a URL", given: imageRequest{Prompt: "a cat", ReferenceImage: "/etc/passwd"}, wantErr: true},
		{name: "reference data URL", given: imageRequest{Prompt: "a cat", ReferenceImage: "data:image/png;base64,AA=="},
			want: imageParams{Prompt: "a cat", AspectRatio: "1:1", N: 1, ReferenceImage: "data:image/png;base64,AA=="}},
		{name: "invalid UTF-8", given: imageRequest{Prompt: "a \xff cat"}, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := tt.given.validate()
			if tt.wantErr {
				var p *problem
				if !errors.As(err, &p) || p.Status != http.StatusBadRequest {
					t.Fatalf("validate() error = %v, want a 400 problem", err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("validate() = %+v, %v; want %+v", got, err, tt.want)
			}
		})
	}
}

// Retry-After and poll_after_ms tell a client the same wait, however far
// away the task's start is: a task scheduled centuries ahead (RunAfter is
// accepted up to year 9999) must not overflow into "poll every second".
func TestRetryAfterAgreesWithPollHint(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		given time.Time
	}{
		{"in an hour", time.Now().Add(time.Hour)},
		{"after year 2318", time.Date(2400, 1, 1, 0, 0, 0, 0, time.UTC)},
		{"year 9999", time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v, err := viewOf(pgstore.Task{State: pgstore.StatePending, RunAfter: tt.given})
			if err != nil {
				t.Fatal(err)
			}
			got, err := strconv.ParseInt(retryAfter(v.PollAfterMS), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			if want := (v.PollAfterMS + 999) / 1000; got != want {
				t.Fatalf("Retry-After = %d s, poll_after_ms = %d: want %d s", got, v.PollAfterMS, want)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

// A NUL in a text field can never be stored (Postgres refuses it), so it
// is a 400 before anything is stored, never a 503 "retry".
func TestSubmitRefusesNUL(t *testing.T) {
	t.Parallel()
	n := newTaskNode(t)
	tests := []struct {
		name  string
		given string // path
		when  string // body
	}{
		{name: "prompt", given: "/v1/images", when: `{"prompt":"a cat\u0000"}`},
		{name: "reference image", given: "/v1/images", when: `{"prompt":"a cat","reference_image":"https://example.com/\u0000.png"}`},
		{name: "music prompt", given: "/v1/music", when: `{"prompt":"a \u0000 tune"}`},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, v := n.do(t, "alice", http.MethodPost, tt.given, "nul:"+strconv.Itoa(i), tt.when)
			if code != http.StatusBadRequest || v["code"] != "invalid_request" {
				t.Errorf("%s: %d %v; want 400 invalid_request", tt.when, code, v)
			}
		})
	}
	var stored int
	if err := n.b.pool.QueryRow(context.Background(), `SELECT count(*) FROM idemgate_tasks`).Scan(&stored); err != nil || stored != 0 {
		t.Errorf("%d tasks stored (%v); want none", stored, err)
	}
}

// What the API's own checks miss but pgstore refuses is a 400 too, never
// a 503: parameters handed to submit without the route's validation
// stand in for a check the API forgot.
func TestSubmitAnswersInvalidTaskAs400(t *testing.T) {
	t.Parallel()
	n := newTaskNode(t)
	a := &api{store: n.b.store, pool: n.b.pool, logger: slog.New(slog.DiscardHandler)}
	e := echo.New()
	e.HTTPErrorHandler = errorHandler(a.logger)
	e.POST("/", func(c echo.Context) error {
		return a.submit(c, imageParams{Prompt: "a\x00cat", AspectRatio: "1:1", N: 1})
	},
		middleware.New(middleware.Config{Store: redisstore.New(redis.NewClient(&redis.Options{Addr: miniredis.RunT(t).Addr()})),
			Scope: func(echo.Context) (string, string, error) { return "acme", "alice", nil }, Kind: kindImages, Required: true}))
	req := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(`{}`))
	req.Header.Set("Idempotency-Key", "k")
	rec := httptest.NewRecorder()
	e.ServeHTTP(rec, req)
	if rec.Code != http.StatusBadRequest || !strings.Contains(rec.Body.String(), "invalid_request") {
		t.Fatalf("%d %s; want 400 invalid_request", rec.Code, rec.Body)
	}
}
