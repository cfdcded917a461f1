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
	return b.requestRound(session, step, iteration, 0, nil, fb...)
}

// requestRound emits job.requested for iteration of step in a later round
// (after runs cut short), with info-signal hints, and returns the job id.
func (b *builder) requestRound(session, step string, iteration, round int, hints []string, fb ...schemas.Feedback) string {
	id := jobID(session, step, iteration)
	if round > 0 {
		id = testID(session, "job", step, strconv.Itoa(iteration), "round", strconv.Itoa(round))
	}
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
		Round:     round,
		Hints:     hints,
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
	b.jobCompletedUsage(session, step, job, worker, iteration, &schemas.Usage{InputTokens: 5120, OutputTokens: 830}, arts...)
}

// jobCompletedUsage is jobCompleted reporting usage u.
func (b *builder) jobCompletedUsage(session, step, job, worker string, iteration int, u *schemas.Usage, arts ...schemas.ArtifactRef) {
	for _, a := range arts {
		b.add(session, schemas.TypeArtifactStored, step, job, &schemas.ArtifactStored{JobID: job, Artifact: a})
	}
	b.add(session, schemas.TypeJobCompleted, step, job, &schemas.JobCompleted{
		JobID: job, Step: step, Iteration: iteration, RequestSeq: 2, Worker: worker,
		DurationMs: 41310, Artifacts: arts, Usage: u,
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

// jobRestarted: the summary job is started by worker-a, handed out again
// (worker-a was lost) and started by worker-b, which completes it.
func jobRestarted() []schemas.Event {
	var b builder
	b.start(sessionID)
	job := b.request(sessionID, "summary", 1)
	b.jobStarted(sessionID, "summary", job, "worker-a")
	b.add(sessionID, schemas.TypeJobStarted, "summary", job, &schemas.JobStarted{JobID: job, Worker: "worker-b", Delivery: 2})
	sum := artifact(sessionID, "summary", 1, "summary.json", summaryJSON)
	b.jobCompleted(sessionID, "summary", job, "worker-b", 1, sum)
	b.passed(sessionID, "summary", job, 1, sum)
	b.stepCompleted(sessionID, "summary", job, 1, "summary-v1", sum)
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

// Control events: signals and what the orchestrator records for them.

// signal emits signal.<verb> for the session (or one step) and returns its
// event id.
func (b *builder) signal(session, verb, step, reason, message string) string {
	ev := b.add(session, schemas.SignalTypes()[verb], step, "", &schemas.Signal{
		Target: session + map[bool]string{true: "/" + step}[step != ""], Step: step, Reason: reason, Message: message,
	})
	return ev.ID
}

func (b *builder) ack(session, signalID, verb, step, result, detail string) {
	b.add(session, schemas.TypeSignalAcknowledged, step, "", &schemas.SignalAcknowledged{
		SignalID: signalID, Signal: verb, Step: step, Result: result, Detail: detail,
	})
}

func (b *builder) cancel(session, step, job string, iteration int, reason string) {
	b.add(session, schemas.TypeJobCancelled, step, job, &schemas.JobCancelled{JobID: job, Step: step, Iteration: iteration, Reason: reason})
}

// killed is a worker's report of a cancelled job it killed.
func (b *builder) killed(session, step, job, worker string, iteration int, u *schemas.Usage) {
	b.add(session, schemas.TypeJobFailed, step, job, &schemas.JobFailed{
		JobID: job, Step: step, Iteration: iteration, Worker: worker, ExitCode: -1, DurationMs: 950,
		Error: "cancelled: agent killed", Cancelled: true, Usage: u,
	})
}

func (b *builder) stepPaused(session, step, kind, reason string) {
	b.add(session, schemas.TypeStepPaused, step, "", &schemas.StepPaused{Step: step, Kind: kind, Reason: reason})
}

func (b *builder) stepResumed(session, step, reason string) {
	b.add(session, schemas.TypeStepResumed, step, "", &schemas.StepResumed{Step: step, Reason: reason})
}

// resetAt is when the fixtures' usage limit lifts.
var resetAt = time.Date(2026, 11, 22, 15, 0, 0, 0, time.UTC)

// stopResume: a stop signal stops the session while summary runs (its job
// is cancelled and its worker reports the kill, with usage); a resume
// signal resumes it and summary runs iteration 1 again in round 1, with
// the hint an info signal gave meanwhile; then the session completes.
func stopResume() []schemas.Event {
	var b builder
	b.start(sessionID)
	job := b.request(sessionID, "summary", 1)
	b.jobStarted(sessionID, "summary", job, "worker-a")
	b.add(sessionID, schemas.TypeToolStarted, "summary", job, &schemas.ToolStarted{JobID: job, ToolID: "t1", Name: "Bash", Input: "ls -la"})
	stop := b.signal(sessionID, "stop", "", "wrong input file", "")
	b.add(sessionID, schemas.TypeSessionStopped, "", "", &schemas.SessionStopped{Kind: schemas.StopSignal, Reason: "wrong input file"})
	b.cancel(sessionID, "summary", job, 1, "session stopped: wrong input file")
	b.ack(sessionID, stop, "stop", "", schemas.SignalApplied, "session stopped; 1 job cancelled")
	b.killed(sessionID, "summary", job, "worker-a", 1, &schemas.Usage{InputTokens: 800, OutputTokens: 20, CostUSD: 0.004})
	info := b.signal(sessionID, "info", "summary", "", "The talk is about event sourcing, not CQRS.")
	b.ack(sessionID, info, "info", "summary", schemas.SignalApplied, "hint queued for summary's next job")
	// A resume while stopped resumes; a second one is ignored.
	resume := b.signal(sessionID, "resume", "", "input fixed", "")
	b.add(sessionID, schemas.TypeSessionResumed, "", "", &schemas.SessionResumed{Reason: "input fixed"})
	b.ack(sessionID, resume, "resume", "", schemas.SignalApplied, "session resumed")
	again := b.signal(sessionID, "resume", "", "", "")
	b.ack(sessionID, again, "resume", "", schemas.SignalIgnored, "session is running")
	job = b.requestRound(sessionID, "summary", 1, 1, []string{"The talk is about event sourcing, not CQRS."})
	b.jobStarted(sessionID, "summary", job, "worker-b")
	sum := artifact(sessionID, "summary", 1, "summary.json", summaryJSON)
	b.jobCompletedUsage(sessionID, "summary", job, "worker-b", 1, &schemas.Usage{InputTokens: 5120, OutputTokens: 830, CostUSD: 0.0312}, sum)
	b.passed(sessionID, "summary", job, 1, sum)
	b.stepCompleted(sessionID, "summary", job, 1, "summary-v1", sum)
	b.runStep(sessionID, "ideas", "worker-a", 1, "ideas.json", ideasJSON, "ideas-v1")
	// A pause and resume of the session between steps.
	b.add(sessionID, schemas.TypeSessionPaused, "", "", &schemas.SessionPaused{Reason: "lunch"})
	b.add(sessionID, schemas.TypeSessionResumed, "", "", &schemas.SessionResumed{})
	kit := b.runStep(sessionID, "writing-kit", "worker-a", 1, "writing-kit.md", kitMD, "")
	b.sessionCompleted(sessionID, kit...)
	return b.evs
}

// budgetPipeline is the writing-kit pipeline with a budget of $0.50.
func budgetPipeline() schemas.Pipeline {
	p := writingKitPipeline()
	p.Budget = &schemas.Budget{MaxCostUSD: 0.50, MaxIterations: 12}
	return p
}

// budgetStop: the pipeline's budget ($0.50, 12 runs) tightened by the
// session's ($0.10, 100000 tokens); ideas' first iteration runs over it
// and the session stops with kind budget, cancelling ideas' second job.
func budgetStop() []schemas.Event {
	var b builder
	in := inputRef(sessionID)
	b.add(sessionID, schemas.TypeSessionStarted, "", "", &schemas.SessionStarted{
		Pipeline: budgetPipeline(), Input: in, SourceHash: shortHash(in.Digest),
		Budget: &schemas.Budget{MaxCostUSD: 0.10, MaxTokens: 100000},
	})
	sum := artifact(sessionID, "summary", 1, "summary.json", summaryJSON)
	job := b.request(sessionID, "summary", 1)
	b.jobStarted(sessionID, "summary", job, "worker-a")
	b.jobCompletedUsage(sessionID, "summary", job, "worker-a", 1, &schemas.Usage{InputTokens: 20000, OutputTokens: 3000, CostUSD: 0.045}, sum)
	b.passed(sessionID, "summary", job, 1, sum)
	b.stepCompleted(sessionID, "summary", job, 1, "summary-v1", sum)
	job = b.request(sessionID, "ideas", 1)
	b.jobStarted(sessionID, "ideas", job, "worker-a")
	bad := artifact(sessionID, "ideas", 1, "ideas.json", ideasBad)
	b.jobCompletedUsage(sessionID, "ideas", job, "worker-a", 1, &schemas.Usage{InputTokens: 25000, OutputTokens: 4000, CostUSD: 0.06}, bad)
	b.failedValidation(sessionID, "ideas", job, 1, ideasHint, ideasErrors, bad)
	job = b.request(sessionID, "ideas", 2, schemas.Feedback{Iteration: 1, Kind: "validation", Errors: ideasErrors, RetryHint: ideasHint})
	b.jobStarted(sessionID, "ideas", job, "worker-b")
	b.add(sessionID, schemas.TypeSessionStopped, "", "", &schemas.SessionStopped{Kind: schemas.StopBudget, Reason: "cost $0.105 reached the budget of $0.10"})
	b.cancel(sessionID, "ideas", job, 2, "budget reached")
	b.killed(sessionID, "ideas", job, "worker-b", 2, nil)
	return b.evs
}

// rateLimitWait: summary's agent hits its usage limit; the step waits
// until the reset, then runs iteration 2 and completes.
func rateLimitWait() []schemas.Event {
	var b builder
	b.start(sessionID)
	job := b.request(sessionID, "summary", 1)
	b.jobStarted(sessionID, "summary", job, "worker-a")
	reset := resetAt
	b.add(sessionID, schemas.TypeJobFailed, "summary", job, &schemas.JobFailed{
		JobID: job, Step: "summary", Iteration: 1, Worker: "worker-a", ExitCode: 1, DurationMs: 2100,
		Error: "usage limit reached; resets at 15:00 UTC", RateLimited: true, ResetAt: &reset,
		Usage: &schemas.Usage{InputTokens: 310, OutputTokens: 12, CostUSD: 0.0021},
	})
	b.add(sessionID, schemas.TypeStepWaiting, "summary", job, &schemas.StepWaiting{Step: "summary", JobID: job, Until: resetAt, Reason: "usage limit"})
	b.runStep(sessionID, "summary", "worker-a", 2, "summary.json", summaryJSON, "summary-v1")
	// ideas waits too, and is still waiting.
	job = b.request(sessionID, "ideas", 1)
	b.jobFailed(sessionID, "ideas", job, "worker-b", 1, "429 Too Many Requests")
	b.add(sessionID, schemas.TypeStepWaiting, "ideas", job, &schemas.StepWaiting{Step: "ideas", JobID: job, Until: resetAt.Add(90 * time.Second), Reason: "rate limit"})
	return b.evs
}

// breakerOpenClose: ideas fails validation with the same errors twice in
// a row (a breaker set to trip after 2); the breaker opens; a resume
// signal closes it and the step passes on its third iteration. Then
// writing-kit is paused and resumed, and stopped while it runs.
func breakerOpenClose() []schemas.Event {
	var b builder
	b.start(sessionID)
	b.runStep(sessionID, "summary", "worker-a", 1, "summary.json", summaryJSON, "summary-v1")
	var fb []schemas.Feedback
	for it := 1; it <= 2; it++ {
		job := b.request(sessionID, "ideas", it, fb...)
		b.jobStarted(sessionID, "ideas", job, "worker-a")
		bad := artifact(sessionID, "ideas", it, "ideas.json", ideasBad)
		b.jobCompleted(sessionID, "ideas", job, "worker-a", it, bad)
		b.failedValidation(sessionID, "ideas", job, it, ideasHint, ideasErrors, bad)
		fb = append(fb, schemas.Feedback{Iteration: it, Kind: "validation", Errors: ideasErrors, RetryHint: ideasHint})
	}
	b.stepPaused(sessionID, "ideas", schemas.PauseBreaker, "no progress: 2 iterations in a row with the same errors and unchanged outputs")
	resume := b.signal(sessionID, "resume", "ideas", "schema fixed", "")
	b.stepResumed(sessionID, "ideas", "schema fixed")
	b.ack(sessionID, resume, "resume", "ideas", schemas.SignalApplied, "breaker closed")
	b.runStep(sessionID, "ideas", "worker-b", 3, "ideas.json", ideasJSON, "ideas-v1")
	// A paused and a stopped step, each resumed.
	b.stepPaused(sessionID, "writing-kit", schemas.PauseSignal, "review the ideas first")
	b.stepResumed(sessionID, "writing-kit", "")
	job := b.request(sessionID, "writing-kit", 1)
	b.stepPaused(sessionID, "writing-kit", schemas.PauseStop, "wrong tone")
	b.cancel(sessionID, "writing-kit", job, 1, "step stopped: wrong tone")
	return b.evs
}

// invalidation: summary and ideas complete; an invalidate signal for
// summary invalidates it and ideas (which requires it); summary runs again
// from iteration 1 in round 1.
func invalidation() []schemas.Event {
	var b builder
	b.start(sessionID)
	b.runStep(sessionID, "summary", "worker-a", 1, "summary.json", summaryJSON, "summary-v1")
	b.runStep(sessionID, "ideas", "worker-a", 1, "ideas.json", ideasJSON, "ideas-v1")
	job := b.request(sessionID, "writing-kit", 1)
	b.jobStarted(sessionID, "writing-kit", job, "worker-b")
	inv := b.signal(sessionID, "invalidate", "summary", "the talk was updated", "")
	b.add(sessionID, schemas.TypeStepInvalidated, "summary", "", &schemas.StepInvalidated{Step: "summary", Cause: "summary", Reason: "the talk was updated"})
	b.add(sessionID, schemas.TypeStepInvalidated, "ideas", "", &schemas.StepInvalidated{Step: "ideas", Cause: "summary", Reason: "the talk was updated"})
	b.add(sessionID, schemas.TypeStepInvalidated, "writing-kit", "", &schemas.StepInvalidated{Step: "writing-kit", Cause: "summary", Reason: "the talk was updated"})
	b.cancel(sessionID, "writing-kit", job, 1, "invalidated")
	b.ack(sessionID, inv, "invalidate", "summary", schemas.SignalApplied, "3 steps invalidated")
	job = b.requestRound(sessionID, "summary", 1, 1, nil)
	b.jobStarted(sessionID, "summary", job, "worker-a")
	return b.evs
}

// usageSums: usage summed per job, step and session; one job reports
// twice (the last report counts), a failed job's usage counts, a job
// without usage adds nothing.
func usageSums() []schemas.Event {
	var b builder
	b.start(sessionID)
	u := func(in, out int64, cost float64) *schemas.Usage {
		return &schemas.Usage{InputTokens: in, OutputTokens: out, CostUSD: cost}
	}
	job := b.request(sessionID, "summary", 1)
	b.jobStarted(sessionID, "summary", job, "worker-a")
	b.add(sessionID, schemas.TypeJobFailed, "summary", job, &schemas.JobFailed{
		JobID: job, Step: "summary", Iteration: 1, Worker: "worker-a", ExitCode: 2, Error: "agent crashed", Usage: u(1000, 100, 0.01),
	})
	job = b.request(sessionID, "summary", 2)
	b.jobStarted(sessionID, "summary", job, "worker-a")
	sum := artifact(sessionID, "summary", 2, "summary.json", summaryJSON)
	b.jobCompletedUsage(sessionID, "summary", job, "worker-a", 2, u(2000, 200, 0.1), sum)
	// Redelivered after a lost ack: the same job reports again, and only
	// its last report counts.
	b.jobStarted(sessionID, "summary", job, "worker-b")
	b.jobCompletedUsage(sessionID, "summary", job, "worker-b", 2, u(2100, 210, 0.2), sum)
	b.passed(sessionID, "summary", job, 2, sum)
	b.stepCompleted(sessionID, "summary", job, 2, "summary-v1", sum)
	job = b.request(sessionID, "ideas", 1)
	b.jobStarted(sessionID, "ideas", job, "worker-b")
	ideas := artifact(sessionID, "ideas", 1, "ideas.json", ideasJSON)
	b.jobCompletedUsage(sessionID, "ideas", job, "worker-b", 1, u(3000, 300, 0.1), ideas)
	b.passed(sessionID, "ideas", job, 1, ideas)
	b.stepCompleted(sessionID, "ideas", job, 1, "ideas-v1", ideas)
	job = b.request(sessionID, "writing-kit", 1)
	b.jobStarted(sessionID, "writing-kit", job, "worker-a")
	kit := artifact(sessionID, "writing-kit", 1, "writing-kit.md", kitMD)
	b.jobCompletedUsage(sessionID, "writing-kit", job, "worker-a", 1, nil, kit)
	b.passed(sessionID, "writing-kit", job, 1, kit)
	b.stepCompleted(sessionID, "writing-kit", job, 1, "", kit)
	b.sessionCompleted(sessionID, kit)
	return b.evs
}
