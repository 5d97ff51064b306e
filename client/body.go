package client

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"reflect"
)

// maxRequestBody bounds a body Send reads from an io.Reader: the bytes are
// held in memory so that every attempt sends the same ones.
const maxRequestBody = 64 << 20

// requestBody returns the bytes Send sends for body; none (nil) for nil, a
// nil or empty []byte or json.RawMessage, or a reader with nothing to
// read. A reader is read up to limit bytes (maxRequestBody but in tests),
// and no longer than ctx lasts: a reader that hangs (a pipe) is left to
// its Read, as net/http leaves a request body that hangs.
func requestBody(ctx context.Context, body any, limit int) ([]byte, error) {
	switch b := body.(type) {
	case nil:
		return nil, nil
	case []byte:
		return b, nil
	case json.RawMessage: // encoded already: not compacted nor escaped again
		return b, nil
	case io.Reader:
		type read struct {
			data     []byte
			err      error
			panicked any // a panic of b's Read, raised again in the caller's goroutine
		}
		done := make(chan read, 1)
		go func() {
			defer func() {
				if v := recover(); v != nil {
					done <- read{panicked: v}
				}
			}()
			data, err := io.ReadAll(io.LimitReader(b, int64(limit)+1))
			done <- read{data: data, err: err}
		}()
		var data []byte
		select {
		case r := <-done:
			if r.panicked != nil {
				panic(r.panicked)
			}
			data = r.data
			if r.err != nil {
				return nil, fmt.Errorf("client: read request body: %w", r.err)
			}
		case <-ctx.Done():
			return nil, fmt.Errorf("client: read request body: %w", ctx.Err())
		}
		if len(data) > limit {
			return nil, fmt.Errorf("client: request body over %d MiB: a body read from an io.Reader is held in memory to be sent again on a retry", limit>>20)
		}
		return data, nil
	}
	if t := reflect.TypeOf(body); t.Kind() != reflect.Pointer && reflect.PointerTo(t).Implements(reflect.TypeFor[io.Reader]()) &&
		!t.Implements(reflect.TypeFor[json.Marshaler]()) {
		// A bytes.Buffer, strings.Reader, bytes.Reader by value: its fields
		// are unexported, so its JSON encoding is {}.
		return nil, fmt.Errorf("client: a %s body is no io.Reader (its pointer is) and would be sent as {}: pass &body", t)
	}
	data, err := json.Marshal(body)
	if err != nil {
		return nil, fmt.Errorf("client: encode request: %w", err)
	}
	return data, nil
}
