package orchestrator

import (
	"bytes"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"text/template"
	"time"

	"github.com/loopbus/loopbus/schemas"
)

// Decide returns the events that should follow, given st with trigger
// already applied. It is level-triggered: it looks at the whole session, not
// only at the trigger, so a decision lost to a crash or to a concurrent
// writer is made again on the next event. It does not change st. Event ids
// are derived from the session's logical position (step, iteration), so a
// repeated decision de-duplicates. trigger supplies causation; now supplies
// the event time.
func Decide(st *State, trigger schemas.Event, now time.Time) []schemas.Event {
	orig := st.Sessions[trigger.Session]
	if orig == nil || orig.terminal() {
		return nil
	}
	s := orig.clone()
	var out []schemas.Event
	emit := func(typ, step string, data any, idParts ...string) {
		ev := schemas.Event{
			ID:          schemas.DeterministicID(append([]string{s.ID, typ}, idParts...)...),
			Type:        typ,
			Session:     s.ID,
			Step:        step,
			Causation:   trigger.ID,
			Correlation: s.StartID,
			Time:        now,
			Data:        data,
		}
		if jr, ok := data.(*schemas.JobRequested); ok {
			ev.Job = jr.JobID
		}
		evolveSession(s, ev)
		out = append(out, ev)
	}
	fail := func(step string, iterations int, reason string) {
		emit(schemas.TypeStepFailed, step, &schemas.StepFailed{Step: step, Iterations: iterations, Error: reason}, step)
		emit(schemas.TypeSessionFailed, "", &schemas.SessionFailed{Step: step, Reason: fmt.Sprintf("step %s failed: %s", step, reason)})
	}
	request := func(st *Step, iteration, attempt int, feedback []schemas.Feedback) bool {
		jr, err := jobRequest(s, st, iteration, attempt, feedback)
		if err != nil {
			fail(st.Def.Name, st.Iteration, err.Error())
			return false
		}
		idParts := []string{st.Def.Name, strconv.Itoa(iteration)}
		if attempt > 1 {
			idParts = append(idParts, "attempt", strconv.Itoa(attempt))
		}
		emit(schemas.TypeJobRequested, st.Def.Name, jr, idParts...)
		return true
	}

	for changed := true; changed && !s.terminal(); {
		changed = false
		for _, name := range s.stepNames() {
			st := s.Steps[name]
			switch {
			case st.Status == StepRunning && st.Outcome == outcomePassed:
				emit(schemas.TypeStepCompleted, name, &schemas.StepCompleted{
					Step: name, JobID: st.JobID, Iterations: st.Iteration, Artifacts: st.Passed,
					ContentHash: schemas.ContentHash(st.Passed), SchemaVersion: stepSchemaVersion(st.Def),
				}, name)
				changed = true
			case st.Status == StepRunning && st.Outcome == outcomeFailed && st.Retryable && st.Attempt < MaxAttempts:
				// Not the agent's fault (an input could not be fetched, its
				// workers kept dying): run the same iteration again.
				if !request(st, st.Iteration, st.Attempt+1, st.Feedback) {
					return out
				}
				changed = true
			case st.Status == StepRunning && st.Outcome == outcomeFailed:
				if st.Iteration >= st.Def.MaxIterations {
					fail(name, st.Iteration, exhausted(st))
					return out
				}
				fb := schemas.BoundFeedback(slices.Concat(st.Feedback, []schemas.Feedback{*st.Failure}))
				if !request(st, st.Iteration+1, 1, fb) {
					return out
				}
				changed = true
			case st.Status == StepPending && s.ready(st):
				if !request(st, 1, 1, nil) {
					return out
				}
				changed = true
			}
		}
		if !changed && s.allCompleted() {
			emit(schemas.TypeSessionCompleted, "", &schemas.SessionCompleted{Final: s.finalArtifacts()})
		}
	}
	return out
}

func (s *Session) ready(st *Step) bool {
	for _, r := range st.Def.Requires {
		if dep := s.Steps[r]; dep == nil || dep.Status != StepCompleted {
			return false
		}
	}
	return true
}

func (s *Session) allCompleted() bool {
	for _, st := range s.Steps {
		if st.Status != StepCompleted {
			return false
		}
	}
	return len(s.Steps) > 0
}

func (s *Session) finalArtifacts() []schemas.ArtifactRef {
	for _, d := range s.Pipeline.Steps {
		if d.Final {
			return s.Steps[d.Name].Artifacts
		}
	}
	last := s.Pipeline.Steps[len(s.Pipeline.Steps)-1].Name
	return s.Steps[last].Artifacts
}

func exhausted(st *Step) string {
	f := st.Failure
	var detail string
	switch {
	case f == nil:
	case len(f.Errors) > 0:
		parts := make([]string, 0, len(f.Errors))
		for _, e := range f.Errors {
			parts = append(parts, e.String())
		}
		detail = strings.Join(parts, "; ")
	default:
		detail = firstLine(f.Message)
	}
	return fmt.Sprintf("no valid output after %d of %d iterations; last error: %s", st.Iteration, st.Def.MaxIterations, detail)
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

func stepSchemaVersion(d schemas.Step) string {
	var vs []string
	for _, o := range d.Outputs {
		if o.SchemaVersion != "" {
			vs = append(vs, o.SchemaVersion)
		}
	}
	return strings.Join(vs, ",")
}

// MaxAttempts bounds how often one iteration is requested after retryable
// job failures.
const MaxAttempts = 3

// MaxPromptBytes bounds a rendered prompt; the job.requested carrying it,
// JSON-escaped, with bounded feedback, must stay under bus.MaxEventBytes
// (512 KiB). A prompt with many characters JSON escapes six-fold can still
// exceed it: the session then fails with the reason (see Unrecordable).
const MaxPromptBytes = 128 << 10

// JobID names a job: session, step and iteration, and the attempt when it
// is not the first.
func JobID(session, step string, iteration, attempt int) string {
	id := session + "." + step + "." + strconv.Itoa(iteration)
	if attempt > 1 {
		id += ".a" + strconv.Itoa(attempt)
	}
	return id
}

// PromptData is what a step's prompt template sees.
type PromptData struct {
	Input     schemas.ArtifactRef
	Artifacts map[string]schemas.ArtifactRef
	// Feedback is the formatted failures of earlier iterations ("" at first).
	Feedback  string
	Iteration int
	Session   string
	Step      string
}

func jobRequest(s *Session, st *Step, iteration, attempt int, feedback []schemas.Feedback) (*schemas.JobRequested, error) {
	inputs := []schemas.ArtifactRef{s.Input}
	arts := map[string]schemas.ArtifactRef{}
	for _, r := range st.Def.Requires {
		for _, a := range s.Steps[r].Artifacts {
			inputs = append(inputs, a)
			arts[a.Name] = a
		}
	}
	data := PromptData{Input: s.Input, Artifacts: arts, Feedback: schemas.FormatFeedback(feedback), Iteration: iteration, Session: s.ID, Step: st.Def.Name}
	prompt, err := RenderPrompt(st.Def.Prompt, data)
	if err != nil {
		return nil, err
	}
	if len(prompt) > MaxPromptBytes {
		return nil, fmt.Errorf("the rendered prompt is %d bytes, over the %d-byte limit; pass large content as artifacts (files in in/) instead", len(prompt), MaxPromptBytes)
	}
	return &schemas.JobRequested{
		JobID: JobID(s.ID, st.Def.Name, iteration, attempt), Step: st.Def.Name, Iteration: iteration, Attempt: attempt,
		Agent: st.Def.Agent, Prompt: prompt, Inputs: inputs, Outputs: st.Def.Outputs,
		Validate: st.Def.Validate, TimeoutMs: st.Def.TimeoutMs, ValidateTimeoutMs: st.Def.ValidateTimeoutMs,
		Dir: s.Pipeline.Dir, Feedback: feedback,
	}, nil
}

// RenderPrompt executes a prompt template. When the template does not use
// .Feedback and there is feedback, it is appended under its own heading, so
// an agent always learns why its previous iteration failed.
func RenderPrompt(text string, data PromptData) (string, error) {
	t, err := template.New("prompt").Option("missingkey=error").Parse(text)
	if err != nil {
		return "", fmt.Errorf("prompt template: %w", err)
	}
	var b bytes.Buffer
	if err := t.Execute(&b, data); err != nil {
		return "", fmt.Errorf("prompt template: %w", err)
	}
	if data.Feedback != "" && !strings.Contains(text, ".Feedback") {
		b.WriteString("\n\n## Feedback from earlier iterations\n\n")
		b.WriteString(data.Feedback)
	}
	return b.String(), nil
}

// Unrecordable returns the events that end a session whose decision evs
// could not be written for a reason retrying cannot fix (the server refused
// it, or it does not encode): the step it concerned fails, and the session
// with it, so nobody waits for a decision that will never come. Like Decide
// it is pure and its ids are those of the ordinary failure events.
func Unrecordable(st *State, trigger schemas.Event, evs []schemas.Event, cause error, now time.Time) []schemas.Event {
	s := st.Sessions[trigger.Session]
	if s == nil || s.terminal() {
		return nil
	}
	step := ""
	types := make([]string, 0, len(evs))
	for _, ev := range evs {
		types = append(types, strings.TrimPrefix(ev.Type, "loopbus."))
		if step == "" && ev.Step != "" {
			step = ev.Step
		}
	}
	reason := fmt.Sprintf("the orchestrator could not record its decision (%s): %v", strings.Join(types, ", "), cause)
	mk := func(typ, stepName string, data any, idParts ...string) schemas.Event {
		return schemas.Event{
			ID: schemas.DeterministicID(append([]string{s.ID, typ}, idParts...)...), Type: typ, Session: s.ID, Step: stepName,
			Causation: trigger.ID, Correlation: s.StartID, Time: now, Data: data,
		}
	}
	var out []schemas.Event
	if st := s.Steps[step]; st != nil && st.Status != StepCompleted && st.Status != StepFailed {
		out = append(out, mk(schemas.TypeStepFailed, step, &schemas.StepFailed{Step: step, Iterations: st.Iteration, Error: reason}, step))
		reason = fmt.Sprintf("step %s failed: %s", step, reason)
	}
	return append(out, mk(schemas.TypeSessionFailed, "", &schemas.SessionFailed{Step: step, Reason: reason}))
}
