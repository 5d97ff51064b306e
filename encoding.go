package idemgate

import (
	"bytes"
	"compress/gzip"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
)

// A stored response keeps the Content-Encoding it was sent with: with a
// compressing middleware inside this one, the first client's gzip. A
// replay must never send a coding the retry did not accept, so when the
// retry does not accept every stored coding, a gzip body is decoded (if it
// fits MaxResponseBytes decoded) and anything else is refused with 406
// encoding_not_acceptable. Compression belongs outside this middleware:
// then the stored body is identity and each answer is compressed as its
// request asks.

// acceptsEncoding reports whether every content coding in contentEncoding
// (the stored Content-Encoding values, codings in the order applied) is
// acceptable under accept (the request's Accept-Encoding values).
func acceptsEncoding(accept, contentEncoding []string) bool {
	for _, v := range contentEncoding {
		for v != "" {
			var coding string
			coding, v, _ = strings.Cut(v, ",")
			coding = strings.Trim(coding, " \t")
			if coding == "" || strings.EqualFold(coding, "identity") {
				continue
			}
			if !acceptsCoding(accept, coding) {
				return false
			}
		}
	}
	return true
}

// acceptsCoding reports whether coding is acceptable under the
// Accept-Encoding values accept (RFC 9110 section 12.5.3): listed with a
// non-zero weight, or matched by "*" with a non-zero weight and not listed
// with a zero one. Names compare case-insensitively; x-gzip is gzip. A
// missing or empty Accept-Encoding accepts no coding: RFC 9110 would allow
// any, but a client that sends none (curl without --compressed) cannot
// read gzip, and echo's Gzip middleware does not compress for it either.
// A malformed element is ignored, which can only refuse a coding.
func acceptsCoding(accept []string, coding string) bool {
	coding = canonicalCoding(coding)
	listed, listedOK, star, starOK := false, true, false, false
	for _, v := range accept {
		for v != "" {
			var elem string
			elem, v, _ = strings.Cut(v, ",")
			name, positive, ok := parseAcceptElement(elem)
			switch {
			case !ok:
			case name == "*":
				star, starOK = true, positive
			case canonicalCoding(name) == coding:
				listed = true
				listedOK = listedOK && positive
			}
		}
	}
	if listed {
		return listedOK
	}
	return star && starOK
}

// canonicalCoding lower-cases a coding name and maps the x- aliases
// (RFC 9110 section 8.4.1).
func canonicalCoding(name string) string {
	name = strings.ToLower(name)
	switch name {
	case "x-gzip":
		return "gzip"
	case "x-compress":
		return "compress"
	}
	return name
}

// parseAcceptElement parses one Accept-Encoding element,
// `coding [ OWS ";" OWS "q=" qvalue ]`: the coding, whether its weight is
// above zero, and whether the element is well formed.
func parseAcceptElement(elem string) (name string, positive, ok bool) {
	name, params, hasParams := strings.Cut(elem, ";")
	name = strings.Trim(name, " \t")
	if !isToken(name) {
		return "", false, false
	}
	if !hasParams {
		return name, true, true
	}
	params = strings.Trim(params, " \t")
	if len(params) < 2 || params[0]|0x20 != 'q' || params[1] != '=' {
		return "", false, false
	}
	positive, ok = parseQValue(params[2:])
	return name, positive, ok
}

// parseQValue parses an RFC 9110 qvalue ("0", "0.5", "1.000") and reports
// whether it is above zero.
func parseQValue(q string) (positive, ok bool) {
	if q == "" || (q[0] != '0' && q[0] != '1') {
		return false, false
	}
	frac := q[1:]
	if frac != "" {
		if frac[0] != '.' || len(frac) > 4 {
			return false, false
		}
		frac = frac[1:]
	}
	for i := 0; i < len(frac); i++ {
		switch {
		case frac[i] < '0' || frac[i] > '9':
			return false, false
		case q[0] == '1' && frac[i] != '0':
			return false, false
		case frac[i] != '0':
			positive = true
		}
	}
	return positive || q[0] == '1', true
}

// decodeForReplay decodes a stored body whose Content-Encoding is exactly
// gzip, into at most max bytes. It reports false for any other coding, a
// corrupt body or one larger than max decoded.
func decodeForReplay(contentEncoding []string, body []byte, max int64) ([]byte, bool) {
	if len(contentEncoding) != 1 || canonicalCoding(strings.Trim(contentEncoding[0], " \t")) != "gzip" {
		return nil, false
	}
	zr, err := gzip.NewReader(bytes.NewReader(body))
	if err != nil {
		return nil, false
	}
	// One byte more than max proves the body is too large; max of
	// math.MaxInt64 ("no limit") must not wrap max+1 negative.
	out, err := io.ReadAll(io.LimitReader(zr, min(max, math.MaxInt64-1)+1))
	if err != nil || int64(len(out)) > max {
		return nil, false
	}
	return out, true
}

// withoutEncoding returns a copy of h for a body decoded to decodedLen
// bytes: without Content-Encoding, with a stored Content-Length set to
// decodedLen, with a strong ETag made weak (it named the encoded bytes), and with
// Accept-Encoding in Vary: the decoded copy was chosen by the retry's
// Accept-Encoding, whether or not the handler said its answer varies.
func withoutEncoding(h http.Header, decodedLen int) http.Header {
	out := make(http.Header, len(h)+1)
	for name, v := range h {
		switch name {
		case "Content-Encoding":
			continue
		case "Content-Length":
			// Named in ReplayHeaders: it counted the encoded bytes.
			v = []string{strconv.Itoa(decodedLen)}
		}
		out[name] = v
	}
	if etag := out.Get("Etag"); strings.HasPrefix(etag, `"`) {
		out["Etag"] = []string{"W/" + etag}
	}
	if !varies(out["Vary"], "Accept-Encoding") {
		out["Vary"] = append(out["Vary"][:len(out["Vary"]):len(out["Vary"])], "Accept-Encoding")
	}
	return out
}

// varies reports whether the Vary values name field, or "*".
func varies(vary []string, field string) bool {
	for _, v := range vary {
		for v != "" {
			var tok string
			tok, v, _ = strings.Cut(v, ",")
			tok = strings.Trim(tok, " \t")
			if tok == "*" || strings.EqualFold(tok, field) {
				return true
			}
		}
	}
	return false
}
