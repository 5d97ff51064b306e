package fingerprint

import (
	"errors"
	"net/http/httptest"
	"strings"
	"testing"
)

// secret stands for a card number a client put where it did not belong.
const secret = "4111111111111111"

// TestErrorsHideBody: the error for a malformed body gives the reason and
// an offset, never body content (the middleware passes it on as the
// problem detail). Every body below holds the secret near the fault.
func TestErrorsHideBody(t *testing.T) {
	t.Parallel()
	const (
		jsonType = "application/json"
		mp       = "multipart/form-data; boundary=b"
	)
	selected := Spec{Fields: []string{"/prompt"}, Exclude: []string{"/note"}}
	tests := []struct {
		name  string
		spec  Spec
		given body
	}{
		{"duplicate member", Spec{}, body{jsonType, `{"` + secret + `":1,"` + secret + `":2}`}},
		{"duplicate member, escaped", Spec{}, body{jsonType, `{"` + secret + `":1,"\u0034` + secret[1:] + `":2}`}},
		{"control character", Spec{}, body{jsonType, `{"a":"` + secret + "\x01" + `"}`}},
		{"control character in a name", Spec{}, body{jsonType, `{"` + secret + "\n" + `":1}`}},
		{"bad escape", Spec{}, body{jsonType, `{"a":"` + secret + `\q"}`}},
		{"lone surrogate", Spec{}, body{jsonType, `{"a":"` + secret + `\ud800"}`}},
		{"invalid UTF-8", Spec{}, body{jsonType, `{"a":"` + secret + "\xff" + `"}`}},
		{"unterminated string", Spec{}, body{jsonType, `{"a":"` + secret}},
		{"unexpected byte", Spec{}, body{jsonType, `[` + secret + `x]`}},
		{"bare word", Spec{}, body{jsonType, `{"a":` + secret[:4] + `x` + secret + `}`}},
		{"number out of range", Spec{}, body{jsonType, `[` + secret + `e999]`}},
		{"trailing data", Spec{}, body{jsonType, `{} ` + secret}},
		{"folded member name", selected, body{jsonType, `{"Prompt` + secret + `":1,"PROMPT":"` + secret + `"}`}},
		{"folded excluded name", selected, body{jsonType, `{"NOTE":"` + secret + `"}`}},
		{"duplicate selected member", selected, body{jsonType, `{"prompt":"` + secret + `","prompt":"` + secret + `"}`}},
		{"form escape", Spec{}, body{formType, "a=" + secret + "%zz"}},
		{"form escape in a name", Spec{}, body{formType, secret + "%4=1"}},
		{"form semicolon", Spec{}, body{formType, "a=" + secret + ";b=" + secret}},
		{"form folded name", selected, body{formType, "Prompt=" + secret}},
		{"multipart malformed header line", Spec{}, body{mp, "--b\r\n" + secret + "\r\n\r\nx\r\n--b--\r\n"}},
		{"multipart header without a colon", Spec{}, body{mp, "--b\r\nContent-Disposition form-data; name=\"" + secret + "\"\r\n\r\nx\r\n--b--\r\n"}},
		{"multipart truncated", Spec{}, body{mp, "--b\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\n" + secret}},
		{"multipart garbage after a part", Spec{}, body{mp, "--b\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\nx\r\n--b" + secret + "\r\n"}},
		{"multipart folded name", selected, body{mp, "--b\r\nContent-Disposition: form-data; name=\"Prompt\"\r\n\r\n" + secret + "\r\n--b--\r\n"}},
		{"multipart without its boundary", Spec{}, body{"multipart/form-data; boundary=" + secret, "x"}},
		{"malformed Content-Type", Spec{}, body{"application/" + secret + " x", "x"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := httptest.NewRequest("POST", "/", nil)
			r.Header.Set("Content-Type", tt.given.contentType)
			fp, err := tt.spec.SumRequest(r, []byte(tt.given.data))
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("SumRequest = %q, %v; want an error wrapping ErrInvalid", fp, err)
			}
			msg := err.Error()
			if strings.Contains(msg, secret[:6]) || strings.Contains(msg, "Prompt") || strings.Contains(msg, "NOTE") {
				t.Errorf("error %q quotes the body", msg)
			}
			if !strings.Contains(msg, "offset ") && !strings.Contains(msg, "media type") && !strings.Contains(msg, "no boundary") {
				t.Errorf("error %q gives no offset", msg)
			}
		})
	}
}
