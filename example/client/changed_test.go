package client

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

// TestProblemChanged: a key_reused problem's "changed" pointers are read
// and printed; values never appear in it.
func TestProblemChanged(t *testing.T) {
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
