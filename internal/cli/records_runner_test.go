package cli

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/keyspace"
)

// A Runner.Do record is found as a request's: by the tenant, user,
// request id (the scope's Request) and kind (Runner.Kind). While fn runs,
// records show tells a live claim and records release refuses it; once
// fn returned, it shows a finished 200 holding fn's output, and release
// -finished frees the key, so that the next Do runs fn again.
func TestRecordsFindARunnerDoRecordAsARequests(t *testing.T) {
	t.Parallel()
	for name, newBench := range holderBenches() {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := newBench(t)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			scope := keyspace.Scope{Tenant: "acme", User: "billing-worker", Request: "msg-42"}
			flags := []string{"-tenant", scope.Tenant, "-user", scope.User, "-request-id", scope.Request, "-kind", "charge"}
			show := func() recordRow {
				t.Helper()
				code, stdout, stderr := b.run(ctx, append([]string{"records", "show", "-json"}, flags...)...)
				var row recordRow
				if err := json.Unmarshal([]byte(stdout), &row); code != ExitOK || err != nil {
					t.Fatalf("records show: exit %d, %v\n%s%s", code, err, stdout, stderr)
				}
				return row
			}
			r := idemgate.Runner{Store: b.store, Kind: "charge", Lease: 3 * time.Second}
			runs := 0
			fn := func(context.Context) ([]byte, error) {
				runs++
				if row := show(); row.State != "claimed" || row.Holder != "live" || row.Kind != "charge" && row.Kind != "" {
					t.Errorf("while fn runs: %+v, want a live claim", row)
				}
				if code, stdout, stderr := b.run(ctx, append([]string{"records", "release", "-yes"}, flags...)...); code == ExitOK {
					t.Errorf("release of the running Do's claim: exit 0, want a refusal\n%s%s", stdout, stderr)
				}
				return []byte(`{"charge":"ch_42"}`), nil
			}
			if _, err := r.Do(ctx, scope, []byte(`{"amount":100}`), fn); err != nil {
				t.Fatal(err)
			}
			if row := show(); row.State != "finished" || row.Status != 200 || row.BodyBytes != len(`{"charge":"ch_42"}`) {
				t.Errorf("after Do: %+v, want a finished 200 of fn's %d bytes", row, len(`{"charge":"ch_42"}`))
			}
			if code, stdout, stderr := b.run(ctx, append([]string{"records", "release", "-finished", "-yes"}, flags...)...); code != ExitOK {
				t.Fatalf("release -finished: exit %d\n%s%s", code, stdout, stderr)
			}
			if res, err := r.Do(ctx, scope, []byte(`{"amount":100}`), fn); err != nil || res.Replayed || runs != 2 {
				t.Errorf("Do after the release = %+v, %v, runs %d; want fn to run again", res, err, runs)
			}
		})
	}
}
