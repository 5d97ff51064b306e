package main

import (
	"testing"

	"github.com/idemgate/idemgate/pgstore"
)

func TestParsePolicy(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		given   string
		want    string
		wantErr bool
	}{
		{name: "empty keeps the defaults", given: "", want: "images=uncertain,music=retry"},
		{name: "one kind changed", given: "images=retry", want: "images=retry,music=retry"},
		{name: "both, spaces", given: " music=uncertain , images=retry ", want: "images=retry,music=uncertain"},
		{name: "unknown kind", given: "video=retry", wantErr: true},
		{name: "unknown policy", given: "images=twice", wantErr: true},
		{name: "no equals", given: "images", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parsePolicy(tt.given)
			if tt.wantErr {
				if err == nil {
					t.Fatalf("parsePolicy(%q) = %v, want an error", tt.given, got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if s := formatPolicy(got); s != tt.want {
				t.Fatalf("parsePolicy(%q) = %s, want %s", tt.given, s, tt.want)
			}
		})
	}
	if defaultPolicy[kindImages] != pgstore.LostUncertain {
		t.Fatal("a lost image attempt must become uncertain by default: the upstream is paid")
	}
}

func FuzzParsePolicy(f *testing.F) {
	f.Add("images=retry,music=uncertain")
	f.Add(",=,")
	f.Fuzz(func(t *testing.T, s string) {
		p, err := parsePolicy(s)
		if err != nil {
			return
		}
		again, err := parsePolicy(formatPolicy(p))
		if err != nil || formatPolicy(again) != formatPolicy(p) {
			t.Fatalf("%q: %s does not read back (%v)", s, formatPolicy(p), err)
		}
	})
}
