package middleware_test

import (
	"bytes"
	"encoding/json"
	"io"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"net/textproto"
	"strings"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/labstack/echo/v4"
	"github.com/redis/go-redis/v9"

	"github.com/idemgate/idemgate/fingerprint"
	"github.com/idemgate/idemgate/middleware"
	"github.com/idemgate/idemgate/redisstore"
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
	v := &env{e: echo.New(), mr: mr, client: client, store: redisstore.New(client), events: &recorder{}}
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

// Requests on the seam between the fingerprint and echo's DefaultBinder:
// pairs of requests sent under one key where the second must never be
// replayed the first one's answer when the handler would bind other
// values. Each case sends first, then second; the second must run the
// handler or be refused, never replay an answer bound from other values.

// nested is bound by the handlers of these tests: a nested struct, as
// echo's form binder fills it from flat form names.
type nested struct {
	Prompt string `json:"prompt" form:"prompt"`
	Size   struct {
		W int `json:"w" form:"w"`
	} `json:"size"`
}

// boundEnv serves POST /v1/tasks through the middleware with spec: Bind
// into a fresh *T, answer 201 with what was bound as JSON.
func boundEnv[T any](t *testing.T, spec fingerprint.Spec) *env {
	t.Helper()
	mr := miniredis.RunT(t)
	client := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { client.Close() })
	v := &env{e: echo.New(), mr: mr, client: client, store: redisstore.New(client), events: &recorder{}}
	mw := middleware.New(middleware.Config{Store: v.store, Scope: testScope, Fingerprint: spec, OnEvent: v.events.add})
	h := func(c echo.Context) error {
		v.calls.Add(1)
		got := new(T)
		if err := c.Bind(got); err != nil {
			return err
		}
		return c.JSON(http.StatusCreated, got)
	}
	v.e.POST("/v1/tasks", h, mw)
	v.e.POST("/v1/orders/:id/refund", h, mw)
	return v
}

// bindOf returns what the handler bound, by running it without the
// middleware (a fresh echo with the same handler shape).
func bindOf[T any](t *testing.T, r *http.Request) string {
	t.Helper()
	e := echo.New()
	var out string
	h := func(c echo.Context) error {
		got := new(T)
		if err := c.Bind(got); err != nil {
			out = "error: " + err.Error()
			return nil
		}
		b, _ := json.Marshal(got)
		out = string(b)
		return nil
	}
	e.POST("/v1/tasks", h)
	e.POST("/v1/orders/:id/refund", h)
	e.ServeHTTP(httptest.NewRecorder(), r)
	return out
}

// checkNoFalseReplay sends first then second under one key and fails if
// the second is replayed while the handler binds them differently.
func checkNoFalseReplay[T any](t *testing.T, v *env, first, second req) {
	t.Helper()
	b1, b2 := bindOf[T](t, first.build()), bindOf[T](t, second.build())
	if b1 == b2 {
		t.Fatalf("bad pair: both bind %s", b1)
	}
	r1 := v.do(first)
	r2 := v.do(second)
	if r2.Header().Get("Idempotent-Replayed") == "true" {
		t.Fatalf("false replay: second binds %s, but got the first's answer %d %s (first binds %s, answered %d)",
			b2, r2.Code, strings.TrimSpace(r2.Body.String()), b1, r1.Code)
	}
}

// TestFoldedMembersReordered: without a Spec (the whole body), two
// members whose names fold together ("prompt", "Prompt") bind the last
// one; canonical member order is sorted, so swapping them kept the
// fingerprint while the handler read the other value.
func TestFoldedMembersReordered(t *testing.T) {
	t.Parallel()
	type flat struct {
		Prompt string `json:"prompt"`
		Size   string `json:"size"`
		K      int    `json:"k"`
	}
	for _, tt := range []struct{ name, first, second string }{
		{"top level", `{"prompt":"a dog","Prompt":"a cat"}`, `{"Prompt":"a cat","prompt":"a dog"}`},
		{"long s", `{"ſize":"huge","size":"small","prompt":"x"}`, `{"size":"small","ſize":"huge","prompt":"x"}`},
		{"kelvin", `{"k":1,"\u212a":2}`, `{"\u212a":2,"k":1}`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			v := boundEnv[flat](t, fingerprint.Spec{})
			checkNoFalseReplay[flat](t, v, req{path: "/v1/tasks", key: "k", body: tt.first}, req{path: "/v1/tasks", key: "k", body: tt.second})
		})
	}
}

// TestFoldedMembersInSelectedValue: the same inside a selected
// value, which is hashed whole ("/size" selected, {"w":1,"W":2} inside).
func TestFoldedMembersInSelectedValue(t *testing.T) {
	t.Parallel()
	v := boundEnv[nested](t, fingerprint.Spec{Fields: []string{"/prompt", "/size"}})
	checkNoFalseReplay[nested](t, v,
		req{path: "/v1/tasks", key: "k", body: `{"prompt":"x","size":{"w":1,"W":2}}`},
		req{path: "/v1/tasks", key: "k", body: `{"prompt":"x","size":{"W":2,"w":1}}`})
}

// TestFormNestedField: echo's form binder fills a nested struct's
// fields from flat form names, so a value JSON reaches as "/size/w" (or
// inside "/size", selected whole) arrives in a form as "w". Selecting form
// fields by pointer let w=1 and w=2 share a fingerprint; a form now takes
// part whole (less Exclude).
func TestFormNestedField(t *testing.T) {
	t.Parallel()
	const form = "application/x-www-form-urlencoded"
	for _, fields := range [][]string{{"/prompt", "/size/w"}, {"/prompt", "/size"}} {
		t.Run(strings.Join(fields, ","), func(t *testing.T) {
			t.Parallel()
			v := boundEnv[nested](t, fingerprint.Spec{Fields: fields})
			checkNoFalseReplay[nested](t, v,
				req{path: "/v1/tasks", key: "k", ctype: form, body: "prompt=x&w=1"},
				req{path: "/v1/tasks", key: "k", ctype: form, body: "prompt=x&w=2"})
		})
	}
}

// quirky is bound by the handler of TestBinderQuirks: ASCII names,
// a non-ASCII one with a special fold (ß, ẞ U+1E9E), Greek sigma (σ, ς,
// Σ fold together), a slice, and a file.
type quirky struct {
	Prompt string   `json:"prompt" form:"prompt"`
	Straße string   `json:"straße" form:"straße"`
	Sigma  string   `json:"σ" form:"σ"`
	Images []string `json:"images" form:"images"`
	Note   string   `json:"note" form:"note"`
}

func multipartOf(t *testing.T, parts ...[3]string) (string, string) {
	t.Helper()
	var b bytes.Buffer
	w := multipart.NewWriter(&b)
	w.SetBoundary("quirk")
	for _, p := range parts {
		h := textproto.MIMEHeader{}
		if p[1] != "" {
			h.Set("Content-Disposition", `form-data; name="`+p[0]+`"; filename="`+p[1]+`"`)
		} else {
			h.Set("Content-Disposition", `form-data; name="`+p[0]+`"`)
		}
		pw, _ := w.CreatePart(h)
		pw.Write([]byte(p[2]))
	}
	w.Close()
	return w.FormDataContentType(), b.String()
}

// TestBinderQuirks: pairs of requests that a careless reading of
// encoding/json or echo's binders could let share a fingerprint while the
// handler binds other values. Each held on the code of 068b6a6: the
// second is refused or runs, never replayed.
func TestBinderQuirks(t *testing.T) {
	t.Parallel()
	const form = "application/x-www-form-urlencoded"
	selected := fingerprint.Spec{Fields: []string{"/prompt", "/straße", "/σ", "/images"}}
	mpType, mpAB := multipartOf(t, [3]string{"images", "", "a"}, [3]string{"images", "i.png", "x"}, [3]string{"images", "", "b"})
	_, mpBA := multipartOf(t, [3]string{"images", "", "b"}, [3]string{"images", "i.png", "x"}, [3]string{"images", "", "a"})
	_, mpFileFirst := multipartOf(t, [3]string{"images", "i.png", "x"}, [3]string{"images", "", "b"}, [3]string{"images", "", "a"})
	tests := []struct {
		name          string
		spec          fingerprint.Spec
		first, second req
	}{
		{"escaped folded name", selected,
			req{path: "/v1/tasks", key: "k", body: `{"prompt":"x"}`},
			req{path: "/v1/tasks", key: "k", body: `{"prompt":"x","\u0050rompt":"y"}`}},
		{"name with a NUL is another name, not bound", selected,
			req{path: "/v1/tasks", key: "k", body: `{"prompt":"x"}`},
			req{path: "/v1/tasks", key: "k", body: `{"prompt\u0000":"x"}`}},
		{"capital sharp s folds onto ß", selected,
			req{path: "/v1/tasks", key: "k", body: `{"straße":"a"}`},
			req{path: "/v1/tasks", key: "k", body: `{"straße":"a","STRAẞE":"b"}`}},
		{"final sigma folds onto σ", selected,
			req{path: "/v1/tasks", key: "k", body: `{"σ":"a"}`},
			req{path: "/v1/tasks", key: "k", body: `{"σ":"a","ς":"b"}`}},
		{"capital sigma, whole body, swapped", fingerprint.Spec{},
			req{path: "/v1/tasks", key: "k", body: `{"σ":"a","Σ":"b"}`},
			req{path: "/v1/tasks", key: "k", body: `{"Σ":"b","σ":"a"}`}},
		{"percent-encoded folded form name", selected,
			req{path: "/v1/tasks", key: "k", ctype: form, body: "prompt=x"},
			req{path: "/v1/tasks", key: "k", ctype: form, body: "prompt=x&%50rompt=y&note=1"}},
		{"form body merged with the URL query", selected,
			req{path: "/v1/tasks", key: "k", ctype: form, body: "note=1"},
			req{path: "/v1/tasks?prompt=y", key: "k", ctype: form, body: "note=1"}},
		{"form repeated values reordered", selected,
			req{path: "/v1/tasks", key: "k", ctype: form, body: "images=a&images=b"},
			req{path: "/v1/tasks", key: "k", ctype: form, body: "images=b&images=a"}},
		{"multipart: text values of a name around a file part, reordered", selected,
			req{path: "/v1/tasks", key: "k", ctype: mpType, body: mpAB},
			req{path: "/v1/tasks", key: "k", ctype: mpType, body: mpBA}},
		{"multipart: file part moved, text values reordered", selected,
			req{path: "/v1/tasks", key: "k", ctype: mpType, body: mpAB},
			req{path: "/v1/tasks", key: "k", ctype: mpType, body: mpFileFirst}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			v := boundEnv[quirky](t, tt.spec)
			checkNoFalseReplay[quirky](t, v, tt.first, tt.second)
		})
	}
}
