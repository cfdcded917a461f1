package orchestrator

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/loopbus/loopbus/schemas"
)

// The specification of approval gates on loop levels and backlog roles:
// the simulated worlds of loops_test.go and backlog_test.go answer every
// job, and each gate reached is answered as the case says.

// gatedLoops is loopsPipeline(1) with approval gates on the levels named.
func gatedLoops(gates map[string]*schemas.Approval) schemas.Pipeline {
	p := loopsPipeline(1)
	lp := *p.Loops
	lp.Levels = slices.Clone(lp.Levels)
	for i := range lp.Levels {
		lp.Levels[i].Approval = gates[lp.Levels[i].Name]
	}
	p.Loops = &lp
	return p
}

// oneEach gives plan and spec one child each; code loops pass.
func oneEach(jr *schemas.JobRequested) (string, bool) {
	if jr.Step == "plan" || jr.Step == "plan-001" {
		return "## the only part of " + jr.Step + "\n", true
	}
	return "", true
}

func TestLoopsApproval(t *testing.T) {
	required := &schemas.Approval{}
	tests := []struct {
		name   string
		gates  map[string]*schemas.Approval
		during map[string][]schemas.Event
		want   []string
	}{
		{
			name:  "a gated loop waits after its validation passed: no child is spawned",
			gates: map[string]*schemas.Approval{"plan": required},
			want: []string{
				"loop.spawned plan", "job.requested s1.plan.1",
				"approval.requested plan job s1.plan.1, 1 artifacts",
			},
		},
		{
			name:  "approve completes the loop, then its children are spawned",
			gates: map[string]*schemas.Approval{"plan": required},
			during: map[string][]schemas.Event{
				"gate s1.plan.1": {approvalSignal(1, "approve", "plan", "good plan", "alice")},
			},
			want: []string{
				"loop.spawned plan", "job.requested s1.plan.1",
				"approval.requested plan job s1.plan.1, 1 artifacts",
				"signal.acknowledged sig-1 approve applied: loop plan approved by alice; it completes and spawns its children",
				"loop.spawned plan-001", "job.requested s1.plan-001.1",
				"loop.spawned plan-001-001", "job.requested s1.plan-001-001.1",
				"job.requested s1.plan-001-001.merge1", "loop.merged plan-001-001 #1", "session.completed",
			},
		},
		{
			name:  "reject runs the loop again with the reason (free), then approve spawns its children",
			gates: map[string]*schemas.Approval{"plan": required},
			during: map[string][]schemas.Event{
				"gate s1.plan.1": {approvalSignal(1, "reject", "plan", "split the work by module", "bob")},
				"gate s1.plan.2": {approvalSignal(2, "approve", "plan", "", "bob")},
			},
			want: []string{
				"loop.spawned plan", "job.requested s1.plan.1",
				"approval.requested plan job s1.plan.1, 1 artifacts",
				"signal.acknowledged sig-1 reject applied: loop plan rejected by bob; iteration 2 runs with the reason as feedback",
				"job.requested s1.plan.2 feedback=1",
				"approval.requested plan job s1.plan.2, 1 artifacts",
				"signal.acknowledged sig-2 approve applied: loop plan approved by bob; it completes and spawns its children",
				"loop.spawned plan-001", "job.requested s1.plan-001.1",
				"loop.spawned plan-001-001", "job.requested s1.plan-001-001.1",
				"job.requested s1.plan-001-001.merge1", "loop.merged plan-001-001 #1", "session.completed",
			},
		},
		{
			name:  "a gated worktree loop is merged only once approved",
			gates: map[string]*schemas.Approval{"code": required},
			during: map[string][]schemas.Event{
				"gate s1.plan-001-001.1": {approvalSignal(1, "approve", "plan-001-001", "", "carol")},
			},
			want: []string{
				"loop.spawned plan", "job.requested s1.plan.1",
				"loop.spawned plan-001", "job.requested s1.plan-001.1",
				"loop.spawned plan-001-001", "job.requested s1.plan-001-001.1",
				"approval.requested plan-001-001 job s1.plan-001-001.1, 0 artifacts",
				"signal.acknowledged sig-1 approve applied: loop plan-001-001 approved by carol; it completes",
				"job.requested s1.plan-001-001.merge1", "loop.merged plan-001-001 #1", "session.completed",
			},
		},
		{
			name:  "approve of a loop of an ungated level is ignored",
			gates: map[string]*schemas.Approval{"code": required},
			during: map[string][]schemas.Event{
				"s1.plan-001.1": {approvalSignal(1, "approve", "plan", "", "")},
			},
			want: []string{
				"loop.spawned plan", "job.requested s1.plan.1",
				"loop.spawned plan-001", "job.requested s1.plan-001.1",
				"signal.acknowledged sig-1 approve ignored: loop plan has no approval gate",
				"loop.spawned plan-001-001", "job.requested s1.plan-001-001.1",
				"approval.requested plan-001-001 job s1.plan-001-001.1, 0 artifacts",
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, _, _ := runLoops(t, loopsStarted(gatedLoops(tt.gates)), loopWorld{agent: oneEach, during: tt.during})
			if !slices.Equal(got, tt.want) {
				t.Errorf("decisions:\n  got  %s\n  want %s", strings.Join(got, "\n       "), strings.Join(tt.want, "\n       "))
			}
		})
	}
}

// A rejection's reason reaches the loop's next prompt.
func TestLoopsRejectReasonInPrompt(t *testing.T) {
	during := map[string][]schemas.Event{
		"gate s1.plan.1": {approvalSignal(1, "reject", "plan", "split the work by module", "bob")},
	}
	_, reqs, _ := runLoops(t, loopsStarted(gatedLoops(map[string]*schemas.Approval{"plan": {}})), loopWorld{agent: oneEach, during: during})
	jr := reqs["s1.plan.2"]
	if jr == nil {
		t.Fatal("no second iteration of plan")
	}
	for _, want := range []string{"## Feedback from earlier iterations", "a reviewer rejected the outputs", "split the work by module"} {
		if !strings.Contains(jr.Prompt, want) {
			t.Errorf("prompt lacks %q:\n%s", want, jr.Prompt)
		}
	}
	if strings.Contains(reqs["s1.plan.1"].Prompt, "split the work") {
		t.Error("the first prompt has the reason too")
	}
}

// A loop's gate times out as its level says: approve spawns the children,
// reject runs the loop again (counting against max_iterations), fail
// fails the loop as using up its iterations would: its parent iterates
// again, and a root loop fails the session.
func TestLoopsApprovalTimeout(t *testing.T) {
	until := fixedNow.Add(time.Hour)
	tests := []struct {
		action     string
		level      string // "" for plan
		iterations int
		want       []string
	}{
		{action: schemas.OnTimeoutApprove, iterations: 1, want: []string{
			"approval.expired plan approve: no approval within 1h0m0s",
			"loop.spawned plan-001", "job.requested s1.plan-001.1",
		}},
		{action: schemas.OnTimeoutReject, iterations: 2, want: []string{
			"approval.expired plan reject: rejected: no approval within 1h0m0s",
			"job.requested s1.plan.2 feedback=1",
		}},
		{action: schemas.OnTimeoutReject, iterations: 1, want: []string{
			"approval.expired plan reject: rejected: no approval within 1h0m0s",
			"step.failed plan: no valid output after 1 of 1 iterations; last error: rejected: no approval within 1h0m0s",
			"session.failed",
		}},
		{action: schemas.OnTimeoutFail, iterations: 1, want: []string{
			"approval.expired plan fail: no approval within 1h0m0s",
			"step.failed plan: approval timed out: no approval within 1h0m0s (on_timeout: fail)",
			"session.failed",
		}},
		{action: schemas.OnTimeoutFail, level: "spec", iterations: 2, want: []string{
			"approval.expired plan-001 fail: no approval within 1h0m0s",
			"step.failed plan-001: approval timed out: no approval within 1h0m0s (on_timeout: fail)",
			"loop.invalidated plan-001", "step.invalidated plan", "job.requested s1.plan.1.r1 feedback=1",
		}},
	}
	for _, tt := range tests {
		t.Run(tt.action+" "+tt.level, func(t *testing.T) {
			level, idx, loop := "plan", 0, "plan"
			if tt.level == "spec" {
				level, idx, loop = "spec", 1, "plan-001"
			}
			p := gatedLoops(map[string]*schemas.Approval{level: {TimeoutMs: time.Hour.Milliseconds(), OnTimeout: tt.action}})
			p.Loops.Levels[idx].MaxIterations = tt.iterations
			lines, _, st := runLoops(t, loopsStarted(p), loopWorld{agent: oneEach})
			want := "approval.requested " + loop + " job s1." + loop + ".1, 1 artifacts, until " + until.Format(time.RFC3339) + " then " + tt.action
			if lines[len(lines)-1] != want {
				t.Fatalf("the simulation ended with %q, want %q", lines[len(lines)-1], want)
			}
			tick := schemas.Event{ID: "tick", Session: sess}
			if out := Decide(st, tick, until.Add(-time.Second)); len(out) > 0 {
				t.Fatalf("before the timeout: %s", types(out))
			}
			var got []string
			for _, ev := range Decide(st, tick, until) {
				if l := loopLine(ev); l != "" {
					got = append(got, l)
				}
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("at the timeout:\n  got  %s\n  want %s", strings.Join(got, "\n       "), strings.Join(tt.want, "\n       "))
			}
		})
	}
}

// gatedBacklog is backlogPipeline(1, "") with approval gates by role.
func gatedBacklog(gates map[string]schemas.Approval) schemas.Pipeline {
	p := backlogPipeline(1, "")
	b := *p.Backlog
	b.Approval = gates
	p.Backlog = &b
	return p
}

func TestBacklogApproval(t *testing.T) {
	imported := &schemas.BacklogStart{Tasks: []schemas.Task{task("T1", 1, "todo"), task("T2", 2, "todo")}}
	tests := []struct {
		name   string
		gates  map[string]schemas.Approval
		start  *schemas.BacklogStart
		during map[string][]schemas.Event
		want   []string
	}{
		{
			name:  "a gated task run waits after its summary passed: the task stays open, nothing else runs",
			gates: map[string]schemas.Approval{schemas.RoleIterate: {}},
			start: imported,
			want: []string{
				"task.added T1 [todo] by import", "task.added T2 [todo] by import", "backlog.phase iterate",
				"task.selected T1 run 1 by a", "job.requested s1.T1.1",
				"approval.requested T1 job s1.T1.1, 1 artifacts",
			},
		},
		{
			name:  "approve applies the run's summary; reject runs the task again with the reason",
			gates: map[string]schemas.Approval{schemas.RoleIterate: {}},
			start: imported,
			during: map[string][]schemas.Event{
				"gate s1.T1.1": {approvalSignal(1, "approve", "T1", "", "alice")},
				"gate s1.T2.1": {approvalSignal(2, "reject", "T2", "also cover the error path", "alice")},
				"gate s1.T2.2": {approvalSignal(3, "approve", "T2", "", "alice")},
			},
			want: []string{
				"task.added T1 [todo] by import", "task.added T2 [todo] by import", "backlog.phase iterate",
				"task.selected T1 run 1 by a", "job.requested s1.T1.1",
				"approval.requested T1 job s1.T1.1, 1 artifacts",
				"signal.acknowledged sig-1 approve applied: task T1 approved by alice; it completes",
				"task.updated T1 done", "task.selected T2 run 1 by a", "job.requested s1.T2.1",
				"approval.requested T2 job s1.T2.1, 1 artifacts",
				"signal.acknowledged sig-2 reject applied: task T2 rejected by alice; iteration 2 runs with the reason as feedback",
				"job.requested s1.T2.2 feedback=1",
				"approval.requested T2 job s1.T2.2, 1 artifacts",
				"signal.acknowledged sig-3 approve applied: task T2 approved by alice; it completes",
				"task.updated T2 done", "backlog.phase review", "job.requested s1.review.1",
				"backlog.phase done", "session.completed",
			},
		},
		{
			name:  "a gated bootstrap adds its tasks only once approved; ungated task runs go on",
			gates: map[string]schemas.Approval{schemas.RoleBootstrap: {}},
			during: map[string][]schemas.Event{
				"gate s1.bootstrap.1": {approvalSignal(1, "approve", "bootstrap", "", "dana")},
			},
			want: []string{
				"backlog.phase bootstrap", "job.requested s1.bootstrap.1",
				"approval.requested bootstrap job s1.bootstrap.1, 1 artifacts",
				"signal.acknowledged sig-1 approve applied: the bootstrap run approved by dana; it completes",
				"task.added T1 [todo] by s1.bootstrap.1", "backlog.phase iterate",
				"task.selected T1 run 1 by a", "job.requested s1.T1.1",
				"task.updated T1 done", "backlog.phase review", "job.requested s1.review.1",
				"backlog.phase done", "session.completed",
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := simulate(t, backlogStarted(gatedBacklog(tt.gates), tt.start), doneAll([]schemas.Task{task("T1", 1, "todo")}), tt.during)
			if !slices.Equal(res.lines, tt.want) {
				t.Errorf("decisions:\n  got  %s\n  want %s", strings.Join(res.lines, "\n       "), strings.Join(tt.want, "\n       "))
			}
		})
	}
}

// A rejection's reason reaches the task's next prompt.
func TestBacklogRejectReasonInPrompt(t *testing.T) {
	during := map[string][]schemas.Event{
		"gate s1.T1.1": {approvalSignal(1, "reject", "T1", "also cover the error path", "alice")},
		"gate s1.T1.2": {approvalSignal(2, "approve", "T1", "", "alice")},
	}
	start := &schemas.BacklogStart{Tasks: []schemas.Task{task("T1", 1, "todo")}}
	res := simulate(t, backlogStarted(gatedBacklog(map[string]schemas.Approval{schemas.RoleIterate: {}}), start), doneAll(), during)
	prompt, ok := res.prompts["s1.T1.2"]
	if !ok {
		t.Fatal("no second iteration of T1")
	}
	for _, want := range []string{"a reviewer rejected the outputs", "also cover the error path"} {
		if !strings.Contains(prompt, want) {
			t.Errorf("prompt lacks %q:\n%s", want, prompt)
		}
	}
}

// A task run's gate times out as its role says: approve applies the
// summary, reject runs the task again until its iterations are spent (then
// the task is blocked and the backlog goes on).
func TestBacklogApprovalTimeout(t *testing.T) {
	until := fixedNow.Add(time.Hour)
	tests := []struct {
		action string
		want   []string
	}{
		{action: schemas.OnTimeoutApprove, want: []string{
			"approval.expired T1 approve: no approval within 1h0m0s",
			"task.updated T1 done", "backlog.phase review", "job.requested s1.review.1",
		}},
		{action: schemas.OnTimeoutReject, want: []string{
			"approval.expired T1 reject: rejected: no approval within 1h0m0s",
			"job.requested s1.T1.2 feedback=1",
		}},
		{action: schemas.OnTimeoutFail, want: []string{
			"approval.expired T1 fail: no approval within 1h0m0s",
			`task.updated T1 blocked blockers=["approval timed out: no approval within 1h0m0s (on_timeout: fail)"]`,
			"step.failed T1: approval timed out: no approval within 1h0m0s (on_timeout: fail)",
			"backlog.phase review", "job.requested s1.review.1",
		}},
	}
	for _, tt := range tests {
		t.Run(tt.action, func(t *testing.T) {
			gates := map[string]schemas.Approval{schemas.RoleIterate: {TimeoutMs: time.Hour.Milliseconds(), OnTimeout: tt.action}}
			start := &schemas.BacklogStart{Tasks: []schemas.Task{task("T1", 1, "todo")}}
			res := simulate(t, backlogStarted(gatedBacklog(gates), start), doneAll())
			want := "approval.requested T1 job s1.T1.1, 1 artifacts, until " + until.Format(time.RFC3339) + " then " + tt.action
			if last := res.lines[len(res.lines)-1]; last != want {
				t.Fatalf("the simulation ended with %q, want %q", last, want)
			}
			var got []string
			for _, ev := range Decide(res.state, schemas.Event{ID: "tick", Session: sess}, until) {
				if l := simLine(ev); l != "" {
					got = append(got, l)
				}
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("at the timeout:\n  got  %s\n  want %s", strings.Join(got, "\n       "), strings.Join(tt.want, "\n       "))
			}
		})
	}
}

// A role run's gate that times out with on_timeout: fail fails the
// session, as the run using up its iterations does: no task stands for it.
func TestBacklogRoleApprovalTimeoutFails(t *testing.T) {
	until := fixedNow.Add(time.Hour)
	gates := map[string]schemas.Approval{schemas.RoleReview: {TimeoutMs: time.Hour.Milliseconds(), OnTimeout: schemas.OnTimeoutFail}}
	start := &schemas.BacklogStart{Tasks: []schemas.Task{task("T1", 1, "todo")}}
	res := simulate(t, backlogStarted(gatedBacklog(gates), start), doneAll())
	want := "approval.requested review job s1.review.1, 1 artifacts, until " + until.Format(time.RFC3339) + " then fail"
	if last := res.lines[len(res.lines)-1]; last != want {
		t.Fatalf("the simulation ended with %q, want %q", last, want)
	}
	var got []string
	for _, ev := range Decide(res.state, schemas.Event{ID: "tick", Session: sess}, until) {
		if l := simLine(ev); l != "" {
			got = append(got, l)
		}
	}
	wantAt := []string{
		"approval.expired review fail: no approval within 1h0m0s",
		"step.failed review: approval timed out: no approval within 1h0m0s (on_timeout: fail)",
		"session.failed",
	}
	if !slices.Equal(got, wantAt) {
		t.Errorf("at the timeout:\n  got  %s\n  want %s", strings.Join(got, "\n       "), strings.Join(wantAt, "\n       "))
	}
}

// settleAt folds start and the decisions that follow it (no job is ever
// answered: no worker runs) and returns the state.
func settleAt(t *testing.T, start schemas.Event) *State {
	t.Helper()
	st := NewState()
	Evolve(st, start)
	trigger := start
	for n := 0; n < 50; n++ {
		out := Decide(st, trigger, fixedNow)
		if len(out) == 0 {
			return st
		}
		for _, ev := range out {
			if err := Check(st, ev); err != nil {
				t.Fatalf("decided %s: %v", ev.Type, err)
			}
			Evolve(st, ev)
		}
		trigger = out[len(out)-1]
	}
	t.Fatal("the decisions do not settle")
	return nil
}

// job_dispatch_timeout applies to a loops file's and a backlog's jobs as
// to a pipeline's: a job no worker started by then fails its step and the
// session.
func TestJobDispatchTimeoutLoopsAndBacklog(t *testing.T) {
	loops := loopsPipeline(1)
	loops.JobDispatchTimeoutMs = 30_000
	backlogP := backlogPipeline(1, "")
	backlogP.JobDispatchTimeoutMs = 30_000
	tests := []struct {
		name  string
		start schemas.Event
		want  []string
	}{
		{name: "loops", start: loopsStarted(loops), want: []string{
			"job.cancelled s1.plan.1: job_dispatch_timeout",
			"step.failed plan: job s1.plan.1 was not started within job_dispatch_timeout 30s: no worker took it (does a worker run its tool lanes? see agentworker --lanes)",
			"session.failed",
		}},
		{name: "backlog", start: backlogStarted(backlogP, &schemas.BacklogStart{Tasks: []schemas.Task{task("T1", 1, "todo")}}), want: []string{
			"job.cancelled s1.T1.1: job_dispatch_timeout",
			"step.failed T1: job s1.T1.1 was not started within job_dispatch_timeout 30s: no worker took it (does a worker run its tool lanes? see agentworker --lanes)",
			"session.failed",
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := settleAt(t, tt.start)
			if wake, ok := st.Sessions[sess].WakeAt(); !ok || !wake.Equal(fixedNow.Add(30*time.Second)) {
				t.Errorf("WakeAt = %v, %v; want the dispatch deadline", wake, ok)
			}
			tick := schemas.Event{ID: "tick", Session: sess}
			if out := Decide(st, tick, fixedNow.Add(29*time.Second)); len(out) > 0 {
				t.Fatalf("before the deadline: %s", types(out))
			}
			var got []string
			for _, ev := range Decide(st, tick, fixedNow.Add(30*time.Second)) {
				got = append(got, line(ev))
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("at the deadline:\n  got  %s\n  want %s", strings.Join(got, "\n       "), strings.Join(tt.want, "\n       "))
			}
		})
	}
}
