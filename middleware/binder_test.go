package middleware_test

import (
	"bytes"
	"io"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/labstack/echo/v4"
	"github.com/redis/go-redis/v9"

	"github.com/idemgate/idemgate/fingerprint"
	"github.com/idemgate/idemgate/middleware"
)

// Tests through echo's DefaultBinder: what the handler binds is what the
// fingerprint covers, so a retry is never replayed with another request's
// answer.

// task is what the handlers bind.
type task struct {
	Prompt string `json:"prompt" form:"prompt"`
	N      int    `json:"n" form:"n"`
	Size   string `json:"size" form:"size"`
}

// binderEnv serves POST /v1/tasks: Bind, then answer what was bound.
func binderEnv(t *testing.T, spec fingerprint.Spec) *env {
	t.Helper()
	mr := miniredis.RunT(t)
	client := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { client.Close() })
	v := &env{e: echo.New(), mr: mr, client: client, store: middleware.NewRedisStore(client), events: &recorder{}}
	mw := middleware.New(middleware.Config{Store: v.store, Scope: testScope, Fingerprint: spec, OnEvent: v.events.add})
	v.e.POST("/v1/tasks", func(c echo.Context) error {
		v.calls.Add(1)
		var got task
		if err := c.Bind(&got); err != nil {
			return err
		}
		return c.JSON(http.StatusCreated, got)
	}, mw)
	return v
}

func (v *env) post(ctype, body string) *httptest.ResponseRecorder {
	return v.do(req{path: "/v1/tasks", key: "k", ctype: ctype, body: body})
}

// TestBinderNameFolding: encoding/json and echo's form binder match member
// names case-insensitively (and with Unicode folds), the fingerprint by
// exact name. A body whose member name folds onto a selected or excluded
// one without being it is refused, so it can never replay another
// request's answer; the detail names the pointer, never a value.
func TestBinderNameFolding(t *testing.T) {
	t.Parallel()
	const form = "application/x-www-form-urlencoded"
	fields := fingerprint.Spec{Fields: []string{"/prompt", "/n", "/size"}}
	tests := []struct {
		name   string
		spec   fingerprint.Spec
		ctype  string
		first  string // sent first under the key; its answer is not checked
		second string // must be 400 body_invalid, never a replay
	}{
		{name: "JSON capitalized name", spec: fields, ctype: "application/json",
			first: `{"Prompt":"a dog","n":1}`, second: `{"Prompt":"a cat","n":1}`},
		{name: "JSON exact and folded duplicate", spec: fields, ctype: "application/json",
			first: `{"prompt":"x","n":1}`, second: `{"prompt":"x","Prompt":"a dog","n":1}`},
		{name: "JSON long s folds to s", spec: fields, ctype: "application/json",
			first: `{"prompt":"x","n":1,"size":"small"}`, second: `{"prompt":"x","n":1,"size":"small","ſize":"huge"}`},
		{name: "JSON folded excluded name", spec: fingerprint.Spec{Exclude: []string{"/client_note"}}, ctype: "application/json",
			first: `{"prompt":"x","client_note":"a"}`, second: `{"prompt":"x","Client_Note":"b"}`},
		{name: "form upper-case name", spec: fields, ctype: form,
			first: "Prompt=a+dog&n=1", second: "PROMPT=a+cat&n=1"},
		{name: "form exact and folded", spec: fields, ctype: form,
			first: "prompt=x&n=1", second: "prompt=x&Prompt=a+dog&n=1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			v := binderEnv(t, tt.spec)
			first := v.post(tt.ctype, tt.first)
			rec := v.post(tt.ctype, tt.second)
			if rec.Header().Get("Idempotent-Replayed") == "true" {
				t.Fatalf("%s was replayed the answer of %s: %s", tt.second, tt.first, rec.Body)
			}
			if rec.Code != http.StatusBadRequest || problemCode(t, rec) != "body_invalid" {
				t.Fatalf("second = %d %s, want 400 body_invalid (first was %d)", rec.Code, rec.Body, first.Code)
			}
			for _, value := range []string{"dog", "cat", "huge", `"b"`} {
				if strings.Contains(rec.Body.String(), value) {
					t.Errorf("detail echoes a value (%s): %s", value, rec.Body)
				}
			}
		})
	}
}

// TestBinderEmptyBody: a keyed POST with Content-Type application/json
// and no body is a valid request (echo's Bind accepts it: action routes
// such as POST /orders/1/cancel). It runs, its retry replays, and it is
// another request than {} or null.
func TestBinderEmptyBody(t *testing.T) {
	t.Parallel()
	for _, spec := range []fingerprint.Spec{{}, {Fields: []string{"/prompt"}}} {
		t.Run("fields "+strings.Join(spec.Fields, ","), func(t *testing.T) {
			t.Parallel()
			v := binderEnv(t, spec)
			want{status: 201, calls: 1}.check(t, v, v.post("application/json", ""))
			want{status: 201, calls: 1, replayed: true}.check(t, v, v.post("application/json", ""))
			for _, other := range []string{"{}", "null"} {
				if rec := v.post("application/json", other); rec.Code != 409 || problemCode(t, rec) != "key_reused" {
					t.Errorf("%s under the empty body's key = %d %s, want 409 key_reused", other, rec.Code, rec.Body)
				}
			}
		})
	}
}

// TestBinderEmptyBodyServer: the same on a real server, where an empty
// body arrives as http.NoBody (Content-Length: 0) or as an empty chunked
// body; both are the one empty request.
func TestBinderEmptyBodyServer(t *testing.T) {
	t.Parallel()
	v := binderEnv(t, fingerprint.Spec{})
	srv := httptest.NewServer(v.e)
	t.Cleanup(srv.Close)
	send := func(chunked bool) *http.Response {
		t.Helper()
		var body io.Reader
		if chunked {
			body = io.MultiReader() // unknown length: sent chunked
		}
		r, err := http.NewRequest(http.MethodPost, srv.URL+"/v1/tasks", body)
		if err != nil {
			t.Fatal(err)
		}
		r.Header.Set("Idempotency-Key", "k")
		r.Header.Set("X-Tenant", "acme")
		r.Header.Set("X-User", "alice")
		r.Header.Set("Content-Type", "application/json")
		resp, err := srv.Client().Do(r)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	if resp := send(false); resp.StatusCode != 201 {
		t.Fatalf("empty body = %d, want 201", resp.StatusCode)
	}
	if resp := send(true); resp.StatusCode != 201 || resp.Header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("empty chunked retry = %d replayed=%q, want a replay", resp.StatusCode, resp.Header.Get("Idempotent-Replayed"))
	}
	if n := v.calls.Load(); n != 1 {
		t.Errorf("handler ran %d times, want 1", n)
	}
}

// TestBodyInvalidDetail: body_invalid details give the reason and the byte
// offset, never body content: not a member name, not a value, not a
// multipart header line.
func TestBodyInvalidDetail(t *testing.T) {
	t.Parallel()
	const secret = "4111111111111111"
	var mp bytes.Buffer
	mw := multipart.NewWriter(&mp)
	mp.WriteString("--" + mw.Boundary() + "\r\nContent-Disposition form-data; name=card; " + secret + "\r\n\r\nx\r\n--" + mw.Boundary() + "--\r\n")
	tests := []struct {
		name  string
		spec  fingerprint.Spec
		ctype string
		body  string
	}{
		{name: "duplicate member name", ctype: "application/json", body: `{"` + secret + `":1,"` + secret + `":2}`},
		{name: "unterminated member name", ctype: "application/json", body: `{"` + secret},
		{name: "control character in a member name", ctype: "application/json", body: "{\"" + secret + "\x01\":1}"},
		{name: "invalid UTF-8 in a member name", ctype: "application/json", body: "{\"" + secret + "\xff\":1}"},
		{name: "member name where a value belongs", ctype: "application/json", body: `{"a":` + secret + `x}`},
		{name: "folded name with a secret value", spec: fingerprint.Spec{Fields: []string{"/card"}}, ctype: "application/json",
			body: `{"card":"1","Card":"` + secret + `"}`},
		{name: "malformed multipart header line", ctype: mw.FormDataContentType(), body: mp.String()},
		{name: "malformed form", ctype: "application/x-www-form-urlencoded", body: "card=" + secret + "%zz"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			v := binderEnv(t, tt.spec)
			rec := v.post(tt.ctype, tt.body)
			if rec.Code != http.StatusBadRequest || problemCode(t, rec) != "body_invalid" {
				t.Fatalf("= %d %s, want 400 body_invalid", rec.Code, rec.Body)
			}
			if strings.Contains(rec.Body.String(), secret[:8]) {
				t.Errorf("detail echoes body content: %s", rec.Body)
			}
			if v.calls.Load() != 0 {
				t.Errorf("handler ran for an invalid body")
			}
		})
	}
}
