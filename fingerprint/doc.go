// Package fingerprint decides whether two requests carry the same
// parameters. An idempotency key says "this is the same business action";
// the fingerprint says "with the same parameters", so a true retry can be
// replayed and a retry whose parameters drifted is refused.
//
// A false replay (two different parameter sets, one fingerprint) is the
// worst failure this package could have; a false conflict is safe. Every
// choice below leans that way.
//
// # What counts as the same parameters
//
// Only syntax is normalized: member order, whitespace between tokens,
// escape spelling ("\u0041" is "A") and number spelling (1, 1.0, 1e0 and
// 10e-1). Values are compared exactly: one more space inside a string,
// "16:9" against "9:16", n 1 against n 2, another reference image - each
// is a different fingerprint. A Spec narrows the body to the fields that
// matter (Fields) or drops the ones that do not (Exclude); a selected field
// that is absent differs from the same field present with null, a value
// moved from one selected field to another changes the fingerprint, and a
// pointer token that names an object member differs from the same token
// naming an array element ("/0" of {"0":"x"} is not "/0" of ["x"]).
//
// # Names are exact, and unambiguous
//
// Fields and Exclude match member names byte for byte, but a handler's
// binder may not: encoding/json, and echo's form binder after it, match a
// struct field case-insensitively under simple Unicode folding when no
// name is equal ("Prompt" and "PROMPT" read as "prompt", "ſ" U+017F as
// "s", the Kelvin sign U+212A as "k"), and the last duplicate wins. So
// whenever a Spec has Fields or Exclude, a JSON member on the path of a
// pointer (at every level), or a form field, whose name is not equal to
// the pointer's token but folds onto it is an error wrapping ErrInvalid
// that names the pointer and the offset: {"Prompt":"a dog"} cannot share
// a fingerprint with {"Prompt":"a cat"} while the handler reads either
// prompt. Where a value is hashed whole (the body without a Spec, or a
// selected value), an object with two members whose names fold together
// keeps its member order, as the last of them is what a binder reads.
//
// # The empty body
//
// A body of no bytes at all (POST /orders/1/cancel) is a request of its
// own, for Sum and for every media type of SumRequest, with or without a
// Spec: it is neither {} nor null, and echo's binder binds nothing from
// it. Canonicalize still rejects it: it is not JSON.
//
// # Two choices for numbers
//
// Canonicalize follows RFC 8785 to the letter: a number is an IEEE-754
// double, written as ECMAScript writes it, so 9007199254740993 becomes
// 9007199254740992 and 0.10000000000000001 becomes 0.1.
//
// Sum cannot afford that rounding: two different parameters would share a
// fingerprint. It writes numbers exactly instead, as a decimal mantissa and
// exponent without leading or trailing zeros and without rounding. So 1,
// 1.0, 1e0 and 10e-1 agree, -0 is 0, while 9007199254740993 and
// 9007199254740992 differ, and so do 0.1 and 0.10000000000000001. Both
// functions accept the same bodies: a number beyond the range of a double
// (1e400) is an error for both; a number too small for one (1e-400) is
// accepted, read as 0 by Canonicalize and kept exact by Sum.
//
// # Strict JSON
//
// Canonicalize and Sum accept one JSON value (RFC 8259) in UTF-8 and
// nothing else: no trailing data, no byte order mark, no duplicate member
// names at any depth (compared after unescaping), no lone surrogate escapes,
// no invalid UTF-8, and nesting of arrays and objects at most 512 deep. A
// rejected body yields an error wrapping ErrInvalid that names the problem
// and its byte offset. No input makes them panic, and the nesting limit
// bounds their recursion.
//
// # Request bodies
//
// SumRequest picks the encoding by media type: JSON types go through Sum;
// urlencoded and multipart forms hash every field by name, every value
// of a repeated name in order, file parts by the SHA-256 of their bytes,
// less the fields one-token Exclude pointers name ("/client_note"); Fields
// do not narrow a form, as echo's form binder fills nested structs from
// flat form names that no pointer can tell; anything else hashes
// its raw bytes. The media type itself takes part, so the same bytes sent
// as JSON and as text differ. Where in doubt two requests differ: each
// multipart part takes part with its headers (the same file under another
// file name or part Content-Type is another request), and a raw body with
// its media type parameters (text/plain in UTF-8 and in Latin-1 differ),
// normalized: parameter names lower-cased and sorted, the charset value
// lower-cased, other values as sent. JSON and form media type parameters
// are ignored, as their parsers ignore them.
//
// # Errors
//
// An error about a body gives the reason and a byte offset, never body
// content: no member names, no bytes of strings, no multipart header
// lines. The middleware passes it on to the client, and logs may keep it.
//
// # Stability
//
// A fingerprint is "v1:" and a SHA-256 in hex. The hash input is framed so
// that no two different parameter sets share it: every name and value is
// length-prefixed, and each selected field carries its typed path, the
// kind of container (object or array) each pointer token stepped into.
// The v1 algorithm never changes;
// golden fingerprints in testdata/golden.json pin it.
//
// # Cost
//
// Sum makes one pass over the body: a hand-written scanner validates it,
// writes its canonical form into a pooled buffer (strings that need no
// change are copied as they are; only the member names of each object are
// sorted) and hashes that buffer once. It allocates only the returned
// string. Canonicalize and Sum are safe for concurrent use.
package fingerprint
