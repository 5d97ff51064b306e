package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
)

// Every command that prints prints one JSON document with -json, and
// nothing else on stdout, wherever -json is given: a script pipes it to
// jq.
func TestJSONFlagGivesJSONOnEveryPrintingCommand(t *testing.T) {
	t.Parallel()
	o := newOpsBench(t)
	tests := [][]string{
		{"tasks", "list", "-json"},
		{"tasks", "-json", "list"},
		{"tasks", "show", o.IDs[0], "-json"},
		{"tasks", "cancel", "-json", "-yes", o.IDs[1]},
		{"tasks", "limits", "images", "-json"},
		{"tasks", "limits", "images", "-max-running", "3", "-json"},
		{"tasks", "pause", "images", "-json"},
		{"tasks", "resume", "-json", "images"},
		{"migrate", "up", "-json"},
		{"migrate", "status", "-json"},
		{"migrate", "-json", "status", "-check"},
		{"migrate", "sql", "-json"},
		{"migrate", "sql", "-pending", "-json"},
	}
	for _, args := range tests {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			getenv := func(k string) string {
				if k == "DATABASE_URL" {
					return o.DSN
				}
				return ""
			}
			code := Main(context.Background(), args, Env{Prog: "idemgate", Getenv: getenv, Stdin: strings.NewReader(""), Stdout: &stdout, Stderr: &stderr})
			if code != ExitOK {
				t.Fatalf("exit %d: %s", code, stderr.String())
			}
			dec := json.NewDecoder(&stdout)
			var v any
			if err := dec.Decode(&v); err != nil {
				t.Fatalf("stdout is not JSON: %v\n%s", err, stdout.String())
			}
			if dec.More() {
				t.Errorf("stdout holds more than one JSON document")
			}
		})
	}
}
