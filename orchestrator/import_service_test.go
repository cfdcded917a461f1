package orchestrator_test

import (
	"context"
	"testing"
	"time"

	"github.com/loopbus/loopbus/internal/testnats"
	"github.com/loopbus/loopbus/projections"
	"github.com/loopbus/loopbus/schemas"
)

// TestRunnerDeadLettersLateImports: an imported session waits for its
// resume; a step.imported for a step the pipeline does not have, and one
// after the session's first job, are dead-lettered with the reason, and
// the step keeps running.
func TestRunnerDeadLettersLateImports(t *testing.T) {
	b, _ := testnats.Bus(t)
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	r := startRunner(t, b, "o1")
	const session = "late-import"
	in := inputRef(session)
	id := schemas.DeterministicID(session, schemas.TypeSessionStarted)
	start := schemas.Event{ID: id, Type: schemas.TypeSessionStarted, Session: session, Correlation: id, Time: time.Now(),
		Data: &schemas.SessionStarted{Pipeline: twoSteps(), Input: in, SourceHash: schemas.ShortHash(in.Digest), Import: &schemas.ImportStart{Source: schemas.ImportSourceLooplia}}}
	if _, err := b.PublishExpect(ctx, start, 0); err != nil {
		t.Fatal(err)
	}
	draft := []schemas.ArtifactRef{{Name: "draft.md", Object: session + "/import/draft/draft.md", Digest: schemas.Digest([]byte("d")), Size: 1, Step: "draft"}}
	imported := func(id, step string) schemas.Event {
		return schemas.Event{ID: id, Type: schemas.TypeStepImported, Session: session, Step: step, Correlation: start.ID, Time: time.Now(),
			Data: &schemas.StepImported{Step: step, Artifacts: draft, ContentHash: schemas.ContentHash(draft), Source: schemas.ImportSourceLooplia}}
	}
	if _, err := b.Publish(ctx, imported("import-nope", "nope")); err != nil {
		t.Fatal(err)
	}
	resume := schemas.Event{ID: "resume-1", Type: schemas.TypeSignalResume, Session: session, Correlation: start.ID, Time: time.Now(),
		Data: &schemas.Signal{Target: session, Reason: "go"}}
	if _, err := b.Publish(ctx, resume); err != nil {
		t.Fatal(err)
	}
	waitEvents(t, b, session, "job.requested for draft", has(schemas.TypeJobRequested, "draft"))
	if _, err := b.Publish(ctx, imported("import-draft", "draft")); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"step.imported names step nope, which session " + session + " does not have",
		"step.imported imports into session " + session + ", which has run jobs: imports come before the first job",
	}
	assertDeadLetters(ctx, t, b, want)
	if m := projections.BuildManifest(session, sessionEvents(t, b, session)); m.Steps["draft"].Status != projections.StepStatusInProgress || m.Steps["draft"].Imported {
		t.Errorf("draft after a late import: %+v, want in progress", m.Steps["draft"])
	}
	r.stop()
	r.assertNoErrors(t)
}
