package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/loopbus/loopbus/internal/testnats"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// chaosSeedEnv overrides the seed of a chaos test's random choices, to
// replay the kill points of a failed run.
const chaosSeedEnv = "LOOPBUS_CHAOS_SEED"

// chaosRand returns the test's seeded source of random choices and logs the
// seed, so a failing run can be repeated with the same kill points.
func chaosRand(t *testing.T) *rand.Rand {
	t.Helper()
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv(chaosSeedEnv); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("%s=%q: %v", chaosSeedEnv, s, err)
		}
		seed = n
	}
	t.Logf("chaos seed %d (repeat with %s=%d)", seed, chaosSeedEnv, seed)
	return rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
}

// between returns a random duration in [lo, hi).
func between(rng *rand.Rand, lo, hi time.Duration) time.Duration {
	if hi <= lo {
		return lo
	}
	return lo + time.Duration(rng.Int64N(int64(hi-lo)))
}

// proc is one long-running loopbus process that a chaos test starts,
// SIGKILLs and starts again. Every start appends to the same log file. Its
// methods are safe for concurrent use and never call t, so a killer
// goroutine may use them.
type proc struct {
	label   string
	args    []string
	env     []string
	logPath string

	mu     sync.Mutex
	cmd    *exec.Cmd
	done   chan struct{} // closed when the current process has exited
	killed bool          // the current process was killed by the test
	starts int
	exit   error // how the current process exited, once done
}

// start runs the process (again) with its arguments plus extra; it fails
// if the previous process is still running.
func (p *proc) start(extra ...string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		select {
		case <-p.done:
		default:
			return fmt.Errorf("%s: already running", p.label)
		}
	}
	logf, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	p.starts++
	args := append(slices.Clone(p.args), extra...)
	fmt.Fprintf(logf, "=== start #%d at %s: loopbus %s\n", p.starts, time.Now().Format("15:04:05.000"), strings.Join(args, " "))
	cmd := exec.Command(binary, args...)
	cmd.Env = p.env
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("%s: %w", p.label, err)
	}
	done := make(chan struct{})
	p.cmd, p.done, p.killed, p.exit = cmd, done, false, nil
	go func() {
		err := cmd.Wait()
		logf.Close()
		p.mu.Lock()
		p.exit = err
		p.mu.Unlock()
		close(done)
	}()
	return nil
}

// kill sends SIGKILL to the running process and waits until it is gone.
// It returns when it was killed, or at once if it was not running.
func (p *proc) kill() error {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	if cmd == nil {
		p.mu.Unlock()
		return nil
	}
	p.killed = true
	p.mu.Unlock()
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("%s: SIGKILL: %w", p.label, err)
	}
	select {
	case <-done:
		return nil
	case <-time.After(30 * time.Second):
		return fmt.Errorf("%s: still running 30s after SIGKILL", p.label)
	}
}

// restart kills the process and starts it again with extra arguments.
func (p *proc) restart(extra ...string) error {
	if err := p.kill(); err != nil {
		return err
	}
	return p.start(extra...)
}

// crashed describes an exit the test did not cause ("" while the process
// runs or after the test killed it): a service must never exit by itself.
func (p *proc) crashed() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || p.killed {
		return ""
	}
	select {
	case <-p.done:
		return fmt.Sprintf("%s exited by itself (start #%d): %v", p.label, p.starts, p.exit)
	default:
		return ""
	}
}

// startCount is how often the process was started.
func (p *proc) startCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.starts
}

// awaitLogged waits until the running process (since its latest start)
// has logged a line holding msg, for up to two minutes: a process that
// never does fails the test by the lack of progress it causes. It
// reports false if ctx ended first.
func (p *proc) awaitLogged(ctx context.Context, msg string) bool {
	p.mu.Lock()
	marker := fmt.Sprintf("=== start #%d ", p.starts)
	p.mu.Unlock()
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		if raw, err := os.ReadFile(p.logPath); err == nil {
			if _, since, ok := strings.Cut(string(raw), marker); ok && strings.Contains(since, msg) {
				return true
			}
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(50 * time.Millisecond):
		}
	}
	return true
}

// logTail returns the last n lines of the process's log.
func (p *proc) logTail(n int) string {
	raw, err := os.ReadFile(p.logPath)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(raw), "\n"), "\n")
	if len(lines) > n {
		lines = append([]string{fmt.Sprintf("... (%d earlier lines)", len(lines)-n)}, lines[len(lines)-n:]...)
	}
	return strings.Join(lines, "\n")
}

// cluster is a `loopbus nats` process on a data directory and port of its
// own, plus service processes connected to it with --nats. Its cleanup
// kills every process and, if the test failed, prints their logs.
type cluster struct {
	t    *testing.T
	dir  string // logs, agent records, release markers
	data string
	addr string
	url  string
	env  []string
	nats *proc

	mu    sync.Mutex
	procs []*proc
}

// newCluster starts `loopbus nats` and waits until it accepts connections.
func newCluster(t *testing.T) *cluster {
	t.Helper()
	dir := t.TempDir()
	tmp := filepath.Join(dir, "tmp")
	if err := os.MkdirAll(filepath.Join(dir, "release"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		t.Fatal(err)
	}
	addr := testnats.FreeAddr(t)
	c := &cluster{
		t: t, dir: dir, data: filepath.Join(dir, "data"), addr: addr, url: "nats://" + addr,
		// Workspaces of workers and validators stay inside the test.
		env: append(testEnv(t), "TMPDIR="+tmp),
	}
	t.Cleanup(c.stop)
	c.nats = c.spawn("nats", "nats", "--data", c.data, "--listen", addr, "--log-level", "info")
	c.waitNATS()
	return c
}

// spawn starts a process and registers it with the cluster.
func (c *cluster) spawn(label string, args ...string) *proc {
	c.t.Helper()
	p := &proc{label: label, args: args, env: c.env, logPath: filepath.Join(c.dir, label+".log")}
	c.mu.Lock()
	c.procs = append(c.procs, p)
	c.mu.Unlock()
	if err := p.start(); err != nil {
		c.t.Fatal(err)
	}
	return p
}

// service starts `loopbus <service> args... --nats URL` under label.
func (c *cluster) service(label, service string, args ...string) *proc {
	c.t.Helper()
	return c.spawn(label, append(append([]string{service}, args...), "--nats", c.url, "--log-level", "info")...)
}

// all starts one orchestrator, validator and projector and the given agent
// worker replicas (ids worker-a, worker-b, ...; --ack-wait ackWait).
func (c *cluster) all(workers, concurrency int, ackWait time.Duration) map[string]*proc {
	c.t.Helper()
	ps := map[string]*proc{
		"orchestrator": c.service("orchestrator", "orchestrator"),
		"validator":    c.service("validator", "validator", "--ack-wait", ackWait.String()),
		"projector":    c.service("projector", "projector"),
	}
	for i := range workers {
		id := "worker-" + string(rune('a'+i))
		ps[id] = c.service(id, "agentworker", "--id", id, "--concurrency", strconv.Itoa(concurrency),
			"--ack-wait", ackWait.String(), "--work-dir", filepath.Join(c.dir, "work-"+id))
	}
	return ps
}

// waitNATS waits until the server accepts TCP connections.
func (c *cluster) waitNATS() {
	c.t.Helper()
	eventually(c.t, 60*time.Second, "loopbus nats to listen on "+c.addr, func() bool {
		if msg := c.nats.crashed(); msg != "" {
			c.t.Fatal(msg)
		}
		conn, err := net.DialTimeout("tcp", c.addr, time.Second)
		if err != nil {
			return false
		}
		conn.Close()
		return true
	})
}

// global is the CLI flags that reach this cluster's server.
func (c *cluster) global() []string { return []string{"--nats", c.url} }

// checkAlive fails the test if a process exited without being killed.
func (c *cluster) checkAlive() {
	c.t.Helper()
	c.mu.Lock()
	procs := slices.Clone(c.procs)
	c.mu.Unlock()
	for _, p := range procs {
		if msg := p.crashed(); msg != "" {
			c.t.Fatalf("%s\nlog:\n%s", msg, p.logTail(40))
		}
	}
}

func (c *cluster) stop() {
	c.mu.Lock()
	procs := slices.Clone(c.procs)
	c.mu.Unlock()
	for _, p := range procs {
		_ = p.kill()
	}
	if !c.t.Failed() {
		return
	}
	for _, p := range procs {
		c.t.Logf("----- log of %s (%d starts) -----\n%s", p.label, p.startCount(), p.logTail(120))
	}
	if raw, err := os.ReadFile(filepath.Join(c.dir, "runs.log")); err == nil {
		c.t.Logf("----- agent and check runs -----\n%s", raw)
	}
}

// release lets held agents (name SESSION.STEP) or validate commands (name
// SESSION.verdict) of a session go on.
func (c *cluster) release(name string) {
	c.t.Helper()
	if err := os.WriteFile(filepath.Join(c.dir, "release", name), nil, 0o644); err != nil {
		c.t.Fatal(err)
	}
}

// runs counts the records of agent and validate-command starts: keys are
// "SESSION STEP ITERATION" for agents, "check SESSION JOB" for validate
// commands.
func (c *cluster) runs() map[string]int {
	c.t.Helper()
	raw, err := os.ReadFile(filepath.Join(c.dir, "runs.log"))
	if errors.Is(err, os.ErrNotExist) {
		return map[string]int{}
	}
	if err != nil {
		c.t.Fatal(err)
	}
	n := map[string]int{}
	for _, l := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
		if l != "" {
			n[l]++
		}
	}
	return n
}

// chaosStep is one step of a generated pipeline. Each agent records its
// start in runs.log and writes one output derived only from its inputs, so
// two sessions over the same input produce identical artifacts.
type chaosStep struct {
	name     string
	requires []string
	// hold: the agent waits for release(SESSION + "." + STEP) before
	// writing.
	hold bool
	// passAt > 0 makes the output a JSON document checked by a schema,
	// invalid before iteration passAt.
	passAt int
	// holdCheck adds a validate command that records its start and waits
	// for release(SESSION + ".verdict").
	holdCheck bool
}

func (s chaosStep) output() string {
	if s.passAt > 0 {
		return s.name + ".json"
	}
	return s.name + ".txt"
}

// iterations is how many iterations the step needs to pass.
func (s chaosStep) iterations() int { return max(s.passAt, 1) }

// writePipeline writes the agent scripts, an input file and a pipeline of
// steps into c.dir and returns the pipeline's and the input's paths.
func (c *cluster) writePipeline(name string, steps []chaosStep) (pipelineFile, input string) {
	c.t.Helper()
	agent := `set -eu
echo "$LOOPBUS_SESSION $LOOPBUS_STEP $LOOPBUS_ITERATION" >> "$RUNS"
if [ "$HOLD" = yes ]; then
  i=0
  while [ ! -e "$RELEASE_DIR/$LOOPBUS_SESSION.$LOOPBUS_STEP" ]; do sleep 0.1; i=$((i+1)); [ $i -lt 1800 ] || exit 9; done
fi
out="$LOOPBUS_OUTPUT_DIR/$OUT"
if [ "$PASS_AT" -gt 0 ]; then
  if [ "$LOOPBUS_ITERATION" -lt "$PASS_AT" ]; then printf '{"count": "many"}' > "$out"
  else printf '{"count": %d}' "$(cat "$LOOPBUS_INPUT_DIR"/* | wc -c)" > "$out"; fi
else
  { echo "$LOOPBUS_STEP"; cat "$LOOPBUS_INPUT_DIR"/*; } > "$out"
fi
`
	check := `set -eu
echo "check $LOOPBUS_SESSION $LOOPBUS_JOB" >> "$RUNS"
i=0
while [ ! -e "$RELEASE_DIR/$LOOPBUS_SESSION.verdict" ]; do sleep 0.1; i=$((i+1)); [ $i -lt 1800 ] || exit 9; done
`
	var y strings.Builder
	fmt.Fprintf(&y, "name: %s\nsteps:\n", name)
	for _, s := range steps {
		hold := "no"
		if s.hold {
			hold = "yes"
		}
		fmt.Fprintf(&y, "  %s:\n", s.name)
		if len(s.requires) > 0 {
			fmt.Fprintf(&y, "    requires: [%s]\n", strings.Join(s.requires, ", "))
		}
		fmt.Fprintf(&y, "    agent: {backend: exec, command: [sh, agent.sh], env: {RUNS: %s, RELEASE_DIR: %s, HOLD: %s, OUT: %s, PASS_AT: %q}}\n",
			filepath.Join(c.dir, "runs.log"), filepath.Join(c.dir, "release"), hold, s.output(), strconv.Itoa(s.passAt))
		fmt.Fprintf(&y, "    prompt: \"Write out/%s.\"\n", s.output())
		if s.passAt > 0 {
			fmt.Fprintf(&y, "    outputs: [{name: %s, schema: count.schema.json}]\n    max_iterations: %d\n", s.output(), s.passAt+1)
		} else {
			fmt.Fprintf(&y, "    outputs: [{name: %s}]\n", s.output())
		}
		if s.holdCheck {
			y.WriteString("    validate: [sh, check.sh]\n")
		}
	}
	writeFiles(c.t, c.dir, map[string]string{
		"agent.sh":          agent,
		"check.sh":          check,
		"count.schema.json": countSchema,
		"input.txt":         "three apples\n",
		name + ".yaml":      y.String(),
	})
	return filepath.Join(c.dir, name+".yaml"), filepath.Join(c.dir, "input.txt")
}

// submit starts sessions of a pipeline with `run --detach`, concurrently.
func (c *cluster) submit(pipelineFile, input string, sessions ...string) {
	c.t.Helper()
	errs := make([]error, len(sessions))
	var wg sync.WaitGroup
	for i, s := range sessions {
		wg.Go(func() {
			r, err := runCLI(c.env, append([]string{"run", pipelineFile, "--input", input, "--session", s, "--detach"}, c.global()...)...)
			switch {
			case err != nil:
				errs[i] = err
			case r.code != 0 || strings.TrimSpace(r.stdout) != s:
				errs[i] = fmt.Errorf("run --detach %s: exit %d, stdout %q\n%s", s, r.code, r.stdout, r.stderr)
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		c.t.Fatal(err)
	}
}

// runCLI runs the binary to completion within two minutes. Unlike loopbus
// it does not use t, so goroutines may call it.
func runCLI(env []string, args ...string) (result, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, args...)
	cmd.Env = env
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if ctx.Err() != nil {
		return result{}, fmt.Errorf("loopbus %v: timed out\nstderr:\n%s", args, errb.String())
	}
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		return result{}, fmt.Errorf("loopbus %v: %w", args, err)
	}
	return result{code: code, stdout: out.String(), stderr: errb.String()}, nil
}

// chaosEvent is a line of `events --json` with the data fields the chaos
// checks read.
type chaosEvent struct {
	Type    string    `json:"type"`
	Source  string    `json:"source"`
	Session string    `json:"session"`
	Step    string    `json:"step"`
	Job     string    `json:"job"`
	Time    time.Time `json:"time"`
	Data    struct {
		JobID     string `json:"jobId"`
		Step      string `json:"step"`
		Iteration int    `json:"iteration"`
		Attempt   int    `json:"attempt"`
		Worker    string `json:"worker"`
		Delivery  int    `json:"delivery"`
	} `json:"data"`
}

// jobID is the job an event concerns.
func (e chaosEvent) jobID() string {
	if e.Data.JobID != "" {
		return e.Data.JobID
	}
	return e.Job
}

// events reads every session's events, in stream order, through the CLI.
func (c *cluster) events() map[string][]chaosEvent {
	c.t.Helper()
	r := loopbus(c.t, append([]string{"events", "--json"}, c.global()...)...)
	if r.code != 0 {
		c.t.Fatalf("events: exit %d\n%s", r.code, r.stderr)
	}
	out := map[string][]chaosEvent{}
	sc := bufio.NewScanner(strings.NewReader(r.stdout))
	sc.Buffer(make([]byte, 1<<20), 8<<20)
	for sc.Scan() {
		var e chaosEvent
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			c.t.Fatalf("events --json line: %v\n%s", err, sc.Text())
		}
		out[e.Session] = append(out[e.Session], e)
	}
	return out
}

// terminal reports whether a session's events end it.
func terminal(evs []chaosEvent) bool {
	for _, e := range evs {
		if e.Type == "loopbus.session.completed" || e.Type == "loopbus.session.failed" {
			return true
		}
	}
	return false
}

// waitTerminal polls the stream until every session has ended and returns
// all events. It fails as soon as the sessions make no progress (no new
// event of theirs) for stall, printing the tail of each unfinished session,
// and at once if a process exits by itself.
func (c *cluster) waitTerminal(stall time.Duration, sessions ...string) map[string][]chaosEvent {
	c.t.Helper()
	seen, progressed := -1, time.Now()
	for {
		c.checkAlive()
		all := c.events()
		var open []string
		n := 0
		for _, s := range sessions {
			n += len(all[s])
			if !terminal(all[s]) {
				open = append(open, s)
			}
		}
		if len(open) == 0 {
			return all
		}
		if n != seen {
			seen, progressed = n, time.Now()
		}
		if time.Since(progressed) > stall {
			var b strings.Builder
			for _, s := range open {
				evs := all[s]
				fmt.Fprintf(&b, "%s (%d events), last:", s, len(evs))
				for _, e := range evs[max(0, len(evs)-6):] {
					fmt.Fprintf(&b, " %s[%s]", strings.TrimPrefix(e.Type, "loopbus."), e.Step)
				}
				b.WriteByte('\n')
			}
			c.t.Fatalf("no progress for %s: %d of %d sessions did not end:\n%s", stall, len(open), len(sessions), b.String())
		}
		time.Sleep(300 * time.Millisecond)
	}
}

// checkDecisions fails the test with every problem decisionProblems finds
// in the events of session and returns the job.started events per job for
// scenario checks.
func checkDecisions(t *testing.T, session string, evs []chaosEvent, steps []chaosStep) map[string][]chaosEvent {
	t.Helper()
	problems, started := decisionProblems(evs, steps)
	for _, p := range problems {
		t.Errorf("session %s: %s", session, p)
	}
	return started
}

// decisionProblems lists every broken invariant of one session that should
// have completed: it ended once, completed; every decision (job.requested
// per step, iteration and attempt; step.completed and step.failed per step;
// session.completed and session.failed) appears at most once; each step
// was requested exactly for the iterations it needs, only after the steps
// it requires completed, and never ran (requested, started, tool started)
// after it completed; a step completed only after a passed verdict of its
// job; every job has exactly one result, no failure, and one verdict. It
// also returns the job.started events per job.
func decisionProblems(evs []chaosEvent, steps []chaosStep) (problems []string, started map[string][]chaosEvent) {
	errorf := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	decisions := map[string]int{}
	completedAt := map[string]int{} // step → index of its step.completed
	passed := map[string]bool{}     // job → validation.passed seen
	results := map[string]int{}
	verdicts := map[string]int{}
	started = map[string][]chaosEvent{}
	requires := map[string][]string{}
	for _, s := range steps {
		requires[s.name] = s.requires
	}
	for i, e := range evs {
		step := e.Step
		if step == "" {
			step = e.Data.Step
		}
		_, done := completedAt[step]
		switch e.Type {
		case "loopbus.job.requested":
			decisions[fmt.Sprintf("job.requested %s iteration %d attempt %d", step, e.Data.Iteration, max(e.Data.Attempt, 1))]++
			for _, r := range requires[step] {
				if _, ok := completedAt[r]; !ok {
					errorf("event %d: %s requested before %s, which it requires, completed", i, step, r)
				}
			}
			if done {
				errorf("event %d: %s requested again after it completed", i, step)
			}
		case "loopbus.job.started", "loopbus.tool.started":
			if done {
				errorf("event %d: %s of %s after the step completed", i, e.Type, step)
			}
			if e.Type == "loopbus.job.started" {
				started[e.jobID()] = append(started[e.jobID()], e)
			}
		case "loopbus.job.completed", "loopbus.job.failed":
			results[e.jobID()]++
			if e.Type == "loopbus.job.failed" {
				errorf("event %d: job %s failed", i, e.jobID())
			}
		case "loopbus.validation.passed", "loopbus.validation.failed":
			verdicts[e.jobID()]++
			if e.Type == "loopbus.validation.passed" {
				passed[e.jobID()] = true
			}
		case "loopbus.step.completed":
			decisions["step.completed "+step]++
			if !passed[e.jobID()] {
				errorf("event %d: step.completed of %s without a passed verdict of job %s before it", i, step, e.jobID())
			}
			if !done {
				completedAt[step] = i
			}
		case "loopbus.step.failed":
			decisions["step.failed "+step]++
		case "loopbus.session.started", "loopbus.session.completed", "loopbus.session.failed":
			decisions[strings.TrimPrefix(e.Type, "loopbus.")]++
		}
	}
	want := map[string]int{"session.started": 1, "session.completed": 1}
	for _, s := range steps {
		want["step.completed "+s.name] = 1
		for it := 1; it <= s.iterations(); it++ {
			want[fmt.Sprintf("job.requested %s iteration %d attempt 1", s.name, it)] = 1
		}
	}
	if !reflect.DeepEqual(decisions, want) {
		var diff []string
		for k := range mergeKeys(decisions, want) { // sorted below
			if decisions[k] != want[k] {
				diff = append(diff, fmt.Sprintf("%s: %d, want %d", k, decisions[k], want[k]))
			}
		}
		slices.Sort(diff)
		errorf("decisions differ:\n  %s", strings.Join(diff, "\n  "))
	}
	for _, job := range slices.Sorted(maps.Keys(mergeKeys(results, started))) {
		if results[job] != 1 || verdicts[job] != 1 {
			errorf("job %s: %d results and %d verdicts, want 1 and 1", job, results[job], verdicts[job])
		}
	}
	return problems, started
}

func mergeKeys[V1, V2 any](a map[string]V1, b map[string]V2) map[string]bool {
	keys := map[string]bool{}
	for k := range a {
		keys[k] = true
	}
	for k := range b {
		keys[k] = true
	}
	return keys
}

// comparableManifest returns a manifest (JSON) without what legitimately differs
// between two sessions of the same pipeline and input: the session id (also
// inside job ids), times, stream sequences, object-store keys (they name
// the session and the delivery) and the workers that ran the jobs.
// Statuses, iterations, hashes, digests, sizes and feedback remain.
func comparableManifest(t *testing.T, raw string) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(raw), &m); err != nil {
		t.Fatalf("manifest: %v\n%s", err, raw)
	}
	session, _ := m["contentId"].(string)
	// restarts: how often agents ran again depends on the faults.
	for _, k := range []string{"contentId", "createdAt", "updatedAt", "lastSeq", "restarts"} {
		delete(m, k)
	}
	dropObjects := func(v any) {
		refs, _ := v.([]any)
		for _, r := range refs {
			if ref, ok := r.(map[string]any); ok {
				delete(ref, "object")
			}
		}
	}
	if in, ok := m["input"].(map[string]any); ok {
		delete(in, "object")
	}
	dropObjects(m["final"])
	steps, _ := m["steps"].(map[string]any)
	for _, v := range steps {
		st, _ := v.(map[string]any)
		delete(st, "completedAt")
		delete(st, "worker")
		if id, ok := st["jobId"].(string); ok {
			st["jobId"] = strings.TrimPrefix(id, session+".")
		}
		dropObjects(st["artifacts"])
	}
	// Jobs by id without the session, and without the worker that ran them.
	if jobs, ok := m["jobs"].(map[string]any); ok {
		byID := map[string]any{}
		for id, v := range jobs {
			if j, ok := v.(map[string]any); ok {
				delete(j, "worker")
				delete(j, "restarts")
			}
			byID[strings.TrimPrefix(id, session+".")] = v
		}
		m["jobs"] = byID
	}
	return m
}

// viewsBucket reads and drops the projector's views directly in the KV
// bucket: `status` falls back to folding the stream when a view lags, so it
// cannot tell whether the projector did its work.
type viewsBucket struct {
	t  *testing.T
	nc *nats.Conn
	kv jetstream.KeyValue
}

func (c *cluster) views() *viewsBucket {
	c.t.Helper()
	nc, err := nats.Connect(c.url, nats.Timeout(10*time.Second))
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		c.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	kv, err := js.KeyValue(ctx, "LOOPBUS_VIEWS")
	if err != nil {
		c.t.Fatal(err)
	}
	return &viewsBucket{t: c.t, nc: nc, kv: kv}
}

// manifest returns the stored view of a session, nil if there is none.
func (v *viewsBucket) manifest(session string) map[string]any {
	v.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	e, err := v.kv.Get(ctx, "session."+session)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil
	}
	if err != nil {
		v.t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(e.Value(), &m); err != nil {
		v.t.Fatalf("view of %s: %v\n%s", session, err, e.Value())
	}
	return m
}

// dropAll deletes every key of the bucket: views and the projector's
// checkpoint.
func (v *viewsBucket) dropAll() int {
	v.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	keys, err := v.kv.Keys(ctx)
	if err != nil {
		v.t.Fatal(err)
	}
	for _, k := range keys {
		if err := v.kv.Delete(ctx, k); err != nil {
			v.t.Fatal(err)
		}
	}
	return len(keys)
}

// manifests runs `COMMAND SESSION --json` (replay or status) for each
// session, a few at a time, and decodes the manifests.
func (c *cluster) manifests(command string, sessions ...string) map[string]map[string]any {
	c.t.Helper()
	out := make([]map[string]any, len(sessions))
	errs := make([]error, len(sessions))
	slots := make(chan struct{}, 4)
	var wg sync.WaitGroup
	for i, s := range sessions {
		wg.Go(func() {
			slots <- struct{}{}
			defer func() { <-slots }()
			r, err := runCLI(c.env, append([]string{command, s, "--json"}, c.global()...)...)
			switch {
			case err != nil:
				errs[i] = err
			case r.code != 0:
				errs[i] = fmt.Errorf("%s %s: exit %d\n%s", command, s, r.code, r.stderr)
			default:
				if err := json.Unmarshal([]byte(r.stdout), &out[i]); err != nil {
					errs[i] = fmt.Errorf("%s %s: %w\n%s", command, s, err, r.stdout)
				}
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		c.t.Fatal(err)
	}
	m := map[string]map[string]any{}
	for i, s := range sessions {
		m[s] = out[i]
	}
	return m
}

// checkViews waits until the projector's stored view of every session has
// caught up with the stream, then requires it, and `status --json`, to
// equal the fold of the stream (`replay --json`) exactly.
func (c *cluster) checkViews(within time.Duration, sessions ...string) {
	c.t.Helper()
	v := c.views()
	want := c.manifests("replay", sessions...)
	deadline := time.Now().Add(within)
	for _, s := range sessions {
		for {
			got := v.manifest(s)
			if seq, ok := got["lastSeq"].(float64); ok && seq > want[s]["lastSeq"].(float64) {
				// Events came after the replay (a late redelivery): fold again.
				want[s] = c.manifests("replay", s)[s]
				continue
			}
			if got != nil && got["lastSeq"] == want[s]["lastSeq"] {
				if !reflect.DeepEqual(got, want[s]) {
					c.t.Errorf("stored view of %s differs from the fold of the stream:\nview:   %s\nstream: %s", s, mustJSON(got), mustJSON(want[s]))
				}
				break
			}
			if time.Now().After(deadline) {
				c.t.Fatalf("the stored view of %s did not reach the stream's last sequence %v within %s:\n%s", s, want[s]["lastSeq"], within, mustJSON(got))
			}
			c.checkAlive()
			time.Sleep(200 * time.Millisecond)
		}
	}
	for s, st := range c.manifests("status", sessions...) {
		if !reflect.DeepEqual(st, want[s]) {
			c.t.Errorf("status --json of %s differs from replay --json:\nstatus: %s\nreplay: %s", s, mustJSON(st), mustJSON(want[s]))
		}
	}
}

func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return err.Error()
	}
	return string(b)
}

// killer SIGKILLs a process at random points and starts it again until
// stopped: up for a random time from up(rng), then killed, down for a
// random time below maxDown, then started again.
//
// When up says so (its second result), the time up is counted from when
// the process has logged ready since its start, not from the start: on a
// loaded machine (tests in parallel, race-built binaries) catching up
// can take longer than any time up drawn from a fixed range, and a
// process always killed before it has caught up never makes progress.
type killer struct {
	p      *proc
	cancel context.CancelFunc
	done   chan struct{}

	mu    sync.Mutex
	kills []time.Time
	err   error
}

func startKiller(p *proc, rng *rand.Rand, ready string, up func(*rand.Rand) (time.Duration, bool), maxDown time.Duration) *killer {
	ctx, cancel := context.WithCancel(context.Background())
	k := &killer{p: p, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(k.done)
		for {
			d, afterReady := up(rng)
			if afterReady && !p.awaitLogged(ctx, ready) {
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(d):
			}
			k.mu.Lock()
			k.kills = append(k.kills, time.Now())
			k.mu.Unlock()
			if err := p.kill(); err != nil {
				k.fail(err)
				return
			}
			select {
			case <-ctx.Done():
			case <-time.After(between(rng, 0, maxDown)):
			}
			if err := p.start(); err != nil {
				k.fail(err)
				return
			}
		}
	}()
	return k
}

func (k *killer) fail(err error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.err = err
}

// halt ends the killing and leaves the process running.
func (k *killer) halt() {
	k.cancel()
	<-k.done
}

// stop halts the killer, fails the test if killing or restarting failed,
// and returns the kill times.
func (k *killer) stop(t *testing.T) []time.Time {
	t.Helper()
	k.halt()
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.err != nil {
		t.Fatal(k.err)
	}
	return slices.Clone(k.kills)
}

// killsSoFar returns the kill times until now.
func (k *killer) killsSoFar() []time.Time {
	k.mu.Lock()
	defer k.mu.Unlock()
	return slices.Clone(k.kills)
}

// killedDuring counts the kills between a session's start and its end.
func killedDuring(kills []time.Time, evs []chaosEvent) int {
	var from, to time.Time
	for _, e := range evs {
		switch e.Type {
		case "loopbus.session.started":
			from = e.Time
		case "loopbus.session.completed", "loopbus.session.failed":
			to = e.Time
		}
	}
	n := 0
	for _, k := range kills {
		if k.After(from) && k.Before(to) {
			n++
		}
	}
	return n
}
