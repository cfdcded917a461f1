package orchestrator

import (
	"testing"
	"time"

	"github.com/loopbus/loopbus/schemas"
)

// The specification of sessions left hanging: a budget raised on a
// session its budget stopped, and a session closed for good (given events
// → the events Decide returns).

func budgetEv(n string, b schemas.Budget) schemas.Event {
	return schemas.Event{ID: "budget-" + n, Type: schemas.TypeSessionBudget, Session: sess, Data: &schemas.SessionBudget{Budget: b, Reason: "test"}}
}

func closedEv() schemas.Event {
	return schemas.Event{ID: "close-1", Type: schemas.TypeSessionClosed, Session: sess, Data: &schemas.SessionClosed{Reason: "test"}}
}

func TestDecideSessionBudget(t *testing.T) {
	withBudget := func(p schemas.Pipeline, b schemas.Budget) schemas.Pipeline {
		p.Budget = &b
		return p
	}
	runs := withBudget(promptPipeline("Do {{.Input.Name}}", 5), schemas.Budget{MaxIterations: 2})
	cost := withBudget(promptPipeline("Do {{.Input.Name}}", 5), schemas.Budget{MaxCostUSD: 0.5})
	stoppedByRuns := []schemas.Event{started(runs), requested("p", 1), rejected("p", 1, "a"), requested("p", 2), rejected("p", 2, "b"),
		control(schemas.TypeSessionStopped, &schemas.SessionStopped{Kind: schemas.StopBudget, Reason: "x"})}
	stoppedByCost := []schemas.Event{started(cost), requested("p", 1), withUsage(jobCompleted("p", 1), 0.6, 100), rejected("p", 1, "again"),
		control(schemas.TypeSessionStopped, &schemas.SessionStopped{Kind: schemas.StopBudget, Reason: "x"})}
	with := func(evs []schemas.Event, more ...schemas.Event) []schemas.Event {
		return append(append([]schemas.Event{}, evs...), more...)
	}
	runControl(t, []controlCase{
		{
			name:  "more agent runs: the session resumes and dispatches the pending iteration",
			given: with(stoppedByRuns, budgetEv("1", schemas.Budget{MaxIterations: 4})),
			want:  []string{"session.resumed", "job.requested s1.p.3"},
		},
		{
			name:  "more money: the session resumes",
			given: with(stoppedByCost, budgetEv("1", schemas.Budget{MaxCostUSD: 5})),
			want:  []string{"session.resumed", "job.requested s1.p.2"},
		},
		{
			name:  "a raise that is still spent: the stop is recorded again",
			given: with(stoppedByCost, budgetEv("1", schemas.Budget{MaxCostUSD: 0.55})),
			want:  []string{"session.stopped budget: budget: still spent after the new budget: cost $0.6000 reached max_cost_usd $0.5500"},
		},
		{
			name: "which answers the raise: nothing more",
			given: with(stoppedByCost, budgetEv("1", schemas.Budget{MaxCostUSD: 0.55}),
				control(schemas.TypeSessionStopped, &schemas.SessionStopped{Kind: schemas.StopBudget, Reason: "y"}), signal(1, "info", "", "hi")),
			want: []string{"signal.acknowledged sig-1 info applied: added to the next prompt of step p"},
		},
		{
			name:  "a raise of another bound leaves the spent one: still stopped",
			given: with(stoppedByCost, budgetEv("1", schemas.Budget{MaxTokens: 1 << 20})),
			want:  []string{"session.stopped budget: budget: still spent after the new budget: cost $0.6000 reached max_cost_usd $0.5000"},
		},
		{
			name:  "a raise before the stop is not answered again",
			given: []schemas.Event{started(runs), budgetEv("1", schemas.Budget{MaxIterations: 2}), requested("p", 1), rejected("p", 1, "a"), requested("p", 2), rejected("p", 2, "b"), control(schemas.TypeSessionStopped, &schemas.SessionStopped{Kind: schemas.StopBudget, Reason: "x"})},
			want:  nil,
		},
		{
			name:  "a session stopped by a signal is not resumed by a budget",
			given: with(stoppedByCost[:4], control(schemas.TypeSessionStopped, &schemas.SessionStopped{Kind: schemas.StopSignal, Reason: "x"}), budgetEv("1", schemas.Budget{MaxCostUSD: 5})),
			want:  nil,
		},
		{
			name: "the resumed session spends its new budget and stops again",
			given: with(stoppedByRuns, budgetEv("1", schemas.Budget{MaxIterations: 3}),
				control(schemas.TypeSessionResumed, &schemas.SessionResumed{Reason: "budget raised"}), requested("p", 3), jobFailed("p", 3, "boom", "")),
			want: []string{"session.stopped budget: budget: 3 agent runs reached max_iterations 3"},
		},
		{
			name: "raised while running: a later bound applies",
			given: []schemas.Event{started(runs), budgetEv("1", schemas.Budget{MaxIterations: 3}), requested("p", 1), rejected("p", 1, "a"),
				requested("p", 2), rejected("p", 2, "b")},
			want: []string{"job.requested s1.p.3"},
		},
		{
			name:  "a resume is refused while a raise is still spent",
			given: with(stoppedByRuns, budgetEv("1", schemas.Budget{MaxIterations: 1}), signal(1, "resume", "")),
			want: []string{"signal.acknowledged sig-1 resume ignored: the budget is still exhausted (2 agent runs reached max_iterations 1); raise it with loopbus budget s1, or close the session with loopbus close s1",
				"session.stopped budget: budget: still spent after the new budget: 2 agent runs reached max_iterations 1"},
		},
	})
}

func TestDecideSessionClosed(t *testing.T) {
	p := singlePipeline()
	diamond := diamondPipeline()
	runControl(t, []controlCase{
		{
			name:  "a closed session cancels its running job and dispatches nothing",
			given: []schemas.Event{started(p), requested("only", 1), closedEv()},
			want:  []string{"job.cancelled s1.only.1: session closed"},
		},
		{
			name: "every job in flight is cancelled",
			given: []schemas.Event{started(diamond), requested("a", 1), passed("a", 1, art("a", "a.json")), stepCompleted("a", 1, art("a", "a.json")),
				requested("b", 1), requested("c", 1), closedEv()},
			want: []string{"job.cancelled s1.b.1: session closed", "job.cancelled s1.c.1: session closed"},
		},
		{
			name:  "once cancelled, nothing more",
			given: []schemas.Event{started(p), requested("only", 1), closedEv(), cancelledEv("only", 1)},
			want:  nil,
		},
		{
			name:  "a late result changes nothing",
			given: []schemas.Event{started(p), requested("only", 1), closedEv(), cancelledEv("only", 1), passed("only", 1, art("only", "o.json"))},
			want:  nil,
		},
		{
			name:  "signals are ignored",
			given: []schemas.Event{started(p), requested("only", 1), closedEv(), cancelledEv("only", 1), signal(1, "resume", "")},
			want:  []string{"signal.acknowledged sig-1 resume ignored: session s1 already closed"},
		},
		{
			name:  "a budget-stopped session closed: a raise does not reopen it",
			given: []schemas.Event{started(p), requested("only", 1), control(schemas.TypeSessionStopped, &schemas.SessionStopped{Kind: schemas.StopBudget, Reason: "x"}), closedEv(), cancelledEv("only", 1), budgetEv("1", schemas.Budget{MaxCostUSD: 9})},
			want:  nil,
		},
	})
	// Closed is terminal in the state, and stays so.
	st := fold(t, []schemas.Event{started(p), requested("only", 1), closedEv(), cancelledEv("only", 1), sessionCompletedEv(), sessionFailedEv("late")})
	if s := st.Sessions[sess]; s.Status != StatusClosed || !s.terminal() || len(s.Orphans) != 0 {
		t.Errorf("status %s, terminal %v, orphans %v; want closed, terminal, none", s.Status, s.terminal(), s.Orphans)
	}
	// A completed session is not closed.
	st = fold(t, []schemas.Event{started(p), requested("only", 1), passed("only", 1, art("only", "o.json")), stepCompleted("only", 1, art("only", "o.json")), sessionCompletedEv(), closedEv()})
	if s := st.Sessions[sess]; s.Status != StatusCompleted {
		t.Errorf("a completed session closed later: status %s, want completed", s.Status)
	}
}

func TestDecideJobDispatchTimeout(t *testing.T) {
	p := singlePipeline()
	p.JobDispatchTimeoutMs = 30_000
	at := func(ev schemas.Event, tm time.Time) schemas.Event { ev.Time = tm; return ev }
	req := at(requested("only", 1), fixedNow)
	jobStarted := schemas.Event{ID: "started-1", Type: schemas.TypeJobStarted, Session: sess, Step: "only", Job: jid("only", 1),
		Data: &schemas.JobStarted{JobID: jid("only", 1), Worker: "w1", Delivery: 1}}
	noLimit := singlePipeline()
	runControl(t, []controlCase{
		{
			name:  "before the deadline: nothing",
			given: []schemas.Event{started(p), req},
			now:   fixedNow.Add(29 * time.Second),
			want:  nil,
		},
		{
			name:  "not started by the deadline: the job is cancelled, the step and the session fail",
			given: []schemas.Event{started(p), req},
			now:   fixedNow.Add(30 * time.Second),
			want: []string{
				"job.cancelled s1.only.1: job_dispatch_timeout",
				"step.failed only: job s1.only.1 was not started within job_dispatch_timeout 30s: no worker took it (does a worker run its tool lanes? see agentworker --lanes)",
				"session.failed",
			},
		},
		{
			name:  "a started job runs on",
			given: []schemas.Event{started(p), req, jobStarted},
			now:   fixedNow.Add(time.Hour),
			want:  nil,
		},
		{
			name:  "without job_dispatch_timeout a job waits for a worker",
			given: []schemas.Event{started(noLimit), req},
			now:   fixedNow.Add(24 * time.Hour),
			want:  nil,
		},
	})
	// The service wakes at the deadline, and not once the job started.
	st := fold(t, []schemas.Event{started(p), req})
	if wake, ok := st.Sessions[sess].WakeAt(); !ok || !wake.Equal(fixedNow.Add(30*time.Second)) {
		t.Errorf("WakeAt = %v, %v; want the dispatch deadline", wake, ok)
	}
	st = fold(t, []schemas.Event{started(p), req, jobStarted})
	if wake, ok := st.Sessions[sess].WakeAt(); ok {
		t.Errorf("WakeAt = %v after the job started, want none", wake)
	}
}
