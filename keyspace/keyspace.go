package keyspace

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
)

// ErrInvalid is wrapped by every error Derive returns. The wrapping error
// says which part is wrong and why, without echoing the user or request id.
var ErrInvalid = errors.New("invalid key input")

// Limits on the parts of a Scope, in bytes, as Derive enforces them. The
// request id limit is Stripe's limit on an idempotency key; a header parser
// that reads the request id can refuse a longer one before deriving.
const (
	MaxTenant  = 255
	MaxUser    = 255
	MaxRequest = 255
)

const maxKind = 64

const (
	prefix    = "idem:"
	digestLen = 2 * sha256.Size
	// maxKeyLen bounds String(): the tenant escapes to at most 3 bytes per
	// byte.
	maxKeyLen = len(prefix) + 3*MaxTenant + 1 + maxKind + 1 + digestLen + 1 + digestLen
)

// Scope is who asks and what they call the action.
type Scope struct {
	// Tenant is the customer or organisation; it appears normalized in the key.
	Tenant string
	// User is the authenticated principal; it appears only as a digest.
	User string
	// Request is the client's idempotency key (the request id); it appears
	// only as a digest.
	Request string
}

// Key is a derived idempotency key. It is a small comparable value; the zero
// Key means "no key" and all its methods return "".
type Key struct {
	// s is String(): Derive allocates once, and every accessor but Task
	// is a substring. Task is hashed when asked for: a store keyed by
	// String (Redis) never needs it.
	s         string
	tenantEnd int // end of the tenant segment in s
	kindEnd   int // end of the kind segment in s
}

// Derive returns the key for the action kind performed in scope s.
//
// kind must match [a-z0-9][a-z0-9_-]{0,63}. Tenant, user and request must be
// non-empty and at most 255 bytes each; the request id must also be
// printable ASCII (0x20–0x7E). Otherwise the error wraps [ErrInvalid].
func Derive(kind string, s Scope) (Key, error) {
	if err := validate(kind, s); err != nil {
		return Key{}, err
	}

	// Both inputs are at most 255 bytes, so they are hashed from a stack
	// buffer instead of a heap copy.
	var in [MaxRequest]byte
	user := sha256.Sum256(in[:copy(in[:], s.User)])
	request := sha256.Sum256(in[:copy(in[:], s.Request)])

	// The key is built on the stack; string(b) is Derive's one allocation.
	var buf [maxKeyLen]byte
	b := buf[:0]
	b = append(b, prefix...)
	b = appendSegment(b, s.Tenant)
	tenantEnd := len(b)
	b = append(b, ':')
	b = append(b, kind...)
	kindEnd := len(b)
	b = append(b, ':')
	b = hex.AppendEncode(b, user[:])
	b = append(b, ':')
	b = hex.AppendEncode(b, request[:])

	return Key{s: string(b), tenantEnd: tenantEnd, kindEnd: kindEnd}, nil
}

func validate(kind string, s Scope) error {
	if err := validateKind(kind); err != nil {
		return err
	}
	if err := validateLen("tenant", s.Tenant, MaxTenant); err != nil {
		return err
	}
	if err := validateLen("user", s.User, MaxUser); err != nil {
		return err
	}
	if err := validateLen("request id", s.Request, MaxRequest); err != nil {
		return err
	}
	for i := 0; i < len(s.Request); i++ {
		if c := s.Request[i]; c < 0x20 || c > 0x7E {
			return fmt.Errorf("keyspace: request id has byte 0x%02X at offset %d, want printable ASCII 0x20-0x7E: %w", c, i, ErrInvalid)
		}
	}
	return nil
}

func validateKind(kind string) error {
	if err := validateLen("kind", kind, maxKind); err != nil {
		return err
	}
	for i := 0; i < len(kind); i++ {
		c := kind[i]
		ok := 'a' <= c && c <= 'z' || '0' <= c && c <= '9' || i > 0 && (c == '_' || c == '-')
		if !ok {
			return fmt.Errorf("keyspace: kind %q has byte %q at offset %d, want [a-z0-9][a-z0-9_-]{0,63}: %w", kind, c, i, ErrInvalid)
		}
	}
	return nil
}

func validateLen(what, v string, max int) error {
	switch {
	case v == "":
		return fmt.Errorf("keyspace: %s is empty: %w", what, ErrInvalid)
	case len(v) > max:
		return fmt.Errorf("keyspace: %s is %d bytes, max %d: %w", what, len(v), max, ErrInvalid)
	}
	return nil
}

// String returns the store key,
// idem:<tenant>:<kind>:<hex sha256(user)>:<hex sha256(request)>.
func (k Key) String() string {
	return k.s
}

// Task returns <kind>:<hex sha256(k.String())>: a fixed-length key (for a
// given kind) for the Postgres task store. It is computed on each call
// (one SHA-256 and one allocation): call it once per request.
func (k Key) Task() string {
	if k.s == "" {
		return ""
	}
	var in [maxKeyLen]byte
	text := sha256.Sum256(in[:copy(in[:], k.s)])
	var buf [maxKind + 1 + digestLen]byte
	b := append(buf[:0], k.Kind()...)
	b = append(b, ':')
	b = hex.AppendEncode(b, text[:])
	return string(b)
}

// Tenant returns the normalized tenant segment, as it appears in String.
func (k Key) Tenant() string {
	if k.s == "" {
		return ""
	}
	return k.s[len(prefix):k.tenantEnd]
}

// Kind returns the kind of action the key was derived for.
func (k Key) Kind() string {
	if k.s == "" {
		return ""
	}
	return k.s[k.tenantEnd+1 : k.kindEnd]
}

// Owner returns hex sha256(user): what stores keep and compare as the owner
// of a record, so that the user never has to be stored in plaintext.
func (k Key) Owner() string {
	if k.s == "" {
		return ""
	}
	return k.s[k.kindEnd+1 : k.kindEnd+1+digestLen]
}

// NormalizeSegment escapes s for use as one segment of a key. Bytes in
// [A-Za-z0-9._-] pass through unchanged; every other byte, '%' included,
// becomes %XX (upper-case hex). The mapping is injective, so two different
// inputs never share a segment, and its output contains no ':', '{', '}',
// whitespace or control characters. Case is kept: folding it would merge
// tenants.
func NormalizeSegment(s string) string {
	n := segmentLen(s)
	if n == len(s) {
		return s
	}
	return string(appendSegment(make([]byte, 0, n), s))
}

// segmentLen returns len(NormalizeSegment(s)).
func segmentLen(s string) int {
	n := len(s)
	for i := 0; i < len(s); i++ {
		if !plain(s[i]) {
			n += 2
		}
	}
	return n
}

// appendSegment appends NormalizeSegment(s) to b.
func appendSegment(b []byte, s string) []byte {
	const upperHex = "0123456789ABCDEF"
	for i := 0; i < len(s); i++ {
		if c := s[i]; plain(c) {
			b = append(b, c)
		} else {
			b = append(b, '%', upperHex[c>>4], upperHex[c&0x0F])
		}
	}
	return b
}

func plain(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
		c == '.' || c == '_' || c == '-'
}
