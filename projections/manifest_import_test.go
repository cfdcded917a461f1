package projections

import (
	"testing"
	"time"

	"github.com/loopbus/loopbus/schemas"
)

// importStart emits the session.started of loopbus import.
func (b *builder) importStart(session string) {
	in := inputRef(session)
	b.add(session, schemas.TypeSessionStarted, "", "", &schemas.SessionStarted{
		Pipeline:   writingKitPipeline(),
		Input:      in,
		SourceHash: shortHash(in.Digest),
		Import:     &schemas.ImportStart{Source: schemas.ImportSourceLooplia, ManifestSourceHash: shortHash(in.Digest)},
	})
}

// importStep emits step.imported of step with one artifact and returns it.
func (b *builder) importStep(session, step, name, content string, completedAt *time.Time) schemas.ArtifactRef {
	a := artifact(session, step, 0, name, content)
	a.Object = session + "/import/" + step + "/" + name
	arts := []schemas.ArtifactRef{a}
	b.add(session, schemas.TypeStepImported, step, "", &schemas.StepImported{Step: step, Artifacts: arts, ContentHash: schemas.ContentHash(arts),
		SchemaVersion: step + "-v1", Source: schemas.ImportSourceLooplia, CompletedAt: completedAt})
	return a
}

// importedSession: a Looplia folder with summary and ideas done is
// imported (an import of a step not in the pipeline and one out of order
// are ignored), resumed, and writing-kit runs to completion; an import
// after that first job is ignored.
func importedSession() []schemas.Event {
	var b builder
	b.importStart(sessionID)
	done := t0.Add(-time.Hour)
	b.importStep(sessionID, "summary", "summary.json", summaryJSON, &done)
	b.importStep(sessionID, "outline", "outline.json", "{}", nil)
	b.importStep(sessionID, "ideas", "ideas.json", ideasJSON, nil)
	sig := b.signal(sessionID, "resume", "", "", "")
	b.add(sessionID, schemas.TypeSessionResumed, "", "", &schemas.SessionResumed{})
	b.ack(sessionID, sig, "resume", "", schemas.SignalApplied, "resumed session")
	job := b.request(sessionID, "writing-kit", 1)
	b.importStep(sessionID, "writing-kit", "writing-kit.md", kitMD, nil)
	b.jobStarted(sessionID, "writing-kit", job, "worker-a")
	kit := artifact(sessionID, "writing-kit", 1, "writing-kit.md", kitMD)
	b.jobCompleted(sessionID, "writing-kit", job, "worker-a", 1, kit)
	b.passed(sessionID, "writing-kit", job, 1, kit)
	b.stepCompleted(sessionID, "writing-kit", job, 1, "", kit)
	b.sessionCompleted(sessionID, kit)
	return b.evs
}

// TestManifestImport: an imported session is paused (hold "import") until
// resumed; imported steps are completed with imported: true, their
// artifacts and hashes; imports out of order, of unknown steps, after the
// first job or into a session run (not imported) are ignored.
func TestManifestImport(t *testing.T) {
	evs := importedSession()
	m := foldAll(evs[:4])
	if m.Status != StatusPaused || m.Hold == nil || m.Hold.Kind != HoldImport || m.Import == nil {
		t.Fatalf("imported session: status %s, hold %+v, import %+v; want paused by import", m.Status, m.Hold, m.Import)
	}
	for _, name := range []string{"summary", "ideas"} {
		sv := m.Steps[name]
		if sv.Status != StepStatusCompleted || !sv.Imported || len(sv.Artifacts) != 1 || sv.ContentHash != schemas.ContentHash(sv.Artifacts) || sv.CompletedAt == nil {
			t.Errorf("%s: %+v; want completed, imported, with its artifact and hash", name, sv)
		}
	}
	if sv := m.Steps["summary"]; !sv.CompletedAt.Equal(t0.Add(-time.Hour)) {
		t.Errorf("summary completed at %v, want the source's time", sv.CompletedAt)
	}
	if sv := m.Steps["writing-kit"]; sv.Status != StepStatusPending || sv.Imported {
		t.Errorf("writing-kit: %+v; want pending", sv)
	}
	if _, ok := m.Steps["outline"]; ok {
		t.Error("a step not in the pipeline was added")
	}
	m = foldAll(evs)
	if m.Status != StatusCompleted || m.Hold != nil || m.Steps["writing-kit"].Imported || m.Steps["writing-kit"].Iterations != 1 {
		t.Errorf("after the resume: status %s, hold %+v, writing-kit %+v; want completed by its job", m.Status, m.Hold, m.Steps["writing-kit"])
	}
	// Out of order (ideas before summary), with a wrong hash, and into a
	// session run.
	var b builder
	b.importStart(sessionID)
	b.importStep(sessionID, "ideas", "ideas.json", ideasJSON, nil)
	if m := foldAll(b.evs); m.Steps["ideas"].Status != StepStatusPending {
		t.Errorf("ideas imported before summary: %s", m.Steps["ideas"].Status)
	}
	b = builder{}
	b.importStart(sessionID)
	b.importStep(sessionID, "summary", "summary.json", summaryJSON, nil)
	b.evs[1].Data.(*schemas.StepImported).ContentHash = "0000000000000000"
	if m := foldAll(b.evs); m.Steps["summary"].Status != StepStatusPending {
		t.Errorf("summary imported with a wrong content hash: %s", m.Steps["summary"].Status)
	}
	b = builder{}
	b.start(sessionID)
	b.importStep(sessionID, "summary", "summary.json", summaryJSON, nil)
	if m := foldAll(b.evs); m.Steps["summary"].Status != StepStatusPending || m.Status != StatusRunning {
		t.Errorf("an import into a session run: %s, summary %s", m.Status, m.Steps["summary"].Status)
	}
}

// TestManifestImportChecksOutputs: as the orchestrator, the manifest
// completes an imported step only with exactly the step's declared
// outputs; and a step's job.requested after its import (it runs) ends
// Imported.
func TestManifestImportChecksOutputs(t *testing.T) {
	forge := func(names ...string) func(b *builder) {
		return func(b *builder) {
			var arts []schemas.ArtifactRef
			for _, n := range names {
				a := artifact(sessionID, "summary", 0, n, summaryJSON)
				a.Object = sessionID + "/import/summary/" + n
				arts = append(arts, a)
			}
			b.add(sessionID, schemas.TypeStepImported, "summary", "", &schemas.StepImported{Step: "summary", Artifacts: arts,
				ContentHash: schemas.ContentHash(arts), Source: schemas.ImportSourceLooplia})
		}
	}
	for _, tc := range []struct {
		name         string
		then         func(b *builder)
		status       string
		imported     bool
		wantArtifact int // -1: not checked
	}{
		{"the declared output", forge("summary.json"), StepStatusCompleted, true, 1},
		{"another name", forge("ideas.json"), StepStatusPending, false, 0},
		{"an output too many", forge("summary.json", "extra.json"), StepStatusPending, false, 0},
		{"the output twice", forge("summary.json", "summary.json"), StepStatusPending, false, 0},
		{"a job after the import", func(b *builder) {
			b.importStep(sessionID, "summary", "summary.json", summaryJSON, nil)
			b.request(sessionID, "summary", 1)
		}, StepStatusInProgress, false, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b builder
			b.importStart(sessionID)
			tc.then(&b)
			sv := foldAll(b.evs).Steps["summary"]
			if sv.Status != tc.status || sv.Imported != tc.imported || tc.wantArtifact >= 0 && len(sv.Artifacts) != tc.wantArtifact {
				t.Errorf("summary: status %s, imported %v, %d artifacts; want %s, %v, %d", sv.Status, sv.Imported, len(sv.Artifacts), tc.status, tc.imported, tc.wantArtifact)
			}
		})
	}
}
