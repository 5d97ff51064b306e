package idemgate

import (
	"bytes"
	"errors"
	"io"
	"math"
	"net"
	"net/http"
	"os"
)

// bodyReader restores the request body for the handler.
type bodyReader struct{ bytes.Reader }

func (*bodyReader) Close() error { return nil }

var (
	errBodyTooLarge = errors.New("body too large")
	errBodyShort    = errors.New("body shorter than its Content-Length")
)

// initialBodyCap bounds what readBody allocates before the body arrives, so
// that a client cannot make the server allocate far more than it sends.
const initialBodyCap = 64 << 10

// readBody reads at most limit bytes of the request body, in growing
// chunks. A body shorter than its Content-Length (the client went away
// mid-body) is an error: the handler must never run on a truncated body.
func readBody(r *http.Request, limit int64) ([]byte, error) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, nil
	}
	length := r.ContentLength
	if len(r.Header["Content-Encoding"]) > 0 {
		// A decoding middleware outside this one (echo's Decompress)
		// replaces the body but not Content-Length, which counts the
		// encoded bytes: the decoded body is longer or shorter.
		length = -1
	}
	// One byte more than declared (or allowed) proves the body ends
	// there, so the limit must leave room for it: math.MaxInt64, a
	// natural "no limit", would wrap limit+1 negative.
	limit = min(limit, math.MaxInt64-1)
	if length > limit {
		return nil, errBodyTooLarge
	}
	most := limit + 1
	if length >= 0 {
		most = length + 1
	}
	size := most
	if length < 0 {
		size = 512
	}
	buf := make([]byte, 0, min(size, initialBodyCap))
	for {
		if len(buf) == cap(buf) {
			if int64(len(buf)) >= most {
				break
			}
			grown := make([]byte, len(buf), min(2*int64(cap(buf)), most))
			copy(grown, buf)
			buf = grown
		}
		n, err := r.Body.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
	}
	switch {
	case int64(len(buf)) > limit:
		return nil, errBodyTooLarge
	case length < 0:
		return buf, nil
	case int64(len(buf)) > length:
		return nil, errBodyTooLarge
	case int64(len(buf)) < length:
		return nil, errBodyShort
	}
	return buf, nil
}

// timedOut reports whether a body read failed on a deadline (the server's
// ReadTimeout, a connection's read deadline): the body may arrive in full
// on a retry, unlike one that is malformed.
func timedOut(err error) bool {
	var ne net.Error
	return errors.Is(err, os.ErrDeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}
