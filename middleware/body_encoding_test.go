package middleware_test

import (
	"bytes"
	"compress/gzip"
	"hash/crc32"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/labstack/echo/v4"
	echomw "github.com/labstack/echo/v4/middleware"
	"github.com/redis/go-redis/v9"

	"github.com/idemgate/idemgate/middleware"
	"github.com/idemgate/idemgate/redisstore"
)

func gzipped(t *testing.T, s string) []byte {
	t.Helper()
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	zw.Write([]byte(s))
	zw.Close()
	return b.Bytes()
}

// storedGzip builds a gzip stream of payload in one stored (uncompressed)
// deflate block, with "====" as its modification time: what a client may
// send, and what gzip.Reader accepts.
func storedGzip(payload []byte) []byte {
	b := []byte{0x1f, 0x8b, 8, 0, '=', '=', '=', '=', 0, 0xff, 1}
	n := len(payload)
	b = append(b, byte(n), byte(n>>8), ^byte(n), ^byte(n>>8))
	b = append(b, payload...)
	c := crc32.ChecksumIEEE(payload)
	return append(b, byte(c), byte(c>>8), byte(c>>16), byte(c>>24), byte(n), byte(n>>8), byte(n>>16), byte(n>>24))
}

// forgeCRC flips the case of hex letters of p at the offsets in letters
// so that p's CRC-32 becomes want; it reports false when no combination
// does. CRC-32 is affine over GF(2), so this is a linear system.
func forgeCRC(p []byte, letters []int, want uint32) bool {
	zero := crc32.ChecksumIEEE(make([]byte, len(p)))
	type vec struct {
		v    uint32
		mask []bool
	}
	var basis []vec
	for i, off := range letters {
		d := make([]byte, len(p))
		d[off] = 0x20
		m := make([]bool, len(letters))
		m[i] = true
		basis = append(basis, vec{crc32.ChecksumIEEE(d) ^ zero, m})
	}
	target := vec{crc32.ChecksumIEEE(p) ^ want, make([]bool, len(letters))}
	xor := func(a *vec, b vec) {
		a.v ^= b.v
		for i := range a.mask {
			a.mask[i] = a.mask[i] != b.mask[i]
		}
	}
	var rows []vec
	for _, b := range basis {
		for _, r := range rows {
			if b.v^r.v < b.v {
				xor(&b, r)
			}
		}
		if b.v != 0 {
			rows = append(rows, b)
		}
	}
	for _, r := range rows {
		if target.v^r.v < target.v {
			xor(&target, r)
		}
	}
	if target.v != 0 {
		return false
	}
	for i, flip := range target.mask {
		if flip {
			p[letters[i]] ^= 0x20
		}
	}
	return crc32.ChecksumIEEE(p) == want
}

// TestEncodedFormCollision: with a decoding middleware inside this
// one (echo's Decompress on the route), the fingerprint reads the gzip
// bytes while the handler reads what they decode to. Two gzip streams can
// parse as one form and decode to forms the handler binds differently:
// here "prompt=a&..." and "prompt%3Da&..." (a field named "prompt=a")
// sit in the value of the form pair the stream's header starts, where
// %3D and = read alike, and the CRC-32 is matched by flipping the case of
// hex escapes in a padding field. A body with a Content-Encoding must
// never share a fingerprint with another unless their bytes are equal.
func TestEncodedFormCollision(t *testing.T) {
	t.Parallel()
	var r1, r2 []byte
	for pad := 0; pad < 64 && r1 == nil; pad++ {
		hexes := strings.Repeat("%ab%cd%ef", 6)
		p1 := []byte("prompt=a&n=%31&pad=" + strings.Repeat("x", pad) + hexes + "&")
		p2 := []byte("prompt%3Da&n=1&pad=" + strings.Repeat("x", pad) + hexes + "&")
		var letters []int
		base := bytes.Index(p2, []byte("%ab"))
		for i := base; i < len(p2)-1; i++ {
			if c := p2[i]; c >= 'a' && c <= 'f' {
				letters = append(letters, i)
			}
		}
		if !forgeCRC(p2, letters, crc32.ChecksumIEEE(p1)) {
			continue
		}
		g1, g2 := storedGzip(p1), storedGzip(p2)
		if bytes.ContainsAny(g1[:15], "&;%") || bytes.ContainsAny(g1[len(g1)-8:], "&;%") {
			continue
		}
		r1, r2 = g1, g2
	}
	if r1 == nil {
		t.Fatal("no colliding pair built")
	}
	const form = "application/x-www-form-urlencoded"
	// The two streams decode to forms that bind other prompts.
	for _, g := range [][]byte{r1, r2} {
		zr, err := gzip.NewReader(bytes.NewReader(g))
		if err != nil {
			t.Fatal(err)
		}
		dec, err := io.ReadAll(zr)
		if err != nil {
			t.Fatalf("stream does not decode: %v", err)
		}
		q, _ := url.ParseQuery(string(dec))
		t.Logf("decodes to prompt=%q", q.Get("prompt"))
	}

	mr := miniredis.RunT(t)
	client := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { client.Close() })
	e := echo.New()
	idem := middleware.New(middleware.Config{Store: redisstore.New(client), Scope: testScope})
	e.POST("/v1/tasks", func(c echo.Context) error {
		var got struct {
			Prompt string `form:"prompt"`
			N      int    `form:"n"`
		}
		if err := c.Bind(&got); err != nil {
			return err
		}
		return c.JSON(http.StatusCreated, got)
	}, idem, echomw.Decompress())
	send := func(body []byte) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodPost, "/v1/tasks", bytes.NewReader(body))
		r.Header.Set("Content-Encoding", "gzip")
		r.Header.Set("Content-Type", form)
		r.Header.Set("Idempotency-Key", "k")
		r.Header.Set("X-Tenant", "acme")
		r.Header.Set("X-User", "alice")
		rec := httptest.NewRecorder()
		e.ServeHTTP(rec, r)
		return rec
	}
	first := send(r1)
	if first.Code != http.StatusCreated || !strings.Contains(first.Body.String(), `"Prompt":"a"`) {
		t.Fatalf("first = %d %s, want 201 binding prompt a", first.Code, first.Body)
	}
	second := send(r2)
	if second.Header().Get("Idempotent-Replayed") == "true" {
		t.Fatalf("false replay: a body that binds another prompt got %d %s", second.Code, second.Body)
	}
}
