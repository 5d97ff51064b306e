package redisstore_test

import (
	"context"
	"crypto/rand"
	"errors"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/internal/devserver"
	"github.com/idemgate/idemgate/internal/testenv"
	"github.com/idemgate/idemgate/keyspace"
	"github.com/idemgate/idemgate/redisstore"
	"github.com/idemgate/idemgate/storetest"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

// newClients returns two clients made by dial, closed when t ends: the
// harness's Store and Other, as two nodes of a service would have.
func newClients(t *testing.T, dial func() redis.UniversalClient) (idemgate.Store, idemgate.Store) {
	t.Helper()
	one, two := dial(), dial()
	t.Cleanup(func() { one.Close(); two.Close() })
	return redisstore.New(one), redisstore.New(two)
}

// miniredisHarness is the Redis store on miniredis, whose clock the
// harness moves. miniredis keeps its data in memory across Restart, so
// its durability run checks that the clients reconnect, not persistence.
func miniredisHarness(t *testing.T) storetest.Harness {
	mr := miniredis.RunT(t)
	one, two := newClients(t, func() redis.UniversalClient { return redis.NewClient(&redis.Options{Addr: mr.Addr()}) })
	return storetest.Harness{
		Store:   one,
		Other:   two,
		Advance: mr.FastForward,
		Lease:   30 * time.Second,
		Restart: func(t *testing.T) {
			mr.Close()
			if err := mr.Restart(); err != nil {
				t.Fatalf("restart miniredis: %v", err)
			}
		},
	}
}

func TestRedisStoreMiniredis(t *testing.T) {
	t.Parallel()
	storetest.Run(t, miniredisHarness)
}

func TestRedisStoreMiniredisDurability(t *testing.T) {
	t.Parallel()
	storetest.RunDurability(t, miniredisHarness)
}

// realLease is long enough for a loaded 2-core machine to answer within it,
// short enough to sleep through.
const realLease = 600 * time.Millisecond

func TestRedisStoreServer(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(t *testing.T) storetest.Harness {
		opts := testenv.Redis(t)
		one, two := newClients(t, func() redis.UniversalClient { return redis.NewClient(opts) })
		return storetest.Harness{Store: one, Other: two, Advance: time.Sleep, Lease: realLease}
	})
}

// TestRedisStoreServerDurability runs the durability cases on a
// redis-server of their own that appends every write to its file and
// fsyncs it before answering (appendonly yes, appendfsync always), and
// that Restart kills (SIGKILL, no shutdown save) and starts again on the
// same files. Redis without persistence (the default of testenv's server)
// loses every record on a restart.
func TestRedisStoreServerDurability(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srv, err := devserver.StartRedis(ctx, 0, "--appendonly", "yes", "--appendfsync", "always")
	if err != nil {
		if errors.Is(err, devserver.ErrMissing) && (testing.Short() || os.Getenv("TEST_REDIS_URL") != "") {
			t.Skipf("no redis-server to restart: %v", err)
		}
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Stop() })
	storetest.RunDurability(t, func(t *testing.T) storetest.Harness {
		opts := &redis.Options{Addr: srv.Addr}
		one, two := newClients(t, func() redis.UniversalClient { return redis.NewClient(opts) })
		return storetest.Harness{
			Store: one, Other: two, Advance: time.Sleep, Lease: realLease,
			Restart: func(t *testing.T) {
				if err := srv.Kill(); err != nil {
					t.Fatalf("kill redis-server: %v", err)
				}
				if err := srv.Restart(ctx); err != nil {
					t.Fatalf("restart redis-server: %v", err)
				}
			},
		}
	})
}

// TestRedisStoreCluster runs the suite on a 3-node Redis Cluster: every
// script touches one key, so none fails with CROSSSLOT, and the random keys
// land on all three nodes. Its nodes run without persistence, so the
// durability cases skip; TestRedisStoreServerDurability covers the store.
func TestRedisStoreCluster(t *testing.T) {
	t.Parallel()
	addrs := testenv.RedisCluster(t)
	newHarness := func(t *testing.T) storetest.Harness {
		one, two := newClients(t, func() redis.UniversalClient { return redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs}) })
		return storetest.Harness{Store: one, Other: two, Advance: time.Sleep, Lease: realLease}
	}
	storetest.Run(t, newHarness)
	t.Run("durability", func(t *testing.T) { storetest.RunDurability(t, newHarness) })

	// The keys of one run really spread over the nodes.
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	defer client.Close()
	store := redisstore.New(client)
	ctx := context.Background()
	nodes := map[string]bool{}
	for range 32 {
		key := storetest.Key(t)
		if _, err := store.Claim(ctx, key, idemgate.ClaimRequest{Fingerprint: "v1:x", Owner: "o", Kind: "k", Lease: time.Second}); err != nil {
			t.Fatalf("Claim on the cluster: %v", err)
		}
		shard, err := client.MasterForKey(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		nodes[shard.Options().Addr] = true
	}
	if len(nodes) < 2 {
		t.Errorf("32 keys landed on %d node(s); the cluster test proves nothing", len(nodes))
	}

	// Compact keyspace keys ("…:{}" and raw digests) spread too: the empty
	// hash tag makes the cluster hash the whole key.
	tenant := "spread-" + newToken().String()[:8]
	for i := range 32 {
		k, err := keyspace.Derive("image", keyspace.Scope{Tenant: tenant, User: "u", Request: strconv.Itoa(i)})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := store.Claim(ctx, k.String(), idemgate.ClaimRequest{Fingerprint: "v1:x", Owner: k.Owner(), Kind: k.Kind(), Lease: time.Minute}); err != nil {
			t.Fatalf("Claim on the cluster: %v", err)
		}
	}
	var mu sync.Mutex
	holding := 0
	err := client.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
		keys, _, err := node.Scan(ctx, 0, "idem:"+tenant+":image:{}*", 10000).Result()
		mu.Lock()
		defer mu.Unlock()
		if len(keys) > 0 {
			holding++
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if holding < 2 {
		t.Errorf("32 compact keys landed on %d node(s), want them spread", holding)
	}
}

// pre70 makes a client talk like Redis before 7.0: SET … NX … GET is sent
// with an option the server does not know, so the server itself answers
// "ERR syntax error", as Redis 6.2 does.
type pre70 struct{ refused atomic.Int64 }

func (p *pre70) DialHook(next redis.DialHook) redis.DialHook { return next }
func (p *pre70) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		args := cmd.Args()
		if cmd.Name() == "set" && len(args) > 0 && args[len(args)-1] == "get" {
			args[len(args)-1] = "get-before-7.0"
			p.refused.Add(1)
		}
		return next(ctx, cmd)
	}
}
func (p *pre70) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestRedisStorePre70: a server that refuses SET NX GET is detected at the
// first claim, once, and claims go through the script from then on; the
// whole conformance suite holds.
func TestRedisStorePre70(t *testing.T) {
	t.Parallel()
	t.Run("suite", func(t *testing.T) {
		t.Parallel()
		storetest.Run(t, func(t *testing.T) storetest.Harness {
			mr := miniredis.RunT(t)
			client := redis.NewClient(&redis.Options{Addr: mr.Addr()})
			client.AddHook(&pre70{})
			t.Cleanup(func() { client.Close() })
			return storetest.Harness{Store: redisstore.New(client), Advance: mr.FastForward, Lease: 30 * time.Second}
		})
	})
	mr := miniredis.RunT(t)
	for name, opts := range map[string]*redis.Options{"miniredis": {Addr: mr.Addr()}, "redis-server": testenv.Redis(t)} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			client := redis.NewClient(opts)
			t.Cleanup(func() { client.Close() })
			hook := &pre70{}
			client.AddHook(hook)
			s := redisstore.New(client)
			ctx := context.Background()
			key := storetest.Key(t)
			req := idemgate.ClaimRequest{Fingerprint: "v1:x", Owner: "o", Kind: "k", Lease: time.Minute, Token: newToken()}
			for i, want := range []idemgate.ClaimStatus{idemgate.Claimed, idemgate.Claimed, idemgate.Running} {
				if i == 2 {
					req.Token = newToken()
				}
				res, err := s.Claim(ctx, key, req)
				if err != nil || res.Status != want {
					t.Fatalf("claim %d = %v, %v; want %v", i, res.Status, err, want)
				}
			}
			if n := hook.refused.Load(); n != 1 {
				t.Errorf("SET NX GET sent %d times to a server that refuses it, want once", n)
			}
		})
	}
}

func newToken() idemgate.Token {
	var t idemgate.Token
	_, _ = rand.Read(t[:])
	return t
}
