package fingerprint

import (
	"unicode"
	"unicode/utf8"
)

// equalFold reports whether s and t are equal under simple Unicode case
// folding, exactly as bytes.EqualFold(s, []byte(t)) and strings.EqualFold
// do: that is how encoding/json matches a member name to a struct field
// when no name is equal ("Prompt" and "PROMPT" for "prompt", "ſ" U+017F for
// "s", the Kelvin sign U+212A for "k"), and how echo's form binder matches
// a form field. It takes s as bytes and t as a string so that neither needs
// converting.
func equalFold(s []byte, t string) bool {
	i := 0
	for n := min(len(s), len(t)); i < n; i++ {
		sr, tr := s[i], t[i]
		if sr|tr >= utf8.RuneSelf {
			return equalFoldUnicode(s[i:], t[i:])
		}
		if tr == sr {
			continue
		}
		if tr < sr {
			tr, sr = sr, tr
		}
		if 'A' <= sr && sr <= 'Z' && tr == sr+'a'-'A' {
			continue
		}
		return false
	}
	return len(s) == len(t)
}

func equalFoldUnicode(s []byte, t string) bool {
	for len(s) > 0 {
		sr, size := utf8.DecodeRune(s)
		s = s[size:]
		if len(t) == 0 {
			return false
		}
		tr, size := utf8.DecodeRuneInString(t)
		t = t[size:]
		if tr == sr {
			continue
		}
		if tr < sr {
			tr, sr = sr, tr
		}
		if tr < utf8.RuneSelf {
			if 'A' <= sr && sr <= 'Z' && tr == sr+'a'-'A' {
				continue
			}
			return false
		}
		// SimpleFold(x) returns the next rune of x's fold orbit above x, or
		// wraps around to the smallest.
		r := unicode.SimpleFold(sr)
		for r != sr && r < tr {
			r = unicode.SimpleFold(r)
		}
		if r == tr {
			continue
		}
		return false
	}
	return len(t) == 0
}

// appendFoldKey appends the fold key of the valid UTF-8 name: names have
// equal keys exactly when equalFold (bytes.EqualFold) holds. ASCII letters
// are upper-cased and every other rune becomes the smallest rune of its
// fold orbit, as encoding/json's foldName does.
func appendFoldKey(b, name []byte) []byte {
	for i := 0; i < len(name); {
		if c := name[i]; c < utf8.RuneSelf {
			if 'a' <= c && c <= 'z' {
				c -= 'a' - 'A'
			}
			b = append(b, c)
			i++
			continue
		}
		r, n := utf8.DecodeRune(name[i:])
		b = utf8.AppendRune(b, foldRune(r))
		i += n
	}
	return b
}

// foldRune returns the smallest rune of r's simple fold orbit.
func foldRune(r rune) rune {
	for {
		r2 := unicode.SimpleFold(r)
		if r2 <= r {
			return r2
		}
		r = r2
	}
}
