package client

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
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
	// RetryAfter is the answer's retry-after-ms or Retry-After (0 if it had
	// neither), at most a day.
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

// problemFrom reads an error answer as a *Problem (any body shape).
func problemFrom(resp *http.Response, body []byte) *Problem {
	p, ok := decodeProblem(body)
	if !ok {
		p = &Problem{Detail: strings.TrimSpace(string(body))}
	}
	p.Status = resp.StatusCode
	if p.Title == "" {
		p.Title = http.StatusText(resp.StatusCode)
	}
	p.RetryAfter = retryAfter(resp.Header)
	p.ShouldRetry = strings.ToLower(strings.TrimSpace(resp.Header.Get("X-Should-Retry")))
	return p
}

// decodeProblem reads a JSON object's problem members one by one: a member
// of an unexpected type (a proxy's "title": 7, a string "status") is left
// out alone, so that the code, which decides retries and ErrKeyReused,
// survives it; so is each occurrence of a member named twice, the last of
// the expected type counting (as encoding/json reads one). The status comes
// from the answer, never from the body. It reports false for a body that is
// no JSON object.
func decodeProblem(body []byte) (*Problem, bool) {
	if !json.Valid(body) {
		return nil, false
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, false
	}
	p := &Problem{}
	strs := map[string]*string{"type": &p.Type, "title": &p.Title, "detail": &p.Detail, "code": &p.Code}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, false
		}
		name, _ := tok.(string)
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, false
		}
		if dst, ok := strs[name]; ok {
			var s string
			if bytes.HasPrefix(raw, []byte(`"`)) && json.Unmarshal(raw, &s) == nil {
				*dst = s
			}
			continue
		}
		var changed []json.RawMessage
		if name == "changed" && json.Unmarshal(raw, &changed) == nil {
			p.Changed = nil
			for _, c := range changed {
				var s string
				if json.Unmarshal(c, &s) == nil {
					p.Changed = append(p.Changed, s)
				}
			}
		}
	}
	return p, true
}
