package redact_test

import (
	"errors"
	"io"
	"testing"

	"github.com/idemgate/idemgate/otelidem/internal/redact"
)

func TestError(t *testing.T) {
	t.Parallel()
	base := errors.Join(io.ErrUnexpectedEOF, errors.New("claim idem:acme:k: down, again idem:acme:k"))
	for _, tc := range []struct {
		name  string
		given error
		key   string
		want  string
	}{
		{name: "every occurrence", given: base, key: "idem:acme:k", want: "unexpected EOF\nclaim [key]: down, again [key]"},
		{name: "no key", given: base, key: "", want: base.Error()},
		{name: "key absent", given: io.EOF, key: "idem:acme:k", want: "EOF"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := redact.Error(tc.given, tc.key)
			if got.Error() != tc.want {
				t.Errorf("Error() = %q, want %q", got.Error(), tc.want)
			}
			if !errors.Is(got, tc.given) {
				t.Errorf("errors.Is(redacted, original) = false")
			}
		})
	}
	if redact.Error(nil, "k") != nil {
		t.Error("Error(nil) != nil")
	}
}
