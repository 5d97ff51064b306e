package idemgate

import (
	"bufio"
	"errors"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
)

// captureWriter passes a response through to the client and keeps a copy
// (status, the replayable headers the handler set, as they were when the
// status was written, and up to max body bytes) for the store. Headers that
// outer middleware set before the handler ran (a request id, CORS) are not
// the handler's result: unless the handler changed them, they are left out,
// and the outer middleware sets them afresh on a replay. It keeps Flush, Hijack and the
// rest of http.ResponseController working through Unwrap.
//
// A write to a client that went away fails (broken pipe) once the response
// outgrows the socket buffer. While the response is still being captured,
// such a failure is not the handler's: the writer keeps capturing, reports
// success, and the stored copy is what the client's retry gets. Once the
// response outgrew max (it will not be stored), the failure is reported.
type captureWriter struct {
	http.ResponseWriter
	filter      *headerFilter
	max         int64
	status      int
	header      http.Header // the replayable headers the handler set
	before      http.Header // the headers before the handler ran
	body        *[]byte     // pooled; nil once the body overflowed max
	wroteHeader bool
	overflow    bool
	hijacked    bool
	clientErr   error // the first failed write or flush to the client
	// hold keeps the whole response back (an Atomic route): nothing goes
	// to the client until send, after the commit. Flush does nothing,
	// Hijack is refused, and a body over max is dropped (overflow).
	hold bool
	// sent is, when holding, every header as it stood at WriteHeader: what
	// the client would have got then. A header set later never goes out,
	// as on a route that does not hold its answer.
	sent http.Header
}

// errHoldHijack is what Hijack answers on an Atomic route.
var errHoldHijack = errors.New("idemgate: an Atomic route cannot hijack the connection: its answer goes out after the commit")

func (w *captureWriter) reset(rw http.ResponseWriter, f *headerFilter, max int64) {
	*w = captureWriter{ResponseWriter: rw, filter: f, max: max}
	w.body = bodyPool.Get().(*[]byte)
	*w.body = (*w.body)[:0]
	if h := rw.Header(); len(h) > 0 {
		w.before = headerPool.Get().(http.Header)
		for name, v := range h {
			w.before[name] = v[:len(v):len(v)]
		}
	}
}

// release returns the body buffer to its pool; the captured body must not
// be used afterwards.
func (w *captureWriter) release() {
	w.releaseBody()
	for _, h := range [...]*http.Header{&w.header, &w.before} {
		if *h != nil {
			clear(*h)
			headerPool.Put(*h)
			*h = nil
		}
	}
}

// releaseBody returns the body buffer to its pool.
func (w *captureWriter) releaseBody() {
	if w.body != nil && cap(*w.body) <= maxPooledBlob {
		bodyPool.Put(w.body)
	}
	w.body = nil
}

// takeBack undoes what a held answer did to the response: the headers the
// handler set are removed (those set before it ran are put back), so that
// another answer can replace it.
func (w *captureWriter) takeBack() {
	h := w.ResponseWriter.Header()
	for name := range h {
		if _, ok := w.before[name]; !ok {
			delete(h, name)
		}
	}
	for name, v := range w.before {
		h[name] = v
	}
}

// takeBack takes a held answer back, from the response and from the
// framework's bookkeeping (Door.Rewound).
func (st *call) takeBack() {
	st.cw.takeBack()
	st.d.Rewound(st.x)
}

// send sends a held answer (captureWriter.send) and tells the framework
// how much of it went out (Door.Sent).
func (st *call) send() {
	st.d.Sent(st.x, st.cw.send())
}

// send writes a held answer to the client: the headers as they stood at
// WriteHeader, the status, then the body, and returns how many bytes of
// the body went out. A client that went away misses it; the commit
// stands.
func (w *captureWriter) send() int64 {
	h := w.ResponseWriter.Header()
	clear(h)
	for name, v := range w.sent {
		h[name] = v
	}
	w.ResponseWriter.WriteHeader(w.status)
	n, _ := w.ResponseWriter.Write(*w.body)
	return int64(n)
}

func (w *captureWriter) WriteHeader(code int) {
	// 1xx (103 Early Hints) may precede the final status; 101 is final.
	if !w.wroteHeader && (code >= 200 || code == http.StatusSwitchingProtocols) {
		w.wroteHeader = true
		w.status = code
		w.header = w.filter.snapshot(w.ResponseWriter.Header(), w.before)
		if w.hold {
			w.sent = w.ResponseWriter.Header().Clone()
		}
	}
	if w.hold {
		return // sent after the commit; 1xx (Early Hints) are dropped
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *captureWriter) Write(b []byte) (int, error) {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	if w.body != nil {
		if int64(len(*w.body))+int64(len(b)) > w.max {
			w.overflow = true
			if w.hold {
				w.releaseBody() // the headers are needed to take the answer back
			} else {
				w.release()
			}
		} else {
			*w.body = append(*w.body, b...)
		}
	}
	if w.hold {
		return len(b), nil
	}
	if w.clientErr != nil {
		return w.clientGone(len(b), 0)
	}
	n, err := w.ResponseWriter.Write(b)
	if err != nil && handlerFault(err) {
		// The handler's own mistake (writing past its Content-Length),
		// which net/http reports with the bytes refused: the handler
		// hears of it, and the copy keeps only what went out.
		if w.body != nil {
			*w.body = (*w.body)[:len(*w.body)-(len(b)-n)]
		}
		return n, err
	}
	if err != nil {
		w.clientErr = err
		return w.clientGone(len(b), n)
	}
	return n, nil
}

// handlerFault reports whether a failed write is the handler's doing,
// not the client's connection's.
func handlerFault(err error) bool {
	return errors.Is(err, http.ErrContentLength) || errors.Is(err, http.ErrBodyNotAllowed)
}

// clientGone answers a write of size bytes after the client's connection
// failed (n of them reached it): success while the response is still
// captured for the store, the connection's error once it is not.
func (w *captureWriter) clientGone(size, n int) (int, error) {
	if w.body != nil {
		return size, nil
	}
	return n, w.clientErr
}

// FlushError is what http.ResponseController.Flush looks for first.
func (w *captureWriter) FlushError() error {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	if w.hold {
		return nil // the whole answer goes out after the commit
	}
	if w.clientErr != nil {
		_, err := w.clientGone(0, 0)
		return err
	}
	err := http.NewResponseController(w.ResponseWriter).Flush()
	if err == nil || errors.Is(err, http.ErrNotSupported) {
		return err
	}
	w.clientErr = err
	_, err = w.clientGone(0, 0)
	return err
}

// Flush implements http.Flusher for code that type-asserts it.
func (w *captureWriter) Flush() { _ = w.FlushError() }

// Hijack hands the connection over; a hijacked response is never stored.
// A hijack that fails (HTTP/2, a writer that cannot) leaves the response
// to the handler, which may still answer it in full: that one is stored.
func (w *captureWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	if w.hold {
		return nil, nil, errHoldHijack
	}
	conn, rw, err := http.NewResponseController(w.ResponseWriter).Hijack()
	if err == nil {
		w.hijacked = true
	}
	return conn, rw, err
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (w *captureWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// maxPooledBlob bounds the buffers kept for reuse: a rare huge body must
// not stay pinned in a pool.
const maxPooledBlob = 64 << 10

var (
	bodyPool   = sync.Pool{New: func() any { b := make([]byte, 0, 4096); return &b }}
	headerPool = sync.Pool{New: func() any { return make(http.Header, 8) }}
)

// headerFilter picks the headers a replay repeats.
type headerFilter struct {
	allow map[string]bool // canonical names; nil means the default deny list
}

// Never replayed by default: hop-by-hop headers (RFC 9110 section 7.6.1),
// Date and Content-Length (recomputed), Set-Cookie (a session is not an
// idempotent result), and our own marker.
var deniedHeaders = map[string]bool{
	"Connection": true, "Keep-Alive": true, "Proxy-Authenticate": true,
	"Proxy-Authorization": true, "Proxy-Connection": true, "Te": true,
	"Trailer": true, "Transfer-Encoding": true, "Upgrade": true,
	"Date": true, "Content-Length": true, "Set-Cookie": true,
	replayedHeader: true,
}

// keep reports whether the header name (canonical) is replayed; conn holds
// the response's Connection values.
func (f *headerFilter) keep(name string, conn []string) bool {
	if name == replayedHeader {
		return false // the replay sets its own, once
	}
	if f.allow != nil {
		return f.allow[name]
	}
	if deniedHeaders[name] {
		return false
	}
	// Headers named in Connection are hop-by-hop too.
	for _, v := range conn {
		for v != "" {
			var tok string
			tok, v, _ = strings.Cut(v, ",")
			if http.CanonicalHeaderKey(strings.TrimSpace(tok)) == name {
				return false
			}
		}
	}
	return true
}

// snapshot returns the replayable headers of h that differ from before
// (added or changed) in a pooled map. Value slices are shared: handlers
// replace header values (Set, Add, Del) rather than edit them in place.
func (f *headerFilter) snapshot(h, before http.Header) http.Header {
	out := headerPool.Get().(http.Header)
	// Header names are case-insensitive: a handler that writes
	// h["set-cookie"] or h["connection"] straight into the map is
	// filtered as if it had called Set.
	var conn []string
	for name, v := range h {
		if len(name) == len("Connection") && http.CanonicalHeaderKey(name) == "Connection" {
			if conn == nil {
				conn = v
			} else {
				conn = append(conn[:len(conn):len(conn)], v...)
			}
		}
	}
	for name, v := range h {
		if !slices.Equal(v, before[name]) && f.keep(http.CanonicalHeaderKey(name), conn) {
			out[name] = v[:len(v):len(v)]
		}
	}
	return out
}
