package main

import (
	"fmt"
	"html/template"
	"io"
	"math"
	"os"
	"slices"
	"strings"
	"time"
)

// round is one stack's figures in one round of a scenario: the spread
// across rounds says how much of a difference is noise.
type round struct {
	Round     int     `json:"round"`
	Requests  int64   `json:"requests"`
	ReqPerSec float64 `json:"req_per_sec"`
	P50ms     float64 `json:"p50_ms"`
	P99ms     float64 `json:"p99_ms"`
}

// newRound summarizes one round's latencies (not sorted; lat is not kept).
func newRound(n int, lat []time.Duration, elapsed time.Duration) round {
	sorted := slices.Clone(lat)
	slices.Sort(sorted)
	r := round{Round: n + 1, Requests: int64(len(sorted)), P50ms: pct(sorted, 0.50), P99ms: pct(sorted, 0.99)}
	if elapsed > 0 {
		r.ReqPerSec = float64(len(sorted)) / elapsed.Seconds()
	}
	return r
}

// stackColors are fixed per stack name so that every plot agrees.
var stackColors = map[string]string{floorName: "#7a8599", floorScriptName: "#b0b8c6", idemgateName: "#2f5bd3", idemgateHTTPName: "#4f8fe8",
	pgFloorName: "#b39a6b", idemgatePGName: "#1f7a4d", idemgatePGAtomicName: "#8e3bb5"}

var extraColors = []string{"#c2571a", "#1f7a4d", "#8e3bb5", "#b3261e"}

func colorOf(stack string) string {
	if c, ok := stackColors[stack]; ok {
		return c
	}
	return extraColors[len(stack)%len(extraColors)]
}

// series is one line of a plot.
type series struct {
	Name   string
	Color  string
	Values []float64 // by round; NaN for a missing point
}

// plot is a line chart over rounds, as inline SVG.
type plot struct {
	Title  string
	Unit   string
	Series []series
	Ref    float64 // a dashed reference line (e.g. 1.0 for a ratio); 0 = none
}

const (
	plotW, plotH               = 300, 190
	padL, padR, padT, padB     = 52, 12, 26, 30
	innerW, innerH             = plotW - padL - padR, plotH - padT - padB
	maxTicks               int = 5
)

// niceMax returns a round upper bound ≥ v and its tick step.
func niceMax(v float64) (top, step float64) {
	if v <= 0 || math.IsNaN(v) || math.IsInf(v, 0) {
		return 1, 0.2
	}
	raw := v / float64(maxTicks)
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		step = m * mag
		if step >= raw {
			break
		}
	}
	return step * math.Ceil(v/step), step
}

// svg renders p. Every label is escaped; numbers are formatted by Go.
func (p plot) svg() template.HTML {
	n := 0
	hi := p.Ref
	for _, s := range p.Series {
		n = max(n, len(s.Values))
		for _, v := range s.Values {
			if !math.IsNaN(v) {
				hi = max(hi, v)
			}
		}
	}
	top, step := niceMax(hi)
	x := func(i int) float64 {
		if n <= 1 {
			return padL + innerW/2
		}
		return padL + float64(i)*innerW/float64(n-1)
	}
	y := func(v float64) float64 { return padT + innerH - v/top*innerH }

	var b strings.Builder
	esc := template.HTMLEscapeString
	fmt.Fprintf(&b, `<svg class="plot" viewBox="0 0 %d %d" width="%d" height="%d" role="img" aria-label="%s">`,
		plotW, plotH, plotW, plotH, esc(p.Title))
	fmt.Fprintf(&b, `<text x="%d" y="16" class="title">%s (%s)</text>`, padL, esc(p.Title), esc(p.Unit))
	for v := 0.0; v <= top+step/2; v += step {
		fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" class="grid"/>`, padL, plotW-padR, y(v), y(v))
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" class="tick" text-anchor="end">%s</text>`, padL-6, y(v)+4, esc(short(v)))
	}
	for i := range n {
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" class="tick" text-anchor="middle">%d</text>`, x(i), plotH-padB+16, i+1)
	}
	fmt.Fprintf(&b, `<text x="%d" y="%d" class="axis" text-anchor="end">round</text>`, plotW-padR, plotH-2)
	if p.Ref > 0 {
		fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" class="ref"/>`, padL, plotW-padR, y(p.Ref), y(p.Ref))
	}
	for _, s := range p.Series {
		var pts []string
		for i, v := range s.Values {
			if !math.IsNaN(v) {
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(i), y(v)))
			}
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`, s.Color, strings.Join(pts, " "))
		for i, v := range s.Values {
			if !math.IsNaN(v) {
				fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="3" fill="%s"><title>%s, round %d: %s %s</title></circle>`,
					x(i), y(v), s.Color, esc(s.Name), i+1, esc(short(v)), esc(p.Unit))
			}
		}
	}
	b.WriteString(`</svg>`)
	return template.HTML(b.String()) // built above from escaped text and numbers
}

// short formats a figure for an axis or a tooltip.
func short(v float64) string {
	switch {
	case v == 0:
		return "0"
	case v >= 10000:
		return fmt.Sprintf("%.0fk", v/1000)
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.2f", v)
}

// htmlScenario is one scenario's section of the report.
type htmlScenario struct {
	Name    string
	Results []*result
	Plots   []template.HTML
}

// scenarios groups r's results by scenario, in run order, with their plots.
func (r report) scenarios() []htmlScenario {
	var out []htmlScenario
	idx := map[string]int{}
	for _, res := range r.Results {
		i, ok := idx[res.Scenario]
		if !ok {
			i = len(out)
			idx[res.Scenario] = i
			out = append(out, htmlScenario{Name: res.Scenario})
		}
		out[i].Results = append(out[i].Results, res)
	}
	for i := range out {
		out[i].Plots = plotsOf(out[i].Results)
	}
	return out
}

// plotsOf draws throughput, p50, p99 and each stack's ratio to its floor
// over the rounds of one scenario.
func plotsOf(results []*result) []template.HTML {
	pick := func(f func(round) float64) []series {
		var ss []series
		for _, res := range results {
			s := series{Name: res.Stack, Color: colorOf(res.Stack)}
			for _, rd := range res.Rounds {
				s.Values = append(s.Values, f(rd))
			}
			ss = append(ss, s)
		}
		return ss
	}
	plots := []plot{
		{Title: "throughput", Unit: "req/s", Series: pick(func(r round) float64 { return r.ReqPerSec })},
		{Title: "p50 latency", Unit: "ms", Series: pick(func(r round) float64 { return r.P50ms })},
		{Title: "p99 latency", Unit: "ms", Series: pick(func(r round) float64 { return r.P99ms })},
	}
	byStack := map[string]*result{}
	for _, res := range results {
		byStack[res.Stack] = res
	}
	ratio := plot{Title: "throughput ÷ its floor (same round)", Unit: "×", Ref: 1}
	for _, res := range results {
		floor, ok := byStack[res.Floor]
		if !ok {
			continue
		}
		s := series{Name: res.Stack + " ÷ " + res.Floor, Color: colorOf(res.Stack)}
		for j, rd := range res.Rounds {
			v := math.NaN()
			if j < len(floor.Rounds) && floor.Rounds[j].ReqPerSec > 0 {
				v = rd.ReqPerSec / floor.Rounds[j].ReqPerSec
			}
			s.Values = append(s.Values, v)
		}
		ratio.Series = append(ratio.Series, s)
	}
	if len(ratio.Series) > 0 {
		plots = append(plots, ratio)
	}
	out := make([]template.HTML, len(plots))
	for i, p := range plots {
		out[i] = p.svg()
	}
	return out
}

// ratioBars draws each scenario's overall ratio to the floor as bars.
func (r report) ratioBars() template.HTML {
	type bar struct {
		label string
		v     float64
		color string
		floor string
	}
	var bars []bar
	hi := 1.0
	for _, res := range r.Results {
		if res.RatioToFloor > 0 {
			bars = append(bars, bar{res.Scenario + " · " + res.Stack, res.RatioToFloor, colorOf(res.Stack), res.Floor})
			hi = max(hi, res.RatioToFloor)
		}
	}
	if len(bars) == 0 {
		return ""
	}
	top, step := niceMax(hi)
	const w, rowH, left, right = 600, 24, 190, 60
	h := len(bars)*rowH + 30
	x := func(v float64) float64 { return left + v/top*(w-left-right) }
	esc := template.HTMLEscapeString
	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="bars" viewBox="0 0 %d %d" width="%d" height="%d" role="img" aria-label="throughput relative to each stack's floor">`, w, h, w, h)
	for v := 0.0; v <= top+step/2; v += step {
		fmt.Fprintf(&b, `<line x1="%.1f" x2="%.1f" y1="4" y2="%d" class="grid"/><text x="%.1f" y="%d" class="tick" text-anchor="middle">%s×</text>`,
			x(v), x(v), h-22, x(v), h-8, esc(short(v)))
	}
	fmt.Fprintf(&b, `<line x1="%.1f" x2="%.1f" y1="4" y2="%d" class="ref"/>`, x(1), x(1), h-22)
	for i, br := range bars {
		y := 6 + i*rowH
		fmt.Fprintf(&b, `<text x="%d" y="%d" class="label" text-anchor="end">%s</text>`, left-8, y+14, esc(br.label))
		fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%.1f" height="%d" fill="%s"><title>%s: %.2f× %s</title></rect>`,
			left, y, x(br.v)-left, rowH-8, br.color, esc(br.label), br.v, esc(br.floor))
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" class="value">%.2f×</text>`, x(br.v)+6, y+14, br.v)
	}
	b.WriteString(`</svg>`)
	return template.HTML(b.String()) // built above from escaped text and numbers
}

var htmlReport = template.Must(template.New("report").Funcs(template.FuncMap{"status": statusLine}).Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>idemgate load test</title>
<style>
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; color: #1d2330; margin: 1.5rem 2rem; max-width: 1600px; }
h1 { font-size: 1.4rem; margin: 0 0 .3rem; } h2 { font-size: 1.1rem; margin: 1.6rem 0 .4rem; }
.machine { color: #5d6677; margin: .2rem 0; }
table { border-collapse: collapse; font-variant-numeric: tabular-nums; margin: .4rem 0 .8rem; }
th, td { padding: .2rem .6rem; border-bottom: 1px solid #e3e6ec; text-align: right; }
th:first-child, td:first-child { text-align: left; }
th { font-weight: 600; color: #5d6677; }
.plots { display: flex; flex-wrap: wrap; gap: .6rem 1.2rem; }
svg text { font: 11px system-ui, "DejaVu Sans", sans-serif; fill: #5d6677; }
svg .title { font-weight: 600; fill: #1d2330; font-size: 12px; }
svg .label, svg .value { fill: #1d2330; }
svg .grid { stroke: #e8ebf0; } svg .ref { stroke: #b3261e; stroke-dasharray: 4 3; }
.key span { display: inline-block; margin-right: 1rem; } .key i { display: inline-block; width: .8rem; height: .8rem; border-radius: 2px; margin-right: .3rem; vertical-align: -1px; }
.note { color: #5d6677; max-width: 60rem; }
.bad { color: #b3261e; font-weight: 600; }
</style></head><body>
<h1>idemgate load test</h1>
{{with .Machine}}<p class="machine">Machine: {{.CPUs}} CPUs (GOMAXPROCS {{.GOMAXPROCS}}), {{.GOOS}}/{{.GOARCH}}, {{.Go}}, Redis {{.Redis}}, PostgreSQL {{.Postgres}}{{if .LoadAvgStart}}, load average {{.LoadAvgStart}} → {{.LoadAvgEnd}}{{end}}</p>{{end}}
<p class="machine">{{.Duration}} per scenario and stack in {{.Rounds}} alternating rounds, {{.Concurrency}} keep-alive clients; dup: groups of {{.DupGroup}} on a {{.Slow}} handler.</p>
{{if eq .PGWrite "ledger"}}<p class="machine">Handler write (-pg-write ledger): one INSERT into loadtest_ledger, in idemgate-pg-atomic's transaction and in autocommit on idemgate-pg's records pool, instead of the task; idemgate-pg-atomic's ratio is to idemgate-pg. pg µs/req then includes that INSERT, not the task work.</p>{{end}}
<p class="note">A floor is a bare echo handler doing by hand the fewest Redis commands (floor) or Postgres statements (pg-floor) an idempotency layer needs; every stack does the same task work (decode, validate, pgstore.Submit of the same task), so stacks differ only in the idempotency layer. Ratios are to each stack's own floor: floor-script and idemgate to floor, idemgate-pg to pg-floor. pg µs/req is the whole Postgres server's CPU, task work included (the same for every stack); pg rt/req counts the Postgres stacks' records pool only; go µs/req is this process's CPU (the clients, the same for every stack, and the stack's server).
Compare the ratio to the floor, measured in the same run on the same machine; absolute figures move with the machine and its load.</p>
<p class="key">{{range .Key}}<span><i style="background:{{.Color}}"></i>{{.Name}}</span>{{end}}</p>
<h2>Throughput relative to its floor</h2>
{{.Bars}}
{{range .Scenarios}}
<h2>{{.Name}}</h2>
<table><tr><th>stack</th><th>req/s</th><th>vs floor</th><th>p50 ms</th><th>p99 ms</th><th>p99.9 ms</th><th>requests</th><th>dup execs</th><th>redis rt/req</th><th>redis µs/req</th><th>pg rt/req</th><th>pg µs/req</th><th>go µs/req</th><th>B/record</th><th>rows/key</th><th>status</th></tr>
{{range .Results}}<tr><td>{{.Stack}}</td><td>{{printf "%.0f" .ReqPerSec}}</td><td>{{if .RatioToFloor}}{{printf "%.2f" .RatioToFloor}}×{{else}}–{{end}}</td><td>{{printf "%.2f" .P50ms}}</td><td>{{printf "%.2f" .P99ms}}</td><td>{{printf "%.2f" .P999ms}}</td><td>{{.Requests}}</td><td{{if .DuplicateExecutions}} class="bad"{{end}}>{{.DuplicateExecutions}}</td><td>{{printf "%.2f" .RedisRoundTripsPerReq}}</td><td>{{printf "%.1f" .RedisCPUusPerReq}}</td><td>{{if eq .Records "postgres"}}{{printf "%.2f" .PGRoundTripsPerReq}}{{else}}–{{end}}</td><td>{{if $.Machine.PostgresCPU}}{{printf "%.1f" .PGCPUusPerReq}}{{else}}–{{end}}</td><td>{{printf "%.1f" .ProcessCPUusPerReq}}</td><td>{{if .RedisBytesPerRecord}}{{printf "%.0f" .RedisBytesPerRecord}}{{else}}–{{end}}</td><td>{{printf "%.2f" .RowsPerAcceptedKey}}</td><td>{{status .}}</td></tr>
{{end}}</table>
<div class="plots">{{range .Plots}}{{.}}{{end}}</div>
{{end}}
</body></html>
`))

// writeHTML writes r as one self-contained HTML page: inline CSS and SVG,
// nothing fetched from anywhere.
func (r report) writeHTML(w io.Writer) error {
	type keyItem struct {
		Name  string
		Color template.CSS
	}
	var key []keyItem
	seen := map[string]bool{}
	for _, res := range r.Results {
		if !seen[res.Stack] {
			seen[res.Stack] = true
			key = append(key, keyItem{res.Stack, template.CSS(colorOf(res.Stack))})
		}
	}
	return htmlReport.Execute(w, struct {
		report
		Key       []keyItem
		Bars      template.HTML
		Scenarios []htmlScenario
	}{r, key, r.ratioBars(), r.scenarios()})
}

// writeHTMLFile writes r's HTML report to path.
func writeHTMLFile(path string, r report) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("html report: %w", err)
	}
	if err := r.writeHTML(f); err != nil {
		f.Close()
		return fmt.Errorf("html report: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("html report: %w", err)
	}
	return nil
}
