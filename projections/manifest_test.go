package projections

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"reflect"
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
	{"duplicate_event", duplicateEvents},
	{"other_session", otherSessionInterleaved},
	{"before_started", beforeStarted},
	{"only_before_started", onlyBeforeStarted},
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
			events: []schemas.Event{started(1),
				ev(2, schemas.TypeSessionCompleted, &schemas.SessionCompleted{Final: []schemas.ArtifactRef{sum}})},
			want: want{status: StatusCompleted, lastSeq: 2, updatedAt: at(2), final: 1,
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
				ev(2, "loopbus.session.paused", nil),
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
			events: []schemas.Event{started(2), ev(0, schemas.TypeSessionCompleted, &schemas.SessionCompleted{})},
			want:   want{status: StatusCompleted, lastSeq: 2, updatedAt: at(0)},
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
			if m.Version != 1 || m.ContentID != sessionID || !m.CreatedAt.Equal(t0.Add(time.Duration(tc.events[0].Seq)*time.Second)) {
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
