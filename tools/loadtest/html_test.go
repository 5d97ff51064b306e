package main

import (
	"bytes"
	"context"
	"encoding/xml"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemgate/idemgate/internal/testenv"
)

// sampleReport is two scenarios on the floor and idemgate, three rounds
// each, and a third stack whose name needs escaping.
func sampleReport() report {
	r := report{Machine: machine{GOOS: "linux", GOARCH: "amd64", CPUs: 2, GOMAXPROCS: 2, Go: "go1.26",
		Redis: "7.0.15", Postgres: "15.18", LoadAvgStart: "0.5", LoadAvgEnd: "1.5"},
		Duration: "3s", Rounds: 3, Concurrency: 8, Slow: "50ms", DupGroup: 4}
	for _, sc := range []string{"miss", "replay"} {
		for i, st := range []string{floorName, "idemgate", `<b>"x"</b>`} {
			res := &result{Scenario: sc, Stack: st, ReqPerSec: 1000 / float64(i+1), P50ms: 1, P99ms: 5,
				Status: map[string]int64{"202": 10}, RowsPerAcceptedKey: 1}
			if st != floorName {
				res.Floor = floorName
				res.RatioToFloor = 1 / float64(i+1)
			}
			for n := range 3 {
				res.Rounds = append(res.Rounds, round{Round: n + 1, ReqPerSec: float64(900+100*n) / float64(i+1),
					P50ms: 1 + float64(n), P99ms: 5 + float64(n)})
			}
			r.Results = append(r.Results, res)
		}
	}
	return r
}

// TestHTMLReport checks that the report stands alone (no scripts, nothing
// fetched), that every SVG is well-formed, that it has the plots it should
// and that names are escaped.
func TestHTMLReport(t *testing.T) {
	var buf bytes.Buffer
	if err := sampleReport().writeHTML(&buf); err != nil {
		t.Fatal(err)
	}
	page := buf.String()
	for _, bad := range []string{"<script", "src=", "href=", "@import", "url("} {
		if strings.Contains(page, bad) {
			t.Errorf("report contains %q: it must not load anything", bad)
		}
	}
	if strings.Contains(page, `<b>"x"</b>`) {
		t.Error("a stack name was not escaped")
	}
	for _, want := range []string{"2 CPUs (GOMAXPROCS 2)", "Redis 7.0.15", "PostgreSQL 15.18", "load average 0.5 → 1.5",
		"<h2>miss</h2>", "<h2>replay</h2>", "0.50×", "<th>pg rt/req</th><th>pg µs/req</th>", "idemgate ÷ floor, round 1"} {
		if !strings.Contains(page, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	svgs := regexp.MustCompile(`(?s)<svg.*?</svg>`).FindAllString(page, -1)
	// Per scenario: throughput, p50, p99 and the ratio; plus one bar chart.
	if want := 2*4 + 1; len(svgs) != want {
		t.Fatalf("%d SVGs, want %d", len(svgs), want)
	}
	for _, s := range svgs {
		d := xml.NewDecoder(strings.NewReader(s))
		for {
			_, err := d.Token()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("SVG is not well-formed: %v\n%s", err, s)
			}
		}
	}
}

// TestHTMLReportSaysTheLedgerWrite: a -pg-write ledger run says that
// its handler wrote a ledger row, not the task; a task run does not.
func TestHTMLReportSaysTheLedgerWrite(t *testing.T) {
	for _, write := range []string{pgWriteTask, pgWriteLedger} {
		r := sampleReport()
		r.PGWrite = write
		var buf bytes.Buffer
		if err := r.writeHTML(&buf); err != nil {
			t.Fatal(err)
		}
		if got := strings.Contains(buf.String(), "-pg-write ledger"); got != (write == pgWriteLedger) {
			t.Errorf("-pg-write %s: the report mentions the ledger write: %v", write, got)
		}
	}
}

var pointsRE = regexp.MustCompile(`points="([^"]*)"`)

// TestPlotScale checks the geometry: every point inside the plot area,
// a larger value drawn higher, rounds left to right.
func TestPlotScale(t *testing.T) {
	p := plot{Title: "t", Unit: "u", Series: []series{{Name: "a", Color: "#000", Values: []float64{100, 300, 200}}}}
	m := pointsRE.FindStringSubmatch(string(p.svg()))
	if m == nil {
		t.Fatal("no polyline")
	}
	var xs, ys []float64
	for _, pt := range strings.Fields(m[1]) {
		x, y, _ := strings.Cut(pt, ",")
		fx, _ := strconv.ParseFloat(x, 64)
		fy, _ := strconv.ParseFloat(y, 64)
		if fx < padL || fx > plotW-padR || fy < padT || fy > plotH-padB {
			t.Errorf("point %s outside the plot area", pt)
		}
		xs, ys = append(xs, fx), append(ys, fy)
	}
	if len(xs) != 3 || !slices.IsSorted(xs) {
		t.Fatalf("x = %v, want 3 increasing", xs)
	}
	if !(ys[1] < ys[2] && ys[2] < ys[0]) {
		t.Errorf("y = %v: 300 must be drawn above 200, above 100", ys)
	}
}

func TestNiceMax(t *testing.T) {
	for _, v := range []float64{0.3, 1, 7, 12, 99, 101, 2345, 17000, 1e6} {
		top, step := niceMax(v)
		mant := step / math.Pow(10, math.Floor(math.Log10(step)))
		if top < v || top >= v+step+1e-9 || !slices.ContainsFunc([]float64{1, 2, 2.5, 5}, func(m float64) bool { return math.Abs(m-mant) < 1e-9 }) {
			t.Errorf("niceMax(%v) = %v, %v", v, top, step)
		}
		if ticks := top / step; ticks > float64(maxTicks)+1e-9 {
			t.Errorf("niceMax(%v): %v ticks, want at most %d", v, ticks, maxTicks)
		}
	}
}

func TestNewRound(t *testing.T) {
	lat := make([]time.Duration, 100)
	for i := range lat {
		lat[i] = time.Duration(100-i) * time.Millisecond // reversed: newRound must sort a copy
	}
	r := newRound(2, lat, 2*time.Second)
	// Nearest rank (measure.Percentile) of 1 … 100 ms: p50 is the 50th, p99 the 99th.
	if r.Round != 3 || r.Requests != 100 || r.ReqPerSec != 50 || r.P50ms != 50 || r.P99ms != 99 {
		t.Errorf("newRound = %+v", r)
	}
	if lat[0] != 100*time.Millisecond {
		t.Error("newRound sorted its input")
	}
}

// TestRunHTML runs the tool briefly with -html and reads the report back.
func TestRunHTML(t *testing.T) {
	if testing.Short() {
		t.Skip("drives real servers")
	}
	ro := testenv.Redis(t)
	dsn := testenv.PostgresDSN(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	path := filepath.Join(t.TempDir(), "report.html")
	var out, log bytes.Buffer
	err := run(ctx, []string{"-scenarios", "miss,replay", "-duration", "200ms", "-rounds", "2", "-warmup", "100ms",
		"-concurrency", "2", "-dup-group", "2", "-keys", "4", "-html", path, "-stacks", "pg-floor,idemgate-pg",
		"-redis-url", fmt.Sprintf("redis://%s/%d", ro.Addr, ro.DB), "-database-url", dsn}, &out, &log)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, log.String())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	page := string(b)
	if n := strings.Count(page, `<svg class="plot"`); n != 2*4 {
		t.Errorf("%d plots, want 8 (2 scenarios × throughput, p50, p99, ratio)", n)
	}
	// Each plot line has one point per round.
	for _, m := range pointsRE.FindAllStringSubmatch(page, -1) {
		if n := len(strings.Fields(m[1])); n != 2 {
			t.Errorf("a line has %d points, want 2 rounds", n)
		}
	}
	if !strings.Contains(page, "<h2>miss</h2>") || !strings.Contains(page, "<h2>replay</h2>") {
		t.Error("report lacks a scenario")
	}
}
