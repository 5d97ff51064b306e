package fingerprint

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"mime/multipart"
	"net/http/httptest"
	"net/textproto"
	"strings"
	"testing"

	"github.com/labstack/echo/v4"
)

// This file checks the fingerprint against what a handler reads: echo's
// DefaultBinder. Whenever two bodies get one fingerprint, the binder must
// bind equal values to the selected fields, or the second request would be
// replayed with the first one's answer while its handler would have read
// other parameters. The bodies come from a small alphabet of member names
// (case variants, "ſ" for s, the Kelvin sign for k, duplicates, escapes)
// and values, so that bodies often share a fingerprint.

// bound is what a handler binds: the selected fields of diffSpec.
type bound struct {
	Prompt string `json:"prompt" form:"prompt"`
	N      int    `json:"n" form:"n"`
	Sketch string `json:"sketch" form:"sketch"`
	Size   struct {
		K int `json:"k" form:"k"` // a form fills it from the flat name "k"
	} `json:"size"`
}

var diffSpec = Spec{Fields: []string{"/prompt", "/n", "/sketch", "/size/k"}, Exclude: []string{"/note"}}

// diffSpecs are the Specs the differential runs under: a deep selection,
// the whole body (where two names that fold together make their order a
// parameter), and a selected object hashed whole ("/size").
var diffSpecs = []struct {
	name string
	spec Spec
}{
	{"fields", diffSpec},
	{"whole body", Spec{}},
	{"selected object", Spec{Fields: []string{"/prompt", "/n", "/sketch", "/size"}}},
}

// Member names: the selected ones, names that fold onto them, and others.
var (
	diffPrompt = []string{"prompt", "Prompt", "PROMPT"}
	diffN      = []string{"n", "N"}
	diffSketch = []string{"sketch", "Sketch", "ſketch", "s\u212aetch", "SKETCH"}
	diffSize   = []string{"size", "Size", "ſize"}
	diffK      = []string{"k", "K", "\u212a", "j"}
	diffOther  = []string{"note", "Note", "other", "ſ", "x"}
)

func pick(r *rand.Rand, s []string) string { return s[r.IntN(len(s))] }

// pickName picks a member name: mostly the exact one (the first), else a
// variant, so that enough bodies are accepted to share fingerprints.
func pickName(r *rand.Rand, s []string) string {
	if r.IntN(5) < 4 {
		return s[0]
	}
	return pick(r, s)
}

// jsonName writes a member name, sometimes with its first byte escaped.
func jsonName(r *rand.Rand, name string) string {
	if name != "" && name[0] < 0x80 && r.IntN(4) == 0 {
		return fmt.Sprintf(`"\u%04x%s"`, name[0], name[1:])
	}
	return `"` + name + `"`
}

func genJSON(r *rand.Rand) string {
	var b strings.Builder
	b.WriteByte('{')
	for i := range r.IntN(5) {
		if i > 0 {
			b.WriteByte(',')
		}
		switch r.IntN(5) {
		case 0:
			b.WriteString(jsonName(r, pickName(r, diffPrompt)) + ":" + pick(r, []string{`"a"`, `"b"`, `"\u0061"`, `null`}))
		case 1:
			b.WriteString(jsonName(r, pickName(r, diffN)) + ":" + pick(r, []string{"1", "2", "0", "-0"}))
		case 2:
			b.WriteString(jsonName(r, pickName(r, diffSketch)) + ":" + pick(r, []string{`"a"`, `"b"`}))
		case 3:
			b.WriteString(jsonName(r, pickName(r, diffSize)) + ":{")
			for j := range r.IntN(3) {
				if j > 0 {
					b.WriteByte(',')
				}
				b.WriteString(jsonName(r, pickName(r, diffK)) + ":" + pick(r, []string{"1", "2"}))
			}
			b.WriteByte('}')
		default:
			b.WriteString(jsonName(r, pick(r, diffOther)) + ":" + pick(r, []string{`"a"`, `1`}))
		}
	}
	b.WriteByte('}')
	return b.String()
}

// formPair is one name=value of a form body, unescaped.
type formPair struct{ name, value string }

func genPairs(r *rand.Rand) []formPair {
	var ps []formPair
	for range r.IntN(5) {
		switch r.IntN(5) {
		case 0:
			ps = append(ps, formPair{pickName(r, diffPrompt), pick(r, []string{"a", "b", "a b", ""})})
		case 3:
			ps = append(ps, formPair{pickName(r, diffK), pick(r, []string{"1", "2"})})
		case 1:
			ps = append(ps, formPair{pickName(r, diffN), pick(r, []string{"1", "2"})})
		case 2:
			ps = append(ps, formPair{pickName(r, diffSketch), pick(r, []string{"a", "b"})})
		default:
			ps = append(ps, formPair{pick(r, diffOther), pick(r, []string{"a", "1"})})
		}
	}
	return ps
}

// urlEncoded writes pairs with random but equivalent escapes.
func urlEncoded(r *rand.Rand, ps []formPair) string {
	esc := func(s string) string {
		var b strings.Builder
		for i := 0; i < len(s); i++ {
			switch c := s[i]; {
			case c == ' ' && r.IntN(2) == 0:
				b.WriteByte('+')
			case c == ' ' || c >= 0x80 || r.IntN(6) == 0:
				fmt.Fprintf(&b, "%%%02X", c)
			default:
				b.WriteByte(c)
			}
		}
		return b.String()
	}
	var parts []string
	for _, p := range ps {
		parts = append(parts, esc(p.name)+"="+esc(p.value))
	}
	return strings.Join(parts, "&")
}

func multipartText(ps []formPair) body {
	var buf bytes.Buffer
	w := multipart.NewWriter(&buf)
	w.SetBoundary("diff-boundary")
	for _, p := range ps {
		h := textproto.MIMEHeader{}
		h.Set("Content-Disposition", fmt.Sprintf(`form-data; name=%q`, p.name))
		pw, _ := w.CreatePart(h)
		pw.Write([]byte(p.value))
	}
	w.Close()
	return body{w.FormDataContentType(), buf.String()}
}

// bindBody binds b as an echo handler would with c.Bind for a POST.
func bindBody(e *echo.Echo, b body) (bound, error) {
	req := httptest.NewRequest("POST", "/", strings.NewReader(b.data))
	req.Header.Set("Content-Type", b.contentType)
	c := e.NewContext(req, httptest.NewRecorder())
	var v bound
	err := new(echo.DefaultBinder).BindBody(c, &v)
	return v, err
}

// diffStats counts what one differential run saw.
type diffStats struct {
	bodies, refused, groups, pairs, skipped int
}

// differential fingerprints the distinct bodies, binds every accepted one
// with echo, and compares the bindings of every pair that shares a
// fingerprint. It returns the first pair that binds differently.
func differential(t testing.TB, e *echo.Echo, spec Spec, bodies []body) (diffStats, string) {
	var st diffStats
	type entry struct {
		b   body
		v   bound
		err error
	}
	groups := map[Fingerprint][]entry{}
	seen := map[body]bool{}
	for _, b := range bodies {
		if seen[b] {
			continue
		}
		seen[b] = true
		st.bodies++
		r := httptest.NewRequest("POST", "/", nil)
		r.Header.Set("Content-Type", b.contentType)
		fp, err := spec.SumRequest(r, []byte(b.data))
		if err != nil {
			st.refused++
			continue
		}
		v, err := bindBody(e, b)
		groups[fp] = append(groups[fp], entry{b, v, err})
	}
	st.groups = len(groups)
	for _, g := range groups {
		for i := range g {
			for j := i + 1; j < len(g); j++ {
				if g[i].err != nil || g[j].err != nil {
					st.skipped++
					continue
				}
				st.pairs++
				if g[i].v != g[j].v {
					return st, fmt.Sprintf("%q and %q share a fingerprint but bind %+v and %+v", g[i].b.data, g[j].b.data, g[i].v, g[j].v)
				}
			}
		}
	}
	return st, ""
}

// TestFoldDifferential runs the differential check over random JSON,
// urlencoded and multipart bodies: at least 100,000 same-fingerprint pairs
// in all, each bound by echo and compared.
func TestFoldDifferential(t *testing.T) {
	t.Parallel()
	e := echo.New()
	r := rand.New(rand.NewPCG(15, 1))
	var jsonBodies, formBodies, multipartBodies []body
	for range 30000 {
		jsonBodies = append(jsonBodies, body{"application/json", genJSON(r)})
	}
	for range 15000 {
		formBodies = append(formBodies, body{formType, urlEncoded(r, genPairs(r))})
	}
	for range 6000 {
		multipartBodies = append(multipartBodies, multipartText(genPairs(r)))
	}
	total := 0
	for _, sp := range diffSpecs {
		for _, run := range []struct {
			name   string
			bodies []body
		}{{"JSON", jsonBodies}, {"urlencoded", formBodies}, {"multipart", multipartBodies}} {
			st, bad := differential(t, e, sp.spec, run.bodies)
			if bad != "" {
				t.Fatalf("%s, %s: %s", sp.name, run.name, bad)
			}
			t.Logf("%s, %s: %d distinct bodies, %d refused, %d fingerprints, %d same-fingerprint pairs bound equal, %d pairs skipped (a binding error)",
				sp.name, run.name, st.bodies, st.refused, st.groups, st.pairs, st.skipped)
			if sp.name == "fields" && (st.refused == 0 || st.refused == st.bodies) {
				t.Errorf("%s: %d of %d bodies refused: the generator does not exercise folding", run.name, st.refused, st.bodies)
			}
			total += st.pairs
		}
	}
	if total < 100_000 {
		t.Errorf("%d same-fingerprint pairs compared, want at least 100,000", total)
	}
}

// FuzzFoldDifferential: for any two JSON or form bodies that share a
// fingerprint under diffSpec, echo binds equal values.
func FuzzFoldDifferential(f *testing.F) {
	f.Add(true, `{"Prompt":"a dog","n":1}`, `{"Prompt":"a cat","n":1}`)
	f.Add(true, `{"prompt":"x","Prompt":"a dog"}`, `{"prompt":"x","Prompt":"a cat"}`)
	f.Add(false, "Prompt=a+dog&n=1", "PROMPT=a+cat&n=1")
	f.Add(true, `{"ſketch":"a"}`, `{"s\u212aetch":"b"}`)
	f.Add(true, `{"prompt":"a","Prompt":"b"}`, `{"Prompt":"b","prompt":"a"}`)
	f.Add(true, `{"size":{"k":1,"K":2}}`, `{"size":{"K":2,"k":1}}`)
	f.Add(false, "prompt=a&k=1", "prompt=a&k=2")
	e := echo.New()
	f.Fuzz(func(t *testing.T, isJSON bool, a, b string) {
		ct := formType
		if isJSON {
			ct = "application/json"
		}
		for _, sp := range diffSpecs {
			if _, bad := differential(t, e, sp.spec, []body{{ct, a}, {ct, b}}); bad != "" {
				t.Fatalf("%s: %s", sp.name, bad)
			}
		}
	})
}
