package orchestrator

import (
	"errors"
	"slices"
	"testing"

	"github.com/loopbus/loopbus/schemas"
)

// The specification of imported sessions (loopbus import): a session
// started with Import waits paused; step.imported events complete steps
// before the first job; a resume runs the rest, with the imported
// artifacts as inputs (given events → then events).

func startedImport(p schemas.Pipeline) schemas.Event {
	ev := started(p)
	d := *ev.Data.(*schemas.SessionStarted)
	d.Import = &schemas.ImportStart{Source: schemas.ImportSourceLooplia}
	ev.Data = &d
	return ev
}

func importedEv(step string, arts ...schemas.ArtifactRef) schemas.Event {
	return schemas.Event{ID: "import-" + step, Type: schemas.TypeStepImported, Session: sess, Step: step,
		Data: &schemas.StepImported{Step: step, Artifacts: arts, ContentHash: schemas.ContentHash(arts), Source: schemas.ImportSourceLooplia}}
}

func TestDecideImport(t *testing.T) {
	chain := chainPipeline()
	sum, ideas, kit := art("summary", "summary.json"), art("ideas", "ideas.json"), art("writing-kit", "writing-kit.json")
	two := []schemas.Event{startedImport(chain), importedEv("summary", sum), importedEv("ideas", ideas)}
	runControl(t, []controlCase{
		{
			name:  "an imported session starts paused: nothing is requested",
			given: []schemas.Event{startedImport(chain)},
			want:  nil,
		},
		{
			name:  "imported steps are completed, and nothing runs before a resume",
			given: two,
			want:  nil,
		},
		{
			name:  "a resume runs the first step not imported, not the imported ones",
			given: with(two, signal(1, "resume", "")),
			want:  []string{"session.resumed", "signal.acknowledged sig-1 resume applied: resumed session", "job.requested s1.writing-kit.1"},
		},
		{
			name:  "without imports, a resume runs the first step",
			given: []schemas.Event{startedImport(chain), signal(1, "resume", "")},
			want:  []string{"session.resumed", "signal.acknowledged sig-1 resume applied: resumed session", "job.requested s1.summary.1"},
		},
		{
			name:  "every step imported: the session completes",
			given: with(two, importedEv("writing-kit", kit)),
			want:  []string{"session.completed"},
		},
		{
			name:  "a session run (not imported) is not paused",
			given: []schemas.Event{started(chain)},
			want:  []string{"job.requested s1.summary.1"},
		},
	})
}

// TestImportedArtifactsAreInputs: the job of the step after the imported
// ones gets their artifacts as inputs, as it gets the outputs of steps
// that ran.
func TestImportedArtifactsAreInputs(t *testing.T) {
	sum, ideas := art("summary", "summary.json"), art("ideas", "ideas.json")
	got := runDecide(t, []schemas.Event{startedImport(chainPipeline()), importedEv("summary", sum), importedEv("ideas", ideas), signal(1, "resume", "")})
	i := slices.IndexFunc(got, func(ev schemas.Event) bool { return ev.Type == schemas.TypeJobRequested })
	if i < 0 {
		t.Fatalf("no job requested: %v", got)
	}
	jr := got[i].Data.(*schemas.JobRequested)
	if want := []schemas.ArtifactRef{input(), sum, ideas}; !slices.Equal(jr.Inputs, want) {
		t.Errorf("inputs %+v, want %+v", jr.Inputs, want)
	}
}

func TestEvolveImport(t *testing.T) {
	sum := art("summary", "summary.json")
	st := fold(t, []schemas.Event{startedImport(chainPipeline()), importedEv("summary", sum)})
	s := st.Sessions[sess]
	if s.Status != StatusPaused || s.Import == nil {
		t.Fatalf("session %s, import %v; want paused, imported", s.Status, s.Import)
	}
	if got := s.Steps["summary"]; got.Status != StepCompleted || !got.Imported || !slices.Equal(got.Artifacts, []schemas.ArtifactRef{sum}) {
		t.Errorf("summary %+v, want completed, imported, with its artifact", got)
	}
	if got := s.Steps["ideas"]; got.Status != StepPending || got.Imported {
		t.Errorf("ideas %+v, want pending", got)
	}
	// A refused import changes nothing (Evolve checks as Check does).
	st = fold(t, []schemas.Event{started(chainPipeline()), importedEv("summary", sum)})
	if got := st.Sessions[sess].Steps["summary"]; got.Status != StepPending {
		t.Errorf("an import into a session run, not imported, completed summary: %+v", got)
	}
}

func TestCheckImport(t *testing.T) {
	chain := chainPipeline()
	roots := rootsPipeline()
	roots.Steps[1].Outputs = []schemas.Output{{Name: "x.json"}}
	sum, ideas := art("summary", "summary.json"), art("ideas", "ideas.json")
	base := []schemas.Event{startedImport(chain)}
	oneDone := with(base, importedEv("summary", sum))
	badHash := importedEv("summary", sum)
	badHash.Data.(*schemas.StepImported).ContentHash = "0000000000000000"
	for _, tc := range []struct {
		name  string
		given []schemas.Event
		ev    schemas.Event
		want  error
	}{
		{"the first step", base, importedEv("summary", sum), nil},
		{"the step after an imported one", oneDone, importedEv("ideas", ideas), nil},
		{"a step not in the pipeline", base, importedEv("nope", sum), ErrInconsistent},
		{"a step whose required step is not imported", base, importedEv("ideas", ideas), ErrInconsistent},
		{"a copy of an applied import", oneDone, importedEv("summary", sum), ErrReplayed},
		{"a step imported twice", oneDone, func() schemas.Event { ev := importedEv("summary", sum); ev.ID = "again"; return ev }(), ErrInconsistent},
		{"other artifacts than the declared outputs", base, importedEv("summary", art("summary", "other.json")), ErrInconsistent},
		{"no artifacts", base, importedEv("summary"), ErrInconsistent},
		{"a wrong content hash", base, badHash, ErrInconsistent},
		{"after the first job", with(base, signal(1, "resume", ""), control(schemas.TypeSessionResumed, &schemas.SessionResumed{}), requested("summary", 1)),
			importedEv("summary", sum), ErrInconsistent},
		{"after the first job, for a step the job is not of", with([]schemas.Event{startedImport(roots)}, signal(1, "resume", ""),
			control(schemas.TypeSessionResumed, &schemas.SessionResumed{}), requested("y", 1)), importedEv("x", art("x", "x.json")), ErrInconsistent},
		{"before the first job, for a step of two roots", []schemas.Event{startedImport(roots)}, importedEv("x", art("x", "x.json")), nil},
		{"into a session run, not imported", []schemas.Event{started(chain)}, importedEv("summary", sum), ErrInconsistent},
		{"into a completed session", with(base, importedEv("summary", sum), importedEv("ideas", ideas), importedEv("writing-kit", art("writing-kit", "writing-kit.json")),
			control(schemas.TypeSessionCompleted, &schemas.SessionCompleted{})), func() schemas.Event { ev := importedEv("summary", sum); ev.ID = "late"; return ev }(), ErrInconsistent},
		{"never started", nil, importedEv("summary", sum), ErrNoSession},
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
