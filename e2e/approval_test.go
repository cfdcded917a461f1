package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// gatePipeline is draft (copying its prompt to its output, with the
// approval gate approval) → publish.
func gatePipeline(approval string) string {
	return `name: gate
steps:
  draft:
    agent: {backend: exec, command: [sh, -c, "cp \"$LOOPBUS_PROMPT_FILE\" \"$LOOPBUS_OUTPUT_DIR/draft.txt\""]}
    prompt: "Draft from {{.Input.Name}} (iteration {{.Iteration}})."
    outputs: [{name: draft.txt}]
    approval: ` + approval + `
  publish:
    requires: [draft]
    final: true
    agent: {backend: exec, command: [sh, -c, "echo published > \"$LOOPBUS_OUTPUT_DIR/post.txt\""]}
    prompt: publish
    outputs: [{name: post.txt}]
`
}

// gateSession starts a cluster (one orchestrator, validator, projector
// and worker as processes) and a session of gatePipeline(approval).
func gateSession(t *testing.T, session, approval string) (*cluster, map[string]*proc) {
	t.Helper()
	c := newCluster(t)
	writeFiles(t, c.dir, map[string]string{"input.txt": "x\n", "pipeline.yaml": gatePipeline(approval)})
	ps := c.all(1, 1, 30*time.Second)
	r := loopbus(t, append([]string{"run", filepath.Join(c.dir, "pipeline.yaml"), "--input", filepath.Join(c.dir, "input.txt"),
		"--session", session, "--detach"}, c.global()...)...)
	if r.code != 0 {
		t.Fatalf("run --detach: exit %d\n%s", r.code, r.stderr)
	}
	return c, ps
}

// awaitEvent waits until the session has n events of typ (for step, if
// set) and returns the session's events.
func awaitEvent(t *testing.T, c *cluster, session, typ, step string, n int) []cloudEvent {
	t.Helper()
	var evs []cloudEvent
	eventually(t, 90*time.Second, typ+" in session "+session, func() bool {
		c.checkAlive()
		evs = events(t, c.global(), session)
		return count(evs, typ, step) >= n
	})
	return evs
}

// stepStatus reads a step's status from `status --json`.
func stepStatus(t *testing.T, c *cluster, session, step string) string {
	t.Helper()
	r := loopbus(t, append([]string{"status", session, "--json"}, c.global()...)...)
	if r.code != 0 {
		t.Fatalf("status: exit %d\n%s", r.code, r.stderr)
	}
	return parseManifest(t, r.stdout).Steps[step].Status
}

// draftText is the draft.txt an iteration of draft produced (a copy of its
// prompt), from `export`.
func draftText(t *testing.T, c *cluster, session, job string) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "export")
	if r := loopbus(t, append([]string{"export", session, "--dir", out}, c.global()...)...); r.code != 0 {
		t.Fatalf("export: exit %d\n%s", r.code, r.stderr)
	}
	matches, _ := filepath.Glob(filepath.Join(out, "iterations", job, "draft.txt"))
	if len(matches) != 1 {
		all, _ := filepath.Glob(filepath.Join(out, "iterations", "*", "*"))
		t.Fatalf("no draft.txt of job %s in the export: %v", job, all)
	}
	raw, err := os.ReadFile(matches[0])
	if err != nil {
		t.Fatal(err)
	}
	return string(raw)
}

// TestApprovalGateApproveReject: a gated step waits (status
// awaiting_approval) after its validation passed; a rejection runs another
// iteration whose prompt carries the reason; an approval completes the
// step and the session; approving again is acknowledged as ignored.
func TestApprovalGateApproveReject(t *testing.T) {
	t.Parallel()
	c, _ := gateSession(t, "gate-1", "required")
	evs := awaitEvent(t, c, "gate-1", "loopbus.approval.requested", "draft", 1)
	if n := count(evs, "loopbus.step.completed", "draft"); n != 0 {
		t.Fatalf("draft completed before approval: %d", n)
	}
	if s := stepStatus(t, c, "gate-1", "draft"); s != "awaiting_approval" {
		// The projector may lag a moment behind the stream.
		eventually(t, 30*time.Second, "status awaiting_approval", func() bool { return stepStatus(t, c, "gate-1", "draft") == "awaiting_approval" })
	}
	// Refused before anything is sent.
	if r := loopbus(t, append([]string{"reject", "gate-1/draft"}, c.global()...)...); r.code != 2 || !strings.Contains(r.stderr, "reject needs --reason") {
		t.Errorf("reject without --reason: exit %d\n%s", r.code, r.stderr)
	}
	if r := loopbus(t, append([]string{"approve", "gate-1"}, c.global()...)...); r.code != 2 || !strings.Contains(r.stderr, "approve needs SESSION/STEP") {
		t.Errorf("approve without a step: exit %d\n%s", r.code, r.stderr)
	}
	// Not awaiting: publish has no gate.
	r := loopbus(t, append([]string{"approve", "gate-1/publish", "--wait", "60s"}, c.global()...)...)
	if r.code != 1 || !strings.Contains(r.stdout, "approve gate-1/publish: ignored — step publish has no approval gate") {
		t.Errorf("approve publish: exit %d\nstdout: %s\nstderr: %s", r.code, r.stdout, r.stderr)
	}

	r = loopbus(t, append([]string{"reject", "gate-1/draft", "--reason", "too long: cut it to 100 words", "--by", "bob", "--wait", "60s"}, c.global()...)...)
	if r.code != 0 || !strings.Contains(r.stdout, "reject gate-1/draft: applied — step draft rejected by bob; iteration 2 runs with the reason as feedback") {
		t.Fatalf("reject: exit %d\nstdout: %s\nstderr: %s", r.code, r.stdout, r.stderr)
	}
	evs = awaitEvent(t, c, "gate-1", "loopbus.approval.requested", "draft", 2)
	var sig map[string]string
	for _, e := range evs {
		if e.Type == "loopbus.signal.reject" {
			_ = json.Unmarshal(e.Data, &sig)
		}
	}
	if sig["by"] != "bob" || sig["reason"] != "too long: cut it to 100 words" || sig["step"] != "draft" {
		t.Errorf("signal.reject data %v", sig)
	}
	second := draftText(t, c, "gate-1", "gate-1.draft.2")
	for _, want := range []string{"(iteration 2)", "a reviewer rejected the outputs", "too long: cut it to 100 words"} {
		if !strings.Contains(second, want) {
			t.Errorf("second prompt lacks %q:\n%s", want, second)
		}
	}
	if first := draftText(t, c, "gate-1", "gate-1.draft.1"); strings.Contains(first, "too long") {
		t.Errorf("first prompt has the feedback:\n%s", first)
	}

	r = loopbus(t, append([]string{"approve", "gate-1/draft", "--comment", "reads well", "--by", "alice", "--wait", "60s"}, c.global()...)...)
	if r.code != 0 || !strings.Contains(r.stdout, "approve gate-1/draft: applied — step draft approved by alice; it completes") {
		t.Fatalf("approve: exit %d\nstdout: %s\nstderr: %s", r.code, r.stdout, r.stderr)
	}
	r = loopbus(t, append([]string{"wait", "gate-1"}, c.global()...)...)
	if r.code != 0 {
		t.Fatalf("wait: exit %d\nstdout: %s\nstderr: %s", r.code, r.stdout, r.stderr)
	}
	evs = events(t, c.global(), "gate-1")
	if count(evs, "loopbus.session.completed", "") != 1 || count(evs, "loopbus.step.completed", "draft") != 1 || count(evs, "loopbus.job.requested", "draft") != 2 {
		t.Errorf("events after approval: %d session.completed, %d draft completions, %d draft jobs",
			count(evs, "loopbus.session.completed", ""), count(evs, "loopbus.step.completed", "draft"), count(evs, "loopbus.job.requested", "draft"))
	}
	r = loopbus(t, append([]string{"approve", "gate-1/draft", "--wait", "60s"}, c.global()...)...)
	if r.code != 1 || !strings.Contains(r.stdout, "ignored — session gate-1 already completed") {
		t.Errorf("approve after completion: exit %d\nstdout: %s\nstderr: %s", r.code, r.stdout, r.stderr)
	}
}

// TestApprovalGateTimeout: with approval {timeout, on_timeout: fail} and no
// answer, the step and the session fail with a clear reason.
func TestApprovalGateTimeout(t *testing.T) {
	t.Parallel()
	c, _ := gateSession(t, "gate-t", "{timeout: 2s, on_timeout: fail}")
	awaitEvent(t, c, "gate-t", "loopbus.approval.requested", "draft", 1)
	evs := awaitEvent(t, c, "gate-t", "loopbus.session.failed", "", 1)
	if count(evs, "loopbus.approval.expired", "draft") != 1 || count(evs, "loopbus.step.failed", "draft") != 1 {
		t.Fatalf("events: %d approval.expired, %d step.failed", count(evs, "loopbus.approval.expired", "draft"), count(evs, "loopbus.step.failed", "draft"))
	}
	r := loopbus(t, append([]string{"wait", "gate-t"}, c.global()...)...)
	if r.code != 1 || !strings.Contains(r.stderr, "approval timed out: no approval within 2s (on_timeout: fail)") {
		t.Errorf("wait: exit %d\nstderr: %s", r.code, r.stderr)
	}
}

// TestApprovalGateTimeoutReject: on_timeout reject runs another iteration
// with the timeout as feedback, which waits at the gate again; the
// timeouts count against max_iterations, so the step then fails.
func TestApprovalGateTimeoutReject(t *testing.T) {
	t.Parallel()
	c, _ := gateSession(t, "gate-tr", "{timeout: 2s, on_timeout: reject}\n    max_iterations: 2")
	awaitEvent(t, c, "gate-tr", "loopbus.approval.requested", "draft", 2)
	if text := draftText(t, c, "gate-tr", "gate-tr.draft.2"); !strings.Contains(text, "rejected: no approval within 2s") {
		t.Errorf("second prompt lacks the timeout:\n%s", text)
	}
	// A timeout's rejection counts against max_iterations: nobody answering,
	// the step fails after its second iteration instead of running forever.
	evs := awaitEvent(t, c, "gate-tr", "loopbus.session.failed", "", 1)
	if n := count(evs, "loopbus.job.requested", "draft"); n != 2 {
		t.Errorf("%d draft jobs, want 2", n)
	}
}

// TestApprovalGateOrchestratorKilled: the orchestrator is killed (SIGKILL)
// while a gate waits; an approval sent while it is down is recorded, and
// the restarted orchestrator acts on it: the session completes.
func TestApprovalGateOrchestratorKilled(t *testing.T) {
	t.Parallel()
	c, ps := gateSession(t, "gate-k", "{timeout: 1h}")
	awaitEvent(t, c, "gate-k", "loopbus.approval.requested", "draft", 1)
	if err := ps["orchestrator"].kill(); err != nil {
		t.Fatal(err)
	}
	r := loopbus(t, append([]string{"approve", "gate-k/draft", "--comment", "ok", "--wait", "1s"}, c.global()...)...)
	if r.code != 0 || !strings.Contains(r.stdout, "approve gate-k/draft: recorded at stream sequence ") {
		t.Fatalf("approve while the orchestrator is down: exit %d\nstdout: %s\nstderr: %s", r.code, r.stdout, r.stderr)
	}
	if err := ps["orchestrator"].start(); err != nil {
		t.Fatal(err)
	}
	evs := awaitEvent(t, c, "gate-k", "loopbus.session.completed", "", 1)
	if count(evs, "loopbus.approval.requested", "draft") != 1 || count(evs, "loopbus.job.requested", "draft") != 1 ||
		count(evs, "loopbus.approval.expired", "") != 0 {
		t.Errorf("events: %d approval.requested, %d draft jobs, %d approval.expired", count(evs, "loopbus.approval.requested", "draft"),
			count(evs, "loopbus.job.requested", "draft"), count(evs, "loopbus.approval.expired", ""))
	}
}
