package orchestrator

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/loopbus/loopbus/backlog"
	"github.com/loopbus/loopbus/schemas"
)

func TestCheck(t *testing.T) {
	t.Parallel()
	p := singlePipeline()
	secondStart := started(p)
	secondStart.ID = "another-start"
	one, two := art("only", "one.json"), art("only", "two.json")
	bp := backlogPipeline(1, "")
	tests := []struct {
		name    string
		given   []schemas.Event
		ev      schemas.Event
		wantErr error
		// wantMsg is part of the error's message (its reason).
		wantMsg string
	}{
		{name: "first event of a session", ev: started(p)},
		{name: "new event of a running session", given: []schemas.Event{started(p)}, ev: requested("only", 1)},
		{name: "copy of an event of a running session", given: []schemas.Event{started(p), requested("only", 1)}, ev: requested("only", 1), wantErr: ErrReplayed},
		{name: "copy of session.started", given: []schemas.Event{started(p)}, ev: started(p), wantErr: ErrReplayed},
		{name: "second session.started with another id", given: []schemas.Event{started(p)}, ev: secondStart, wantErr: ErrReplayed},
		{name: "second session.started of a finished session", given: []schemas.Event{started(p), sessionCompletedEv()}, ev: secondStart, wantErr: ErrReplayed},
		// A finished session forgets its ids (its events change nothing).
		{name: "copy of an event of a finished session", given: []schemas.Event{started(p), requested("only", 1), sessionCompletedEv()}, ev: requested("only", 1)},
		{name: "event of an unknown session", ev: requested("only", 1), wantErr: ErrNoSession},
		// Facts the history contradicts (forged, whoever sent them).
		{name: "a verdict on a job that never completed", given: []schemas.Event{started(p), requested("only", 1)}, ev: passed("only", 1), wantErr: ErrInconsistent},
		{name: "a verdict once the job completed", given: []schemas.Event{started(p), requested("only", 1), jobCompleted("only", 1)}, ev: passed("only", 1)},
		{name: "a result of a job never requested", given: []schemas.Event{started(p)}, ev: jobCompleted("only", 1), wantErr: ErrInconsistent},
		{name: "a failure of a job never requested", given: []schemas.Event{started(p)}, ev: jobFailed("only", 1, "x", ""), wantErr: ErrInconsistent},
		{name: "a result naming an artifact never stored", given: []schemas.Event{started(p), requested("only", 1)}, ev: withOutputs(jobCompleted("only", 1), art("only", "out.md")), wantErr: ErrInconsistent},
		{name: "a result naming a stored artifact", given: []schemas.Event{started(p), requested("only", 1), stored("only", 1, art("only", "out.md"))}, ev: withOutputs(jobCompleted("only", 1), art("only", "out.md"))},
		{name: "a result naming the bytes an earlier run of the job stored", given: []schemas.Event{started(p), requested("only", 1), stored("only", 1, art("only", "out.md"))}, ev: withOutputs(jobCompleted("only", 1), elsewhere(art("only", "out.md")))},
		{name: "a verdict naming an artifact its job did not produce", given: []schemas.Event{started(p), requested("only", 1), jobCompleted("only", 1)}, ev: withArtifacts(passed("only", 1), art("only", "out.md")), wantErr: ErrInconsistent},
		{name: "a result naming a stored artifact with another digest", given: []schemas.Event{started(p), requested("only", 1), stored("only", 1, art("only", "out.md"))}, ev: withOutputs(jobCompleted("only", 1), art("only", "other.md")), wantErr: ErrInconsistent},

		// step.completed: the step's current job passed, with the
		// verdict's artifacts.
		{name: "a step completed on its job's passed verdict", given: verdictOn(p, passed("only", 1, one, two)), ev: stepCompleted("only", 1, one, two)},
		{name: "a step completed that never ran", given: []schemas.Event{started(p)}, ev: stepCompleted("only", 1), wantErr: ErrInconsistent, wantMsg: "completes step only, which is pending"},
		{name: "a step completed while its job runs", given: []schemas.Event{started(p), requested("only", 1)}, ev: stepCompleted("only", 1), wantErr: ErrInconsistent, wantMsg: "whose validation has not passed"},
		{name: "a step completed once its job completed, before the verdict", given: []schemas.Event{started(p), requested("only", 1), jobCompleted("only", 1)}, ev: stepCompleted("only", 1), wantErr: ErrInconsistent, wantMsg: "whose validation has not passed"},
		{name: "a step completed on a failed verdict", given: verdictOn(p, rejected("only", 1, "")), ev: stepCompleted("only", 1), wantErr: ErrInconsistent, wantMsg: "whose run or validation failed"},
		{name: "a step completed on a failed job", given: []schemas.Event{started(p), requested("only", 1), jobFailed("only", 1, "boom", "")}, ev: stepCompleted("only", 1), wantErr: ErrInconsistent, wantMsg: "whose run or validation failed"},
		{name: "a step completed with another job than the one that passed", given: verdictOn(p, passed("only", 1, one, two)), ev: stepCompleted("only", 2, one, two), wantErr: ErrInconsistent, wantMsg: "with job s1.only.2, but the step's current job is s1.only.1"},
		{name: "a step completed with the passed job of an earlier iteration", given: append(verdictOn(p, rejected("only", 1, "")), requested("only", 2)), ev: stepCompleted("only", 1), wantErr: ErrInconsistent, wantMsg: "current job is s1.only.2"},
		{name: "a step completed with artifacts the verdict did not pass", given: verdictOn(p, passed("only", 1, one, two)), ev: stepCompleted("only", 1, one, elsewhere(two)), wantErr: ErrInconsistent, wantMsg: "but the passed verdict on job s1.only.1 names"},
		{name: "a step completed with fewer artifacts than the verdict passed", given: verdictOn(p, passed("only", 1, one, two)), ev: stepCompleted("only", 1, one), wantErr: ErrInconsistent, wantMsg: "but the passed verdict"},
		{name: "a step completed with a content hash of other artifacts", given: verdictOn(p, passed("only", 1, one, two)), ev: withHash(stepCompleted("only", 1, one, two), "0123456789abcdef"), wantErr: ErrInconsistent, wantMsg: "content hash 0123456789abcdef"},
		{name: "a step completed twice", given: append(verdictOn(p, passed("only", 1, one, two)), stepCompleted("only", 1, one, two)), ev: renamed(stepCompleted("only", 1, one, two), "again"), wantErr: ErrInconsistent, wantMsg: "which is completed"},
		{name: "a step the session does not have", given: []schemas.Event{started(p)}, ev: stepCompleted("other", 1), wantErr: ErrInconsistent, wantMsg: "which session s1 does not have"},
		{name: "a step completed while the session is paused", given: append(verdictOn(p, passed("only", 1, one, two)), control(schemas.TypeSessionPaused, &schemas.SessionPaused{})), ev: stepCompleted("only", 1, one, two)},
		{name: "a backlog task run completed on its passed report", given: backlogRun(true), ev: stepCompleted("a", 1, art("a", backlog.SummaryName))},
		{name: "a backlog task run completed on a verdict carrying no report", given: backlogRun(false), ev: stepCompleted("a", 1, art("a", backlog.SummaryName)), wantErr: ErrInconsistent, wantMsg: "whose run or validation failed"},
		{name: "a loop completed on its passed verdict", given: oneLoop(false, true), ev: stepCompleted("plan", 1)},
		{name: "a loop completed before its verdict", given: oneLoop(false, false), ev: stepCompleted("plan", 1), wantErr: ErrInconsistent, wantMsg: "whose validation has not passed"},

		// session.completed: by the session's kind's rule.
		{name: "a pipeline completed once every step completed", given: append(verdictOn(p, passed("only", 1, one, two)), stepCompleted("only", 1, one, two)), ev: sessionCompletedEv(one, two)},
		{name: "a pipeline completed while a step runs", given: []schemas.Event{started(p), requested("only", 1)}, ev: sessionCompletedEv(), wantErr: ErrInconsistent, wantMsg: "completes session s1, but step only is running"},
		{name: "a pipeline completed while a step waits to run", given: []schemas.Event{started(chainPipeline()), requested("summary", 1), jobCompleted("summary", 1), passed("summary", 1), stepCompleted("summary", 1)}, ev: sessionCompletedEv(), wantErr: ErrInconsistent, wantMsg: "step ideas is pending"},
		{name: "a pipeline completed with its last step passed but not completed", given: verdictOn(p, passed("only", 1, one, two)), ev: sessionCompletedEv(), wantErr: ErrInconsistent, wantMsg: "step only is running"},
		{name: "a backlog completed once it is done", given: []schemas.Event{backlogStarted(bp, nil), phaseEv(schemas.PhaseDone)}, ev: sessionCompletedEv()},
		{name: "a backlog completed while it iterates", given: []schemas.Event{backlogStarted(bp, nil), phaseEv(schemas.PhaseIterate)}, ev: sessionCompletedEv(), wantErr: ErrInconsistent, wantMsg: `the backlog is in phase "iterate"`},
		{name: "a backlog completed before it started", given: []schemas.Event{backlogStarted(bp, nil)}, ev: sessionCompletedEv(), wantErr: ErrInconsistent, wantMsg: `the backlog is in phase ""`},
		{name: "a backlog completed while a run is due", given: []schemas.Event{backlogStarted(bp, nil), phaseEv(schemas.PhaseIterate), taskAddedEv("a"), taskSelectedEv("a"), phaseEv(schemas.PhaseDone)}, ev: sessionCompletedEv(), wantErr: ErrInconsistent, wantMsg: "run a is pending"},
		{name: "a backlog completed while stopped", given: []schemas.Event{backlogStarted(bp, nil), phaseEv(schemas.PhaseDone), control(schemas.TypeSessionStopped, &schemas.SessionStopped{Kind: schemas.StopSignal})}, ev: sessionCompletedEv(), wantErr: ErrInconsistent, wantMsg: "it is stopped"},
		{name: "loops completed once every loop completed", given: append(oneLoop(false, true), stepCompleted("plan", 1)), ev: sessionCompletedEv()},
		{name: "loops completed while a loop runs", given: oneLoop(false, true), ev: sessionCompletedEv(), wantErr: ErrInconsistent, wantMsg: "loop plan is running"},
		{name: "loops completed before the root was spawned", given: []schemas.Event{loopsStarted(loopsPipeline(1))}, ev: sessionCompletedEv(), wantErr: ErrInconsistent, wantMsg: "no loop was spawned"},
		{name: "loops completed while a passed loop waits to merge", given: append(oneLoop(true, true), stepCompleted("plan", 1)), ev: sessionCompletedEv(), wantErr: ErrInconsistent, wantMsg: "wait to be merged"},

		// Jobs held by the signer of their job.started (when the bus
		// verifies signatures).
		{name: "a result signed by the worker that started the job", given: []schemas.Event{started(p), requested("only", 1), jobStarted("only", 1, keyA, 1)}, ev: signed(jobCompleted("only", 1), keyA)},
		{name: "a result signed by another worker", given: []schemas.Event{started(p), requested("only", 1), jobStarted("only", 1, keyA, 1)}, ev: signed(jobCompleted("only", 1), keyB), wantErr: ErrInconsistent,
			wantMsg: "is signed by UBBBBBBBBBBB…, but job s1.only.1 is held by UAAAAAAAAAAA… (started it at 2025-03-04T05:06:07Z)"},
		{name: "a failure signed by another worker", given: []schemas.Event{started(p), requested("only", 1), jobStarted("only", 1, keyA, 1)}, ev: signed(jobFailed("only", 1, "x", ""), keyB), wantErr: ErrInconsistent, wantMsg: "is held by UAAAAAAAAAAA…"},
		{name: "a result signed by the worker that took over the job", given: []schemas.Event{started(p), requested("only", 1), jobStarted("only", 1, keyA, 1), jobStarted("only", 1, keyB, 2)}, ev: signed(jobCompleted("only", 1), keyB)},
		{name: "another worker claims a started job at the same delivery", given: []schemas.Event{started(p), requested("only", 1), jobStarted("only", 1, keyA, 1)}, ev: withID(jobStarted("only", 1, keyB, 1), "claim"), wantErr: ErrInconsistent, wantMsg: "a job changes hands only when it is delivered again"},
		{name: "another worker takes a job over when it is delivered again", given: []schemas.Event{started(p), requested("only", 1), jobStarted("only", 1, keyA, 1)}, ev: jobStarted("only", 1, keyB, 2)},
		{name: "the holder announces its job again", given: []schemas.Event{started(p), requested("only", 1), jobStarted("only", 1, keyA, 2)}, ev: withID(jobStarted("only", 1, keyA, 1), "again")},
		{name: "a signed verdict on a result the orchestrator refused", given: []schemas.Event{started(p), requested("only", 1), jobStarted("only", 1, keyA, 1), signed(jobCompleted("only", 1), keyA)},
			ev: caused(signed(rejected("only", 1, "no output"), keyV), "forged-result"), wantErr: ErrInconsistent, wantMsg: "judges result forged-result of job s1.only.1, but the job's accepted result is completed-only-1"},
		{name: "a signed verdict on the accepted result", given: []schemas.Event{started(p), requested("only", 1), jobStarted("only", 1, keyA, 1), signed(jobCompleted("only", 1), keyA)},
			ev: caused(signed(passed("only", 1), keyV), "completed-only-1")},
		{name: "an artifact of a job never requested", given: []schemas.Event{started(p)}, ev: stored("only", 1, one), wantErr: ErrInconsistent, wantMsg: "belongs to job s1.only.1, which was never requested"},
		{name: "a tool call of a job never requested", given: []schemas.Event{started(p)}, ev: toolStarted("only", 1), wantErr: ErrInconsistent, wantMsg: "which was never requested"},
		{name: "a result signed by the worker whose job was taken over", given: []schemas.Event{started(p), requested("only", 1), jobStarted("only", 1, keyA, 1), jobStarted("only", 1, keyB, 2)}, ev: signed(jobCompleted("only", 1), keyA), wantErr: ErrInconsistent, wantMsg: "is held by UBBBBBBBBBBB…"},
		{name: "a signed result of a job no worker started", given: []schemas.Event{started(p), requested("only", 1)}, ev: signed(jobCompleted("only", 1), keyA), wantErr: ErrInconsistent, wantMsg: "no worker announced starting job s1.only.1"},
		{name: "a signed failure of a job no worker started", given: []schemas.Event{started(p), requested("only", 1)}, ev: signed(jobFailed("only", 1, "x", ""), keyA), wantErr: ErrInconsistent, wantMsg: "no worker announced starting job s1.only.1"},
		{name: "a signed result of a job only an unsigned job.started started", given: []schemas.Event{started(p), requested("only", 1), jobStarted("only", 1, "", 1)}, ev: signed(jobCompleted("only", 1), keyA), wantErr: ErrInconsistent, wantMsg: "no worker announced starting"},
		{name: "a signed result of a job started before it was requested", given: []schemas.Event{started(p), jobStarted("only", 1, keyA, 1), requested("only", 1)}, ev: signed(jobCompleted("only", 1), keyA), wantErr: ErrInconsistent, wantMsg: "no worker announced starting"},
		{name: "a signed failure of a job cancelled before a worker started it", given: []schemas.Event{started(p), requested("only", 1), cancelledEv("only", 1)}, ev: signed(cancelledBeforeStart("only", 1), keyA)},
		{name: "a signed cancelled failure of a job never cancelled", given: []schemas.Event{started(p), requested("only", 1)}, ev: signed(cancelledBeforeStart("only", 1), keyA), wantErr: ErrInconsistent, wantMsg: "no worker announced starting"},
		{name: "a signed cancelled failure reporting usage", given: []schemas.Event{started(p), requested("only", 1), cancelledEv("only", 1)}, ev: signed(withUsage(cancelledBeforeStart("only", 1), 1, 10), keyA), wantErr: ErrInconsistent, wantMsg: "no worker announced starting"},
		{name: "a cancelled failure signed by another than the holder", given: []schemas.Event{started(p), requested("only", 1), jobStarted("only", 1, keyA, 1), cancelledEv("only", 1)}, ev: signed(cancelledBeforeStart("only", 1), keyB), wantErr: ErrInconsistent, wantMsg: "is held by UAAAAAAAAAAA…"},
		{name: "an artifact stored by the job's holder", given: []schemas.Event{started(p), requested("only", 1), jobStarted("only", 1, keyA, 1)}, ev: signed(stored("only", 1, one), keyA)},
		{name: "an artifact stored by another worker", given: []schemas.Event{started(p), requested("only", 1), jobStarted("only", 1, keyA, 1)}, ev: signed(stored("only", 1, one), keyB), wantErr: ErrInconsistent, wantMsg: "is held by UAAAAAAAAAAA…"},
		{name: "a tool started by another worker", given: []schemas.Event{started(p), requested("only", 1), jobStarted("only", 1, keyA, 1)}, ev: signed(toolStarted("only", 1), keyB), wantErr: ErrInconsistent, wantMsg: "is held by"},
		{name: "a tool completed by another worker", given: []schemas.Event{started(p), requested("only", 1), jobStarted("only", 1, keyA, 1)}, ev: signed(toolCompleted("only", 1), keyB), wantErr: ErrInconsistent, wantMsg: "is held by"},
		{name: "an agent message from another worker", given: []schemas.Event{started(p), requested("only", 1), jobStarted("only", 1, keyA, 1)}, ev: signed(agentMessage("only", 1), keyB), wantErr: ErrInconsistent, wantMsg: "is held by"},
		{name: "a tool completed by the job's holder", given: []schemas.Event{started(p), requested("only", 1), jobStarted("only", 1, keyA, 1)}, ev: signed(toolCompleted("only", 1), keyA)},
		{name: "an agent message from the job's holder", given: []schemas.Event{started(p), requested("only", 1), jobStarted("only", 1, keyA, 1)}, ev: signed(agentMessage("only", 1), keyA)},
		{name: "a signed progress event of a job no worker started", given: []schemas.Event{started(p), requested("only", 1)}, ev: signed(toolStarted("only", 1), keyA)},

		// Leases: a job changes hands only when its holder released it
		// or was silent for two thirds of its lease (by the stream's clock).
		{name: "a takeover while the holder is heard from", given: []schemas.Event{started(p), requested("only", 1), leased(jobStarted("only", 1, keyA, 1), 0), at(heartbeat("only", 1, keyA, 1), 10)},
			ev: at(jobStarted("only", 1, keyB, 2), 20), wantErr: ErrInconsistent, wantMsg: "which was heard from 10s before (its lease is 30s): a job changes hands only when its holder released it or was silent for 15s"},
		{name: "a takeover after the holder went silent", given: []schemas.Event{started(p), requested("only", 1), leased(jobStarted("only", 1, keyA, 1), 0), at(heartbeat("only", 1, keyA, 1), 10)},
			ev: at(jobStarted("only", 1, keyB, 2), 40)},
		{name: "a takeover timed by the holder's progress", given: []schemas.Event{started(p), requested("only", 1), leased(jobStarted("only", 1, keyA, 1), 0), at(signed(toolStarted("only", 1), keyA), 30)},
			ev: at(jobStarted("only", 1, keyB, 2), 40), wantErr: ErrInconsistent, wantMsg: "heard from 10s before"},
		{name: "a lease beyond an hour counts as an hour", given: []schemas.Event{started(p), requested("only", 1), leasedFor(jobStarted("only", 1, keyA, 1), 0, 1_000_000_000_000)},
			ev: at(jobStarted("only", 1, keyB, 2), 1800)},
		{name: "another worker's heartbeat does not keep the job", given: []schemas.Event{started(p), requested("only", 1), leased(jobStarted("only", 1, keyA, 1), 0)},
			ev: at(heartbeat("only", 1, keyB, 1), 10), wantErr: ErrInconsistent, wantMsg: "is held by UAAAAAAAAAAA…"},
		{name: "a takeover after the holder released the job", given: []schemas.Event{started(p), requested("only", 1), leased(jobStarted("only", 1, keyA, 1), 0), at(released("only", 1, keyA, 1), 1)},
			ev: at(jobStarted("only", 1, keyB, 2), 2)},
		{name: "a release by another worker", given: []schemas.Event{started(p), requested("only", 1), leased(jobStarted("only", 1, keyA, 1), 0)},
			ev: at(released("only", 1, keyB, 1), 1), wantErr: ErrInconsistent, wantMsg: "is held by UAAAAAAAAAAA…"},
		{name: "a takeover at once after a refused release", given: []schemas.Event{started(p), requested("only", 1), leased(jobStarted("only", 1, keyA, 1), 0), at(released("only", 1, keyB, 1), 1)},
			ev: at(jobStarted("only", 1, keyB, 2), 2), wantErr: ErrInconsistent, wantMsg: "which was heard from 2s before"},
		{name: "a takeover with no stream time", given: []schemas.Event{started(p), requested("only", 1), leased(jobStarted("only", 1, keyA, 1), 0)},
			ev: jobStarted("only", 1, keyB, 2), wantErr: ErrInconsistent, wantMsg: "cannot be checked"},
		{name: "a takeover at the same delivery after a release", given: []schemas.Event{started(p), requested("only", 1), leased(jobStarted("only", 1, keyA, 1), 0), at(released("only", 1, keyA, 1), 1)},
			ev: at(withID(jobStarted("only", 1, keyB, 1), "b"), 2), wantErr: ErrInconsistent, wantMsg: "a job changes hands only when it is delivered again"},
		{name: "the holder's own redelivery while it was heard from", given: []schemas.Event{started(p), requested("only", 1), leased(jobStarted("only", 1, keyA, 1), 0), at(heartbeat("only", 1, keyA, 1), 10)},
			ev: at(jobStarted("only", 1, keyA, 2), 11)},
		{name: "a result of the worker whose takeover was refused", given: []schemas.Event{started(p), requested("only", 1), leased(jobStarted("only", 1, keyA, 1), 0), at(heartbeat("only", 1, keyA, 1), 10)},
			ev: signed(jobCompleted("only", 1), keyB), wantErr: ErrInconsistent, wantMsg: "is held by UAAAAAAAAAAA…"},
		// With no trust configured, events carry no signer: nobody holds a job.
		{name: "an unsigned result after a signed job.started", given: []schemas.Event{started(p), requested("only", 1), jobStarted("only", 1, keyA, 1)}, ev: jobCompleted("only", 1), wantErr: nil},
		{name: "an unsigned result of a job no worker started", given: []schemas.Event{started(p), requested("only", 1)}, ev: jobCompleted("only", 1)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := fold(t, tt.given)
			err := Check(st, tt.ev)
			if !errors.Is(err, tt.wantErr) || (tt.wantErr == nil && err != nil) {
				t.Errorf("Check = %v, want %v", err, tt.wantErr)
			}
			if err != nil && !strings.Contains(err.Error(), tt.wantMsg) {
				t.Errorf("Check = %q, want it to say %q", err, tt.wantMsg)
			}
		})
	}
}

// TestCheckAcceptsOwnDecisions: every decision of a pipeline session run to
// its end, read back in order through Check as the service reads them, is
// accepted; so are the workers' signed events. At each point, the
// completions and results the history does not support yet are refused.
func TestCheckAcceptsOwnDecisions(t *testing.T) {
	t.Parallel()
	for _, p := range []schemas.Pipeline{chainPipeline(), diamondPipeline(), singlePipeline()} {
		t.Run(p.Name, func(t *testing.T) {
			st := NewState()
			seq := uint64(0)
			refused := func(ev schemas.Event, why string) {
				t.Helper()
				ev.ID += "-forged"
				if err := Check(st, ev); !errors.Is(err, ErrInconsistent) {
					t.Fatalf("forged %s (%s): Check = %v, want %v", ev.Type, why, err, ErrInconsistent)
				}
			}
			apply := func(ev schemas.Event) {
				t.Helper()
				seq++
				ev.Seq = seq
				switch d := ev.Data.(type) {
				case *schemas.StepCompleted:
					refused(sessionCompletedEv(), "before step "+d.Step+" completed")
				case *schemas.JobCompleted:
					refused(signed(ev, keyB), "by another worker than the job's")
				}
				if err := Check(st, ev); err != nil {
					t.Fatalf("event %s: %v", ev.Type, err)
				}
				Evolve(st, ev)
				if d, ok := ev.Data.(*schemas.JobRequested); ok {
					refused(schemas.Event{ID: "sc", Type: schemas.TypeStepCompleted, Session: sess, Step: d.Step,
						Data: &schemas.StepCompleted{Step: d.Step, JobID: d.JobID, Iterations: d.Iteration, ContentHash: schemas.ContentHash(nil)}}, "before its job ran")
				}
			}
			queue := []schemas.Event{started(p)}
			failed := map[string]bool{}
			for n := 0; len(queue) > 0 && n < 200; n++ {
				trigger := queue[0]
				queue = queue[1:]
				apply(trigger)
				for _, o := range Decide(st, trigger, fixedNow) {
					apply(o)
					jr, ok := o.Data.(*schemas.JobRequested)
					if !ok {
						continue
					}
					// The worker (signing) starts the job, stores its
					// outputs and completes it; the validator fails each
					// step's first iteration once when it may run again.
					var arts []schemas.ArtifactRef
					mk := func(id, typ string, data any) schemas.Event {
						return schemas.Event{ID: id + "-" + jr.JobID, Type: typ, Session: sess, Step: jr.Step, Job: jr.JobID, Signer: keyA, Data: data}
					}
					queue = append(queue, mk("start", schemas.TypeJobStarted, &schemas.JobStarted{JobID: jr.JobID, Worker: "w", Delivery: 1}))
					for _, out := range jr.Outputs {
						a := art(jr.Step, out.Name)
						arts = append(arts, a)
						queue = append(queue, mk("stored-"+out.Name, schemas.TypeArtifactStored, &schemas.ArtifactStored{JobID: jr.JobID, Artifact: a}))
					}
					queue = append(queue, mk("done", schemas.TypeJobCompleted, &schemas.JobCompleted{JobID: jr.JobID, Step: jr.Step, Iteration: jr.Iteration, Worker: "w", Artifacts: arts}))
					v := &schemas.Verdict{JobID: jr.JobID, Step: jr.Step, Iteration: jr.Iteration, Artifacts: arts}
					typ := schemas.TypeValidationPassed
					if def := stepDef(t, p, jr.Step); def.MaxIterations > 1 && !failed[jr.Step] {
						failed[jr.Step] = true
						typ, v.Artifacts, v.Errors = schemas.TypeValidationFailed, nil, []schemas.ValidationError{{Message: "not yet"}}
					}
					verdict := mk("verdict", typ, v)
					verdict.Signer, verdict.Causation = keyV, "done-"+jr.JobID
					queue = append(queue, verdict)
				}
			}
			if s := st.Sessions[sess]; s.Status != StatusCompleted {
				t.Fatalf("session %s after %d events", s.Status, seq)
			}
		})
	}
}

// TestEvolveCompactsFinishedSessions: a finished session drops what Check
// knows of its run (with State.Retain, as a rerun needs it, a failed or
// completed pipeline session keeps its pipeline and steps; without, as
// the service keeps its state, and for a closed one, only what identifies
// it stays), and late events of it change nothing else.
func TestEvolveCompactsFinishedSessions(t *testing.T) {
	t.Parallel()
	p := singlePipeline()
	failed := []schemas.Event{started(p), requested("only", 1), sessionFailedEv("gave up"), passed("only", 1), stepCompleted("only", 1)}
	compact := NewState()
	for i, ev := range failed {
		ev.Seq = uint64(i + 1)
		Evolve(compact, ev)
	}
	if s := compact.Sessions[sess]; s == nil || s.Status != StatusFailed || s.LastSeq != 5 || s.Steps != nil || len(s.Pipeline.Steps) != 0 || s.seen != nil || s.facts != nil {
		t.Errorf("finished session, not retained, still holds its pipeline, steps or ids: %+v", s)
	}
	st := fold(t, failed)
	s := st.Sessions[sess]
	if s == nil || s.Status != StatusFailed || s.StartID != startID || s.LastSeq != 5 {
		t.Fatalf("session %+v", s)
	}
	if s.seen != nil || s.facts != nil {
		t.Errorf("finished session still holds its ids or facts: %+v", s)
	}
	if got := s.Steps["only"]; got == nil || got.Status != StepRunning || got.Outcome != outcomeNone {
		t.Errorf("late events of a failed session moved its step: %+v", got)
	}
	if evs := Decide(st, stepCompleted("only", 1), time.Time{}); len(evs) != 0 {
		t.Errorf("Decide on a finished session = %v", evs)
	}
	st = fold(t, []schemas.Event{started(p), requested("only", 1), closedEv(), passed("only", 1)})
	if s := st.Sessions[sess]; s.Steps != nil || len(s.Pipeline.Steps) != 0 || s.seen != nil || s.facts != nil {
		t.Errorf("closed session still holds its pipeline, steps or ids: %+v", s)
	}
}

func stored(step string, iteration int, a schemas.ArtifactRef) schemas.Event {
	return schemas.Event{ID: fmt.Sprintf("stored-%s-%d-%s", step, iteration, a.Name), Type: schemas.TypeArtifactStored, Session: sess, Step: step, Job: jid(step, iteration),
		Data: &schemas.ArtifactStored{JobID: jid(step, iteration), Artifact: a}}
}

func withOutputs(ev schemas.Event, arts ...schemas.ArtifactRef) schemas.Event {
	d := *ev.Data.(*schemas.JobCompleted)
	d.Artifacts = arts
	ev.Data = &d
	return ev
}

// elsewhere is a under another object, as a later delivery stores it.
func elsewhere(a schemas.ArtifactRef) schemas.ArtifactRef {
	a.Object += ".d2"
	return a
}

// Public keys of signers (nkeys are 56 characters, "U…").
var (
	keyA = "U" + strings.Repeat("A", 55)
	keyB = "U" + strings.Repeat("B", 55)
	keyV = "U" + strings.Repeat("V", 55)
)

// signed is ev as the bus reads it when key's signature verified.
func signed(ev schemas.Event, key string) schemas.Event {
	ev.Signer = key
	return ev
}

// jobStarted is a worker's job.started of a delivery, signed by key ("":
// unsigned).
func jobStarted(step string, iteration int, key string, delivery int) schemas.Event {
	return schemas.Event{ID: fmt.Sprintf("jobstarted-%s-%d-%d", step, iteration, delivery), Type: schemas.TypeJobStarted, Session: sess, Step: step,
		Job: jid(step, iteration), Time: fixedNow, Signer: key,
		Data: &schemas.JobStarted{JobID: jid(step, iteration), Worker: "w", Delivery: delivery}}
}

// leased is a job.started stored at second s of the test clock, stating
// a lease of 30 seconds.
func leased(ev schemas.Event, s int) schemas.Event {
	return leasedFor(ev, s, 30_000)
}

// leasedFor is a job.started stored at second s, stating a lease of ms.
func leasedFor(ev schemas.Event, s int, ms int64) schemas.Event {
	d := *ev.Data.(*schemas.JobStarted)
	d.LeaseMs = ms
	ev.Data = &d
	return at(ev, s)
}

// at is ev as stored by the stream at second s of the test clock.
func at(ev schemas.Event, s int) schemas.Event {
	ev.Stored = fixedNow.Add(time.Duration(s) * time.Second)
	return ev
}

// heartbeat is a job.heartbeat signed by key.
func heartbeat(step string, iteration int, key string, delivery int) schemas.Event {
	return schemas.Event{ID: fmt.Sprintf("heartbeat-%s-%d-%s", step, iteration, key[1:2]), Type: schemas.TypeJobHeartbeat, Session: sess, Step: step,
		Job: jid(step, iteration), Time: fixedNow, Signer: key,
		Data: &schemas.JobHeartbeat{JobID: jid(step, iteration), Worker: "w", Delivery: delivery}}
}

// released is a job.released signed by key.
func released(step string, iteration int, key string, delivery int) schemas.Event {
	return schemas.Event{ID: fmt.Sprintf("released-%s-%d-%s", step, iteration, key[1:2]), Type: schemas.TypeJobReleased, Session: sess, Step: step,
		Job: jid(step, iteration), Time: fixedNow, Signer: key,
		Data: &schemas.JobReleased{JobID: jid(step, iteration), Worker: "w", Delivery: delivery, Reason: "shutting down"}}
}

// cancelledBeforeStart is what a worker publishes for a job it finds
// cancelled before it starts it.
func cancelledBeforeStart(step string, iteration int) schemas.Event {
	ev := jobFailed(step, iteration, "cancelled", "")
	d := *ev.Data.(*schemas.JobFailed)
	d.Cancelled, d.ExitCode = true, -1
	ev.Data = &d
	return ev
}

func toolStarted(step string, iteration int) schemas.Event {
	return schemas.Event{ID: fmt.Sprintf("toolstarted-%s-%d", step, iteration), Type: schemas.TypeToolStarted, Session: sess, Step: step, Job: jid(step, iteration),
		Data: &schemas.ToolStarted{JobID: jid(step, iteration), ToolID: "t1", Name: "sh"}}
}

func agentMessage(step string, iteration int) schemas.Event {
	return schemas.Event{ID: fmt.Sprintf("message-%s-%d", step, iteration), Type: schemas.TypeAgentMessage, Session: sess, Step: step, Job: jid(step, iteration),
		Data: &schemas.AgentMessage{JobID: jid(step, iteration), Text: "working"}}
}

// verdictOn is p's session whose step "only" ran job 1, with verdict v.
func verdictOn(p schemas.Pipeline, v schemas.Event) []schemas.Event {
	return []schemas.Event{started(p), requested("only", 1), jobCompleted("only", 1), v}
}

func withHash(ev schemas.Event, hash string) schemas.Event {
	d := *ev.Data.(*schemas.StepCompleted)
	d.ContentHash = hash
	ev.Data = &d
	return ev
}

func renamed(ev schemas.Event, id string) schemas.Event {
	ev.ID = id
	return ev
}

func phaseEv(phase string) schemas.Event {
	return control(schemas.TypeBacklogPhase, &schemas.BacklogPhase{Phase: phase})
}

func taskAddedEv(id string) schemas.Event {
	return control(schemas.TypeTaskAdded, &schemas.TaskAdded{Task: task(id, 0, schemas.TaskTodo), By: "import"})
}

func taskSelectedEv(id string) schemas.Event {
	return control(schemas.TypeTaskSelected, &schemas.TaskSelected{ID: id, Run: 1, Agent: "a"})
}

// backlogRun is a backlog whose task a's first run passed its validation,
// carrying its summary (withReport) or not (the orchestrator then turns
// the verdict into a failure).
func backlogRun(withReport bool) []schemas.Event {
	v := passed("a", 1, art("a", backlog.SummaryName))
	if withReport {
		raw, _ := json.Marshal(backlog.Summary{TaskID: "a", Status: schemas.TaskDone, Summary: "did a"})
		v.Data.(*schemas.Verdict).Reports = []schemas.Report{{Name: backlog.SummaryName, Content: raw}}
	}
	return []schemas.Event{backlogStarted(backlogPipeline(1, ""), nil), phaseEv(schemas.PhaseIterate), taskAddedEv("a"), taskSelectedEv("a"),
		requested("a", 1), jobCompleted("a", 1), v}
}

// oneLoop is a loops session of one level with no children (in a
// worktree: worktree), whose root loop ran job 1; passed adds a passed
// verdict.
func oneLoop(worktree, passed bool) []schemas.Event {
	p := schemas.Pipeline{Name: "one-loop", Kind: schemas.KindLoops, Loops: &schemas.Loops{Levels: []schemas.LoopLevel{
		{Name: "plan", Agent: agent("a.sh"), MaxIterations: 1, Worktree: worktree}}}}
	done := jobCompleted("plan", 1)
	done.Data.(*schemas.JobCompleted).Git = &schemas.GitResult{Commit: commitOf("plan"), Base: baseCommit, Changed: true}
	evs := []schemas.Event{loopsStarted(p), control(schemas.TypeLoopSpawned, &schemas.LoopSpawned{Loop: "plan", Level: "plan"}), requested("plan", 1), done}
	if passed {
		evs = append(evs, schemas.Event{ID: "passed-plan-1", Type: schemas.TypeValidationPassed, Session: sess, Step: "plan", Job: jid("plan", 1),
			Data: &schemas.Verdict{JobID: jid("plan", 1), Step: "plan", Iteration: 1}})
	}
	return evs
}

func withID(ev schemas.Event, id string) schemas.Event {
	ev.ID = id
	return ev
}

func caused(ev schemas.Event, by string) schemas.Event {
	ev.Causation = by
	return ev
}
