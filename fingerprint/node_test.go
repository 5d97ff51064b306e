package fingerprint

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// appendixB holds the sample values of RFC 8785 Appendix B: IEEE-754 bit
// patterns and their canonical text. (NaN and Infinity, also listed there,
// cannot occur in a JSON text.)
var appendixB = []struct {
	bits uint64
	want string
}{
	{0x0000000000000000, "0"},
	{0x8000000000000000, "0"},
	{0x0000000000000001, "5e-324"},
	{0x8000000000000001, "-5e-324"},
	{0x7fefffffffffffff, "1.7976931348623157e+308"},
	{0xffefffffffffffff, "-1.7976931348623157e+308"},
	{0x4340000000000000, "9007199254740992"},
	{0xc340000000000000, "-9007199254740992"},
	{0x4430000000000000, "295147905179352830000"},
	{0x44b52d02c7e14af5, "9.999999999999997e+22"},
	{0x44b52d02c7e14af6, "1e+23"},
	{0x44b52d02c7e14af7, "1.0000000000000001e+23"},
	{0x444b1ae4d6e2ef4e, "999999999999999700000"},
	{0x444b1ae4d6e2ef4f, "999999999999999900000"},
	{0x444b1ae4d6e2ef50, "1e+21"},
	{0x3eb0c6f7a0b5ed8c, "9.999999999999997e-7"},
	{0x3eb0c6f7a0b5ed8d, "0.000001"},
	{0x41b3de4355555553, "333333333.3333332"},
	{0x41b3de4355555554, "333333333.33333325"},
	{0x41b3de4355555555, "333333333.3333333"},
	{0x41b3de4355555556, "333333333.3333334"},
	{0x41b3de4355555557, "333333333.33333343"},
	{0xbecbf647612f3696, "-0.0000033333333333333333"},
	{0x43143ff3c1cb0959, "1424953923781206.2"},
}

// goLiteral spells f as a JSON number that reads back as exactly f.
func goLiteral(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }

func TestAppendixB(t *testing.T) {
	t.Parallel()
	for _, tt := range appendixB {
		f := math.Float64frombits(tt.bits)
		got, err := Canonicalize([]byte(goLiteral(f)))
		if err != nil {
			t.Errorf("%016x: %v", tt.bits, err)
			continue
		}
		if string(got) != tt.want {
			t.Errorf("%016x (%s): got %s, want %s", tt.bits, goLiteral(f), got, tt.want)
		}
	}
}

// nodeStringify is run by Node.js: it reads hex bit patterns, one a line,
// and prints JSON.stringify of the array of those doubles.
const nodeStringify = `
const lines = require('fs').readFileSync(0, 'utf8').trim().split('\n');
const buf = Buffer.alloc(8);
const xs = lines.map((h) => { buf.write(h, 'hex'); return buf.readDoubleBE(0); });
process.stdout.write(JSON.stringify(xs));
`

// TestNodeDifferential compares the numbers Canonicalize writes with what
// JSON.stringify writes in Node.js, the check RFC 8785 recommends, over
// random bit patterns, doubles of every magnitude JSON traffic carries, and
// the Appendix B values.
func TestNodeDifferential(t *testing.T) {
	t.Parallel()
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node is not on PATH: the ES6 number differential test needs Node.js")
	}
	rng := rand.New(rand.NewPCG(8785, 2020))
	var bits []uint64
	for _, tt := range appendixB {
		bits = append(bits, tt.bits)
	}
	for len(bits) < 100_000+len(appendixB) { // any bit pattern but NaN and ±Inf
		b := rng.Uint64()
		if b>>52&0x7ff != 0x7ff {
			bits = append(bits, b)
		}
	}
	for range 50_000 { // exponents from about 1e-9 to 1e24, around the notation switches
		e := uint64(1023-30) + rng.Uint64N(110)
		bits = append(bits, rng.Uint64()&(1<<63|1<<52-1)|e<<52)
	}
	for p := -30; p <= 30; p++ { // powers of ten and their neighbours
		f := math.Pow(10, float64(p))
		bits = append(bits, math.Float64bits(f), math.Float64bits(f)+1, math.Float64bits(f)-1)
	}
	for i := range uint64(1000) { // subnormals and the smallest normals
		bits = append(bits, i, 0x0010000000000000+i, 0x000fffffffffffff-i)
	}

	var hexLines, doc strings.Builder
	doc.WriteByte('[')
	for i, b := range bits {
		fmt.Fprintf(&hexLines, "%016x\n", b)
		if i > 0 {
			doc.WriteByte(',')
		}
		doc.WriteString(goLiteral(math.Float64frombits(b)))
	}
	doc.WriteByte(']')

	cmd := exec.Command(node, "-e", nodeStringify)
	cmd.Stdin = strings.NewReader(hexLines.String())
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	want, err := cmd.Output()
	if err != nil {
		t.Fatalf("node: %v\n%s", err, stderr.Bytes())
	}
	got, err := Canonicalize([]byte(doc.String()))
	if err != nil {
		t.Fatalf("Canonicalize: %v", err)
	}
	if bytes.Equal(got, want) {
		return
	}
	gotNums := strings.Split(strings.Trim(string(got), "[]"), ",")
	wantNums := strings.Split(strings.Trim(string(want), "[]"), ",")
	if len(gotNums) != len(wantNums) {
		t.Fatalf("got %d numbers, node printed %d", len(gotNums), len(wantNums))
	}
	failures := 0
	for i := range gotNums {
		if gotNums[i] != wantNums[i] {
			t.Errorf("%016x: got %s, node prints %s", bits[i], gotNums[i], wantNums[i])
			if failures++; failures == 20 {
				t.Fatal("too many differences")
			}
		}
	}
}
