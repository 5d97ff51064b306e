// Package cli is the idemgate command line: the operator's tools on a
// service's schema, idempotency records and task queue. cmd/idemgate runs
// it; the example runs its tasks commands.
//
// Commands read like kubectl's (noun verb, flags before or after), print
// a table or, with -json, JSON, and exit 0 on success, 1 on an error
// ("not found" is one) and 2 on bad usage. Nothing destructive runs
// without a confirmation, and a read-only command never writes: it
// refuses a schema that is missing or older than it needs, and says so.
package cli

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/idemgate/idemgate/internal/redisurl"
)

// Env is what a command sees of its process.
type Env struct {
	// Prog names the program in usage texts: "idemgate", "go run ./example".
	Prog   string
	Getenv func(string) string
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
	// StdinIsTerminal reports that a person can answer a confirmation.
	StdinIsTerminal bool
}

// ErrUsage reports a bad command line; the command already said why.
var ErrUsage = errors.New("usage")

// Exit codes.
const (
	ExitOK    = 0
	ExitError = 1
	ExitUsage = 2
)

const usage = `%[1]s: operator tools for services that use idemgate.

Usage:
  %[1]s migrate up | status | sql              the schema of pgstore and pgrecords
  %[1]s records show | release                 an idempotency record (Redis or Postgres)
  %[1]s tasks list | show | retry | cancel | limits | pause | resume
                                                 the task queue (pgstore)

Environment:
  DATABASE_URL  PostgreSQL URL (-database-url)
  REDIS_URL     Redis URL (-redis-url): one node redis://host:6379/0, a cluster
                redis://h1:7000,h2:7001,h3:7002, Sentinel
                redis://s1:26379,s2:26379?master_name=mymaster

Every command takes -schema (the PostgreSQL schema; default: the
connection's search_path) and -json where it prints. Exit status: 0 success,
1 error (a missing record or task is one), 2 bad usage.
Run "%[1]s <noun> -h" for a noun's commands and flags.
`

// Main runs one command line and returns the exit code.
func Main(ctx context.Context, args []string, env Env) int {
	if len(args) == 0 {
		fmt.Fprintf(env.Stderr, usage, env.Prog)
		return ExitUsage
	}
	noun, args := args[0], args[1:]
	var err error
	switch noun {
	case "-h", "-help", "--help", "help":
		fmt.Fprintf(env.Stdout, usage, env.Prog)
		return ExitOK
	case "migrate":
		err = Migrate(ctx, args, env)
	case "records":
		err = Records(ctx, args, env)
	case "tasks":
		err = Tasks(ctx, args, env)
	default:
		fmt.Fprintf(env.Stderr, "%s: unknown command %s\n\n", env.Prog, shown(noun))
		fmt.Fprintf(env.Stderr, usage, env.Prog)
		return ExitUsage
	}
	return ExitCode(err, env.Stderr, env.Prog+" "+noun)
}

// ExitCode prints err, if any, and returns the exit code it means.
func ExitCode(err error, stderr io.Writer, prefix string) int {
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return ExitOK
	case errors.Is(err, ErrUsage):
		if _, ok := err.(badInput); ok {
			fmt.Fprintf(stderr, "%s: %v\n", prefix, err)
		}
		return ExitUsage
	}
	fmt.Fprintf(stderr, "%s: %v\n", prefix, err)
	return ExitError
}

// badInput is bad usage that no flag set has printed: a URL from the
// environment that cannot be what was meant. ExitCode prints it.
type badInput struct{ msg string }

func (e badInput) Error() string        { return e.msg }
func (e badInput) Is(target error) bool { return target == ErrUsage }

// verb splits a noun's arguments into its verb and the rest; -json (and
// -schema S) may come before the verb, as in "tasks -json list".
func verb(args []string, nounUsage string, env Env) (string, []string, []string, error) {
	var pre []string
	for len(args) > 0 && strings.HasPrefix(args[0], "-") {
		switch a := args[0]; {
		case a == "-h" || a == "-help" || a == "--help":
			fmt.Fprint(env.Stdout, nounUsage)
			return "", nil, nil, flag.ErrHelp
		case strings.Contains(a, "=") || boolFlags[strings.TrimLeft(a, "-")]:
			pre, args = append(pre, a), args[1:]
		case len(args) > 1:
			pre, args = append(pre, a, args[1]), args[2:]
		default:
			args = args[1:]
		}
	}
	if len(args) == 0 {
		fmt.Fprint(env.Stderr, nounUsage)
		return "", nil, nil, ErrUsage
	}
	return args[0], pre, args[1:], nil
}

// boolFlags are the flags that take no value, so that one given before
// the verb does not take the verb for its value.
var boolFlags = map[string]bool{"json": true, "yes": true, "check": true, "pending": true, "finished": true, "new-kind": true, "force": true}

// common are the flags every command takes.
type common struct {
	databaseURL string
	redisURL    string
	schema      string
	json        bool
	getenv      func(string) string
}

// The URLs' flags default to nothing and fall back on the environment
// when used: a default shows in -h, and a URL may hold a password.
func (c *common) database(fs *flag.FlagSet, getenv func(string) string) {
	c.getenv = getenv
	fs.StringVar(&c.databaseURL, "database-url", "", "PostgreSQL URL; empty: env DATABASE_URL")
	fs.StringVar(&c.schema, "schema", "", "PostgreSQL schema of idemgate's tables; empty: the connection's search_path")
}

func (c *common) redis(fs *flag.FlagSet, getenv func(string) string) {
	c.getenv = getenv
	fs.StringVar(&c.redisURL, "redis-url", "", "Redis URL: one node, a cluster (several seeds) or Sentinel (master_name=); empty: env REDIS_URL")
}

func (c *common) jsonFlag(fs *flag.FlagSet) {
	fs.BoolVar(&c.json, "json", false, "print JSON instead of a table")
}

// newFlagSet returns a flag set for "noun verb" whose -h prints summary and
// the flags.
func newFlagSet(env Env, cmd, summary string) *flag.FlagSet {
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	fs.SetOutput(env.Stderr)
	fs.Usage = func() {
		fmt.Fprintf(env.Stderr, "Usage: %s %s [flags]\n\n%s\n\nFlags:\n", env.Prog, cmd, summary)
		fs.PrintDefaults()
	}
	return fs
}

// parse parses pre (flags given before the verb) and args, which may
// hold operands before, between or after the flags, and returns the
// operands; want is how many the command takes.
func parse(fs *flag.FlagSet, pre, args []string, want int) ([]string, error) {
	return parseOperands(fs, pre, args, want, true)
}

// parseOperands is parse; without echo, a stray operand is not printed:
// records takes a user and a request id, and an unquoted one with a space
// (-request-id my key) leaves a piece of it as an operand, which must not
// end up in a terminal's scrollback or a CI log.
func parseOperands(fs *flag.FlagSet, pre, args []string, want int, echo bool) ([]string, error) {
	if err := fs.Parse(pre); err != nil {
		return nil, parseErr(err)
	}
	var operands []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, parseErr(err)
		}
		if fs.NArg() == 0 {
			break
		}
		operands = append(operands, fs.Arg(0))
		args = fs.Args()[1:]
	}
	if len(operands) != want {
		switch {
		case want == 0 && !echo:
			fmt.Fprintf(fs.Output(), "unexpected argument (not shown: it may be a user or request id); quote a value with spaces\n")
		case want == 0:
			fmt.Fprintf(fs.Output(), "unexpected argument %s\n", shown(operands[0]))
		default:
			fmt.Fprintf(fs.Output(), "want %d argument(s), got %d\n", want, len(operands))
		}
		fs.Usage()
		return nil, ErrUsage
	}
	return operands, nil
}

func parseErr(err error) error {
	if errors.Is(err, flag.ErrHelp) {
		return err
	}
	return ErrUsage
}

// shown is s, an operand or verb, quoted for a usage error; or, when s
// looks like a connection string (it holds "://", "@" or "="), a phrase
// that does not show it: one passed where an operand goes ("idemgate
// migrate status $DATABASE_URL") holds a password.
func shown(s string) string {
	if strings.Contains(s, "://") || strings.ContainsAny(s, "@=") {
		return "(not shown: it looks like a URL or key=value string, which may hold a password; give it as -database-url or -redis-url)"
	}
	return strconv.Quote(s)
}

// usageError prints msg as a usage error.
func usageError(fs *flag.FlagSet, format string, args ...any) error {
	fmt.Fprintf(fs.Output(), format+"\n", args...)
	fs.Usage()
	return ErrUsage
}

// openPool connects to DATABASE_URL with search_path set to -schema, and
// checks that the schema exists. It creates nothing.
func (c *common) openPool(ctx context.Context) (*pgxpool.Pool, string, error) {
	if c.databaseURL == "" {
		c.databaseURL = c.getenv("DATABASE_URL")
	}
	if c.databaseURL == "" {
		return nil, "", errors.New("DATABASE_URL (or -database-url) is required")
	}
	if pgAtAfterPath(c.databaseURL) {
		return nil, "", badInput{"DATABASE_URL: an '@' after the host (not shown): a password holding '/' must be percent-encoded (%2F), as must an '@' in a database name or parameter (%40)"}
	}
	cfg, err := pgxpool.ParseConfig(c.databaseURL)
	if err != nil {
		// pgconn's error quotes the string with its passwords masked on a
		// best-effort basis only (its own words), and a wrapped url.Error
		// quotes it as given: say nothing of the string.
		return nil, "", badInput{"DATABASE_URL: not a postgres:// URL or key=value string that pgx can read (not shown: it may hold a password)"}
	}
	if c.schema != "" {
		cfg.ConnConfig.RuntimeParams["search_path"] = pgx.Identifier{c.schema}.Sanitize()
	}
	cfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, "", fmt.Errorf("postgres: %w", err)
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var schema *string
	if err := pool.QueryRow(pctx, "SELECT current_schema()").Scan(&schema); err != nil {
		pool.Close()
		return nil, "", fmt.Errorf("postgres %s: %w", pgTarget(cfg.ConnConfig.Config), err)
	}
	if schema == nil {
		pool.Close()
		if c.schema != "" {
			return nil, "", fmt.Errorf("schema %q does not exist in this database (idemgate creates tables, never schemas)", c.schema)
		}
		return nil, "", errors.New("the connection's search_path names no existing schema: set -schema")
	}
	return pool, *schema, nil
}

// pgAtAfterPath reports whether s, a postgres:// URL, has an '@' after
// the first '/' that follows its scheme, other than in the value of a
// parameter that may hold one (user=alice@example.com, an IAM user): the
// mark of a password holding a '/' that was not percent-encoded. pgx,
// like libpq, reads the user info up to an '@' that comes before any
// '/', so such a password's '/' ends it early: the URL then reads as one
// with no password whose host is the user name and whose database is the
// rest of the password, up to the '@' and past it, and a connection error
// names both. (A '?' or '#' in a password is read as libpq reads it, and
// needs no check.)
func pgAtAfterPath(s string) bool {
	s = strings.TrimSpace(s)
	rest, ok := strings.CutPrefix(s, "postgresql://")
	if !ok {
		if rest, ok = strings.CutPrefix(s, "postgres://"); !ok {
			return false
		}
	}
	i := strings.IndexByte(rest, '/')
	if i < 0 {
		return false
	}
	rest, fragment, _ := strings.Cut(rest[i:], "#")
	path, query, _ := strings.Cut(rest, "?")
	if strings.Contains(path, "@") || strings.Contains(fragment, "@") {
		return true
	}
	for _, pair := range strings.Split(query, "&") {
		name, value, _ := strings.Cut(pair, "=")
		if strings.Contains(name, "@") || strings.Contains(value, "@") && !pgAtAllowed[strings.ToLower(name)] {
			return true
		}
	}
	return false
}

// pgAtAllowed are the parameters whose value may hold an '@': a user name
// (an e-mail address, for IAM users), an application name, options and
// file names.
var pgAtAllowed = map[string]bool{"user": true, "application_name": true, "options": true,
	"sslrootcert": true, "sslcert": true, "sslkey": true, "sslcrl": true, "passfile": true, "service": true}

// pgTarget names the server and database cfg connects to, for an error:
// built from the parsed fields, not the string, which may carry a password
// in its user info, in a query parameter (password=, sslpassword=) or in
// a key=value pair.
func pgTarget(cfg pgconn.Config) string {
	return fmt.Sprintf("postgres://%s@%s/%s", url.PathEscape(cfg.User),
		net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))), url.PathEscape(cfg.Database))
}

// openRedis connects to REDIS_URL.
func (c *common) openRedis(ctx context.Context) (redis.UniversalClient, error) {
	if c.redisURL == "" {
		c.redisURL = c.getenv("REDIS_URL")
	}
	if c.redisURL == "" {
		return nil, errors.New("REDIS_URL (or -redis-url) is required for -store redis")
	}
	opts, topology, err := redisurl.Parse(c.redisURL)
	if err != nil {
		return nil, badInput{"REDIS_URL: " + err.Error()}
	}
	client := redis.NewUniversalClient(opts)
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := client.Ping(pctx).Err(); err != nil {
		_ = client.Close()
		return nil, fmt.Errorf("redis %s (%s): %w", redisurl.Redact(c.redisURL), topology, err)
	}
	return client, nil
}

// confirmedTimeout bounds a change once confirmed, which Ctrl-C does not
// end.
const confirmedTimeout = 15 * time.Second

// confirmed returns the context of a change confirmed (by the answer or
// -yes), one step: Ctrl-C does not end it, since cut short its outcome
// would be unknown (the database may commit and lose only its answer);
// confirmedTimeout does.
func confirmed(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), confirmedTimeout)
}

// printer writes JSON or, through table, text for people.
type printer struct {
	w    io.Writer
	json bool
}

func (p printer) encode(v any) error {
	enc := json.NewEncoder(p.w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// StdinIsTerminal reports whether f is a terminal: a character device
// other than the null device, which a cron job or a CI step gives a
// command as its stdin (it is a character device too, and a confirmation
// read from it would read nothing).
func StdinIsTerminal(f *os.File) bool {
	st, err := f.Stat()
	if err != nil || st.Mode()&os.ModeCharDevice == 0 {
		return false
	}
	null, err := os.Stat(os.DevNull)
	return err != nil || !os.SameFile(st, null)
}

// confirm asks the person at the terminal to type yes before what (a
// phrase such as "cancel task X (...)") is done, after show has written
// what it acts on to w, the terminal's stderr: stdout may be a file or
// carry -json. Without a terminal it refuses: a script says -yes. Ctrl-C
// (ctx done) at the prompt ends it, not confirmed.
func confirm(ctx context.Context, env Env, what string, show func(w io.Writer)) error {
	if !env.StdinIsTerminal {
		return fmt.Errorf("refusing to %s without a confirmation: pass -yes", strings.SplitN(what, " (", 2)[0])
	}
	show(env.Stderr)
	fmt.Fprintf(env.Stderr, "About to %s.\nType yes to go on: ", what)
	// The read cannot be interrupted; on Ctrl-C the command ends and the
	// process with it, and the goroutine with the process.
	answer := make(chan string, 1)
	go func() {
		a, _ := bufio.NewReader(env.Stdin).ReadString('\n')
		answer <- a
	}()
	select {
	case <-ctx.Done():
		fmt.Fprintln(env.Stderr)
		return errors.New("interrupted at the confirmation: nothing changed")
	case a := <-answer:
		if strings.TrimSpace(a) != "yes" {
			return errors.New("not confirmed: nothing changed")
		}
		return nil
	}
}
