package main

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"sync"
	"time"
)

// A history is what a run recorded, as JSON lines: one object per line,
// told apart by "type". It is everything the checker reads, so a history
// file can be checked again without a run (-check FILE).
type History struct {
	Meta     Meta
	Requests []Request
	Actions  []Action
	Gen      []GenCall
	Faults   []Fault
	Rows     []Row
	Exports  []Export
	Limits   []Limit
}

// Meta describes the run.
type Meta struct {
	Type     string        `json:"type"` // "meta"
	Seed     int64         `json:"seed"`
	Duration time.Duration `json:"duration_ns"`
	Plant    string        `json:"plant,omitempty"`
	Start    time.Time     `json:"start"`
	// Heal is when the nemesis stopped and every fault was undone.
	Heal time.Time `json:"heal"`
	// Bound is how long after Heal every client action must have finished.
	Bound time.Duration `json:"bound_ns"`
	End   time.Time     `json:"end"`
	// Policy is what a lost attempt becomes, per task kind: "uncertain"
	// (no second generator call, ever) or "retry" (a second call only
	// after an attempt was cut off by a fault).
	Policy map[string]string `json:"policy"`
	// Starts reports that generator calls were recorded when they start
	// (the stand-in upstream's call log in Postgres), not only when they
	// end (the workers' logs): then a call cut off by a kill counts too.
	Starts bool `json:"starts"`
	// Store is where the API nodes kept the idempotency records: "redis"
	// ("" in older histories) or "postgres" (STORE=postgres, the export
	// route Atomic: its ledger row commits with its record).
	Store string `json:"store,omitempty"`
	// Modes are the run's modes (short-lease, limits, flood); Lease,
	// GenTime and ExportTime its timings (Lease 0: the defaults).
	Modes      []string      `json:"modes,omitempty"`
	Lease      time.Duration `json:"lease_ns,omitempty"`
	GenTime    time.Duration `json:"gen_time_ns,omitempty"`
	ExportTime time.Duration `json:"export_time_ns,omitempty"`
	// Flood is the tenant that floods (flood mode), "" when none does.
	Flood string `json:"flood,omitempty"`
}

// Limit is one change of a kind's limits (limits mode): asked at Asked,
// in force once SetKindLimits returned at Set. Err says it failed (it may
// still have been applied).
type Limit struct {
	Type       string    `json:"type"` // "limit"
	Kind       string    `json:"kind"`
	MaxRunning int       `json:"max_running"`
	PerTenant  int       `json:"max_running_per_tenant"`
	Paused     bool      `json:"paused,omitempty"`
	Asked      time.Time `json:"asked"`
	Set        time.Time `json:"set"`
	Err        string    `json:"err,omitempty"`
}

// Params are the parameters of an image request that the server
// fingerprints, with the server's defaults filled in.
type Params struct {
	Prompt         string `json:"prompt"`
	AspectRatio    string `json:"aspect_ratio"`
	N              int    `json:"n"`
	ReferenceImage string `json:"reference_image,omitempty"`
}

// FP is the checker's own digest of p: independent of the library's
// fingerprint, so that a bug there cannot hide from the checker.
func (p Params) FP() string {
	b, _ := json.Marshal(p)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:8])
}

// Request is one HTTP exchange a client made.
type Request struct {
	Type   string `json:"type"` // "req"
	Client int    `json:"client"`
	Action int    `json:"action"`
	Tenant string `json:"tenant"`
	User   string `json:"user"`
	Node   string `json:"node"`
	Method string `json:"method"`
	// Route is the route template: "POST /v1/images", "GET /v1/tasks/{id}".
	Route string `json:"route"`
	// Key is the request id sent as Idempotency-Key (submits and exports).
	Key string `json:"key,omitempty"`
	// PathTask is the task id the path names (the task routes), whatever
	// the answer: it says whose task a request tried.
	PathTask string  `json:"path_task,omitempty"`
	Params   *Params `json:"params,omitempty"`
	// FP is Params.FP() of what was sent (submits only).
	FP   string    `json:"fp,omitempty"`
	Sent time.Time `json:"sent"`
	Done time.Time `json:"done"`
	// Status is the HTTP status; 0 for a transport error (Err says which).
	Status int    `json:"status"`
	Err    string `json:"err,omitempty"`
	// Code is the problem document's code.
	Code     string `json:"code,omitempty"`
	TaskID   string `json:"task_id,omitempty"`
	TaskSt   string `json:"task_status,omitempty"`
	Replayed bool   `json:"replayed,omitempty"`
	// Images and BadImages count the images of a task answer, and those
	// that are not PNG data URLs.
	Images    int `json:"images,omitempty"`
	BadImages int `json:"bad_images,omitempty"`
	// ExportID is the ledger id a 200 to an export names.
	ExportID int64 `json:"export_id,omitempty"`
}

// Action is one business action of a client, from its first request to
// its outcome.
type Action struct {
	Type     string `json:"type"` // "action"
	ID       int    `json:"id"`
	Client   int    `json:"client"`
	Tenant   string `json:"tenant"`
	User     string `json:"user"`
	Key      string `json:"key"`
	Scenario string `json:"scenario"`
	// TaskID is the task the action was accepted as, if it was.
	TaskID string    `json:"task_id,omitempty"`
	Start  time.Time `json:"start"`
	End    time.Time `json:"end"`
	// Outcome: succeeded, failed, cancelled, key_reused, rejected (another
	// 4xx), or unfinished (still going at the liveness deadline).
	Outcome string `json:"outcome"`
	Detail  string `json:"detail,omitempty"`
}

// GenCall is one call of the stand-in generator: from the upstream's call
// log (Phase "start", Proc unknown), from a worker's log (Phase "end": the
// call finished with Result), or a reconcile query (Phase "reconcile": not
// a generation).
type GenCall struct {
	Type    string    `json:"type"` // "gen"
	Task    string    `json:"task"`
	Proc    string    `json:"proc"`
	Phase   string    `json:"phase"`
	Result  string    `json:"result,omitempty"`
	Attempt int       `json:"attempt,omitempty"`
	At      time.Time `json:"at"`
	// Done is when the upstream is done with a call it logged (Phase
	// "start"): its planned end; the caller may stop waiting earlier.
	Done time.Time `json:"done,omitzero"`
}

// Fault is one fault the nemesis injected, from start to heal.
type Fault struct {
	Type   string    `json:"type"` // "fault"
	Kind   string    `json:"kind"`
	Target string    `json:"target,omitempty"` // a process name; empty: every process
	Start  time.Time `json:"start"`
	End    time.Time `json:"end"`
	Detail string    `json:"detail,omitempty"`
}

// Row is one task row at the end of the run.
type Row struct {
	Type     string `json:"type"` // "row"
	ID       string `json:"id"`
	Tenant   string `json:"tenant"`
	Owner    string `json:"owner"`
	Kind     string `json:"kind"`
	IdemKey  string `json:"idempotency_key"`
	ParamsFP string `json:"params_fp"`
	State    string `json:"state"`
	Attempt  int    `json:"attempt"`
	Results  int    `json:"results"`
	PNGs     int    `json:"pngs"` // results that are PNG data URLs
	// Recoveries counts how often the task was put back in line after a
	// failure (POST /v1/tasks/{id}/recover).
	Recoveries int       `json:"recoveries,omitempty"`
	Error      string    `json:"error,omitempty"`
	CreatedAt  time.Time `json:"created_at"`
}

// Export is one run of the example's export handler, a billed action:
// a row of its ledger (idemgate_example_exports) at the end of the run.
type Export struct {
	Type    string    `json:"type"` // "export"
	ID      int64     `json:"id"`
	Tenant  string    `json:"tenant"`
	Owner   string    `json:"owner"`
	IdemKey string    `json:"idempotency_key"`
	TaskID  string    `json:"task_id"`
	Proc    string    `json:"proc"` // the API node that ran it
	Started time.Time `json:"started"`
	Created time.Time `json:"created"`
}

// recorder appends history events as JSON lines and keeps them for the
// checker. It is safe for concurrent use.
type recorder struct {
	mu  sync.Mutex
	w   *bufio.Writer
	err error
	h   History
}

func newRecorder(w io.Writer) *recorder {
	return &recorder{w: bufio.NewWriter(w)}
}

func (r *recorder) write(v any) {
	if r.w == nil {
		return
	}
	b, err := json.Marshal(v)
	if err == nil {
		b = append(b, '\n')
		_, err = r.w.Write(b)
	}
	if err != nil && r.err == nil {
		r.err = err
	}
}

func (r *recorder) meta(m Meta) {
	r.mu.Lock()
	defer r.mu.Unlock()
	m.Type = "meta"
	r.h.Meta = m
	r.write(m)
}

func (r *recorder) request(q Request) {
	r.mu.Lock()
	defer r.mu.Unlock()
	q.Type = "req"
	r.h.Requests = append(r.h.Requests, q)
	r.write(q)
}

func (r *recorder) action(a Action) {
	r.mu.Lock()
	defer r.mu.Unlock()
	a.Type = "action"
	r.h.Actions = append(r.h.Actions, a)
	r.write(a)
}

func (r *recorder) gen(g GenCall) {
	r.mu.Lock()
	defer r.mu.Unlock()
	g.Type = "gen"
	r.h.Gen = append(r.h.Gen, g)
	r.write(g)
}

func (r *recorder) fault(f Fault) {
	r.mu.Lock()
	defer r.mu.Unlock()
	f.Type = "fault"
	r.h.Faults = append(r.h.Faults, f)
	r.write(f)
}

func (r *recorder) row(w Row) {
	r.mu.Lock()
	defer r.mu.Unlock()
	w.Type = "row"
	r.h.Rows = append(r.h.Rows, w)
	r.write(w)
}

func (r *recorder) limit(l Limit) {
	r.mu.Lock()
	defer r.mu.Unlock()
	l.Type = "limit"
	r.h.Limits = append(r.h.Limits, l)
	r.write(l)
}

func (r *recorder) export(e Export) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e.Type = "export"
	r.h.Exports = append(r.h.Exports, e)
	r.write(e)
}

// flush writes out what is buffered and returns the first write error.
func (r *recorder) flush() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.w != nil {
		if err := r.w.Flush(); err != nil && r.err == nil {
			r.err = err
		}
	}
	return r.err
}

// history returns a copy of what was recorded.
func (r *recorder) history() History {
	r.mu.Lock()
	defer r.mu.Unlock()
	h := r.h
	h.Requests = append([]Request(nil), h.Requests...)
	h.Actions = append([]Action(nil), h.Actions...)
	h.Gen = append([]GenCall(nil), h.Gen...)
	h.Faults = append([]Fault(nil), h.Faults...)
	h.Rows = append([]Row(nil), h.Rows...)
	h.Exports = append([]Export(nil), h.Exports...)
	h.Limits = append([]Limit(nil), h.Limits...)
	return h
}

// ReadHistory parses a history written by a run.
func ReadHistory(r io.Reader) (History, error) {
	var h History
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Bytes()
		if len(line) == 0 {
			continue
		}
		var probe struct {
			Type string `json:"type"`
		}
		if err := json.Unmarshal(line, &probe); err != nil {
			return h, fmt.Errorf("chaos: history line %d: %w", n, err)
		}
		var err error
		switch probe.Type {
		case "meta":
			err = json.Unmarshal(line, &h.Meta)
		case "req":
			var v Request
			err = json.Unmarshal(line, &v)
			h.Requests = append(h.Requests, v)
		case "action":
			var v Action
			err = json.Unmarshal(line, &v)
			h.Actions = append(h.Actions, v)
		case "gen":
			var v GenCall
			err = json.Unmarshal(line, &v)
			h.Gen = append(h.Gen, v)
		case "fault":
			var v Fault
			err = json.Unmarshal(line, &v)
			h.Faults = append(h.Faults, v)
		case "row":
			var v Row
			err = json.Unmarshal(line, &v)
			h.Rows = append(h.Rows, v)
		case "export":
			var v Export
			err = json.Unmarshal(line, &v)
			h.Exports = append(h.Exports, v)
		case "limit":
			var v Limit
			err = json.Unmarshal(line, &v)
			h.Limits = append(h.Limits, v)
		default:
			err = fmt.Errorf("unknown type %q", probe.Type)
		}
		if err != nil {
			return h, fmt.Errorf("chaos: history line %d: %w", n, err)
		}
	}
	if err := sc.Err(); err != nil {
		return h, fmt.Errorf("chaos: read history: %w", err)
	}
	return h, nil
}
