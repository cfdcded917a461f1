package e2e

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// index returns the position of the first event of typ (and step, if set)
// in evs, or -1.
func index(evs []cloudEvent, typ, step string) int {
	return slices.IndexFunc(evs, func(e cloudEvent) bool { return e.Type == typ && (step == "" || e.Step == step) })
}

// TestApprovalGateLoopLevel: a loops file whose plan level has approval:
// required. The plan loop waits (status awaiting_approval) with no child
// spawned; a rejection runs it again with the reason in its prompt; the
// approval completes it, and only then are its children spawned and the
// session completes.
func TestApprovalGateLoopLevel(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	c.all(1, 2, 30*time.Second)
	writeFiles(t, c.dir, map[string]string{
		"plan.sh": `printf '# plan\n## one\n## two\n' > "$LOOPBUS_OUTPUT_DIR/plan.md"` + "\n",
		"part.sh": `cp "$LOOPBUS_INPUT_DIR/plan.md" "$LOOPBUS_OUTPUT_DIR/part.md"` + "\n",
		"loops.yaml": `kind: loops
name: gated
levels:
  plan:
    agent: {backend: exec, command: [sh, plan.sh]}
    outputs: [{name: plan.md}]
    approval: required
    children: {level: part, from: plan.md, split: headings}
  part:
    agent: {backend: exec, command: [sh, part.sh]}
    outputs: [{name: part.md}]
`,
	})
	const s = "lg"
	r := loopbus(t, append([]string{"run", filepath.Join(c.dir, "loops.yaml"), "--task", "Write two parts", "--session", s, "--detach"}, c.global()...)...)
	if r.code != 0 {
		t.Fatalf("run --detach: exit %d\n%s", r.code, r.stderr)
	}
	evs := awaitEvent(t, c, s, "loopbus.approval.requested", "plan", 1)
	if n := count(evs, "loopbus.loop.spawned", "plan-001"); n != 0 {
		t.Fatalf("plan-001 spawned before plan was approved")
	}
	eventually(t, 30*time.Second, "status awaiting_approval", func() bool { return stepStatus(t, c, s, "plan") == "awaiting_approval" })

	r = loopbus(t, append([]string{"reject", s + "/plan", "--reason", "name the parts after the modules", "--by", "bob", "--wait", "60s"}, c.global()...)...)
	if r.code != 0 || !strings.Contains(r.stdout, "reject lg/plan: applied — loop plan rejected by bob; iteration 2 runs with the reason as feedback") {
		t.Fatalf("reject: exit %d\nstdout: %s\nstderr: %s", r.code, r.stdout, r.stderr)
	}
	evs = awaitEvent(t, c, s, "loopbus.approval.requested", "plan", 2)
	if p := jobRequest(t, evs, "lg.plan.2"); !strings.Contains(p, "a reviewer rejected the outputs") || !strings.Contains(p, "name the parts after the modules") {
		t.Errorf("the second iteration's prompt lacks the rejection:\n%s", p)
	}
	if n := count(evs, "loopbus.loop.spawned", "plan-001"); n != 0 {
		t.Fatalf("plan-001 spawned after a rejection")
	}

	r = loopbus(t, append([]string{"approve", s + "/plan", "--comment", "good split", "--by", "alice", "--wait", "60s"}, c.global()...)...)
	if r.code != 0 || !strings.Contains(r.stdout, "approve lg/plan: applied — loop plan approved by alice; it completes and spawns its children") {
		t.Fatalf("approve: exit %d\nstdout: %s\nstderr: %s", r.code, r.stdout, r.stderr)
	}
	if r = loopbus(t, append([]string{"wait", s}, c.global()...)...); r.code != 0 {
		t.Fatalf("wait: exit %d\nstdout: %s\nstderr: %s", r.code, r.stdout, r.stderr)
	}
	evs = events(t, c.global(), s)
	approved := index(evs, "loopbus.signal.approve", "")
	completed := index(evs, "loopbus.step.completed", "plan")
	spawned := index(evs, "loopbus.loop.spawned", "plan-001")
	if approved < 0 || completed < approved || spawned < completed || count(evs, "loopbus.loop.spawned", "plan-002") != 1 {
		t.Errorf("approve at %d, plan completed at %d, plan-001 spawned at %d, %d plan-002 spawned; want them in this order, each once",
			approved, completed, spawned, count(evs, "loopbus.loop.spawned", "plan-002"))
	}
	if count(evs, "loopbus.job.requested", "plan") != 2 || count(evs, "loopbus.step.completed", "plan-001") != 1 ||
		count(evs, "loopbus.step.completed", "plan-002") != 1 || count(evs, "loopbus.session.completed", "") != 1 {
		t.Errorf("events:\n%s", typesOfCloud(evs))
	}
}

// TestApprovalGateBacklogTask: a backlog whose iterate role has approval:
// required. A task run waits after its summary passed; the task stays
// open and the review does not start; a rejection runs the task again
// with the reason in its prompt; the approval applies the summary and the
// backlog runs to done.
func TestApprovalGateBacklogTask(t *testing.T) {
	t.Parallel()
	r := newBacklogRig(t, 1, 2)
	file := r.backlog("approval:\n  iterate: required\n")
	writeFiles(t, r.dir, map[string]string{"to-do.json": `{"schema_version": 1, "project": {"name": "Demo"}, "source_files": ["spec.md"], "tasks": [
  {"id": "T001", "title": "Build", "status": "todo", "priority": 1}]}`})
	const s = "bl-gate"
	r.run(file, s, "--tasks", filepath.Join(r.dir, "to-do.json"))
	c := r.cluster
	evs := awaitEvent(t, c, s, "loopbus.approval.requested", "T001", 1)
	if count(evs, "loopbus.task.updated", "T001") != 0 || count(evs, "loopbus.step.completed", "T001") != 0 {
		t.Fatalf("T001's run was applied before approval:\n%s", typesOfCloud(evs))
	}
	eventually(t, 30*time.Second, "status awaiting_approval", func() bool { return stepStatus(t, c, s, "T001") == "awaiting_approval" })

	res := loopbus(t, append([]string{"reject", s + "/T001", "--reason", "also write the tests", "--by", "bob", "--wait", "60s"}, r.global()...)...)
	if res.code != 0 || !strings.Contains(res.stdout, "applied — task T001 rejected by bob; iteration 2 runs with the reason as feedback") {
		t.Fatalf("reject: exit %d\nstdout: %s\nstderr: %s", res.code, res.stdout, res.stderr)
	}
	awaitEvent(t, c, s, "loopbus.approval.requested", "T001", 2)
	if p := r.prompt("T001", 2); !strings.Contains(p, "a reviewer rejected the outputs") || !strings.Contains(p, "also write the tests") {
		t.Errorf("T001's second prompt lacks the rejection:\n%s", p)
	}
	res = loopbus(t, append([]string{"approve", s + "/T001", "--by", "alice", "--wait", "60s"}, r.global()...)...)
	if res.code != 0 || !strings.Contains(res.stdout, "applied — task T001 approved by alice; it completes") {
		t.Fatalf("approve: exit %d\nstdout: %s\nstderr: %s", res.code, res.stdout, res.stderr)
	}
	done := r.completed(s)
	trace := backlogTrace(done)
	if !strings.Contains(trace, "job.requested bl-gate.T001.1\njob.requested bl-gate.T001.2\ntask.updated T001 done\nbacklog.phase review\n") {
		t.Errorf("trace:\n%s", trace)
	}
	// The review run has no gate: it completes by itself.
	if n := len(ofType(done, "approval.requested")); n != 2 {
		t.Errorf("%d approval.requested, want 2 (both T001's)", n)
	}
}

// typesOfCloud lists events one per line for failure messages.
func typesOfCloud(evs []cloudEvent) string {
	var b strings.Builder
	for _, e := range evs {
		b.WriteString("  " + strings.TrimPrefix(e.Type, "loopbus.") + " " + e.Step + "\n")
	}
	return b.String()
}
