package validator_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/internal/testnats"
	"github.com/loopbus/loopbus/schemas"
	"github.com/loopbus/loopbus/validator"
	"github.com/nats-io/nats.go/jetstream"
)

const session = "s1"

const waitTimeout = 30 * time.Second

// summarySchema requires a string title and a positive integer count.
const summarySchema = `{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "type": "object",
  "required": ["title", "count"],
  "properties": {
    "title": {"type": "string"},
    "count": {"type": "integer", "minimum": 1}
  }
}`

type file struct{ name, content string }

// startValidator runs a validator until the test ends. dump is put in the
// base environment of validate commands as $DUMP.
func startValidator(t *testing.T, b *bus.Bus, dump string) {
	t.Helper()
	v, err := validator.New(validator.Config{
		WorkDir: t.TempDir(),
		Env:     []string{"PATH=" + os.Getenv("PATH"), "DUMP=" + dump},
	}, b, testnats.Logger(t), time.Now)
	if err != nil {
		t.Fatalf("validator.New: %v", err)
	}
	testnats.Run(t, "validator", v.Run)
}

func writeScript(t *testing.T, body string) []string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "validate.sh")
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body), 0o700); err != nil {
		t.Fatal(err)
	}
	return []string{"sh", p}
}

func publish(t *testing.T, b *bus.Bus, sess, typ, step, job string, data any) uint64 {
	t.Helper()
	p, err := b.Publish(context.Background(), schemas.Event{
		ID:          schemas.DeterministicID("test", sess, typ, job),
		Type:        typ,
		Session:     sess,
		Step:        step,
		Job:         job,
		Correlation: sess,
		Time:        time.Now(),
		Data:        data,
	})
	if err != nil {
		t.Fatalf("publish %s: %v", typ, err)
	}
	return p.Seq
}

func putArtifact(t *testing.T, b *bus.Bus, object, name, content string) schemas.ArtifactRef {
	t.Helper()
	ref, err := b.PutArtifact(context.Background(), object, name, strings.NewReader(content))
	if err != nil {
		t.Fatalf("PutArtifact: %v", err)
	}
	return ref
}

// job is one job of the "summary" step: its request and the outputs its
// job.completed lists.
type job struct {
	id       string
	request  *schemas.JobRequested
	produced []file
}

func newJob(id string, outputs ...schemas.Output) *job {
	return &job{id: id, request: &schemas.JobRequested{
		JobID: id, Step: "summary", Iteration: 1, Attempt: 1,
		Agent:     schemas.AgentSpec{Backend: "exec", Command: []string{"true"}},
		Prompt:    "Summarise talk.md.",
		Inputs:    []schemas.ArtifactRef{},
		Outputs:   outputs,
		TimeoutMs: 1000,
	}}
}

// complete stores the produced outputs and publishes the job.completed
// pointing at requestSeq; it returns the completion's sequence and data.
func (j *job) complete(t *testing.T, b *bus.Bus, requestSeq uint64) (uint64, *schemas.JobCompleted) {
	t.Helper()
	jc := &schemas.JobCompleted{
		JobID: j.id, Step: "summary", Iteration: 1, RequestSeq: requestSeq, Worker: "w1",
		Artifacts: []schemas.ArtifactRef{},
	}
	for _, f := range j.produced {
		ref := putArtifact(t, b, j.id+"/"+f.name, f.name, f.content)
		ref.Step = "summary"
		jc.Artifacts = append(jc.Artifacts, ref)
	}
	return publish(t, b, session, schemas.TypeJobCompleted, "summary", j.id, jc), jc
}

func sessionEvents(t *testing.T, b *bus.Bus) []schemas.Event {
	t.Helper()
	return testnats.Events(t, b, schemas.SessionSubjects(session))
}

func isVerdict(ev schemas.Event) bool {
	return ev.Type == schemas.TypeValidationPassed || ev.Type == schemas.TypeValidationFailed
}

func describe(evs []schemas.Event) string {
	var s strings.Builder
	for _, ev := range evs {
		d, _ := json.Marshal(ev.Data)
		fmt.Fprintf(&s, "\n  %d %s %s", ev.Seq, ev.Type, d)
	}
	return s.String()
}

// waitVerdict waits for the verdict of jobID.
func waitVerdict(t *testing.T, b *bus.Bus, jobID string) (schemas.Event, *schemas.Verdict) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for {
		evs := sessionEvents(t, b)
		for _, ev := range evs {
			if isVerdict(ev) && ev.Job == jobID {
				return ev, ev.Data.(*schemas.Verdict)
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no verdict for %s; events:%s", jobID, describe(evs))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func waitAcked(t *testing.T, b *bus.Bus) {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(waitTimeout)
	for {
		cons, err := b.JetStream().Consumer(ctx, b.StreamName(), validator.ConsumerName)
		if err != nil {
			t.Fatal(err)
		}
		info, err := cons.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.NumAckPending == 0 && info.NumPending == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("validator consumer: %d unacknowledged, %d pending", info.NumAckPending, info.NumPending)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

type wantErr struct {
	artifact, pointer, source string
	contains                  []string
}

func TestVerdicts(t *testing.T) {
	schema := json.RawMessage(summarySchema)
	summary := schemas.Output{Name: "summary.json", Schema: schema, SchemaVersion: "v1"}
	const validJSON = `{"title":"Event-sourced agents","count":3}`
	const talk = "# Event-sourced agents\n"

	tests := []struct {
		name     string
		outputs  []schemas.Output
		produced []file
		// validate is the body of the validate command; it always records
		// that it ran in $DUMP/ran first.
		validate          string
		validateTimeoutMs int64
		want              string
		wantErrs          []wantErr
		wantRan           bool
		// check inspects what the validate command saw in $DUMP.
		check func(t *testing.T, dump string)
	}{
		{
			name:     "schema-valid output passes",
			outputs:  []schemas.Output{summary},
			produced: []file{{"summary.json", validJSON}},
			want:     schemas.TypeValidationPassed,
		},
		{
			name:     "output without schema passes",
			outputs:  []schemas.Output{{Name: "notes.md"}},
			produced: []file{{"notes.md", "not JSON at all"}},
			want:     schemas.TypeValidationPassed,
		},
		{
			name:     "valid output and passing command",
			outputs:  []schemas.Output{summary},
			produced: []file{{"summary.json", validJSON}},
			validate: `cp "$LOOPBUS_OUTPUT_DIR/summary.json" "$DUMP/out-summary.json"
cp "$LOOPBUS_INPUT_DIR/talk.md" "$DUMP/in-talk.md"
printf '%s' "$LOOPBUS_JOB" > "$DUMP/job"
`,
			want:    schemas.TypeValidationPassed,
			wantRan: true,
			check: func(t *testing.T, dump string) {
				wantFile(t, filepath.Join(dump, "out-summary.json"), validJSON)
				wantFile(t, filepath.Join(dump, "in-talk.md"), talk)
				wantFile(t, filepath.Join(dump, "job"), "s1.summary.1")
			},
		},
		{
			name:     "two schema violations",
			outputs:  []schemas.Output{summary},
			produced: []file{{"summary.json", `{"title":42,"count":0}`}},
			validate: "exit 0\n",
			want:     schemas.TypeValidationFailed,
			wantErrs: []wantErr{
				{artifact: "summary.json", pointer: "/count", source: "schema", contains: []string{"minimum"}},
				{artifact: "summary.json", pointer: "/title", source: "schema", contains: []string{"string"}},
			},
		},
		{
			name:     "output is not JSON",
			outputs:  []schemas.Output{summary},
			produced: []file{{"summary.json", "Title: Event-sourced agents\n"}},
			validate: "exit 0\n",
			want:     schemas.TypeValidationFailed,
			wantErrs: []wantErr{{artifact: "summary.json", pointer: "", source: "schema", contains: []string{"JSON"}}},
		},
		{
			name:     "declared output not produced",
			outputs:  []schemas.Output{summary, {Name: "ideas.json"}},
			produced: []file{{"summary.json", validJSON}},
			validate: "exit 0\n",
			want:     schemas.TypeValidationFailed,
			wantErrs: []wantErr{{artifact: "ideas.json", pointer: "", source: "schema", contains: []string{"declared output was not produced"}}},
		},
		{
			name:     "schema does not compile",
			outputs:  []schemas.Output{{Name: "summary.json", Schema: json.RawMessage(`{"type":12}`)}},
			produced: []file{{"summary.json", validJSON}},
			want:     schemas.TypeValidationFailed,
			wantErrs: []wantErr{{artifact: "summary.json", source: "schema", contains: []string{"does not compile"}}},
		},
		{
			name:     "command fails",
			outputs:  []schemas.Output{summary},
			produced: []file{{"summary.json", validJSON}},
			validate: `cp "$LOOPBUS_OUTPUT_DIR/summary.json" "$DUMP/out-summary.json"
cp "$LOOPBUS_INPUT_DIR/talk.md" "$DUMP/in-talk.md"
echo "checking summary"
echo "title is too generic" >&2
exit 1
`,
			want: schemas.TypeValidationFailed,
			wantErrs: []wantErr{{source: "command", contains: []string{
				"exited with code 1", "title is too generic", "checking summary",
			}}},
			wantRan: true,
			check: func(t *testing.T, dump string) {
				wantFile(t, filepath.Join(dump, "out-summary.json"), validJSON)
				wantFile(t, filepath.Join(dump, "in-talk.md"), talk)
			},
		},
		{
			name:              "command times out",
			outputs:           []schemas.Output{summary},
			produced:          []file{{"summary.json", validJSON}},
			validate:          "sleep 20\n",
			validateTimeoutMs: 300,
			want:              schemas.TypeValidationFailed,
			wantErrs:          []wantErr{{source: "command", contains: []string{"timed out", "300ms"}}},
			wantRan:           true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b, _ := testnats.Bus(t)
			dump := t.TempDir()
			in := putArtifact(t, b, "s1/input/talk.md", "talk.md", talk)

			j := newJob("s1.summary.1", tt.outputs...)
			j.request.Inputs = []schemas.ArtifactRef{in}
			j.produced = tt.produced
			if tt.validate != "" {
				j.request.Validate = writeScript(t, "touch \"$DUMP/ran\"\n"+tt.validate)
				j.request.ValidateTimeoutMs = tt.validateTimeoutMs
			}
			reqSeq := publish(t, b, session, schemas.TypeJobRequested, "summary", j.id, j.request)
			_, jc := j.complete(t, b, reqSeq)

			startTime := time.Now()
			startValidator(t, b, dump)
			ev, v := waitVerdict(t, b, j.id)
			took := time.Since(startTime)

			if ev.Type != tt.want {
				t.Fatalf("verdict %s, want %s: %+v", ev.Type, tt.want, *v)
			}
			if v.JobID != j.id || v.Step != "summary" || v.Iteration != 1 || ev.Step != "summary" || ev.Session != session {
				t.Errorf("verdict identifies job %s step %s/%s iteration %d session %s", v.JobID, v.Step, ev.Step, v.Iteration, ev.Session)
			}
			if got, want := mustJSON(t, v.Artifacts), mustJSON(t, jc.Artifacts); got != want {
				t.Errorf("verdict artifacts %s, want those of job.completed %s", got, want)
			}
			if len(v.Errors) != len(tt.wantErrs) {
				t.Fatalf("verdict errors:\n%s\nwant %d", mustJSON(t, v.Errors), len(tt.wantErrs))
			}
			for i, w := range tt.wantErrs {
				e := v.Errors[i]
				if e.Artifact != w.artifact || e.Pointer != w.pointer || e.Source != w.source {
					t.Errorf("error %d = %+v, want artifact %q pointer %q source %q", i, e, w.artifact, w.pointer, w.source)
				}
				for _, s := range w.contains {
					if !strings.Contains(e.Message, s) {
						t.Errorf("error %d message %q does not contain %q", i, e.Message, s)
					}
				}
			}
			switch {
			case ev.Type == schemas.TypeValidationFailed && strings.TrimSpace(v.RetryHint) == "":
				t.Errorf("failed verdict without retry hint")
			case ev.Type == schemas.TypeValidationPassed && v.RetryHint != "":
				t.Errorf("passed verdict with retry hint %q", v.RetryHint)
			}
			for _, w := range tt.wantErrs {
				if w.artifact != "" && !strings.Contains(v.RetryHint, w.artifact) {
					t.Errorf("retry hint %q does not name %s", v.RetryHint, w.artifact)
				}
			}
			_, err := os.Stat(filepath.Join(dump, "ran"))
			if ran := err == nil; ran != tt.wantRan {
				t.Errorf("validate command ran = %v, want %v", ran, tt.wantRan)
			}
			if tt.validateTimeoutMs > 0 && took > 10*time.Second {
				t.Errorf("verdict took %s with a %dms validate timeout", took, tt.validateTimeoutMs)
			}
			if tt.check != nil {
				tt.check(t, dump)
			}
			waitAcked(t, b)
		})
	}
}

func wantFile(t *testing.T, path, want string) {
	t.Helper()
	got, err := os.ReadFile(path)
	if err != nil {
		t.Errorf("validate command did not leave %s: %v", filepath.Base(path), err)
		return
	}
	if string(got) != want {
		t.Errorf("%s = %q, want %q", filepath.Base(path), got, want)
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	raw, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(raw)
}

func TestCompletionOfAnotherRequestIsDeadLettered(t *testing.T) {
	tests := []struct {
		name string
		// target publishes events and returns the RequestSeq to use.
		target func(t *testing.T, b *bus.Bus) uint64
	}{
		{
			name: "request of another job",
			target: func(t *testing.T, b *bus.Bus) uint64 {
				return publish(t, b, session, schemas.TypeJobRequested, "summary", "s1.summary.9", newJob("s1.summary.9").request)
			},
		},
		{
			name: "same job id in another session",
			target: func(t *testing.T, b *bus.Bus) uint64 {
				return publish(t, b, "s2", schemas.TypeJobRequested, "summary", "s1.summary.1", newJob("s1.summary.1").request)
			},
		},
		{
			name: "not a job.requested",
			target: func(t *testing.T, b *bus.Bus) uint64 {
				return publish(t, b, session, schemas.TypeStepFailed, "summary", "", &schemas.StepFailed{Step: "summary", Iterations: 1, Error: "x"})
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b, _ := testnats.Bus(t)
			dump := t.TempDir()
			// The job's real request exists too; the completion points elsewhere.
			j := newJob("s1.summary.1", schemas.Output{Name: "summary.json"})
			j.request.Validate = writeScript(t, "touch \"$DUMP/ran\"\n")
			publish(t, b, session, schemas.TypeJobRequested, "summary", j.id, j.request)
			j.produced = []file{{"summary.json", "{}"}}
			wrong := tt.target(t, b)
			jcSeq, _ := j.complete(t, b, wrong)

			startValidator(t, b, dump)
			msg := waitDeadLetter(t, b, jcSeq)
			if reason := msg.Header.Get(bus.HeaderDLQReason); !strings.Contains(reason, "is not the request of job s1.summary.1") {
				t.Errorf("dead-letter reason %q", reason)
			}
			if c := msg.Header.Get(bus.HeaderDLQConsumer); c != validator.ConsumerName {
				t.Errorf("dead-letter consumer %q", c)
			}
			waitAcked(t, b)
			for _, ev := range sessionEvents(t, b) {
				if isVerdict(ev) {
					t.Errorf("verdict published for a dead-lettered completion: %s", describe([]schemas.Event{ev}))
				}
			}
			if _, err := os.Stat(filepath.Join(dump, "ran")); err == nil {
				t.Errorf("validate command ran")
			}
		})
	}
}

// waitDeadLetter waits for the validator's dead letter of stream sequence
// seq and returns it.
func waitDeadLetter(t *testing.T, b *bus.Bus, seq uint64) *jetstream.RawStreamMsg {
	t.Helper()
	ctx := context.Background()
	st, err := b.JetStream().Stream(ctx, bus.DefaultDLQStream)
	if err != nil {
		t.Fatalf("DLQ stream: %v", err)
	}
	deadline := time.Now().Add(waitTimeout)
	for {
		msg, err := st.GetLastMsgForSubject(ctx, bus.DLQSubjectPrefix+"."+validator.ConsumerName+".*")
		if err == nil && msg.Header.Get(bus.HeaderDLQSeq) == strconv.FormatUint(seq, 10) {
			return msg
		}
		if err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
			t.Fatalf("DLQ: %v", err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("no dead letter of seq %d (last: %v, %v)", seq, msg, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestMissingOutputObjectFailsValidation(t *testing.T) {
	b, _ := testnats.Bus(t)
	j := newJob("s1.summary.1", schemas.Output{Name: "summary.json", Schema: json.RawMessage(summarySchema)})
	reqSeq := publish(t, b, session, schemas.TypeJobRequested, "summary", j.id, j.request)
	jc := &schemas.JobCompleted{
		JobID: j.id, Step: "summary", Iteration: 1, RequestSeq: reqSeq, Worker: "w1",
		Artifacts: []schemas.ArtifactRef{{
			Name: "summary.json", Object: "never/stored", Digest: schemas.Digest([]byte("{}")), Size: 2, Step: "summary",
		}},
	}
	publish(t, b, session, schemas.TypeJobCompleted, "summary", j.id, jc)
	startValidator(t, b, t.TempDir())
	ev, v := waitVerdict(t, b, j.id)
	if ev.Type != schemas.TypeValidationFailed || len(v.Errors) != 1 || !strings.Contains(v.Errors[0].Message, "cannot read outputs") {
		t.Fatalf("verdict %s %+v, want validation.failed: cannot read outputs", ev.Type, *v)
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	b, _ := testnats.Bus(t)
	tests := []struct {
		name    string
		cfg     validator.Config
		nilBus  bool
		wantErr bool
	}{
		{name: "zero value"},
		{name: "negative concurrency", cfg: validator.Config{Concurrency: -1}, wantErr: true},
		{name: "negative timeout", cfg: validator.Config{DefaultTimeout: -time.Second}, wantErr: true},
		{name: "no bus", nilBus: true, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var bb validator.Bus = b
			if tt.nilBus {
				bb = nil
			}
			if _, err := validator.New(tt.cfg, bb, testnats.Logger(t), time.Now); (err != nil) != tt.wantErr {
				t.Fatalf("New error = %v, wantErr %v", err, tt.wantErr)
			}
		})
	}
}

// A missing input is as permanent as a missing output: the verdict must
// say so (as "cannot read outputs" does) rather than the completion being
// retried until it is dead-lettered, which leaves the session waiting for
// a verdict that never comes.
func TestMissingInputObjectGivesAVerdict(t *testing.T) {
	b, _ := testnats.Bus(t)
	dump := t.TempDir()
	j := newJob("s1.summary.1", schemas.Output{Name: "summary.json"})
	j.request.Inputs = []schemas.ArtifactRef{{Name: "talk.md", Object: "never/stored", Digest: schemas.Digest([]byte("x")), Size: 1}}
	j.request.Validate = writeScript(t, "touch \"$DUMP/ran\"\n")
	j.produced = []file{{"summary.json", "{}"}}
	reqSeq := publish(t, b, session, schemas.TypeJobRequested, "summary", j.id, j.request)
	jcSeq, _ := j.complete(t, b, reqSeq)
	startValidator(t, b, dump)

	ctx := context.Background()
	dlq, err := b.JetStream().Stream(ctx, bus.DefaultDLQStream)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(waitTimeout)
	for {
		for _, ev := range sessionEvents(t, b) {
			if isVerdict(ev) && ev.Job == j.id {
				v := ev.Data.(*schemas.Verdict)
				if ev.Type != schemas.TypeValidationFailed || len(v.Errors) == 0 {
					t.Fatalf("verdict %s %+v, want validation.failed naming the missing input", ev.Type, *v)
				}
				return
			}
		}
		if msg, err := dlq.GetLastMsgForSubject(ctx, bus.DLQSubjectPrefix+"."+validator.ConsumerName+".*"); err == nil &&
			msg.Header.Get(bus.HeaderDLQSeq) == strconv.FormatUint(jcSeq, 10) {
			t.Fatalf("job.completed dead-lettered without a verdict: %s", msg.Header.Get(bus.HeaderDLQReason))
		}
		if time.Now().After(deadline) {
			t.Fatalf("neither a verdict nor a dead letter for %s", j.id)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
