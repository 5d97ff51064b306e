package cli

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/idemgate/idemgate/keyspace"
	"github.com/idemgate/idemgate/middleware"
	"github.com/idemgate/idemgate/pgrecords"
)

const recordsUsage = `Usage: %[1]s records show | release [flags]

  records show      the record of one idempotency key: claimed (a request
                    holds it) or finished (it holds the answer), when its
                    lease or retention ends, the stored status and size, the
                    fingerprint. User and request id appear as digests only.
  records release   free a stuck claim so that the client's retry runs
                    (the request that held it can no longer finish it);
                    with -finished, also forget a stored answer. Asks for a
                    confirmation; -yes confirms without a terminal.

The key, as the middleware derives it:
  -tenant T -user U -request-id R -kind K     (or -key idem:…, as stored)
  -store redis (REDIS_URL) or postgres (DATABASE_URL, pgrecords)
`

// keyFlags name a key.
type keyFlags struct {
	store, tenant, user, request, kind, key string
}

func (k *keyFlags) add(fs interface {
	StringVar(*string, string, string, string)
}) {
	fs.StringVar(&k.store, "store", "", "where the records live: redis or postgres (required)")
	fs.StringVar(&k.tenant, "tenant", "", "the tenant, as the service's scope gives it")
	fs.StringVar(&k.user, "user", "", "the user (authenticated principal), as the service's scope gives it")
	fs.StringVar(&k.request, "request-id", "", "the client's Idempotency-Key")
	fs.StringVar(&k.kind, "kind", "", "the route's kind (Config.Kind, or keyspace.KindFor(method, route))")
	fs.StringVar(&k.key, "key", "", "the key as stored (idem:<tenant>:<kind>:<user digest>:<request digest>), instead of the four above")
}

// derive returns the key the middleware would use.
func (k *keyFlags) derive() (string, error) {
	parts := k.tenant != "" || k.user != "" || k.request != "" || k.kind != ""
	switch {
	case k.key != "" && parts:
		return "", errors.New("give -key, or -tenant, -user, -request-id and -kind, not both")
	case k.key != "":
		return k.key, nil
	case !parts:
		return "", errors.New("give -tenant, -user, -request-id and -kind (or -key)")
	}
	key, err := keyspace.Derive(k.kind, keyspace.Scope{Tenant: k.tenant, User: k.user, Request: k.request})
	if err != nil {
		return "", err // never echoes the user or the request id
	}
	return key.String(), nil
}

// Records runs "records show|release".
func Records(ctx context.Context, args []string, env Env) error {
	help := fmt.Sprintf(recordsUsage, env.Prog)
	sub, pre, args, err := verb(args, help, env)
	if err != nil {
		return err
	}
	if sub != "show" && sub != "release" {
		fmt.Fprintf(env.Stderr, "records: unknown command %q\n\n%s", sub, help)
		return ErrUsage
	}
	fs := newFlagSet(env, "records "+sub, strings.SplitN(help, "\n\n", 2)[1])
	var c common
	c.database(fs, env.Getenv)
	c.redis(fs, env.Getenv)
	c.jsonFlag(fs)
	var k keyFlags
	k.add(fs)
	var finished, yes bool
	if sub == "release" {
		fs.BoolVar(&finished, "finished", false, "also forget a finished record's stored answer (the next request with the key runs again)")
		fs.BoolVar(&yes, "yes", false, "confirm without asking")
	}
	if _, err := parseOperands(fs, pre, args, 0, false); err != nil {
		return err
	}
	if k.store != "redis" && k.store != "postgres" {
		return usageError(fs, "-store %q: want redis or postgres", k.store)
	}
	key, err := k.derive()
	if err != nil {
		return usageError(fs, "%v", err)
	}

	var insp middleware.Inspector
	if k.store == "redis" {
		client, err := c.openRedis(ctx)
		if err != nil {
			return err
		}
		defer client.Close()
		insp = middleware.NewRedisStore(client)
	} else {
		pool, schema, err := c.openPool(ctx)
		if err != nil {
			return err
		}
		defer pool.Close()
		if err := requireCurrent(ctx, pool, schema, "pgrecords"); err != nil {
			return err
		}
		s, err := pgrecords.New(ctx, pool)
		if err != nil {
			return err
		}
		insp = s
	}

	info, err := insp.Inspect(ctx, key)
	if errors.Is(err, middleware.ErrNoRecord) {
		hint := ""
		if k.key == "" {
			hint = "; -tenant, -user, -request-id and -kind must be the values the service's scope and route give, byte for byte"
		}
		return fmt.Errorf("no live record under %s (never claimed, expired, or released%s)", shortKey(key), hint)
	}
	if err != nil {
		return err
	}
	now := time.Now()
	row := recordRowOf(key, k.store, info, now)
	out := printer{w: env.Stdout, json: c.json}
	if sub == "show" {
		return out.record(row)
	}

	if info.Finished && !finished {
		out.record(row) //nolint:errcheck // the error below matters more
		return errors.New("the record is finished: it holds the answer the client's retries get. Pass -finished to forget that answer (the next request with this key runs the handler again)")
	}
	what := "release the claim (the request holding it can no longer finish it; the client's retry will run)"
	if info.Finished {
		what = fmt.Sprintf("forget the stored answer (status %d, %d bytes; the next request with this key runs again)", info.Status, info.BodySize)
	}
	if !yes {
		if err := confirm(env, what, func() {
			if !c.json {
				out.record(row) //nolint:errcheck
			}
		}); err != nil {
			return err
		}
	}
	if err := insp.Forget(ctx, key, info.Token, info.Finished); err != nil {
		if errors.Is(err, middleware.ErrNoRecord) {
			return errors.New("the record changed since it was read (finished, expired, released or claimed again): nothing released; run records show again")
		}
		return err
	}
	if out.json {
		return out.encode(struct {
			Released bool      `json:"released"`
			Record   recordRow `json:"record"`
		}{true, row})
	}
	state := "claim released"
	if info.Finished {
		state = "stored answer forgotten"
	}
	_, err = fmt.Fprintf(env.Stdout, "%s: %s (token %s)\n", state, shortKey(key), info.Token)
	return err
}

// recordRow is a record as the tools print it.
type recordRow struct {
	Key           string    `json:"key"`
	Store         string    `json:"store"`
	Tenant        string    `json:"tenant,omitempty"`
	Kind          string    `json:"kind,omitempty"`
	UserDigest    string    `json:"user_digest,omitempty"`
	RequestDigest string    `json:"request_digest,omitempty"`
	State         string    `json:"state"` // claimed or finished
	Token         string    `json:"token"`
	Until         time.Time `json:"until"` // the lease's end (claimed) or the retention's (finished)
	Left          string    `json:"left"`
	Fingerprint   string    `json:"fingerprint"`
	Fields        int       `json:"field_digests"`
	Status        int       `json:"status,omitempty"`
	Headers       []string  `json:"headers,omitempty"` // names only
	BodyBytes     int       `json:"body_bytes"`
	StoredBytes   int       `json:"stored_bytes"`
}

func recordRowOf(key, store string, info middleware.RecordInfo, now time.Time) recordRow {
	r := recordRow{Key: key, Store: store, State: "claimed", Token: info.Token.String(),
		Until: now.Add(info.Left).UTC().Truncate(time.Millisecond), Left: info.Left.Round(time.Second).String(),
		Fingerprint: info.Fingerprint, Fields: info.Fields, Status: info.Status, BodyBytes: info.BodySize,
		StoredBytes: info.Size, Kind: info.Kind}
	if info.Finished {
		r.State = "finished"
	}
	for name := range info.Header {
		r.Headers = append(r.Headers, name)
	}
	slices.Sort(r.Headers)
	// idem:<tenant>:<kind>:<user digest>:<request digest>
	if parts := strings.Split(key, ":"); len(parts) == 5 && parts[0] == "idem" {
		r.Tenant, r.Kind, r.UserDigest, r.RequestDigest = parts[1], parts[2], parts[3], parts[4]
	}
	return r
}

func (p printer) record(r recordRow) error {
	if p.json {
		return p.encode(r)
	}
	tw := tabwriter.NewWriter(p.w, 0, 4, 2, ' ', 0)
	state := "claimed: a request holds it (lease)"
	until := "lease ends"
	if r.State == "finished" {
		state = "finished: it holds the answer that retries get"
		until = "expires"
	}
	lines := [][2]string{{"key", shortKey(r.Key)}, {"store", r.Store}}
	if r.Tenant != "" {
		lines = append(lines, [2]string{"tenant", r.Tenant}, [2]string{"kind", r.Kind},
			[2]string{"user", "sha256:" + r.UserDigest}, [2]string{"request id", "sha256:" + r.RequestDigest})
	} else if r.Kind != "" {
		lines = append(lines, [2]string{"kind", r.Kind})
	}
	lines = append(lines, [2]string{"state", state}, [2]string{until, r.Until.Format(time.RFC3339) + " (in " + r.Left + ")"},
		[2]string{"token", r.Token}, [2]string{"fingerprint", r.Fingerprint},
		[2]string{"field digests", fmt.Sprint(r.Fields)})
	if r.State == "finished" {
		lines = append(lines, [2]string{"status", fmt.Sprint(r.Status)}, [2]string{"headers", strings.Join(r.Headers, ", ")},
			[2]string{"body", fmt.Sprintf("%d bytes", r.BodyBytes)})
	}
	lines = append(lines, [2]string{"stored", fmt.Sprintf("%d bytes", r.StoredBytes)})
	for _, kv := range lines {
		fmt.Fprintf(tw, "%s:\t%s\n", kv[0], kv[1])
	}
	return tw.Flush()
}

// shortKey shortens the digests of a keyspace key for a line of text.
func shortKey(key string) string {
	parts := strings.Split(key, ":")
	if len(parts) != 5 || parts[0] != "idem" || len(parts[3]) != 64 || len(parts[4]) != 64 {
		return key
	}
	return strings.Join([]string{parts[0], parts[1], parts[2], parts[3][:12] + "…", parts[4][:12] + "…"}, ":")
}
