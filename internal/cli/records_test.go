package cli

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/fingerprint"
	"github.com/idemgate/idemgate/keyspace"
)

// One request's record shows one fingerprint, whichever store holds it:
// the Redis store keeps 192 bits of a v1 fingerprint's digest and
// Postgres all of it, and records show prints what both have.
func TestRecordsShowOneFingerprintForOneRequestInEveryStore(t *testing.T) {
	t.Parallel()
	const fp = "v1:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	got := map[string]string{}
	for name, newBench := range holderBenches() {
		b := newBench(t)
		ctx := context.Background()
		k, err := keyspace.Derive("images", keyspace.Scope{Tenant: "acme", User: "alice", Request: "fp-1"})
		if err != nil {
			t.Fatal(err)
		}
		res, err := b.store.Claim(ctx, k.String(), idemgate.ClaimRequest{Fingerprint: fingerprint.Fingerprint(fp),
			Owner: k.Owner(), Kind: k.Kind(), Lease: time.Minute, Token: claimToken(time.Now(), time.Minute)})
		if err != nil || res.Status != idemgate.Claimed {
			t.Fatalf("%s: claim: %v %v", name, res.Status, err)
		}
		code, stdout, stderr := b.run(ctx, "records", "show", "-json", "-key", k.String())
		var row recordRow
		if err := json.Unmarshal([]byte(stdout), &row); code != ExitOK || err != nil {
			t.Fatalf("%s: show -json: exit %d, %v\n%s%s", name, code, err, stdout, stderr)
		}
		got[name] = row.Fingerprint
	}
	if got["redis"] != got["postgres"] || got["redis"] != fp[:3+48] {
		t.Fatalf("fingerprints: redis %q, postgres %q; want both %q", got["redis"], got["postgres"], fp[:3+48])
	}
}
