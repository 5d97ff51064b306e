// Package redisurl reads a REDIS_URL the way the example and the idemgate
// command take it: one node, a cluster or Sentinel, told apart as
// go-redis' UniversalClient tells the three topologies apart.
package redisurl

import (
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Topology is what a URL names.
type Topology string

// The topologies a URL can name.
const (
	Single   Topology = "single node"
	Cluster  Topology = "cluster"
	Sentinel Topology = "sentinel"
)

// Parse reads s:
//
//	redis://host:6379/0                                 one node (redis.ParseURL)
//	redis://h1:7000,h2:7001,h3:7002                     a cluster: several seed addresses
//	redis://h1:7000?addr=h2:7001&addr=h3:7002           the same, go-redis' ParseClusterURL form
//	redis://s1:26379?master_name=mymaster&addr=s2:26379 Sentinel: sentinels and the master's name
//
// rediss:// asks for TLS in each form. A cluster URL takes no database
// number (a cluster has only database 0). An error never echoes a
// password, and a URL with an '@' after its host is refused (see
// AtAfterHost).
func Parse(s string) (*redis.UniversalOptions, Topology, error) {
	u, err := url.Parse(strings.TrimSpace(s))
	if err != nil {
		return nil, "", errors.New("not a URL") // url's error would echo a password
	}
	if AtAfterHost(s) {
		return nil, "", errAtAfterHost
	}
	if u.Scheme != "redis" && u.Scheme != "rediss" {
		return nil, "", fmt.Errorf("scheme %q: want redis:// or rediss://", u.Scheme)
	}
	q := u.Query()
	seeds := strings.Split(u.Host, ",")
	for _, h := range seeds {
		if h == "" {
			return nil, "", errors.New("empty host in the address list")
		}
	}
	if len(seeds) > 1 {
		// A seed list in the host: the first seed is the URL's host, the
		// others go to addr=, as ParseClusterURL and ParseFailoverURL read them.
		u.Host = seeds[0]
		for _, h := range seeds[1:] {
			q.Add("addr", h)
		}
		u.RawQuery = q.Encode()
	}
	switch {
	case q.Get("master_name") != "":
		o, err := redis.ParseFailoverURL(u.String())
		if err != nil {
			return nil, "", redactErr(err)
		}
		return &redis.UniversalOptions{
			Addrs: o.SentinelAddrs, MasterName: o.MasterName,
			Username: o.Username, Password: o.Password,
			SentinelUsername: o.SentinelUsername, SentinelPassword: o.SentinelPassword,
			DB: o.DB, TLSConfig: o.TLSConfig, Protocol: o.Protocol,
			DialTimeout: o.DialTimeout, ReadTimeout: o.ReadTimeout, WriteTimeout: o.WriteTimeout,
			PoolSize: o.PoolSize, MinIdleConns: o.MinIdleConns,
		}, Sentinel, nil
	case len(q["addr"]) > 0:
		// go-redis ignores a cluster URL's path: a database number there
		// would be dropped without a word.
		if db := strings.Trim(u.Path, "/"); db != "" && db != "0" || q.Has("db") && q.Get("db") != "0" {
			return nil, "", errors.New("a cluster URL names a database: a cluster has only database 0; drop the /N (or db=)")
		}
		q.Del("db")
		u.Path, u.RawQuery = "", q.Encode()
		o, err := redis.ParseClusterURL(u.String())
		if err != nil {
			return nil, "", redactErr(err)
		}
		return &redis.UniversalOptions{
			Addrs: o.Addrs, IsClusterMode: true,
			Username: o.Username, Password: o.Password,
			TLSConfig: o.TLSConfig, Protocol: o.Protocol,
			DialTimeout: o.DialTimeout, ReadTimeout: o.ReadTimeout, WriteTimeout: o.WriteTimeout,
			PoolSize: o.PoolSize, MinIdleConns: o.MinIdleConns,
		}, Cluster, nil
	}
	o, err := redis.ParseURL(u.String())
	if err != nil {
		return nil, "", redactErr(err)
	}
	return &redis.UniversalOptions{
		Addrs: []string{o.Addr}, Username: o.Username, Password: o.Password,
		DB: o.DB, TLSConfig: o.TLSConfig, Protocol: o.Protocol,
		DialTimeout: o.DialTimeout, ReadTimeout: o.ReadTimeout, WriteTimeout: o.WriteTimeout,
		PoolSize: o.PoolSize, MinIdleConns: o.MinIdleConns,
	}, Single, nil
}

// redactErr keeps go-redis' reason but never a URL that may hold a
// password: its parse errors quote parameters, not the user info.
func redactErr(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return errors.New("not a URL")
	}
	return err
}

// errAtAfterHost refuses a URL that AtAfterHost reports, naming no part of it.
var errAtAfterHost = errors.New("an '@' after the host (not shown): a password holding '/', '?' or '#' must be percent-encoded (%2F, %3F, %23), as must an '@' in a path or parameter (%40)")

// AtAfterHost reports whether s, a URL, has an '@' after its host, in its
// path, query or fragment: the mark of a password holding a '/', '?' or
// '#' that was not percent-encoded. Such a character ends the user info
// early, so the URL reads as one with no password, and the rest of the
// password, up to the '@', lands in the path (a database number or name),
// the query (a parameter's name) or the fragment, where errors quote it.
func AtAfterHost(s string) bool {
	_, rest, ok := strings.Cut(strings.TrimSpace(s), "://")
	if !ok {
		return false
	}
	i := strings.IndexAny(rest, "/?#")
	return i >= 0 && strings.Contains(rest[i:], "@")
}

// Redact returns s, a URL, for printing: its user info's password and
// the value of every query parameter that may hold a secret (see
// IsSecretParam) replaced by "xxxxx", its fragment dropped. A string that
// does not parse as a URL, or has an '@' after its host (AtAfterHost), is
// "(configured)".
func Redact(s string) string {
	u, err := url.Parse(strings.TrimSpace(s))
	if err != nil || u.Scheme == "" || AtAfterHost(s) {
		return "(configured)"
	}
	u.Fragment, u.RawFragment = "", ""
	if u.RawQuery != "" {
		q, err := url.ParseQuery(u.RawQuery)
		if err != nil {
			return "(configured)" // a query that does not parse may hide a secret anywhere
		}
		for name, values := range q {
			if IsSecretParam(name) {
				for i := range values {
					values[i] = "xxxxx"
				}
			}
		}
		u.RawQuery = q.Encode()
	}
	return u.Redacted()
}

// IsSecretParam reports whether a connection parameter of that name may
// hold a secret: libpq's and pgx's password and sslpassword, go-redis'
// password (Sentinel) and sentinel_password, and, to be safe with names
// a driver may add, any name holding "pass", "secret", "token" or "key"
// (sslkey, a file name, is masked with them), in any case.
func IsSecretParam(name string) bool {
	n := strings.ToLower(name)
	for _, s := range []string{"pass", "secret", "token", "key"} {
		if strings.Contains(n, s) {
			return true
		}
	}
	return false
}
