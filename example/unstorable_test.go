package main

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// Input Postgres cannot store (a NUL, invalid UTF-8) anywhere a client
// controls it, in the body, the path, the token's claims or the
// Idempotency-Key, is a 4xx before anything is stored: never a 5xx that
// asks for the same request again.
func TestUnstorableInputIsAnswered4xx(t *testing.T) {
	t.Parallel()
	n := newTaskNode(t)
	tests := []struct {
		name         string
		tenant, user string
		method, path string
		key, body    string
	}{
		{name: "client note NUL", tenant: "acme", user: "alice", method: http.MethodPost, path: "/v1/images", key: "u1",
			body: `{"prompt":"a cat","client_note":"x\u0000y"}`},
		{name: "aspect ratio NUL", tenant: "acme", user: "alice", method: http.MethodPost, path: "/v1/images", key: "u2",
			body: `{"prompt":"a cat","aspect_ratio":"1:1\u0000"}`},
		{name: "tenant claim NUL", tenant: "ac\x00me", user: "alice", method: http.MethodPost, path: "/v1/images", key: "u3",
			body: `{"prompt":"a cat"}`},
		{name: "user claim NUL", tenant: "acme", user: "al\x00ice", method: http.MethodPost, path: "/v1/music", key: "u4",
			body: `{"prompt":"a tune"}`},
		{name: "tenant claim invalid UTF-8", tenant: "ac\xffme", user: "alice", method: http.MethodPost, path: "/v1/images", key: "u5",
			body: `{"prompt":"a cat"}`},
		{name: "key invalid UTF-8", tenant: "acme", user: "alice", method: http.MethodPost, path: "/v1/images", key: "k\xff\xfe",
			body: `{"prompt":"a cat"}`},
		{name: "key NUL", tenant: "acme", user: "alice", method: http.MethodPost, path: "/v1/music", key: "k\x00",
			body: `{"prompt":"a tune"}`},
		{name: "task id NUL", tenant: "acme", user: "alice", method: http.MethodGet, path: "/v1/tasks/%00"},
		{name: "task id invalid UTF-8", tenant: "acme", user: "alice", method: http.MethodGet, path: "/v1/tasks/%FF"},
		{name: "cancel id NUL", tenant: "acme", user: "alice", method: http.MethodPost, path: "/v1/tasks/a%00b/cancel"},
		{name: "recover id NUL", tenant: "acme", user: "alice", method: http.MethodPost, path: "/v1/tasks/a%00b/recover"},
		{name: "export id NUL", tenant: "acme", user: "alice", method: http.MethodPost, path: "/v1/tasks/%00/export", key: "u6"},
		{name: "export id invalid UTF-8", tenant: "acme", user: "alice", method: http.MethodPost, path: "/v1/tasks/%C3%28/export", key: "u7"},
		{name: "queue as NUL tenant", tenant: "a\x00", user: "alice", method: http.MethodGet, path: "/v1/queue"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tok, err := mintToken(n.secret, tt.tenant, tt.user, time.Now(), time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			req := httptest.NewRequest(tt.method, tt.path, strings.NewReader(tt.body))
			req.Header.Set("Authorization", "Bearer "+tok)
			if tt.body != "" {
				req.Header.Set("Content-Type", "application/json")
			}
			if tt.key != "" {
				req.Header["Idempotency-Key"] = []string{tt.key}
			}
			rec := httptest.NewRecorder()
			n.e.ServeHTTP(rec, req)
			// A 200 from the queue is fine: it stores nothing.
			if rec.Code >= 500 {
				t.Errorf("%d %s; want a 4xx (or the queue's 200)", rec.Code, rec.Body)
			}
		})
	}
}
