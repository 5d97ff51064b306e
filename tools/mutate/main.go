// Command mutate measures what the chaos soak catches: it writes each of a
// dozen realistic bugs (mutations.go) into a scratch copy of the
// repository, one at a time, runs the soak against it, and reports which
// the soak caught (an invariant violated, exit 1) and which it missed.
//
//	go run ./tools/mutate -check                      # does each mutation still apply?
//	go run ./tools/mutate -seeds 1,2 -duration 90s    # the score (make mutate)
//	go run ./tools/mutate -only pgs-turn-zero -seeds 3
//
// The repository (-src, default the workspace's root) is copied without
// its .git into a scratch directory per concurrent run (-parallel), and
// each mutation is applied there and taken back after its run, so the
// build cache serves the unchanged packages. The soak's own binary is
// built once from the unmutated copy: its checker uses the keyspace, which
// a mutation may break. Before the mutations, each seed gets a baseline
// run on the unmutated copy per records store the mutations use; a
// mutation counts as caught at a seed only when it violates an invariant
// that its store's baseline at that seed did not.
//
// Exit status: 0 when the runs were made, 1 when a mutation does not
// apply or a run could not be made, 2 on bad flags.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

type options struct {
	src      string
	seeds    []int64
	duration time.Duration
	bound    time.Duration
	modes    string
	only     map[string]bool
	parallel int
	check    bool
	list     bool
	keep     bool
	asJSON   bool
}

func parseOptions(args []string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("mutate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.src, "src", "", "repository to copy and mutate; default: the workspace's root (go env GOWORK)")
	seeds := fs.String("seeds", "1,2", "comma-separated soak seeds; every mutation runs at each")
	fs.DurationVar(&o.duration, "duration", 90*time.Second, "fault window of each soak run")
	fs.DurationVar(&o.bound, "bound", 45*time.Second, "the soak's liveness bound after healing")
	fs.StringVar(&o.modes, "modes", "all", "the soak's -modes")
	only := fs.String("only", "", "comma-separated mutation names; default: all")
	fs.IntVar(&o.parallel, "parallel", 1, "soak runs at once (each has its own scratch copy)")
	fs.BoolVar(&o.check, "check", false, "only check that every mutation applies to -src")
	fs.BoolVar(&o.list, "list", false, "list the mutations")
	fs.BoolVar(&o.keep, "keep", false, "keep the scratch copies")
	fs.BoolVar(&o.asJSON, "json", false, "print the results as JSON")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	for _, s := range strings.Split(*seeds, ",") {
		n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
		if err != nil {
			return o, fmt.Errorf("mutate: -seeds %q: %w", *seeds, err)
		}
		o.seeds = append(o.seeds, n)
	}
	if *only != "" {
		o.only = map[string]bool{}
		for _, n := range strings.Split(*only, ",") {
			if _, ok := find(strings.TrimSpace(n)); !ok {
				return o, fmt.Errorf("mutate: unknown mutation %q (-list names them)", n)
			}
			o.only[strings.TrimSpace(n)] = true
		}
	}
	if o.parallel < 1 || o.duration <= 0 {
		return o, errors.New("mutate: -parallel and -duration must be positive")
	}
	return o, nil
}

func find(name string) (mutation, bool) {
	for _, m := range mutations {
		if m.Name == name {
			return m, true
		}
	}
	return mutation{}, false
}

// result is one soak run: a mutation (or the baseline) at a seed.
type result struct {
	Mutation string   `json:"mutation"` // "" for the baseline
	Seed     int64    `json:"seed"`
	Store    string   `json:"store"`
	Verdict  string   `json:"verdict"` // caught, missed, error
	Violated []int    `json:"violated,omitempty"`
	Examples []string `json:"examples,omitempty"`
	Took     string   `json:"took"`
	Detail   string   `json:"detail,omitempty"`
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, err := parseOptions(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	if o.list {
		tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
		for _, m := range mutations {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", m.Name, m.Pkg, m.Store, m.What)
		}
		tw.Flush()
		return 0
	}
	if o.src == "" {
		out, err := exec.Command("go", "env", "GOWORK").Output()
		if err != nil || strings.TrimSpace(string(out)) == "" || strings.TrimSpace(string(out)) == "off" {
			fmt.Fprintln(stderr, "mutate: not inside the idemgate workspace; pass -src")
			return 2
		}
		o.src = filepath.Dir(strings.TrimSpace(string(out)))
	}
	var ms []mutation
	for _, m := range mutations {
		if o.only == nil || o.only[m.Name] {
			ms = append(ms, m)
		}
	}
	// Every mutation must apply, whatever runs: one that silently did not
	// would count as missed.
	bad := 0
	for _, m := range ms {
		if err := m.applies(o.src); err != nil {
			fmt.Fprintf(stdout, "%-32s does not apply: %v\n", m.Name, err)
			bad++
		} else if o.check {
			fmt.Fprintf(stdout, "%-32s applies\n", m.Name)
		}
	}
	if o.check || bad > 0 {
		if bad > 0 {
			fmt.Fprintf(stdout, "%d of %d mutations do not apply to %s\n", bad, len(ms), o.src)
			return 1
		}
		return 0
	}

	scratch, err := os.MkdirTemp("", "idemgate-mutate-")
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	if !o.keep {
		defer os.RemoveAll(scratch)
	}
	logf := func(format string, a ...any) {
		fmt.Fprintf(stderr, "mutate: %s "+format+"\n", append([]any{time.Now().UTC().Format("15:04:05")}, a...)...)
	}
	var copies []string
	for i := range o.parallel {
		dir := filepath.Join(scratch, fmt.Sprintf("copy%d", i))
		if err := copyTree(o.src, dir); err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
		copies = append(copies, dir)
	}
	// Warm the build cache for the example (the soak builds it with
	// -trimpath, so one build serves every copy): a cold build on a
	// loaded machine takes minutes.
	warm := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", os.DevNull, "./example")
	warm.Dir = copies[0]
	if out, err := warm.CombinedOutput(); err != nil {
		fmt.Fprintf(stderr, "mutate: build the unmutated example: %v\n%s", err, out)
		return 1
	}
	chaos := filepath.Join(scratch, "chaos")
	build := exec.CommandContext(ctx, "go", "build", "-o", chaos, "./tools/chaos")
	build.Dir = copies[0]
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(stderr, "mutate: build the soak from the unmutated copy: %v\n%s", err, out)
		return 1
	}
	logf("copied %s to %d scratch copies in %s; %d mutations × %d seeds of %v", o.src, len(copies), scratch, len(ms), len(o.seeds), o.duration)

	type job struct {
		m     *mutation // nil: the baseline
		seed  int64
		store string
	}
	// A baseline per seed and per store the mutations run with: the
	// soak in Postgres mode (an Atomic export, invariant 7 strict) is
	// not the soak in Redis mode.
	var stores []string
	for _, m := range ms {
		if !slices.Contains(stores, m.Store) {
			stores = append(stores, m.Store)
		}
	}
	var jobs []job
	for _, s := range o.seeds {
		for _, st := range stores {
			jobs = append(jobs, job{nil, s, st})
		}
	}
	for _, s := range o.seeds {
		for i := range ms {
			jobs = append(jobs, job{&ms[i], s, ms[i].Store})
		}
	}
	queue := make(chan job)
	var (
		mu      sync.Mutex
		results []result
		wg      sync.WaitGroup
	)
	for _, dir := range copies {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range queue {
				r := runOne(ctx, chaos, dir, j.m, j.seed, j.store, o)
				if r.Verdict == "error" && ctx.Err() == nil {
					// A run that could not start (a free port taken
					// meanwhile, a build beside other builds) gets one
					// more try; a run that could not be judged is no
					// verdict either way.
					logf("%s seed %d: %s; once more", nameOf(j.m), j.seed, r.Detail)
					r = runOne(ctx, chaos, dir, j.m, j.seed, j.store, o)
				}
				logf("%s seed %d %s: %s %v (%s) %s", nameOf(j.m), j.seed, j.store, r.Verdict, r.Violated, r.Took, r.Detail)
				mu.Lock()
				results = append(results, r)
				mu.Unlock()
			}
		}()
	}
	for _, j := range jobs {
		select {
		case queue <- j:
		case <-ctx.Done():
		}
	}
	close(queue)
	wg.Wait()
	return printScore(stdout, ms, o, results)
}

func nameOf(m *mutation) string {
	if m == nil {
		return "baseline"
	}
	return m.Name
}

// runOne applies m (nil: none) in dir, runs the soak, and takes m back.
func runOne(ctx context.Context, chaos, dir string, m *mutation, seed int64, store string, o options) result {
	r := result{Mutation: nameOf(m), Seed: seed, Store: store}
	if m == nil {
		r.Mutation = ""
	}
	if m != nil {
		restore, err := m.apply(dir)
		if err != nil {
			r.Verdict, r.Detail = "error", "does not apply: "+err.Error()
			return r
		}
		defer restore()
	}
	began := time.Now()
	args := []string{"-root", dir, "-seed", fmt.Sprint(seed), "-duration", o.duration.String(), "-bound", o.bound.String(),
		"-modes", o.modes, "-store", store, "-json", "-q"}
	cmd := exec.CommandContext(ctx, chaos, args...)
	cmd.Dir = dir
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	r.Took = time.Since(began).Round(time.Second).String()
	code := 0
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		code = ee.ExitCode()
	case err != nil:
		r.Verdict, r.Detail = "error", err.Error()
		return r
	}
	var sum struct {
		Invariants []struct {
			N        int      `json:"n"`
			Holds    bool     `json:"holds"`
			Examples []string `json:"examples"`
		} `json:"invariants"`
	}
	if code == 2 || json.Unmarshal(out.Bytes(), &sum) != nil {
		r.Verdict, r.Detail = "error", fmt.Sprintf("exit %d: %s", code, lastLines(errOut.String(), 6))
		return r
	}
	for _, inv := range sum.Invariants {
		if !inv.Holds {
			r.Violated = append(r.Violated, inv.N)
			if len(inv.Examples) > 0 {
				r.Examples = append(r.Examples, fmt.Sprintf("%d: %s", inv.N, inv.Examples[0]))
			}
		}
	}
	r.Verdict = "violated"
	if code == 0 {
		r.Verdict = "holds"
	}
	return r
}

// judge turns a mutant's run into caught or missed against its seed's
// baseline: only invariants the baseline kept count.
func judge(r, base result) result {
	if r.Verdict == "error" {
		return r
	}
	broke := map[int]bool{}
	for _, n := range base.Violated {
		broke[n] = true
	}
	r.Verdict = "missed"
	for _, n := range r.Violated {
		if !broke[n] {
			r.Verdict = "caught"
		}
	}
	return r
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

// printScore prints a table of verdicts, mutation by seed, and the catch
// rate per seed (only seeds whose baseline held count).
func printScore(w io.Writer, ms []mutation, o options, results []result) int {
	if o.asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(results)
	}
	type baseKey struct {
		seed  int64
		store string
	}
	at := map[string]map[int64]result{}
	bases := map[baseKey]result{}
	for _, r := range results {
		if r.Mutation == "" {
			bases[baseKey{r.Seed, r.Store}] = r
			continue
		}
		if at[r.Mutation] == nil {
			at[r.Mutation] = map[int64]result{}
		}
		at[r.Mutation][r.Seed] = r
	}
	for _, bySeed := range at {
		for s, r := range bySeed {
			base, ok := bases[baseKey{s, r.Store}]
			switch {
			case !ok:
				r.Verdict, r.Detail = "error", "no baseline run at this seed and store"
			case base.Verdict == "error":
				r.Verdict, r.Detail = "error", "the baseline at this seed and store could not run: "+base.Detail
			default:
				r = judge(r, base)
			}
			bySeed[s] = r
		}
	}
	cell := func(r result, ok bool) string {
		switch {
		case !ok:
			return "-"
		case len(r.Violated) > 0:
			return fmt.Sprintf("%s %v", r.Verdict, r.Violated)
		case r.Detail != "":
			return r.Verdict + " (" + r.Detail + ")"
		}
		return r.Verdict
	}
	code := 0
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "mutation\tpackage\tstore")
	for _, s := range o.seeds {
		fmt.Fprintf(tw, "\tseed %d", s)
	}
	fmt.Fprintln(tw)
	var stores []string
	for _, m := range ms {
		if !slices.Contains(stores, m.Store) {
			stores = append(stores, m.Store)
		}
	}
	for _, st := range stores {
		fmt.Fprintf(tw, "(baseline, no mutation)\t\t%s", st)
		for _, s := range o.seeds {
			r, ok := bases[baseKey{s, st}]
			fmt.Fprintf(tw, "\t%s", cell(r, ok))
		}
		fmt.Fprintln(tw)
	}
	caught := map[int64]int{}
	for _, m := range ms {
		fmt.Fprintf(tw, "%s\t%s\t%s", m.Name, m.Pkg, m.Store)
		for _, s := range o.seeds {
			r, ok := at[m.Name][s]
			fmt.Fprintf(tw, "\t%s", cell(r, ok))
			if r.Verdict == "caught" {
				caught[s]++
			}
			if r.Verdict == "error" {
				code = 1
			}
		}
		fmt.Fprintln(tw)
	}
	tw.Flush()
	fmt.Fprintln(w)
	for _, s := range o.seeds {
		note := ""
		for _, st := range stores {
			if base := bases[baseKey{s, st}]; base.Verdict != "holds" {
				note += fmt.Sprintf(" (the %s baseline %s %v at this seed: those invariants count for none of its mutations)", st, base.Verdict, base.Violated)
			}
		}
		fmt.Fprintf(w, "seed %d: caught %d of %d in %v runs%s\n", s, caught[s], len(ms), o.duration, note)
	}
	for _, r := range results {
		for _, e := range r.Examples {
			fmt.Fprintf(w, "  %s seed %d (%s): invariant %s\n", nameOf0(r.Mutation), r.Seed, r.Store, e)
		}
	}
	return code
}

func nameOf0(s string) string {
	if s == "" {
		return "baseline"
	}
	return s
}

// applies reports whether every edit of m applies to the tree at root.
func (m mutation) applies(root string) error {
	files := map[string]string{}
	for _, e := range m.Edits {
		src, ok := files[e.File]
		if !ok {
			b, err := os.ReadFile(filepath.Join(root, e.File))
			if err != nil {
				return err
			}
			src = string(b)
		}
		out, err := e.replace(src)
		if err != nil {
			return err
		}
		files[e.File] = out
	}
	return nil
}

func (e edit) replace(src string) (string, error) {
	n := strings.Count(src, e.Old)
	switch {
	case n == 0:
		return "", fmt.Errorf("%s: %q not found (the code moved: rewrite the mutation)", e.File, short(e.Old))
	case n > 1 && !e.All:
		return "", fmt.Errorf("%s: %q found %d times, want once", e.File, short(e.Old), n)
	}
	return strings.ReplaceAll(src, e.Old, e.New), nil
}

func short(s string) string {
	if len(s) > 60 {
		return s[:60] + "…"
	}
	return s
}

// apply writes m into the tree at root and returns what takes it back.
func (m mutation) apply(root string) (restore func(), err error) {
	orig := map[string][]byte{}
	restore = func() {
		for f, b := range orig {
			_ = os.WriteFile(filepath.Join(root, f), b, 0o644)
		}
	}
	for _, e := range m.Edits {
		path := filepath.Join(root, e.File)
		b, err := os.ReadFile(path)
		if err != nil {
			restore()
			return nil, err
		}
		if _, seen := orig[e.File]; !seen {
			orig[e.File] = b
		}
		out, err := e.replace(string(b))
		if err != nil {
			restore()
			return nil, err
		}
		if err := os.WriteFile(path, []byte(out), 0o644); err != nil {
			restore()
			return nil, err
		}
	}
	return restore, nil
}

// copyTree copies the repository at src to dst, without .git.
func copyTree(src, dst string) error {
	return filepath.WalkDir(src, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		if d.IsDir() && d.Name() == ".git" {
			return filepath.SkipDir
		}
		target := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		if !d.Type().IsRegular() {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		return os.WriteFile(target, b, info.Mode().Perm())
	})
}
