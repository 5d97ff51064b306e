package pgstore

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgconn"
)

func TestStorableJSON(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		given string
		want  string
	}{
		{name: "nothing to replace", given: `["a\n\"b\\u0000"]`, want: `["a\n\"b\\u0000"]`},
		{name: "NUL escape", given: `["a\u0000b"]`, want: `["a\ufffdb"]`},
		{name: "two NULs in two strings", given: `[{"k\u0000":"\u0000"}]`, want: `[{"k\ufffd":"\ufffd"}]`},
		{name: "lone high surrogate", given: `["\ud800x"]`, want: `["\ufffdx"]`},
		{name: "lone low surrogate", given: `["\udc00"]`, want: `["\ufffd"]`},
		{name: "a pair stays", given: `["\ud83d\ude00"]`, want: `["\ud83d\ude00"]`},
		{name: "high then NUL", given: `["\ud800\u0000"]`, want: `["\ufffd\ufffd"]`},
		{name: "escaped backslash before u", given: `["\\u0000\u0000"]`, want: `["\\u0000\ufffd"]`},
		{name: "upper-case hex", given: `["\u0000\uD800"]`, want: `["\ufffd\ufffd"]`},
		{name: "invalid UTF-8", given: "[\"a\xffb\"]", want: "[\"a\uFFFDb\"]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := storableJSON([]byte(tt.given)); string(got) != tt.want {
				t.Fatalf("storableJSON(%s) = %s; want %s", tt.given, got, tt.want)
			}
		})
	}
}

func TestStorableText(t *testing.T) {
	t.Parallel()
	if got := storableText("a\x00b\xffc"); got != "a\uFFFDb\uFFFDc" {
		t.Fatalf("storableText = %q", got)
	}
}

// FuzzStorableJSON: whatever valid JSON comes in, what goes out is valid
// JSON, holds no escape jsonb refuses, is valid UTF-8, and is the input
// itself when the input had nothing to replace.
func FuzzStorableJSON(f *testing.F) {
	for _, s := range []string{`["a\u0000b"]`, `["\ud800"]`, `["\ud83d\ude00"]`, `{"\\u0000":1}`, `[null,1,"x"]`, "[\"\xff\"]"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if !json.Valid(b) {
			return
		}
		got := storableJSON(b)
		if !json.Valid(got) {
			t.Fatalf("storableJSON(%q) = %q: not JSON", b, got)
		}
		if !utf8.Valid(got) {
			t.Fatalf("storableJSON(%q) = %q: not UTF-8", b, got)
		}
		if refused(got) {
			t.Fatalf("storableJSON(%q) = %q: still holds an escape jsonb refuses", b, got)
		}
		if utf8.Valid(b) && !refused(b) && !bytes.Equal(got, b) {
			t.Fatalf("storableJSON(%q) = %q: changed input that needed no change", b, got)
		}
	})
}

// refused reports whether JSON b has a string escape jsonb refuses: a
// plain reference scan, written apart from storableJSON.
func refused(b []byte) bool {
	in := false
	for i := 0; i < len(b); i++ {
		switch {
		case !in && b[i] == '"':
			in = true
		case in && b[i] == '"':
			in = false
		case in && b[i] == '\\':
			if b[i+1] != 'u' {
				i++
				continue
			}
			r, _ := hex4(b, i+2)
			switch {
			case r == 0, r >= 0xDC00 && r <= 0xDFFF:
				return true
			case r >= 0xD800 && r <= 0xDBFF:
				lo, ok := hex4(b, i+8)
				if !ok || !strings.HasPrefix(string(b[i+6:]), `\u`) || lo < 0xDC00 || lo > 0xDFFF {
					return true
				}
				i += 11
				continue
			}
			i += 5
		}
	}
	return false
}

// Submit refuses what Postgres cannot store before it reaches the
// database, as SubmitMany does for each of its tasks: the caller gets an
// error that no retry can fix, never the database's refusal (which reads
// like an outage).
func TestSubmitRefusesUnstorableTask(t *testing.T) {
	t.Parallel()
	s, db := setup(t)
	ctx := context.Background()
	tests := []struct {
		name  string
		given func(*NewTask)
	}{
		{name: "NUL in params", given: func(nt *NewTask) { nt.Params = json.RawMessage(`{"prompt":"a\u0000b"}`) }},
		{name: "lone surrogate in params", given: func(nt *NewTask) { nt.Params = json.RawMessage(`{"prompt":"\ud800"}`) }},
		{name: "params not JSON", given: func(nt *NewTask) { nt.Params = json.RawMessage(`{"prompt":`) }},
		{name: "NUL in tenant", given: func(nt *NewTask) { nt.Tenant = "acme\x00" }},
		{name: "invalid UTF-8 in kind", given: func(nt *NewTask) { nt.Kind = "images\xff" }},
		{name: "NUL in fingerprint", given: func(nt *NewTask) { nt.Fingerprint = "v1:\x00" }},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			nt := newTask("unstorable-" + strconv.Itoa(i))
			tt.given(&nt)
			_, err := s.Submit(ctx, nt)
			var pgErr *pgconn.PgError
			if !errors.Is(err, ErrInvalidTask) || errors.As(err, &pgErr) {
				t.Errorf("Submit: %v; want ErrInvalidTask, before the database", err)
			}
			tx, err := db.pool(t).Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx)
			if _, err := s.SubmitTx(ctx, tx, nt); !errors.Is(err, ErrInvalidTask) || errors.As(err, &pgErr) {
				t.Errorf("SubmitTx: %v; want ErrInvalidTask, before the database", err)
			}
			if _, err := tx.Exec(ctx, `SELECT 1`); err != nil {
				t.Errorf("the caller's transaction is unusable after the refusal: %v", err)
			}
			res, err := s.SubmitMany(ctx, []NewTask{nt})
			if err != nil || !errors.Is(res[0].Err, ErrInvalidTask) {
				t.Errorf("SubmitMany: %v, %v; want the task's own ErrInvalidTask", err, res)
			}
		})
	}
	var n int
	if err := db.pool(t).QueryRow(ctx, `SELECT count(*) FROM idemgate_tasks`).Scan(&n); err != nil || n != 0 {
		t.Errorf("%d tasks stored (%v); want none", n, err)
	}
}
