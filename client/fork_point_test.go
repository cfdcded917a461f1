package client

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/loopbus/loopbus/schemas"
)

// history builds a session's events as the services write them: the
// orchestrator's decisions in a row, each event caused by the decision's
// trigger and correlated with the session's start.
type history struct {
	session string
	evs     []schemas.Event
}

// add appends an event of source caused by cause ("" for none) and
// returns its id.
func (h *history) add(source, typ, step, cause string, data any) string {
	ev := schemas.Event{ID: fmt.Sprintf("e%d", len(h.evs)+1), Source: source, Type: typ, Session: h.session, Step: step, Causation: cause,
		Data: data, Seq: uint64(len(h.evs) + 1)}
	if len(h.evs) > 0 {
		ev.Correlation = h.evs[0].ID
	}
	h.evs = append(h.evs, ev)
	return ev.ID
}

// decide appends one decision of the orchestrator, triggered by trigger.
func (h *history) decide(trigger string, evs ...schemas.Event) {
	for _, ev := range evs {
		h.add("orchestrator", ev.Type, ev.Step, trigger, ev.Data)
	}
}

// worker appends a worker's event and returns its id.
func (h *history) worker(typ, step string) string {
	return h.add("worker", typ, step, "", &schemas.JobCompleted{})
}

func spawned(loop, parent, level string) schemas.Event {
	return schemas.Event{Type: schemas.TypeLoopSpawned, Step: loop, Data: &schemas.LoopSpawned{Loop: loop, Parent: parent, Level: level}}
}

func merged(loop string) schemas.Event {
	return schemas.Event{Type: schemas.TypeLoopMerged, Step: loop, Data: &schemas.LoopMerged{Loop: loop, Head: "head-" + loop}}
}

func rebase(loop, cause string) schemas.Event {
	return schemas.Event{Type: schemas.TypeLoopRebase, Step: loop, Data: &schemas.LoopRebase{Loop: loop, Cause: cause}}
}

func completed(step string) schemas.Event {
	return schemas.Event{Type: schemas.TypeStepCompleted, Step: step, Data: &schemas.StepCompleted{Step: step}}
}

func taskUpdated(id string) schemas.Event {
	return schemas.Event{Type: schemas.TypeTaskUpdated, Step: id, Data: &schemas.TaskUpdated{ID: id, Status: schemas.TaskDone}}
}

// levels is a loops pipeline of levels, each below the one before; the
// first works in no worktree, the others do.
func levels(names ...string) schemas.Pipeline {
	p := schemas.Pipeline{Name: "tree", Kind: schemas.KindLoops, Loops: &schemas.Loops{}}
	for i, n := range names {
		p.Loops.Levels = append(p.Loops.Levels, schemas.LoopLevel{Name: n, Prompt: n, MaxIterations: 1, Worktree: i > 0})
	}
	return p
}

// codeLoops is a coding session: a plan spawned two code loops, which
// merged one after the other (the first at e13, in a decision that also
// rebased the second, e13…e14, triggered by the merge job's result e12).
func codeLoops() []schemas.Event {
	h := &history{session: "s1"}
	start := h.add("cli", schemas.TypeSessionStarted, "", "", &schemas.SessionStarted{Pipeline: levels("plan", "code"), Loops: &schemas.LoopsStart{Task: "t"}})
	h.decide(start, spawned("plan", "", "plan"))                                                                // e2
	done := h.worker(schemas.TypeJobCompleted, "plan")                                                          // e3
	h.decide(done, completed("plan"), spawned("plan-001", "plan", "code"), spawned("plan-002", "plan", "code")) // e4…e6
	h.worker(schemas.TypeJobCompleted, "plan-001")                                                              // e7
	h.decide("e7", completed("plan-001"))                                                                       // e8
	h.worker(schemas.TypeJobStarted, "plan-002")                                                                // e9
	h.worker(schemas.TypeJobStarted, "plan-001")                                                                // e10 (the merge job)
	h.worker(schemas.TypeJobCompleted, "plan-002")                                                              // e11
	m1 := h.worker(schemas.TypeJobCompleted, "plan-001")                                                        // e12
	h.decide(m1, merged("plan-001"), rebase("plan-002", "plan-001"))                                            // e13…e14
	h.decide("e14", completed("plan-002"))                                                                      // e15
	m2 := h.worker(schemas.TypeJobCompleted, "plan-002")                                                        // e16
	h.decide(m2, merged("plan-002"))                                                                            // e17
	return h.evs
}

// deepLoops is a coding session whose code loop merged before the spec
// loop above it (e8), then a fix loop under it (e11), then the spec loop
// (e13).
func deepLoops() []schemas.Event {
	h := &history{session: "s1"}
	start := h.add("cli", schemas.TypeSessionStarted, "", "", &schemas.SessionStarted{Pipeline: levels("plan", "spec", "code", "fix"), Loops: &schemas.LoopsStart{Task: "t"}})
	h.decide(start, spawned("plan", "", "plan"), completed("plan"), spawned("p-1", "plan", "spec"))
	h.decide(h.worker(schemas.TypeJobCompleted, "p-1"), spawned("p-1-1", "p-1", "code"))
	h.decide(h.worker(schemas.TypeJobCompleted, "p-1-1"), merged("p-1-1"), spawned("p-1-1-1", "p-1-1", "fix"))
	h.decide(h.worker(schemas.TypeJobCompleted, "p-1-1-1"), merged("p-1-1-1"))
	h.decide(h.worker(schemas.TypeJobCompleted, "p-1"), merged("p-1"))
	return h.evs
}

// tasks is a backlog session: T001 and then T002 ran and completed (each
// in a decision with its task's update), then the review.
func tasks() []schemas.Event {
	h := &history{session: "b1"}
	start := h.add("cli", schemas.TypeSessionStarted, "", "", &schemas.SessionStarted{Pipeline: schemas.Pipeline{Name: "bk", Kind: schemas.KindBacklog, Backlog: &schemas.Backlog{}}})
	h.decide(start, schemas.Event{Type: schemas.TypeJobRequested, Step: "T001", Data: &schemas.JobRequested{Step: "T001"}})
	h.decide(h.worker(schemas.TypeJobCompleted, "T001"), taskUpdated("T001"), completed("T001"))      // e3; e4, e5
	h.decide(h.worker(schemas.TypeJobCompleted, "T002"), taskUpdated("T002"), completed("T002"))      // e6; e7, e8
	h.decide(h.worker(schemas.TypeJobCompleted, schemas.PhaseReview), completed(schemas.PhaseReview)) // e9; e10
	return h.evs
}

// TestForkPoint: a fork that runs again a merged loop or a completed
// backlog run moves its point back to the last event before the decision
// that merged (completed) the first of them, and again from there until
// none is left; a point with none stays.
func TestForkPoint(t *testing.T) {
	forked := &schemas.SessionForked{Origin: "s0", Pipeline: levels("plan", "code")}
	for _, tc := range []struct {
		name    string
		history []schemas.Event
		at      int // events up to the requested point
		p       schemas.Pipeline
		changed []string
		// want is the point (an event id) and the work it moved before.
		want, redo string
	}{
		{"a changed code level: before the decision that merged the first code loop", codeLoops(), 17, levels("plan", "code"), []string{"code"},
			"e12", "loop plan-001 (level code, changed) merged at 13"},
		{"at the first merge's decision, inside it", codeLoops(), 14, levels("plan", "code"), []string{"code"},
			"e12", "loop plan-001 (level code, changed) merged at 13"},
		{"a changed plan level: its code loops go", codeLoops(), 17, levels("plan", "code"), []string{"plan"},
			"e12", "loop plan-001 (level code, under a loop that runs again) merged at 13"},
		{"no code level in the fork's file", codeLoops(), 17, levels("plan"), []string{"plan"},
			"e12", "loop plan-001 (level code, not in the fork's file) merged at 13"},
		{"before any merge, a changed code level keeps the point", codeLoops(), 12, levels("plan", "code"), []string{"code"}, "e12", ""},
		{"nothing changed keeps the point", codeLoops(), 17, levels("plan", "code"), nil, "e17", ""},
		{"a changed fix level moves the point before the fix loop's merge, where the spec loop above the merged code loop had not merged: again before that",
			deepLoops(), 13, levels("plan", "spec", "code", "fix"), []string{"fix"},
			"e7", "loop p-1-1 (level code, under a loop that runs again) merged at 8, loop p-1-1-1 (level fix, changed) merged at 11"},
		{"a changed iterate role: before the decision that completed the first task run", tasks(), 10, schemas.Pipeline{Kind: schemas.KindBacklog}, []string{schemas.RoleIterate},
			"e3", "run T001 (role iterate, changed) completed at 5"},
		{"a changed review role: before the review's completion", tasks(), 10, schemas.Pipeline{Kind: schemas.KindBacklog}, []string{schemas.RoleReview},
			"e9", "run review (role review, changed) completed at 10"},
		{"a changed review role before the review completed keeps the point", tasks(), 9, schemas.Pipeline{Kind: schemas.KindBacklog}, []string{schemas.RoleReview}, "e9", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := *forked
			d.Pipeline, d.Changed = tc.p, tc.changed
			session := tc.history[0].Session
			n, redo, err := forkPoint(tc.history[:tc.at], session, &d)
			if err != nil {
				t.Fatal(err)
			}
			if got := tc.history[n-1].ID; got != tc.want {
				t.Errorf("point %s, want %s", got, tc.want)
			}
			f := Forked{Requested: tc.history[tc.at-1], Point: tc.history[n-1], Redo: redo}
			if tc.redo == "" {
				if len(redo) > 0 || f.MovedBack() != "" {
					t.Errorf("moved before %v: %s", redo, f.MovedBack())
				}
				return
			}
			want := fmt.Sprintf("fork point moved back from stream sequence %d to %d: %s, and later work was built on", tc.at, n, tc.redo)
			if got := f.MovedBack(); !strings.HasPrefix(got, want) {
				t.Errorf("MovedBack:\n  %s\nwant:\n  %s", got, want)
			}
		})
	}
}

// TestForkPointInCopies: a point that would move back into the history a
// fork copied from its origin is refused, naming the origin's event to
// fork at instead.
func TestForkPointInCopies(t *testing.T) {
	var evs []schemas.Event
	for _, ev := range codeLoops() {
		ev.ForkOf, ev.ID, ev.Session = ev.ID, "c-"+ev.ID, "s2"
		if ev.Causation != "" {
			ev.Causation = "c-" + ev.Causation
		}
		ev.Correlation = "c-" + ev.Correlation
		evs = append(evs, ev)
	}
	h := &history{session: "s2", evs: evs}
	h.add("cli", schemas.TypeSessionForked, "", "", &schemas.SessionForked{Origin: "s1", Pipeline: levels("plan", "code")})
	d := &schemas.SessionForked{Pipeline: levels("plan", "code"), Changed: []string{"code"}}
	_, _, err := forkPoint(h.evs, "s2", d)
	want := "the fork runs again loop plan-001 (level code, changed) merged at 13, and later work was built on it; the fork point would move back before it, " +
		"into the history s2 copied from its origin: fork s1 instead (loopbus fork s1 --at e12)"
	if !errors.Is(err, ErrBadInput) || !strings.Contains(err.Error(), want) {
		t.Errorf("forkPoint = %v, want %q", err, want)
	}
}

func sessionCompleted() schemas.Event {
	return schemas.Event{Type: schemas.TypeSessionCompleted, Data: &schemas.SessionCompleted{}}
}

// TestForkPointAtTheEnd: a loops or backlog point at or after the
// origin's own end moves back to the last event before the decision that
// ended it (with the events it shares), and the checks for redone work go
// on from there; a pipeline's point stays.
func TestForkPointAtTheEnd(t *testing.T) {
	// The last merge's decision completes the session (e17…e18).
	done := func() []schemas.Event {
		h := &history{session: "s1", evs: codeLoops()}
		h.evs = h.evs[:len(h.evs)-1]
		h.decide("e16", merged("plan-002"), sessionCompleted())
		return h.evs
	}
	// The second code loop used up its iterations: step.failed and
	// session.failed in one decision (e17…e18), then a hook ran (e19).
	failed := func() []schemas.Event {
		h := &history{session: "s1", evs: codeLoops()[:16]}
		h.decide("e16", schemas.Event{Type: schemas.TypeStepFailed, Step: "plan-002", Data: &schemas.StepFailed{Step: "plan-002", Error: "no"}},
			schemas.Event{Type: schemas.TypeSessionFailed, Data: &schemas.SessionFailed{Step: "plan-002", Reason: "no"}})
		h.add("hooks", schemas.TypeHookCompleted, "", "e18", &schemas.HookRun{})
		return h.evs
	}
	backlogDone := func() []schemas.Event {
		h := &history{session: "b1", evs: tasks()}
		h.decide("e9", completed(schemas.PhaseReview), sessionCompleted())
		h.evs = slices.Delete(h.evs, 9, 10) // the review's completion is in the ending decision
		for i := range h.evs {
			h.evs[i].ID, h.evs[i].Seq = fmt.Sprintf("e%d", i+1), uint64(i+1)
		}
		return h.evs
	}
	pipeline := func() []schemas.Event {
		h := &history{session: "p1"}
		start := h.add("cli", schemas.TypeSessionStarted, "", "", &schemas.SessionStarted{Pipeline: schemas.Pipeline{Name: "p"}})
		h.decide(start, schemas.Event{Type: schemas.TypeJobRequested, Step: "one", Data: &schemas.JobRequested{Step: "one"}})
		h.decide(h.worker(schemas.TypeJobCompleted, "one"), completed("one"), sessionCompleted()) // e3; e4, e5
		return h.evs
	}
	for _, tc := range []struct {
		name    string
		history []schemas.Event
		at      int
		p       schemas.Pipeline
		changed []string
		want    string // the point (an event id)
		moved   string // MovedBack ("" when it stays)
	}{
		{"a completed loops session at its end: before the decision that completed it", done(), 18, levels("plan", "code"), nil,
			"e16", "fork point moved back from stream sequence 18 to 16: session s1 completed at 18, and a fork starts from a running session"},
		{"inside the ending decision", done(), 17, levels("plan", "code"), nil, "e17", ""},
		{"then a changed code level moves it before the first merge", done(), 18, levels("plan", "code"), []string{"code"},
			"e12", "fork point moved back from stream sequence 18 to 12: loop plan-001 (level code, changed) merged at 13, and later work was built on it; " +
				"session s1 completed at 18, and a fork starts from a running session"},
		{"a failed loops session: before step.failed and session.failed", failed(), 18, levels("plan", "code"), nil,
			"e16", "fork point moved back from stream sequence 18 to 16: session s1 failed at 18, and a fork starts from a running session"},
		{"a point after the end", failed(), 19, levels("plan", "code"), nil,
			"e16", "fork point moved back from stream sequence 19 to 16: session s1 failed at 18, and a fork starts from a running session"},
		{"a completed backlog", backlogDone(), 11, schemas.Pipeline{Kind: schemas.KindBacklog}, nil,
			"e9", "fork point moved back from stream sequence 11 to 9: session b1 completed at 11, and a fork starts from a running session"},
		{"a pipeline forks at its end", pipeline(), 5, schemas.Pipeline{Name: "p"}, nil, "e5", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := &schemas.SessionForked{Pipeline: tc.p, Changed: tc.changed}
			n, redo, err := forkPoint(tc.history[:tc.at], tc.history[0].Session, d)
			if err != nil {
				t.Fatal(err)
			}
			if got := tc.history[n-1].ID; got != tc.want {
				t.Errorf("point %s, want %s", got, tc.want)
			}
			f := Forked{Requested: tc.history[tc.at-1], Point: tc.history[n-1], Redo: redo}
			if got := f.MovedBack(); got != tc.moved {
				t.Errorf("MovedBack:\n  %q\nwant:\n  %q", got, tc.moved)
			}
		})
	}
}
