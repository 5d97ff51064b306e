package middleware

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisStore is a Store on Redis: a single server, Sentinel or Cluster,
// through redis.UniversalClient.
//
// Each record is one string under the key itself. A claimed record is
//
//	'C' token(16 bytes) ident
//
// and a finished one
//
//	'F' token(16 bytes) ident response
//
// where ident frames fingerprint, owner and kind, each prefixed with its
// length (so comparing ident byte for byte compares all three ordinally)
// and response is the encoded status, headers and body. The finished record
// keeps the token so that a resent Complete can tell that it already
// succeeded: go-redis resends a command after a read timeout, and every
// script must give the same answer when it runs twice. Every transition is
// one Lua script touching only that key, so Redis Cluster needs no hash tags
// and never answers CROSSSLOT. A claimed record expires with its lease, a
// finished one after the retention: nothing lives forever.
//
// Round trips: a miss costs two (claim, complete), a replay one, a conflict
// one, plus one extend per Lease/3 of handler time.
type RedisStore struct {
	client redis.UniversalClient
	// The millisecond arguments of the last lease and retention, boxed once:
	// they rarely change, and boxing an int64 per call allocates.
	lease, retention atomic.Pointer[msArg]
}

type msArg struct {
	d   time.Duration
	arg any
}

var _ Store = (*RedisStore)(nil)

// NewRedisStore returns a Store on client. The caller keeps ownership of
// client (and closes it).
func NewRedisStore(client redis.UniversalClient) *RedisStore {
	return &RedisStore{client: client}
}

// The claim script takes the claimed record to create (ARGV[1] = 'C' token
// ident) and the lease in milliseconds. It returns -1 when it claimed the
// key (or already holds it with the same token: a resent claim), -2 on a
// mismatch, the milliseconds left on the lease (>= 0) when the record is
// running, and the encoded response when finished. The comparison happens
// here, inside Redis, so a mismatching caller never receives the stored
// response.
var claimScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if not v then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return -1
end
if string.sub(v, 1, 17) == string.sub(ARGV[1], 1, 17) then
  return -1
end
local id = string.sub(ARGV[1], 18)
if string.sub(v, 18, 17 + #id) ~= id then
  return -2
end
if string.byte(v, 1) == 67 then
  local ttl = redis.call('PTTL', KEYS[1])
  if ttl < 0 then ttl = 0 end
  return ttl
end
return string.sub(v, 18 + #id)
`)

// The fenced scripts take ARGV[1] = 'C' token (plus the response, for
// complete) and act only if the record is still claimed with that token.
var extendScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if not v or string.sub(v, 1, 17) ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
`)

// A record already finished with the caller's token means a resent
// complete whose first run succeeded: it answers 1 and changes nothing.
var completeScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if not v then return 0 end
local head = string.sub(v, 1, 17)
if head == 'F' .. string.sub(ARGV[1], 2, 17) then return 1 end
if head ~= string.sub(ARGV[1], 1, 17) then return 0 end
redis.call('SET', KEYS[1], 'F' .. string.sub(v, 2) .. string.sub(ARGV[1], 18), 'PX', ARGV[2])
return 1
`)

var releaseScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if not v or string.sub(v, 1, 17) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
return 1
`)

// Claim implements Store.
func (s *RedisStore) Claim(ctx context.Context, key string, req ClaimRequest) (ClaimResult, error) {
	rec := getArg()
	rec.b = append(rec.b, 'C')
	rec.b = append(rec.b, req.Token[:]...)
	rec.b = appendString(rec.b, string(req.Fingerprint))
	rec.b = appendString(rec.b, req.Owner)
	rec.b = appendString(rec.b, req.Kind)
	v, err := claimScript.Run(ctx, s.client, []string{key}, rec, s.millis(&s.lease, req.Lease)).Result()
	putArg(rec)
	if err != nil {
		return ClaimResult{}, fmt.Errorf("idemgate: redis claim: %w", err)
	}
	switch v := v.(type) {
	case int64:
		switch {
		case v == -1:
			return ClaimResult{Status: Claimed}, nil
		case v == -2:
			return ClaimResult{Status: Mismatch}, nil
		case v >= 0:
			return ClaimResult{Status: Running, RetryAfter: time.Duration(v) * time.Millisecond}, nil
		}
	case string:
		resp, err := decodeResponse(v)
		if err != nil {
			return ClaimResult{}, fmt.Errorf("idemgate: redis claim: %w", err)
		}
		return ClaimResult{Status: Finished, Response: resp}, nil
	}
	return ClaimResult{}, fmt.Errorf("idemgate: redis claim: unexpected reply %v", v)
}

// Extend implements Store.
func (s *RedisStore) Extend(ctx context.Context, key string, token Token, lease time.Duration) error {
	return s.fenced(ctx, "extend", extendScript, key, token, nil, s.millis(&s.lease, lease))
}

// Complete implements Store.
func (s *RedisStore) Complete(ctx context.Context, key string, token Token, resp Response, retention time.Duration) error {
	return s.fenced(ctx, "complete", completeScript, key, token, &resp, s.millis(&s.retention, retention))
}

// Release implements Store.
func (s *RedisStore) Release(ctx context.Context, key string, token Token) error {
	return s.fenced(ctx, "release", releaseScript, key, token, nil, nil)
}

// fenced runs a compare-and-set script on 'C' token (followed by the
// encoded resp, if any) and ms, if not nil. The script answers 1 (done) or
// 0 (the token no longer holds).
func (s *RedisStore) fenced(ctx context.Context, op string, script *redis.Script, key string, token Token, resp *Response, ms any) error {
	arg := getArg()
	arg.b = append(arg.b, 'C')
	arg.b = append(arg.b, token[:]...)
	if resp != nil {
		arg.b = appendResponse(arg.b, *resp)
	}
	var cmd *redis.Cmd
	if ms != nil {
		cmd = script.Run(ctx, s.client, []string{key}, arg, ms)
	} else {
		cmd = script.Run(ctx, s.client, []string{key}, arg)
	}
	putArg(arg)
	n, err := cmd.Int64()
	if err != nil {
		return fmt.Errorf("idemgate: redis %s: %w", op, err)
	}
	if n != 1 {
		return ErrLeaseLost
	}
	return nil
}

// millis returns d rounded up to whole milliseconds (at least 1) as a
// script argument, boxed once per distinct duration.
func (s *RedisStore) millis(cache *atomic.Pointer[msArg], d time.Duration) any {
	if c := cache.Load(); c != nil && c.d == d {
		return c.arg
	}
	ms := int64((d + time.Millisecond - 1) / time.Millisecond)
	if ms < 1 {
		ms = 1
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

// Stored response encoding, version 1:
//
//	0x01 uvarint(status) uvarint(#names)
//	  { uvarint(len) name uvarint(#values) { uvarint(len) value } }
//	body (the rest, byte for byte)
const responseVersion = 1

var errCorrupt = errors.New("corrupt stored response")

// appendResponse appends the encoding of r to b.
func appendResponse(b []byte, r Response) []byte {
	b = append(b, responseVersion)
	b = binary.AppendUvarint(b, uint64(r.Status))
	b = binary.AppendUvarint(b, uint64(len(r.Header)))
	for name, values := range r.Header {
		b = appendString(b, name)
		b = binary.AppendUvarint(b, uint64(len(values)))
		for _, v := range values {
			b = appendString(b, v)
		}
	}
	return append(b, r.Body...)
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// decodeResponse decodes an encoded response. Header names and values are
// substrings of s, so decoding costs a map, one values slice and the body.
func decodeResponse(s string) (Response, error) {
	if len(s) == 0 || s[0] != responseVersion {
		return Response{}, errCorrupt
	}
	d := decoder{s: s, i: 1}
	status := d.uvarint()
	names := d.uvarint()
	if d.err || status > 999 || names > uint64(len(s)) {
		return Response{}, errCorrupt
	}
	// First pass counts the values so that they share one backing array.
	start, total := d.i, 0
	for range names {
		d.str()
		n := d.uvarint()
		if d.err || n > uint64(len(s)) {
			return Response{}, errCorrupt
		}
		total += int(n)
		for range n {
			d.str()
		}
	}
	if d.err {
		return Response{}, errCorrupt
	}
	body := []byte(s[d.i:])
	d.i = start
	var header http.Header
	if names > 0 {
		header = make(http.Header, names)
	}
	all := make([]string, total)
	for range names {
		name := d.str()
		n := int(d.uvarint())
		for j := range n {
			all[j] = d.str()
		}
		header[name], all = all[:n:n], all[n:]
	}
	return Response{Status: int(status), Header: header, Body: body}, nil
}

type decoder struct {
	s   string
	i   int
	err bool
}

func (d *decoder) uvarint() uint64 {
	var x uint64
	for shift := uint(0); shift < 64; shift += 7 {
		if d.i >= len(d.s) {
			d.err = true
			return 0
		}
		c := d.s[d.i]
		d.i++
		x |= uint64(c&0x7f) << shift
		if c < 0x80 {
			return x
		}
	}
	d.err = true
	return 0
}

func (d *decoder) str() string {
	n := d.uvarint()
	if d.err || n > uint64(len(d.s)-d.i) {
		d.err = true
		return ""
	}
	v := d.s[d.i : d.i+int(n)]
	d.i += int(n)
	return v
}
