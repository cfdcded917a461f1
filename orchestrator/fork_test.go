package orchestrator

import (
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/loopbus/loopbus/schemas"
)

// The specification of session.forked: a new session starts from the
// origin's state at the fork point, read from the origin's own history
// (given events → then events, with the stream read from memory).

const forkSess = "f1"

// stream is an event stream in memory: events in order, with sequences.
type stream struct{ evs []schemas.Event }

func (s *stream) add(evs ...schemas.Event) *stream {
	for _, ev := range evs {
		ev.Seq = uint64(len(s.evs) + 1)
		s.evs = append(s.evs, ev)
	}
	return s
}

// seqOf is the sequence of the event of session with id.
func (s *stream) seqOf(t *testing.T, session, id string) uint64 {
	t.Helper()
	for _, ev := range s.evs {
		if ev.Session == session && ev.ID == id {
			return ev.Seq
		}
	}
	t.Fatalf("no event %s of %s", id, session)
	return 0
}

func (s *stream) read(session string, until uint64, fn func(schemas.Event) error) error {
	for _, ev := range s.evs {
		if until != 0 && ev.Seq > until {
			break
		}
		if ev.Session != session {
			continue
		}
		if err := fn(ev); err != nil {
			return err
		}
	}
	return nil
}

// fork returns the copies and the session.forked that fork origin at the
// event with id pointID into session into, as loopbus fork publishes
// them, with the pipeline p (the origin's when Steps is empty).
func (s *stream) fork(t *testing.T, origin, pointID, into string, p schemas.Pipeline, changed ...string) []schemas.Event {
	t.Helper()
	seq := s.seqOf(t, origin, pointID)
	var out []schemas.Event
	var startData *schemas.SessionStarted
	for _, ev := range s.evs {
		if ev.Seq > seq {
			break
		}
		if ev.Session != origin {
			continue
		}
		if d, ok := ev.Data.(*schemas.SessionStarted); ok && startData == nil {
			startData = d
		}
		c := ev
		c.ID, c.Session, c.ForkOf, c.Seq = "copy-"+into+"-"+ev.ID, into, orElse(ev.ForkOf, ev.ID), 0
		out = append(out, c)
	}
	if len(p.Steps) == 0 {
		p = startData.Pipeline
	}
	in := startData.Input
	return append(out, schemas.Event{ID: "forked-" + into, Type: schemas.TypeSessionForked, Session: into,
		Data: &schemas.SessionForked{Origin: origin, Seq: seq, Event: pointID, Copied: len(out), Pipeline: p, Input: in,
			SourceHash: schemas.ShortHash(in.Digest), Changed: changed}})
}

// foldStream folds the stream as the service does: a session.forked is
// prepared from the stream, and events Check refuses are skipped (their
// refusals are returned by id).
func foldStream(t *testing.T, s *stream) (*State, map[string]error) {
	t.Helper()
	st := NewState()
	st.Retain = true
	refused := map[string]error{}
	for _, ev := range s.evs {
		forget := func() {}
		if ev.Type == schemas.TypeSessionForked && ev.ForkOf == "" {
			var err error
			if forget, err = PrepareFork(st, ev, s.read); err != nil {
				t.Fatal(err)
			}
		}
		if err := Check(st, ev); err != nil {
			forget()
			refused[ev.ID] = err
			continue
		}
		Evolve(st, ev)
	}
	if len(st.forks) != 0 {
		t.Errorf("PrepareFork kept %d preparations after the fold", len(st.forks))
	}
	return st, refused
}

// checkedChain is chainPipeline's session completed with every fact
// Check wants (results with their stored artifacts): each step's job is
// requested, stores its artifact, completes, passes and its step completes.
func checkedChain() []schemas.Event {
	evs := []schemas.Event{started(chainPipeline())}
	for _, a := range []schemas.ArtifactRef{art("summary", "summary.json"), art("ideas", "ideas.json"), art("writing-kit", "kit.json")} {
		evs = append(evs, requested(a.Step, 1), stored(a.Step, 1, a), withOutputs(jobCompleted(a.Step, 1), a), passed(a.Step, 1, a), stepCompleted(a.Step, 1, a))
	}
	return append(evs, sessionCompletedEv(art("writing-kit", "kit.json")))
}

// changedIdeas is chainPipeline with another prompt for ideas.
func changedIdeas() schemas.Pipeline {
	p := chainPipeline()
	p.Steps = append([]schemas.Step{}, p.Steps...)
	p.Steps[1].Prompt = "Better ideas for {{.Input.Name}}."
	return p
}

func TestDecideFork(t *testing.T) {
	done := checkedChain()
	summaryDone, ideasAsked, ideasDone, kitDone := done[5].ID, done[6].ID, done[10].ID, done[15].ID
	for _, tc := range []struct {
		name     string
		point    string
		pipeline schemas.Pipeline
		want     []string
	}{
		{"after the first step, with the second changed: the second runs; the first is kept", summaryDone, changedIdeas(),
			[]string{"job.requested f1.ideas.1"}},
		{"after the second step, nothing changed: the third runs", ideasDone, schemas.Pipeline{},
			[]string{"job.requested f1.writing-kit.1"}},
		{"after the second step, with it changed: it runs again in a new round; its dependent waits", ideasDone, changedIdeas(),
			[]string{"job.requested f1.ideas.1.r1"}},
		{"while the origin's job of the second step was in flight: the fork asks a job of its own, and cancels none", ideasAsked, schemas.Pipeline{},
			[]string{"job.requested f1.ideas.1.r1"}},
		{"at the end, nothing changed: every step is kept and the fork completes", done[len(done)-1].ID, schemas.Pipeline{},
			[]string{"session.completed"}},
		{"at the end, with the second step changed: it and the third run again", kitDone, changedIdeas(),
			[]string{"job.requested f1.ideas.1.r1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := (&stream{}).add(done...)
			var changed []string
			if len(tc.pipeline.Steps) > 0 {
				changed = schemas.ChangedSteps(chainPipeline(), tc.pipeline, nil, nil, false)
			}
			s.add(s.fork(t, sess, tc.point, forkSess, tc.pipeline, changed...)...)
			st, refused := foldStream(t, s)
			if len(refused) > 0 {
				t.Fatalf("refused: %v", refused)
			}
			got := Decide(st, s.evs[len(s.evs)-1], fixedNow)
			var lines []string
			for _, ev := range got {
				if ev.Session != forkSess || ev.Correlation != "forked-"+forkSess {
					t.Errorf("%s of session %s, correlation %s; want the fork's", ev.Type, ev.Session, ev.Correlation)
				}
				lines = append(lines, line(ev))
			}
			if strings.Join(lines, "\n") != strings.Join(tc.want, "\n") {
				t.Errorf("got:\n  %s\nwant:\n  %s", strings.Join(lines, "\n  "), strings.Join(tc.want, "\n  "))
			}
			// The origin is untouched: still completed, nothing to decide.
			if o := st.Sessions[sess]; o.Status != StatusCompleted || len(Decide(st, done[len(done)-1], fixedNow)) != 0 {
				t.Errorf("origin after the fork: %s", o.Status)
			}
		})
	}
}

// TestForkKeepsResults: the kept step carries the origin's artifacts, the
// rerun ones start over; the next job's input is the kept artifact.
func TestForkKeepsResults(t *testing.T) {
	done := checkedChain()
	s := (&stream{}).add(done...)
	s.add(s.fork(t, sess, done[5].ID, forkSess, changedIdeas(), "ideas")...)
	st, _ := foldStream(t, s)
	f := st.Sessions[forkSess]
	if f == nil || f.Status != StatusRunning || f.StartID != "forked-"+forkSess {
		t.Fatalf("fork %+v", f)
	}
	if sum := f.Steps["summary"]; sum.Status != StepCompleted || len(sum.Artifacts) != 1 || sum.Artifacts[0].Name != "summary.json" {
		t.Errorf("summary in the fork: %+v", sum)
	}
	if ideas := f.Steps["ideas"]; ideas.Status != StepPending || ideas.Def.Prompt != changedIdeas().Steps[1].Prompt {
		t.Errorf("ideas in the fork: %+v", ideas)
	}
	got := Decide(st, s.evs[len(s.evs)-1], fixedNow)
	if len(got) != 1 {
		t.Fatalf("decided %v", got)
	}
	jr := got[0].Data.(*schemas.JobRequested)
	if len(jr.Inputs) == 0 || !strings.Contains(jr.Prompt, "Better ideas") {
		t.Errorf("job of the fork: inputs %v, prompt %q", jr.Inputs, jr.Prompt)
	}
}

// TestForkOfAFork: a fork's fork reads the chain back (copies are never
// taken as facts).
func TestForkOfAFork(t *testing.T) {
	done := checkedChain()
	s := (&stream{}).add(done[:6]...) // the origin completed summary
	s.add(s.fork(t, sess, done[5].ID, forkSess, schemas.Pipeline{})...)
	// The fork runs ideas and completes it.
	ideas := art("ideas", "ideas.json")
	job := JobID(forkSess, "ideas", 1, 1, 0)
	s.add(
		schemas.Event{ID: "f1-req", Type: schemas.TypeJobRequested, Session: forkSess, Step: "ideas", Job: job,
			Data: &schemas.JobRequested{JobID: job, Step: "ideas", Iteration: 1, Attempt: 1, Prompt: "…"}},
		schemas.Event{ID: "f1-passed", Type: schemas.TypeValidationPassed, Session: forkSess, Step: "ideas", Job: job,
			Data: &schemas.Verdict{JobID: job, Step: "ideas", Iteration: 1, Artifacts: []schemas.ArtifactRef{ideas}}},
	)
	// A verdict on a job never completed is refused: take the fork's
	// facts as Check sees them.
	if _, refused := foldStream(t, s); refused["f1-passed"] == nil {
		t.Fatalf("a verdict without a result was accepted in the fork")
	}
	s.evs = s.evs[:len(s.evs)-1]
	s.add(
		schemas.Event{ID: "f1-done", Type: schemas.TypeJobCompleted, Session: forkSess, Step: "ideas", Job: job,
			Data: &schemas.JobCompleted{JobID: job, Step: "ideas", Iteration: 1, Worker: "w1"}},
		schemas.Event{ID: "f1-passed", Type: schemas.TypeValidationPassed, Session: forkSess, Step: "ideas", Job: job,
			Data: &schemas.Verdict{JobID: job, Step: "ideas", Iteration: 1}},
		schemas.Event{ID: "f1-step", Type: schemas.TypeStepCompleted, Session: forkSess, Step: "ideas",
			Data: &schemas.StepCompleted{Step: "ideas", JobID: job, Iterations: 1, ContentHash: schemas.ContentHash(nil)}},
	)
	s.add(s.fork(t, forkSess, "f1-step", "f2", schemas.Pipeline{})...)
	st, refused := foldStream(t, s)
	if len(refused) > 0 {
		t.Fatalf("refused: %v", refused)
	}
	f2 := st.Sessions["f2"]
	if f2 == nil || f2.Steps["summary"].Status != StepCompleted || f2.Steps["ideas"].Status != StepCompleted || f2.Steps["ideas"].JobID != job {
		t.Fatalf("f2: %+v", f2)
	}
	if got := Decide(st, s.evs[len(s.evs)-1], fixedNow); len(got) != 1 || line(got[0]) != "job.requested f2.writing-kit.1" {
		t.Errorf("f2 decided %v", got)
	}
	// Forking f1 at one of its copies (before f1 itself started) is
	// refused: that is its origin's history.
	s.add(s.fork(t, forkSess, "copy-f1-"+done[1].ID, "f3", schemas.Pipeline{})...)
	if _, refused = foldStream(t, s); !errors.Is(refused["forked-f3"], ErrInconsistent) || !strings.Contains(refused["forked-f3"].Error(), "before the session started") {
		t.Errorf("fork at a copy: %v", refused["forked-f3"])
	}
}

func TestCheckFork(t *testing.T) {
	done := checkedChain()
	point := done[5].ID
	for _, tc := range []struct {
		name   string
		edit   func(s *stream, forked *schemas.Event)
		want   error
		reason string
	}{
		{"unknown origin", func(_ *stream, f *schemas.Event) { f.Data.(*schemas.SessionForked).Origin = "nosuch" }, ErrNoSession, "has no events"},
		{"a point holding no event of the origin", func(_ *stream, f *schemas.Event) { f.Data.(*schemas.SessionForked).Seq = 999 }, ErrInconsistent, "holds no event"},
		{"a point naming another event", func(_ *stream, f *schemas.Event) { f.Data.(*schemas.SessionForked).Event = "other" }, ErrInconsistent, "but its event at"},
		{"a count of copies that does not match", func(_ *stream, f *schemas.Event) { f.Data.(*schemas.SessionForked).Copied = 2 }, ErrInconsistent, "copied 2 events"},
		{"into itself", func(_ *stream, f *schemas.Event) { f.Session = sess }, ErrReplayed, "exists"},
		{"into a session that exists", func(s *stream, f *schemas.Event) {
			other := started(chainPipeline())
			other.Session, other.ID = forkSess, "other-start"
			s.add(other)
		}, ErrReplayed, "exists"},
		{"a loops pipeline", func(_ *stream, f *schemas.Event) {
			f.Data.(*schemas.SessionForked).Pipeline.Kind = schemas.KindLoops
		}, ErrInconsistent, "a fork keeps its origin's kind"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := (&stream{}).add(done...)
			evs := s.fork(t, sess, point, forkSess, schemas.Pipeline{})
			forked := evs[len(evs)-1]
			d := *forked.Data.(*schemas.SessionForked)
			forked.Data = &d
			tc.edit(s, &forked)
			if forked.Session == forkSess {
				s.add(evs[:len(evs)-1]...)
			}
			s.add(forked)
			st, refused := foldStream(t, s)
			err := refused[forked.ID]
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.reason) {
				t.Errorf("Check = %v, want %v (%s)", err, tc.want, tc.reason)
			}
			if f := st.Sessions[forkSess]; f != nil && f.StartID == forked.ID {
				t.Errorf("the refused fork started")
			}
		})
	}
	// A copy of session.forked after it applied is a replay; copies are
	// no facts (they start nothing, even a session.started).
	s := (&stream{}).add(done...)
	evs := s.fork(t, sess, point, forkSess, schemas.Pipeline{})
	s.add(evs[:len(evs)-1]...)
	if st, refused := foldStream(t, s); len(refused) > 0 || st.Sessions[forkSess] != nil {
		t.Fatalf("copies alone: refused %v, session %+v", refused, st.Sessions[forkSess])
	}
	s.add(evs[len(evs)-1], evs[len(evs)-1])
	if _, refused := foldStream(t, s); !errors.Is(refused[evs[len(evs)-1].ID], ErrReplayed) {
		t.Errorf("second session.forked: %v", refused)
	}
	// Nor a closed session after its close (it keeps nothing of its
	// steps); before it, it is.
	c := (&stream{}).add(done[:6]...).add(closedEv())
	c.add(c.fork(t, sess, closedEv().ID, forkSess, schemas.Pipeline{})...)
	c.add(c.fork(t, sess, done[5].ID, "f2", schemas.Pipeline{})...)
	st, refused := foldStream(t, c)
	if err := refused["forked-"+forkSess]; !errors.Is(err, ErrInconsistent) || !strings.Contains(err.Error(), "after it was closed for good") {
		t.Errorf("fork after a close: %v", err)
	}
	if f2 := st.Sessions["f2"]; f2 == nil || f2.Steps["summary"].Status != StepCompleted {
		t.Errorf("fork of a closed session before its close: %+v (refused: %v)", f2, refused["forked-f2"])
	}
	// A backlog session forked at its start starts as it did (see
	// TestDecideForkBacklog).
	b := (&stream{}).add(started(backlogPipeline(1, "")))
	bevs := b.fork(t, sess, startID, forkSess, schemas.Pipeline{})
	b.add(bevs...)
	if st, refused := foldStream(t, b); len(refused) > 0 || st.Sessions[forkSess] == nil || st.Sessions[forkSess].Backlog == nil {
		t.Errorf("fork of a backlog at its start: %v", refused)
	}
}

// TestChangedSteps: what a fork with another pipeline, its scripts or its
// input runs again whatever it did.
func TestChangedSteps(t *testing.T) {
	old := chainPipeline()
	file := func(path, content string, exec bool) schemas.DefinitionFile {
		return schemas.DefinitionFile{Path: path, Artifact: schemas.ArtifactRef{Digest: schemas.Digest([]byte(content))}, Executable: exec}
	}
	files := []schemas.DefinitionFile{file("agents/ideas.sh", "a", true), file("agents/kit.sh", "b", true)}
	renamed := chainPipeline()
	renamed.Steps = renamed.Steps[:2]
	added := chainPipeline()
	added.Steps = append(added.Steps, schemas.Step{Name: "extra", Requires: []string{"summary"}})
	for _, tc := range []struct {
		name      string
		next      schemas.Pipeline
		nextFiles []schemas.DefinitionFile
		input     bool
		want      string
	}{
		{"same", old, files, false, ""},
		{"a prompt changed", changedIdeas(), files, false, "ideas"},
		{"a script changed", old, []schemas.DefinitionFile{file("agents/ideas.sh", "a", true), file("agents/kit.sh", "c", true)}, false, "writing-kit"},
		{"a script lost its execute bit", old, []schemas.DefinitionFile{file("agents/ideas.sh", "a", false), file("agents/kit.sh", "b", true)}, false, "ideas"},
		{"a step removed", renamed, files, false, ""},
		{"a step added", added, files, false, "extra"},
		{"the input changed", old, files, true, "summary ideas writing-kit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := strings.Join(schemas.ChangedSteps(old, tc.next, files, tc.nextFiles, tc.input), " "); got != tc.want {
				t.Errorf("ChangedSteps = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestCheckForkForgeries: a copy (Event.ForkOf) into a session that
// exists is refused as a replay: a fork's history is copied before its
// session.forked, so a copy after it, or into a live session, is forged.
func TestCheckForkForgeries(t *testing.T) {
	done := checkedChain()
	s := (&stream{}).add(done[:6]...)
	forged := schemas.Event{ID: "forged-fail", Type: schemas.TypeSessionFailed, Session: sess, ForkOf: "other", Data: &schemas.SessionFailed{Reason: "forged"}}
	s.add(forged)
	evs := s.fork(t, sess, done[5].ID, forkSess, schemas.Pipeline{})
	s.add(evs...)
	late := forged
	late.ID, late.Session = "forged-late", forkSess
	s.add(late)
	st, refused := foldStream(t, s)
	for _, id := range []string{forged.ID, late.ID} {
		if err := refused[id]; !errors.Is(err, ErrReplayed) || !strings.Contains(err.Error(), "which exists") {
			t.Errorf("copy %s: %v, want refused", id, err)
		}
	}
	if f := st.Sessions[forkSess]; len(refused) != 2 || st.Sessions[sess].Status != StatusRunning || f == nil || f.Status != StatusRunning {
		t.Errorf("refused %v; origin %s, fork %v", refused, st.Sessions[sess].Status, f != nil)
	}
}

// TestForkReadsAtMostMaxForkCopies: a session.forked saying it copied
// more than schemas.MaxForkCopies events is refused before the origin is
// read, and the read of an origin with more events than that up to the
// fork point stops after MaxForkCopies+1 of them, with a refusal.
func TestForkReadsAtMostMaxForkCopies(t *testing.T) {
	s := (&stream{}).add(started(chainPipeline()))
	for i := range schemas.MaxForkCopies + 200 {
		s.add(budgetEv(strconv.Itoa(i), schemas.Budget{MaxTokens: int64(i + 1)}))
	}
	point := s.evs[len(s.evs)-1]
	read := 0
	counted := func(session string, until uint64, fn func(schemas.Event) error) error {
		return s.read(session, until, func(ev schemas.Event) error {
			read++
			return fn(ev)
		})
	}
	for _, tc := range []struct {
		copied   int
		reason   string
		maxReads int
	}{
		{len(s.evs), "a fork copies at most", 0},
		{schemas.MaxForkCopies, "after more than 999 of its events", schemas.MaxForkCopies + 1},
	} {
		read = 0
		forked := schemas.Event{ID: "forked-" + forkSess, Type: schemas.TypeSessionForked, Session: forkSess,
			Data: &schemas.SessionForked{Origin: sess, Seq: point.Seq, Event: point.ID, Copied: tc.copied, Pipeline: chainPipeline(), Input: input()}}
		st := NewState()
		forget, err := PrepareFork(st, forked, counted)
		if err != nil {
			t.Fatal(err)
		}
		if err := Check(st, forked); !errors.Is(err, ErrInconsistent) || !strings.Contains(err.Error(), tc.reason) {
			t.Errorf("copied %d: Check = %v, want %q", tc.copied, err, tc.reason)
		}
		forget()
		if read > tc.maxReads {
			t.Errorf("copied %d: read %d events of the origin, want at most %d", tc.copied, read, tc.maxReads)
		}
	}
}

// TestForkKeepsBudgetRaises: a fork runs under its origin's budget at the
// fork point, raises by session.budget included (its usage carries over),
// tightened by session.forked's own budget.
func TestForkKeepsBudgetRaises(t *testing.T) {
	p := chainPipeline()
	p.Budget = &schemas.Budget{MaxCostUSD: 1, MaxIterations: 10}
	s := (&stream{}).add(started(p), budgetEv("1", schemas.Budget{MaxCostUSD: 5}))
	evs := s.fork(t, sess, "budget-1", forkSess, schemas.Pipeline{})
	forked := &evs[len(evs)-1]
	d := *forked.Data.(*schemas.SessionForked)
	d.Budget = &schemas.Budget{MaxTokens: 100}
	forked.Data = &d
	s.add(evs...)
	st, refused := foldStream(t, s)
	f := st.Sessions[forkSess]
	if f == nil {
		t.Fatalf("fork refused: %v", refused)
	}
	if want := (schemas.Budget{MaxCostUSD: 5, MaxTokens: 100, MaxIterations: 10}); f.Budget != want {
		t.Errorf("fork's budget %+v, want %+v", f.Budget, want)
	}
}
