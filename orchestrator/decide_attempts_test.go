package orchestrator

import (
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/loopbus/loopbus/schemas"
)

func retryableFailure(step string, iteration, attempt int, msg string) schemas.Event {
	job := JobID(sess, step, iteration, attempt, 0)
	return schemas.Event{
		ID: "retryable-" + job, Type: schemas.TypeJobFailed, Session: sess, Step: step, Job: job, Correlation: startID,
		Data: &schemas.JobFailed{JobID: job, Step: step, Iteration: iteration, Worker: "w1", ExitCode: -1, Error: msg, Retryable: true},
	}
}

func requestedAttempt(step string, iteration, attempt int) schemas.Event {
	ev := requested(step, iteration)
	job := JobID(sess, step, iteration, attempt, 0)
	ev.ID = schemas.DeterministicID(sess, schemas.TypeJobRequested, step, strconv.Itoa(iteration), "attempt", strconv.Itoa(attempt))
	ev.Job = job
	jr := *ev.Data.(*schemas.JobRequested)
	jr.JobID, jr.Attempt = job, attempt
	ev.Data = &jr
	return ev
}

// wantAttempt is wantJob for a later attempt of the same iteration.
func wantAttempt(t *testing.T, ev schemas.Event, step string, iteration, attempt int) schemas.Event {
	t.Helper()
	job := JobID(sess, step, iteration, attempt, 0)
	ev.ID = schemas.DeterministicID(sess, "loopbus.job.requested", step, strconv.Itoa(iteration), "attempt", strconv.Itoa(attempt))
	ev.Job = job
	jr := *ev.Data.(*schemas.JobRequested)
	jr.JobID, jr.Attempt = job, attempt
	ev.Data = &jr
	return ev
}

// TestDecideRetryableAttempts: a failure that was not the agent's fault
// (Retryable) runs the same iteration again, up to MaxAttempts, without
// spending an iteration or adding feedback.
func TestDecideRetryableAttempts(t *testing.T) {
	single := singlePipeline() // max_iterations 2
	in := input()
	first := wantJob(t, single, "only", 1, "Do article.md (1)", []schemas.ArtifactRef{in})
	runCases(t, []decideCase{
		{
			name:  "retryable failure: attempt 2 of iteration 1",
			given: []schemas.Event{started(single), requested("only", 1), retryableFailure("only", 1, 1, "cannot provide inputs: not found")},
			want:  []schemas.Event{wantAttempt(t, first, "only", 1, 2)},
		},
		{
			name: "attempt 3 after two retryable failures",
			given: []schemas.Event{started(single), requested("only", 1), retryableFailure("only", 1, 1, "x"),
				requestedAttempt("only", 1, 2), retryableFailure("only", 1, 2, "x")},
			want: []schemas.Event{wantAttempt(t, first, "only", 1, 3)},
		},
		{
			name: "attempts used up: the failure counts as an iteration",
			given: []schemas.Event{started(single), requested("only", 1), retryableFailure("only", 1, 1, "x"),
				requestedAttempt("only", 1, 2), retryableFailure("only", 1, 2, "x"),
				requestedAttempt("only", 1, 3), retryableFailure("only", 1, 3, "job abandoned")},
			want: []schemas.Event{wantJob(t, single, "only", 2,
				"Do article.md (2)\n\n## Feedback from earlier iterations\n\nIteration 1: the agent run failed.\njob abandoned\n",
				[]schemas.ArtifactRef{in}, schemas.Feedback{Iteration: 1, Kind: "job", Message: "job abandoned"})},
		},
		{
			name:  "a result of an earlier attempt is stale",
			given: []schemas.Event{started(single), requested("only", 1), retryableFailure("only", 1, 1, "x"), requestedAttempt("only", 1, 2), passed("only", 1)},
			want:  nil,
		},
	})
}

// TestDecidePromptTooLarge: a prompt over MaxPromptBytes fails the step
// instead of producing an event that cannot be stored.
// Templates that would render without bound stop at the limit or are
// refused before they allocate: the step fails with the reason, and the
// orchestrator's memory stays small (the first case made a service run out
// of memory, on every restart, before templates were bounded).
func TestDecidePromptTooLarge(t *testing.T) {
	for _, tc := range []struct{ tmpl, want string }{
		{`{{range 3000}}{{printf "%0100d" 0}}{{end}}`, "renders more than 131072 bytes"},
		{`{{range 100000}}{{printf "%1000000d" 1}}{{end}}`, "width or precision 1000000 is over 9999"},
		{`{{printf "%*d" 1000000000 1}}`, "width or precision 1000000000 is over 9999"},
		{`{{range 1000}}{{range 1001}}{{end}}{{end}}`, "runs over 1000000 times"},
		{`{{range 10000000000}}{{end}}`, "runs over 1000000 times"},
		// Counts the parser cannot see: the session input's size in bytes
		// (9), nested 8 deep: 43 million runs that write nothing.
		{strings.Repeat(`{{range $.Input.Size}}`, 8) + strings.Repeat(`{{end}}`, 8), "calls run more than 200000 times"},
	} {
		t.Run(tc.tmpl, func(t *testing.T) {
			p := promptPipeline(tc.tmpl, 1)
			evs := runDecide(t, []schemas.Event{started(p)})
			if len(evs) != 2 || evs[0].Type != schemas.TypeStepFailed || evs[1].Type != schemas.TypeSessionFailed {
				t.Fatalf("got %v", types(evs))
			}
			if reason := evs[1].Data.(*schemas.SessionFailed).Reason; !strings.Contains(reason, tc.want) {
				t.Errorf("reason: %s, want %q", reason, tc.want)
			}
		})
	}
}

// TestUnrecordable: a decision the bus refused ends the step and session
// with the cause, under the ids of the ordinary failure events.
func TestUnrecordable(t *testing.T) {
	chain := chainPipeline()
	given := []schemas.Event{started(chain)}
	st := fold(t, given)
	evs := Decide(st, given[0], fixedNow)
	if len(evs) != 1 {
		t.Fatalf("decide: %v", types(evs))
	}
	got := Unrecordable(st, given[0], evs, errors.New("publish rejected: too big"), fixedNow)
	reason := "the orchestrator could not record its decision (job.requested): publish rejected: too big"
	want := []schemas.Event{wantStepFailed("summary", 0, reason), wantSessionFailed("summary", "step summary failed: "+reason)}
	for i := range want {
		want[i].Causation = given[0].ID
	}
	compareEvents(t, got, want, "unrecordable")

	done := fold(t, []schemas.Event{started(chain), sessionFailedEv("earlier")})
	if evs := Unrecordable(done, given[0], evs, errors.New("x"), fixedNow); evs != nil {
		t.Errorf("ended session: %v", types(evs))
	}
}

// TestSafeDecide: a panic while deciding for one session fails that
// session with the panic as the reason instead of crashing the service.
func TestSafeDecide(t *testing.T) {
	st := fold(t, []schemas.Event{started(chainPipeline())})
	st.Sessions[sess].Steps["broken"] = nil // a state Decide cannot handle
	evs := SafeDecide(st, schemas.Event{ID: "trigger-1", Type: schemas.TypeJobCompleted, Session: sess}, fixedNow)
	if len(evs) != 1 || evs[0].Type != schemas.TypeSessionFailed {
		t.Fatalf("got %v", types(evs))
	}
	if r := evs[0].Data.(*schemas.SessionFailed).Reason; !strings.Contains(r, "could not decide after event trigger-1") || !strings.Contains(r, "panic:") {
		t.Errorf("reason: %s", r)
	}
	if got := SafeDecide(fold(t, []schemas.Event{started(chainPipeline())}), schemas.Event{ID: "t", Session: sess}, fixedNow); len(got) == 0 || got[0].Type != schemas.TypeJobRequested {
		t.Errorf("a sound state decides as Decide does: %v", types(got))
	}
}

func TestSafeEvolve(t *testing.T) {
	// A session.started without its data (never from the bus, which
	// decodes and checks every event) makes Evolve panic.
	err := safeEvolve(NewState(), schemas.Event{ID: "e1", Type: schemas.TypeSessionStarted, Session: "s2"})
	if err == nil || !strings.Contains(err.Error(), "folding event e1 (loopbus.session.started) panicked") {
		t.Fatalf("err = %v", err)
	}
}
