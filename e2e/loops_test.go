package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The tests of loops and signals drive real processes (loopbus nats,
// orchestrator, validator, projector, agentworker) and the claude backend
// with testdata/claude-script, a scripted Claude Code printing the real
// stream format. Signals go through `loopbus signal`, as a user sends them.

// loopRig is a cluster running every service, a pipeline directory and the
// scripted agent's record directory.
type loopRig struct {
	*cluster
	procs map[string]*proc
	fake  string // FAKE_DIR: prompts, pids, counters, release markers
}

func newLoopRig(t *testing.T) *loopRig {
	t.Helper()
	return newLoopRigOf(t, 1, 4)
}

// newLoopRigOf is newLoopRig with the given worker replicas, each running
// concurrency jobs at once.
func newLoopRigOf(t *testing.T, workers, concurrency int) *loopRig {
	t.Helper()
	c := newCluster(t)
	procs := c.all(workers, concurrency, 10*time.Second)
	fake := filepath.Join(c.dir, "fake")
	if err := os.MkdirAll(fake, 0o755); err != nil {
		t.Fatal(err)
	}
	return &loopRig{cluster: c, procs: procs, fake: fake}
}

// loopStep is one step of a test pipeline run by claude-script.
type loopStep struct {
	name, script string
	requires     []string
	env          string // more agent environment, as YAML flow entries
	extra        string // more YAML lines of the step, indented by four spaces
}

// pipeline writes a pipeline whose steps each write STEP.txt and pass
// validation only when it starts with "pass"; top is added at the top level.
func (r *loopRig) pipeline(name, top string, steps ...loopStep) (file, input string) {
	r.t.Helper()
	script, err := filepath.Abs(filepath.Join("testdata", "claude-script"))
	if err != nil {
		r.t.Fatal(err)
	}
	var y strings.Builder
	fmt.Fprintf(&y, "name: %s\n%ssteps:\n", name, top)
	for _, s := range steps {
		fmt.Fprintf(&y, "  %s:\n", s.name)
		if len(s.requires) > 0 {
			fmt.Fprintf(&y, "    requires: [%s]\n", strings.Join(s.requires, ", "))
		}
		env := fmt.Sprintf("FAKE_DIR: %s, FAKE_SCRIPT: %q", r.fake, s.script)
		if s.env != "" {
			env += ", " + s.env
		}
		fmt.Fprintf(&y, "    agent: {backend: claude, command: [%s], env: {%s}}\n", script, env)
		fmt.Fprintf(&y, "    prompt: \"Write out/%s.txt.\"\n", s.name)
		fmt.Fprintf(&y, "    outputs: [{name: %s.txt}]\n", s.name)
		y.WriteString("    validate: [sh, check.sh]\n")
		y.WriteString(s.extra)
	}
	writeFiles(r.t, r.dir, map[string]string{
		name + ".yaml": y.String(),
		"check.sh": `out=$(cat "$LOOPBUS_OUTPUT_DIR"/*.txt)
case $out in pass*) exit 0 ;; esac
echo "the output says \"$out\", want it to start with pass"
exit 1
`,
		"input.txt": "brief\n",
	})
	return filepath.Join(r.dir, name+".yaml"), filepath.Join(r.dir, "input.txt")
}

// signal runs `loopbus signal args...` and returns its output; it fails the
// test unless the command exits 0.
func (r *loopRig) signal(args ...string) string {
	r.t.Helper()
	res := loopbus(r.t, append(append([]string{"signal"}, args...), r.global()...)...)
	if res.code != 0 {
		r.t.Fatalf("loopbus signal %v: exit %d\n%s%s", args, res.code, res.stdout, res.stderr)
	}
	return res.stdout
}

// sessionEvents returns the session's events with their data decoded.
func (r *loopRig) sessionEvents(session string) []loopEvent {
	r.t.Helper()
	var out []loopEvent
	for _, e := range events(r.t, r.global(), session) {
		le := loopEvent{cloudEvent: e}
		if err := json.Unmarshal(e.Data, &le.data); err != nil {
			r.t.Fatalf("%s data: %v", e.Type, err)
		}
		out = append(out, le)
	}
	return out
}

type loopEvent struct {
	cloudEvent
	data map[string]any
}

func (e loopEvent) str(key string) string { s, _ := e.data[key].(string); return s }

func ofType(evs []loopEvent, typ string) []loopEvent {
	var out []loopEvent
	for _, e := range evs {
		if e.Type == "loopbus."+typ {
			out = append(out, e)
		}
	}
	return out
}

// waitFor polls the session's events until one of type typ (and step, if
// given) exists and returns it.
func (r *loopRig) waitFor(session, typ, step string, within time.Duration) loopEvent {
	r.t.Helper()
	var found loopEvent
	eventually(r.t, within, session+" "+typ+" "+step, func() bool {
		r.checkAlive()
		for _, e := range ofType(r.sessionEvents(session), typ) {
			if step == "" || e.Step == step {
				found = e
				return true
			}
		}
		return false
	})
	return found
}

// waitFile waits until the scripted agent wrote a record and returns it.
func (r *loopRig) waitFile(name string, within time.Duration) string {
	r.t.Helper()
	var content string
	eventually(r.t, within, "agent record "+name, func() bool {
		r.checkAlive()
		b, err := os.ReadFile(filepath.Join(r.fake, name))
		content = strings.TrimSpace(string(b))
		return err == nil && content != ""
	})
	return content
}

func (r *loopRig) prompt(step string, run int) string {
	r.t.Helper()
	b, err := os.ReadFile(filepath.Join(r.fake, fmt.Sprintf("%s.%d.prompt", step, run)))
	if err != nil {
		r.t.Fatal(err)
	}
	return string(b)
}

func (r *loopRig) runs(step string) int {
	b, _ := os.ReadFile(filepath.Join(r.fake, step+".n"))
	n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return n
}

func (r *loopRig) release(step string) {
	r.t.Helper()
	if err := os.WriteFile(filepath.Join(r.fake, step+".release"), nil, 0o644); err != nil {
		r.t.Fatal(err)
	}
}

// processGone reports whether pid has exited (a zombie counts as gone: it
// runs no more).
func processGone(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	// pid (comm) S ...: the state follows the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && i+2 < len(s) && (s[i+2] == 'Z' || s[i+2] == 'X')
}

// completed waits until the session has ended and checks that it completed.
func (r *loopRig) completed(session string) []loopEvent {
	r.t.Helper()
	r.waitTerminal(90*time.Second, session)
	evs := r.sessionEvents(session)
	if n := len(ofType(evs, "session.completed")); n != 1 {
		r.t.Fatalf("%s: %d session.completed; events:\n%s", session, n, typesOf(evs))
	}
	return evs
}

func typesOf(evs []loopEvent) string {
	var b strings.Builder
	for _, e := range evs {
		fmt.Fprintf(&b, "  %s %s %s\n", strings.TrimPrefix(e.Type, "loopbus."), e.Step, e.str("jobId"))
	}
	return b.String()
}

// TestLoopPassesOnThirdIteration: each failed verdict reaches the next
// iteration's prompt, oldest first; the third iteration passes.
func TestLoopPassesOnThirdIteration(t *testing.T) {
	t.Parallel()
	r := newLoopRig(t)
	file, input := r.pipeline("loop", "", loopStep{name: "fix", script: "bad bad pass", extra: "    max_iterations: 5\n"})
	r.submit(file, input, "loop-1")
	evs := r.completed("loop-1")
	if n := len(ofType(evs, "validation.failed")); n != 2 {
		t.Errorf("%d validation.failed, want 2", n)
	}
	if n := r.runs("fix"); n != 3 {
		t.Fatalf("%d runs, want 3", n)
	}
	third := r.prompt("fix", 3)
	one, two := strings.Index(third, `"bad run 1"`), strings.Index(third, `"bad run 2"`)
	if one < 0 || two < 0 || one > two {
		t.Errorf("third prompt lacks the first two verdicts, oldest first:\n%s", third)
	}
	if second := r.prompt("fix", 2); !strings.Contains(second, `"bad run 1"`) || strings.Contains(second, `"bad run 2"`) {
		t.Errorf("second prompt:\n%s", second)
	}
	reqs := ofType(evs, "job.requested")
	if len(reqs) != 3 {
		t.Fatalf("%d job.requested", len(reqs))
	}
	if fb, _ := reqs[2].data["feedback"].([]any); len(fb) != 2 {
		t.Errorf("third job.requested carries %d feedback entries, want 2", len(fb))
	}
	st := loopbus(t, append([]string{"status", "loop-1", "--json"}, r.global()...)...)
	m := parseManifest(t, st.stdout)
	if s := m.Steps["fix"]; s.Iterations != 3 || !strings.Contains(s.LastFeedback, "bad run 2") {
		t.Errorf("manifest step: %+v", s)
	}
}

// TestStopKillsAgentThenResume: stop kills the running agent and its child
// within 5 s; resume runs the cut iteration again and the session completes.
func TestStopKillsAgentThenResume(t *testing.T) {
	t.Parallel()
	r := newLoopRig(t)
	file, input := r.pipeline("stop", "",
		loopStep{name: "draft", script: "slow pass"},
		loopStep{name: "edit", script: "pass", requires: []string{"draft"}})
	r.submit(file, input, "stop-1")
	pid, _ := strconv.Atoi(r.waitFile("draft.1.pid", 60*time.Second))
	child, _ := strconv.Atoi(r.waitFile("draft.1.child", 10*time.Second))
	if processGone(pid) || processGone(child) {
		t.Fatal("the agent is not running")
	}
	sent := time.Now()
	out := r.signal("stop", "stop-1", "--reason", "wrong brief")
	var killedAfter time.Duration
	eventually(t, 5*time.Second, "agent and child killed", func() bool {
		killedAfter = time.Since(sent)
		return processGone(pid) && processGone(child)
	})
	t.Logf("agent and child gone %v after `loopbus signal stop`; it printed: %s", killedAfter.Round(time.Millisecond), strings.TrimSpace(out))
	if !strings.Contains(out, "applied") {
		t.Errorf("signal output: %s", out)
	}
	r.waitFor("stop-1", "job.failed", "draft", 30*time.Second)
	evs := r.sessionEvents("stop-1")
	if c := ofType(evs, "job.cancelled"); len(c) != 1 || c[0].str("jobId") != "stop-1.draft.1" {
		t.Errorf("job.cancelled: %s", typesOf(c))
	}
	if s := ofType(evs, "session.stopped"); len(s) != 1 || !strings.Contains(s[0].str("reason"), "wrong brief") {
		t.Errorf("session.stopped: %v", s)
	}
	if f := ofType(evs, "job.failed"); len(f) != 1 || f[0].data["cancelled"] != true {
		t.Errorf("job.failed: %v", f)
	}
	if a := ofType(evs, "signal.acknowledged"); len(a) != 1 || a[0].str("result") != "applied" {
		t.Errorf("signal.acknowledged: %v", a)
	}
	st := loopbus(t, append([]string{"status", "stop-1"}, r.global()...)...)
	if !strings.Contains(st.stdout, "stopped") {
		t.Errorf("status of a stopped session:\n%s", st.stdout)
	}
	time.Sleep(time.Second) // nothing runs while stopped
	if n := r.runs("draft"); n != 1 {
		t.Fatalf("draft ran %d times while stopped", n)
	}

	r.signal("resume", "stop-1")
	evs = r.completed("stop-1")
	if n := r.runs("draft"); n != 2 {
		t.Errorf("draft ran %d times, want 2", n)
	}
	var rounds []string
	for _, e := range ofType(evs, "job.requested") {
		rounds = append(rounds, e.str("jobId"))
	}
	if want := "stop-1.draft.1 stop-1.draft.1.r1 stop-1.edit.1"; strings.Join(rounds, " ") != want {
		t.Errorf("jobs %v, want %s", rounds, want)
	}
}

// TestInfoHintReachesNextPrompt: an info signal given while an iteration
// runs is in the next iteration's prompt, not in the running one's.
func TestInfoHintReachesNextPrompt(t *testing.T) {
	t.Parallel()
	r := newLoopRig(t)
	file, input := r.pipeline("info", "", loopStep{name: "fix", script: "wait pass", extra: "    max_iterations: 3\n"})
	r.submit(file, input, "info-1")
	r.waitFile("fix.1.pid", 60*time.Second)
	out := r.signal("info", "info-1/fix", "--message", "Use the blue theme.")
	if !strings.Contains(out, "applied") {
		t.Errorf("signal output: %s", out)
	}
	r.release("fix")
	r.completed("info-1")
	if p := r.prompt("fix", 1); strings.Contains(p, "blue theme") {
		t.Errorf("the running iteration's prompt changed:\n%s", p)
	}
	if p := r.prompt("fix", 2); !strings.Contains(p, "Use the blue theme.") {
		t.Errorf("second prompt lacks the hint:\n%s", p)
	}
}

// TestInvalidateReRunsStepAndDependents: invalidating a completed step while
// its dependent runs cancels the dependent and runs both again; the step
// they depend on does not run again.
func TestInvalidateReRunsStepAndDependents(t *testing.T) {
	t.Parallel()
	r := newLoopRig(t)
	file, input := r.pipeline("inval", "",
		loopStep{name: "research", script: "pass"},
		loopStep{name: "outline", script: "pass", requires: []string{"research"}},
		loopStep{name: "draft", script: "slow pass", requires: []string{"outline"}})
	r.submit(file, input, "inval-1")
	r.waitFile("draft.1.pid", 60*time.Second)
	out := r.signal("invalidate", "inval-1/outline", "--reason", "outline was too short")
	if !strings.Contains(out, "applied") {
		t.Errorf("signal output: %s", out)
	}
	evs := r.completed("inval-1")
	got := map[string]int{"research": r.runs("research"), "outline": r.runs("outline"), "draft": r.runs("draft")}
	if want := map[string]int{"research": 1, "outline": 2, "draft": 2}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("runs %v, want %v", got, want)
	}
	var inv []string
	for _, e := range ofType(evs, "step.invalidated") {
		inv = append(inv, e.Step+"<"+e.str("cause"))
	}
	if strings.Join(inv, " ") != "outline<outline draft<outline" {
		t.Errorf("step.invalidated: %v", inv)
	}
	// research once, outline twice, draft once: its first run was cut.
	if n := len(ofType(evs, "step.completed")); n != 4 {
		t.Errorf("%d step.completed, want 4\n%s", n, typesOf(evs))
	}
}

// TestBudgetStopsSession: a loop whose every iteration costs $0.01 stops
// at its $0.025 budget after three runs, with the reason.
func TestBudgetStopsSession(t *testing.T) {
	t.Parallel()
	r := newLoopRig(t)
	file, input := r.pipeline("budget", "budget: {max_cost_usd: 0.025}\n", loopStep{name: "fix", script: "bad", extra: "    max_iterations: 10\n"})
	// run follows the session and exits 3 when the budget stops it.
	res := loopbus(t, append([]string{"run", file, "--input", input, "--session", "budget-1"}, r.global()...)...)
	if res.code != 3 || !strings.Contains(res.stderr, "session budget-1 stopped: budget: cost") {
		t.Errorf("run: exit %d, want 3\n%s", res.code, res.stderr)
	}
	stopped := r.waitFor("budget-1", "session.stopped", "", 90*time.Second)
	if stopped.str("kind") != "budget" || !strings.Contains(stopped.str("reason"), "max_cost_usd") {
		t.Errorf("session.stopped: %v", stopped.data)
	}
	time.Sleep(time.Second)
	evs := r.sessionEvents("budget-1")
	if n := len(ofType(evs, "job.requested")); n != 3 {
		t.Errorf("%d jobs requested, want 3\n%s", n, typesOf(evs))
	}
	st := loopbus(t, append([]string{"status", "budget-1"}, r.global()...)...)
	if !strings.Contains(st.stdout, "budget") {
		t.Errorf("status:\n%s", st.stdout)
	}
	// Resuming does not spend past the budget.
	if out := r.signal("resume", "budget-1"); !strings.Contains(out, "ignored") {
		t.Errorf("resume over budget: %s", out)
	}
}

// TestRateLimitWaitSurvivesOrchestratorKill: a job that hit a usage limit
// is retried at the reset time, even though the orchestrator was killed and
// restarted during the wait.
func TestRateLimitWaitSurvivesOrchestratorKill(t *testing.T) {
	t.Parallel()
	r := newLoopRig(t)
	file, input := r.pipeline("limit", "", loopStep{name: "fix", script: "limit pass", env: `FAKE_RESET_IN: "8"`})
	r.submit(file, input, "limit-1")
	waiting := r.waitFor("limit-1", "step.waiting", "fix", 60*time.Second)
	until, err := time.Parse(time.RFC3339, waiting.str("until"))
	if err != nil {
		t.Fatalf("until: %v", err)
	}
	st := loopbus(t, append([]string{"status", "limit-1"}, r.global()...)...)
	if !strings.Contains(st.stdout, "waiting until") {
		t.Errorf("status while waiting:\n%s", st.stdout)
	}
	orch := r.procs["orchestrator"]
	if err := orch.kill(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	if err := orch.start(); err != nil {
		t.Fatal(err)
	}
	evs := r.completed("limit-1")
	reqs := ofType(evs, "job.requested")
	if len(reqs) != 2 {
		t.Fatalf("%d job.requested\n%s", len(reqs), typesOf(evs))
	}
	at, _ := time.Parse(time.RFC3339Nano, reqs[1].Time)
	if at.Before(until) || at.After(until.Add(10*time.Second)) {
		t.Errorf("retried at %s; the limit reset at %s", at, until)
	}
	t.Logf("reset at %s, retried at %s (orchestrator restarted during the wait)", until.Format(time.RFC3339), at.Format(time.RFC3339Nano))
	if f := ofType(evs, "job.failed"); len(f) != 1 || f[0].data["rateLimited"] != true {
		t.Errorf("job.failed: %v", f)
	}
}

// TestBreakerOpensAndCloses: iterations without progress open the breaker;
// the step pauses with the reason, and resume closes it.
func TestBreakerOpensAndCloses(t *testing.T) {
	t.Parallel()
	r := newLoopRig(t)
	file, input := r.pipeline("breaker", "breaker: {no_progress: 2}\n", loopStep{name: "fix", script: "same same pass", extra: "    max_iterations: 6\n"})
	r.submit(file, input, "breaker-1")
	paused := r.waitFor("breaker-1", "step.paused", "fix", 60*time.Second)
	if paused.str("kind") != "breaker" || !strings.Contains(paused.str("reason"), "without progress") {
		t.Errorf("step.paused: %v", paused.data)
	}
	time.Sleep(time.Second)
	if n := r.runs("fix"); n != 2 {
		t.Fatalf("fix ran %d times with the breaker open", n)
	}
	st := loopbus(t, append([]string{"status", "breaker-1"}, r.global()...)...)
	if !strings.Contains(st.stdout, "breaker") {
		t.Errorf("status:\n%s", st.stdout)
	}
	out := r.signal("resume", "breaker-1/fix")
	if !strings.Contains(out, "applied") {
		t.Errorf("resume: %s", out)
	}
	r.completed("breaker-1")
	if n := r.runs("fix"); n != 3 {
		t.Errorf("fix ran %d times, want 3", n)
	}
}
