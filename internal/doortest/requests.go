package doortest

import (
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/fingerprint"
)

// testRequestPath: what one request after some others gets, for each
// outcome a request can have on a route that runs at once.
func testRequestPath(t *testing.T, b bundle) {
	first := req{key: "req-1", body: imageBody}
	tests := []struct {
		name  string
		given func(*Config)
		h     handlerFunc
		setup []req // requests sent before, in order
		when  req
		want  want
	}{
		{name: "the first request runs the handler", when: first,
			want: want{status: 201, calls: 1, body: `{"run":1,"got":` + imageBody + `}`, events: "claimed"}},
		{name: "an identical retry replays", setup: []req{first}, when: first,
			want: want{status: 201, calls: 1, replayed: true, body: `{"run":1,"got":` + imageBody + `}`, events: "claimed,replayed"}},
		{name: "a retry with reordered members and whitespace replays", setup: []req{first},
			when: req{key: "req-1", body: "{ \"n\":1, \"aspect_ratio\":\"16:9\",\n\"prompt\":\"a red fox\"}"},
			want: want{status: 201, calls: 1, replayed: true}},
		{name: "a changed body is key_reused", setup: []req{first},
			when: req{key: "req-1", body: `{"prompt":"a red fox ","aspect_ratio":"16:9","n":1}`},
			want: want{status: 409, code: "key_reused", calls: 1, events: "claimed,reused"}},
		{name: "MismatchStatus is the status of key_reused", given: func(c *Config) { c.MismatchStatus = 422 }, setup: []req{first},
			when: req{key: "req-1", body: `{"prompt":"a blue fox"}`},
			want: want{status: 422, code: "key_reused", calls: 1}},
		{name: "an excluded field does not take part",
			given: func(c *Config) { c.Fingerprint = fingerprint.Spec{Exclude: []string{"/client_note"}} },
			setup: []req{{key: "k", body: `{"prompt":"p","client_note":"a"}`}},
			when:  req{key: "k", body: `{"prompt":"p","client_note":"b"}`},
			want:  want{status: 201, calls: 1, replayed: true}},
		{name: "the same bytes as text/plain are key_reused", setup: []req{first},
			when: req{key: "req-1", ctype: "text/plain", body: imageBody}, want: want{status: 409, code: "key_reused", calls: 1}},
		{name: "the same key and body on another route runs", setup: []req{first},
			when: req{path: "/v1/videos", key: "req-1", body: imageBody},
			want: want{status: 201, calls: 2}},
		{name: "the same key on another route with a shared Kind is key_reused",
			given: func(c *Config) { c.Kind = "media" }, setup: []req{first},
			when: req{path: "/v1/videos", key: "req-1", body: imageBody},
			want: want{status: 409, code: "key_reused", calls: 1}},
		{name: "the same key from another user runs", setup: []req{first},
			when: req{key: "req-1", user: "bob", body: imageBody}, want: want{status: 201, calls: 2}},
		{name: "the same key from another tenant runs", setup: []req{first},
			when: req{key: "req-1", otherTenant: true, body: imageBody}, want: want{status: 201, calls: 2}},

		{name: "GET passes through", setup: []req{{method: "GET", key: "req-1"}}, when: req{method: "GET", key: "req-1"},
			want: want{status: 201, calls: 2, events: noEvents}},
		{name: "PUT passes through by default", setup: []req{{method: "PUT", key: "req-1", body: imageBody}},
			when: req{method: "PUT", key: "req-1", body: imageBody}, want: want{status: 201, calls: 2}},
		{name: "PUT is protected when Methods lists it", given: func(c *Config) { c.Methods = []string{"PUT"} },
			setup: []req{{method: "PUT", key: "req-1", body: imageBody}}, when: req{method: "PUT", key: "req-1", body: imageBody},
			want: want{status: 201, calls: 1, replayed: true}},
		{name: "Skipper passes a request through", given: func(c *Config) {
			c.Skipper = func(r *http.Request) bool { return r.Method == http.MethodPost }
		}, setup: []req{first}, when: first, want: want{status: 201, calls: 2, events: noEvents}},
		{name: "POST passes through when Methods lists only PUT", given: func(c *Config) { c.Methods = []string{"PUT"} },
			setup: []req{first}, when: first, want: want{status: 201, calls: 2}},
		{name: "a request without a key passes through", setup: []req{{body: imageBody}}, when: req{body: imageBody},
			want: want{status: 201, calls: 2, events: noEvents}},

		{name: "no key with Required is key_missing", given: func(c *Config) { c.Required = true },
			when: req{body: imageBody}, want: want{status: 400, code: "key_missing"}},
		{name: "Header names the key's header", given: func(c *Config) { c.Header = "X-Request-Id"; c.Required = true },
			setup: []req{{header: "X-Request-Id", key: "req-1", body: imageBody}},
			when:  req{header: "X-Request-Id", key: "req-1", body: imageBody}, want: want{status: 201, calls: 1, replayed: true}},
		{name: "the default header with another Header configured is key_missing",
			given: func(c *Config) { c.Header = "X-Request-Id"; c.Required = true },
			when:  first, want: want{status: 400, code: "key_missing"}},
		{name: "a repeated key header is key_invalid", when: req{keys: []string{"a", "a"}, body: imageBody},
			want: want{status: 400, code: "key_invalid"}},
		{name: "a 256-byte key is key_invalid", when: req{key: strings.Repeat("k", 256), body: imageBody},
			want: want{status: 400, code: "key_invalid"}},
		{name: "a 255-byte key runs", when: req{key: strings.Repeat("k", 255), body: imageBody},
			want: want{status: 201, calls: 1}},
		{name: "a non-ASCII key is key_invalid", when: req{key: "clé", body: imageBody},
			want: want{status: 400, code: "key_invalid"}},
		{name: "a quoted key and the bare token of the same id are one key",
			setup: []req{{key: `"req-1"`, body: imageBody}}, when: first,
			want: want{status: 201, calls: 1, replayed: true}},
		{name: "a user identity over 255 bytes is scope_invalid",
			when: req{key: "req-1", user: strings.Repeat("u", 256), body: imageBody}, want: want{status: 400, code: "scope_invalid"}},

		{name: "a declared body over MaxBodyBytes is body_too_large",
			given: func(c *Config) { c.MaxBodyBytes = 16 },
			when:  req{key: "req-1", body: imageBody}, want: want{status: 413, code: "body_too_large"}},
		{name: "a chunked body over MaxBodyBytes is body_too_large",
			given: func(c *Config) { c.MaxBodyBytes = 16 },
			when:  req{key: "req-1", body: imageBody, chunked: true}, want: want{status: 413, code: "body_too_large"}},
		{name: "a chunked body within MaxBodyBytes runs", when: req{key: "req-1", body: imageBody, chunked: true},
			want: want{status: 201, calls: 1, body: `{"run":1,"got":` + imageBody + `}`}},
		{name: "malformed JSON is body_invalid", when: req{key: "req-1", body: `{"prompt":`},
			want: want{status: 400, code: "body_invalid"}},

		{name: "a 5xx is not stored: the retry runs", h: func(w http.ResponseWriter, r *http.Request, n int64) {
			if n == 1 {
				answer(http.StatusBadGateway, "upstream down")(w, r, n)
				return
			}
			defaultHandler(w, r, n)
		}, setup: []req{first}, when: first,
			want: want{status: 201, calls: 2, events: "claimed,released(not_cacheable),claimed"}},
		{name: "a 429 is not stored", h: answer(http.StatusTooManyRequests, "slow down"),
			setup: []req{first}, when: first, want: want{status: 429, calls: 2, body: "slow down 2"}},
		{name: "a 422 is stored and replayed", h: answer(http.StatusUnprocessableEntity, "bad prompt"),
			setup: []req{first}, when: first, want: want{status: 422, calls: 1, replayed: true, body: "bad prompt 1"}},
		{name: "Cacheable decides what is stored",
			given: func(c *Config) { c.Cacheable = func(status int) bool { return status == 201 } },
			h:     answer(http.StatusUnprocessableEntity, "bad prompt"),
			setup: []req{first}, when: first, want: want{status: 422, calls: 2, body: "bad prompt 2"}},
		{name: "a handler that writes nothing is stored as 200",
			h:     func(http.ResponseWriter, *http.Request, int64) {},
			setup: []req{first}, when: first, want: want{status: 200, calls: 1, replayed: true}},
		{name: "an answer over MaxResponseBytes streams through and is not stored",
			given: func(c *Config) { c.MaxResponseBytes = 8 },
			setup: []req{first}, when: first,
			want: want{status: 201, calls: 2, body: `{"run":2,"got":` + imageBody + `}`,
				events: "claimed,released(response_too_large),claimed,released(response_too_large)"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := b.serve(t, tt.given, tt.h)
			for _, r := range tt.setup {
				s.do(t, r)
			}
			tt.want.check(t, s, s.do(t, tt.when))
		})
	}
}

// testReplayIsByteForByte: a replay has the first answer's status, body
// and headers, but for Set-Cookie (never stored), and Idempotent-Replayed:
// true, which the first answer has not.
func testReplayIsByteForByte(t *testing.T, b bundle) {
	s := b.serve(t, nil, func(w http.ResponseWriter, r *http.Request, n int64) {
		h := w.Header()
		h.Set("Location", "/v1/images/1")
		h.Add("X-Multi", "a")
		h.Add("X-Multi", "b")
		defaultHandler(w, r, n)
	})
	first := s.do(t, req{key: "k", body: imageBody})
	replay := s.do(t, req{key: "k", body: imageBody})
	if first.Code != http.StatusCreated || first.Header().Get("Idempotent-Replayed") != "" {
		t.Fatalf("first answer = %d %v", first.Code, first.Header())
	}
	if got := replay.Header().Values("Idempotent-Replayed"); len(got) != 1 || got[0] != "true" {
		t.Fatalf("Idempotent-Replayed of the retry = %q, want [true]", got)
	}
	if replay.Code != first.Code || replay.Body.String() != first.Body.String() {
		t.Errorf("replay = %d %q, want the first answer %d %q", replay.Code, replay.Body, first.Code, first.Body)
	}
	wantHeader := first.Header().Clone()
	wantHeader.Del("Set-Cookie")
	wantHeader.Set("Idempotent-Replayed", "true")
	if !reflect.DeepEqual(replay.Header(), wantHeader) {
		t.Errorf("replay's headers = %v, want %v", replay.Header(), wantHeader)
	}
	if got := s.calls.Load(); got != 1 {
		t.Errorf("handler ran %d times, want 1", got)
	}
	if got := s.events.String(); got != "claimed,replayed" {
		t.Errorf("events = %s, want claimed,replayed", got)
	}
}

// testReplayHeaders: by default a replay drops Set-Cookie, Date and
// hop-by-hop headers; ReplayHeaders is the allowlist of what is kept.
func testReplayHeaders(t *testing.T, b bundle) {
	tests := []struct {
		name  string
		given []string
		want  http.Header // the headers a replay must have
		not   []string    // and must not
	}{
		{name: "the default drops Set-Cookie, Date and hop-by-hop headers",
			want: http.Header{"X-Run": {"1"}, "Content-Type": {"application/json"}},
			not:  []string{"Set-Cookie", "Date", "X-Hop"}},
		{name: "ReplayHeaders is an allowlist", given: []string{"x-run"}, want: http.Header{"X-Run": {"1"}},
			not: []string{"Set-Cookie", "Content-Type"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := b.serve(t, func(c *Config) { c.ReplayHeaders = tt.given }, func(w http.ResponseWriter, r *http.Request, n int64) {
				h := w.Header()
				h.Set("Date", "Mon, 01 Jan 2024 00:00:00 GMT")
				h.Set("Connection", "X-Hop")
				h.Set("X-Hop", "1")
				defaultHandler(w, r, n)
			})
			s.do(t, req{key: "k", body: imageBody})
			rec := s.do(t, req{key: "k", body: imageBody})
			if rec.Header().Get("Idempotent-Replayed") != "true" {
				t.Fatalf("not a replay: %d %s", rec.Code, rec.Body)
			}
			for name, vals := range tt.want {
				if got := rec.Header().Values(name); strings.Join(got, "|") != strings.Join(vals, "|") {
					t.Errorf("%s = %q, want %q", name, got, vals)
				}
			}
			for _, name := range tt.not {
				if got := rec.Header().Get(name); got != "" {
					t.Errorf("%s replayed as %q", name, got)
				}
			}
		})
	}
}

// testOuterHeadersAreTheRetrysOwn: headers set around the server before
// it runs (a request id) belong to each request: a replay carries the
// retry's own, and those the handler set or changed.
func testOuterHeadersAreTheRetrysOwn(t *testing.T, b bundle) {
	s := b.serve(t, nil, func(w http.ResponseWriter, r *http.Request, n int64) {
		w.Header().Set("Cache-Control", "private")
		defaultHandler(w, r, n)
	})
	outer := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Outer", r.Header.Get("X-Request-Id"))
		w.Header().Set("Cache-Control", "no-store")
		s.h.ServeHTTP(w, r)
	})
	send := func(id string) *httptest.ResponseRecorder {
		hr := req{key: "k", body: imageBody}.build(s)
		hr.Header.Set("X-Request-Id", id)
		rec, p := s.try(outer, hr)
		if p != nil {
			t.Fatalf("the server panicked with %v", p)
		}
		return rec
	}
	if rec := send("first"); rec.Header().Get("X-Outer") != "first" || rec.Code != http.StatusCreated {
		t.Fatalf("first answer: %d %v", rec.Code, rec.Header())
	}
	rec := send("second")
	if rec.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("not a replay: %d %s", rec.Code, rec.Body)
	}
	for name, want := range map[string]string{
		"X-Outer":       "second",  // outer, per request
		"Cache-Control": "private", // outer, changed by the handler
		"X-Run":         "1",       // the handler's
	} {
		if got := rec.Header().Values(name); len(got) != 1 || got[0] != want {
			t.Errorf("replayed %s = %q, want [%s]", name, got, want)
		}
	}
}

// testProblemDocument: a problem is an RFC 9457 document, byte for byte
// the one the echo middleware writes, with nothing of the stored answer.
func testProblemDocument(t *testing.T, b bundle) {
	s := b.serve(t, nil, nil)
	s.do(t, req{key: "k", body: `{"a":1}`})
	rec := s.do(t, req{key: "k", body: `{"a":2}`})
	want := `{"type":"https://github.com/idemgate/idemgate#key_reused","title":"Idempotency key reused","status":409,` +
		`"detail":"This idempotency key was already used with other request parameters. Send a new key for new parameters.","code":"key_reused"}` + "\n"
	if rec.Body.String() != want {
		t.Errorf("body =\n%s\nwant\n%s", rec.Body, want)
	}
	if ct := rec.Header().Get("Content-Type"); ct != "application/problem+json" {
		t.Errorf("Content-Type = %q", ct)
	}
	problemOf(t, rec)
	if rec.Header().Get("X-Run") != "" || rec.Header().Get("Idempotent-Replayed") != "" {
		t.Errorf("key_reused answer leaks the stored response: %v", rec.Header())
	}
}

// testChangedNamesTheDriftedFields: key_reused names the selected fields
// that changed (pointers, never values) when Fingerprint selects fields,
// and nothing when the query or the whole body differ.
func testChangedNamesTheDriftedFields(t *testing.T, b bundle) {
	fields := fingerprint.Spec{Fields: []string{"/prompt", "/aspect_ratio", "/n"}}
	tests := []struct {
		name        string
		spec        fingerprint.Spec
		given, when req
		wantChanged []string // nil: no "changed" member
	}{
		{"one field", fields,
			req{key: "k", body: imageBody},
			req{key: "k", body: `{"prompt":"a red fox ","aspect_ratio":"16:9","n":1}`}, []string{"/prompt"}},
		{"two fields", fields,
			req{key: "k", body: imageBody},
			req{key: "k", body: `{"prompt":"a red fox","aspect_ratio":"9:16","n":2}`}, []string{"/aspect_ratio", "/n"}},
		{"a field removed", fields,
			req{key: "k", body: imageBody},
			req{key: "k", body: `{"prompt":"a red fox","n":1}`}, []string{"/aspect_ratio"}},
		{"a form field", fields,
			req{key: "k", ctype: "application/x-www-form-urlencoded", body: "prompt=a&n=1&aspect_ratio=1%3A1"},
			req{key: "k", ctype: "application/x-www-form-urlencoded", body: "prompt=b&n=1&aspect_ratio=1%3A1"}, []string{"/prompt"}},
		{"the query only", fields,
			req{key: "k", body: imageBody},
			req{key: "k", path: "/v1/images?dry_run=true", body: imageBody}, nil},
		{"the whole body", fingerprint.Spec{},
			req{key: "k", body: imageBody},
			req{key: "k", body: `{"prompt":"a red fox ","aspect_ratio":"16:9","n":1}`}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := b.serve(t, func(c *Config) { c.Fingerprint = tt.spec }, nil)
			if rec := s.do(t, tt.given); rec.Code != http.StatusCreated {
				t.Fatalf("first request = %d %s", rec.Code, rec.Body)
			}
			rec := s.do(t, tt.when)
			want{status: 409, code: "key_reused", calls: 1, events: "claimed,reused"}.check(t, s, rec)
			if p := problemOf(t, rec); !reflect.DeepEqual(p.Changed, tt.wantChanged) {
				t.Errorf("changed = %q, want %q (%s)", p.Changed, tt.wantChanged, rec.Body)
			}
		})
	}
}

// testPathValuesAndQueryAreFingerprinted: the path's wildcard values and
// the raw query take part in the fingerprint, so one key never replays
// another order's answer, nor a dry run's.
func testPathValuesAndQueryAreFingerprinted(t *testing.T, b bundle) {
	tests := []struct {
		name  string
		given string // path of the first request
		when  string // path of the retry with the same key and body
		want  want
	}{
		{name: "another path value is key_reused", given: "/v1/orders/1/refund", when: "/v1/orders/2/refund",
			want: want{status: 409, code: "key_reused", calls: 1}},
		{name: "the same path value replays", given: "/v1/orders/1/refund", when: "/v1/orders/1/refund",
			want: want{status: 201, calls: 1, replayed: true}},
		{name: "an added query is key_reused", given: "/v1/images", when: "/v1/images?dry_run=true",
			want: want{status: 409, code: "key_reused", calls: 1}},
		{name: "another query value is key_reused", given: "/v1/images?dry_run=false", when: "/v1/images?dry_run=true",
			want: want{status: 409, code: "key_reused", calls: 1}},
		{name: "a reordered query is key_reused", given: "/v1/images?a=1&b=2", when: "/v1/images?b=2&a=1",
			want: want{status: 409, code: "key_reused", calls: 1}},
		{name: "the same query replays", given: "/v1/orders/1/refund?dry_run=true", when: "/v1/orders/1/refund?dry_run=true",
			want: want{status: 201, calls: 1, replayed: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := b.serve(t, nil, nil)
			if rec := s.do(t, req{path: tt.given, key: "k", body: imageBody}); rec.Code != http.StatusCreated {
				t.Fatalf("first request = %d %s", rec.Code, rec.Body)
			}
			tt.want.check(t, s, s.do(t, req{path: tt.when, key: "k", body: imageBody}))
		})
	}
}

// testErrorHandler: ErrorHandler renders the middleware's problems in the
// application's own format, after the headers that every problem carries
// are set (x-should-retry, Retry-After, Cache-Control: no-store); one that
// writes nothing leaves the problem to the default document.
func testErrorHandler(t *testing.T, b bundle) {
	render := func(w http.ResponseWriter, _ *http.Request, p idemgate.Problem) {
		if p.Code == idemgate.CodeKeyInvalid {
			return // left to the default
		}
		w.Header().Set("Content-Type", "application/vnd.app+json")
		w.WriteHeader(p.Status)
		_, _ = io.WriteString(w, `{"error":"`+string(p.Code)+`"}`)
	}
	s := b.serve(t, func(c *Config) { c.ErrorHandler = render }, nil)
	s.do(t, req{key: "k", body: `{"a":1}`})
	rec := s.do(t, req{key: "k", body: `{"a":2}`})
	if rec.Code != http.StatusConflict || rec.Body.String() != `{"error":"key_reused"}` {
		t.Errorf("key_reused = %d %s, want 409 in the application's format", rec.Code, rec.Body)
	}
	if h := rec.Header(); h.Get("X-Should-Retry") != "false" || h.Get("Cache-Control") != "no-store" || h.Get("Retry-After") != "" {
		t.Errorf("key_reused headers %v, want x-should-retry false, Cache-Control no-store, no Retry-After", h)
	}
	want{status: 400, code: "key_invalid", calls: 1}.check(t, s, s.do(t, req{key: "clé", body: imageBody}))
}
