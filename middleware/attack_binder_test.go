package middleware_test

import (
	"encoding/json"
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

// Attacks on the seam between the fingerprint and echo's DefaultBinder:
// pairs of requests sent under one key where the second must never be
// replayed the first one's answer when the handler would bind other
// values. Each case sends first, then second; the second must run the
// handler or be refused, never replay an answer bound from other values.

// nested is bound by the handlers of these attacks: a nested struct, as
// echo's form binder fills it from flat form names.
type nested struct {
	Prompt string `json:"prompt" form:"prompt"`
	Size   struct {
		W int `json:"w" form:"w"`
	} `json:"size"`
}

// attackEnv serves POST /v1/tasks through the middleware with spec: Bind
// into a fresh *T, answer 201 with what was bound as JSON.
func attackEnv[T any](t *testing.T, spec fingerprint.Spec) *env {
	t.Helper()
	mr := miniredis.RunT(t)
	client := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { client.Close() })
	v := &env{e: echo.New(), mr: mr, client: client, store: middleware.NewRedisStore(client), events: &recorder{}}
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
		t.Fatalf("bad attack: both bind %s", b1)
	}
	r1 := v.do(first)
	r2 := v.do(second)
	if r2.Header().Get("Idempotent-Replayed") == "true" {
		t.Fatalf("false replay: second binds %s, but got the first's answer %d %s (first binds %s, answered %d)",
			b2, r2.Code, strings.TrimSpace(r2.Body.String()), b1, r1.Code)
	}
}

// TestAttackFoldedMembersReordered: without a Spec (the whole body), two
// members whose names fold together ("prompt", "Prompt") bind the last
// one; canonical member order is sorted, so swapping them kept the
// fingerprint while the handler read the other value.
func TestAttackFoldedMembersReordered(t *testing.T) {
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
			v := attackEnv[flat](t, fingerprint.Spec{})
			checkNoFalseReplay[flat](t, v, req{path: "/v1/tasks", key: "k", body: tt.first}, req{path: "/v1/tasks", key: "k", body: tt.second})
		})
	}
}

// TestAttackFoldedMembersInSelectedValue: the same inside a selected
// value, which is hashed whole ("/size" selected, {"w":1,"W":2} inside).
func TestAttackFoldedMembersInSelectedValue(t *testing.T) {
	t.Parallel()
	v := attackEnv[nested](t, fingerprint.Spec{Fields: []string{"/prompt", "/size"}})
	checkNoFalseReplay[nested](t, v,
		req{path: "/v1/tasks", key: "k", body: `{"prompt":"x","size":{"w":1,"W":2}}`},
		req{path: "/v1/tasks", key: "k", body: `{"prompt":"x","size":{"W":2,"w":1}}`})
}

// TestAttackFormNestedField: echo's form binder fills a nested struct's
// fields from flat form names, so a value JSON reaches as "/size/w" (or
// inside "/size", selected whole) arrives in a form as "w". Selecting form
// fields by pointer let w=1 and w=2 share a fingerprint; a form now takes
// part whole (less Exclude).
func TestAttackFormNestedField(t *testing.T) {
	t.Parallel()
	const form = "application/x-www-form-urlencoded"
	for _, fields := range [][]string{{"/prompt", "/size/w"}, {"/prompt", "/size"}} {
		t.Run(strings.Join(fields, ","), func(t *testing.T) {
			t.Parallel()
			v := attackEnv[nested](t, fingerprint.Spec{Fields: fields})
			checkNoFalseReplay[nested](t, v,
				req{path: "/v1/tasks", key: "k", ctype: form, body: "prompt=x&w=1"},
				req{path: "/v1/tasks", key: "k", ctype: form, body: "prompt=x&w=2"})
		})
	}
}
