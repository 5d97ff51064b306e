package cli

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/fingerprint"
	"github.com/idemgate/idemgate/internal/testenv"
	"github.com/idemgate/idemgate/keyspace"
	"github.com/idemgate/idemgate/redisstore"
)

// blockedStdin is a terminal nobody types at: Read says that it was
// called and blocks until the test ends.
type blockedStdin struct {
	reading chan struct{}
	once    sync.Once
	done    chan struct{}
}

func (b *blockedStdin) Read([]byte) (int, error) {
	b.once.Do(func() { close(b.reading) })
	<-b.done
	return 0, fmt.Errorf("test over")
}

// lockedBuffer is a bytes.Buffer that a running command and the test may
// use at once.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// stuckRedisClaim claims a fresh key in Redis as a holder that stopped
// renewing would leave it, and returns the command's environment and the
// flags that name the key.
func stuckRedisClaim(t *testing.T) (store *redisstore.Store, key string, getenv func(string) string, flags []string) {
	t.Helper()
	opts := testenv.Redis(t)
	client := redis.NewClient(opts)
	t.Cleanup(func() { _ = client.Close() })
	store = redisstore.New(client)
	request := "confirm-" + fmt.Sprint(time.Now().UnixNano())
	k, err := keyspace.Derive("images", keyspace.Scope{Tenant: "acme", User: "alice", Request: request})
	if err != nil {
		t.Fatal(err)
	}
	res, err := store.Claim(context.Background(), k.String(), idemgate.ClaimRequest{
		Fingerprint: fingerprint.Fingerprint("v1:" + strings.Repeat("ab", 32)), Owner: k.Owner(), Kind: k.Kind(),
		Lease: time.Minute, Token: claimToken(time.Now().Add(-3*time.Minute), 8*time.Minute)})
	if err != nil || res.Status != idemgate.Claimed {
		t.Fatalf("claim: %v %v", res.Status, err)
	}
	url := fmt.Sprintf("redis://%s/%d", opts.Addr, opts.DB)
	getenv = func(k string) string {
		if k == "REDIS_URL" {
			return url
		}
		return ""
	}
	return store, k.String(), getenv, []string{"-store", "redis", "-tenant", "acme", "-user", "alice", "-request-id", request, "-kind", "images"}
}

// Ctrl-C at the question ends the command, nothing changed: the line
// typed next must not become the answer.
func TestConfirmationEndsOnInterrupt(t *testing.T) {
	t.Parallel()
	store, key, getenv, flags := stuckRedisClaim(t)
	stdin := &blockedStdin{reading: make(chan struct{}), done: make(chan struct{})}
	t.Cleanup(func() { close(stdin.done) })
	ctx, interrupt := context.WithCancel(context.Background())
	defer interrupt()
	var stdout, stderr lockedBuffer
	exit := make(chan int, 1)
	go func() {
		exit <- Main(ctx, append([]string{"records", "release"}, flags...),
			Env{Prog: "idemgate", Getenv: getenv, Stdin: stdin, Stdout: &stdout, Stderr: &stderr, StdinIsTerminal: true})
	}()
	select {
	case <-stdin.reading:
	case code := <-exit:
		t.Fatalf("exit %d before the question was read\nstdout: %s\nstderr: %s", code, stdout.String(), stderr.String())
	}
	interrupt() // what signal.NotifyContext does on SIGINT
	select {
	case code := <-exit:
		if code != ExitError || !strings.Contains(stderr.String(), "nothing changed") {
			t.Fatalf("exit %d after Ctrl-C; want 1, nothing changed\nstderr: %s", code, stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("still waiting for a line 30s after Ctrl-C\nstderr: %s", stderr.String())
	}
	if _, err := store.Inspect(context.Background(), key); err != nil {
		t.Fatalf("the claim after an interrupted release: %v; want it still held", err)
	}
}

// The person asked must see what they confirm, also with -json (stdout
// is for the answer) or a redirected stdout: the record goes to stderr,
// beside the question, and stdout stays empty until there is an answer.
func TestConfirmationShowsTheRecordOnStderr(t *testing.T) {
	t.Parallel()
	for _, json := range []bool{false, true} {
		t.Run(fmt.Sprint("json=", json), func(t *testing.T) {
			t.Parallel()
			_, _, getenv, flags := stuckRedisClaim(t)
			args := append([]string{"records", "release"}, flags...)
			if json {
				args = append(args, "-json")
			}
			var stdout, stderr bytes.Buffer
			code := Main(context.Background(), args, Env{Prog: "idemgate", Getenv: getenv, Stdin: strings.NewReader("no\n"),
				Stdout: &stdout, Stderr: &stderr, StdinIsTerminal: true})
			if code != ExitError {
				t.Fatalf("exit %d; want 1 (not confirmed)\n%s", code, stderr.String())
			}
			question := strings.Index(stderr.String(), "Type yes")
			record := strings.Index(stderr.String(), "token:")
			if record < 0 || question < record || stdout.Len() != 0 {
				t.Fatalf("want the record on stderr before the question, nothing on stdout\nstdout: %s\nstderr: %s", stdout.String(), stderr.String())
			}
		})
	}
}
