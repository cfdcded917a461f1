// Package projections holds loopbus's read models: views computed as pure
// folds over a session's events. A projection never does I/O and never reads
// the clock, so replaying the same events always yields the same view.
package projections

import (
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/loopbus/loopbus/schemas"
)

// ManifestVersion is the value of Manifest.Version.
const ManifestVersion = 1

// Session statuses (Manifest.Status).
const (
	StatusRunning   = "running"
	StatusCompleted = "completed"
	StatusFailed    = "failed"
)

// Step statuses (StepView.Status).
const (
	StepStatusPending    = "pending"
	StepStatusInProgress = "in_progress"
	StepStatusCompleted  = "completed"
	StepStatusFailed     = "failed"
)

// MaxFeedbackBytes bounds StepView.LastFeedback, in bytes.
const MaxFeedbackBytes = 2000

// Manifest is the session manifest view: the state of one session and of
// each of its steps, as folded from the session's events by FoldManifest.
type Manifest struct {
	// Version is the manifest format version, always ManifestVersion.
	Version int `json:"version"`
	// ContentID is the session id.
	ContentID string `json:"contentId"`
	// Pipeline is the pipeline name.
	Pipeline string `json:"pipeline"`
	// Status is StatusRunning, StatusCompleted or StatusFailed.
	Status    string    `json:"status"`
	CreatedAt time.Time `json:"createdAt"`
	UpdatedAt time.Time `json:"updatedAt"`
	// SourceHash is 16 hex digits of the input's sha-256.
	SourceHash string               `json:"sourceHash"`
	Input      *schemas.ArtifactRef `json:"input,omitempty"`
	// Steps maps each pipeline step name to its view. It holds exactly the
	// steps named in StepOrder.
	Steps map[string]*StepView `json:"steps"`
	// StepOrder lists the step names in pipeline file order, for display.
	StepOrder []string `json:"stepOrder"`
	// Final is the session's final artifacts, set by session.completed.
	Final []schemas.ArtifactRef `json:"final,omitempty"`
	// Error is the session failure reason, set by session.failed.
	Error string `json:"error,omitempty"`
	// FailedStep is the step session.failed blamed, if any.
	FailedStep string `json:"failedStep,omitempty"`
	// LastSeq is the stream sequence of the last event folded (0 when no
	// folded event came from the stream).
	LastSeq uint64 `json:"lastSeq"`
}

// StepView is the state of one step in a Manifest.
type StepView struct {
	// Status is one of the StepStatus constants.
	Status      string     `json:"status"`
	ContentHash string     `json:"contentHash,omitempty"`
	CompletedAt *time.Time `json:"completedAt,omitempty"`
	// ErrorMessage is the step.failed error; cleared by step.completed.
	ErrorMessage  string `json:"errorMessage,omitempty"`
	SchemaVersion string `json:"schemaVersion,omitempty"`
	// Iterations is the number of iterations used so far: the highest
	// iteration requested, or the count step.completed reported.
	Iterations int      `json:"iterations"`
	Requires   []string `json:"requires,omitempty"`
	Final      bool     `json:"final,omitempty"`
	// JobID is the current (or last) job of the step.
	JobID string `json:"jobId,omitempty"`
	// Worker is the worker that took the current job.
	Worker string `json:"worker,omitempty"`
	// Artifacts is the step's validated outputs, once completed.
	Artifacts []schemas.ArtifactRef `json:"artifacts,omitempty"`
	// LastFeedback summarises the newest failed verdict or job error of the
	// step in one paragraph of at most MaxFeedbackBytes bytes.
	LastFeedback string `json:"lastFeedback,omitempty"`
}

// FoldManifest applies one event to m and returns the result.
//
// m is nil before the session's session.started: a session.started event
// then creates the manifest (for ev.Session), and any other event returns
// nil. Once m exists, events whose Session differs from m.ContentID are
// ignored, as are events with Seq != 0 and Seq <= m.LastSeq (so re-applying
// events after a crash is idempotent); ignored events return m unchanged.
// Every other event sets UpdatedAt to ev.Time (unless ev.Time is zero) and,
// when ev.Seq != 0, LastSeq to ev.Seq; event types that do not concern the
// manifest, and a repeated session.started, change nothing else. LastSeq
// therefore never decreases.
//
// The fold is tolerant: data of an unexpected Go type (the registered
// pointer type and the plain struct are both accepted), nil data and step
// names not in the pipeline are ignored rather than rejected, and it never
// panics.
//
// FoldManifest is pure (no I/O, no clock) but not copy-on-write: it mutates
// m in place and returns it. Callers that need the previous state must Clone
// it first.
func FoldManifest(m *Manifest, ev schemas.Event) *Manifest {
	if m == nil {
		if ev.Type != schemas.TypeSessionStarted {
			return nil
		}
		return startManifest(ev)
	}
	if ev.Session != m.ContentID {
		return m
	}
	if ev.Seq != 0 && ev.Seq <= m.LastSeq {
		return m
	}
	if !ev.Time.IsZero() {
		m.UpdatedAt = ev.Time
	}
	if ev.Seq != 0 {
		m.LastSeq = ev.Seq
	}

	switch ev.Type {
	case schemas.TypeJobRequested:
		d, ok := dataAs[schemas.JobRequested](ev.Data)
		if !ok {
			return m
		}
		sv := m.step(orElse(d.Step, ev.Step))
		if sv == nil {
			return m
		}
		sv.Status = StepStatusInProgress
		sv.Iterations = max(sv.Iterations, d.Iteration)
		sv.JobID = orElse(d.JobID, ev.Job)
		sv.Worker = ""

	case schemas.TypeJobStarted:
		d, ok := dataAs[schemas.JobStarted](ev.Data)
		if !ok {
			return m
		}
		if sv := m.stepOfJob(orElse(d.JobID, ev.Job)); sv != nil {
			sv.Worker = d.Worker
		}

	case schemas.TypeValidationFailed:
		d, ok := dataAs[schemas.Verdict](ev.Data)
		if !ok {
			return m
		}
		if sv := m.stepOfJob(orElse(d.JobID, ev.Job)); sv != nil {
			sv.LastFeedback = verdictFeedback(d)
		}

	case schemas.TypeJobFailed:
		d, ok := dataAs[schemas.JobFailed](ev.Data)
		if !ok {
			return m
		}
		if sv := m.stepOfJob(orElse(d.JobID, ev.Job)); sv != nil {
			msg := d.Error
			if strings.TrimSpace(msg) == "" {
				msg = fmt.Sprintf("job failed (exit code %d)", d.ExitCode)
			}
			sv.LastFeedback = paragraph(msg)
		}

	case schemas.TypeStepCompleted:
		d, ok := dataAs[schemas.StepCompleted](ev.Data)
		if !ok {
			return m
		}
		sv := m.step(orElse(d.Step, ev.Step))
		if sv == nil {
			return m
		}
		sv.Status = StepStatusCompleted
		sv.ContentHash = d.ContentHash
		if !ev.Time.IsZero() {
			t := ev.Time
			sv.CompletedAt = &t
		}
		sv.SchemaVersion = d.SchemaVersion
		if d.Iterations > 0 {
			sv.Iterations = d.Iterations
		}
		if d.JobID != "" {
			sv.JobID = d.JobID
		}
		sv.Artifacts = slices.Clone(d.Artifacts)
		sv.ErrorMessage = ""

	case schemas.TypeStepFailed:
		d, ok := dataAs[schemas.StepFailed](ev.Data)
		if !ok {
			return m
		}
		sv := m.step(orElse(d.Step, ev.Step))
		if sv == nil {
			return m
		}
		sv.Status = StepStatusFailed
		sv.ErrorMessage = d.Error
		sv.Iterations = max(sv.Iterations, d.Iterations)

	case schemas.TypeSessionCompleted:
		m.Status = StatusCompleted
		if d, ok := dataAs[schemas.SessionCompleted](ev.Data); ok {
			m.Final = slices.Clone(d.Final)
		}

	case schemas.TypeSessionFailed:
		m.Status = StatusFailed
		if d, ok := dataAs[schemas.SessionFailed](ev.Data); ok {
			m.Error = d.Reason
			m.FailedStep = d.Step
		}
	}
	return m
}

// BuildManifest folds the events of session in order, starting from nil,
// and returns the manifest; nil if no session.started of session is among
// them. Events of other sessions are skipped.
func BuildManifest(session string, evs []schemas.Event) *Manifest {
	var m *Manifest
	for _, ev := range evs {
		if ev.Session != session {
			continue
		}
		m = FoldManifest(m, ev)
	}
	return m
}

// startManifest creates the manifest from a session.started event.
func startManifest(ev schemas.Event) *Manifest {
	m := &Manifest{
		Version:   ManifestVersion,
		ContentID: ev.Session,
		Status:    StatusRunning,
		CreatedAt: ev.Time,
		UpdatedAt: ev.Time,
		Steps:     map[string]*StepView{},
		StepOrder: []string{},
		LastSeq:   ev.Seq,
	}
	d, ok := dataAs[schemas.SessionStarted](ev.Data)
	if !ok {
		return m
	}
	m.Pipeline = d.Pipeline.Name
	m.SourceHash = d.SourceHash
	if d.Input != (schemas.ArtifactRef{}) {
		in := d.Input
		m.Input = &in
	}
	for _, st := range d.Pipeline.Steps {
		if st.Name == "" || m.Steps[st.Name] != nil {
			continue // malformed pipeline: keep the first of duplicate names
		}
		m.Steps[st.Name] = &StepView{
			Status:   StepStatusPending,
			Requires: slices.Clone(st.Requires),
			Final:    st.Final,
		}
		m.StepOrder = append(m.StepOrder, st.Name)
	}
	return m
}

// step returns the view of a pipeline step, or nil for an unknown name.
func (m *Manifest) step(name string) *StepView {
	if name == "" {
		return nil
	}
	return m.Steps[name]
}

// stepOfJob returns the step whose current job is jobID, or nil. Steps are
// searched in file order so that the result is deterministic.
func (m *Manifest) stepOfJob(jobID string) *StepView {
	if jobID == "" {
		return nil
	}
	for _, name := range m.StepOrder {
		if sv := m.Steps[name]; sv != nil && sv.JobID == jobID {
			return sv
		}
	}
	return nil
}

// dataAs returns event data registered as *T; a plain T is accepted too.
// It reports false for nil or data of another type.
func dataAs[T any](data any) (*T, bool) {
	switch d := data.(type) {
	case *T:
		return d, d != nil
	case T:
		return &d, true
	}
	return nil, false
}

// orElse returns a, or b when a is empty.
func orElse(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// verdictFeedback summarises a failed verdict: "pointer: message; ..."
// (the root pointer written as "(root)"), then the retry hint.
func verdictFeedback(v *schemas.Verdict) string {
	var b strings.Builder
	for i, e := range v.Errors {
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(schemas.DisplayPointer(e.Pointer))
		b.WriteString(": ")
		b.WriteString(e.Message)
	}
	if b.Len() == 0 {
		b.WriteString("validation failed")
	}
	if h := strings.TrimSpace(v.RetryHint); h != "" {
		b.WriteString(". Retry hint: ")
		b.WriteString(h)
	}
	return paragraph(b.String())
}

// paragraph folds s into one paragraph (runs of white space, newlines
// included, become one space; invalid UTF-8 is replaced) and truncates it to
// MaxFeedbackBytes bytes on a rune boundary, ending with "…" when cut.
func paragraph(s string) string {
	s = strings.Join(strings.Fields(strings.ToValidUTF8(s, "\uFFFD")), " ")
	if len(s) <= MaxFeedbackBytes {
		return s
	}
	const ellipsis = "…"
	cut := MaxFeedbackBytes - len(ellipsis)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return strings.TrimRight(s[:cut], " ") + ellipsis
}
