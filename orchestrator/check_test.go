package orchestrator

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/loopbus/loopbus/schemas"
)

func TestCheck(t *testing.T) {
	t.Parallel()
	p := singlePipeline()
	secondStart := started(p)
	secondStart.ID = "another-start"
	tests := []struct {
		name    string
		given   []schemas.Event
		ev      schemas.Event
		wantErr error
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
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := fold(t, tt.given)
			err := Check(st, tt.ev)
			if !errors.Is(err, tt.wantErr) || (tt.wantErr == nil && err != nil) {
				t.Errorf("Check = %v, want %v", err, tt.wantErr)
			}
		})
	}
}

// TestEvolveCompactsFinishedSessions: a finished session keeps only what
// identifies it, and late events of it change nothing else.
func TestEvolveCompactsFinishedSessions(t *testing.T) {
	t.Parallel()
	p := singlePipeline()
	st := fold(t, []schemas.Event{started(p), requested("only", 1), sessionFailedEv("gave up"), passed("only", 1), stepCompleted("only", 1)})
	s := st.Sessions[sess]
	if s == nil || s.Status != StatusFailed || s.StartID != startID || s.LastSeq != 5 {
		t.Fatalf("session %+v", s)
	}
	if s.Steps != nil || len(s.Pipeline.Steps) != 0 || s.seen != nil {
		t.Errorf("finished session still holds its pipeline, steps or ids: %+v", s)
	}
	if evs := Decide(st, stepCompleted("only", 1), time.Time{}); len(evs) != 0 {
		t.Errorf("Decide on a finished session = %v", evs)
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
