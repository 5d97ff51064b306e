package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"image/png"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/example/imageclient"
)

// Tenants and users of the clients. Request ids are shared across them on
// purpose: the same id under another tenant or user is another action.
var (
	tenants = []string{"acme", "globex", "initech ü/2"}
	users   = []string{"alice", "bob"}
)

// workload is the clients of a run.
type workload struct {
	rec     *recorder
	nodes   []string // API base URLs
	secret  []byte
	clients int
	seed    int64
	// stopNew is when clients stop starting actions; deadline is when an
	// unfinished action is given up as unfinished.
	stopNew, deadline time.Time
	// patience is the HTTP timeout of one request.
	patience time.Duration
	// plan is the run's modes and timings; acks hears every 2xx to a POST
	// (for the nemesis's ack-kill).
	plan plan
	acks *acks
	// aims hears exports sent and cancels to come (for the nemesis's
	// export-pause and cancel-slow).
	aims *aims

	transport *http.Transport

	mu      sync.Mutex
	nextID  int
	created map[string][]string // identity → task ids it was given, for snooping
	// partials are tasks that failed keeping partial results, by identity:
	// a recover by anyone else must find nothing.
	partials map[string][]string
	// failing are the tasks that failed keeping partial results and
	// whose owner has not recovered them yet, by tenant: the window in
	// which a colleague's recover could succeed.
	failing map[string][]failed
}

// failed is a task failed with partial results, and its owner.
type failed struct{ id, user string }

// actionCtx travels in a request's context to the recording transport.
type actionCtx struct {
	client, action int
	tenant, user   string
}

type actionKey struct{}

// run starts the clients and waits until each has finished its last action.
func (w *workload) run(ctx context.Context) error {
	w.created = map[string][]string{}
	w.partials = map[string][]string{}
	w.failing = map[string][]failed{}
	// One connection pool for every client, loopback only, sized so that
	// keep-alive connections are reused (and meet restarted nodes).
	w.transport = &http.Transport{MaxIdleConnsPerHost: w.clients, IdleConnTimeout: 30 * time.Second}
	defer w.transport.CloseIdleConnections()
	players := make([]*player, w.clients)
	for i := range players {
		var err error
		if players[i], err = w.newPlayer(i); err != nil {
			return err
		}
	}
	var wg sync.WaitGroup
	for _, p := range players {
		wg.Add(1)
		go func() { defer wg.Done(); p.run(ctx) }()
	}
	if w.plan.has("flood") {
		f, err := w.newFlooder()
		if err != nil {
			return err
		}
		wg.Add(1)
		go func() { defer wg.Done(); f.flood(ctx) }()
	}
	wg.Wait()
	return nil
}

// player is one client: an identity, a client per API node, a random source.
type player struct {
	w      *workload
	n      int
	tenant string
	user   string
	slot   int // the client's index within its identity: clients share request ids by slot
	rng    *rand.Rand
	cl     []*imageclient.Client
	http   *http.Client
	token  string
	round  int
	// past are earlier accepted actions, revisited later: an honest retry
	// must replay the same task, a reworded one must get key_reused, even
	// after Redis forgot the key.
	past []pastAction
	// succeeded are the client's succeeded tasks, for exports.
	succeeded []string
}

type pastAction struct {
	key string
	req imageclient.ImageRequest
}

// newPlayer makes client n: its identity, token and a client per node.
func (w *workload) newPlayer(n int) (*player, error) {
	ident := n % (len(tenants) * len(users))
	p := &player{w: w, n: n, tenant: tenants[ident/len(users)], user: users[ident%len(users)],
		slot: n / (len(tenants) * len(users)), rng: newRand(w.seed, uint64(n))}
	tok, err := mintToken(w.secret, p.tenant, p.user)
	if err != nil {
		return nil, fmt.Errorf("chaos: token for client %d: %w", n, err)
	}
	p.token = tok
	p.http = &http.Client{Timeout: w.patience, Transport: &recording{rec: w.rec, base: w.transport, acks: w.acks, aims: w.aims}}
	for _, u := range w.nodes {
		p.cl = append(p.cl, imageclient.New(imageclient.Config{
			BaseURL: u, Token: tok, HTTPClient: p.http,
			MaxAttempts: 4, MinBackoff: 50 * time.Millisecond, MaxBackoff: time.Second,
		}))
	}
	return p, nil
}

// run plays actions until the workload stops starting new ones.
func (p *player) run(ctx context.Context) {
	for time.Now().Before(p.w.stopNew) && ctx.Err() == nil {
		p.round++
		if len(p.past) > 0 && p.rng.IntN(4) == 0 {
			p.revisit(ctx)
			continue
		}
		p.play(ctx)
	}
}

// newAction opens an action and returns the context its requests carry.
func (p *player) newAction(ctx context.Context, key, scenario string) (context.Context, Action) {
	p.w.mu.Lock()
	p.w.nextID++
	id := p.w.nextID
	p.w.mu.Unlock()
	a := Action{ID: id, Client: p.n, Tenant: p.tenant, User: p.user, Key: key, Scenario: scenario, Start: time.Now()}
	return context.WithValue(ctx, actionKey{}, actionCtx{client: p.n, action: id, tenant: p.tenant, user: p.user}), a
}

func (p *player) end(a Action, outcome, detail string) {
	a.End, a.Outcome, a.Detail = time.Now(), outcome, detail
	p.w.rec.action(a)
}

// play runs one business action, chosen at random, to its end.
func (p *player) play(ctx context.Context) {
	req := imageclient.ImageRequest{
		Prompt:      fmt.Sprintf("poster %d for %s/%s round %d", p.n, p.tenant, p.user, p.round),
		AspectRatio: []string{"1:1", "16:9", "9:16"}[p.rng.IntN(3)],
		N:           1 + p.rng.IntN(2),
		ClientNote:  "first try",
	}
	scenario := "plain"
	switch r := p.rng.IntN(100); {
	case r < 20:
		scenario = "reworded"
	case r < 30:
		scenario = "cancel"
	case r < 35:
		scenario, req.Prompt = "fail", req.Prompt+" #fail"
	case r < 40:
		scenario, req.Prompt = "timeout", req.Prompt+" #timeout"
	case r < 45:
		// The upstream answers late: the task becomes uncertain and is
		// reconciled; the client cancels it then.
		scenario, req.Prompt = "cancel-uncertain", req.Prompt+" #timeout"
	case r < 52:
		scenario = "cancel-late"
	case r < 57:
		// The upstream fails after the first image: the task fails
		// keeping it; its owner recovers it, others try to.
		scenario, req.Prompt, req.N = "partial", req.Prompt+" #partial", 2
	}
	// Rule 1: the id names the business action; clients share ids by slot.
	key := fmt.Sprintf("poster:%d:%d", p.round, p.slot)
	actx, a := p.newAction(ctx, key, scenario)
	p.recoverColleagues(actx)
	sub, outcome, detail := p.submit(actx, key, req)
	if outcome != "" {
		p.end(a, outcome, detail)
		return
	}
	a.TaskID = sub.TaskID
	p.remember(sub.TaskID)
	if scenario == "plain" || scenario == "reworded" {
		p.past = append(p.past, pastAction{key: key, req: req})
	}
	if p.rng.IntN(2) == 0 {
		// An honest retry, byte for byte, to either node; then one whose
		// client_note changed (not a fingerprinted field): both replay.
		p.submit(actx, key, req)
		note := req
		note.ClientNote = "second try"
		p.submit(actx, key, note)
	}
	if p.rng.IntN(5) == 0 {
		p.snoop(actx)
	}
	switch scenario {
	case "cancel":
		p.cancel(actx, sub.TaskID)
	case "cancel-uncertain":
		// Cancel while the task is uncertain, or being reconciled.
		if p.waitFor(actx, sub.TaskID, "uncertain") {
			sleep(actx, time.Duration(p.rng.IntN(2000))*time.Millisecond)
			p.cancel(actx, sub.TaskID)
		}
	case "cancel-late":
		// Cancel near the end of the generation, from a little before
		// to a little after it: the attempt's outcome and the cancel
		// race. A cancel-slow hears of it and slows the workers'
		// writes around it, so that a cancel can land between the
		// generator's return and the attempt's finish.
		if p.waitFor(actx, sub.TaskID, "running") {
			at := time.Now().Add(p.w.plan.genTime + time.Duration(p.rng.IntN(700)-400)*time.Millisecond)
			p.w.aims.cancelAt(at)
			sleep(actx, time.Until(at))
			p.cancel(actx, sub.TaskID)
		}
	case "partial":
		if outcome, _ := p.poll(actx, sub.TaskID); outcome == "failed" {
			// The owner takes its time: meanwhile the failed task is
			// there for a colleague's snoop to try to recover.
			p.addPartial(sub.TaskID)
			p.setFailing(sub.TaskID, true)
			sleep(actx, time.Second+time.Duration(p.rng.IntN(3000))*time.Millisecond)
			p.setFailing(sub.TaskID, false)
			p.recover(actx, sub.TaskID)
		}
	case "reworded":
		// Rule 2 broken on purpose: a reworded prompt under the old id
		// must be refused with key_reused, whatever the task's state.
		re := req
		re.Prompt += " " // one extra space is another prompt
		ractx, ra := p.newAction(ctx, key, "reworded-old-key")
		rsub, outcome, detail := p.submit(ractx, key, re)
		switch outcome {
		case "":
			ra.TaskID = rsub.TaskID
			p.end(ra, "accepted", "a reworded retry under the old key was accepted")
		default:
			p.end(ra, outcome, detail)
		}
	}
	outcome, detail = p.poll(actx, sub.TaskID)
	p.end(a, outcome, detail)
	if outcome == "succeeded" && scenario == "plain" {
		p.succeeded = append(p.succeeded, sub.TaskID)
		if p.rng.IntN(3) == 0 {
			p.export(ctx, sub.TaskID)
		}
	}
	if scenario == "reworded" && time.Now().Before(p.w.stopNew) {
		// Rule 2 kept: the new parameters under a new id.
		re := req
		re.Prompt += " "
		nkey := imageclient.RequestID(fmt.Sprintf("poster:%d:%d", p.round, p.slot), re)
		nctx, na := p.newAction(ctx, nkey, "reworded-new-key")
		nsub, outcome, detail := p.submit(nctx, nkey, re)
		if outcome == "" {
			na.TaskID = nsub.TaskID
			p.remember(nsub.TaskID)
			outcome, detail = p.poll(nctx, nsub.TaskID)
		}
		p.end(na, outcome, detail)
	}
}

// export buys a contact sheet of a succeeded task: a billed action under
// its own request id. Half the time the client gives up before the
// export is done (the example's renderer takes 300 ms), as an impatient
// one does, then retries honestly: same id, no body, until answered. The
// retries must get the first run's stored answer (invariant 7).
func (p *player) export(ctx context.Context, taskID string) {
	key := fmt.Sprintf("export:%d:%d", p.round, p.slot)
	actx, a := p.newAction(ctx, key, "export")
	a.TaskID = taskID
	timeout := p.w.patience
	if p.rng.IntN(2) == 0 {
		timeout = time.Duration(30+p.rng.IntN(200)) * time.Millisecond
	}
	node := p.rng.IntN(len(p.w.nodes))
	last := ""
	for {
		if time.Now().After(p.w.deadline) {
			p.end(a, "unfinished", "export: "+last)
			return
		}
		status, code, err := p.exportOnce(actx, p.w.nodes[node], key, taskID, timeout)
		timeout = p.w.patience
		switch {
		case err != nil:
			last = err.Error()
		case status == http.StatusOK:
			p.end(a, "exported", "")
			// Every export whose client has another succeeded task
			// reuses its id once on it: a fingerprint that confused
			// the two tasks would answer the first's sheet.
			if len(p.succeeded) > 1 {
				p.reuseExportKey(ctx, key, taskID)
			}
			return
		case status/100 == 4 && code != string(idemgate.CodeRequestInProgress) && status != http.StatusRequestTimeout &&
			status != http.StatusTooEarly && status != http.StatusTooManyRequests:
			p.end(a, "rejected", fmt.Sprintf("export: %d %s", status, code))
			return
		default:
			last = fmt.Sprintf("%d %s", status, code)
		}
		node = (node + 1) % len(p.w.nodes)
		sleep(ctx, 100*time.Millisecond+time.Duration(p.rng.IntN(200))*time.Millisecond)
	}
}

// reuseExportKey sends the request id of an export of task used on
// another of the client's tasks: a client bug that must get 409
// key_reused, never the first export's answer (invariant 11) nor a run.
func (p *player) reuseExportKey(ctx context.Context, key, used string) {
	other := used
	for other == used {
		other = p.succeeded[p.rng.IntN(len(p.succeeded))]
	}
	actx, a := p.newAction(ctx, key, "export-reuse")
	a.TaskID = other
	for try := 0; ; try++ {
		if time.Now().After(p.w.deadline) {
			p.end(a, "unfinished", "export-reuse")
			return
		}
		status, code, err := p.exportOnce(actx, p.w.nodes[p.rng.IntN(len(p.w.nodes))], key, other, p.w.patience)
		switch {
		case err != nil, status >= 500, code == string(idemgate.CodeRequestInProgress):
		case status == http.StatusOK:
			p.end(a, "exported", "an export request id reused on another task was answered 200")
			return
		default:
			p.end(a, code, fmt.Sprintf("%d", status))
			return
		}
		sleep(ctx, 100*time.Millisecond+time.Duration(p.rng.IntN(200))*time.Millisecond)
	}
}

// waitFor polls the task until it shows state (true) or an end state or
// the deadline (false).
func (p *player) waitFor(ctx context.Context, id, state string) bool {
	for time.Now().Before(p.w.deadline) && ctx.Err() == nil {
		t, err := p.cl[p.rng.IntN(len(p.cl))].Task(ctx, id)
		if err == nil {
			switch t.Status {
			case state:
				return true
			case "succeeded", "failed", "cancelled":
				return false
			}
		}
		sleep(ctx, 100*time.Millisecond)
	}
	return false
}

// recover asks to put the client's failed task back in line until an
// answer says what became of it (2xx or 4xx).
func (p *player) recover(ctx context.Context, id string) {
	node := p.rng.IntN(len(p.w.nodes))
	for time.Now().Before(p.w.deadline) && ctx.Err() == nil {
		status, _ := p.post(ctx, p.w.nodes[node], "/v1/tasks/"+id+"/recover", "")
		if status != 0 && status < 500 {
			return
		}
		node = (node + 1) % len(p.w.nodes)
		sleep(ctx, 100*time.Millisecond+time.Duration(p.rng.IntN(200))*time.Millisecond)
	}
}

// setFailing adds the client's failed task to the ones its colleagues'
// recovers aim at (on), or takes it out (!on) before its owner recovers it.
func (p *player) setFailing(id string, on bool) {
	p.w.mu.Lock()
	defer p.w.mu.Unlock()
	if on {
		p.w.failing[p.tenant] = append(p.w.failing[p.tenant], failed{id, p.user})
		return
	}
	p.w.failing[p.tenant] = slices.DeleteFunc(p.w.failing[p.tenant], func(f failed) bool { return f.id == id })
}

// recoverColleagues tries, half the time, to recover a colleague's task
// (same tenant, another user) that failed keeping partial results and
// that its owner has not recovered yet: a Recover that checked the tenant
// alone would put it back in line. It must find nothing (invariant 3).
func (p *player) recoverColleagues(ctx context.Context) {
	p.w.mu.Lock()
	var ids []string
	for _, f := range p.w.failing[p.tenant] {
		if f.user != p.user {
			ids = append(ids, f.id)
		}
	}
	p.w.mu.Unlock()
	if len(ids) == 0 || p.rng.IntN(2) == 0 {
		return
	}
	_, _ = p.post(ctx, p.w.nodes[p.rng.IntN(len(p.w.nodes))], "/v1/tasks/"+ids[p.rng.IntN(len(ids))]+"/recover", "")
}

func (p *player) addPartial(id string) {
	p.w.mu.Lock()
	defer p.w.mu.Unlock()
	k := p.tenant + "\x00" + p.user
	p.w.partials[k] = append(p.w.partials[k], id)
}

// exportOnce sends one export request, giving up after timeout.
func (p *player) exportOnce(ctx context.Context, base, key, taskID string, timeout time.Duration) (int, string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/tasks/"+taskID+"/export", nil)
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Authorization", "Bearer "+p.token)
	req.Header.Set("Idempotency-Key", key)
	resp, err := p.http.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	var doc struct {
		Code string `json:"code"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&doc)
	return resp.StatusCode, doc.Code, nil
}

// revisit retries an earlier action, seconds or minutes later: byte for
// byte (it must replay the same task) or reworded (it must get key_reused).
func (p *player) revisit(ctx context.Context) {
	old := p.past[p.rng.IntN(len(p.past))]
	req, scenario := old.req, "late-retry"
	if p.rng.IntN(2) == 0 {
		req.Prompt, scenario = req.Prompt+" ", "late-reworded"
	}
	actx, a := p.newAction(ctx, old.key, scenario)
	sub, outcome, detail := p.submit(actx, old.key, req)
	if outcome == "" {
		a.TaskID, outcome = sub.TaskID, "accepted"
	}
	p.end(a, outcome, detail)
}

// submit sends the action until it is accepted ("" outcome), refused
// (key_reused, rejected) or the deadline passes (unfinished). Retries keep
// the id and the body; when one node gives up, the other is tried.
func (p *player) submit(ctx context.Context, key string, req imageclient.ImageRequest) (imageclient.Submission, string, string) {
	node := p.rng.IntN(len(p.cl))
	var last error
	for {
		if time.Now().After(p.w.deadline) {
			return imageclient.Submission{}, "unfinished", fmt.Sprintf("submit: %v", last)
		}
		sub, err := p.cl[node].SubmitImages(ctx, key, req)
		if err == nil {
			return sub, "", ""
		}
		last = err
		if errors.Is(err, imageclient.ErrKeyReused) {
			return sub, string(idemgate.CodeKeyReused), ""
		}
		var pr *imageclient.Problem
		if errors.As(err, &pr) && pr.Status/100 == 4 && pr.Code != string(idemgate.CodeRequestInProgress) &&
			pr.Status != http.StatusRequestTimeout && pr.Status != http.StatusTooEarly && pr.Status != http.StatusTooManyRequests {
			return sub, "rejected", pr.Error()
		}
		node = (node + 1) % len(p.cl)
		sleep(ctx, 100*time.Millisecond+time.Duration(p.rng.IntN(200))*time.Millisecond)
	}
}

// poll reads the task until it ends (succeeded, failed, cancelled) or the
// deadline passes. A task that stays uncertain is polled too: the example
// reconciles it.
func (p *player) poll(ctx context.Context, id string) (string, string) {
	wait := 200 * time.Millisecond
	var last string
	for {
		if time.Now().After(p.w.deadline) {
			return "unfinished", "poll: " + last
		}
		t, err := p.cl[p.rng.IntN(len(p.cl))].Task(ctx, id)
		if err == nil {
			switch t.Status {
			case "succeeded", "failed", "cancelled":
				return t.Status, t.Error
			}
			last = "status " + t.Status
			wait = min(max(t.PollAfter, 200*time.Millisecond), 2*time.Second)
		} else {
			last = err.Error()
		}
		sleep(ctx, wait)
	}
}

// cancel asks to cancel the task until an answer says what became of it
// (200 with its end state, or a 4xx), switching nodes on a transport error
// or a 5xx; the route is idempotent. What the answer says is checked
// against how the task ends (invariant 8).
func (p *player) cancel(ctx context.Context, id string) {
	node := p.rng.IntN(len(p.w.nodes))
	for time.Now().Before(p.w.deadline) && ctx.Err() == nil {
		status, _ := p.post(ctx, p.w.nodes[node], "/v1/tasks/"+id+"/cancel", "")
		if status != 0 && status < 500 {
			return
		}
		node = (node + 1) % len(p.w.nodes)
		sleep(ctx, 100*time.Millisecond+time.Duration(p.rng.IntN(200))*time.Millisecond)
	}
}

// post sends one POST with the client's token (and an Idempotency-Key
// when key is set) and returns the status, 0 for a transport error.
func (p *player) post(ctx context.Context, base, path, key string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+path, nil)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Authorization", "Bearer "+p.token)
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := p.http.Do(req)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

// snoop tries a task of another identity once: a poll, a cancel, an
// export (under the snooper's own request id) or a recover. Each must
// find nothing (404) and change nothing (invariants 3 and 8).
func (p *player) snoop(ctx context.Context) {
	p.w.mu.Lock()
	var ids []string
	for ident, got := range p.w.created {
		if ident != p.tenant+"\x00"+p.user {
			ids = append(ids, got...)
		}
	}
	p.w.mu.Unlock()
	if len(ids) == 0 {
		return
	}
	id := ids[p.rng.IntN(len(ids))]
	base := p.w.nodes[p.rng.IntN(len(p.w.nodes))]
	p.w.mu.Lock()
	var partials, colleagues []string
	for ident, got := range p.w.partials {
		if ident == p.tenant+"\x00"+p.user {
			continue
		}
		partials = append(partials, got...)
		if t, _, _ := strings.Cut(ident, "\x00"); t == p.tenant {
			// The newest of a colleague's: most likely still failed.
			colleagues = append(colleagues, got[max(0, len(got)-2):]...)
		}
	}
	p.w.mu.Unlock()
	if len(colleagues) > 0 && p.rng.IntN(4) != 0 {
		// A colleague's (same tenant, another user) task that kept
		// partial results: a Recover that checked the tenant alone
		// would put it back in line.
		_, _ = p.post(ctx, base, "/v1/tasks/"+colleagues[p.rng.IntN(len(colleagues))]+"/recover", "")
		return
	}
	if len(partials) > 0 && p.rng.IntN(2) == 0 {
		// A task that kept partial results: a recover that reached it
		// would succeed, so this is the one that must find nothing.
		_, _ = p.post(ctx, base, "/v1/tasks/"+partials[p.rng.IntN(len(partials))]+"/recover", "")
		return
	}
	switch p.rng.IntN(4) {
	case 0:
		_, _ = p.cl[0].Task(ctx, id)
	case 1:
		_, _ = p.post(ctx, base, "/v1/tasks/"+id+"/cancel", "")
	case 2:
		_, _ = p.post(ctx, base, "/v1/tasks/"+id+"/export", fmt.Sprintf("snoop:%d:%d", p.round, p.slot))
	case 3:
		_, _ = p.post(ctx, base, "/v1/tasks/"+id+"/recover", "")
	}
}

func (p *player) remember(id string) {
	p.w.mu.Lock()
	defer p.w.mu.Unlock()
	k := p.tenant + "\x00" + p.user
	p.w.created[k] = append(p.w.created[k], id)
}

// newRand is the random source of client n of a run with seed.
func newRand(seed int64, n uint64) *rand.Rand { return rand.New(rand.NewPCG(uint64(seed), n)) }

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// mintToken returns an HS256 bearer token as the example expects.
func mintToken(secret []byte, tenant, user string) (string, error) {
	now := time.Now()
	return jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{
		"tenant": tenant, "sub": user, "iat": now.Unix(), "exp": now.Add(24 * time.Hour).Unix(),
	}).SignedString(secret)
}

// ---- recording ----

// recording is an http.RoundTripper that records every exchange in the
// history: what was sent (key, parameters) and what came back.
type recording struct {
	rec  *recorder
	base http.RoundTripper
	acks *acks
	aims *aims
}

func (t *recording) RoundTrip(req *http.Request) (*http.Response, error) {
	ac, _ := req.Context().Value(actionKey{}).(actionCtx)
	q := Request{Client: ac.client, Action: ac.action, Tenant: ac.tenant, User: ac.user,
		Node: req.URL.Host, Method: req.Method, Route: routeOf(req.Method, req.URL.Path), Sent: time.Now()}
	if rest, ok := strings.CutPrefix(req.URL.Path, "/v1/tasks/"); ok {
		q.PathTask, _, _ = strings.Cut(rest, "/")
	}
	if q.Route == routeExport {
		q.Key = req.Header.Get("Idempotency-Key")
		t.aims.exportSent(req.URL.Host)
	}
	if q.Route == routeSubmit {
		q.Key = req.Header.Get("Idempotency-Key")
		if req.GetBody != nil {
			if rc, err := req.GetBody(); err == nil {
				b, _ := io.ReadAll(rc)
				rc.Close()
				var ir imageclient.ImageRequest
				if json.Unmarshal(b, &ir) == nil {
					pp := Params{Prompt: ir.Prompt, AspectRatio: ir.AspectRatio, N: ir.N, ReferenceImage: ir.ReferenceImage}
					if pp.AspectRatio == "" {
						pp.AspectRatio = "1:1"
					}
					if pp.N == 0 {
						pp.N = 1
					}
					q.Params, q.FP = &pp, pp.FP()
				}
			}
		}
	}
	resp, err := t.base.RoundTrip(req)
	if err != nil {
		q.Done, q.Err = time.Now(), err.Error()
		t.rec.request(q)
		return nil, err
	}
	body, rerr := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	resp.Body.Close()
	q.Done = time.Now()
	if rerr != nil {
		// The answer was cut off: to the client it is a transport error.
		q.Err = "read body: " + rerr.Error()
		t.rec.request(q)
		return nil, rerr
	}
	resp.Body = io.NopCloser(bytes.NewReader(body))
	q.Status = resp.StatusCode
	if req.Method == http.MethodPost && q.Status/100 == 2 {
		t.acks.got(req.URL.Host, fmt.Sprintf("%s %d", q.Route, q.Status))
	}
	q.Replayed = resp.Header.Get("Idempotent-Replayed") == "true"
	if q.Route == routeExport {
		var doc struct {
			Code     string `json:"code"`
			TaskID   string `json:"task_id"`
			ExportID int64  `json:"export_id"`
			Sheet    string `json:"sheet"`
		}
		_ = json.Unmarshal(body, &doc)
		q.Code, q.TaskID, q.ExportID = doc.Code, doc.TaskID, doc.ExportID
		if doc.Sheet != "" {
			q.Images = 1
			if !isPNGDataURL(doc.Sheet) {
				q.BadImages = 1
			}
		}
		t.rec.request(q)
		return resp, nil
	}
	var doc struct {
		Code   string   `json:"code"`
		TaskID string   `json:"task_id"`
		Status any      `json:"status"` // a problem's status is a number, a task's a string
		Images []string `json:"images"`
	}
	_ = json.Unmarshal(body, &doc)
	q.Code, q.TaskID = doc.Code, doc.TaskID
	if s, ok := doc.Status.(string); ok {
		q.TaskSt = s
	}
	q.Images = len(doc.Images)
	for _, u := range doc.Images {
		if !isPNGDataURL(u) {
			q.BadImages++
		}
	}
	t.rec.request(q)
	return resp, nil
}

// routeOf names the route template of a request path.
func routeOf(method, path string) string {
	switch {
	case method == http.MethodPost && path == "/v1/images":
		return routeSubmit
	case method == http.MethodGet && strings.HasPrefix(path, "/v1/tasks/"):
		return routeTask
	case method == http.MethodPost && strings.HasPrefix(path, "/v1/tasks/") && strings.HasSuffix(path, "/cancel"):
		return routeCancel
	case method == http.MethodPost && strings.HasPrefix(path, "/v1/tasks/") && strings.HasSuffix(path, "/export"):
		return routeExport
	case method == http.MethodPost && strings.HasPrefix(path, "/v1/tasks/") && strings.HasSuffix(path, "/recover"):
		return routeRecover
	}
	return method + " " + path
}

// isPNGDataURL reports whether u is a data URL of a decodable PNG image.
func isPNGDataURL(u string) bool {
	const prefix = "data:image/png;base64,"
	if !strings.HasPrefix(u, prefix) {
		return false
	}
	b, err := base64.StdEncoding.DecodeString(u[len(prefix):])
	if err != nil {
		return false
	}
	_, err = png.DecodeConfig(bytes.NewReader(b))
	return err == nil
}
