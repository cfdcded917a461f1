package e2e

import (
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The tests of "no session left hanging" (issue 18): a backlog whose
// tasks ended blocked says so with its own exit code, a budget-stopped
// session is continued with a raised budget or closed for good, and a job
// no worker takes fails on the pipeline's job_dispatch_timeout.

// TestBacklogBlockedExitCode: a backlog whose task stays blocked completes
// (the review finds nothing to add), but run and wait exit 4 naming the
// blocked task count, not 0.
func TestBacklogBlockedExitCode(t *testing.T) {
	t.Parallel()
	r := newBacklogRig(t, 1, 2)
	file := r.backlog("")
	writeFiles(t, r.dir, map[string]string{"to-do.json": `{"schema_version": 1, "tasks": [
  {"id": "T1", "title": "needs a key", "status": "todo"},
  {"id": "T2", "title": "easy", "status": "todo"}]}`})
	r.planRun("T1", 0, `{"task_id": "T1", "status": "blocked", "summary": "no API key", "blockers": ["no API key"]}`)
	res := loopbus(t, append([]string{"run", file, "--session", "bl-blocked", "--tasks", filepath.Join(r.dir, "to-do.json")}, r.global()...)...)
	if res.code != 4 || !strings.Contains(res.stderr, "completed with 1 task blocked") {
		t.Fatalf("run: exit %d, want 4 saying 1 task is blocked\n%s%s", res.code, res.stdout, res.stderr)
	}
	wait := loopbus(t, append([]string{"wait", "bl-blocked"}, r.global()...)...)
	if wait.code != 4 {
		t.Errorf("wait: exit %d, want 4\n%s%s", wait.code, wait.stdout, wait.stderr)
	}
}

// TestBudgetRaisedContinuesSession: a loop whose budget stops it after
// three paid runs goes on when `loopbus budget` raises the bound: the
// pending iteration is dispatched, the fourth run passes, and wait exits 0.
// A second session stopped the same way is closed for good: wait exits 5,
// status says closed, and neither a budget nor a resume reopens it.
func TestBudgetRaisedContinuesSession(t *testing.T) {
	t.Parallel()
	r := newLoopRig(t)
	file, input := r.pipeline("budget", "budget: {max_cost_usd: 0.025}\n", loopStep{name: "fix", script: "bad bad bad pass", extra: "    max_iterations: 10\n"})
	res := loopbus(t, append([]string{"run", file, "--input", input, "--session", "raise-1"}, r.global()...)...)
	if res.code != 3 {
		t.Fatalf("run: exit %d, want 3 (stopped by the budget)\n%s", res.code, res.stderr)
	}
	out := loopbus(t, append([]string{"budget", "raise-1", "--max-cost-usd", "1", "--reason", "worth it"}, r.global()...)...)
	if out.code != 0 || !strings.Contains(out.stdout, "budget of raise-1 set: max cost $1.00") {
		t.Fatalf("budget: exit %d\n%s%s", out.code, out.stdout, out.stderr)
	}
	wait := loopbus(t, append([]string{"wait", "raise-1"}, r.global()...)...)
	if wait.code != 0 {
		t.Fatalf("wait after the raise: exit %d, want 0\n%s", wait.code, wait.stderr)
	}
	evs := r.completed("raise-1")
	if n := len(ofType(evs, "job.requested")); n != 4 || r.runs("fix") != 4 {
		t.Errorf("%d jobs requested, %d runs; want 4 each\n%s", n, r.runs("fix"), typesOf(evs))
	}
	if res := ofType(evs, "session.resumed"); len(res) != 1 || res[0].str("reason") != "budget raised" {
		t.Errorf("session.resumed: %v\n%s", res, typesOf(evs))
	}

	// Closed for good (another step: the scripted agent counts runs per
	// step name).
	file, input = r.pipeline("budget2", "budget: {max_cost_usd: 0.025}\n", loopStep{name: "other", script: "bad", extra: "    max_iterations: 10\n"})
	res = loopbus(t, append([]string{"run", file, "--input", input, "--session", "close-1"}, r.global()...)...)
	if res.code != 3 {
		t.Fatalf("run close-1: exit %d, want 3\n%s", res.code, res.stderr)
	}
	out = loopbus(t, append([]string{"close", "close-1", "--reason", "not worth it"}, r.global()...)...)
	if out.code != 0 || !strings.Contains(out.stdout, "session close-1 closed") {
		t.Fatalf("close: exit %d\n%s%s", out.code, out.stdout, out.stderr)
	}
	wait = loopbus(t, append([]string{"wait", "close-1"}, r.global()...)...)
	if wait.code != 5 || !strings.Contains(wait.stderr, "session close-1 closed: not worth it") {
		t.Errorf("wait of a closed session: exit %d, want 5\n%s", wait.code, wait.stderr)
	}
	st := loopbus(t, append([]string{"status", "close-1", "--json"}, r.global()...)...)
	if !strings.Contains(st.stdout, `"status": "closed"`) && !strings.Contains(st.stdout, `"status":"closed"`) {
		t.Errorf("status --json of a closed session:\n%s", st.stdout)
	}
	if again := loopbus(t, append([]string{"budget", "close-1", "--max-cost-usd", "9"}, r.global()...)...); again.code != 2 || !strings.Contains(again.stderr, "closed") {
		t.Errorf("budget of a closed session: exit %d, want 2 saying it is closed\n%s", again.code, again.stderr)
	}
	if out := r.signal("resume", "close-1"); !strings.Contains(out, "ignored") && !strings.Contains(out, "recorded") {
		t.Errorf("resume of a closed session: %s", out)
	}
	time.Sleep(500 * time.Millisecond)
	evs = r.sessionEvents("close-1")
	if n := len(ofType(evs, "job.requested")); n != 3 || len(ofType(evs, "session.resumed")) != 0 {
		t.Errorf("a closed session ran again: %d jobs requested\n%s", n, typesOf(evs))
	}
}

// TestJobDispatchTimeoutUnservedLane: the only worker runs the no-net lane
// and a step's agent may use Bash (lane heavy): no worker ever starts the
// job, and with job_dispatch_timeout 3s the step and the session fail
// within seconds, naming the timeout, instead of waiting for the
// redelivery limit.
func TestJobDispatchTimeoutUnservedLane(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	c.service("orchestrator", "orchestrator")
	c.service("validator", "validator", "--ack-wait", "10s")
	c.service("projector", "projector")
	c.service("worker-a", "agentworker", "--id", "worker-a", "--lanes", "no-net", "--ack-wait", "10s", "--work-dir", filepath.Join(c.dir, "work-a"))
	writeFiles(t, c.dir, map[string]string{
		"lanes.yaml": `name: lanes
job_dispatch_timeout: 3s
steps:
  shell:
    agent: {backend: claude, command: [false], allowed_tools: [Bash]}
    prompt: "Run the build."
    outputs: [{name: out.txt}]
`,
		"in.txt": "x\n",
	})
	start := time.Now()
	res := loopbus(t, append([]string{"run", filepath.Join(c.dir, "lanes.yaml"), "--input", filepath.Join(c.dir, "in.txt"), "--session", "lane-1"}, c.global()...)...)
	took := time.Since(start)
	if res.code != 1 || !strings.Contains(res.stderr, "was not started within job_dispatch_timeout 3s") {
		t.Fatalf("run: exit %d after %s, want 1 naming job_dispatch_timeout\n%s", res.code, took, res.stderr)
	}
	if took > 45*time.Second {
		t.Errorf("the session failed after %s, want a few seconds", took)
	}
	evs := c.waitTerminal(30*time.Second, "lane-1")["lane-1"]
	var types []string
	for _, e := range evs {
		types = append(types, strings.TrimPrefix(e.Type, "loopbus."))
	}
	got := strings.Join(types, " ")
	if strings.Contains(got, "job.started") || !strings.Contains(got, "job.cancelled step.failed session.failed") {
		t.Errorf("events: %s; want the job never started, then cancelled and failed", got)
	}
}

// TestJobDispatchTimeoutLoops: a loops file takes job_dispatch_timeout as
// a pipeline does: its root loop's agent may use Bash (lane heavy), the
// only worker runs no-net, and the session fails within seconds naming the
// timeout.
func TestJobDispatchTimeoutLoops(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	c.service("orchestrator", "orchestrator")
	c.service("validator", "validator", "--ack-wait", "10s")
	c.service("projector", "projector")
	c.service("worker-a", "agentworker", "--id", "worker-a", "--lanes", "no-net", "--ack-wait", "10s", "--work-dir", filepath.Join(c.dir, "work-a"))
	writeFiles(t, c.dir, map[string]string{"loops.yaml": `kind: loops
name: lanes
job_dispatch_timeout: 3s
levels:
  plan:
    agent: {backend: claude, command: [false], allowed_tools: [Bash]}
    outputs: [{name: plan.md}]
`})
	start := time.Now()
	res := loopbus(t, append([]string{"run", filepath.Join(c.dir, "loops.yaml"), "--task", "build it", "--session", "lane-loops"}, c.global()...)...)
	took := time.Since(start)
	if res.code != 1 || !strings.Contains(res.stderr, "job lane-loops.plan.1 was not started within job_dispatch_timeout 3s") {
		t.Fatalf("run: exit %d after %s, want 1 naming job_dispatch_timeout\n%s", res.code, took, res.stderr)
	}
	if took > 45*time.Second {
		t.Errorf("the session failed after %s, want a few seconds", took)
	}
}
