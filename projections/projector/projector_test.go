package projector_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/internal/testnats"
	"github.com/loopbus/loopbus/projections"
	"github.com/loopbus/loopbus/projections/projector"
	"github.com/loopbus/loopbus/schemas"
)

const waitTimeout = 30 * time.Second

var epoch = time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)

// spec is one event to publish; data may refer to the stream sequences of
// earlier job.requested events through reqSeq.
type spec struct {
	session, typ, step, job string
	data                    func(reqSeq map[string]uint64) any
}

// publisher publishes specs in order with distinct ids and times.
type publisher struct {
	t      *testing.T
	b      *bus.Bus
	n      int
	reqSeq map[string]uint64
	last   map[string]uint64 // newest sequence per session
}

func newPublisher(t *testing.T, b *bus.Bus) *publisher {
	return &publisher{t: t, b: b, reqSeq: map[string]uint64{}, last: map[string]uint64{}}
}

func (p *publisher) publish(specs ...spec) {
	p.t.Helper()
	for _, s := range specs {
		p.n++
		res, err := p.b.Publish(context.Background(), schemas.Event{
			ID:          schemas.DeterministicID("projector-test", s.session, s.typ, strconv.Itoa(p.n)),
			Type:        s.typ,
			Session:     s.session,
			Step:        s.step,
			Job:         s.job,
			Correlation: s.session,
			Time:        epoch.Add(time.Duration(p.n) * time.Second),
			Data:        s.data(p.reqSeq),
		})
		if err != nil {
			p.t.Fatalf("publish %s of %s: %v", s.typ, s.session, err)
		}
		if res.Duplicate {
			p.t.Fatalf("publish %s of %s: duplicate", s.typ, s.session)
		}
		if s.typ == schemas.TypeJobRequested {
			p.reqSeq[s.job] = res.Seq
		}
		p.last[s.session] = res.Seq
	}
}

func ref(name, object, content, step string) schemas.ArtifactRef {
	return schemas.ArtifactRef{
		Name: name, Object: object, Digest: schemas.Digest([]byte(content)),
		Size: int64(len(content)), ContentType: "application/json", Step: step,
	}
}

func pipeline() schemas.Pipeline {
	step := func(name string, requires []string, final bool) schemas.Step {
		return schemas.Step{
			Name:          name,
			Agent:         schemas.AgentSpec{Backend: "exec", Command: []string{"sh", "agents/" + name + ".sh"}},
			Prompt:        "Do " + name + ".",
			Requires:      requires,
			Outputs:       []schemas.Output{{Name: name + ".json"}},
			MaxIterations: 2,
			TimeoutMs:     60000,
			Final:         final,
		}
	}
	return schemas.Pipeline{Name: "kit", Dir: "/srv/kit", Steps: []schemas.Step{
		step("summary", nil, false),
		step("ideas", []string{"summary"}, true),
	}}
}

func constant(v any) func(map[string]uint64) any { return func(map[string]uint64) any { return v } }

// completeSession is the whole history of a session that completes: the
// summary step fails once, then passes; ideas fails validation once, then
// passes; the session completes with ideas.json.
func completeSession(sess string) []spec {
	in := ref("talk.md", sess+"/input/talk.md", "# talk\n", "")
	in.ContentType = "text/markdown"
	var out []spec
	add := func(typ, step, job string, data func(map[string]uint64) any) {
		out = append(out, spec{session: sess, typ: typ, step: step, job: job, data: data})
	}
	add(schemas.TypeSessionStarted, "", "", constant(&schemas.SessionStarted{
		Pipeline: pipeline(), Input: in, SourceHash: schemas.ShortHash(in.Digest),
	}))
	runStep := func(step string, iteration int, content string, outcome string) []schemas.ArtifactRef {
		job := fmt.Sprintf("%s.%s.%d", sess, step, iteration)
		add(schemas.TypeJobRequested, step, job, constant(&schemas.JobRequested{
			JobID: job, Step: step, Iteration: iteration, Attempt: 1,
			Agent:  schemas.AgentSpec{Backend: "exec", Command: []string{"sh", "agents/" + step + ".sh"}},
			Prompt: "Do " + step + ".", Inputs: []schemas.ArtifactRef{in},
			Outputs: []schemas.Output{{Name: step + ".json"}}, TimeoutMs: 60000,
		}))
		add(schemas.TypeJobStarted, step, job, constant(&schemas.JobStarted{JobID: job, Worker: "worker-" + step, Delivery: 1}))
		if outcome == "job-fails" {
			add(schemas.TypeJobFailed, step, job, constant(&schemas.JobFailed{
				JobID: job, Step: step, Iteration: iteration, Worker: "worker-" + step, ExitCode: 2,
				Error: "agent exited with code 2", OutputTail: "rate limited",
			}))
			return nil
		}
		art := ref(step+".json", job+"/"+step+".json", content, step)
		arts := []schemas.ArtifactRef{art}
		add(schemas.TypeArtifactStored, step, job, constant(&schemas.ArtifactStored{JobID: job, Artifact: art}))
		add(schemas.TypeJobCompleted, step, job, func(reqSeq map[string]uint64) any {
			return &schemas.JobCompleted{
				JobID: job, Step: step, Iteration: iteration, RequestSeq: reqSeq[job], Worker: "worker-" + step,
				DurationMs: 1200, Artifacts: arts,
			}
		})
		if outcome == "invalid" {
			add(schemas.TypeValidationFailed, step, job, constant(&schemas.Verdict{
				JobID: job, Step: step, Iteration: iteration, Artifacts: arts,
				Errors:    []schemas.ValidationError{{Artifact: art.Name, Pointer: "/ideas", Message: "minItems: got 1, want 3", Source: "schema"}},
				RetryHint: "Fix the listed problems in " + art.Name + ".",
			}))
			return nil
		}
		add(schemas.TypeValidationPassed, step, job, constant(&schemas.Verdict{JobID: job, Step: step, Iteration: iteration, Artifacts: arts}))
		add(schemas.TypeStepCompleted, step, job, constant(&schemas.StepCompleted{
			Step: step, JobID: job, Iterations: iteration, Artifacts: arts, ContentHash: schemas.ContentHash(arts),
		}))
		return arts
	}
	runStep("summary", 1, "", "job-fails")
	runStep("summary", 2, `{"title":"talk"}`, "passes")
	runStep("ideas", 1, `{"ideas":[1]}`, "invalid")
	final := runStep("ideas", 2, `{"ideas":[1,2,3]}`, "passes")
	add(schemas.TypeSessionCompleted, "", "", constant(&schemas.SessionCompleted{Final: final}))
	return out
}

// interleave merges the sessions' histories round-robin.
func interleave(histories ...[]spec) []spec {
	var out []spec
	for i := 0; ; i++ {
		any := false
		for _, h := range histories {
			if i < len(h) {
				out = append(out, h[i])
				any = true
			}
		}
		if !any {
			return out
		}
	}
}

// startProjector runs a projector until the returned stop is called (or
// the test ends).
func startProjector(t *testing.T, b projector.Bus, cfg projector.Config) (stop func()) {
	t.Helper()
	p, err := projector.New(cfg, b, testnats.Logger(t))
	if err != nil {
		t.Fatalf("projector.New: %v", err)
	}
	return testnats.Run(t, "projector", p.Run)
}

func allEvents(t *testing.T, b *bus.Bus) []schemas.Event {
	t.Helper()
	return testnats.Events(t, b)
}

func view(t *testing.T, b *bus.Bus, sess string) (*projections.Manifest, json.RawMessage) {
	t.Helper()
	var raw json.RawMessage
	if err := b.GetView(context.Background(), projections.ManifestKey(sess), &raw); err != nil {
		return nil, nil
	}
	var m projections.Manifest
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, raw // garbage: not (yet) a manifest
	}
	return &m, raw
}

// waitView waits until the session's view reflects the stream up to seq.
func waitView(t *testing.T, b *bus.Bus, sess string, seq uint64) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for {
		m, raw := view(t, b, sess)
		if m != nil && m.LastSeq == seq {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("view of %s never reached seq %d; it is %s", sess, seq, raw)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// assertViewIsFold compares the stored view of sess with BuildManifest
// over every event in the stream, as JSON.
func assertViewIsFold(t *testing.T, b *bus.Bus, sess string) {
	t.Helper()
	want := projections.BuildManifest(sess, allEvents(t, b))
	if want == nil {
		t.Fatalf("BuildManifest(%s) is nil", sess)
	}
	wantRaw, err := json.Marshal(want)
	if err != nil {
		t.Fatal(err)
	}
	_, gotRaw := view(t, b, sess)
	var got, exp any
	if err := json.Unmarshal(gotRaw, &got); err != nil {
		t.Fatalf("view of %s is not JSON: %s", sess, gotRaw)
	}
	if err := json.Unmarshal(wantRaw, &exp); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, exp) {
		t.Errorf("view of %s differs from BuildManifest over the stream:\n got %s\nwant %s", sess, gotRaw, wantRaw)
	}
}

func TestProjectorFollowsCompleteSession(t *testing.T) {
	b, _ := testnats.Bus(t)
	p := newPublisher(t, b)
	history := completeSession("s1")
	// Half before the projector starts, half while it follows.
	p.publish(history[:len(history)/2]...)
	startProjector(t, b, projector.Config{})
	p.publish(history[len(history)/2:]...)

	waitView(t, b, "s1", p.last["s1"])
	m, _ := view(t, b, "s1")
	if m.Status != projections.StatusCompleted {
		t.Errorf("status %q, want completed", m.Status)
	}
	if sv := m.Steps["ideas"]; sv == nil || sv.Status != projections.StepStatusCompleted || sv.Iterations != 2 || len(m.Final) != 1 {
		t.Errorf("manifest does not show the completed session: %+v", m)
	}
	assertViewIsFold(t, b, "s1")
}

func TestProjectorResumesAfterStop(t *testing.T) {
	tests := []struct {
		name            string
		checkpointEvery int
		// waitAll: stop the first projector once it caught up with the first
		// half; otherwise as soon as the first view exists.
		waitAll bool
	}{
		{name: "stopped after catching up, checkpoint every 3", checkpointEvery: 3, waitAll: true},
		{name: "stopped after catching up, default checkpoint", waitAll: true},
		{name: "stopped mid-way, checkpoint every 2", checkpointEvery: 2},
		{name: "stopped mid-way, checkpoint every event", checkpointEvery: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b, _ := testnats.Bus(t)
			p := newPublisher(t, b)
			history := interleave(completeSession("s1"), completeSession("s2")[:9])
			rest := completeSession("s2")[9:]
			cfg := projector.Config{CheckpointEvery: tt.checkpointEvery}

			p.publish(history...)
			stop := startProjector(t, b, cfg)
			if tt.waitAll {
				waitView(t, b, "s1", p.last["s1"])
				waitView(t, b, "s2", p.last["s2"])
			} else {
				deadline := time.Now().Add(waitTimeout)
				for m, _ := view(t, b, "s1"); m == nil; m, _ = view(t, b, "s1") {
					if time.Now().After(deadline) {
						t.Fatal("no view appeared")
					}
					time.Sleep(5 * time.Millisecond)
				}
			}
			stop()

			p.publish(rest...)
			startProjector(t, b, cfg)
			waitView(t, b, "s1", p.last["s1"])
			waitView(t, b, "s2", p.last["s2"])
			assertViewIsFold(t, b, "s1")
			assertViewIsFold(t, b, "s2")
		})
	}
}

func TestRebuildRestoresViews(t *testing.T) {
	b, _ := testnats.Bus(t)
	p := newPublisher(t, b)
	p.publish(interleave(completeSession("s1"), completeSession("s2"))...)
	stop := startProjector(t, b, projector.Config{})
	waitView(t, b, "s1", p.last["s1"])
	waitView(t, b, "s2", p.last["s2"])
	stop()

	ctx := context.Background()
	if err := b.PutView(ctx, projections.ManifestKey("s1"), map[string]any{"status": "garbage", "lastSeq": 1 << 40}); err != nil {
		t.Fatal(err)
	}
	if err := b.PutView(ctx, projections.ManifestKey("s2"), "not a manifest"); err != nil {
		t.Fatal(err)
	}
	r, err := projector.New(projector.Config{}, b, testnats.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, waitTimeout)
	defer cancel()
	if err := r.Rebuild(rctx); err != nil {
		t.Fatalf("Rebuild: %v", err)
	}
	assertViewIsFold(t, b, "s1")
	assertViewIsFold(t, b, "s2")
}

// Events can follow a session's terminal event (a job still running when
// the session failed reports later). Run folds them into the view; Rebuild
// must produce the same view.
func TestRebuildFoldsEventsAfterTheEnd(t *testing.T) {
	b, _ := testnats.Bus(t)
	p := newPublisher(t, b)
	h := completeSession("s1")
	// Up to summary's second job.started, then the session fails, then the
	// running job reports.
	var cut int
	for i, s := range h {
		if s.typ == schemas.TypeJobStarted && s.job == "s1.summary.2" {
			cut = i + 1
		}
	}
	p.publish(h[:cut]...)
	p.publish(spec{session: "s1", typ: schemas.TypeSessionFailed, data: constant(&schemas.SessionFailed{Reason: "cancelled by the user"})})
	p.publish(spec{session: "s1", typ: schemas.TypeJobFailed, step: "summary", job: "s1.summary.2", data: constant(&schemas.JobFailed{
		JobID: "s1.summary.2", Step: "summary", Iteration: 2, Worker: "worker-summary", ExitCode: -1, Error: "agent was stopped",
	})})

	stop := startProjector(t, b, projector.Config{})
	waitView(t, b, "s1", p.last["s1"])
	stop()
	assertViewIsFold(t, b, "s1")

	r, err := projector.New(projector.Config{}, b, testnats.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if err := r.Rebuild(ctx); err != nil {
		t.Fatalf("Rebuild: %v", err)
	}
	assertViewIsFold(t, b, "s1")
}

func TestNewProjectorRejectsBadConfig(t *testing.T) {
	b, _ := testnats.Bus(t)
	tests := []struct {
		name    string
		cfg     projector.Config
		nilBus  bool
		wantErr bool
	}{
		{name: "zero value"},
		{name: "negative checkpoint", cfg: projector.Config{CheckpointEvery: -1}, wantErr: true},
		{name: "no bus", nilBus: true, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var bb projector.Bus = b
			if tt.nilBus {
				bb = nil
			}
			if _, err := projector.New(tt.cfg, bb, testnats.Logger(t)); (err != nil) != tt.wantErr {
				t.Fatalf("projector.New error = %v, wantErr %v", err, tt.wantErr)
			}
		})
	}
}

// recordingBus is the real bus, with the start of every Read recorded and
// a hook run before every PutView.
type recordingBus struct {
	*bus.Bus
	mu     sync.Mutex
	starts []uint64
	onPut  func(key string)
}

func (r *recordingBus) Read(ctx context.Context, opts bus.ReadOptions, fn func(schemas.Event) error) error {
	r.mu.Lock()
	r.starts = append(r.starts, opts.StartSeq)
	r.mu.Unlock()
	return r.Bus.Read(ctx, opts, fn)
}

func (r *recordingBus) PutView(ctx context.Context, key string, v any) error {
	if r.onPut != nil {
		r.onPut(key)
	}
	return r.Bus.PutView(ctx, key, v)
}

// A projector stopped after it caught up resumes where it stopped: Run
// saves its checkpoint on the way out (only a crash may cost up to
// CheckpointEvery events folded again).
func TestRunResumesFromItsCheckpointAfterStop(t *testing.T) {
	b, _ := testnats.Bus(t)
	p := newPublisher(t, b)
	p.publish(completeSession("s1")...)
	stop := startProjector(t, b, projector.Config{})
	waitView(t, b, "s1", p.last["s1"])
	stop()

	rb := &recordingBus{Bus: b}
	stop = startProjector(t, rb, projector.Config{})
	deadline := time.Now().Add(waitTimeout)
	for {
		rb.mu.Lock()
		n := len(rb.starts)
		rb.mu.Unlock()
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the second projector never read")
		}
		time.Sleep(10 * time.Millisecond)
	}
	stop()
	rb.mu.Lock()
	defer rb.mu.Unlock()
	if want := p.last["s1"] + 1; rb.starts[0] != want {
		t.Errorf("restarted projector reads from seq %d, want %d (after the %d events already folded)", rb.starts[0], want, p.last["s1"])
	}
}

// Stopping the projector while it writes a view is a normal shutdown: Run
// returns nil, as it does when stopped while idle.
func TestRunReturnsNilWhenStopped(t *testing.T) {
	b, _ := testnats.Bus(t)
	p := newPublisher(t, b)
	evs := completeSession("s1")
	p.publish(evs[0])

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var puts atomic.Int32
	rb := &recordingBus{Bus: b, onPut: func(key string) {
		if key == projections.ManifestKey("s1") {
			if puts.Add(1) == 3 {
				cancel() // the shutdown signal arrives during this write
			}
		}
	}}
	proj, err := projector.New(projector.Config{}, rb, testnats.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- proj.Run(ctx) }()
	// Caught up (the backlog is written in one batch); from now on every
	// event is written as it comes.
	deadline := time.Now().Add(waitTimeout)
	for puts.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	p.publish(evs[1:]...)
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run returned %v after its context was cancelled, want nil", err)
		}
	case <-time.After(waitTimeout):
		t.Fatal("Run did not return after cancel")
	}
}

// TestCatchUpWritesViewsInBatches: a backlog is folded in memory and each
// changed manifest written once per batch, not once per event; once caught
// up, every event is written as it comes. The views equal the folds.
func TestCatchUpWritesViewsInBatches(t *testing.T) {
	b, _ := testnats.Bus(t)
	p := newPublisher(t, b)
	for _, s := range []string{"s1", "s2", "s3"} {
		p.publish(completeSession(s)...)
	}
	var mu sync.Mutex
	puts := map[string]int{}
	rb := &recordingBus{Bus: b, onPut: func(key string) {
		mu.Lock()
		puts[key]++
		mu.Unlock()
	}}
	proj, err := projector.New(projector.Config{CatchUpBatch: 1000}, rb, testnats.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	stop := testnats.Run(t, "projector", proj.Run)
	defer stop()
	for _, s := range []string{"s1", "s2", "s3"} {
		waitView(t, b, s, p.last[s])
		assertViewIsFold(t, b, s)
	}
	mu.Lock()
	for _, s := range []string{"s1", "s2", "s3"} {
		if n := puts[projections.ManifestKey(s)]; n != 1 {
			t.Errorf("view of %s written %d times while catching up, want once", s, n)
		}
	}
	mu.Unlock()

	// Caught up: a new session's events are written one by one.
	evs := completeSession("s4")
	p.publish(evs[:2]...)
	waitView(t, b, "s4", p.last["s4"])
	p.publish(evs[2:]...)
	waitView(t, b, "s4", p.last["s4"])
	assertViewIsFold(t, b, "s4")
	mu.Lock()
	defer mu.Unlock()
	if n := puts[projections.ManifestKey("s4")]; n < len(evs)/2 {
		t.Errorf("view of s4 written %d times for %d live events; want one write per event", n, len(evs))
	}
}

// flakyBus fails the first write of a view whose manifest has reached
// failAt, as a server restarting mid-write would.
type flakyBus struct {
	*bus.Bus
	failAt atomic.Uint64
	failed atomic.Bool
}

func (f *flakyBus) PutView(ctx context.Context, key string, v any) error {
	if m, ok := v.(*projections.Manifest); ok && m.LastSeq >= f.failAt.Load() && f.failed.CompareAndSwap(false, true) {
		return errors.New("view write failed for the test")
	}
	return f.Bus.PutView(ctx, key, v)
}

// TestFailedViewWriteIsRetried: a view write that fails after catch-up is
// retried with the folded manifest; the event is not lost (no view stuck
// before the session's end while the checkpoint moves past it).
func TestFailedViewWriteIsRetried(t *testing.T) {
	b, _ := testnats.Bus(t)
	p := newPublisher(t, b)
	evs := completeSession("s1")
	p.publish(evs[0])
	fb := &flakyBus{Bus: b}
	fb.failAt.Store(1 << 62)
	proj, err := projector.New(projector.Config{CheckpointEvery: 1}, fb, testnats.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	stop := testnats.Run(t, "projector", proj.Run)
	defer stop()
	waitView(t, b, "s1", p.last["s1"])
	p.publish(evs[1 : len(evs)-1]...)
	waitView(t, b, "s1", p.last["s1"])
	fb.failAt.Store(0)
	p.publish(evs[len(evs)-1])
	waitView(t, b, "s1", p.last["s1"])
	if !fb.failed.Load() {
		t.Fatal("no view write failed: the test did not test anything")
	}
	assertViewIsFold(t, b, "s1")
}

// TestViewsOfAnotherFormatAreRecomputed: views written by a projector of an
// older manifest format (its checkpoint says so) are recomputed from the
// stream, not folded onward.
func TestViewsOfAnotherFormatAreRecomputed(t *testing.T) {
	b, _ := testnats.Bus(t)
	p := newPublisher(t, b)
	p.publish(completeSession("s1")...)
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	// An old projector's leftovers: a stale, wrong view and a checkpoint at
	// the head without a format version.
	stale := projections.Manifest{Version: 1, ContentID: "s1", Status: "in_progress", LastSeq: 1}
	if err := b.PutView(ctx, projections.ManifestKey("s1"), stale); err != nil {
		t.Fatal(err)
	}
	if err := b.PutView(ctx, "_projector.manifests", map[string]uint64{"seq": p.last["s1"]}); err != nil {
		t.Fatal(err)
	}
	startProjector(t, b, projector.Config{})
	waitView(t, b, "s1", p.last["s1"])
	assertViewIsFold(t, b, "s1")
	if m, _ := view(t, b, "s1"); m.Version != projections.ManifestVersion {
		t.Errorf("view version %d", m.Version)
	}
}

// backlogPipeline is a minimal valid pipeline of kind backlog.
func backlogPipeline() schemas.Pipeline {
	return schemas.Pipeline{Name: "todo", Dir: "/srv/todo", Kind: schemas.KindBacklog, Backlog: &schemas.Backlog{
		Agents:      map[string]schemas.AgentSpec{"coder": {Backend: "exec", Command: []string{"sh", "agents/code.sh"}}},
		Roles:       map[string][]string{schemas.RoleIterate: {"coder"}},
		Schedule:    schemas.ScheduleSingle,
		MaxParallel: 1, MaxSummaryIterations: 3, TimeoutMs: 60000,
		SourceFiles: []string{"README.md"}, Project: "todo app",
	}}
}

// backlogSession is the history of a backlog session that completes: two
// imported tasks, one found by an agent, one added and one unblocked from
// the command line.
func backlogSession(sess string) []spec {
	in := ref("to-do.json", sess+"/input/to-do.json", `{"schema_version":1,"tasks":[]}`, "")
	var out []spec
	add := func(typ, step string, data any) {
		out = append(out, spec{session: sess, typ: typ, step: step, data: constant(data)})
	}
	tasks := []schemas.Task{
		{ID: "T1", Title: "Parse input", Priority: 1, Status: schemas.TaskTodo},
		{ID: "T2", Title: "Print output", Priority: 2, Status: schemas.TaskTodo, DependsOn: []string{"T1"}},
	}
	add(schemas.TypeSessionStarted, "", &schemas.SessionStarted{Pipeline: backlogPipeline(), Input: in, SourceHash: schemas.ShortHash(in.Digest),
		Backlog: &schemas.BacklogStart{Tasks: tasks}})
	for _, t := range tasks {
		add(schemas.TypeTaskAdded, "", &schemas.TaskAdded{Task: t, By: "import", Reason: "imported from to-do.json"})
	}
	add(schemas.TypeBacklogPhase, "", &schemas.BacklogPhase{Phase: schemas.PhaseIterate, Reason: "imported 2 task(s)"})
	add(schemas.TypeTaskSelected, "T1", &schemas.TaskSelected{ID: "T1", Run: 1, Agent: "coder", Reason: "todo: priority 1"})
	add(schemas.TypeTaskUpdated, "T1", &schemas.TaskUpdated{ID: "T1", Status: schemas.TaskDone, Note: "parsed", By: "job-1", Reason: "summary of run 1"})
	add(schemas.TypeTaskAdded, "", &schemas.TaskAdded{Task: schemas.Task{ID: "T3", Title: "Handle errors", Status: schemas.TaskTodo}, By: "job-1", Reason: "found while working on T1"})
	add(schemas.TypeTaskSelected, "T2", &schemas.TaskSelected{ID: "T2", Run: 1, Agent: "coder", Reason: "todo: priority 2"})
	bl := []string{"needs a terminal"}
	add(schemas.TypeTaskUpdated, "T2", &schemas.TaskUpdated{ID: "T2", Status: schemas.TaskBlocked, Blockers: &bl, By: "job-2", Reason: "summary of run 1"})
	none := []string{}
	add(schemas.TypeTaskUpdated, "T2", &schemas.TaskUpdated{ID: "T2", Status: schemas.TaskTodo, Blockers: &none, By: "cli", Reason: "terminal found"})
	add(schemas.TypeTaskAdded, "", &schemas.TaskAdded{Task: schemas.Task{ID: "T4", Title: "Write docs", Status: schemas.TaskTodo}, By: "cli"})
	add(schemas.TypeTaskUpdated, "T9", &schemas.TaskUpdated{ID: "T9", Status: schemas.TaskDone, By: "cli", Reason: "no such task"})
	for _, id := range []string{"T2", "T3", "T4"} {
		add(schemas.TypeTaskSelected, id, &schemas.TaskSelected{ID: id, Run: 1, Agent: "coder"})
		add(schemas.TypeTaskUpdated, id, &schemas.TaskUpdated{ID: id, Status: schemas.TaskDone, By: "job-" + id, Reason: "summary of run 1"})
	}
	add(schemas.TypeBacklogPhase, "", &schemas.BacklogPhase{Phase: schemas.PhaseReview, Reason: "no runnable task left"})
	add(schemas.TypeBacklogPhase, "", &schemas.BacklogPhase{Phase: schemas.PhaseDone, Reason: "review found nothing to add"})
	add(schemas.TypeSessionCompleted, "", &schemas.SessionCompleted{Final: []schemas.ArtifactRef{}})
	return out
}

// tasksView reads the stored task list of sess as raw JSON; nil when none.
func tasksView(t *testing.T, b *bus.Bus, sess string) json.RawMessage {
	t.Helper()
	var raw json.RawMessage
	err := b.GetView(context.Background(), projections.TasksKey(sess), &raw)
	if errors.Is(err, bus.ErrNotFound) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// waitTasks waits until the stored task list of sess reflects seq.
func waitTasks(t *testing.T, b *bus.Bus, sess string, seq uint64) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for {
		raw := tasksView(t, b, sess)
		var v projections.TaskList
		if raw != nil && json.Unmarshal(raw, &v) == nil && v.LastSeq == seq {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("task list of %s never reached seq %d; it is %s", sess, seq, raw)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// assertTasksAreFold compares the stored task list of sess with
// BuildTaskList over every event in the stream, as JSON.
func assertTasksAreFold(t *testing.T, b *bus.Bus, sess string) {
	t.Helper()
	want := projections.BuildTaskList(sess, allEvents(t, b))
	if want == nil {
		t.Fatalf("BuildTaskList(%s) is nil", sess)
	}
	wantRaw, err := json.Marshal(want)
	if err != nil {
		t.Fatal(err)
	}
	gotRaw := tasksView(t, b, sess)
	var got, exp any
	if err := json.Unmarshal(gotRaw, &got); err != nil {
		t.Fatalf("task list of %s is not JSON: %s", sess, gotRaw)
	}
	if err := json.Unmarshal(wantRaw, &exp); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, exp) {
		t.Errorf("task list of %s differs from BuildTaskList over the stream:\n got %s\nwant %s", sess, gotRaw, wantRaw)
	}
}

// TestProjectorTaskLists: the task list of a backlog session is kept next
// to its manifest, through a restart (the stored list is read back and
// folded on) and after the session's end; a pipeline session has none.
func TestProjectorTaskLists(t *testing.T) {
	b, _ := testnats.Bus(t)
	p := newPublisher(t, b)
	history := interleave(backlogSession("b1"), completeSession("s1"))
	half := len(history) / 2
	p.publish(history[:half]...)
	stop := startProjector(t, b, projector.Config{CheckpointEvery: 3})
	waitTasks(t, b, "b1", p.last["b1"])
	assertTasksAreFold(t, b, "b1")
	stop()

	p.publish(history[half:]...)
	startProjector(t, b, projector.Config{CheckpointEvery: 3})
	waitTasks(t, b, "b1", p.last["b1"])
	waitView(t, b, "s1", p.last["s1"])
	assertTasksAreFold(t, b, "b1")
	assertViewIsFold(t, b, "b1")
	var v projections.TaskList
	if err := json.Unmarshal(tasksView(t, b, "b1"), &v); err != nil {
		t.Fatal(err)
	}
	if v.Status != projections.StatusCompleted || v.Phase != schemas.PhaseDone || v.Counts[schemas.TaskDone] != 4 || len(v.Tasks) != 4 {
		t.Errorf("task list does not show the completed backlog: %+v", v)
	}
	if raw := tasksView(t, b, "s1"); raw != nil {
		t.Errorf("pipeline session s1 has a task list: %s", raw)
	}

	// An update after the end (the session's views were dropped from the
	// cache): the stored list is read back and folded on.
	p.publish(spec{session: "b1", typ: schemas.TypeTaskUpdated, step: "T4", data: constant(&schemas.TaskUpdated{ID: "T4", Note: "late note", By: "cli"})})
	waitTasks(t, b, "b1", p.last["b1"])
	assertTasksAreFold(t, b, "b1")
}

// TestTasksViewsOfOlderProjectorAreComputed: a checkpoint of a projector
// that wrote manifests only (no task list version) makes the projector
// recompute every view, so backlog sessions get their task lists.
func TestTasksViewsOfOlderProjectorAreComputed(t *testing.T) {
	b, _ := testnats.Bus(t)
	p := newPublisher(t, b)
	p.publish(backlogSession("b1")...)
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if err := b.PutView(ctx, "_projector.manifests", map[string]any{"seq": p.last["b1"], "version": projections.ManifestVersion}); err != nil {
		t.Fatal(err)
	}
	startProjector(t, b, projector.Config{})
	waitTasks(t, b, "b1", p.last["b1"])
	assertTasksAreFold(t, b, "b1")
	assertViewIsFold(t, b, "b1")
}

// TestForgedStartDoesNotReplaceAnEndedView: a session.started (a copy of
// a fork's history, or a second one) of a session that ended, and is no
// longer cached, folds into its stored view, which ignores it, rather
// than starting a new view over it.
func TestForgedStartDoesNotReplaceAnEndedView(t *testing.T) {
	b, _ := testnats.Bus(t)
	p := newPublisher(t, b)
	history := completeSession("s1")
	p.publish(history...)
	startProjector(t, b, projector.Config{})
	waitView(t, b, "s1", p.last["s1"])
	start := schemas.Event{ID: "forged-start", Type: schemas.TypeSessionStarted, Session: "s1", ForkOf: "x", Correlation: "s1", Time: epoch,
		Data: history[0].data(nil)}
	again := start
	again.ID, again.ForkOf = "second-start", ""
	for _, ev := range []schemas.Event{start, again} {
		if _, err := b.Publish(context.Background(), ev); err != nil {
			t.Fatal(err)
		}
	}
	p.publish(spec{session: "s1", typ: schemas.TypeSignalInfo, data: constant(&schemas.Signal{Target: "s1", Message: "note"})})
	waitView(t, b, "s1", p.last["s1"])
	if m, _ := view(t, b, "s1"); m.Status != projections.StatusCompleted || len(m.Final) != 1 {
		t.Errorf("view after forged starts: %s, final %v", m.Status, m.Final)
	}
	assertViewIsFold(t, b, "s1")
}
