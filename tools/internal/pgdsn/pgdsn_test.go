package pgdsn

import "testing"

func TestWithDatabase(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, given, want string
	}{
		{name: "url", given: "postgres://u@127.0.0.1:5/postgres?sslmode=disable", want: "postgres://u@127.0.0.1:5/x?sslmode=disable"},
		{name: "url without database", given: "postgresql://u:p@h:5", want: "postgresql://u:p@h:5/x"},
		{name: "key value", given: "host=h port=5", want: "host=h port=5 dbname=x"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := WithDatabase(tt.given, "x"); got != tt.want {
				t.Errorf("WithDatabase(%q) = %q, want %q", tt.given, got, tt.want)
			}
		})
	}
}
