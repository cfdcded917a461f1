package orchestrator_test

import (
	"bytes"
	"context"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/internal/testnats"
	"github.com/loopbus/loopbus/orchestrator"
	"github.com/loopbus/loopbus/projections"
	"github.com/loopbus/loopbus/schemas"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
)

// The runner against a real embedded NATS server. The test plays the CLI,
// the agent worker and the validator by publishing their events itself.

const waitTimeout = 10 * time.Second

// ---- orchestrator lifecycle ---------------------------------------------

// logSink collects the orchestrator's log lines; warnings and errors also go
// to the test log while the test runs.
type logSink struct {
	mu    sync.Mutex
	t     testing.TB
	done  bool
	lines []string
}

func newLogSink(t testing.TB) *logSink {
	s := &logSink{t: t}
	t.Cleanup(func() { s.mu.Lock(); s.done = true; s.mu.Unlock() })
	return s
}

func (s *logSink) Write(p []byte) (int, error) {
	line := strings.TrimRight(string(p), "\n")
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lines = append(s.lines, line)
	if !s.done && (strings.Contains(line, `"level":"warn"`) || strings.Contains(line, `"level":"error"`)) {
		s.t.Log(line)
	}
	return len(p), nil
}

// errors returns the error-level lines logged so far.
func (s *logSink) errors() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, l := range s.lines {
		if strings.Contains(l, `"level":"error"`) {
			out = append(out, l)
		}
	}
	return out
}

// count returns the number of lines containing s.
func (s *logSink) count(sub string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, l := range s.lines {
		if strings.Contains(l, sub) {
			n++
		}
	}
	return n
}

// runner is one running orchestrator.Service.
type runner struct {
	t      testing.TB
	name   string
	log    *logSink
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
}

// startRunner starts an orchestrator on b; it is stopped at cleanup at the
// latest.
func startRunner(t *testing.T, b orchestrator.Bus, name string) *runner {
	t.Helper()
	sink := newLogSink(t)
	log := zerolog.New(sink).Level(zerolog.DebugLevel).With().Str("replica", name).Logger()
	o, err := orchestrator.New(orchestrator.Config{}, b, log, time.Now)
	if err != nil {
		t.Fatalf("orchestrator.New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &runner{t: t, name: name, log: sink, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- o.Run(ctx) }()
	t.Cleanup(func() {
		r.stop()
		if t.Failed() {
			sink.mu.Lock()
			t.Logf("orchestrator %s log:\n%s", name, strings.Join(sink.lines, "\n"))
			sink.mu.Unlock()
		}
	})
	return r
}

// stop cancels Run and waits for it to return nil.
func (r *runner) stop() {
	r.once.Do(func() {
		r.cancel()
		select {
		case err := <-r.done:
			if err != nil {
				r.t.Errorf("orchestrator %s: Run returned %v", r.name, err)
			}
		case <-time.After(waitTimeout):
			r.t.Errorf("orchestrator %s: Run did not return after cancel", r.name)
		}
	})
}

// assertNoErrors fails if the orchestrator logged an error.
func (r *runner) assertNoErrors(t *testing.T) {
	t.Helper()
	if errs := r.log.errors(); len(errs) > 0 {
		t.Errorf("orchestrator %s logged errors:\n%s", r.name, strings.Join(errs, "\n"))
	}
}

// caughtUpBus is the real bus, reporting when a Read has caught up.
type caughtUpBus struct {
	*bus.Bus
	caughtUp chan struct{}
}

func (c *caughtUpBus) Read(ctx context.Context, opts bus.ReadOptions, fn func(schemas.Event) error) error {
	inner := opts.OnCaughtUp
	opts.OnCaughtUp = func() {
		if inner != nil {
			inner()
		}
		close(c.caughtUp)
	}
	return c.Bus.Read(ctx, opts, fn)
}

// ---- the session --------------------------------------------------------

// twoSteps is draft → review (final).
func twoSteps() schemas.Pipeline {
	return schemas.Pipeline{Name: "two-steps", Dir: "/srv/two-steps", Steps: []schemas.Step{
		{
			Name: "draft", Agent: schemas.AgentSpec{Backend: "exec", Command: []string{"sh", "draft.sh"}},
			Prompt:        "Draft from {{.Input.Name}}",
			Outputs:       []schemas.Output{{Name: "draft.md"}},
			MaxIterations: 2, TimeoutMs: 60000,
		},
		{
			Name: "review", Requires: []string{"draft"}, Final: true,
			Agent:         schemas.AgentSpec{Backend: "exec", Command: []string{"sh", "review.sh"}},
			Prompt:        "Review {{(index .Artifacts \"draft.md\").Name}}",
			Outputs:       []schemas.Output{{Name: "review.json"}},
			MaxIterations: 2, TimeoutMs: 60000,
		},
	}}
}

func hex64(seed string) string { return strings.TrimPrefix(schemas.Digest([]byte(seed)), "sha256:") }

func inputRef(session string) schemas.ArtifactRef {
	return schemas.ArtifactRef{Name: "input.md", Object: session + "/input/input.md", Digest: "sha256:" + hex64(session+"input"), Size: 100, ContentType: "text/markdown"}
}

func outputRef(session, step, name string) schemas.ArtifactRef {
	return schemas.ArtifactRef{Name: name, Object: session + "/" + step + "/" + name, Digest: "sha256:" + hex64(session+step+name), Size: 10, Step: step}
}

func startSession(t *testing.T, b *bus.Bus, session string, p schemas.Pipeline) schemas.Event {
	t.Helper()
	in := inputRef(session)
	id := schemas.DeterministicID(session, schemas.TypeSessionStarted)
	ev := schemas.Event{
		ID: id, Type: schemas.TypeSessionStarted, Session: session, Correlation: id, Time: time.Now(),
		Data: &schemas.SessionStarted{Pipeline: p, Input: in, SourceHash: schemas.ShortHash(in.Digest)},
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if _, err := b.PublishExpect(ctx, ev, 0); err != nil {
		t.Fatalf("publish session.started: %v", err)
	}
	return ev
}

// pass publishes what a worker and the validator would for a
// job.requested: artifact.stored, job.completed and validation.passed; it
// returns the verdict. Ids are deterministic, so passing the same job
// twice stores each once.
func pass(t *testing.T, b *bus.Bus, jr schemas.Event) schemas.Event {
	t.Helper()
	d := jr.Data.(*schemas.JobRequested)
	arts := complete(t, b, jr)
	ev := schemas.Event{
		ID:   schemas.DeterministicID(jr.Session, schemas.TypeValidationPassed, d.JobID),
		Type: schemas.TypeValidationPassed, Session: jr.Session, Step: d.Step, Job: d.JobID,
		Causation: jr.ID, Correlation: jr.Correlation, Time: time.Now(),
		Data: &schemas.Verdict{JobID: d.JobID, Step: d.Step, Iteration: d.Iteration, Artifacts: arts},
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	res, err := b.Publish(ctx, ev)
	if err != nil {
		t.Fatalf("publish validation.passed: %v", err)
	}
	ev.Seq = res.Seq
	return ev
}

// complete publishes what a worker would for a job.requested before its
// verdict, artifact.stored and job.completed, and returns the artifacts.
func complete(t *testing.T, b *bus.Bus, jr schemas.Event) []schemas.ArtifactRef {
	t.Helper()
	d := jr.Data.(*schemas.JobRequested)
	arts := []schemas.ArtifactRef{outputRef(jr.Session, d.Step, d.Outputs[0].Name)}
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	for _, e := range []schemas.Event{
		{ID: schemas.DeterministicID(jr.Session, schemas.TypeArtifactStored, d.JobID), Type: schemas.TypeArtifactStored,
			Data: &schemas.ArtifactStored{JobID: d.JobID, Artifact: arts[0]}},
		{ID: schemas.DeterministicID(jr.Session, "job.result", d.JobID), Type: schemas.TypeJobCompleted,
			Data: &schemas.JobCompleted{JobID: d.JobID, Step: d.Step, Iteration: d.Iteration, RequestSeq: jr.Seq, Worker: "w1", Artifacts: arts}},
	} {
		e.Session, e.Step, e.Job, e.Causation, e.Correlation, e.Time = jr.Session, d.Step, d.JobID, jr.ID, jr.Correlation, time.Now()
		if _, err := b.Publish(ctx, e); err != nil {
			t.Fatalf("publish %s: %v", e.Type, err)
		}
	}
	return arts
}

// ---- reading the stream -------------------------------------------------

// sessionEvents reads a session's events currently in the stream.
func sessionEvents(t *testing.T, b *bus.Bus, session string) []schemas.Event {
	t.Helper()
	return testnats.Events(t, b, schemas.SessionSubjects(session))
}

// waitEvents polls the session's events until cond holds.
func waitEvents(t *testing.T, b *bus.Bus, session, what string, cond func([]schemas.Event) bool) []schemas.Event {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for {
		evs := sessionEvents(t, b, session)
		if cond(evs) {
			return evs
		}
		if time.Now().After(deadline) {
			t.Fatalf("session %s: no %s within %v; events:\n%s", session, what, waitTimeout, describe(evs))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func find(evs []schemas.Event, typ, step string) (schemas.Event, bool) {
	for _, ev := range evs {
		if ev.Type == typ && ev.Step == step {
			return ev, true
		}
	}
	return schemas.Event{}, false
}

func has(typ, step string) func([]schemas.Event) bool {
	return func(evs []schemas.Event) bool { _, ok := find(evs, typ, step); return ok }
}

func mustFind(t *testing.T, evs []schemas.Event, typ, step string) schemas.Event {
	t.Helper()
	ev, ok := find(evs, typ, step)
	if !ok {
		t.Fatalf("no %s %s in\n%s", typ, step, describe(evs))
	}
	return ev
}

func describe(evs []schemas.Event) string {
	var b strings.Builder
	for _, ev := range evs {
		fmt.Fprintf(&b, "  %4d %-28s %-8s id=%s cause=%s\n", ev.Seq, ev.Type, ev.Step, ev.ID, ev.Causation)
	}
	return b.String()
}

type typeStep struct{ typ, step string }

// decisionTypes are the events only the orchestrator emits.
var decisionTypes = map[string]bool{
	schemas.TypeJobRequested: true, schemas.TypeStepCompleted: true, schemas.TypeStepFailed: true,
	schemas.TypeSessionCompleted: true, schemas.TypeSessionFailed: true,
}

// assertDecisionsOnce checks that each decision event type+step appears
// exactly once and that the decisions are exactly want.
func assertDecisionsOnce(t *testing.T, evs []schemas.Event, want ...typeStep) {
	t.Helper()
	got := map[typeStep]int{}
	for _, ev := range evs {
		if decisionTypes[ev.Type] {
			got[typeStep{ev.Type, ev.Step}]++
		}
	}
	wantM := map[typeStep]int{}
	for _, w := range want {
		wantM[w] = 1
	}
	if !reflect.DeepEqual(got, wantM) {
		t.Errorf("decision counts %v, want each once of %v; events:\n%s", got, want, describe(evs))
	}
}

// ---- tests --------------------------------------------------------------

func TestRunnerCompletesSession(t *testing.T) {
	b, _ := testnats.Bus(t)
	r := startRunner(t, b, "o1")
	const session = "happy"
	start := startSession(t, b, session, twoSteps())

	evs := waitEvents(t, b, session, "job.requested for draft", has(schemas.TypeJobRequested, "draft"))
	jr1 := mustFind(t, evs, schemas.TypeJobRequested, "draft")
	d1 := jr1.Data.(*schemas.JobRequested)
	if jr1.Causation != start.ID || jr1.Correlation != start.ID || jr1.Job != session+".draft.1" {
		t.Errorf("draft job envelope: causation %q correlation %q job %q", jr1.Causation, jr1.Correlation, jr1.Job)
	}
	if d1.JobID != session+".draft.1" || d1.Iteration != 1 || d1.Prompt != "Draft from input.md" ||
		!reflect.DeepEqual(d1.Inputs, []schemas.ArtifactRef{inputRef(session)}) || d1.Dir != "/srv/two-steps" {
		t.Errorf("draft job: %+v", d1)
	}
	if jr1.Source == "" || jr1.Time.IsZero() {
		t.Errorf("draft job: source %q time %v", jr1.Source, jr1.Time)
	}

	v1 := pass(t, b, jr1)
	evs = waitEvents(t, b, session, "job.requested for review", has(schemas.TypeJobRequested, "review"))
	sc := mustFind(t, evs, schemas.TypeStepCompleted, "draft")
	jr2 := mustFind(t, evs, schemas.TypeJobRequested, "review")
	if jr2.Seq != sc.Seq+1 {
		t.Errorf("step.completed at %d and job.requested at %d: not one decision", sc.Seq, jr2.Seq)
	}
	if sc.Causation != v1.ID || jr2.Causation != v1.ID {
		t.Errorf("causation %q, %q; want the verdict %q", sc.Causation, jr2.Causation, v1.ID)
	}
	draftOut := outputRef(session, "draft", "draft.md")
	scd := sc.Data.(*schemas.StepCompleted)
	if scd.JobID != d1.JobID || scd.Iterations != 1 || scd.ContentHash != schemas.ShortHash(draftOut.Digest) ||
		!reflect.DeepEqual(scd.Artifacts, []schemas.ArtifactRef{draftOut}) {
		t.Errorf("step.completed: %+v", scd)
	}
	d2 := jr2.Data.(*schemas.JobRequested)
	if d2.Prompt != "Review draft.md" || !reflect.DeepEqual(d2.Inputs, []schemas.ArtifactRef{inputRef(session), draftOut}) {
		t.Errorf("review job: %+v", d2)
	}

	pass(t, b, jr2)
	evs = waitEvents(t, b, session, "session.completed", has(schemas.TypeSessionCompleted, ""))
	done := mustFind(t, evs, schemas.TypeSessionCompleted, "")
	if final := done.Data.(*schemas.SessionCompleted).Final; !reflect.DeepEqual(final, []schemas.ArtifactRef{outputRef(session, "review", "review.json")}) {
		t.Errorf("final artifacts %+v", final)
	}
	if sc2 := mustFind(t, evs, schemas.TypeStepCompleted, "review"); done.Seq != sc2.Seq+1 {
		t.Errorf("step.completed at %d and session.completed at %d: not one decision", sc2.Seq, done.Seq)
	}
	assertDecisionsOnce(t, evs,
		typeStep{schemas.TypeJobRequested, "draft"}, typeStep{schemas.TypeStepCompleted, "draft"},
		typeStep{schemas.TypeJobRequested, "review"}, typeStep{schemas.TypeStepCompleted, "review"},
		typeStep{schemas.TypeSessionCompleted, ""})
	r.stop()
	r.assertNoErrors(t)
}

// TestRunnerRetriesAndFails: a failed verdict leads to iteration 2
// with the feedback; exhausting the iterations fails the session.
func TestRunnerRetriesAndFails(t *testing.T) {
	b, _ := testnats.Bus(t)
	r := startRunner(t, b, "o1")
	const session = "retry"
	startSession(t, b, session, twoSteps())
	evs := waitEvents(t, b, session, "job.requested for draft", has(schemas.TypeJobRequested, "draft"))
	jr := mustFind(t, evs, schemas.TypeJobRequested, "draft")
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	reject := func(jr schemas.Event, msg string) {
		t.Helper()
		d := jr.Data.(*schemas.JobRequested)
		complete(t, b, jr)
		_, err := b.Publish(ctx, schemas.Event{
			ID:   schemas.DeterministicID(session, schemas.TypeValidationFailed, d.JobID),
			Type: schemas.TypeValidationFailed, Session: session, Step: d.Step, Job: d.JobID, Causation: jr.ID, Correlation: jr.Correlation,
			Data: &schemas.Verdict{JobID: d.JobID, Step: d.Step, Iteration: d.Iteration,
				Errors: []schemas.ValidationError{{Artifact: "draft.md", Pointer: "", Message: msg, Source: "command"}}},
		})
		if err != nil {
			t.Fatalf("publish validation.failed: %v", err)
		}
	}
	reject(jr, "too short")
	evs = waitEvents(t, b, session, "iteration 2", func(evs []schemas.Event) bool {
		for _, ev := range evs {
			if d, ok := ev.Data.(*schemas.JobRequested); ok && d.Iteration == 2 {
				return true
			}
		}
		return false
	})
	var jr2 schemas.Event
	for _, ev := range evs {
		if d, ok := ev.Data.(*schemas.JobRequested); ok && d.Iteration == 2 {
			jr2 = ev
		}
	}
	d2 := jr2.Data.(*schemas.JobRequested)
	if d2.JobID != session+".draft.2" || len(d2.Feedback) != 1 || d2.Feedback[0].Errors[0].Message != "too short" ||
		!strings.Contains(d2.Prompt, "## Feedback from earlier iterations") || !strings.Contains(d2.Prompt, "- draft.md (root): too short") {
		t.Fatalf("iteration 2: %+v", jr2.Data)
	}
	reject(jr2, "still too short")
	evs = waitEvents(t, b, session, "session.failed", has(schemas.TypeSessionFailed, ""))
	sf := mustFind(t, evs, schemas.TypeStepFailed, "draft")
	if d := sf.Data.(*schemas.StepFailed); d.Iterations != 2 || !strings.Contains(d.Error, "still too short") {
		t.Errorf("step.failed: %+v", d)
	}
	if d := mustFind(t, evs, schemas.TypeSessionFailed, "").Data.(*schemas.SessionFailed); d.Step != "draft" || !strings.Contains(d.Reason, "step draft failed") {
		t.Errorf("session.failed: %+v", d)
	}
	r.stop()
	r.assertNoErrors(t)
}

// TestRunnerCatchesUpAfterRestart: a verdict published while no
// orchestrator runs is decided, exactly once, by the next one.
func TestRunnerCatchesUpAfterRestart(t *testing.T) {
	b, _ := testnats.Bus(t)
	first := startRunner(t, b, "first")
	const session = "restart"
	startSession(t, b, session, twoSteps())
	evs := waitEvents(t, b, session, "job.requested for draft", has(schemas.TypeJobRequested, "draft"))
	first.stop()

	v := pass(t, b, mustFind(t, evs, schemas.TypeJobRequested, "draft"))
	if after := sessionEvents(t, b, session); after[len(after)-1].ID != v.ID {
		t.Fatalf("a stopped orchestrator decided:\n%s", describe(after))
	}

	cb := &caughtUpBus{Bus: b, caughtUp: make(chan struct{})}
	second := startRunner(t, cb, "second")
	evs = waitEvents(t, b, session, "job.requested for review", has(schemas.TypeJobRequested, "review"))
	sc := mustFind(t, evs, schemas.TypeStepCompleted, "draft")
	jr2 := mustFind(t, evs, schemas.TypeJobRequested, "review")
	if jr2.Seq != sc.Seq+1 || sc.Causation != v.ID {
		t.Errorf("catch-up decision: step.completed at %d (cause %s), job.requested at %d", sc.Seq, sc.Causation, jr2.Seq)
	}
	select {
	case <-cb.caughtUp:
	case <-time.After(waitTimeout):
		t.Fatal("second orchestrator never caught up")
	}
	assertDecisionsOnce(t, evs,
		typeStep{schemas.TypeJobRequested, "draft"}, typeStep{schemas.TypeStepCompleted, "draft"},
		typeStep{schemas.TypeJobRequested, "review"})

	// The new instance carries on to the end.
	pass(t, b, jr2)
	evs = waitEvents(t, b, session, "session.completed", has(schemas.TypeSessionCompleted, ""))
	second.stop()

	// A third instance over a finished session decides nothing.
	cb3 := &caughtUpBus{Bus: b, caughtUp: make(chan struct{})}
	third := startRunner(t, cb3, "third")
	select {
	case <-cb3.caughtUp:
	case <-time.After(waitTimeout):
		t.Fatal("third orchestrator never caught up")
	}
	third.stop() // Run returns after any decision made on catch-up was published
	final := sessionEvents(t, b, session)
	if len(final) != len(evs) {
		t.Errorf("after a restart on a finished session: %d events, want %d:\n%s", len(final), len(evs), describe(final))
	}
	assertDecisionsOnce(t, final,
		typeStep{schemas.TypeJobRequested, "draft"}, typeStep{schemas.TypeStepCompleted, "draft"},
		typeStep{schemas.TypeJobRequested, "review"}, typeStep{schemas.TypeStepCompleted, "review"},
		typeStep{schemas.TypeSessionCompleted, ""})
	for _, r := range []*runner{first, second, third} {
		r.assertNoErrors(t)
	}
}

// TestRunnerStartsSessionsFromBeforeItRan: sessions started while no
// orchestrator ran are dispatched on catch-up; finished ones are left alone.
func TestRunnerStartsSessionsFromBeforeItRan(t *testing.T) {
	b, _ := testnats.Bus(t)
	startSession(t, b, "early-1", twoSteps())
	startSession(t, b, "early-2", twoSteps())
	r := startRunner(t, b, "late")
	for _, s := range []string{"early-1", "early-2"} {
		evs := waitEvents(t, b, s, "job.requested for draft", has(schemas.TypeJobRequested, "draft"))
		assertDecisionsOnce(t, evs, typeStep{schemas.TypeJobRequested, "draft"})
	}
	r.stop()
	r.assertNoErrors(t)
}

// TestRunnerConcurrentReplicas: two orchestrators on the same stream (each
// with its own connection) race for every decision; each decision is stored
// once.
func TestRunnerConcurrentReplicas(t *testing.T) {
	b, srv := testnats.Bus(t)
	b2 := testnats.Connect(t, srv.URL(), "test/replica-2")
	r1 := startRunner(t, b, "r1")
	r2 := startRunner(t, b2, "r2")

	p := twoSteps()
	// A diamond on top: more decisions, one of them dispatching two jobs.
	diamond := schemas.Pipeline{Name: "diamond", Steps: []schemas.Step{
		{Name: "a", Agent: p.Steps[0].Agent, Prompt: "a", Outputs: []schemas.Output{{Name: "a.json"}}, MaxIterations: 1, TimeoutMs: 1},
		{Name: "b", Requires: []string{"a"}, Agent: p.Steps[0].Agent, Prompt: "b", Outputs: []schemas.Output{{Name: "b.json"}}, MaxIterations: 1, TimeoutMs: 1},
		{Name: "c", Requires: []string{"a"}, Agent: p.Steps[0].Agent, Prompt: "c", Outputs: []schemas.Output{{Name: "c.json"}}, MaxIterations: 1, TimeoutMs: 1},
		{Name: "d", Requires: []string{"b", "c"}, Agent: p.Steps[0].Agent, Prompt: "d", Outputs: []schemas.Output{{Name: "d.json"}}, MaxIterations: 1, TimeoutMs: 1},
	}}
	sessions := map[string]schemas.Pipeline{"two": p, "diamond": diamond}
	for s, p := range sessions {
		startSession(t, b, s, p)
	}

	// Act as worker and validator: pass every job.requested until the
	// sessions complete.
	for s, p := range sessions {
		evs := waitEvents(t, b, s, "session.completed", func(evs []schemas.Event) bool {
			for _, ev := range evs {
				if ev.Type == schemas.TypeJobRequested {
					if _, ok := find(evs, schemas.TypeValidationPassed, ev.Step); !ok {
						pass(t, b, ev)
					}
				}
			}
			_, ok := find(evs, schemas.TypeSessionCompleted, "")
			return ok
		})
		var want []typeStep
		for _, st := range p.Steps {
			want = append(want, typeStep{schemas.TypeJobRequested, st.Name}, typeStep{schemas.TypeStepCompleted, st.Name})
		}
		assertDecisionsOnce(t, evs, append(want, typeStep{schemas.TypeSessionCompleted, ""})...)
	}
	r1.stop()
	r2.stop()
	for _, r := range []*runner{r1, r2} {
		t.Logf("replica %s: %d events published, %d decisions superseded", r.name, r.log.count(`"decided"`), r.log.count(`"decision superseded"`))
	}
	r1.assertNoErrors(t)
	r2.assertNoErrors(t)
}

// TestRunnerDeadLettersMalformed: malformed messages on the event stream
// are copied to the dead-letter stream with a reason, and the orchestrator
// keeps working.
func TestRunnerDeadLettersMalformed(t *testing.T) {
	b, _ := testnats.Bus(t)
	const subject = "loopbus.evt.x.job.requested"
	garbage := [][]byte{
		{0xff, 0x00, 'n', 'o', 't', ' ', 'j', 's', 'o', 'n'},       // before the orchestrator starts (catch-up)
		[]byte(`{"hello":"world","type":"loopbus.job.requested"}`), // JSON, not a CloudEvent
		[]byte(`{"specversion":"1.0","id":"x","source":"s","type":"loopbus.job.requested","subject":"x","time":"2025-01-01T00:00:00Z",` +
			`"datacontenttype":"application/json","dataschema":"urn:loopbus:schema:v1:job.requested","session":"x","data":{"jobId":""}}`), // CloudEvent, bad data
	}
	publishRaw := func(data []byte) {
		t.Helper()
		if err := b.Conn().Publish(subject, data); err != nil {
			t.Fatalf("raw publish: %v", err)
		}
		if err := b.Conn().Flush(); err != nil {
			t.Fatalf("flush: %v", err)
		}
	}
	publishRaw(garbage[0])
	r := startRunner(t, b, "o1")
	publishRaw(garbage[1])
	publishRaw(garbage[2])

	// Still working: a session runs to its first decisions.
	const session = "after-garbage"
	startSession(t, b, session, twoSteps())
	evs := waitEvents(t, b, session, "job.requested for draft", has(schemas.TypeJobRequested, "draft"))
	pass(t, b, mustFind(t, evs, schemas.TypeJobRequested, "draft"))
	waitEvents(t, b, session, "job.requested for review", has(schemas.TypeJobRequested, "review"))

	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	dlq, err := b.JetStream().Stream(ctx, "LOOPBUS_DLQ")
	if err != nil {
		t.Fatalf("DLQ stream: %v", err)
	}
	const dlqSubject = "loopbus.dlq.orchestrator"
	var msgs []*jetstream.RawStreamMsg
	deadline := time.Now().Add(waitTimeout)
	for {
		info, err := dlq.Info(ctx)
		if err != nil {
			t.Fatalf("DLQ info: %v", err)
		}
		if info.State.Msgs >= uint64(len(garbage)) {
			msgs = msgs[:0]
			for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
				m, err := dlq.GetMsg(ctx, seq)
				if err != nil {
					t.Fatalf("DLQ message %d: %v", seq, err)
				}
				msgs = append(msgs, m)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("DLQ holds %d messages, want %d", info.State.Msgs, len(garbage))
		}
		time.Sleep(10 * time.Millisecond)
	}
	if len(msgs) != len(garbage) {
		t.Fatalf("DLQ holds %d messages, want %d", len(msgs), len(garbage))
	}
	for i, m := range msgs {
		if want := dlqSubject + "." + m.Header.Get(bus.HeaderDLQSeq); m.Subject != want {
			t.Errorf("dead letter %d on %q, want %q", i, m.Subject, want)
		}
		if !bytes.Equal(m.Data, garbage[i]) {
			t.Errorf("dead letter %d data %q, want %q", i, m.Data, garbage[i])
		}
		if m.Header.Get("Loopbus-Dlq-Reason") == "" {
			t.Errorf("dead letter %d: no Loopbus-Dlq-Reason header: %v", i, m.Header)
		}
		if got := m.Header.Get(bus.HeaderDLQSubject); got != subject {
			t.Errorf("dead letter %d: subject header %q, want %q", i, got, subject)
		}
		if got := m.Header.Get(bus.HeaderDLQConsumer); got != "orchestrator" {
			t.Errorf("dead letter %d: consumer header %q", i, got)
		}
	}
	last, err := dlq.GetLastMsgForSubject(ctx, dlqSubject+".*")
	if err != nil {
		t.Fatalf("last dead letter: %v", err)
	}
	if !bytes.Equal(last.Data, garbage[len(garbage)-1]) || last.Header.Get("Loopbus-Dlq-Reason") == "" {
		t.Errorf("last dead letter %q reason %q", last.Data, last.Header.Get("Loopbus-Dlq-Reason"))
	}
	r.stop()
	r.assertNoErrors(t)
}

// TestRunnerMalformedLastEventOfSession: a malformed message stored on a
// running session's subject after its newest event must not wedge the
// session. The orchestrator skips the message, so its idea of the session's
// last sequence lags the stream's and every guarded publish is refused as
// stale.
func TestRunnerMalformedLastEventOfSession(t *testing.T) {
	b, _ := testnats.Bus(t)
	first := startRunner(t, b, "first")
	const session = "wedge"
	startSession(t, b, session, twoSteps())
	evs := waitEvents(t, b, session, "job.requested for draft", has(schemas.TypeJobRequested, "draft"))
	first.stop()

	v := pass(t, b, mustFind(t, evs, schemas.TypeJobRequested, "draft"))
	// e.g. a worker of another version whose event fails the schema.
	if err := b.Conn().Publish("loopbus.evt."+session+".tool.completed", []byte(`{"not":"a cloudevent"}`)); err != nil {
		t.Fatal(err)
	}
	if err := b.Conn().Flush(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	for {
		last, err := b.SessionLastSeq(ctx, session)
		if err != nil {
			t.Fatalf("session last seq: %v", err)
		}
		if last > v.Seq {
			break // the malformed message is the session's newest
		}
		time.Sleep(5 * time.Millisecond)
	}

	startRunner(t, b, "second")
	waitEvents(t, b, session, "job.requested for review", has(schemas.TypeJobRequested, "review"))
}

// TestNewRequiresBusAndClock covers New's argument checks.
func TestNewRequiresBusAndClock(t *testing.T) {
	b := &bus.Bus{}
	tests := []struct {
		name    string
		bus     orchestrator.Bus
		now     func() time.Time
		wantErr bool
	}{
		{name: "ok", bus: b, now: time.Now},
		{name: "no bus", bus: nil, now: time.Now, wantErr: true},
		{name: "no clock", bus: b, now: nil, wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o, err := orchestrator.New(orchestrator.Config{}, tc.bus, zerolog.Nop(), tc.now)
			if (err != nil) != tc.wantErr || (err == nil) == (o == nil) {
				t.Fatalf("New: %v, %v; wantErr %v", o, err, tc.wantErr)
			}
		})
	}
}

// TestRunnerDeadLettersReplays: a copy of a running session's event stored
// again after the server's duplicate window (so the server kept it), and a
// second session.started of the session, are not facts: the orchestrator
// dead-letters them with the reason and the session goes on unaffected.
func TestRunnerDeadLettersReplays(t *testing.T) {
	srv := testnats.Server(t)
	cat, err := schemas.NewCatalogue()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	const window = 500 * time.Millisecond
	b, err := bus.Connect(ctx, bus.Config{URL: srv.URL(), DuplicateWindow: window}, "test", cat, testnats.Logger(t))
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(b.Close)
	r := startRunner(t, b, "o1")
	const session = "replayed"
	start := startSession(t, b, session, twoSteps())
	evs := waitEvents(t, b, session, "job.requested for draft", has(schemas.TypeJobRequested, "draft"))
	jr := mustFind(t, evs, schemas.TypeJobRequested, "draft")

	time.Sleep(2 * window) // past the duplicate window: the server stores copies again
	second := start
	second.ID = "another-start"
	for _, ev := range []schemas.Event{jr, second} {
		m, err := b.Encode(ev)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.JetStream().PublishMsg(ctx, m); err != nil {
			t.Fatalf("publish copy of %s: %v", ev.Type, err)
		}
	}
	pass(t, b, jr)
	evs = waitEvents(t, b, session, "session.completed", func(evs []schemas.Event) bool {
		if ev, ok := find(evs, schemas.TypeJobRequested, "review"); ok && !has(schemas.TypeValidationPassed, "review")(evs) {
			pass(t, b, ev)
		}
		return has(schemas.TypeSessionCompleted, "")(evs)
	})
	// The copy is in the stream (the server kept it)...
	copies, got := 0, map[typeStep]int{}
	for _, ev := range evs {
		if ev.ID == jr.ID {
			copies++
			continue
		}
		if decisionTypes[ev.Type] {
			got[typeStep{ev.Type, ev.Step}]++
		}
	}
	if copies != 2 {
		t.Errorf("%d events with the id of draft's job.requested, want the original and its copy", copies)
	}
	// ...but every other decision was made once.
	for ts, n := range got {
		if n != 1 {
			t.Errorf("%d × %v, want 1; events:\n%s", n, ts, describe(evs))
		}
	}
	var reasons []string
	if err := b.DeadLetters(ctx, func(dl bus.DeadLetter) error {
		reasons = append(reasons, dl.Reason)
		return nil
	}); err != nil {
		t.Fatalf("DeadLetters: %v", err)
	}
	want := []string{"already has an event with id " + jr.ID, "already started by event " + start.ID}
	if len(reasons) != len(want) {
		t.Fatalf("dead letters %q, want %d", reasons, len(want))
	}
	for i, w := range want {
		if !strings.Contains(reasons[i], w) {
			t.Errorf("dead letter %d: reason %q, want it to say %q", i, reasons[i], w)
		}
	}
	r.stop()
	r.assertNoErrors(t)
}

// failingBus fails the first n batches with an error the bus would not
// retry, then behaves.
type failingBus struct {
	*bus.Bus
	mu sync.Mutex
	n  int
}

func (f *failingBus) PublishChain(ctx context.Context, session string, expectLast uint64, evs []schemas.Event) (bus.Published, error) {
	if err := f.fail(); err != nil {
		return bus.Published{}, err
	}
	return f.Bus.PublishChain(ctx, session, expectLast, evs)
}

func (f *failingBus) PublishBatch(ctx context.Context, session string, expectLast uint64, evs []schemas.Event) (bus.Published, error) {
	if err := f.fail(); err != nil {
		return bus.Published{}, err
	}
	return f.Bus.PublishBatch(ctx, session, expectLast, evs)
}

func (f *failingBus) fail() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.n--
	if f.n >= 0 {
		return fmt.Errorf("%w: refused for the test", bus.ErrRejected)
	}
	return nil
}

// TestRunnerRetriesAfterUnrecordableFallbackFails: when a decision and
// then the session's failure both cannot be recorded, the session is not
// left busy for ever: its next event decides again.
func TestRunnerRetriesAfterUnrecordableFallbackFails(t *testing.T) {
	b, _ := testnats.Bus(t)
	fb := &failingBus{Bus: b, n: 2}
	r := startRunner(t, fb, "o1")
	const session = "unrecordable"
	start := startSession(t, b, session, twoSteps())
	deadline := time.Now().Add(waitTimeout)
	for r.log.count("could not record the session's failure either") == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the decision and its fallback were never refused")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Any later event of the session is a new trigger.
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if _, err := b.Publish(ctx, schemas.Event{
		ID: "nudge", Type: schemas.TypeToolCompleted, Session: session, Step: "draft", Job: "x", Correlation: start.ID, Time: time.Now(),
		Data: &schemas.ToolCompleted{JobID: "x", ToolID: "t", Name: "n", Lane: "exec", Status: "ok"},
	}); err != nil {
		t.Fatalf("publish: %v", err)
	}
	waitEvents(t, b, session, "job.requested for draft", has(schemas.TypeJobRequested, "draft"))
}

// TestRunnerDeadLettersEventsOfNoSession: an event of a session that was
// never started is not a fact: the orchestrator dead-letters it with the
// reason, where before it was dropped without a word.
func TestRunnerDeadLettersEventsOfNoSession(t *testing.T) {
	b, _ := testnats.Bus(t)
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	r := startRunner(t, b, "o1")
	ghost := schemas.Event{ID: "ghost-completed", Type: schemas.TypeJobCompleted, Session: "ghost", Step: "draft", Job: "ghost.draft.1",
		Correlation: "ghost", Time: time.Now(), Data: &schemas.JobCompleted{JobID: "ghost.draft.1", Step: "draft", Iteration: 1, Worker: "w9", Artifacts: []schemas.ArtifactRef{}}}
	if _, err := b.Publish(ctx, ghost); err != nil {
		t.Fatal(err)
	}
	for {
		var reasons []string
		if err := b.DeadLetters(ctx, func(dl bus.DeadLetter) error {
			reasons = append(reasons, dl.Reason)
			return nil
		}); err != nil {
			t.Fatalf("DeadLetters: %v", err)
		}
		if len(reasons) == 1 {
			if !strings.Contains(reasons[0], "session ghost, which was never started") {
				t.Errorf("reason %q", reasons[0])
			}
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("no dead letter for the ghost session's event: %q", reasons)
		}
		time.Sleep(20 * time.Millisecond)
	}
	r.stop()
	r.assertNoErrors(t)
}

// TestRunnerDeadLettersForgedCompletions: a step.completed for a job whose
// validation never passed and a session.completed while the session runs
// contradict the history: the orchestrator dead-letters them with the
// reason, whoever sent them, and the session completes normally.
func TestRunnerDeadLettersForgedCompletions(t *testing.T) {
	b, _ := testnats.Bus(t)
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	r := startRunner(t, b, "o1")
	const session = "forged"
	start := startSession(t, b, session, twoSteps())
	evs := waitEvents(t, b, session, "job.requested for draft", has(schemas.TypeJobRequested, "draft"))
	jr := mustFind(t, evs, schemas.TypeJobRequested, "draft")
	job := jr.Data.(*schemas.JobRequested).JobID

	// The draft job runs: nothing passed yet.
	forged := []schemas.Event{
		{ID: "forged-step-completed", Type: schemas.TypeStepCompleted, Session: session, Step: "draft", Correlation: start.ID, Time: time.Now(),
			Data: &schemas.StepCompleted{Step: "draft", JobID: job, Iterations: 1, Artifacts: []schemas.ArtifactRef{}, ContentHash: schemas.ContentHash(nil)}},
		{ID: "forged-session-completed", Type: schemas.TypeSessionCompleted, Session: session, Correlation: start.ID, Time: time.Now(),
			Data: &schemas.SessionCompleted{Final: []schemas.ArtifactRef{}}},
	}
	for _, ev := range forged {
		if _, err := b.Publish(ctx, ev); err != nil {
			t.Fatalf("publish forged %s: %v", ev.Type, err)
		}
	}
	want := []string{
		"step.completed completes step draft with job " + job + ", whose validation has not passed",
		"session.completed completes session " + session + ", but step draft is running",
	}
	assertDeadLetters(ctx, t, b, want)

	// Readers of the stream do not end the session on the forgery either.
	if m := projections.BuildManifest(session, waitEvents(t, b, session, "the forgeries", has(schemas.TypeSessionCompleted, ""))); m.Status != projections.StatusRunning {
		t.Errorf("the manifest folded from the stream says %s after a forged session.completed, want running", m.Status)
	}

	// The session goes on as if they had never been sent.
	pass(t, b, jr)
	evs = waitEvents(t, b, session, "session.completed", func(evs []schemas.Event) bool {
		if ev, ok := find(evs, schemas.TypeJobRequested, "review"); ok && !has(schemas.TypeValidationPassed, "review")(evs) {
			pass(t, b, ev)
		}
		for _, ev := range evs {
			if ev.Type == schemas.TypeSessionCompleted && ev.ID != forged[1].ID {
				return true
			}
		}
		return false
	})
	var own []schemas.Event
	for _, ev := range evs {
		if ev.ID != forged[0].ID && ev.ID != forged[1].ID {
			own = append(own, ev)
		}
	}
	assertDecisionsOnce(t, own,
		typeStep{schemas.TypeJobRequested, "draft"}, typeStep{schemas.TypeStepCompleted, "draft"},
		typeStep{schemas.TypeJobRequested, "review"}, typeStep{schemas.TypeStepCompleted, "review"},
		typeStep{schemas.TypeSessionCompleted, ""})
	sc := mustFind(t, own, schemas.TypeStepCompleted, "draft")
	if d := sc.Data.(*schemas.StepCompleted); !reflect.DeepEqual(d.Artifacts, []schemas.ArtifactRef{outputRef(session, "draft", "draft.md")}) {
		t.Errorf("draft completed with %+v, want its passed output", d.Artifacts)
	}
	r.stop()
	r.assertNoErrors(t)
}

// TestClosedSessionCancelsItsJobs: a session closed while its job runs
// gets a job.cancelled for it, so the agent stops spending.
func TestClosedSessionCancelsItsJobs(t *testing.T) {
	b, _ := testnats.Bus(t)
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	startRunner(t, b, "o1")
	const session = "closing"
	start := startSession(t, b, session, twoSteps())
	waitEvents(t, b, session, "job.requested for draft", has(schemas.TypeJobRequested, "draft"))
	closed := schemas.Event{ID: "close-1", Type: schemas.TypeSessionClosed, Session: session, Correlation: start.ID, Time: time.Now(),
		Data: &schemas.SessionClosed{Reason: "not needed any more"}}
	if _, err := b.Publish(ctx, closed); err != nil {
		t.Fatal(err)
	}
	waitEvents(t, b, session, "job.cancelled for draft", has(schemas.TypeJobCancelled, "draft"))
}

// cuttingBus writes only the first event of the first chain of more than
// one event, then answers as a lost connection would: the orchestrator
// that made the decision stops there, as if killed between two writes.
type cuttingBus struct {
	*bus.Bus
	mu  sync.Mutex
	cut bool
}

func (c *cuttingBus) PublishChain(ctx context.Context, session string, expectLast uint64, evs []schemas.Event) (bus.Published, error) {
	c.mu.Lock()
	cut := !c.cut && len(evs) > 1
	c.cut = c.cut || cut
	c.mu.Unlock()
	if !cut {
		return c.Bus.PublishChain(ctx, session, expectLast, evs)
	}
	if _, err := c.Bus.PublishChain(ctx, session, expectLast, evs[:1]); err != nil {
		return bus.Published{}, err
	}
	return bus.Published{}, fmt.Errorf("cut after the first event: %w", bus.ErrConnectionLost)
}

// TestRunnerCompletesADecisionCutShort: a decision is written event by
// event; one cut after its first event (step.completed, not the next
// job.requested) is made whole by the next orchestrator from the events
// written, and the session completes with each decision once.
func TestRunnerCompletesADecisionCutShort(t *testing.T) {
	b, _ := testnats.Bus(t)
	cb := &cuttingBus{Bus: b}
	r1 := startRunner(t, cb, "o1")
	const session = "cut"
	startSession(t, b, session, twoSteps())
	evs := waitEvents(t, b, session, "job.requested for draft", has(schemas.TypeJobRequested, "draft"))
	pass(t, b, mustFind(t, evs, schemas.TypeJobRequested, "draft"))
	evs = waitEvents(t, b, session, "step.completed for draft", has(schemas.TypeStepCompleted, "draft"))
	r1.stop()
	if _, ok := find(sessionEvents(t, b, session), schemas.TypeJobRequested, "review"); ok {
		t.Fatalf("the chain was not cut: %s", describe(evs))
	}
	r2 := startRunner(t, b, "o2")
	evs = waitEvents(t, b, session, "job.requested for review", has(schemas.TypeJobRequested, "review"))
	pass(t, b, mustFind(t, evs, schemas.TypeJobRequested, "review"))
	evs = waitEvents(t, b, session, "session.completed", has(schemas.TypeSessionCompleted, ""))
	assertDecisionsOnce(t, evs,
		typeStep{schemas.TypeJobRequested, "draft"}, typeStep{schemas.TypeStepCompleted, "draft"},
		typeStep{schemas.TypeJobRequested, "review"}, typeStep{schemas.TypeStepCompleted, "review"},
		typeStep{schemas.TypeSessionCompleted, ""})
	r2.stop()
	r2.assertNoErrors(t)
}

// interleavingBus writes the first event of the first chain of more
// than one event, then stores another event of the session, as a worker
// would between two writes, and answers ErrStale: the rest of the chain
// is refused. It records the types of the events written in chains.
type interleavingBus struct {
	*bus.Bus
	mu      sync.Mutex
	done    bool
	chained map[string]bool
}

func (c *interleavingBus) PublishChain(ctx context.Context, session string, expectLast uint64, evs []schemas.Event) (bus.Published, error) {
	c.mu.Lock()
	cut := !c.done && len(evs) > 1
	c.done = c.done || cut
	if c.chained == nil {
		c.chained = map[string]bool{}
	}
	for _, ev := range evs {
		c.chained[ev.Type] = true
	}
	c.mu.Unlock()
	if !cut {
		return c.Bus.PublishChain(ctx, session, expectLast, evs)
	}
	if _, err := c.Bus.PublishChain(ctx, session, expectLast, evs[:1]); err != nil {
		return bus.Published{}, err
	}
	if _, err := c.Bus.Publish(ctx, schemas.Event{
		ID: "between", Type: schemas.TypeToolCompleted, Session: session, Step: "draft", Job: "x", Time: time.Now(),
		Data: &schemas.ToolCompleted{JobID: "x", ToolID: "t", Name: "n", Lane: "exec", Status: "ok"},
	}); err != nil {
		return bus.Published{}, err
	}
	return bus.Published{}, fmt.Errorf("another event came between: %w", bus.ErrStale)
}

// TestRunnerCompletesAnInterruptedDecision: step.completed is written,
// then another event comes between it and the next job.requested; the
// orchestrator decides again and requests the job, each decision once. A
// signal's answer, which could not be made whole again from a part of
// it, is written as one batch, never as a chain, and so is a failure.
func TestRunnerCompletesAnInterruptedDecision(t *testing.T) {
	b, _ := testnats.Bus(t)
	ib := &interleavingBus{Bus: b}
	r := startRunner(t, ib, "o1")
	const session = "interrupted"
	startSession(t, b, session, twoSteps())
	evs := waitEvents(t, b, session, "job.requested for draft", has(schemas.TypeJobRequested, "draft"))
	pass(t, b, mustFind(t, evs, schemas.TypeJobRequested, "draft"))
	evs = waitEvents(t, b, session, "job.requested for review", has(schemas.TypeJobRequested, "review"))
	sc, jr := mustFind(t, evs, schemas.TypeStepCompleted, "draft"), mustFind(t, evs, schemas.TypeJobRequested, "review")
	if between := mustFind(t, evs, schemas.TypeToolCompleted, "draft"); !(sc.Seq < between.Seq && between.Seq < jr.Seq) {
		t.Fatalf("the decision was not interrupted:\n%s", describe(evs))
	}
	publish(t, b, schemas.Event{ID: "stop-1", Type: schemas.TypeSignalStop, Session: session, Time: time.Now(),
		Data: &schemas.Signal{Target: session, Reason: "enough"}})
	evs = waitEvents(t, b, session, "signal.acknowledged", has(schemas.TypeSignalAcknowledged, ""))
	ack := mustFind(t, evs, schemas.TypeSignalAcknowledged, "")
	if d := ack.Data.(*schemas.SignalAcknowledged); d.Result != schemas.SignalApplied {
		t.Errorf("ack: %+v", d)
	}
	if cancelled := mustFind(t, evs, schemas.TypeJobCancelled, "review"); cancelled.Seq+2 != ack.Seq {
		t.Errorf("the answer is not one write:\n%s", describe(evs))
	}
	ib.mu.Lock()
	for typ := range ib.chained {
		switch typ {
		case schemas.TypeJobRequested, schemas.TypeStepCompleted:
		default:
			t.Errorf("a %s was written in a chain", typ)
		}
	}
	ib.mu.Unlock()
	assertDecisionsOnce(t, evs,
		typeStep{schemas.TypeJobRequested, "draft"}, typeStep{schemas.TypeStepCompleted, "draft"},
		typeStep{schemas.TypeJobRequested, "review"})
	for _, typ := range []string{schemas.TypeJobCancelled, schemas.TypeSessionStopped, schemas.TypeSignalAcknowledged} {
		if n := countType(evs, typ); n != 1 {
			t.Errorf("%d %s, want 1:\n%s", n, typ, describe(evs))
		}
	}
	r.stop()
	r.assertNoErrors(t)
}

// assertDeadLetters waits until the dead-letter stream holds len(want)
// letters (until ctx ends), then checks that there are exactly that many
// and that each reason says its want, in order.
func assertDeadLetters(ctx context.Context, t *testing.T, b *bus.Bus, want []string) {
	t.Helper()
	var reasons []string
	for {
		reasons = reasons[:0]
		if err := b.DeadLetters(ctx, func(dl bus.DeadLetter) error {
			reasons = append(reasons, dl.Reason)
			return nil
		}); err != nil {
			t.Fatalf("DeadLetters: %v", err)
		}
		if len(reasons) >= len(want) {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("dead letters %q, want %d", reasons, len(want))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if len(reasons) != len(want) {
		t.Fatalf("dead letters %q, want %d", reasons, len(want))
	}
	for i, w := range want {
		if !strings.Contains(reasons[i], w) {
			t.Errorf("dead letter %d: reason %q, want it to say %q", i, reasons[i], w)
		}
	}
}
