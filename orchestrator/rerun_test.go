package orchestrator

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/loopbus/loopbus/schemas"
)

// The specification of session.rerun: a completed, failed or stopped
// session runs again in the same session, a step and its dependents (or
// every step), in a new round (given events → then events).

func rerunEv(n, step string) schemas.Event {
	return schemas.Event{ID: "rerun-" + n, Type: schemas.TypeSessionRerun, Session: sess, Data: &schemas.SessionRerun{Step: step, Reason: "agent fixed"}}
}

// roundEv gives ev (a job event of jid(step, iteration)) the job id of a
// later round, and an id of its own.
func roundEv(ev schemas.Event, round int) schemas.Event {
	job := JobID(sess, ev.Step, 1, 1, round)
	switch d := ev.Data.(type) {
	case *schemas.JobRequested:
		job = JobID(sess, ev.Step, d.Iteration, 1, round)
		c := *d
		c.JobID, c.Round = job, round
		ev.Data = &c
	case *schemas.Verdict:
		job = JobID(sess, ev.Step, d.Iteration, 1, round)
		c := *d
		c.JobID = job
		ev.Data = &c
	case *schemas.JobCompleted:
		job = JobID(sess, ev.Step, d.Iteration, 1, round)
		c := *d
		c.JobID = job
		ev.Data = &c
	}
	ev.ID, ev.Job = fmt.Sprintf("%s-round%d", ev.ID, round), job
	return ev
}

// failedChain is chainPipeline's session failing at ideas (its two
// iterations rejected): summary completed, writing-kit never ran.
func failedChain() []schemas.Event {
	sum := art("summary", "summary.json")
	return []schemas.Event{
		started(chainPipeline()), requested("summary", 1), passed("summary", 1, sum), stepCompleted("summary", 1, sum),
		requested("ideas", 1), rejected("ideas", 1, "a"), requested("ideas", 2), rejected("ideas", 2, "b"),
		control(schemas.TypeStepFailed, &schemas.StepFailed{Step: "ideas", Iterations: 2, Error: "no valid output"}),
		control(schemas.TypeSessionFailed, &schemas.SessionFailed{Step: "ideas", Reason: "step ideas failed"}),
	}
}

// completedChain is chainPipeline's session completed.
func completedChain() []schemas.Event {
	sum, ideas, kit := art("summary", "summary.json"), art("ideas", "ideas.json"), art("writing-kit", "kit.json")
	return []schemas.Event{
		started(chainPipeline()), requested("summary", 1), passed("summary", 1, sum), stepCompleted("summary", 1, sum),
		requested("ideas", 1), passed("ideas", 1, ideas), stepCompleted("ideas", 1, ideas),
		requested("writing-kit", 1), passed("writing-kit", 1, kit), stepCompleted("writing-kit", 1, kit),
		control(schemas.TypeSessionCompleted, &schemas.SessionCompleted{Final: []schemas.ArtifactRef{kit}}),
	}
}

func with(evs []schemas.Event, more ...schemas.Event) []schemas.Event {
	return append(append([]schemas.Event{}, evs...), more...)
}

func TestDecideRerun(t *testing.T) {
	stopped := []schemas.Event{started(chainPipeline()), requested("summary", 1), cancelledEv("summary", 1),
		control(schemas.TypeSessionStopped, &schemas.SessionStopped{Kind: schemas.StopSignal, Reason: "x"})}
	runControl(t, []controlCase{
		{
			name:  "a failed session, rerun from its failed step: that step runs again in a new round",
			given: with(failedChain(), rerunEv("1", "ideas")),
			want:  []string{"job.requested s1.ideas.1.r1"},
		},
		{
			name:  "a completed session, rerun from its first step: it runs again; its dependents wait for it",
			given: with(completedChain(), rerunEv("1", "summary")),
			want:  []string{"job.requested s1.summary.1.r1"},
		},
		{
			name:  "a completed session, rerun from its last step: only that step",
			given: with(completedChain(), rerunEv("1", "writing-kit")),
			want:  []string{"job.requested s1.writing-kit.1.r1"},
		},
		{
			name:  "rerun without a step: every step, the first runs",
			given: with(completedChain(), rerunEv("1", "")),
			want:  []string{"job.requested s1.summary.1.r1"},
		},
		{
			name:  "a stopped session: the rerun step runs (a round after the stop's)",
			given: with(stopped, rerunEv("1", "summary")),
			want:  []string{"job.requested s1.summary.1.r2"},
		},
		{
			name: "after the rerun step passes, its dependent runs in a new round too",
			given: with(failedChain(), rerunEv("1", "ideas"), roundEv(requested("ideas", 1), 1),
				roundEv(passed("ideas", 1, art("ideas", "ideas.json")), 1)),
			want: []string{"step.completed ideas after 1", "job.requested s1.writing-kit.1.r1"},
		},
		{
			name:  "a signal to a failed session is still ignored",
			given: with(failedChain(), signal(1, "pause", "", "")),
			want:  []string{"signal.acknowledged sig-1 pause ignored: session s1 already failed"},
		},
		{
			name: "a job the failed run left running is cancelled before the step runs again",
			given: with(failedChain()[:5], control(schemas.TypeSessionFailed, &schemas.SessionFailed{Reason: "budget"}),
				rerunEv("1", "ideas")),
			want: []string{"job.cancelled s1.ideas.1: session rerun", "job.requested s1.ideas.1.r1"},
		},
		{
			name:  "a rerun of a closed session reopens nothing (only the job it left running is cancelled)",
			given: with(failedChain()[:5], closedEv(), rerunEv("1", "ideas")),
			want:  []string{"job.cancelled s1.ideas.1: session closed"},
		},
	})
}

// TestCheckRerunOfUnknownSteps: a finished session whose steps the state
// does not hold (compacted, and its history not read back) is not
// reopened: with no steps it would run nothing and never end.
func TestCheckRerunOfUnknownSteps(t *testing.T) {
	st := NewState() // not Retain: finished sessions are compacted
	for i, ev := range failedChain() {
		ev.Seq = uint64(i + 1)
		Evolve(st, ev)
	}
	if err := Check(st, rerunEv("1", "")); !errors.Is(err, ErrInconsistent) || !strings.Contains(err.Error(), "steps are not known") {
		t.Errorf("Check = %v, want the rerun refused: its steps are not known", err)
	}
}

// A session that ends again after a rerun ends with events of its own:
// the stream would de-duplicate copies of the first run's ids.
func TestRerunIDsAreNew(t *testing.T) {
	first := runDecide(t, with(failedChain()[:8]))
	if len(first) != 2 || first[1].Type != schemas.TypeSessionFailed {
		t.Fatalf("first failure: %v", first)
	}
	failed := with(failedChain()[:8], first...)
	second := runDecide(t, with(failed, rerunEv("1", "ideas"), roundEv(requested("ideas", 1), 1), roundEv(rejected("ideas", 1, "a"), 1),
		roundEv(requested("ideas", 2), 1), roundEv(rejected("ideas", 2, "b"), 1)))
	if len(second) != 2 || second[1].Type != schemas.TypeSessionFailed {
		t.Fatalf("second failure: %v", second)
	}
	for i := range first {
		if first[i].ID == second[i].ID {
			t.Errorf("%s of the rerun has the id of the first run's: %s", second[i].Type, second[i].ID)
		}
	}
	// And a completion after a rerun of a completed session.
	done := completedChain()
	kit := art("writing-kit", "kit.json")
	firstDone := runDecide(t, done[:len(done)-1])
	rerun := runDecide(t, with(done, rerunEv("1", "writing-kit"), roundEv(requested("writing-kit", 1), 1),
		roundEv(passed("writing-kit", 1, kit), 1)))
	if len(firstDone) != 1 || len(rerun) != 2 || rerun[1].Type != schemas.TypeSessionCompleted {
		t.Fatalf("completions: %v / %v", firstDone, rerun)
	}
	if firstDone[0].ID == rerun[1].ID {
		t.Errorf("session.completed of the rerun has the first run's id %s", rerun[1].ID)
	}
}

func TestEvolveRerun(t *testing.T) {
	st := fold(t, with(failedChain(), rerunEv("1", "ideas")))
	s := st.Sessions[sess]
	if s.Status != StatusRunning || s.Reruns != 1 {
		t.Fatalf("status %s, reruns %d; want running, 1", s.Status, s.Reruns)
	}
	for name, want := range map[string]struct {
		status string
		round  int
	}{"summary": {StepCompleted, 0}, "ideas": {StepPending, 1}, "writing-kit": {StepPending, 1}} {
		if got := s.Steps[name]; got.Status != want.status || got.Round != want.round || got.Iteration != 0 && want.status == StepPending {
			t.Errorf("step %s: %s round %d iteration %d; want %s round %d", name, got.Status, got.Round, got.Iteration, want.status, want.round)
		}
	}
	if len(s.Steps["summary"].Artifacts) != 1 {
		t.Error("summary lost its artifacts")
	}
	// Events of the first run that arrive late change nothing once it
	// ended, nor (stale jobs) after the rerun.
	st = fold(t, with(failedChain(), jobCompleted("ideas", 2), rerunEv("1", "ideas"), jobFailed("ideas", 2, "late", "")))
	if got := st.Sessions[sess].Steps["ideas"]; got.Status != StepPending || got.Outcome != outcomeNone {
		t.Errorf("a late result moved the rerun step: %+v", got)
	}
}

func TestCheckRerun(t *testing.T) {
	running := []schemas.Event{started(chainPipeline()), requested("summary", 1)}
	paused := with(running, control(schemas.TypeSessionPaused, &schemas.SessionPaused{Reason: "x"}))
	stopped := with(running, cancelledEv("summary", 1), control(schemas.TypeSessionStopped, &schemas.SessionStopped{Kind: schemas.StopSignal}))
	closed := with(running, closedEv())
	for _, tc := range []struct {
		name  string
		given []schemas.Event
		ev    schemas.Event
		want  error
	}{
		{"failed", failedChain(), rerunEv("1", "ideas"), nil},
		{"completed, every step", completedChain(), rerunEv("1", ""), nil},
		{"stopped", stopped, rerunEv("1", "summary"), nil},
		{"running", running, rerunEv("1", "summary"), ErrInconsistent},
		{"paused", paused, rerunEv("1", ""), ErrInconsistent},
		{"closed", closed, rerunEv("1", ""), ErrInconsistent},
		{"unknown step", failedChain(), rerunEv("1", "nope"), ErrInconsistent},
		{"never started", nil, rerunEv("1", ""), ErrNoSession},
		{"a copy of an applied rerun, after the session failed again", with(failedChain(), rerunEv("1", "ideas"),
			control(schemas.TypeSessionFailed, &schemas.SessionFailed{Reason: "again"})), rerunEv("1", "ideas"), ErrReplayed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := fold(t, tc.given)
			err := Check(st, tc.ev)
			if tc.want == nil && err != nil || tc.want != nil && !errors.Is(err, tc.want) {
				t.Errorf("Check = %v, want %v", err, tc.want)
			}
		})
	}
}
