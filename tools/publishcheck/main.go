// Command publishcheck checks that the public modules install as a user
// would install them once released (make publish-check, part of make
// test; docs/releasing.md):
//
//	go run ./tools/publishcheck [-version v0.1.0]
//
// It checks that every module of the workspace is tidy on its own
// (GOWORK=off), packs every public module of the working tree into a
// file-based module proxy at the version (default: the version the modules
// require the library at), and builds and vets fresh consumers against it
// with GOWORK=off: an echo service on the middleware and the Redis store;
// a net/http service on pgrecords and pgstore, which must link neither echo
// nor go-redis; a net/http service on redisstore, which must link no echo;
// one only otelidem (the library reached through otelidem's own
// requirement), one only the client; then it runs go install of the CLI at
// the version. For each it prints the size of the build list and the
// modules linked into the binary, and for a consumer with unlinked the
// modules it proves absent.
//
// The consumers use a new module cache each run: the go command takes a
// version in a module cache as immutable, so it never fetches it again, and
// it keeps an index of its packages' imports in the build cache, keyed by
// the directory. A cache that held an earlier run's packed modules, even
// with them deleted and fetched again, would check stale code. Third-party
// modules come from the shared cache's download directory first (a copy, no
// network), then from the configured proxy, and every build uses -trimpath
// so that the build cache serves what an earlier run compiled.
package main

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"github.com/idemgate/idemgate/tools/internal/modset"
)

// consumer is a fresh module that imports the released modules as a user's
// service would.
type consumer struct {
	name string
	// get lists the modules the consumer asks for; the others come through
	// their requirements.
	get  []string
	main string
	// unlinked lists module path prefixes that must not be linked into
	// the consumer's binary: what the packages it imports promise not
	// to pull in.
	unlinked []string
}

var consumers = []consumer{
	{
		name: "middleware-redis",
		get:  []string{modset.Root},
		main: `package main

import (
	"net/http"

	"github.com/labstack/echo/v4"
	"github.com/redis/go-redis/v9"

	"github.com/idemgate/idemgate/fingerprint"
	idem "github.com/idemgate/idemgate/middleware"
	"github.com/idemgate/idemgate/redisstore"
)

func main() {
	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	e := echo.New()
	e.POST("/v1/orders", func(c echo.Context) error {
		return c.JSON(http.StatusCreated, map[string]string{"status": "created"})
	}, idem.New(idem.Config{
		Store:       redisstore.New(rdb),
		Scope:       func(echo.Context) (string, string, error) { return "tenant", "user", nil },
		Fingerprint: fingerprint.Spec{Fields: []string{"/amount"}},
	}))
	_ = e.Start(":8080")
}
`,
	},
	{
		name:     "nethttp-pgrecords",
		get:      []string{modset.Root},
		unlinked: []string{"github.com/labstack/", "github.com/redis/go-redis/"},
		main: `package main

import (
	"context"
	"errors"
	"log"
	"net/http"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgate/idemgate/idemhttp"
	"github.com/idemgate/idemgate/pgrecords"
	"github.com/idemgate/idemgate/pgstore"
)

func main() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://localhost/app")
	if err != nil {
		log.Fatal(err)
	}
	records, err := pgrecords.New(ctx, pool)
	if err != nil {
		log.Fatal(err)
	}
	tasks, err := pgstore.New(ctx, pool)
	if err != nil {
		log.Fatal(err)
	}
	mw := idemhttp.New(idemhttp.Config{
		Store:  records,
		Atomic: true, // the task and the stored answer commit together
		Scope: func(r *http.Request) (tenant, user string, err error) {
			tenant, user = r.Header.Get("X-Tenant"), r.Header.Get("X-User") // set by a trusted gateway
			if tenant == "" || user == "" {
				return "", "", errors.New("unauthenticated")
			}
			return tenant, user, nil
		},
	})
	mux := http.NewServeMux()
	mux.Handle("POST /v1/orders/{id}", mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req, _ := idemhttp.FromRequest(r)
		task, err := tasks.SubmitTx(r.Context(), pgrecords.TxFromContext(r.Context()), pgstore.NewTask{
			Tenant: req.Key.Tenant(), Owner: req.Key.Owner(), Kind: "orders", IdempotencyKey: req.Key.Task(),
		})
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusAccepted)
		_, _ = w.Write([]byte(task.ID))
	})))
	log.Fatal(http.ListenAndServe(":8080", mux))
}
`,
	},
	{
		name:     "nethttp-redisstore",
		get:      []string{modset.Root},
		unlinked: []string{"github.com/labstack/"},
		main: `package main

import (
	"errors"
	"log"
	"net/http"

	"github.com/redis/go-redis/v9"

	"github.com/idemgate/idemgate/idemhttp"
	"github.com/idemgate/idemgate/redisstore"
)

func main() {
	mw := idemhttp.New(idemhttp.Config{
		Store: redisstore.New(redis.NewClient(&redis.Options{Addr: "localhost:6379"})),
		Scope: func(r *http.Request) (tenant, user string, err error) {
			tenant, user = r.Header.Get("X-Tenant"), r.Header.Get("X-User") // set by a trusted gateway
			if tenant == "" || user == "" {
				return "", "", errors.New("unauthenticated")
			}
			return tenant, user, nil
		},
	})
	mux := http.NewServeMux()
	mux.Handle("POST /v1/orders/{id}", mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte("created " + r.PathValue("id")))
	})))
	log.Fatal(http.ListenAndServe(":8080", mux))
}
`,
	},
	{
		name:     "do-consumer",
		get:      []string{modset.Root},
		unlinked: []string{"github.com/labstack/", "github.com/jackc/pgx/"},
		main: `package main

import (
	"context"
	"fmt"
	"log"

	"github.com/redis/go-redis/v9"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/keyspace"
	"github.com/idemgate/idemgate/redisstore"
)

// A queue consumer: each message's effect runs once per message id,
// however often the queue delivers it.
func main() {
	r := idemgate.Runner{
		Store: redisstore.New(redis.NewClient(&redis.Options{Addr: "localhost:6379"})),
		Kind:  "charge",
	}
	deliver := func(ctx context.Context, id string, body []byte) error {
		res, err := r.Do(ctx, keyspace.Scope{Tenant: "acme", User: "billing", Request: id}, body,
			func(ctx context.Context) ([]byte, error) { return []byte("charged"), nil })
		if err != nil {
			return err
		}
		fmt.Printf("%s: %s (replayed %v)\n", id, res.Value, res.Replayed)
		return nil
	}
	if err := deliver(context.Background(), "msg-1", []byte(` + "`" + `{"amount":100}` + "`" + `)); err != nil {
		log.Fatal(err)
	}
}
`,
	},
	{
		name: "otelidem",
		get:  []string{modset.Root + "/otelidem"},
		main: `package main

import (
	"log"

	"github.com/idemgate/idemgate/otelidem"
)

func main() {
	rec, err := otelidem.New(otelidem.Config{})
	if err != nil {
		log.Fatal(err)
	}
	log.Println(rec.Server() != nil)
}
`,
	},
	{
		name: "client",
		get:  []string{modset.Root + "/client"},
		main: `package main

import (
	"context"
	"log"
	"net/http"

	"github.com/idemgate/idemgate/client"
)

func main() {
	c := client.New(client.Config{BaseURL: "http://localhost:8080"})
	order := map[string]any{"amount": 10}
	_, err := c.Send(context.Background(), http.MethodPost, "/v1/orders", client.RequestID("order:7:create", order), order)
	log.Println(err)
}
`,
	},
}

func main() {
	version := flag.String("version", "", "the version to pack the public modules at (default: the one the modules require)")
	keep := flag.Bool("keep", false, "keep the proxy and consumers' directory and print it")
	flag.Parse()
	if err := run(*version, *keep); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func run(version string, keep bool) error {
	root := "."
	mods, err := modset.Load(root)
	if err != nil {
		return fmt.Errorf("publishcheck: %w", err)
	}
	if version == "" {
		for _, m := range mods {
			if v, err := modset.Required(root, m); err != nil {
				return fmt.Errorf("publishcheck: %w", err)
			} else if v != "" {
				version = v
				break
			}
		}
	}
	if err := modset.CheckVersion(version); err != nil {
		return fmt.Errorf("publishcheck: %w", err)
	}
	for _, m := range mods {
		if err := checkRequired(root, m, version); err != nil {
			return err
		}
		if err := checkTidy(root, m); err != nil {
			return err
		}
	}

	tmp, err := os.MkdirTemp("", "idemgate-publishcheck-")
	if err != nil {
		return fmt.Errorf("publishcheck: %w", err)
	}
	if keep {
		fmt.Println("kept in", tmp)
	} else {
		defer os.RemoveAll(tmp)
	}
	proxy := filepath.Join(tmp, "proxy")
	var public []modset.Module
	for _, m := range mods {
		if m.Public {
			if err := modset.Pack(root, proxy, m, version); err != nil {
				return fmt.Errorf("publishcheck: %w", err)
			}
			public = append(public, m)
		}
	}
	env, err := consumerEnv(tmp, proxy)
	if err != nil {
		return err
	}
	sums, err := knownSums(root, public)
	if err != nil {
		return err
	}
	fmt.Printf("packed %d modules at %s\n", len(public), version)
	for _, c := range consumers {
		if err := c.check(filepath.Join(tmp, c.name), env, sums, version); err != nil {
			return err
		}
	}
	for _, m := range public {
		cmd, err := isCommand(root, m)
		if err != nil {
			return err
		}
		if cmd {
			if err := checkCommandTidy(root, tmp, env, m); err != nil {
				return err
			}
			if err := install(tmp, env, m, version); err != nil {
				return err
			}
		}
	}
	return nil
}

// checkRequired reports an error if m requires a sibling at a version other
// than the one being packed: a consumer would get two releases mixed.
func checkRequired(root string, m modset.Module, version string) error {
	sib, err := modset.Siblings(root, m)
	if err != nil {
		return fmt.Errorf("publishcheck: %w", err)
	}
	for path, v := range sib {
		if v != version {
			return fmt.Errorf("publishcheck: %s/go.mod requires %s %s, not %s (go run ./tools/release -set -version %s)", m.Dir, path, v, version, version)
		}
	}
	return nil
}

// checkTidy runs go mod tidy -diff in the module outside the workspace. A
// module that users install (no replace directives) needs its siblings at
// the released version, which only the proxy has: go install checks it.
func checkTidy(root string, m modset.Module) error {
	cmd, err := isCommand(root, m)
	if err != nil || (cmd && m.Public) {
		return err
	}
	c := exec.Command("go", "mod", "tidy", "-diff")
	c.Dir = filepath.Join(root, m.Dir)
	c.Env = append(os.Environ(), "GOWORK=off")
	if out, err := c.CombinedOutput(); err != nil {
		return fmt.Errorf("publishcheck: %s is not tidy outside the workspace (cd %s && GOWORK=off go mod tidy): %w\n%s", m.Dir, m.Dir, err, out)
	}
	return nil
}

// consumerEnv is the environment of a user outside this repository, whose
// module proxy serves the packed modules.
func consumerEnv(tmp, proxy string) ([]string, error) {
	out, err := exec.Command("go", "env", "GOPROXY", "GOMODCACHE", "GOFLAGS").Output()
	if err != nil {
		return nil, fmt.Errorf("publishcheck: go env: %w", err)
	}
	v := strings.Split(strings.TrimRight(string(out), "\n"), "\n")
	if len(v) != 3 {
		return nil, fmt.Errorf("publishcheck: go env printed %q", out)
	}
	goproxy := "file://" + filepath.ToSlash(proxy) + ",file://" + filepath.ToSlash(filepath.Join(v[1], "cache", "download"))
	if v[0] != "" && v[0] != "off" {
		goproxy += "," + v[0]
	}
	return append(os.Environ(),
		"GOWORK=off",
		"GOPROXY="+goproxy,
		"GONOSUMDB="+modset.Root,   // not published yet: no checksum database knows it
		"GOPRIVATE=", "GONOPROXY=", // the packed modules come from the file proxy, whatever the machine says
		"GOMODCACHE="+filepath.Join(tmp, "modcache"),
		"GOFLAGS="+strings.TrimSpace(v[2]+" -trimpath -modcacherw"),
		"GOBIN="+filepath.Join(tmp, "bin"),
	), nil
}

// knownSums collects the go.sum lines of the public modules: hashes this
// repository already verified, so a consumer's go.sum needs no lookups in
// the checksum database for them.
func knownSums(root string, mods []modset.Module) ([]byte, error) {
	var lines []string
	for _, m := range mods {
		data, err := os.ReadFile(filepath.Join(root, m.Dir, "go.sum"))
		if os.IsNotExist(err) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("publishcheck: %w", err)
		}
		lines = append(lines, strings.Split(strings.TrimSpace(string(data)), "\n")...)
	}
	slices.Sort(lines)
	lines = slices.Compact(lines)
	return []byte(strings.Join(lines, "\n") + "\n"), nil
}

func (c consumer) check(dir string, env []string, sums []byte, version string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("publishcheck: %w", err)
	}
	files := map[string]string{
		"go.mod":  "module example.com/consumer\n\ngo 1.26.0\n",
		"go.sum":  string(sums),
		"main.go": c.main,
	}
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			return fmt.Errorf("publishcheck: %w", err)
		}
	}
	get := []string{"get"}
	for _, m := range c.get {
		get = append(get, m+"@"+version)
	}
	steps := [][]string{get, {"mod", "tidy"}, {"build", "-o", "consumer", "."}, {"vet", "./..."}}
	for _, args := range steps {
		if _, err := goIn(dir, env, args...); err != nil {
			return fmt.Errorf("publishcheck: consumer %s: %w", c.name, err)
		}
	}
	all, err := goIn(dir, env, "list", "-m", "all")
	if err != nil {
		return fmt.Errorf("publishcheck: consumer %s: %w", c.name, err)
	}
	// Every idemgate module in the build list is the packed one: a sibling
	// requirement at another version would mix two releases.
	for line := range strings.Lines(all) {
		f := strings.Fields(line)
		if len(f) == 2 && (f[0] == modset.Root || strings.HasPrefix(f[0], modset.Root+"/")) && f[1] != version {
			return fmt.Errorf("publishcheck: consumer %s builds with %s %s, not %s", c.name, f[0], f[1], version)
		}
	}
	deps, err := linked(dir, env, filepath.Join(dir, "consumer"))
	if err != nil {
		return fmt.Errorf("publishcheck: consumer %s: %w", c.name, err)
	}
	fmt.Printf("consumer %-18s build list: itself and %2d modules; linked (%d): %s\n",
		c.name, strings.Count(all, "\n")-1, len(deps), strings.Join(deps, " "))
	if len(c.unlinked) > 0 {
		for _, dep := range deps {
			for _, no := range c.unlinked {
				if strings.HasPrefix(dep, no) {
					return fmt.Errorf("publishcheck: consumer %s links %s, which it must not (no %s)", c.name, dep, strings.Join(c.unlinked, ", no "))
				}
			}
		}
		fmt.Printf("consumer %-18s links none of: %s\n", c.name, strings.Join(c.unlinked, " "))
	}
	return nil
}

// checkCommandTidy runs go mod tidy on a copy of a command's module,
// outside the workspace, against the packed siblings: its go.mod must not
// change, nor its go.sum but for the siblings' hashes, which only a release
// fixes (they hash the tree at its tag) and which it therefore leaves out.
func checkCommandTidy(root, tmp string, env []string, m modset.Module) error {
	src := filepath.Join(root, m.Dir)
	dir := filepath.Join(tmp, "tidy", filepath.FromSlash(m.Dir))
	if err := os.CopyFS(dir, os.DirFS(src)); err != nil {
		return fmt.Errorf("publishcheck: %w", err)
	}
	if _, err := goIn(dir, append(env, "GOFLAGS=-mod=mod"), "mod", "tidy"); err != nil {
		return fmt.Errorf("publishcheck: %s: %w", m.Dir, err)
	}
	for _, name := range []string{"go.mod", "go.sum"} {
		want, err := readSiblingless(filepath.Join(src, name), name == "go.sum")
		if err != nil {
			return err
		}
		got, err := readSiblingless(filepath.Join(dir, name), name == "go.sum")
		if err != nil {
			return err
		}
		if got != want {
			return fmt.Errorf("publishcheck: %s/%s is not tidy: go mod tidy against the packed modules gives\n%s\n(keep no %s lines in go.sum)", m.Dir, name, got, modset.Root)
		}
	}
	return nil
}

// readSiblingless returns the file, without the go.sum lines of the
// repository's own modules when sum is set (a missing go.sum is empty).
func readSiblingless(name string, sum bool) (string, error) {
	data, err := os.ReadFile(name)
	if sum && os.IsNotExist(err) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("publishcheck: %w", err)
	}
	if !sum {
		return string(data), nil
	}
	var b strings.Builder
	for line := range strings.Lines(string(data)) {
		if f := strings.Fields(line); len(f) > 0 && (f[0] == modset.Root || strings.HasPrefix(f[0], modset.Root+"/")) {
			continue
		}
		b.WriteString(line)
	}
	return b.String(), nil
}

// install installs the command m holds at version, as its README says.
func install(tmp string, env []string, m modset.Module, version string) error {
	dir := filepath.Join(tmp, "install")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("publishcheck: %w", err)
	}
	if _, err := goIn(dir, env, "install", m.Path+"@"+version); err != nil {
		return fmt.Errorf("publishcheck: %w", err)
	}
	bin := filepath.Join(tmp, "bin", filepath.Base(m.Path))
	deps, err := linked(dir, env, bin)
	if err != nil {
		return fmt.Errorf("publishcheck: %w", err)
	}
	fmt.Printf("go install %s@%s: linked (%d): %s\n", m.Path, version, len(deps), strings.Join(deps, " "))
	return nil
}

// linked lists the modules linked into bin, as go version -m reports them.
func linked(dir string, env []string, bin string) ([]string, error) {
	out, err := goIn(dir, env, "version", "-m", bin)
	if err != nil {
		return nil, err
	}
	var deps []string
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 3 && f[0] == "dep" {
			deps = append(deps, f[1]+"@"+f[2])
		}
	}
	return deps, nil
}

func goIn(dir string, env []string, args ...string) (string, error) {
	cmd := exec.Command("go", args...)
	cmd.Dir, cmd.Env = dir, env
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, stderr.Bytes())
	}
	return string(out), nil
}

// isCommand reports whether the module's root directory is a package main.
func isCommand(root string, m modset.Module) (bool, error) {
	b, err := modset.IsCommand(root, m)
	if err != nil {
		return false, fmt.Errorf("publishcheck: %w", err)
	}
	return b, nil
}
