package client

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strings"
	"testing"
)

// TestProblemDecodedMemberByMember: a member of an unexpected type is
// dropped alone, a duplicate of such a type too; the rest of the problem
// (its code above all) is kept, so a key_reused answer still matches
// ErrKeyReused and is never retried.
func TestProblemDecodedMemberByMember(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name        string
		given       string
		wantCode    string
		wantTitle   string
		wantDetail  string
		wantChanged []string
		wantReused  bool
	}{
		{name: "status as a string", given: `{"status":"409","code":"key_reused","title":"Idempotency key reused"}`,
			wantCode: "key_reused", wantTitle: "Idempotency key reused", wantReused: true},
		{name: "a title of another type", given: `{"status":409,"code":"key_reused","title":7,"detail":"used before"}`,
			wantCode: "key_reused", wantTitle: "Conflict", wantDetail: "used before", wantReused: true},
		{name: "a pointer of another type in changed", given: `{"code":"key_reused","changed":["/amount",5,"/currency"]}`,
			wantCode: "key_reused", wantTitle: "Conflict", wantChanged: []string{"/amount", "/currency"}, wantReused: true},
		{name: "changed not an array", given: `{"code":"key_reused","changed":"/amount"}`,
			wantCode: "key_reused", wantTitle: "Conflict", wantReused: true},
		{name: "a code of another type", given: `{"code":409,"title":"Conflict"}`, wantTitle: "Conflict"},
		{name: "not an object", given: `["key_reused"]`, wantTitle: "Conflict", wantDetail: `["key_reused"]`},
		{name: "a duplicate code of another type after it", given: `{"code":"key_reused","code":7}`,
			wantCode: "key_reused", wantTitle: "Conflict", wantReused: true},
		{name: "a duplicate code of another type before it", given: `{"code":null,"code":"key_reused","code":{}}`,
			wantCode: "key_reused", wantTitle: "Conflict", wantReused: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := newFakeServer(t, answer{status: 409, header: map[string]string{"Content-Type": "application/problem+json"}, body: tt.given})
			c := New(Config{BaseURL: srv.URL})

			_, err := c.Send(context.Background(), http.MethodPost, "/x", "k", nil)

			var p *Problem
			if !errors.As(err, &p) {
				t.Fatalf("Send = %v, want a *Problem", err)
			}
			if p.Status != 409 || p.Code != tt.wantCode || p.Title != tt.wantTitle || p.Detail != tt.wantDetail || !slices.Equal(p.Changed, tt.wantChanged) {
				t.Errorf("problem = %+v, want status 409, code %q, title %q, detail %q, changed %q", *p, tt.wantCode, tt.wantTitle, tt.wantDetail, tt.wantChanged)
			}
			if got := errors.Is(err, ErrKeyReused); got != tt.wantReused {
				t.Errorf("errors.Is(err, ErrKeyReused) = %v, want %v", got, tt.wantReused)
			}
		})
	}
}

// TestProblemChanged: a key_reused problem's "changed" pointers are read
// and printed; values never appear in it.
func TestProblemChanged(t *testing.T) {
	t.Parallel()
	var p Problem
	body := `{"type":"https://github.com/idemgate/idemgate#key_reused","title":"Idempotency key reused","status":409,"detail":"This idempotency key was already used with other request parameters.","code":"key_reused","changed":["/prompt","/n"]}`
	if err := json.Unmarshal([]byte(body), &p); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(&p, ErrKeyReused) {
		t.Errorf("not ErrKeyReused")
	}
	if msg := p.Error(); !strings.Contains(msg, "(changed: /prompt, /n)") {
		t.Errorf("Error() = %q, want the changed fields", msg)
	}
	p.Changed = nil
	if msg := p.Error(); strings.Contains(msg, "changed") {
		t.Errorf("Error() = %q without changed fields", msg)
	}
}

// TestProblemNotJSON: an error answer that is no problem document (a
// proxy's HTML page) still becomes a *Problem with its status.
func TestProblemNotJSON(t *testing.T) {
	t.Parallel()
	srv := newFakeServer(t, answer{status: 413, body: "<html>too large</html>"})
	c := New(Config{BaseURL: srv.URL})
	_, err := c.Send(context.Background(), http.MethodPost, "/x", "k", []byte("{}"))
	var p *Problem
	if !errors.As(err, &p) || p.Status != 413 || p.Title != "Request Entity Too Large" || p.Detail != "<html>too large</html>" {
		t.Fatalf("err = %#v", err)
	}
}

// FuzzDecodeProblem: any body decodes without a panic, and a problem
// document that encoding/json reads whole (lower-case ASCII member names)
// is read member by member to the same values.
func FuzzDecodeProblem(f *testing.F) {
	for _, s := range []string{
		`{"type":"about:blank","title":"Conflict","status":409,"code":"key_reused","changed":["/a"]}`,
		`{"status":"409","code":"key_reused"}`, `{"changed":["/a",5]}`, `null`, `[]`, `<html>`, `{"title":null}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		got, ok := decodeProblem(body)
		var members map[string]json.RawMessage
		if json.Unmarshal(body, &members) != nil || members == nil {
			if ok {
				t.Fatalf("decodeProblem(%q) took a body that is no JSON object", body)
			}
			return
		}
		if !ok {
			t.Fatalf("decodeProblem(%q) refused a JSON object", body)
		}
		for name := range members {
			for i := 0; i < len(name); i++ {
				if name[i] >= 0x80 || (name[i] >= 'A' && name[i] <= 'Z') {
					return // encoding/json folds case; the problem's members are lower case
				}
			}
		}
		var strict Problem
		if json.Unmarshal(body, &strict) != nil {
			return
		}
		if got.Type != strict.Type || got.Title != strict.Title || got.Detail != strict.Detail || got.Code != strict.Code ||
			!slices.Equal(got.Changed, strict.Changed) {
			t.Fatalf("decodeProblem(%q) = %+v, encoding/json read %+v", body, *got, strict)
		}
	})
}
