package projections

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/loopbus/loopbus/schemas"
)

var update = flag.Bool("update", false, "rewrite golden files")

// goldenCases are the fold's specification: each sequence of events is
// folded with FoldManifest and the manifest compared with
// testdata/<name>.golden.json.
var goldenCases = []struct {
	name   string
	events func() []schemas.Event
}{
	{"happy_path", happyPath},
	{"validation_retry", validationRetry},
	{"step_exhausted", stepExhausted},
	{"job_failed", jobFailedCase},
	{"job_restarted", jobRestarted},
	{"duplicate_event", duplicateEvents},
	{"other_session", otherSessionInterleaved},
	{"before_started", beforeStarted},
	{"only_before_started", onlyBeforeStarted},
	{"stop_resume", stopResume},
	{"budget_stop", budgetStop},
	{"rate_limit_wait", rateLimitWait},
	{"breaker_open_close", breakerOpenClose},
	{"invalidation", invalidation},
	{"usage_sums", usageSums},
	{"backlog_runs", backlogRuns},
	{"loops_session", loopsSession},
	{"imported_session", importedSession},
	{"forked", forkedGolden},
}

func foldAll(evs []schemas.Event) *Manifest {
	var m *Manifest
	for _, ev := range evs {
		m = FoldManifest(m, ev)
	}
	return m
}

func marshal(t *testing.T, m *Manifest) []byte {
	t.Helper()
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		t.Fatalf("marshal manifest: %v", err)
	}
	return append(b, '\n')
}

func TestGolden(t *testing.T) {
	for _, tc := range goldenCases {
		t.Run(tc.name, func(t *testing.T) {
			evs := tc.events()
			m := foldAll(evs)
			got := marshal(t, m)

			// BuildManifest, which filters by session up front, agrees.
			if b := marshal(t, BuildManifest(sessionID, evs)); !bytes.Equal(b, got) {
				t.Errorf("BuildManifest differs from folding with FoldManifest:\n%s\nvs\n%s", b, got)
			}

			path := filepath.Join("testdata", tc.name+".golden.json")
			if *update {
				if err := os.MkdirAll("testdata", 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, got, 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run go test ./projections -run TestGolden -update)", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("manifest differs from %s:\n--- got\n%s\n--- want\n%s", path, got, want)
			}

			// The golden file decodes back to the same manifest.
			var back *Manifest
			if err := json.Unmarshal(want, &back); err != nil {
				t.Fatalf("unmarshal %s: %v", path, err)
			}
			if !bytes.Equal(marshal(t, back), want) {
				t.Errorf("%s does not round-trip", path)
			}
		})
	}
}

// TestDuplicatesChangeNothing checks the idempotence the duplicate_event
// golden shows: re-applying events with Seq <= LastSeq is a no-op.
func TestDuplicatesChangeNothing(t *testing.T) {
	base := validationRetry()
	want := foldAll(base)
	got := foldAll(duplicateEvents())
	if !reflect.DeepEqual(got, want) {
		t.Errorf("re-applied events changed the manifest:\n%s\nwant\n%s", marshal(t, got), marshal(t, want))
	}
	// Re-folding the whole history into the finished manifest is a no-op too.
	again := want.Clone()
	for _, ev := range base {
		again = FoldManifest(again, ev)
	}
	if !reflect.DeepEqual(again, want) {
		t.Errorf("re-folding the history changed the manifest")
	}
}

// stepWant is the expected status of a step, with optional details.
type stepWant struct {
	status     string
	iterations int
	jobID      string
	worker     string
	errMsg     string
	feedback   string
}

type want struct {
	nilManifest bool
	status      string
	steps       map[string]stepWant
	lastSeq     uint64
	updatedAt   time.Time
	errMsg      string
	failedStep  string
	final       int
}

// ev builds an event of sessionID with sequence seq at t0 + seq seconds.
func ev(seq uint64, typ string, data any) schemas.Event {
	return schemas.Event{Type: typ, Session: sessionID, Seq: seq, Time: t0.Add(time.Duration(seq) * time.Second), Data: data}
}

func started(seq uint64) schemas.Event {
	in := inputRef(sessionID)
	return ev(seq, schemas.TypeSessionStarted, &schemas.SessionStarted{
		Pipeline: writingKitPipeline(), Input: in, SourceHash: shortHash(in.Digest),
	})
}

func requested(seq uint64, step string, it int) schemas.Event {
	return ev(seq, schemas.TypeJobRequested, &schemas.JobRequested{JobID: jobID(sessionID, step, it), Step: step, Iteration: it})
}

// allStepsDone is a session started at seq-1 whose three steps then
// completed, one per sequence from seq.
func allStepsDone(seq uint64) []schemas.Event {
	evs := []schemas.Event{started(seq - 1)}
	for i, step := range []string{"summary", "ideas", "writing-kit"} {
		evs = append(evs, ev(seq+uint64(i), schemas.TypeStepCompleted, &schemas.StepCompleted{Step: step, JobID: jobID(sessionID, step, 1), Iterations: 1}))
	}
	return evs
}

func at(seq uint64) time.Time { return t0.Add(time.Duration(seq) * time.Second) }

func TestFoldTransitions(t *testing.T) {
	pending := stepWant{status: StepStatusPending}
	j1 := jobID(sessionID, "summary", 1)
	j2 := jobID(sessionID, "summary", 2)
	sum := artifact(sessionID, "summary", 1, "summary.json", summaryJSON)
	tests := []struct {
		name   string
		events []schemas.Event
		want   want
	}{
		{
			name:   "no events",
			events: nil,
			want:   want{nilManifest: true},
		},
		{
			name:   "events before session.started",
			events: []schemas.Event{requested(1, "summary", 1), ev(2, schemas.TypeSessionCompleted, &schemas.SessionCompleted{})},
			want:   want{nilManifest: true},
		},
		{
			name:   "started: running, steps pending",
			events: []schemas.Event{started(1)},
			want: want{status: StatusRunning, lastSeq: 1, updatedAt: at(1),
				steps: map[string]stepWant{"summary": pending, "ideas": pending, "writing-kit": pending}},
		},
		{
			name:   "requested: in progress",
			events: []schemas.Event{started(1), requested(2, "summary", 1)},
			want: want{status: StatusRunning, lastSeq: 2, updatedAt: at(2), steps: map[string]stepWant{
				"summary": {status: StepStatusInProgress, iterations: 1, jobID: j1}, "ideas": pending}},
		},
		{
			name: "job started sets the worker, a new request clears it",
			events: []schemas.Event{started(1), requested(2, "summary", 1),
				ev(3, schemas.TypeJobStarted, &schemas.JobStarted{JobID: j1, Worker: "worker-a"})},
			want: want{status: StatusRunning, lastSeq: 3, updatedAt: at(3), steps: map[string]stepWant{
				"summary": {status: StepStatusInProgress, iterations: 1, jobID: j1, worker: "worker-a"}}},
		},
		{
			name: "re-request clears the worker and keeps the highest iteration",
			events: []schemas.Event{started(1), requested(2, "summary", 2),
				ev(3, schemas.TypeJobStarted, &schemas.JobStarted{JobID: j2, Worker: "worker-a"}),
				requested(4, "summary", 1)},
			want: want{status: StatusRunning, lastSeq: 4, updatedAt: at(4), steps: map[string]stepWant{
				"summary": {status: StepStatusInProgress, iterations: 2, jobID: j1}}},
		},
		{
			name: "job.started of an unknown job changes no step",
			events: []schemas.Event{started(1), requested(2, "summary", 1),
				ev(3, schemas.TypeJobStarted, &schemas.JobStarted{JobID: "nope", Worker: "worker-x"})},
			want: want{status: StatusRunning, lastSeq: 3, updatedAt: at(3), steps: map[string]stepWant{
				"summary": {status: StepStatusInProgress, iterations: 1, jobID: j1}}},
		},
		{
			name: "validation.failed of a superseded job is ignored",
			events: []schemas.Event{started(1), requested(2, "summary", 1), requested(3, "summary", 2),
				ev(4, schemas.TypeValidationFailed, &schemas.Verdict{JobID: j1, Step: "summary", Errors: ideasErrors})},
			want: want{status: StatusRunning, lastSeq: 4, updatedAt: at(4), steps: map[string]stepWant{
				"summary": {status: StepStatusInProgress, iterations: 2, jobID: j2}}},
		},
		{
			name: "validation.failed of the current job sets feedback",
			events: []schemas.Event{started(1), requested(2, "summary", 1),
				ev(3, schemas.TypeValidationFailed, &schemas.Verdict{JobID: j1, Step: "summary", Errors: []schemas.ValidationError{
					{Pointer: "", Message: "not valid JSON"}, {Pointer: "/title", Message: "missing"}}, RetryHint: "  emit JSON only\n"})},
			want: want{status: StatusRunning, lastSeq: 3, updatedAt: at(3), steps: map[string]stepWant{
				"summary": {status: StepStatusInProgress, iterations: 1, jobID: j1,
					feedback: "(root): not valid JSON; /title: missing. Retry hint: emit JSON only"}}},
		},
		{
			name: "job.failed without an error message",
			events: []schemas.Event{started(1), requested(2, "summary", 1),
				ev(3, schemas.TypeJobFailed, &schemas.JobFailed{JobID: j1, Step: "summary", ExitCode: 137})},
			want: want{status: StatusRunning, lastSeq: 3, updatedAt: at(3), steps: map[string]stepWant{
				"summary": {status: StepStatusInProgress, iterations: 1, jobID: j1, feedback: "job failed (exit code 137)"}}},
		},
		{
			name: "step completed",
			events: []schemas.Event{started(1), requested(2, "summary", 1),
				ev(3, schemas.TypeStepCompleted, &schemas.StepCompleted{Step: "summary", JobID: j1, Iterations: 1,
					Artifacts: []schemas.ArtifactRef{sum}, ContentHash: contentHash([]schemas.ArtifactRef{sum})})},
			want: want{status: StatusRunning, lastSeq: 3, updatedAt: at(3), steps: map[string]stepWant{
				"summary": {status: StepStatusCompleted, iterations: 1, jobID: j1}, "ideas": pending}},
		},
		{
			name: "step failed, then session failed",
			events: []schemas.Event{started(1), requested(2, "summary", 1),
				ev(3, schemas.TypeStepFailed, &schemas.StepFailed{Step: "summary", Iterations: 3, Error: "agent timed out"}),
				ev(4, schemas.TypeSessionFailed, &schemas.SessionFailed{Step: "summary", Reason: "step summary failed"})},
			want: want{status: StatusFailed, lastSeq: 4, updatedAt: at(4), errMsg: "step summary failed", failedStep: "summary",
				steps: map[string]stepWant{"summary": {status: StepStatusFailed, iterations: 3, jobID: j1, errMsg: "agent timed out"}}},
		},
		{
			name: "step completed after failing clears the error",
			events: []schemas.Event{started(1),
				ev(2, schemas.TypeStepFailed, &schemas.StepFailed{Step: "summary", Iterations: 1, Error: "boom"}),
				ev(3, schemas.TypeStepCompleted, &schemas.StepCompleted{Step: "summary", JobID: j2, Iterations: 2})},
			want: want{status: StatusRunning, lastSeq: 3, updatedAt: at(3), steps: map[string]stepWant{
				"summary": {status: StepStatusCompleted, iterations: 2, jobID: j2}}},
		},
		{
			name: "session completed",
			events: append(allStepsDone(2),
				ev(5, schemas.TypeSessionCompleted, &schemas.SessionCompleted{Final: []schemas.ArtifactRef{sum}})),
			want: want{status: StatusCompleted, lastSeq: 5, updatedAt: at(5), final: 1,
				steps: map[string]stepWant{"summary": {status: StepStatusCompleted, iterations: 1, jobID: jobID(sessionID, "summary", 1)}}},
		},
		{
			// The orchestrator dead-letters it; readers of the stream
			// must not take it for the end either.
			name: "pipeline completed while a step is pending is ignored",
			events: []schemas.Event{started(1),
				ev(2, schemas.TypeSessionCompleted, &schemas.SessionCompleted{Final: []schemas.ArtifactRef{sum}})},
			want: want{status: StatusRunning, lastSeq: 2, updatedAt: at(2),
				steps: map[string]stepWant{"summary": pending}},
		},
		{
			name:   "session failed without data",
			events: []schemas.Event{started(1), ev(2, schemas.TypeSessionFailed, nil)},
			want:   want{status: StatusFailed, lastSeq: 2, updatedAt: at(2)},
		},
		{
			name: "unknown step names are ignored",
			events: []schemas.Event{started(1),
				requested(2, "publish", 1),
				ev(3, schemas.TypeStepCompleted, &schemas.StepCompleted{Step: "publish"}),
				ev(4, schemas.TypeStepFailed, &schemas.StepFailed{Step: ""})},
			want: want{status: StatusRunning, lastSeq: 4, updatedAt: at(4),
				steps: map[string]stepWant{"summary": pending, "ideas": pending, "writing-kit": pending}},
		},
		{
			name: "unknown types and mistyped data only bump",
			events: []schemas.Event{started(1),
				ev(2, "loopbus.session.snoozed", nil),
				ev(3, schemas.TypeJobRequested, &schemas.StepFailed{Step: "summary"}),
				ev(4, schemas.TypeStepCompleted, (*schemas.StepCompleted)(nil))},
			want: want{status: StatusRunning, lastSeq: 4, updatedAt: at(4), steps: map[string]stepWant{"summary": pending}},
		},
		{
			name: "data as a plain struct is accepted",
			events: []schemas.Event{started(1),
				ev(2, schemas.TypeJobRequested, schemas.JobRequested{JobID: j1, Step: "summary", Iteration: 1})},
			want: want{status: StatusRunning, lastSeq: 2, updatedAt: at(2), steps: map[string]stepWant{
				"summary": {status: StepStatusInProgress, iterations: 1, jobID: j1}}},
		},
		{
			name: "step and job taken from the event when data omits them",
			events: []schemas.Event{started(1),
				func() schemas.Event {
					e := ev(2, schemas.TypeJobRequested, &schemas.JobRequested{Iteration: 1})
					e.Step, e.Job = "ideas", "job-from-event"
					return e
				}()},
			want: want{status: StatusRunning, lastSeq: 2, updatedAt: at(2), steps: map[string]stepWant{
				"ideas": {status: StepStatusInProgress, iterations: 1, jobID: "job-from-event"}}},
		},
		{
			name: "old and duplicate sequences are ignored",
			events: []schemas.Event{started(5), requested(6, "summary", 1),
				ev(6, schemas.TypeSessionFailed, &schemas.SessionFailed{Reason: "dup"}),
				ev(3, schemas.TypeSessionCompleted, &schemas.SessionCompleted{})},
			want: want{status: StatusRunning, lastSeq: 6, updatedAt: at(6), steps: map[string]stepWant{
				"summary": {status: StepStatusInProgress, iterations: 1, jobID: j1}}},
		},
		{
			name:   "events without a sequence apply but keep LastSeq",
			events: []schemas.Event{started(2), ev(0, schemas.TypeSessionFailed, &schemas.SessionFailed{})},
			want:   want{status: StatusFailed, lastSeq: 2, updatedAt: at(0)},
		},
		{
			name: "events of another session are ignored",
			events: []schemas.Event{started(1), func() schemas.Event {
				e := ev(2, schemas.TypeSessionFailed, &schemas.SessionFailed{Reason: "not ours"})
				e.Session = otherSession
				return e
			}()},
			want: want{status: StatusRunning, lastSeq: 1, updatedAt: at(1)},
		},
		{
			name:   "a second session.started does not reset the session",
			events: []schemas.Event{started(1), requested(2, "summary", 1), started(3)},
			want: want{status: StatusRunning, lastSeq: 3, updatedAt: at(3), steps: map[string]stepWant{
				"summary": {status: StepStatusInProgress, iterations: 1, jobID: j1}}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := foldAll(tc.events)
			if tc.want.nilManifest {
				if m != nil {
					t.Fatalf("want nil manifest, got\n%s", marshal(t, m))
				}
				return
			}
			if m == nil {
				t.Fatal("got nil manifest")
			}
			w := tc.want
			if m.Status != w.status || m.LastSeq != w.lastSeq || !m.UpdatedAt.Equal(w.updatedAt) ||
				m.Error != w.errMsg || m.FailedStep != w.failedStep || len(m.Final) != w.final {
				t.Errorf("session: status %q lastSeq %d updatedAt %v error %q failedStep %q final %d; want %q %d %v %q %q %d",
					m.Status, m.LastSeq, m.UpdatedAt, m.Error, m.FailedStep, len(m.Final),
					w.status, w.lastSeq, w.updatedAt, w.errMsg, w.failedStep, w.final)
			}
			if m.Version != ManifestVersion || m.ContentID != sessionID || !m.CreatedAt.Equal(t0.Add(time.Duration(tc.events[0].Seq)*time.Second)) {
				t.Errorf("version %d contentId %q createdAt %v", m.Version, m.ContentID, m.CreatedAt)
			}
			if want := []string{"summary", "ideas", "writing-kit"}; !reflect.DeepEqual(m.StepOrder, want) || len(m.Steps) != 3 {
				t.Errorf("stepOrder %v (%d steps), want %v", m.StepOrder, len(m.Steps), want)
			}
			for name, sw := range w.steps {
				sv := m.Steps[name]
				if sv == nil {
					t.Errorf("step %s missing", name)
					continue
				}
				got := stepWant{sv.Status, sv.Iterations, sv.JobID, sv.Worker, sv.ErrorMessage, sv.LastFeedback}
				if got != sw {
					t.Errorf("step %s = %+v, want %+v", name, got, sw)
				}
			}
		})
	}
}

func TestStartedCopiesThePipeline(t *testing.T) {
	m := foldAll([]schemas.Event{started(1)})
	if m.Pipeline != "writing-kit" || m.SourceHash != shortHash(digest(inputBytes)) || len(m.SourceHash) != 16 {
		t.Errorf("pipeline %q sourceHash %q", m.Pipeline, m.SourceHash)
	}
	if m.Input == nil || *m.Input != inputRef(sessionID) {
		t.Errorf("input = %+v", m.Input)
	}
	if got := m.Steps["writing-kit"]; !got.Final || !reflect.DeepEqual(got.Requires, []string{"summary", "ideas"}) {
		t.Errorf("writing-kit = %+v", got)
	}
	if m.Steps["summary"].Requires != nil || m.Steps["summary"].Final {
		t.Errorf("summary = %+v", m.Steps["summary"])
	}
}

func TestStartedWithOddPipeline(t *testing.T) {
	p := schemas.Pipeline{Name: "odd", Steps: []schemas.Step{{Name: "a"}, {Name: ""}, {Name: "a", Final: true}, {Name: "b"}}}
	m := FoldManifest(nil, ev(1, schemas.TypeSessionStarted, &schemas.SessionStarted{Pipeline: p}))
	if !reflect.DeepEqual(m.StepOrder, []string{"a", "b"}) || len(m.Steps) != 2 || m.Steps["a"].Final {
		t.Errorf("stepOrder %v steps %v", m.StepOrder, m.Steps)
	}
	if m.Input != nil {
		t.Errorf("input = %+v, want nil for a zero input", m.Input)
	}
	// Without data the session still starts, with no steps.
	m = FoldManifest(nil, ev(1, schemas.TypeSessionStarted, nil))
	if m == nil || m.Status != StatusRunning || m.Steps == nil || m.StepOrder == nil {
		t.Errorf("started without data = %+v", m)
	}
	if b := marshal(t, m); !bytes.Contains(b, []byte(`"steps": {}`)) || !bytes.Contains(b, []byte(`"stepOrder": []`)) {
		t.Errorf("empty steps must marshal as {} and []:\n%s", b)
	}
}

func TestFoldMutatesInPlace(t *testing.T) {
	m := foldAll([]schemas.Event{started(1)})
	before := m.Clone()
	got := FoldManifest(m, requested(2, "summary", 1))
	if got != m {
		t.Error("FoldManifest returned a different manifest; documented to mutate and return m")
	}
	if before.Steps["summary"].Status != StepStatusPending || before.LastSeq != 1 {
		t.Error("Clone shares state with the folded manifest")
	}
}

func TestFeedbackIsOneTruncatedParagraph(t *testing.T) {
	long := strings.Repeat("línea de error\n\t", 400) // multi-byte runes, newlines
	m := foldAll([]schemas.Event{started(1), requested(2, "summary", 1),
		ev(3, schemas.TypeJobFailed, &schemas.JobFailed{JobID: jobID(sessionID, "summary", 1), Error: long + "\xff"})})
	fb := m.Steps["summary"].LastFeedback
	if len(fb) > MaxFeedbackBytes || len(fb) < MaxFeedbackBytes-8 {
		t.Errorf("feedback is %d bytes, want at most %d and close to it", len(fb), MaxFeedbackBytes)
	}
	if !utf8.ValidString(fb) || strings.ContainsAny(fb, "\n\t") || strings.Contains(fb, "  ") {
		t.Errorf("feedback is not one clean paragraph: %q", fb[:80])
	}
	if !strings.HasPrefix(fb, "línea de error línea") || !strings.HasSuffix(fb, "…") {
		t.Errorf("feedback = %q…%q", fb[:40], fb[len(fb)-40:])
	}
	if got := paragraph("short\n\nmessage "); got != "short message" {
		t.Errorf("paragraph = %q", got)
	}
	exact := strings.Repeat("x", MaxFeedbackBytes)
	if got := paragraph(exact); got != exact {
		t.Errorf("a paragraph of exactly %d bytes was cut", MaxFeedbackBytes)
	}
}

func TestCloneIsDeep(t *testing.T) {
	m := foldAll(happyPath())
	c := m.Clone()
	if !reflect.DeepEqual(c, m) {
		t.Fatal("clone differs from the original")
	}
	orig := marshal(t, m)
	c.Input.Name = "x"
	c.StepOrder[0] = "x"
	c.Final[0].Name = "x"
	sv := c.Steps["summary"]
	sv.Artifacts[0].Name = "x"
	*sv.CompletedAt = time.Time{}
	c.Steps["writing-kit"].Requires[0] = "x"
	delete(c.Steps, "ideas")
	if !bytes.Equal(marshal(t, m), orig) {
		t.Error("changing the clone changed the original")
	}
	if (*Manifest)(nil).Clone() != nil || (*StepView)(nil).Clone() != nil {
		t.Error("Clone of nil is not nil")
	}
	empty := &Manifest{}
	if c := empty.Clone(); !reflect.DeepEqual(c, empty) {
		t.Errorf("Clone of a zero manifest = %+v", c)
	}
}

func TestTerminal(t *testing.T) {
	for status, want := range map[string]bool{StatusRunning: false, StatusCompleted: true, StatusFailed: true, "": false} {
		if got := (&Manifest{Status: status}).Terminal(); got != want {
			t.Errorf("Terminal() with status %q = %v", status, got)
		}
	}
	if (*Manifest)(nil).Terminal() {
		t.Error("a nil manifest is terminal")
	}
	if !foldAll(happyPath()).Terminal() || !foldAll(stepExhausted()).Terminal() || foldAll(validationRetry()).Terminal() {
		t.Error("Terminal() disagrees with the golden cases")
	}
}

// upTo returns evs up to and including the nth (from 1) event of type typ.
func upTo(t *testing.T, evs []schemas.Event, typ string, nth int) []schemas.Event {
	t.Helper()
	for i, e := range evs {
		if e.Type == typ {
			if nth--; nth == 0 {
				return evs[:i+1]
			}
		}
	}
	t.Fatalf("fewer than the wanted %s events", typ)
	return nil
}

// TestControlStates checks the states the control cases pass through on
// the way to their goldens: each case is folded up to the nth event of a
// type, and the session's and steps' statuses and details compared.
func TestControlStates(t *testing.T) {
	type step struct {
		status     string
		iterations int
		hold       string // hold kind, "" for none
	}
	tests := []struct {
		name   string
		events func() []schemas.Event
		typ    string
		nth    int
		status string
		hold   string // the session's hold kind
		steps  map[string]step
		check  func(t *testing.T, m *Manifest)
	}{
		{
			name: "a stop signal is recorded unanswered", events: stopResume, typ: schemas.TypeSignalStop, nth: 1,
			status: StatusRunning, steps: map[string]step{"summary": {StepStatusInProgress, 1, ""}},
			check: func(t *testing.T, m *Manifest) {
				if len(m.Signals) != 1 || m.Signals[0].Signal != "stop" || m.Signals[0].Reason != "wrong input file" || m.Signals[0].Result != "" {
					t.Errorf("signals = %+v", m.Signals)
				}
			},
		},
		{
			name: "session stopped, its job not yet cancelled", events: stopResume, typ: schemas.TypeSessionStopped, nth: 1,
			status: StatusStopped, hold: schemas.StopSignal, steps: map[string]step{"summary": {StepStatusInProgress, 1, ""}},
			check: func(t *testing.T, m *Manifest) {
				if m.Hold.Reason != "wrong input file" || !m.Hold.Since.Equal(at(6)) {
					t.Errorf("hold = %+v", m.Hold)
				}
			},
		},
		{
			name: "cancelled job: step pending, its iteration not used", events: stopResume, typ: schemas.TypeJobCancelled, nth: 1,
			status: StatusStopped, hold: schemas.StopSignal, steps: map[string]step{"summary": {StepStatusPending, 0, ""}},
			check: func(t *testing.T, m *Manifest) {
				sv := m.Steps["summary"]
				if sv.CancelledJobs != 1 || sv.Worker != "" {
					t.Errorf("summary = %+v", sv)
				}
				if j := m.Jobs[sv.JobID]; j == nil || j.Status != JobStatusCancelled || j.Reason != "session stopped: wrong input file" {
					t.Errorf("job = %+v", j)
				}
			},
		},
		{
			name: "acknowledged stop", events: stopResume, typ: schemas.TypeSignalAcknowledged, nth: 1,
			status: StatusStopped, hold: schemas.StopSignal,
			check: func(t *testing.T, m *Manifest) {
				if sg := m.Signals[0]; sg.Result != schemas.SignalApplied || sg.Detail != "session stopped; 1 job cancelled" || !sg.AcknowledgedAt.Equal(at(8)) {
					t.Errorf("signal = %+v", sg)
				}
			},
		},
		{
			name: "the kill report counts its usage but is no feedback", events: stopResume, typ: schemas.TypeJobFailed, nth: 1,
			status: StatusStopped, hold: schemas.StopSignal, steps: map[string]step{"summary": {StepStatusPending, 0, ""}},
			check: func(t *testing.T, m *Manifest) {
				sv := m.Steps["summary"]
				if sv.LastFeedback != "" || m.Jobs[sv.JobID].Status != JobStatusCancelled {
					t.Errorf("summary = %+v, job %+v", sv, m.Jobs[sv.JobID])
				}
				want := schemas.Usage{InputTokens: 800, OutputTokens: 20, CostUSD: 0.004}
				if m.Usage == nil || !reflect.DeepEqual(*m.Usage, want) || sv.Usage == nil || !reflect.DeepEqual(*sv.Usage, want) {
					t.Errorf("usage: session %+v step %+v", m.Usage, sv.Usage)
				}
			},
		},
		{
			name: "resumed", events: stopResume, typ: schemas.TypeSessionResumed, nth: 1,
			status: StatusRunning, steps: map[string]step{"summary": {StepStatusPending, 0, ""}},
		},
		{
			name: "the re-run carries round and hint", events: stopResume, typ: schemas.TypeJobRequested, nth: 2,
			status: StatusRunning, steps: map[string]step{"summary": {StepStatusInProgress, 1, ""}},
			check: func(t *testing.T, m *Manifest) {
				sv := m.Steps["summary"]
				if sv.Round != 1 || sv.HintsDelivered != 1 || len(sv.Hints) != 1 || sv.Hints[0].Message != "The talk is about event sourcing, not CQRS." || sv.Hints[0].Iteration != 1 {
					t.Errorf("summary = %+v", sv)
				}
			},
		},
		{
			name: "paused", events: stopResume, typ: schemas.TypeSessionPaused, nth: 1,
			status: StatusPaused, hold: schemas.PauseSignal, steps: map[string]step{"ideas": {StepStatusCompleted, 1, ""}},
		},
		{
			name: "paused then resumed", events: stopResume, typ: schemas.TypeSessionResumed, nth: 2, status: StatusRunning,
		},
		{
			name: "stopped by the budget", events: budgetStop, typ: schemas.TypeJobFailed, nth: 1,
			status: StatusStopped, hold: schemas.StopBudget, steps: map[string]step{"summary": {StepStatusCompleted, 1, ""}, "ideas": {StepStatusPending, 1, ""}},
			check: func(t *testing.T, m *Manifest) {
				want := schemas.Budget{MaxCostUSD: 0.10, MaxTokens: 100000, MaxIterations: 12}
				if m.Budget == nil || *m.Budget != want {
					t.Errorf("budget = %+v, want %+v", m.Budget, want)
				}
				if m.Usage == nil || m.Usage.CostUSD != 0.105 || m.Usage.InputTokens != 45000 {
					t.Errorf("usage = %+v", m.Usage)
				}
			},
		},
		{
			name: "waiting for the usage limit", events: rateLimitWait, typ: schemas.TypeStepWaiting, nth: 1,
			status: StatusRunning, steps: map[string]step{"summary": {StepStatusWaiting, 1, ""}},
			check: func(t *testing.T, m *Manifest) {
				if w := m.Steps["summary"].Wait; w == nil || !w.Until.Equal(resetAt) || w.Reason != "usage limit" || w.JobID != jobID(sessionID, "summary", 1) {
					t.Errorf("wait = %+v", w)
				}
			},
		},
		{
			name: "the next request ends the wait", events: rateLimitWait, typ: schemas.TypeJobRequested, nth: 2,
			status: StatusRunning, steps: map[string]step{"summary": {StepStatusInProgress, 2, ""}},
			check: func(t *testing.T, m *Manifest) {
				if m.Steps["summary"].Wait != nil {
					t.Errorf("wait = %+v", m.Steps["summary"].Wait)
				}
			},
		},
		{
			name: "breaker open", events: breakerOpenClose, typ: schemas.TypeStepPaused, nth: 1,
			status: StatusRunning, steps: map[string]step{"ideas": {StepStatusBreaker, 2, schemas.PauseBreaker}},
			check: func(t *testing.T, m *Manifest) {
				if h := m.Steps["ideas"].Hold; h.Reason != "no progress: 2 iterations in a row with the same errors and unchanged outputs" {
					t.Errorf("hold = %+v", h)
				}
			},
		},
		{
			name: "breaker closed", events: breakerOpenClose, typ: schemas.TypeStepResumed, nth: 1,
			status: StatusRunning, steps: map[string]step{"ideas": {StepStatusInProgress, 2, ""}},
		},
		{
			name: "step paused before it ran", events: breakerOpenClose, typ: schemas.TypeStepPaused, nth: 2,
			steps: map[string]step{"writing-kit": {StepStatusPaused, 0, schemas.PauseSignal}, "ideas": {StepStatusCompleted, 3, ""}}, status: StatusRunning,
		},
		{
			name: "step resumed before it ran", events: breakerOpenClose, typ: schemas.TypeStepResumed, nth: 2,
			steps: map[string]step{"writing-kit": {StepStatusPending, 0, ""}}, status: StatusRunning,
		},
		{
			name: "step stopped while running", events: breakerOpenClose, typ: schemas.TypeStepPaused, nth: 3,
			steps: map[string]step{"writing-kit": {StepStatusStopped, 1, schemas.PauseStop}}, status: StatusRunning,
		},
		{
			name: "stopped step's job cancelled", events: breakerOpenClose, typ: schemas.TypeJobCancelled, nth: 1,
			steps: map[string]step{"writing-kit": {StepStatusStopped, 0, schemas.PauseStop}}, status: StatusRunning,
		},
		{
			name: "invalidated step starts over", events: invalidation, typ: schemas.TypeStepInvalidated, nth: 1,
			status: StatusRunning, steps: map[string]step{"summary": {StepStatusPending, 0, ""}, "ideas": {StepStatusCompleted, 1, ""}, "writing-kit": {StepStatusInProgress, 1, ""}},
			check: func(t *testing.T, m *Manifest) {
				sv := m.Steps["summary"]
				if sv.Artifacts != nil || sv.ContentHash != "" || sv.CompletedAt != nil || sv.JobID != "" || sv.Invalidations != 1 ||
					sv.LastInvalidation == nil || sv.LastInvalidation.Cause != "summary" || sv.Usage == nil {
					t.Errorf("summary = %+v", sv)
				}
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := foldAll(upTo(t, tc.events(), tc.typ, tc.nth))
			hold := ""
			if m.Hold != nil {
				hold = m.Hold.Kind
			}
			if m.Status != tc.status || hold != tc.hold {
				t.Errorf("session status %q hold %q, want %q %q", m.Status, hold, tc.status, tc.hold)
			}
			for name, want := range tc.steps {
				sv := m.Steps[name]
				got := step{sv.Status, sv.Iterations, ""}
				if sv.Hold != nil {
					got.hold = sv.Hold.Kind
				}
				if got != want {
					t.Errorf("step %s = %+v, want %+v", name, got, want)
				}
			}
			if tc.check != nil {
				tc.check(t, m)
			}
		})
	}
}

// TestFoldFromStoredView checks what the projector relies on: folding
// from a manifest decoded from its JSON (a stored view) gives the same
// manifest as folding from the start, wherever the history is cut.
func TestFoldFromStoredView(t *testing.T) {
	for _, tc := range goldenCases {
		t.Run(tc.name, func(t *testing.T) {
			evs := tc.events()
			want := marshal(t, foldAll(evs))
			for cut := 1; cut < len(evs); cut++ {
				m := foldAll(evs[:cut])
				if m == nil {
					continue
				}
				var stored *Manifest
				if err := json.Unmarshal(marshal(t, m), &stored); err != nil {
					t.Fatal(err)
				}
				for _, ev := range evs[cut:] {
					stored = FoldManifest(stored, ev)
				}
				if got := marshal(t, stored); !bytes.Equal(got, want) {
					t.Fatalf("cut after event %d: folding on from the stored view gives\n%s\nwant\n%s", cut, got, want)
				}
			}
		})
	}
}

// TestControlOnEndedSessions: an ended session is never held or resumed,
// a repeated job.cancelled counts once, and a job's last usage report
// replaces earlier ones, also when it carries none.
func TestControlOnEndedSessions(t *testing.T) {
	j1 := jobID(sessionID, "summary", 1)
	tests := []struct {
		name   string
		events []schemas.Event
		status string
		check  func(t *testing.T, m *Manifest)
	}{
		{
			name: "completed session is not paused",
			events: append(allStepsDone(2), ev(5, schemas.TypeSessionCompleted, &schemas.SessionCompleted{}),
				ev(6, schemas.TypeSessionPaused, &schemas.SessionPaused{Reason: "late"}), ev(7, schemas.TypeSessionStopped, nil)),
			status: StatusCompleted,
			check: func(t *testing.T, m *Manifest) {
				if m.Hold != nil {
					t.Errorf("hold = %+v", m.Hold)
				}
			},
		},
		{
			name: "failed session is not resumed",
			events: []schemas.Event{started(1), ev(2, schemas.TypeSessionFailed, &schemas.SessionFailed{Reason: "x"}),
				ev(3, schemas.TypeSessionResumed, &schemas.SessionResumed{})},
			status: StatusFailed,
		},
		{
			name: "ending a stopped session clears the hold",
			events: []schemas.Event{started(1), ev(2, schemas.TypeSessionStopped, &schemas.SessionStopped{Kind: "budget", Reason: "r"}),
				ev(3, schemas.TypeSessionFailed, &schemas.SessionFailed{Reason: "x"})},
			status: StatusFailed,
			check: func(t *testing.T, m *Manifest) {
				if m.Hold != nil {
					t.Errorf("hold = %+v", m.Hold)
				}
			},
		},
		{
			name:   "stopped without data is a signal stop",
			events: []schemas.Event{started(1), ev(2, schemas.TypeSessionStopped, nil)},
			status: StatusStopped,
			check: func(t *testing.T, m *Manifest) {
				if m.Hold == nil || m.Hold.Kind != schemas.StopSignal {
					t.Errorf("hold = %+v", m.Hold)
				}
			},
		},
		{
			name: "a job cancelled twice counts once",
			events: []schemas.Event{started(1), requested(2, "summary", 1),
				ev(3, schemas.TypeJobCancelled, &schemas.JobCancelled{JobID: j1, Step: "summary", Iteration: 1, Reason: "a"}),
				ev(4, schemas.TypeJobCancelled, &schemas.JobCancelled{JobID: j1, Step: "summary", Iteration: 1, Reason: "b"})},
			status: StatusRunning,
			check: func(t *testing.T, m *Manifest) {
				if sv := m.Steps["summary"]; sv.CancelledJobs != 1 || sv.Status != StepStatusPending || m.Jobs[j1].Reason != "a" {
					t.Errorf("summary = %+v job %+v", sv, m.Jobs[j1])
				}
			},
		},
		{
			name: "a completed step is not held or cancelled back to pending",
			events: []schemas.Event{started(1), requested(2, "summary", 1),
				ev(3, schemas.TypeStepCompleted, &schemas.StepCompleted{Step: "summary", JobID: j1, Iterations: 1}),
				ev(4, schemas.TypeStepPaused, &schemas.StepPaused{Step: "summary", Kind: schemas.PauseSignal}),
				ev(5, schemas.TypeJobCancelled, &schemas.JobCancelled{JobID: j1, Step: "summary", Iteration: 1}),
				ev(6, schemas.TypeStepWaiting, &schemas.StepWaiting{Step: "summary", Until: resetAt})},
			status: StatusRunning,
			check: func(t *testing.T, m *Manifest) {
				if sv := m.Steps["summary"]; sv.Status != StepStatusCompleted || sv.Iterations != 1 {
					t.Errorf("summary = %+v", sv)
				}
			},
		},
		{
			name: "the last usage report wins, also an empty one",
			events: []schemas.Event{started(1), requested(2, "summary", 1),
				ev(3, schemas.TypeJobCompleted, &schemas.JobCompleted{JobID: j1, Step: "summary", Usage: &schemas.Usage{InputTokens: 9, CostUSD: 1}}),
				ev(4, schemas.TypeJobFailed, &schemas.JobFailed{JobID: j1, Step: "summary"})},
			status: StatusRunning,
			check: func(t *testing.T, m *Manifest) {
				if m.Usage != nil || m.Steps["summary"].Usage != nil || m.Jobs[j1].Usage != nil || m.Jobs[j1].Status != JobStatusFailed {
					t.Errorf("usage %+v step %+v job %+v", m.Usage, m.Steps["summary"].Usage, m.Jobs[j1])
				}
			},
		},
		{
			name: "a report of an unrequested job of a pipeline step counts; of another step not",
			events: []schemas.Event{started(1),
				ev(2, schemas.TypeJobCompleted, &schemas.JobCompleted{JobID: "x", Step: "ideas", Iteration: 2, Usage: &schemas.Usage{OutputTokens: 5}}),
				ev(3, schemas.TypeJobCompleted, &schemas.JobCompleted{JobID: "y", Step: "publish", Usage: &schemas.Usage{OutputTokens: 7}})},
			status: StatusRunning,
			check: func(t *testing.T, m *Manifest) {
				if len(m.Jobs) != 1 || m.Jobs["x"].Iteration != 2 || m.Usage == nil || m.Usage.OutputTokens != 5 || m.Steps["ideas"].Usage.OutputTokens != 5 {
					t.Errorf("jobs %+v usage %+v", m.Jobs, m.Usage)
				}
			},
		},
		{
			name: "signals beyond MaxSignals drop the oldest; an answer to a dropped one is kept",
			events: func() []schemas.Event {
				evs := []schemas.Event{started(1)}
				for i := range MaxSignals + 3 {
					e := ev(uint64(2+i), schemas.TypeSignalInfo, &schemas.Signal{Target: sessionID, Message: "m" + strconv.Itoa(i)})
					e.ID = "sig-" + strconv.Itoa(i)
					evs = append(evs, e)
				}
				return append(evs, ev(100, schemas.TypeSignalAcknowledged, &schemas.SignalAcknowledged{SignalID: "sig-0", Signal: "info", Result: schemas.SignalIgnored}))
			}(),
			status: StatusRunning,
			check: func(t *testing.T, m *Manifest) {
				if len(m.Signals) != MaxSignals || m.Signals[0].ID != "sig-4" || m.Signals[MaxSignals-1].ID != "sig-0" || m.Signals[MaxSignals-1].Result != schemas.SignalIgnored {
					t.Errorf("%d signals: first %+v last %+v", len(m.Signals), m.Signals[0], m.Signals[len(m.Signals)-1])
				}
			},
		},
		{
			name: "hints beyond MaxHints drop the oldest",
			events: func() []schemas.Event {
				hints := make([]string, MaxHints+2)
				for i := range hints {
					hints[i] = "hint " + strconv.Itoa(i)
				}
				return []schemas.Event{started(1), ev(2, schemas.TypeJobRequested, &schemas.JobRequested{JobID: j1, Step: "summary", Iteration: 1, Hints: hints})}
			}(),
			status: StatusRunning,
			check: func(t *testing.T, m *Manifest) {
				sv := m.Steps["summary"]
				if sv.HintsDelivered != MaxHints+2 || len(sv.Hints) != MaxHints || sv.Hints[0].Message != "hint 2" {
					t.Errorf("hints delivered %d kept %d first %+v", sv.HintsDelivered, len(sv.Hints), sv.Hints[0])
				}
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := foldAll(tc.events)
			if m.Status != tc.status {
				t.Errorf("status %q, want %q", m.Status, tc.status)
			}
			if tc.check != nil {
				tc.check(t, m)
			}
		})
	}
}

func TestCloneIsDeepForControlFields(t *testing.T) {
	tests := []struct {
		name   string
		events func() []schemas.Event
		mutate func(c *Manifest)
	}{
		{"budget, hold, usage and jobs", budgetStop, func(c *Manifest) {
			c.Hold.Reason, c.Budget.MaxCostUSD, c.Usage.CostUSD = "x", 9, 9
			c.Steps["ideas"].Usage.CostUSD = 9
			for _, j := range c.Jobs {
				j.Status = "x"
				if j.Usage != nil {
					j.Usage.CostUSD = 9
				}
			}
			c.Jobs["new"] = &JobView{}
		}},
		{"signals and hints", stopResume, func(c *Manifest) {
			c.Signals[0].Result = "x"
			c.Steps["summary"].Hints[0].Message = "x"
		}},
		{"wait", rateLimitWait, func(c *Manifest) { c.Steps["ideas"].Wait.Reason = "x" }},
		{"step hold", breakerOpenClose, func(c *Manifest) { c.Steps["writing-kit"].Hold.Reason = "x" }},
		{"invalidation", invalidation, func(c *Manifest) { c.Steps["summary"].LastInvalidation.Cause = "x" }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := foldAll(tc.events())
			c := m.Clone()
			if !reflect.DeepEqual(c, m) {
				t.Fatal("clone differs from the original")
			}
			orig := marshal(t, m)
			tc.mutate(c)
			if !bytes.Equal(marshal(t, m), orig) {
				t.Error("changing the clone changed the original")
			}
		})
	}
}

// TestHoldsAndWaitsEndLikeTheOrchestrators: a step that finishes is never
// held (so an invalidation does not bring back an old pause), and resuming
// a step ends its rate-limit wait, as the orchestrator decides.
func TestHoldsAndWaitsEndLikeTheOrchestrators(t *testing.T) {
	const s = "hold-1"
	b := &builder{}
	b.start(s)
	job := b.request(s, "summary", 1)
	b.add(s, schemas.TypeStepPaused, "summary", "", &schemas.StepPaused{Step: "summary", Kind: schemas.PauseSignal, Reason: "look"})
	arts := []schemas.ArtifactRef{artifact(s, "summary", 1, "summary.json", "{}")}
	b.passed(s, "summary", job, 1, arts...)
	b.stepCompleted(s, "summary", job, 1, "", arts...)
	m := BuildManifest(s, b.evs)
	if sv := m.Steps["summary"]; sv.Status != StepStatusCompleted || sv.Hold != nil {
		t.Fatalf("completed step: status %s hold %+v", sv.Status, sv.Hold)
	}
	b.add(s, schemas.TypeStepInvalidated, "summary", "", &schemas.StepInvalidated{Step: "summary", Cause: "summary"})
	if sv := BuildManifest(s, b.evs).Steps["summary"]; sv.Status != StepStatusPending || sv.Hold != nil {
		t.Errorf("invalidated step: status %s hold %+v", sv.Status, sv.Hold)
	}

	job = b.request(s, "ideas", 1)
	b.add(s, schemas.TypeStepWaiting, "ideas", job, &schemas.StepWaiting{Step: "ideas", JobID: job, Until: t0.Add(time.Hour), Reason: "usage limit"})
	if sv := BuildManifest(s, b.evs).Steps["ideas"]; sv.Status != StepStatusWaiting {
		t.Fatalf("waiting step: status %s", sv.Status)
	}
	b.add(s, schemas.TypeStepResumed, "ideas", "", &schemas.StepResumed{Step: "ideas"})
	if sv := BuildManifest(s, b.evs).Steps["ideas"]; sv.Wait != nil || sv.Status == StepStatusWaiting {
		t.Errorf("resumed step: status %s wait %+v", sv.Status, sv.Wait)
	}
}
