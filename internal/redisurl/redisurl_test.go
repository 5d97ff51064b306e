package redisurl

import (
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
)

func TestParse(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		given     string
		wantTopo  Topology
		wantAddrs []string
		wantDB    int
		wantPass  string
		wantName  string
		wantErr   string
	}{
		{name: "one node", given: "redis://localhost:6379/3", wantTopo: Single, wantAddrs: []string{"localhost:6379"}, wantDB: 3},
		{name: "one node with password", given: "redis://:s3cret@h:1", wantTopo: Single, wantAddrs: []string{"h:1"}, wantPass: "s3cret"},
		{name: "cluster seed list", given: "redis://h1:7000,h2:7001,h3:7002", wantTopo: Cluster,
			wantAddrs: []string{"h1:7000", "h2:7001", "h3:7002"}},
		{name: "cluster addr params", given: "redis://u:p@h1:7000?addr=h2:7001&addr=h3:7002", wantTopo: Cluster,
			wantAddrs: []string{"h1:7000", "h2:7001", "h3:7002"}, wantPass: "p"},
		{name: "sentinel", given: "redis://s1:26379,s2:26379?master_name=mymaster", wantTopo: Sentinel,
			wantAddrs: []string{"s1:26379", "s2:26379"}, wantName: "mymaster"},
		{name: "wrong scheme", given: "http://h:1", wantErr: "scheme"},
		{name: "empty seed", given: "redis://h1:1,,h2:2", wantErr: "empty host"},
		{name: "unknown parameter", given: "redis://h1:1,h2:2?bogus=1", wantErr: "bogus"},
		{name: "not a URL, password not echoed", given: "redis://:pa ss@h:1%", wantErr: "not a URL"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o, topo, err := Parse(tt.given)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one saying %q", err, tt.wantErr)
				}
				if strings.Contains(err.Error(), "pa ss") || strings.Contains(err.Error(), "s3cret") {
					t.Fatalf("error %q echoes the password", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if topo != tt.wantTopo || strings.Join(o.Addrs, ",") != strings.Join(tt.wantAddrs, ",") ||
				o.DB != tt.wantDB || o.Password != tt.wantPass || o.MasterName != tt.wantName {
				t.Fatalf("got %s %v db=%d pass=%q master=%q", topo, o.Addrs, o.DB, o.Password, o.MasterName)
			}
			// The options choose the same topology in go-redis.
			c := redis.NewUniversalClient(o)
			defer c.Close()
			_, isCluster := c.(*redis.ClusterClient)
			if isCluster != (topo == Cluster) {
				t.Fatalf("go-redis made a %T for a %s URL", c, topo)
			}
		})
	}
}

func TestRedact(t *testing.T) {
	t.Parallel()
	for given, want := range map[string]string{
		"redis://u:s3cret@h:1/0":    "redis://u:xxxxx@h:1/0",
		"postgres://u:pw@db/x":      "postgres://u:xxxxx@db/x",
		"host=db password=pw":       "(configured)",
		"redis://h1:7000,h2:7001/0": "redis://h1:7000,h2:7001/0",
	} {
		if got := Redact(given); got != want {
			t.Errorf("Redact(%q) = %q, want %q", given, got, want)
		}
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{"redis://h:1/0", "redis://a:1,b:2", "rediss://u:p@a:1?addr=b:2", "redis://s:1?master_name=m", "redis://,", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		o, topo, err := Parse(s)
		if err != nil {
			return
		}
		if len(o.Addrs) == 0 || topo == "" {
			t.Fatalf("%q: accepted with no address (%s)", s, topo)
		}
		if topo == Cluster && !o.IsClusterMode {
			t.Fatalf("%q: a cluster URL not in cluster mode", s)
		}
	})
}

// Redact hides a password wherever a URL may carry one: the user info
// and the query parameters that go-redis (Sentinel's password=) and
// libpq (password=, sslpassword=) read.
func TestRedactHidesEverySecret(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, given, want string
	}{
		{name: "user info", given: "redis://u:hunter2@h:1/0", want: "redis://u:xxxxx@h:1/0"},
		{name: "sentinel password parameter", given: "redis://s1:26379?master_name=m&password=hunter2",
			want: "redis://s1:26379?master_name=m&password=xxxxx"},
		{name: "postgres sslpassword", given: "postgres://h/db?sslpassword=hunter2&sslmode=require",
			want: "postgres://h/db?sslmode=require&sslpassword=xxxxx"},
		{name: "upper case", given: "postgres://h/db?PASSWORD=hunter2", want: "postgres://h/db?PASSWORD=xxxxx"},
		{name: "query that does not parse", given: "postgres://h/db?password=hunter2%zz", want: "(configured)"},
		{name: "not a URL", given: "host=h password=hunter2", want: "(configured)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := Redact(tt.given); got != tt.want {
				t.Fatalf("Redact(%q) = %q, want %q", tt.given, got, tt.want)
			}
		})
	}
}

// A cluster has only database 0: a cluster URL naming another one (in the
// path or as db=) is refused, not read as database 0 without a word.
func TestParseRefusesAClusterDatabase(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		given   string
		wantErr bool
	}{
		{name: "seed list, path", given: "redis://h1:7000,h2:7001/3", wantErr: true},
		{name: "addr parameters, path", given: "redis://h1:7000/2?addr=h2:7001", wantErr: true},
		{name: "seed list, db parameter", given: "redis://h1:7000,h2:7001?db=1", wantErr: true},
		{name: "seed list, database 0", given: "redis://h1:7000,h2:7001/0"},
		{name: "seed list, no database", given: "redis://h1:7000,h2:7001/"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, topo, err := Parse(tt.given)
			if (err != nil) != tt.wantErr {
				t.Fatalf("Parse(%q) = %s, %v; want an error: %v", tt.given, topo, err, tt.wantErr)
			}
			if err != nil && !strings.Contains(err.Error(), "database") {
				t.Fatalf("error %q does not say why", err)
			}
		})
	}
}

// A password with a '/', '?' or '#' that was not percent-encoded ends
// the user info early: the URL then parses as a host, and the rest of the
// password lands in the path, the query or the fragment, where go-redis'
// errors quote it and Redact keeps it. Parse refuses such a URL without a
// word of it, and Redact never prints a fragment or an '@' after the host.
func TestAPasswordWithAnUnencodedSlashQuestionMarkOrHashNeverShows(t *testing.T) {
	t.Parallel()
	for _, given := range []string{
		"redis://:/hunter2@127.0.0.1:6379",
		"redis://:12/hunter2@127.0.0.1:6379",
		"redis://:12?hunter2@127.0.0.1:6379",
		"redis://:12#hunter2@127.0.0.1:6379",
		"rediss://u:12/hunter2@h1:7000,h2:7001",
		"redis://:12?hunter2@s1:26379&master_name=m",
	} {
		t.Run(given, func(t *testing.T) {
			t.Parallel()
			_, _, err := Parse(given)
			if err == nil {
				t.Fatalf("Parse accepted it; want an error")
			}
			if strings.Contains(err.Error(), "hunter2") {
				t.Errorf("Parse's error %q echoes the password", err)
			}
			if r := Redact(given); strings.Contains(r, "hunter2") {
				t.Errorf("Redact = %q, echoes the password", r)
			}
		})
	}
}
