package projections

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/loopbus/loopbus/schemas"
)

// Test fixtures: the writing-kit pipeline (summary → ideas → writing-kit)
// and a builder of realistic event sequences with fixed times and sequences.

const (
	sessionID    = "wk-20261122-talk"
	otherSession = "wk-20261122-other"
)

// The fixtures hash with these local helpers rather than the schemas
// package's, so the goldens depend on nothing but the fold.

// testID derives a 32-hex id from parts (event and job ids).
func testID(parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		fmt.Fprintf(h, "%d:%s", len(p), p)
	}
	return hex.EncodeToString(h.Sum(nil)[:16])
}

// digest returns "sha256:<hex>" of b.
func digest(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// shortHash returns the first 16 hex digits of a digest.
func shortHash(d string) string { return d[len("sha256:"):][:16] }

// contentHash returns 16 hex digits identifying arts: the short hash of a
// single artifact, else of its "name digest" lines.
func contentHash(arts []schemas.ArtifactRef) string {
	if len(arts) == 1 {
		return shortHash(arts[0].Digest)
	}
	var lines string
	for _, a := range arts {
		lines += a.Name + " " + a.Digest + "\n"
	}
	return shortHash(digest([]byte(lines)))
}

// t0 is the time of sequence 0; event n happens n seconds later.
var t0 = time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)

var inputBytes = []byte("# Event-sourced agents\n\nA talk about replaying pipelines from a log.\n")

func inputRef(session string) schemas.ArtifactRef {
	return schemas.ArtifactRef{
		Name:        "talk.md",
		Object:      session + "/input/talk.md",
		Digest:      digest(inputBytes),
		Size:        int64(len(inputBytes)),
		ContentType: "text/markdown",
	}
}

func agentSpec(role string) schemas.AgentSpec {
	return schemas.AgentSpec{Backend: "exec", Command: []string{"./agents/run.sh", role}}
}

func writingKitPipeline() schemas.Pipeline {
	schema := func(title string) json.RawMessage {
		return json.RawMessage(`{"$schema":"https://json-schema.org/draft/2020-12/schema","version":"` + title + `-v1","type":"object"}`)
	}
	return schemas.Pipeline{
		Name:   "writing-kit",
		Source: "pipelines/writing-kit.yaml",
		Dir:    "/srv/loopbus/pipelines",
		Steps: []schemas.Step{
			{
				Name:          "summary",
				Agent:         agentSpec("summarizer"),
				Prompt:        "Summarise the talk in talk.md into summary.json.",
				Outputs:       []schemas.Output{{Name: "summary.json", SchemaPath: "schemas/summary.json", Schema: schema("summary"), SchemaVersion: "summary-v1"}},
				MaxIterations: 3,
				TimeoutMs:     600000,
				Line:          4,
			},
			{
				Name:          "ideas",
				Agent:         agentSpec("ideator"),
				Prompt:        "From summary.json, propose five article ideas in ideas.json.",
				Requires:      []string{"summary"},
				Outputs:       []schemas.Output{{Name: "ideas.json", SchemaPath: "schemas/ideas.json", Schema: schema("ideas"), SchemaVersion: "ideas-v1"}},
				Validate:      []string{"./checks/ideas-unique.sh"},
				MaxIterations: 3,
				TimeoutMs:     600000,
				Line:          14,
			},
			{
				Name:          "writing-kit",
				Agent:         agentSpec("writer"),
				Prompt:        "Write the writing kit for the best idea.",
				Requires:      []string{"summary", "ideas"},
				Outputs:       []schemas.Output{{Name: "writing-kit.md"}},
				MaxIterations: 2,
				TimeoutMs:     900000,
				Final:         true,
				Line:          26,
			},
		},
	}
}

// artifact returns the reference to an output of step stored by iteration.
func artifact(session, step string, iteration int, name, content string) schemas.ArtifactRef {
	ct := "application/json"
	if name == "writing-kit.md" {
		ct = "text/markdown"
	}
	return schemas.ArtifactRef{
		Name:        name,
		Object:      fmt.Sprintf("%s/%s/%d/%s", session, step, iteration, name),
		Digest:      digest([]byte(content)),
		Size:        int64(len(content)),
		ContentType: ct,
		Step:        step,
	}
}

func jobID(session, step string, iteration int) string {
	return testID(session, "job", step, strconv.Itoa(iteration))
}

// builder appends events with consecutive stream sequences 1, 2, ... and
// times t0 + seq seconds. Sequences are shared by all sessions, as in the
// one JetStream stream holding every session.
type builder struct {
	seq uint64
	evs []schemas.Event
}

func (b *builder) add(session, typ, step, job string, data any) schemas.Event {
	b.seq++
	ev := schemas.Event{
		ID:          testID(session, typ, step, job, strconv.FormatUint(b.seq, 10)),
		Source:      "loopbus/test",
		Type:        typ,
		Session:     session,
		Step:        step,
		Job:         job,
		Correlation: session,
		Time:        t0.Add(time.Duration(b.seq) * time.Second),
		Data:        data,
		Seq:         b.seq,
	}
	b.evs = append(b.evs, ev)
	return ev
}

func (b *builder) start(session string) {
	in := inputRef(session)
	b.add(session, schemas.TypeSessionStarted, "", "", &schemas.SessionStarted{
		Pipeline:   writingKitPipeline(),
		Input:      in,
		SourceHash: shortHash(in.Digest),
	})
}

// request emits job.requested for iteration of step and returns the job id.
func (b *builder) request(session, step string, iteration int, fb ...schemas.Feedback) string {
	id := jobID(session, step, iteration)
	var st schemas.Step
	for _, s := range writingKitPipeline().Steps {
		if s.Name == step {
			st = s
		}
	}
	b.add(session, schemas.TypeJobRequested, step, id, &schemas.JobRequested{
		JobID:     id,
		Step:      step,
		Iteration: iteration,
		Attempt:   1,
		Agent:     st.Agent,
		Prompt:    st.Prompt,
		Inputs:    []schemas.ArtifactRef{inputRef(session)},
		Outputs:   st.Outputs,
		Validate:  st.Validate,
		TimeoutMs: st.TimeoutMs,
		Dir:       "/srv/loopbus/pipelines",
		Feedback:  fb,
	})
	return id
}

func (b *builder) jobStarted(session, step, job, worker string) {
	b.add(session, schemas.TypeJobStarted, step, job, &schemas.JobStarted{JobID: job, Worker: worker, Delivery: 1})
}

func (b *builder) tool(session, step, job string) {
	b.add(session, schemas.TypeToolStarted, step, job, &schemas.ToolStarted{JobID: job, ToolID: job + "-t1", Name: "exec"})
	b.add(session, schemas.TypeToolCompleted, step, job, &schemas.ToolCompleted{JobID: job, ToolID: job + "-t1", Name: "exec", Status: "ok", DurationMs: 41250})
}

func (b *builder) jobCompleted(session, step, job, worker string, iteration int, arts ...schemas.ArtifactRef) {
	for _, a := range arts {
		b.add(session, schemas.TypeArtifactStored, step, job, &schemas.ArtifactStored{JobID: job, Artifact: a})
	}
	b.add(session, schemas.TypeJobCompleted, step, job, &schemas.JobCompleted{
		JobID: job, Step: step, Iteration: iteration, RequestSeq: 2, Worker: worker,
		DurationMs: 41310, Artifacts: arts, Usage: &schemas.Usage{InputTokens: 5120, OutputTokens: 830},
	})
}

func (b *builder) jobFailed(session, step, job, worker string, iteration int, msg string) {
	b.add(session, schemas.TypeJobFailed, step, job, &schemas.JobFailed{
		JobID: job, Step: step, Iteration: iteration, Worker: worker, ExitCode: 1, DurationMs: 3120, Error: msg,
		OutputTail: "Error: 429 Too Many Requests",
	})
}

func (b *builder) passed(session, step, job string, iteration int, arts ...schemas.ArtifactRef) {
	b.add(session, schemas.TypeValidationPassed, step, job, &schemas.Verdict{JobID: job, Step: step, Iteration: iteration, Artifacts: arts})
}

func (b *builder) failedValidation(session, step, job string, iteration int, hint string, errs []schemas.ValidationError, arts ...schemas.ArtifactRef) {
	b.add(session, schemas.TypeValidationFailed, step, job, &schemas.Verdict{
		JobID: job, Step: step, Iteration: iteration, Artifacts: arts, Errors: errs, RetryHint: hint,
	})
}

func (b *builder) stepCompleted(session, step, job string, iterations int, version string, arts ...schemas.ArtifactRef) {
	b.add(session, schemas.TypeStepCompleted, step, job, &schemas.StepCompleted{
		Step: step, JobID: job, Iterations: iterations, Artifacts: arts,
		ContentHash: contentHash(arts), SchemaVersion: version,
	})
}

func (b *builder) stepFailed(session, step string, iterations int, msg string) {
	b.add(session, schemas.TypeStepFailed, step, "", &schemas.StepFailed{Step: step, Iterations: iterations, Error: msg})
}

func (b *builder) sessionCompleted(session string, final ...schemas.ArtifactRef) {
	b.add(session, schemas.TypeSessionCompleted, "", "", &schemas.SessionCompleted{Final: final})
}

func (b *builder) sessionFailed(session, step, reason string) {
	b.add(session, schemas.TypeSessionFailed, "", "", &schemas.SessionFailed{Step: step, Reason: reason})
}

// runStep emits one successful iteration of step, from job.requested to
// step.completed, and returns the step's artifacts.
func (b *builder) runStep(session, step, worker string, iteration int, name, content, version string) []schemas.ArtifactRef {
	job := b.request(session, step, iteration)
	b.jobStarted(session, step, job, worker)
	a := artifact(session, step, iteration, name, content)
	b.jobCompleted(session, step, job, worker, iteration, a)
	b.passed(session, step, job, iteration, a)
	b.stepCompleted(session, step, job, iteration, version, a)
	return []schemas.ArtifactRef{a}
}

const (
	summaryJSON = `{"title":"Event-sourced agents","points":["replay","idempotence"]}`
	ideasJSON   = `{"ideas":[{"title":"Replay is a feature"},{"title":"Folds not fetches"},{"title":"Idempotent by seq"},{"title":"Logs as contracts"},{"title":"Crash, then resume"}]}`
	ideasBad    = `{"ideas":[{"title":"Replay is a feature"},{"headline":"Folds not fetches"},{"title":"Idempotent by seq"}]}`
	kitMD       = "# Writing kit: Replay is a feature\n\n## Outline\n..."
)

// ideasErrors is a realistic failed verdict of ideas.json.
var ideasErrors = []schemas.ValidationError{
	{Artifact: "ideas.json", Pointer: "/ideas", Message: "minItems: got 3, want 5", Source: "schema"},
	{Artifact: "ideas.json", Pointer: "/ideas/1", Message: "missing property 'title'", Source: "schema"},
}

const ideasHint = "Return exactly five ideas, each an object with a \"title\" string."

// Event sequences, one per golden case.

func happyPath() []schemas.Event {
	var b builder
	b.start(sessionID)
	job := b.request(sessionID, "summary", 1)
	b.jobStarted(sessionID, "summary", job, "worker-a")
	b.tool(sessionID, "summary", job)
	sum := artifact(sessionID, "summary", 1, "summary.json", summaryJSON)
	b.jobCompleted(sessionID, "summary", job, "worker-a", 1, sum)
	b.passed(sessionID, "summary", job, 1, sum)
	b.stepCompleted(sessionID, "summary", job, 1, "summary-v1", sum)
	b.runStep(sessionID, "ideas", "worker-b", 1, "ideas.json", ideasJSON, "ideas-v1")
	kit := b.runStep(sessionID, "writing-kit", "worker-a", 1, "writing-kit.md", kitMD, "")
	b.sessionCompleted(sessionID, kit...)
	return b.evs
}

func validationRetry() []schemas.Event {
	var b builder
	b.start(sessionID)
	b.runStep(sessionID, "summary", "worker-a", 1, "summary.json", summaryJSON, "summary-v1")
	job := b.request(sessionID, "ideas", 1)
	b.jobStarted(sessionID, "ideas", job, "worker-a")
	bad := artifact(sessionID, "ideas", 1, "ideas.json", ideasBad)
	b.jobCompleted(sessionID, "ideas", job, "worker-a", 1, bad)
	b.failedValidation(sessionID, "ideas", job, 1, ideasHint, ideasErrors, bad)
	fb := schemas.Feedback{Iteration: 1, Kind: "validation", Errors: ideasErrors, RetryHint: ideasHint}
	job = b.request(sessionID, "ideas", 2, fb)
	b.jobStarted(sessionID, "ideas", job, "worker-b")
	good := artifact(sessionID, "ideas", 2, "ideas.json", ideasJSON)
	b.jobCompleted(sessionID, "ideas", job, "worker-b", 2, good)
	b.passed(sessionID, "ideas", job, 2, good)
	b.stepCompleted(sessionID, "ideas", job, 2, "ideas-v1", good)
	return b.evs
}

func stepExhausted() []schemas.Event {
	var b builder
	b.start(sessionID)
	b.runStep(sessionID, "summary", "worker-a", 1, "summary.json", summaryJSON, "summary-v1")
	var fb []schemas.Feedback
	for it := 1; it <= 3; it++ {
		job := b.request(sessionID, "ideas", it, fb...)
		b.jobStarted(sessionID, "ideas", job, "worker-a")
		bad := artifact(sessionID, "ideas", it, "ideas.json", ideasBad+strconv.Itoa(it))
		b.jobCompleted(sessionID, "ideas", job, "worker-a", it, bad)
		errs := ideasErrors[:1]
		if it == 3 {
			errs = []schemas.ValidationError{{Artifact: "ideas.json", Pointer: "", Message: "not valid JSON: unexpected end of input", Source: "schema"}}
		}
		b.failedValidation(sessionID, "ideas", job, it, ideasHint, errs, bad)
		fb = append(fb, schemas.Feedback{Iteration: it, Kind: "validation", Errors: errs, RetryHint: ideasHint})
	}
	b.stepFailed(sessionID, "ideas", 3, "validation failed in all 3 iterations")
	b.sessionFailed(sessionID, "ideas", "step ideas failed: validation failed in all 3 iterations")
	return b.evs
}

const rateLimited = "agent exited with status 1:\nError: 429 Too Many Requests\n\n  rate limit exceeded, retry after 30s"

func jobFailedCase() []schemas.Event {
	var b builder
	b.start(sessionID)
	job1 := b.request(sessionID, "summary", 1)
	b.jobStarted(sessionID, "summary", job1, "worker-a")
	b.jobFailed(sessionID, "summary", job1, "worker-a", 1, rateLimited)
	fb := schemas.Feedback{Iteration: 1, Kind: "job", Message: rateLimited}
	job2 := b.request(sessionID, "summary", 2, fb)
	b.jobStarted(sessionID, "summary", job2, "worker-b")
	// A late failure of the superseded job is not the current job's feedback.
	b.jobFailed(sessionID, "summary", job1, "worker-c", 1, "worker lost its lease")
	return b.evs
}

// duplicateEvents is validationRetry with old events delivered again.
func duplicateEvents() []schemas.Event {
	evs := validationRetry()
	last := evs[len(evs)-1]
	// The first job.requested of ideas and its failed verdict, replayed.
	var again []schemas.Event
	for _, ev := range evs {
		if ev.Step == "ideas" && (ev.Type == schemas.TypeJobRequested || ev.Type == schemas.TypeValidationFailed) {
			again = append(again, ev)
			break
		}
	}
	for _, ev := range evs {
		if ev.Type == schemas.TypeValidationFailed {
			again = append(again, ev)
		}
	}
	again = append(again, evs[0], last) // session.started and the newest event
	return append(evs, again...)
}

func otherSessionInterleaved() []schemas.Event {
	var b builder
	b.start(sessionID)
	b.start(otherSession)
	job := b.request(sessionID, "summary", 1)
	other := b.request(otherSession, "summary", 1)
	b.jobStarted(otherSession, "summary", other, "worker-z")
	b.jobStarted(sessionID, "summary", job, "worker-a")
	b.jobFailed(otherSession, "summary", other, "worker-z", 1, "agent timed out after 600s")
	b.stepFailed(otherSession, "summary", 1, "agent timed out after 600s")
	b.sessionFailed(otherSession, "summary", "step summary failed")
	// The other session's job id, on this session's subject: still ignored.
	b.add(otherSession, schemas.TypeJobStarted, "summary", job, &schemas.JobStarted{JobID: job, Worker: "worker-z", Delivery: 2})
	sum := artifact(sessionID, "summary", 1, "summary.json", summaryJSON)
	b.jobCompleted(sessionID, "summary", job, "worker-a", 1, sum)
	b.passed(sessionID, "summary", job, 1, sum)
	b.stepCompleted(sessionID, "summary", job, 1, "summary-v1", sum)
	b.sessionCompleted(otherSession)
	return b.evs
}

func beforeStarted() []schemas.Event {
	var b builder
	// A reader that joined mid-stream, or events published out of order:
	// nothing to fold into until session.started.
	early := b.request(sessionID, "summary", 1)
	b.jobStarted(sessionID, "summary", early, "worker-early")
	b.stepFailed(sessionID, "summary", 1, "ghost failure")
	b.start(sessionID)
	job := b.request(sessionID, "summary", 1)
	b.jobStarted(sessionID, "summary", job, "worker-a")
	return b.evs
}

func onlyBeforeStarted() []schemas.Event {
	return beforeStarted()[:3]
}
