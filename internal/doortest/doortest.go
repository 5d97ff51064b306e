// Package doortest is the behaviour suite of idemgate's doors: every
// adapter that puts the engine in front of a web framework's handlers
// (middleware for echo, idemhttp for net/http and the routers on top of it)
// runs the same HTTP cases, as middleware/storetest runs the same cases
// against every store.
//
// The cases encode what the echo middleware does, which is the contract:
// a retry replays the first answer byte for byte; drifted parameters are
// key_reused, naming the changed fields; path values and the query take
// part in the fingerprint; a retry while the first request runs is
// request_in_progress, or waits and replays; body limits; a stored gzip
// answer for a retry that does not accept gzip; what is stored and what is
// released (5xx, 429, an answer over the response limit); x-should-retry
// and Cache-Control: no-store on every problem; a client gone before the
// claim, during the handler or with its connection; Flush and Hijack
// through the middleware; panics; the router's
// own 404 and 405, untouched; methods not protected; the key's problems;
// an unreachable store; retention; and, on PostgreSQL, an Atomic route
// whose writes commit with the stored answer.
//
// A door's test builds servers through a Door:
//
//	func TestDoor(t *testing.T) {
//		doortest.Run(t, doortest.Door{New: func(t *testing.T, s doortest.Setup) http.Handler {
//			mux := http.NewServeMux()
//			mw := idemhttp.New(idemhttp.Config{Store: s.Config.Store, …})
//			for _, r := range s.Routes {
//				mux.Handle(r.Method+" "+r.Pattern, mw(r.Handler))
//			}
//			return mux
//		}})
//	}
//
// Run starts a real redis-server and a real PostgreSQL through
// internal/testenv, so the test binary needs
// func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }. Every case
// runs once on the Redis store and once on pgrecords; the cases of a store
// share one Redis database or one PostgreSQL database, each case under a
// tenant of its own.
package doortest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/fingerprint"
	"github.com/idemgate/idemgate/internal/testenv"
	"github.com/idemgate/idemgate/pgrecords"
	"github.com/idemgate/idemgate/redisstore"
)

// Door builds servers protected by the adapter under test.
type Door struct {
	// New returns a server that runs each of s.Routes on the framework's
	// router, protected by the adapter configured from s.Config (every
	// field, each onto its namesake). Where the framework lets middleware
	// see requests that match no route (echo's e.Use, chi's r.Use), mount
	// it there, so that the suite's 404 and 405 cases prove something; a
	// framework with a recovery middleware for panics (echo's Recover) has
	// it outermost. Required.
	New func(t *testing.T, s Setup) http.Handler
}

// Setup is one server of a case.
type Setup struct {
	// Routes are the routes to serve, each with its handler.
	Routes []Route
	// Config is the adapter's configuration.
	Config Config
}

// Route is a route of the suite.
type Route struct {
	// Method is the request method the route serves: POST, PUT or GET.
	Method string
	// Pattern is the route's path with {name} wildcards, one a segment:
	// "/v1/orders/{id}/refund". ColonPattern gives echo's spelling.
	Pattern string
	// Handler answers the route's requests.
	Handler http.HandlerFunc
}

// ColonPattern spells a pattern's wildcards as echo, gin and httprouter
// do: "/v1/orders/{id}/refund" becomes "/v1/orders/:id/refund".
func ColonPattern(pattern string) string {
	segs := strings.Split(pattern, "/")
	for i, s := range segs {
		if strings.HasPrefix(s, "{") && strings.HasSuffix(s, "}") {
			segs[i] = ":" + s[1:len(s)-1]
		}
	}
	return strings.Join(segs, "/")
}

// Config is the adapter's configuration in framework-neutral terms: each
// field means what its namesake of middleware.Config means, and a door
// copies every one. Skipper and Scope read the request, where echo's read
// the echo.Context; ErrorHandler writes to the response writer, and an
// echo door gives it c.Response() and returns nil.
type Config struct {
	Skipper          func(r *http.Request) bool
	Store            idemgate.Store
	Scope            func(r *http.Request) (tenant, user string, err error)
	Kind             string
	Fingerprint      fingerprint.Spec
	Header           string
	Required         bool
	Methods          []string
	Retention        time.Duration
	Lease            time.Duration
	WaitInFlight     time.Duration
	MismatchStatus   int
	Cacheable        func(status int) bool
	MaxBodyBytes     int64
	MaxResponseBytes int64
	ReplayHeaders    []string
	FailOpen         bool
	OnEvent          func(ctx context.Context, ev idemgate.Event)
	ErrorHandler     func(w http.ResponseWriter, r *http.Request, p idemgate.Problem)
	Atomic           bool
}

// Run runs every case against d, on the Redis store and on pgrecords.
func Run(t *testing.T, d Door) {
	if d.New == nil {
		t.Fatal("doortest: Door.New is required")
	}
	t.Run("Redis", func(t *testing.T) {
		t.Parallel()
		client := redis.NewClient(testenv.Redis(t))
		t.Cleanup(func() { client.Close() })
		runCases(t, bundle{door: d, store: redisstore.New(client)})
	})
	t.Run("Postgres", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		pool, err := pgxpool.New(ctx, testenv.PostgresDSN(t))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		store, err := pgrecords.New(ctx, pool)
		if err != nil {
			t.Fatal(err)
		}
		if err := store.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, `CREATE TABLE doortest_writes (tenant text NOT NULL, run bigint NOT NULL)`); err != nil {
			t.Fatal(err)
		}
		runCases(t, bundle{door: d, store: store, pool: pool})
	})
}

// bundle is what the cases of one store share.
type bundle struct {
	door  Door
	store idemgate.Store
	pool  *pgxpool.Pool // the database of pgrecords; nil on Redis
}

// runCases runs every case in parallel.
func runCases(t *testing.T, b bundle) {
	cases := []struct {
		name string
		run  func(t *testing.T, b bundle)
	}{
		{"RequestPath", testRequestPath},
		{"ReplayIsByteForByte", testReplayIsByteForByte},
		{"ReplayHeaders", testReplayHeaders},
		{"OuterHeadersAreTheRetrysOwn", testOuterHeadersAreTheRetrysOwn},
		{"ProblemDocument", testProblemDocument},
		{"ErrorHandlerRendersProblems", testErrorHandler},
		{"ChangedNamesTheDriftedFields", testChangedNamesTheDriftedFields},
		{"PathValuesAndQueryAreFingerprinted", testPathValuesAndQueryAreFingerprinted},
		{"InFlight", testInFlight},
		{"Encodings", testEncodings},
		{"ClientGoneBeforeTheClaimLeavesNoClaim", testClientGoneBeforeTheClaim},
		{"AnswerAfterTheClientsContextEndedIsStored", testAnswerAfterTheContextEnded},
		{"AnswerToAClientThatLeftItsConnectionIsStored", testClientLeftTheConnection},
		{"FlushPassesThrough", testFlushPassesThrough},
		{"HijackIsNeverStored", testHijackIsNeverStored},
		{"PanicReleasesTheKeyAndPropagates", testPanic},
		{"UnmatchedRoutesAreTheRoutersOwn", testUnmatchedRoutes},
		{"StoreUnavailable", testStoreUnavailable},
		{"RetentionEnds", testRetentionEnds},
	}
	if b.pool != nil {
		cases = append(cases, struct {
			name string
			run  func(t *testing.T, b bundle)
		}{"AtomicWritesCommitWithTheStoredAnswer", testAtomic})
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.run(t, b)
		})
	}
}

// newTenant returns a tenant no other case uses: the cases of a store
// share its database, and the tenant is part of every key.
func newTenant() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "t" + hex.EncodeToString(b[:])
}
