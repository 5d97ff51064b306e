package idemgate

import (
	"context"
	"net/http"
	"strings"
	"time"
	"unsafe"

	"github.com/idemgate/idemgate/internal/wire"
)

// wait polls the store until the holder of the key finishes, releases it,
// or WaitInFlight runs out.
func (st *call) wait(ctx context.Context, claim ClaimRequest, res ClaimResult) (ClaimResult, error) {
	deadline := st.start.Add(st.m.cfg.WaitInFlight)
	delay := 5 * time.Millisecond
	var err error
	for res.Status == Running {
		left := deadline.Sub(st.m.now())
		if left <= 0 {
			break
		}
		t := time.NewTimer(min(delay, left))
		select {
		case <-ctx.Done():
			t.Stop()
			st.emit(Event{Type: EventWaited, Reason: "canceled"})
			return res, nil
		case <-t.C:
		}
		delay = min(2*delay, 200*time.Millisecond)
		res, err = st.m.cfg.Store.Claim(st.storeCtx(), st.key, claim)
		if err != nil {
			return res, err
		}
	}
	st.emit(Event{Type: EventWaited, Reason: res.Status.String()})
	return res, nil
}

// replay writes a stored response byte for byte, unless it carries a
// Content-Encoding the request does not accept: then a gzip body is
// decoded (Event.Reason "decoded"), and any other is refused with 406
// encoding_not_acceptable (Event.Reason "encoding_not_acceptable").
func (st *call) replay(w http.ResponseWriter, r *http.Request, resp Response) error {
	if ce := resp.Header["Content-Encoding"]; len(ce) > 0 && !acceptsEncoding(r.Header["Accept-Encoding"], ce) {
		body, ok := decodeForReplay(ce, resp.Body, st.m.cfg.MaxResponseBytes)
		if !ok {
			st.emit(Event{Type: EventReplayed, Status: http.StatusNotAcceptable, Reason: string(CodeEncodingNotAcceptable)})
			return st.m.problem(w, r, st.d, st.x, http.StatusNotAcceptable, CodeEncodingNotAcceptable,
				"The stored response to this request is sent with Content-Encoding "+strings.Join(ce, ", ")+
					", which this request does not accept; retry with an Accept-Encoding that allows it.", 0)
		}
		resp = Response{Status: resp.Status, Header: withoutEncoding(resp.Header, len(body)), Body: body}
		st.emit(Event{Type: EventReplayed, Status: resp.Status, Reason: "decoded"})
	} else {
		st.emit(Event{Type: EventReplayed, Status: resp.Status})
	}
	h := w.Header()
	for name, v := range resp.Header {
		h[name] = v
	}
	h[replayedHeader] = []string{"true"}
	w.WriteHeader(resp.Status)
	_, err := w.Write(resp.Body)
	return err
}

// replayStored is replay for a response the store checked but did
// not decode: the stored header entries go straight into the response's
// header, their values and Idempotent-Replayed's sharing one slice, and
// the body is written from the stored bytes without a copy. A response
// with a Content-Encoding is decoded and replayed as any other, since the
// request may not accept it.
func (st *call) replayStored(w http.ResponseWriter, r *http.Request, sr *wire.Stored) error {
	if sr.Encoded() {
		status, header, body := sr.Decode()
		return st.replay(w, r, Response{Status: status, Header: header, Body: body})
	}
	st.emit(Event{Type: EventReplayed, Status: sr.Status()})
	all := make([]string, sr.Values()+1)
	all[sr.Values()] = "true"
	h := w.Header()
	sr.SetHeader(h, all)
	h[replayedHeader] = all[sr.Values():]
	w.WriteHeader(sr.Status())
	// io.Writer's contract: Write neither modifies nor retains p, so the
	// body need not be copied out of the immutable stored string.
	body := sr.Body()
	_, err := w.Write(unsafe.Slice(unsafe.StringData(body), len(body)))
	return err
}
