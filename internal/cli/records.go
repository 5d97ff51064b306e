package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/keyspace"
	"github.com/idemgate/idemgate/pgrecords"
	"github.com/idemgate/idemgate/redisstore"
)

const recordsUsage = `Usage: %[1]s records show | release [flags]

  records show      the record of one idempotency key: claimed (a request
                    holds it) or finished (it holds the answer), when its
                    lease or retention ends, the stored status and size, the
                    fingerprint. User and request id appear as digests only.
  records release   free a stuck claim so that the client's retry runs;
                    with -finished, also forget a stored answer. Asks for a
                    confirmation; -yes confirms without a terminal.

A claim is live while its lease is renewed: idemgate renews it every
Lease/3 while the handler (or a Runner.Do's function) runs (or hangs). release refuses a claim renewed
within the last 5/6 of its lease (more than a sixth of it left), and one
whose token records no lease (an older idemgate's), unless -force: the
handler that holds a live claim still runs, and the client's retry would
run it a second time, so its effects (a charge, an email) may happen twice.

The key, as idemgate derives it for a request or a Runner.Do:
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
	fs.StringVar(&k.request, "request-id", "", "the client's Idempotency-Key (for Runner.Do, its scope's Request)")
	fs.StringVar(&k.kind, "kind", "", "the route's kind (Config.Kind, or keyspace.KindFor(method, route)), or Runner.Kind")
	fs.StringVar(&k.key, "key", "", "the key as stored (idem:<tenant>:<kind>:<user digest>:<request digest>), instead of the four above")
}

// derive returns the key idemgate would use.
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
		fmt.Fprintf(env.Stderr, "records: unknown command %s\n\n%s", shown(sub), help)
		return ErrUsage
	}
	fs := newFlagSet(env, "records "+sub, strings.SplitN(help, "\n\n", 2)[1])
	var c common
	c.database(fs, env.Getenv)
	c.redis(fs, env.Getenv)
	c.jsonFlag(fs)
	var k keyFlags
	k.add(fs)
	var finished, yes, force bool
	if sub == "release" {
		fs.BoolVar(&finished, "finished", false, "also forget a finished record's stored answer (the next request with the key runs again)")
		fs.BoolVar(&yes, "yes", false, "confirm without asking")
		fs.BoolVar(&force, "force", false, "release a live claim too (or one whose holder cannot be told): its handler may still run, and its effects may happen twice")
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

	var insp idemgate.Inspector
	if k.store == "redis" {
		client, err := c.openRedis(ctx)
		if err != nil {
			return err
		}
		defer client.Close()
		insp = redisstore.New(client)
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
	if errors.Is(err, idemgate.ErrNoRecord) {
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
	if !info.Finished && row.Holder != holderStuck && !force {
		out.record(row) //nolint:errcheck // the error below matters more
		return errors.New(refuseLive(row))
	}
	what := "release the claim (" + releaseEffect(row) + ")"
	if info.Finished {
		what = fmt.Sprintf("forget the stored answer (status %d, %d bytes; the next request with this key runs again)", info.Status, info.BodySize)
	}
	if !yes {
		if err := confirm(ctx, env, what, func(w io.Writer) {
			printer{w: w}.record(row) //nolint:errcheck // the answer below matters more
		}); err != nil {
			return err
		}
		// A person took time to answer: a holder judged stuck may have
		// renewed since. Read the record again, as Forget would act on it.
		again, err := insp.Inspect(ctx, key)
		if err != nil && !errors.Is(err, idemgate.ErrNoRecord) {
			return err
		}
		if err == nil && again.Token == info.Token && again.Finished == info.Finished && !info.Finished && !force {
			if r := recordRowOf(key, k.store, again, time.Now()); r.Holder != holderStuck {
				return errors.New("the claim was renewed while you answered: " + refuseLive(r))
			}
		}
	}
	// Confirmed, the release is one step that Ctrl-C does not cut short:
	// cut, its outcome would be unknown (the store may delete the record
	// and lose only its answer). It has a bound of its own instead.
	fctx, cancel := confirmed(ctx)
	defer cancel()
	if err := insp.Forget(fctx, key, info.Token, info.Finished); err != nil {
		if errors.Is(err, idemgate.ErrNoRecord) {
			return errors.New("the record changed since it was read (finished, expired, released or claimed again): nothing released; run records show again")
		}
		return fmt.Errorf("the release may or may not have happened (run records show): %w", err)
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
	if _, err := fmt.Fprintf(env.Stdout, "%s: %s (token %s)\n", state, shortKey(key), info.Token); err != nil {
		return err
	}
	if !info.Finished && row.Holder != holderStuck {
		fmt.Fprintf(env.Stderr, "warning: the claim released was %s; if that handler still runs, its effects may happen twice once the client retries.\n", holderPhrase(row))
	}
	return nil
}

// The holder of a claim, as the tools judge it from the lease.
//
// The middleware renews a claim every Lease/3 while its handler runs; a
// renewal that fails is tried again Lease/3 after it began and at least
// Lease/12 after it ended. One that failed fast is retried 2/3 of a lease
// after the last success; one that stalled until its timeout (Lease/3: a
// partition, a failover that drops packets) is retried 3/4 of a lease
// after it. Judging stuck at 3/4 would catch such a live holder as its
// retry begins; stuckAfter leaves that retry a twelfth of the lease to
// land.
const (
	// holderLive: renewed within the last 5/6 of its lease: a running
	// (or hung) handler's claim, also one whose store lost or stalled a
	// renewal.
	holderLive = "live"
	// holderStuck: not renewed for 5/6 of its lease or more: at least
	// two renewals in a row did not land, so its holder has most likely
	// crashed or lost the store. (A holder cut off from the store may
	// still be running; that is why release still asks.)
	holderStuck = "stuck"
	// holderUnknown: the token records no lease (an older idemgate's
	// claim, or a lease over about 49 days): live and stuck look alike.
	holderUnknown = "unknown"
)

// stuckAfter is the part of its lease after which a claim not renewed
// is stuck.
const stuckAfterNum, stuckAfterDen = 5, 6

// holderOf judges a claim's holder at now. Times that cannot be (a claim
// from the future, more lease left than the claim was made for) are an
// older idemgate's random token that parsed as times: unknown.
func holderOf(info idemgate.RecordInfo, now time.Time) (holder string, sinceRenewal time.Duration) {
	if info.Lease <= 0 || info.ClaimedAt.After(now.Add(time.Hour)) || info.Left > info.Lease+time.Second {
		return holderUnknown, 0
	}
	sinceRenewal = max(info.Lease-info.Left, 0)
	if sinceRenewal < info.Lease/stuckAfterDen*stuckAfterNum {
		return holderLive, sinceRenewal
	}
	return holderStuck, sinceRenewal
}

// holderPhrase says who holds a claimed record, in a phrase that starts
// with the verdict.
func holderPhrase(r recordRow) string {
	switch r.Holder {
	case holderLive:
		return fmt.Sprintf("live: renewed %s ago, within 5/6 of its %s lease (renewed every %s while its handler runs): its handler is running, or hung",
			r.SinceRenewal, r.Lease, r.RenewEvery)
	case holderStuck:
		return fmt.Sprintf("stuck: not renewed for %s, 5/6 of its %s lease or more (renewed every %s while its handler runs): its holder has most likely crashed or lost the store",
			r.SinceRenewal, r.Lease, r.RenewEvery)
	}
	return "unknown: claimed by an idemgate that records no lease in its token: a running handler cannot be told from a stuck one"
}

// refuseLive is the refusal to release a claim that is not stuck.
func refuseLive(r recordRow) string {
	return fmt.Sprintf("refusing to release a claim that is %s. Released, the client's retry runs the handler again while this one may still run, and its effects (a charge, an email) may happen twice. Wait for the lease to run out (%s left) or the handler to finish; pass -force to release it anyway",
		holderPhrase(r), r.Left)
}

// releaseEffect says what releasing a claim does, for the confirmation.
func releaseEffect(r recordRow) string {
	if r.Holder == holderStuck {
		return holderPhrase(r) + "; the client's retry will run the handler again, and if the holder still runs after all, its effects may happen twice"
	}
	return "FORCED: " + holderPhrase(r) + "; the client's retry will run the handler again while this one may still run: its effects may happen twice"
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
	// A claim's times, where its token records them (see holderOf).
	ClaimedAt    *time.Time `json:"claimed_at,omitempty"`
	RenewedAt    *time.Time `json:"renewed_at,omitempty"`
	Lease        string     `json:"lease,omitempty"`
	RenewEvery   string     `json:"renew_every,omitempty"`
	SinceRenewal string     `json:"since_renewal,omitempty"`
	Holder       string     `json:"holder,omitempty"` // live, stuck or unknown (claimed only)
}

func recordRowOf(key, store string, info idemgate.RecordInfo, now time.Time) recordRow {
	r := recordRow{Key: key, Store: store, State: "claimed", Token: info.Token.String(),
		Until: now.Add(info.Left).UTC().Truncate(time.Millisecond), Left: info.Left.Round(time.Second).String(),
		Fingerprint: shownFingerprint(info.Fingerprint), Fields: info.Fields, Status: info.Status, BodyBytes: info.BodySize,
		StoredBytes: info.Size, Kind: info.Kind}
	if info.Finished {
		r.State = "finished"
	}
	if !info.ClaimedAt.IsZero() {
		at := info.ClaimedAt.UTC()
		r.ClaimedAt = &at
	}
	if !info.Finished {
		var since time.Duration
		r.Holder, since = holderOf(info, now)
		if r.Holder != holderUnknown {
			at := now.Add(-since).UTC().Truncate(time.Millisecond)
			r.RenewedAt, r.Lease, r.RenewEvery = &at, info.Lease.String(), (info.Lease / 3).String()
			r.SinceRenewal = since.Round(time.Second).String()
			if since < time.Second {
				r.SinceRenewal = since.Round(time.Millisecond).String()
			}
		}
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
	lines = append(lines, [2]string{"state", state}, [2]string{until, r.Until.Format(time.RFC3339) + " (in " + r.Left + ")"})
	if r.ClaimedAt != nil {
		lines = append(lines, [2]string{"claimed", r.ClaimedAt.Format(millisUTC) + " (by the claiming node's clock)"})
	}
	if r.State == "claimed" {
		if r.RenewedAt != nil {
			lines = append(lines, [2]string{"lease", r.Lease + ", renewed every " + r.RenewEvery + " while the handler runs"},
				[2]string{"last renewed", r.RenewedAt.Format(millisUTC) + " (" + r.SinceRenewal + " ago)"})
		}
		lines = append(lines, [2]string{"holder", holderPhrase(r)})
	}
	lines = append(lines,
		[2]string{"token", r.Token}, [2]string{"fingerprint", fingerprintLine(r.Fingerprint)},
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

// millisUTC prints a UTC time to the millisecond, always three digits.
const millisUTC = "2006-01-02T15:04:05.000Z07:00"

// fingerprintShown is how many hex digits of a v1 fingerprint the tools
// print: the 192 bits the Redis store keeps (Postgres keeps all 256), so
// that one request's record prints alike in every store.
const fingerprintShown = 48

// shownFingerprint is fp as the tools print it: a v1 fingerprint cut to
// fingerprintShown hex digits, any other as stored.
func shownFingerprint(fp string) string {
	if len(fp) > 3+fingerprintShown && strings.HasPrefix(fp, "v1:") {
		return fp[:3+fingerprintShown]
	}
	return fp
}

// fingerprintLine says, for a v1 fingerprint, that it is a prefix.
func fingerprintLine(fp string) string {
	if strings.HasPrefix(fp, "v1:") && len(fp) == 3+fingerprintShown {
		return fp + " (its first 192 bits)"
	}
	return fp
}

// shortKey shortens the digests of a keyspace key for a line of text.
func shortKey(key string) string {
	parts := strings.Split(key, ":")
	if len(parts) != 5 || parts[0] != "idem" || len(parts[3]) != 64 || len(parts[4]) != 64 {
		return key
	}
	return strings.Join([]string{parts[0], parts[1], parts[2], parts[3][:12] + "…", parts[4][:12] + "…"}, ":")
}
