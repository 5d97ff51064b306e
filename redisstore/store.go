// Package redisstore is an idemgate.Store on Redis (a single server,
// Sentinel or Cluster, through redis.UniversalClient): the claims,
// fencing tokens and stored responses of every door, echo's middleware,
// a net/http handler or Runner.Do. It links go-redis and no web
// framework.
//
// Its records and keys are described on Store and in docs/records.md.
package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/internal/wire"
)

// Store is an idemgate.Store on Redis: a single server, Sentinel or Cluster,
// through redis.UniversalClient.
//
// Each record is one string under one key. A key derived by keyspace,
// idem:<tenant>:<kind>:<hex owner>:<hex request>, is stored compact as
//
//	idem:<tenant>:<kind>:{}<owner digest, 16 bytes><request digest, 16 bytes>
//
// (the first 128 bits of each SHA-256, raw; the empty hash tag "{}" makes
// Redis Cluster hash the whole key whatever bytes the digests hold); any
// other key is used as given. The record is binary and versioned: the
// fencing token, the fingerprint's raw digest, the owner
// and kind only when the key does not already name them, the selected
// fields' digests, and once finished the response. A finished record keeps
// the token so that a resent Complete can tell that it already succeeded:
// go-redis resends a command after a read timeout, and every step must
// give the same answer when it runs twice.
//
// Claim is one native command, SET key claim NX PX lease GET (Redis ≥ 7.0):
// it creates the claim or returns the record that holds the key, and the
// fingerprint, owner and kind are compared here, in Go. The stored response
// reaches this process on a mismatch, never the client. A running holder
// costs one more round trip (PTTL, for Retry-After). On Redis before 7.0,
// which refuses SET NX GET, the store notices the first refusal and claims
// with an equivalent script from then on. Extend, Complete and Release are
// one Lua script each (EVALSHA, falling back to EVAL), each a
// compare-and-set on the token. Every command touches one key, so Redis
// Cluster needs no hash tags and never answers CROSSSLOT. A claimed record
// expires with its lease, a finished one after the retention.
//
// Records written by earlier versions (a version 1 record under a key that
// is not a keyspace key) still replay, conflict, and can be completed.
//
// Round trips: a miss costs two (claim, complete), a replay one, a conflict
// one, plus one extend per Lease/3 of handler time.
type Store struct {
	client redis.UniversalClient
	// The millisecond arguments of the last lease and retention, boxed once:
	// they rarely change, and boxing an int64 per call allocates.
	lease, retention atomic.Pointer[msArg]
	// noSetGet is set once the server refused SET NX GET (Redis < 7.0).
	noSetGet atomic.Bool
}

type msArg struct {
	d   time.Duration
	arg any
}

var _ idemgate.Store = (*Store)(nil)

// New returns a Store on client. The caller keeps ownership of client
// (and closes it).
func New(client redis.UniversalClient) *Store {
	return &Store{client: client}
}

// claimScript does what SET KEYS[1] ARGV[1] NX PX ARGV[2] GET does on
// Redis ≥ 7.0, for older servers.
var claimScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if v then return v end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return false
`)

// The fenced scripts take ARGV[1] = 0x02 'C' token (plus the response, for
// complete) and act only if the record is still claimed with that token,
// in version 2 or version 1 ('C' token) form. Only the head is read.
var extendScript = redis.NewScript(`
local h = redis.call('GETRANGE', KEYS[1], 0, 17)
if h ~= ARGV[1] and string.sub(h, 1, 17) ~= string.sub(ARGV[1], 2) then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
`)

var releaseScript = redis.NewScript(`
local h = redis.call('GETRANGE', KEYS[1], 0, 17)
if h ~= ARGV[1] and string.sub(h, 1, 17) ~= string.sub(ARGV[1], 2) then return 0 end
redis.call('DEL', KEYS[1])
return 1
`)

// completeScript turns the claim into a finished record: 'F' for 'C', the
// response appended. A record already finished with the caller's token
// means a resent complete whose first run succeeded: it answers 1 and
// changes nothing.
var completeScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if not v then return 0 end
local tok = string.sub(ARGV[1], 3, 18)
local p = 1
if string.byte(v, 1) == 2 then p = 2 end
local h = string.sub(v, p, p + 16)
if h == 'F' .. tok then return 1 end
if h ~= 'C' .. tok then return 0 end
redis.call('SET', KEYS[1], string.sub(v, 1, p - 1) .. 'F' .. string.sub(v, p + 1) .. string.sub(ARGV[1], 19), 'PX', ARGV[2])
return 1
`)

// maxClaimTries bounds the claims of one Claim call when the running
// holder's key vanishes between the claim and the PTTL (released or
// expired): then the key is free, and the claim is tried again.
const maxClaimTries = 3

// Claim implements idemgate.Store.
func (s *Store) Claim(ctx context.Context, key string, req idemgate.ClaimRequest) (idemgate.ClaimResult, error) {
	res, stored, err := s.ClaimStored(ctx, key, req)
	if err == nil && res.Status == idemgate.Finished {
		res.Response = response(&stored)
	}
	return res, err
}

// ClaimStored is Claim without decoding a finished response, for the
// engine's replay: it answers Finished with the stored response checked
// but not decoded, for the engine to write as it is. Every other answer,
// and every error, is Claim's. Use Claim.
func (s *Store) ClaimStored(ctx context.Context, key string, req idemgate.ClaimRequest) (idemgate.ClaimResult, wire.Stored, error) {
	k, implied := storeKey(key, req.Owner, req.Kind)
	id := newIdent(req, implied)
	rec := getArg()
	defer putArg(rec)
	rec.b = appendClaim(rec.b, req.Token, &id, req.Fields)
	ms := s.millis(&s.lease, req.Lease)
	for try := 1; ; try++ {
		v, held, err := s.setNX(ctx, k, rec, ms)
		if err != nil {
			return idemgate.ClaimResult{}, wire.Stored{}, fmt.Errorf("redisstore: claim: %w", err)
		}
		if !held {
			return idemgate.ClaimResult{Status: idemgate.Claimed}, wire.Stored{}, nil
		}
		r, err := parseRecord(v)
		if err != nil {
			return idemgate.ClaimResult{}, wire.Stored{}, fmt.Errorf("redisstore: claim: %w", err)
		}
		v1 := v[0] != recordV2
		switch {
		case !r.finished && r.token == string(req.Token[:]):
			return idemgate.ClaimResult{Status: idemgate.Claimed}, wire.Stored{}, nil // a resent claim
		case !r.sameOwnerKind(&id, &req, v1):
			return idemgate.ClaimResult{Status: idemgate.Mismatch}, wire.Stored{}, nil
		case !r.sameFingerprint(&id, &req, v1):
			return idemgate.ClaimResult{Status: idemgate.Mismatch, Changed: r.changed(req.Fields)}, wire.Stored{}, nil
		case r.finished:
			stored, err := checkResponse(r.resp)
			if err != nil {
				return idemgate.ClaimResult{}, wire.Stored{}, fmt.Errorf("redisstore: claim: %w", err)
			}
			return idemgate.ClaimResult{Status: idemgate.Finished}, stored, nil
		}
		left, err := s.client.PTTL(ctx, k).Result()
		if err != nil {
			return idemgate.ClaimResult{}, wire.Stored{}, fmt.Errorf("redisstore: claim: lease left: %w", err)
		}
		switch {
		case left == -2 && try < maxClaimTries:
			continue // gone since: claim again
		case left < 0:
			left = 0
		}
		return idemgate.ClaimResult{Status: idemgate.Running, RetryAfter: left}, wire.Stored{}, nil
	}
}

// setNX sets k to rec unless it exists, and returns the record that holds
// it (held) or nothing (claimed).
func (s *Store) setNX(ctx context.Context, k string, rec *scriptArg, ms any) (v string, held bool, err error) {
	if !s.noSetGet.Load() {
		cmd := redis.NewStringCmd(ctx, "set", k, rec, "nx", "px", ms, "get")
		_ = s.client.Process(ctx, cmd)
		v, err = cmd.Result()
		switch {
		case err == nil:
			return v, true, nil
		case errors.Is(err, redis.Nil):
			return "", false, nil
		case !refusesSetNXGet(err):
			return "", false, err
		}
		s.noSetGet.Store(true)
	}
	v, err = claimScript.Run(ctx, s.client, []string{k}, rec, ms).Text()
	switch {
	case err == nil:
		return v, true, nil
	case errors.Is(err, redis.Nil):
		return "", false, nil
	}
	return "", false, err
}

// refusesSetNXGet reports the answer of a Redis before 7.0 to SET … NX …
// GET: "ERR syntax error" (6.2 refuses NX with GET, older ones GET).
func refusesSetNXGet(err error) bool {
	var rerr redis.Error
	return errors.As(err, &rerr) && strings.Contains(rerr.Error(), "syntax error")
}

// storeKey returns the key a record is stored under: a keyspace key
// compacted (see Store), anything else as given. implied reports that
// the key is a keyspace key naming owner and kind.
func storeKey(key, owner, kind string) (k string, implied bool) {
	const digest = 64
	n := len(key)
	if n < len("idem:a:b:")+2*digest+1 || key[n-digest-1] != ':' || key[n-2*digest-2] != ':' || key[:5] != "idem:" {
		return key, false
	}
	o, r := key[n-2*digest-1:n-digest-1], key[n-digest:]
	head := key[:n-2*digest-2] // idem:<tenant>:<kind>
	colon := strings.IndexByte(head[5:], ':')
	if colon < 0 || strings.IndexByte(head[5+colon+1:], ':') >= 0 || !isLowerHex(o[32:]) || !isLowerHex(r[32:]) {
		return key, false
	}
	var buf [128]byte // holds most keys, so that the key is the one allocation
	b := append(buf[:0], head...)
	b = append(b, ":{}"...)
	b, ok := appendLowerHex(b, o[:32])
	if ok {
		b, ok = appendLowerHex(b, r[:32])
	}
	if !ok {
		return key, false
	}
	return string(b), o == owner && head[5+colon+1:] == kind
}

// Extend implements idemgate.Store.
func (s *Store) Extend(ctx context.Context, key string, token idemgate.Token, lease time.Duration) error {
	return s.fenced(ctx, "extend", extendScript, key, token, nil, s.millis(&s.lease, lease))
}

// Complete implements idemgate.Store.
func (s *Store) Complete(ctx context.Context, key string, token idemgate.Token, resp idemgate.Response, retention time.Duration) error {
	return s.fenced(ctx, "complete", completeScript, key, token, &resp, s.millis(&s.retention, retention))
}

// Release implements idemgate.Store.
func (s *Store) Release(ctx context.Context, key string, token idemgate.Token) error {
	return s.fenced(ctx, "release", releaseScript, key, token, nil, nil)
}

// fenced runs a compare-and-set script on 0x02 'C' token (followed by the
// encoded resp, if any) and ms, if not nil. The script answers 1 (done) or
// 0 (the token no longer holds).
func (s *Store) fenced(ctx context.Context, op string, script *redis.Script, key string, token idemgate.Token, resp *idemgate.Response, ms any) error {
	k, _ := storeKey(key, "", "")
	arg := getArg()
	defer putArg(arg)
	arg.b = append(arg.b, recordV2, 'C')
	arg.b = append(arg.b, token[:]...)
	if resp != nil {
		var err error
		if arg.b, err = appendResponse(arg.b, *resp); err != nil {
			return fmt.Errorf("redisstore: %s: %w", op, err)
		}
	}
	var cmd *redis.Cmd
	if ms != nil {
		cmd = script.Run(ctx, s.client, []string{k}, arg, ms)
	} else {
		cmd = script.Run(ctx, s.client, []string{k}, arg)
	}
	n, err := cmd.Int64()
	if err != nil {
		return fmt.Errorf("redisstore: %s: %w", op, err)
	}
	if n != 1 {
		return idemgate.ErrLeaseLost
	}
	return nil
}

// millis returns d rounded up to whole milliseconds (at least 1) as a
// script argument, boxed once per distinct duration.
func (s *Store) millis(cache *atomic.Pointer[msArg], d time.Duration) any {
	if c := cache.Load(); c != nil && c.d == d {
		return c.arg
	}
	ms := int64(1)
	if d > 0 {
		ms = int64(d / time.Millisecond)
		if d%time.Millisecond != 0 {
			ms++ // not d + 999999ns: that overflows near math.MaxInt64
		}
	}
	c := &msArg{d: d, arg: ms}
	cache.Store(c)
	return c.arg
}

const maxPooledBlob = 64 << 10

// scriptArg is a pooled script argument. go-redis writes an
// encoding.BinaryMarshaler's bytes as they are, and a pointer goes into an
// interface without an allocation, unlike a []byte or string.
type scriptArg struct{ b []byte }

// MarshalBinary implements encoding.BinaryMarshaler.
func (a *scriptArg) MarshalBinary() ([]byte, error) { return a.b, nil }

var argPool = sync.Pool{New: func() any { return &scriptArg{b: make([]byte, 0, 512)} }}

func getArg() *scriptArg { a := argPool.Get().(*scriptArg); a.b = a.b[:0]; return a }

// putArg returns a to the pool once go-redis has written it (the call
// returned).
func putArg(a *scriptArg) {
	if cap(a.b) <= maxPooledBlob {
		argPool.Put(a)
	}
}
