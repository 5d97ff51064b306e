package middleware

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/idemgate/idemgate/fingerprint"
	"github.com/idemgate/idemgate/internal/devserver"
	"github.com/idemgate/idemgate/internal/testenv"
	"github.com/idemgate/idemgate/keyspace"
)

// testKey returns a fresh key that is not a keyspace key: version 1
// records live under the same key after the upgrade only there.
func testKey() string { return "idem:recordtest:" + newToken().String() }

// redisClients returns a miniredis client and a real redis-server client.
func redisClients(t *testing.T) map[string]*redis.Client {
	mr := miniredis.RunT(t)
	out := map[string]*redis.Client{
		"miniredis":    redis.NewClient(&redis.Options{Addr: mr.Addr()}),
		"redis-server": redis.NewClient(testenv.Redis(t)),
	}
	for _, c := range out {
		t.Cleanup(func() { c.Close() })
	}
	return out
}

// TestRedisV1Records: records the version 1 encoder wrote (before records
// version 2) replay, conflict, run and complete across the upgrade.
func TestRedisV1Records(t *testing.T) {
	t.Parallel()
	for name, client := range redisClients(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			s := NewRedisStore(client)
			req := ClaimRequest{Fingerprint: "v1:" + fingerprint.Fingerprint(strings.Repeat("7", 64)), Owner: "owner-a", Kind: "image", Lease: time.Minute, Token: newToken()}
			want := Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}, "X-Multi": {"a", "b"}}, Body: []byte("{\"id\":1}\x00\xff")}

			// Finished under version 1: replay and conflict.
			done := testKey()
			if err := client.Set(ctx, done, v1Finished(req.Token, req, want), time.Hour).Err(); err != nil {
				t.Fatal(err)
			}
			again := req
			again.Token = newToken()
			res, err := s.Claim(ctx, done, again)
			if err != nil || res.Status != Finished {
				t.Fatalf("Claim of a v1 finished record = %v, %v; want finished", res.Status, err)
			}
			sameResponse(t, res.Response, want)
			for what, m := range map[string]ClaimRequest{
				"fingerprint": {Fingerprint: "v1:" + fingerprint.Fingerprint(strings.Repeat("8", 64)), Owner: req.Owner, Kind: req.Kind},
				"owner":       {Fingerprint: req.Fingerprint, Owner: "owner-b", Kind: req.Kind},
				"kind":        {Fingerprint: req.Fingerprint, Owner: req.Owner, Kind: "imag"},
			} {
				m.Lease, m.Token = time.Minute, newToken()
				res, err := s.Claim(ctx, done, m)
				if err != nil || res.Status != Mismatch || res.Response.Body != nil || res.Changed != nil {
					t.Errorf("%s: Claim = %+v, %v; want a bare mismatch", what, res, err)
				}
			}
			if err := s.Complete(ctx, done, req.Token, Response{Status: 200}, time.Hour); err != nil {
				t.Errorf("resent Complete of a v1 finished record = %v, want nil", err)
			}

			// Claimed under version 1: running, resent claim, extend,
			// complete (by a version 2 node), then replay.
			running := testKey()
			if err := client.Set(ctx, running, v1Claim(req.Token, req), time.Minute).Err(); err != nil {
				t.Fatal(err)
			}
			if res, err := s.Claim(ctx, running, again); err != nil || res.Status != Running || res.RetryAfter <= 0 {
				t.Fatalf("Claim of a v1 claim = %+v, %v; want running", res, err)
			}
			if res, err := s.Claim(ctx, running, req); err != nil || res.Status != Claimed {
				t.Fatalf("resent claim on a v1 claim = %+v, %v; want claimed", res, err)
			}
			if err := s.Extend(ctx, running, again.Token, time.Minute); !errors.Is(err, ErrLeaseLost) {
				t.Errorf("Extend by another token = %v, want ErrLeaseLost", err)
			}
			if err := s.Extend(ctx, running, req.Token, time.Minute); err != nil {
				t.Errorf("Extend of a v1 claim = %v", err)
			}
			if err := s.Complete(ctx, running, req.Token, want, time.Hour); err != nil {
				t.Fatalf("Complete of a v1 claim = %v", err)
			}
			if err := s.Complete(ctx, running, req.Token, want, time.Hour); err != nil {
				t.Errorf("resent Complete = %v", err)
			}
			res, err = s.Claim(ctx, running, again)
			if err != nil || res.Status != Finished {
				t.Fatalf("Claim after completing a v1 claim = %v, %v", res.Status, err)
			}
			sameResponse(t, res.Response, want)

			// Released under version 2.
			released := testKey()
			if err := client.Set(ctx, released, v1Claim(req.Token, req), time.Minute).Err(); err != nil {
				t.Fatal(err)
			}
			if err := s.Release(ctx, released, again.Token); !errors.Is(err, ErrLeaseLost) {
				t.Errorf("Release by another token = %v, want ErrLeaseLost", err)
			}
			if err := s.Release(ctx, released, req.Token); err != nil {
				t.Errorf("Release of a v1 claim = %v", err)
			}
			if res, err := s.Claim(ctx, released, again); err != nil || res.Status != Claimed {
				t.Errorf("Claim after release = %v, %v", res.Status, err)
			}
		})
	}
}

// TestRedisRecordBytes measures what a record costs a real redis-server
// (used_memory delta over the keys added) for a small JSON response with
// two headers, in version 2 and, for comparison, as version 1 stored it
// (the same keyspace key in hex, the version 1 record). Run with -v to see
// the figures.
func TestRedisRecordBytes(t *testing.T) {
	if testing.Short() {
		t.Skip("starts its own redis-server")
	}
	ctx := context.Background()
	srv, err := devserver.StartRedis(ctx, 1)
	if err != nil {
		t.Skipf("redis-server: %v", err)
	}
	t.Cleanup(func() { srv.Stop() })
	client := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 4})
	t.Cleanup(func() { client.Close() })
	s := NewRedisStore(client)

	// A small JSON response with two headers, with a short task id and
	// with a UUID.
	responses := map[string]Response{
		"short id": {Status: http.StatusAccepted,
			Header: http.Header{"Content-Type": {"application/json"}, "Location": {"/v1/tasks/t_5Ho2Xa"}},
			Body:   []byte(`{"task_id":"t_5Ho2Xa","status":"pending"}`)},
		"uuid": {Status: http.StatusAccepted,
			Header: http.Header{"Content-Type": {"application/json"}, "Location": {"/v1/tasks/0192f5c4-7d1e-7cc0-9d6e-3f1b2a9c8e77"}},
			Body:   []byte(`{"task_id":"0192f5c4-7d1e-7cc0-9d6e-3f1b2a9c8e77","status":"pending"}`)},
	}
	spec := fingerprint.Spec{Fields: []string{"/prompt", "/aspect_ratio", "/n", "/reference_image"}}
	r, _ := http.NewRequest(http.MethodPost, "/v1/images", nil)
	r.Header.Set("Content-Type", "application/json")
	body := []byte(`{"prompt":"a lighthouse at dusk","aspect_ratio":"16:9","n":1}`)
	fp, sums, err := spec.SumRequestFields(r, body, nil)
	if err != nil {
		t.Fatal(err)
	}
	const n = 10000
	measure := func(name string, put func(i int, k keyspace.Key) error) float64 {
		t.Helper()
		if err := client.FlushAll(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		// The first records grow the dictionaries from nothing; start
		// from a populated one, as a server in use is.
		fill := func(from, to int) {
			for i := from; i < to; i++ {
				k, err := keyspace.Derive("images", keyspace.Scope{Tenant: "acme-prod", User: "user-" + strconv.Itoa(i%97), Request: "req-" + strconv.Itoa(i)})
				if err != nil {
					t.Fatal(err)
				}
				if err := put(i, k); err != nil {
					t.Fatalf("%s: %v", name, err)
				}
			}
		}
		fill(0, n)
		mem0, keys0 := usedMemory(t, client), dbSize(t, client)
		fill(n, 3*n)
		mem1, keys1 := usedMemory(t, client), dbSize(t, client)
		per := float64(mem1-mem0) / float64(keys1-keys0)
		t.Logf("%s: %.0f bytes per record (used_memory %+d over %d keys)", name, per, mem1-mem0, keys1-keys0)
		return per
	}
	for _, name := range []string{"short id", "uuid"} {
		resp := responses[name]
		v2 := measure(name+", version 2", func(i int, k keyspace.Key) error {
			req := ClaimRequest{Fingerprint: fp, Owner: k.Owner(), Kind: k.Kind(), Lease: time.Minute, Token: newToken(), Fields: sums}
			if _, err := s.Claim(ctx, k.String(), req); err != nil {
				return err
			}
			return s.Complete(ctx, k.String(), req.Token, resp, time.Hour)
		})
		v1 := measure(name+", version 1", func(i int, k keyspace.Key) error {
			req := ClaimRequest{Fingerprint: fp, Owner: k.Owner(), Kind: k.Kind()}
			return client.Set(ctx, k.String(), v1Finished(newToken(), req, resp), time.Hour).Err()
		})
		if name == "short id" && v2 > 300 {
			t.Errorf("%s: a version 2 record costs %.0f bytes, want at most 300", name, v2)
		}
		if v2 > v1*0.65 {
			t.Errorf("%s: a version 2 record costs %.0f bytes, version 1 %.0f: want at most 65%%", name, v2, v1)
		}
	}
}

func usedMemory(t *testing.T, c *redis.Client) int64 {
	t.Helper()
	info, err := c.Info(context.Background(), "memory").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "used_memory:"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatal("INFO memory has no used_memory")
	return 0
}

func dbSize(t *testing.T, c *redis.Client) int64 {
	t.Helper()
	n, err := c.DBSize(context.Background()).Result()
	if err != nil {
		t.Fatal(fmt.Errorf("DBSIZE: %w", err))
	}
	return n
}

// TestRedisReplayCPU measures what a replay costs a real redis-server in
// CPU (INFO cpu) against one GET of the same record, the same number of
// times from the same number of goroutines, alternating rounds. Run with
// -v to see the figures.
func TestRedisReplayCPU(t *testing.T) {
	if testing.Short() {
		t.Skip("starts its own redis-server")
	}
	ctx := context.Background()
	srv, err := devserver.StartRedis(ctx, 1)
	if err != nil {
		t.Skipf("redis-server: %v", err)
	}
	t.Cleanup(func() { srv.Stop() })
	const workers, perRound, rounds = 8, 4000, 4
	client := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: workers})
	t.Cleanup(func() { client.Close() })
	s := NewRedisStore(client)

	k, _ := keyspace.Derive("images", keyspace.Scope{Tenant: "acme", User: "alice", Request: "r1"})
	req := ClaimRequest{Fingerprint: "v1:" + fingerprint.Fingerprint(strings.Repeat("ab", 32)), Owner: k.Owner(), Kind: k.Kind(), Lease: time.Minute, Token: newToken(),
		Fields: []fingerprint.FieldSum{{1, 2}, {3, 4}, {5, 6}, {7, 8}}}
	if _, err := s.Claim(ctx, k.String(), req); err != nil {
		t.Fatal(err)
	}
	resp := Response{Status: http.StatusAccepted,
		Header: http.Header{"Content-Type": {"application/json"}, "Location": {"/v1/tasks/t_5Ho2Xa"}},
		Body:   []byte(`{"task_id":"t_5Ho2Xa","status":"pending"}`)}
	if err := s.Complete(ctx, k.String(), req.Token, resp, time.Hour); err != nil {
		t.Fatal(err)
	}
	stored, _ := storeKey(k.String(), "", "")
	replay := req
	replay.Token = newToken()
	run := func(op func() error) float64 {
		before := usedCPU(t, client)
		errs := make(chan error, workers)
		for range workers {
			go func() {
				for range perRound / workers {
					if err := op(); err != nil {
						errs <- err
						return
					}
				}
				errs <- nil
			}()
		}
		for range workers {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
		return usedCPU(t, client) - before
	}
	var replayCPU, getCPU float64
	for range rounds {
		replayCPU += run(func() error {
			res, err := s.Claim(ctx, k.String(), replay)
			if err == nil && res.Status != Finished {
				err = fmt.Errorf("claim = %v", res.Status)
			}
			return err
		})
		getCPU += run(func() error { return client.Get(ctx, stored).Err() })
	}
	n := float64(rounds * perRound)
	t.Logf("Redis CPU per replay %.1f µs, per GET of the same record %.1f µs: %.2f×", replayCPU*1e6/n, getCPU*1e6/n, replayCPU/getCPU)
	if replayCPU > 1.5*getCPU {
		t.Errorf("a replay costs Redis %.2f× a GET's CPU", replayCPU/getCPU)
	}
}

func usedCPU(t *testing.T, c *redis.Client) float64 {
	t.Helper()
	info, err := c.Info(context.Background(), "cpu").Result()
	if err != nil {
		t.Fatal(err)
	}
	var cpu float64
	for _, line := range strings.Split(info, "\n") {
		name, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && (name == "used_cpu_sys" || name == "used_cpu_user") {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatal(err)
			}
			cpu += f
		}
	}
	return cpu
}

// scriptCalls is a go-redis hook that counts EVALSHA and EVAL calls by the
// script's SHA-1 (EVAL by the SHA-1 of its source).
type scriptCalls struct {
	mu sync.Mutex
	n  map[string]int
}

func (h *scriptCalls) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *scriptCalls) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *scriptCalls) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		args := cmd.Args()
		if name := cmd.Name(); (name == "evalsha" || name == "eval") && len(args) > 1 {
			sha, _ := args[1].(string)
			if name == "eval" {
				sha = redis.NewScript(sha).Hash()
			}
			h.mu.Lock()
			h.n[sha]++
			h.mu.Unlock()
		}
		return next(ctx, cmd)
	}
}

func (h *scriptCalls) count(s *redis.Script) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.n[s.Hash()]
}

// TestRedisCompleteKnownClaim: a claim this store made completes by
// finishScript (head compared, record set whole) and leaves exactly the
// record completeScript leaves; one it did not make, or made under another
// key with the same token, completes by completeScript; both are fenced
// by the token in Redis.
func TestRedisCompleteKnownClaim(t *testing.T) {
	t.Parallel()
	for name, client := range redisClients(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			calls := &scriptCalls{n: map[string]int{}}
			client.AddHook(calls)
			s, other := NewRedisStore(client), NewRedisStore(client)
			key := func(request string) string {
				k, err := keyspace.Derive("images", keyspace.Scope{Tenant: "acme", User: "alice", Request: request + newToken().String()})
				if err != nil {
					t.Fatal(err)
				}
				return k.String()
			}
			alice, err := keyspace.Derive("images", keyspace.Scope{Tenant: "acme", User: "alice", Request: "x"})
			if err != nil {
				t.Fatal(err)
			}
			claim := func(k string, tok Token) ClaimRequest {
				return ClaimRequest{Fingerprint: "v1:" + fingerprint.Fingerprint(strings.Repeat("a", 64)), Owner: alice.Owner(), Kind: alice.Kind(),
					Lease: time.Minute, Token: tok, Fields: []fingerprint.FieldSum{{1, 2, 3, 4}, {5, 6, 7, 8}}}
			}
			resp := Response{Status: 202, Header: http.Header{"Content-Type": {"application/json"}, "Location": {"/v1/tasks/1"}}, Body: []byte(`{"task_id":"1"}`)}
			get := func(k string) string {
				sk, _ := storeKey(k, "", "")
				v, err := client.Get(ctx, sk).Result()
				if err != nil {
					t.Fatalf("GET %s: %v", k, err)
				}
				return v
			}

			// The same claim completed both ways stores the same bytes.
			tok := newToken()
			fast, slow := key("fast"), key("slow")
			for k, st := range map[string]*RedisStore{fast: s, slow: other} {
				if res, err := st.Claim(ctx, k, claim(k, tok)); err != nil || res.Status != Claimed {
					t.Fatalf("Claim = %v, %v", res.Status, err)
				}
			}
			// used says which scripts complete ran (a first EVALSHA
			// that finds no script is followed by EVAL).
			used := func(complete func() error) (finish, general bool) {
				f, g := calls.count(finishScript), calls.count(completeScript)
				if err := complete(); err != nil {
					t.Fatalf("Complete = %v", err)
				}
				return calls.count(finishScript) > f, calls.count(completeScript) > g
			}
			if finish, general := used(func() error { return s.Complete(ctx, fast, tok, resp, time.Hour) }); !finish || general {
				t.Errorf("a known claim completed by finishScript %t, completeScript %t; want finishScript only", finish, general)
			}
			if finish, general := used(func() error { return s.Complete(ctx, slow, tok, resp, time.Hour) }); finish || !general {
				t.Errorf("another store's claim completed by finishScript %t, completeScript %t; want completeScript only", finish, general)
			}
			// The response's headers are encoded in map order: compare
			// the rest byte for byte and the responses decoded.
			a, b := get(fast), get(slow)
			ra, errA := parseRecord(a)
			rb, errB := parseRecord(b)
			if errA != nil || errB != nil || a[:len(a)-len(ra.resp)] != b[:len(b)-len(rb.resp)] || !ra.finished {
				t.Errorf("finished records differ (%v, %v):\n known claim %q\n general     %q", errA, errB, a, b)
			}
			da, errA := decodeResponse(ra.resp)
			if _, errB := decodeResponse(rb.resp); errA != nil || errB != nil {
				t.Fatalf("decode: %v, %v", errA, errB)
			}
			sameResponse(t, da, resp)
			// Resent, and completed by another token: the answers of
			// completeScript.
			if err := s.Complete(ctx, fast, tok, resp, time.Hour); err != nil {
				t.Errorf("resent Complete = %v, want nil", err)
			}
			if err := s.Complete(ctx, fast, newToken(), resp, time.Hour); !errors.Is(err, ErrLeaseLost) {
				t.Errorf("Complete with another token = %v, want ErrLeaseLost", err)
			}

			// Fenced: the claim lost to another request, then its
			// Complete finds that request's claim and changes nothing.
			lost := key("lost")
			tok = newToken()
			if _, err := s.Claim(ctx, lost, claim(lost, tok)); err != nil {
				t.Fatal(err)
			}
			sk, _ := storeKey(lost, "", "")
			client.Del(ctx, sk)
			thief := newToken()
			if res, err := other.Claim(ctx, lost, claim(lost, thief)); err != nil || res.Status != Claimed {
				t.Fatalf("the second claim = %v, %v", res.Status, err)
			}
			held := get(lost)
			if err := s.Complete(ctx, lost, tok, resp, time.Hour); !errors.Is(err, ErrLeaseLost) {
				t.Errorf("Complete of a lost claim = %v, want ErrLeaseLost", err)
			}
			if got := get(lost); got != held {
				t.Errorf("a lost claim's Complete changed the record: %q, was %q", got, held)
			}
			if err := other.Complete(ctx, lost, thief, resp, time.Hour); err != nil {
				t.Errorf("the holder's Complete = %v", err)
			}

			// One token on two keys with other parameters: each key
			// keeps its own fingerprint.
			tok = newToken()
			one, two := key("one"), key("two")
			reqOne, reqTwo := claim(one, tok), claim(two, tok)
			reqTwo.Fingerprint = "v1:" + fingerprint.Fingerprint(strings.Repeat("b", 64))
			s.Claim(ctx, one, reqOne)
			s.Claim(ctx, two, reqTwo)
			for _, k := range []string{one, two} {
				if err := s.Complete(ctx, k, tok, resp, time.Hour); err != nil {
					t.Fatalf("Complete = %v", err)
				}
			}
			for k, req := range map[string]ClaimRequest{one: reqOne, two: reqTwo} {
				req.Token = newToken()
				if res, err := other.Claim(ctx, k, req); err != nil || res.Status != Finished {
					t.Errorf("replay after one token on two keys = %v, %v; want finished", res.Status, err)
				}
			}

			// A released claim is forgotten.
			rel := key("released")
			tok = newToken()
			s.Claim(ctx, rel, claim(rel, tok))
			if err := s.Release(ctx, rel, tok); err != nil {
				t.Fatal(err)
			}
			if _, ok := s.claims.m[tok]; ok {
				t.Error("a released claim is still remembered")
			}
		})
	}
}

// TestClaimCacheBound: the cache holds at most maxCachedClaims claims;
// when full, it drops those past their lease, and otherwise remembers no
// more (those claims complete by the general script).
func TestClaimCacheBound(t *testing.T) {
	t.Parallel()
	var c claimCache
	rec := []byte("\x02Crecord")
	for i := range maxCachedClaims {
		var tok Token
		binary.BigEndian.PutUint64(tok[:], uint64(i))
		c.add(tok, "key", "k", rec, -time.Second) // already past its lease
	}
	fresh := newToken()
	c.add(fresh, "key", "k", rec, time.Minute)
	if len(c.m) != 1 {
		t.Fatalf("a full cache of expired claims kept %d after an add, want 1", len(c.m))
	}
	for i := range maxCachedClaims - 1 {
		var tok Token
		binary.BigEndian.PutUint64(tok[:], uint64(i))
		c.add(tok, "key", "k", rec, time.Minute)
	}
	late := newToken()
	c.add(late, "key", "k", rec, time.Minute)
	if _, ok := c.m[late]; ok || len(c.m) != maxCachedClaims {
		t.Errorf("a cache full of live claims took another (%d held)", len(c.m))
	}
	arg := &scriptArg{}
	if k, ok := c.take(fresh, "key", arg); !ok || k != "k" || string(arg.b) != string(rec) {
		t.Errorf("take = %q, %t, %q; want k and the record", k, ok, arg.b)
	}
	if _, ok := c.take(fresh, "key", &scriptArg{}); ok {
		t.Error("a claim was taken twice")
	}
	if _, ok := c.take(late, "other key", &scriptArg{}); ok {
		t.Error("a claim was taken under another key")
	}
	c.add(late, "key", "k", make([]byte, maxCachedRecord+1), time.Minute)
	if _, ok := c.m[late]; ok {
		t.Error("a record too long to hold inline was remembered")
	}
}
