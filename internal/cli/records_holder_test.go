package cli

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/labstack/echo/v4"
	"github.com/redis/go-redis/v9"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/fingerprint"
	"github.com/idemgate/idemgate/internal/testenv"
	"github.com/idemgate/idemgate/keyspace"
	"github.com/idemgate/idemgate/middleware"
	"github.com/idemgate/idemgate/pgrecords"
	"github.com/idemgate/idemgate/redisstore"
)

// holderBench is a store of records and the environment that points the
// command at it.
type holderBench struct {
	store interface {
		idemgate.Store
		idemgate.Inspector
	}
	env  map[string]string
	name string // -store
}

func holderBenches() map[string]func(t *testing.T) holderBench {
	return map[string]func(t *testing.T) holderBench{
		"redis": func(t *testing.T) holderBench {
			o := testenv.Redis(t)
			c := redis.NewClient(o)
			t.Cleanup(func() { _ = c.Close() })
			return holderBench{store: redisstore.New(c), env: map[string]string{"REDIS_URL": fmt.Sprintf("redis://%s/%d", o.Addr, o.DB)}, name: "redis"}
		},
		"postgres": func(t *testing.T) holderBench {
			dsn := testenv.PostgresDSN(t)
			pool, err := pgxpool.New(context.Background(), dsn)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(pool.Close)
			s, err := pgrecords.New(context.Background(), pool)
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Migrate(context.Background()); err != nil {
				t.Fatal(err)
			}
			return holderBench{store: s, env: map[string]string{"DATABASE_URL": dsn}, name: "postgres"}
		},
	}
}

func (b holderBench) run(ctx context.Context, args ...string) (code int, stdout, stderr string) {
	var out, errOut bytes.Buffer
	env := Env{Prog: "idemgate", Getenv: func(k string) string { return b.env[k] }, Stdin: strings.NewReader(""),
		Stdout: &out, Stderr: &errOut}
	code = Main(ctx, append(args, "-store", b.name), env)
	return code, out.String(), errOut.String()
}

// claimToken lays a token out as the middleware makes it (see
// idemgate.Token.ClaimTimes): the claim's time and lease, random bits.
func claimToken(at time.Time, lease time.Duration) idemgate.Token {
	var t idemgate.Token
	_, _ = rand.Read(t[:])
	binary.BigEndian.PutUint64(t[:8], uint64(at.UnixMilli())<<16|uint64(binary.BigEndian.Uint16(t[6:8])))
	t[6] = 0x80 | t[6]&0x0f
	t[8] = 0x80 | t[8]&0x3f
	binary.BigEndian.PutUint32(t[9:13], uint32(lease.Milliseconds()))
	return t
}

// A claim whose handler still runs is renewed every Lease/3. records
// release refuses it, saying why, and leaves the claim to its handler;
// with -force it releases it and warns that the handler's effects may
// happen twice. The claim is held by a real echo middleware request
// whose handler blocks, checked past one whole lease, so that only the
// renewals keep it.
func TestRecordsReleaseRefusesALiveClaim(t *testing.T) {
	t.Parallel()
	for name, newBench := range holderBenches() {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := newBench(t)
			ctx := context.Background()
			const lease = 3 * time.Second
			running, finish := make(chan struct{}), make(chan struct{})
			e := echo.New()
			e.Use(middleware.New(middleware.Config{
				Store: b.store, Kind: "charges", Lease: lease,
				Scope: func(echo.Context) (string, string, error) { return "acme", "alice", nil },
			}))
			e.POST("/charges", func(c echo.Context) error {
				close(running)
				<-finish
				return c.String(http.StatusCreated, "charged")
			})
			srv := httptest.NewServer(e)
			t.Cleanup(srv.Close)
			answered := make(chan error, 1)
			go func() {
				req, _ := http.NewRequest(http.MethodPost, srv.URL+"/charges", strings.NewReader(`{"amount":100}`))
				req.Header.Set("Idempotency-Key", "charge-7")
				req.Header.Set("Content-Type", "application/json")
				resp, err := http.DefaultClient.Do(req)
				if err == nil {
					resp.Body.Close()
				}
				answered <- err
			}()
			defer func() {
				close(finish)
				<-answered
			}()
			select {
			case <-running:
			case err := <-answered:
				t.Fatalf("the request ended before its handler ran: %v", err)
			}
			key, err := keyspace.Derive("charges", keyspace.Scope{Tenant: "acme", User: "alice", Request: "charge-7"})
			if err != nil {
				t.Fatal(err)
			}
			held, err := b.store.Inspect(ctx, key.String())
			if err != nil {
				t.Fatal(err)
			}
			if held.Lease != lease || held.ClaimedAt.IsZero() {
				t.Fatalf("the claim records lease %v, claimed at %v; want %v and a time", held.Lease, held.ClaimedAt, lease)
			}
			// Past one whole lease: only renewals keep the claim.
			for deadline := time.Now().Add(time.Minute); time.Since(held.ClaimedAt) < lease+lease/3; {
				if time.Now().After(deadline) {
					t.Fatalf("the claim of %v is not a lease old after a minute", held.ClaimedAt)
				}
				time.Sleep(100 * time.Millisecond)
			}
			flags := []string{"-tenant", "acme", "-user", "alice", "-request-id", "charge-7", "-kind", "charges"}

			code, stdout, stderr := b.run(ctx, append([]string{"records", "show"}, flags...)...)
			if code != ExitOK || !strings.Contains(stdout, "holder:") || !strings.Contains(stdout, "live") || !strings.Contains(stdout, "last renewed:") || !strings.Contains(stdout, "claimed:") {
				t.Fatalf("show: exit %d; want the claim's times and a live holder\nstdout: %s\nstderr: %s", code, stdout, stderr)
			}
			code, stdout, stderr = b.run(ctx, append([]string{"records", "release", "-yes"}, flags...)...)
			if code != ExitError || !strings.Contains(stderr, "refusing to release") || !strings.Contains(stderr, "may happen twice") || !strings.Contains(stderr, "-force") {
				t.Fatalf("release of a live claim: exit %d; want 1 and a refusal naming -force and the double run\nstdout: %s\nstderr: %s", code, stdout, stderr)
			}
			if now, err := b.store.Inspect(ctx, key.String()); err != nil || now.Token != held.Token {
				t.Fatalf("after the refused release the handler's claim is %+v, %v; want token %s", now, err, held.Token)
			}

			code, stdout, stderr = b.run(ctx, append([]string{"records", "release", "-yes", "-force"}, flags...)...)
			if code != ExitOK || !strings.Contains(stdout, "claim released") || !strings.Contains(stderr, "warning:") || !strings.Contains(stderr, "may happen twice") {
				t.Fatalf("release -force: exit %d; want 0, released, and a warning of a double run\nstdout: %s\nstderr: %s", code, stdout, stderr)
			}
			if _, err := b.store.Inspect(ctx, key.String()); !errors.Is(err, idemgate.ErrNoRecord) {
				t.Fatalf("after release -force: %v; want no record", err)
			}
		})
	}
}

// A claim nobody renews (its holder crashed) is released without -force
// once 5/6 of its lease have passed since its last renewal; a claim an
// older idemgate made (a random token: no lease recorded) cannot be told
// live or stuck, and needs -force.
func TestRecordsReleaseTellsAStuckClaim(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		token     func() idemgate.Token
		leaseLeft time.Duration // what the store's lease says
		force     bool
		wantCode  int
		wantOut   string
	}{
		{name: "stuck: not renewed for 7/8 of its lease", token: func() idemgate.Token { return claimToken(time.Now().Add(-3*time.Minute), 4*time.Minute) },
			leaseLeft: 30 * time.Second, wantCode: ExitOK, wantOut: "claim released"},
		{name: "live: renewed a minute ago, 10m lease", token: func() idemgate.Token { return claimToken(time.Now().Add(-time.Hour), 10*time.Minute) },
			leaseLeft: 9 * time.Minute, wantCode: ExitError, wantOut: "refusing to release"},
		{name: "unknown: random token", token: func() idemgate.Token {
			var t idemgate.Token
			_, _ = rand.Read(t[:])
			t[6] = 0x40 | t[6]&0x0f // version 4, as crypto/rand's tokens are 1 in 16
			return t
		}, leaseLeft: time.Minute, wantCode: ExitError, wantOut: "cannot be told"},
		{name: "unknown: random token, -force", token: func() idemgate.Token {
			var t idemgate.Token
			_, _ = rand.Read(t[:])
			t[6] = 0x40 | t[6]&0x0f
			return t
		}, leaseLeft: time.Minute, force: true, wantCode: ExitOK, wantOut: "claim released"},
	}
	for name, newBench := range holderBenches() {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := newBench(t)
			ctx := context.Background()
			for _, tt := range tests {
				t.Run(tt.name, func(t *testing.T) {
					request := "stuck-" + rand.Text()
					k, err := keyspace.Derive("images", keyspace.Scope{Tenant: "acme", User: "alice", Request: request})
					if err != nil {
						t.Fatal(err)
					}
					res, err := b.store.Claim(ctx, k.String(), idemgate.ClaimRequest{
						Fingerprint: fingerprint.Fingerprint("v1:" + strings.Repeat("ab", 32)), Owner: k.Owner(), Kind: k.Kind(),
						Lease: tt.leaseLeft, Token: tt.token()})
					if err != nil || res.Status != idemgate.Claimed {
						t.Fatalf("claim: %v %v", res.Status, err)
					}
					args := []string{"records", "release", "-yes", "-tenant", "acme", "-user", "alice", "-request-id", request, "-kind", "images"}
					if tt.force {
						args = append(args, "-force")
					}
					code, stdout, stderr := b.run(ctx, args...)
					if code != tt.wantCode || !strings.Contains(stdout+stderr, tt.wantOut) {
						t.Fatalf("exit %d; want %d and %q\nstdout: %s\nstderr: %s", code, tt.wantCode, tt.wantOut, stdout, stderr)
					}
					_, err = b.store.Inspect(ctx, k.String())
					if released := errors.Is(err, idemgate.ErrNoRecord); released != (tt.wantCode == ExitOK) {
						t.Fatalf("released %v (%v) after exit %d", released, err, code)
					}
				})
			}
		})
	}
}

// A live holder whose one renewal failed retries 2/3 of a lease after its
// last success and may take up to Lease/12 more to land: it is still
// live. Only a claim not renewed for 5/6 of its lease is stuck.
func TestHolderOfLeavesAFailedRenewalTimeToLand(t *testing.T) {
	t.Parallel()
	const lease = 30 * time.Second
	tests := []struct {
		name      string
		since     time.Duration // since the last renewal
		lease     time.Duration
		claimedIn time.Duration // from now
		want      string
	}{
		{name: "just renewed", since: 0, lease: lease, want: holderLive},
		{name: "one renewal period", since: lease / 3, lease: lease, want: holderLive},
		{name: "a failed renewal's retry begins", since: lease * 2 / 3, lease: lease, want: holderLive},
		{name: "the retry lands late", since: lease*2/3 + lease/12 - time.Millisecond, lease: lease, want: holderLive},
		{name: "five sixths", since: lease * 5 / 6, lease: lease, want: holderStuck},
		{name: "about to run out", since: lease - time.Millisecond, lease: lease, want: holderStuck},
		{name: "no lease recorded", since: time.Second, lease: 0, want: holderUnknown},
		{name: "more left than the lease", since: -time.Minute, lease: lease, want: holderUnknown},
		{name: "claimed in the future", since: time.Second, lease: lease, claimedIn: 48 * time.Hour, want: holderUnknown},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			now := time.Now()
			info := idemgate.RecordInfo{Lease: tt.lease, Left: tt.lease - tt.since, ClaimedAt: now.Add(tt.claimedIn - tt.since)}
			if got, _ := holderOf(info, now); got != tt.want {
				t.Fatalf("holderOf(lease %v, renewed %v ago) = %s, want %s", tt.lease, tt.since, got, tt.want)
			}
		})
	}
}

// A renewal that stalls until its timeout (Lease/3: a partition, a
// failover that drops packets) is tried again Lease/12 after it ended:
// 3/4 of a lease after the last success, its retry only begins, and may
// take a while to land. That holder is live (its handler runs), and
// releasing its claim runs the handler twice; only a claim not renewed
// for 5/6 of its lease, the retry given Lease/12 to land, is stuck.
func TestHolderOfLeavesARenewalThatTimedOutTimeToRetry(t *testing.T) {
	t.Parallel()
	for _, lease := range []time.Duration{3 * time.Second, 30 * time.Second, 10 * time.Minute} {
		every := lease / 3
		// The middleware's schedule (middleware/lease.go): the last success
		// at 0, the next renewal begins at every and times out at 2*every,
		// the retry begins every/4 after that.
		retryBegins := 2*every + every/4
		for _, since := range []time.Duration{retryBegins, retryBegins + lease/12 - time.Millisecond} {
			now := time.Now()
			info := idemgate.RecordInfo{Lease: lease, Left: lease - since, ClaimedAt: now.Add(-since)}
			if got, _ := holderOf(info, now); got != holderLive {
				t.Errorf("lease %v, renewed %v ago (a timed-out renewal's retry under way): holderOf = %s, want %s",
					lease, since, got, holderLive)
			}
		}
		now := time.Now()
		since := lease * 5 / 6
		if got, _ := holderOf(idemgate.RecordInfo{Lease: lease, Left: lease - since, ClaimedAt: now.Add(-since)}, now); got != holderStuck {
			t.Errorf("lease %v, renewed %v ago (5/6): holderOf = %s, want %s", lease, since, got, holderStuck)
		}
	}
}
