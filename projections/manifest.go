// Package projections holds loopbus's read models: views computed as pure
// folds over a session's events. A projection never does I/O and never reads
// the clock, so replaying the same events always yields the same view.
package projections

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/loopbus/loopbus/schemas"
)

// ManifestVersion is the value of Manifest.Version.
const ManifestVersion = 3

// Session statuses (Manifest.Status).
const (
	StatusRunning   = "running"
	StatusCompleted = "completed"
	StatusFailed    = "failed"
	// StatusPaused: session.paused; nothing new is dispatched.
	StatusPaused = "paused"
	// StatusStopped: session.stopped; running jobs were cancelled.
	StatusStopped = "stopped"
	// StatusClosed: session.closed ended the session for good.
	StatusClosed = "closed"
)

// Step statuses (StepView.Status).
const (
	StepStatusPending    = "pending"
	StepStatusInProgress = "in_progress"
	StepStatusCompleted  = "completed"
	StepStatusFailed     = "failed"
	// StepStatusPaused, StepStatusStopped and StepStatusBreaker: the step is
	// held by step.paused of kind pause, stop or breaker (StepView.Hold).
	StepStatusPaused  = "paused"
	StepStatusStopped = "stopped"
	StepStatusBreaker = "breaker"
	// StepStatusWaiting: the step waits for a usage or rate limit to lift
	// (StepView.Wait).
	StepStatusWaiting = "waiting"
	// StepStatusAwaitingApproval: the step's outputs passed and wait at its
	// approval gate for loopbus approve or reject (StepView.Approval).
	StepStatusAwaitingApproval = "awaiting_approval"
)

// Job statuses (JobView.Status).
const (
	JobStatusRequested = "requested"
	JobStatusRunning   = "running"
	JobStatusCompleted = "completed"
	JobStatusFailed    = "failed"
	JobStatusCancelled = "cancelled"
)

// MaxFeedbackBytes bounds StepView.LastFeedback, and every reason, detail
// and message the manifest keeps, in bytes.
const MaxFeedbackBytes = 2000

// MaxSignals bounds Manifest.Signals: only the newest are kept.
const MaxSignals = 20

// MaxHints bounds StepView.Hints: only the newest are kept.
const MaxHints = 10

// Manifest is the session manifest view: the state of one session and of
// each of its steps, as folded from the session's events by FoldManifest.
type Manifest struct {
	// Version is the manifest format version, always ManifestVersion.
	Version int `json:"version"`
	// ContentID is the session id.
	ContentID string `json:"contentId"`
	// Pipeline is the pipeline name.
	Pipeline string `json:"pipeline"`
	// Status is StatusRunning, StatusPaused, StatusStopped,
	// StatusCompleted, StatusFailed or StatusClosed.
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
	// Import is set for a session loopbus import made: it started paused
	// (Hold kind "import") and steps may show Imported.
	Import *schemas.ImportStart `json:"import,omitempty"`
	// Reruns counts the session.rerun events that reopened the session;
	// LastRerun is the newest (its step, "" for all, and reason).
	Reruns    int        `json:"reruns,omitempty"`
	LastRerun *RerunView `json:"lastRerun,omitempty"`
	// Restarts counts the jobs' starts after their first (the sum of
	// JobView.Restarts): each is an agent run again because its job was
	// handed out again (its worker was lost, or the cluster lost track
	// of it).
	Restarts int `json:"restarts,omitempty"`
	// ForkedFrom is the session this one is a fork of and the fork point
	// (session.forked); nil for a session that is no fork. A session's
	// own forks are not in its manifest (the origin stays untouched): they
	// are found from their session.forked events.
	ForkedFrom *ForkView `json:"forkedFrom,omitempty"`
	// Hold is why the session is paused or stopped; nil otherwise. Its kind
	// is "pause" (session.paused), "import" (an imported session waiting
	// for its first resume), or the kind of session.stopped: "signal" or
	// "budget".
	Hold *Hold `json:"hold,omitempty"`
	// Budget is the pipeline's budget tightened by the session's own
	// (schemas.Budget.Tighter); nil when neither bounds anything.
	Budget *schemas.Budget `json:"budget,omitempty"`
	// Usage sums the usage of every job (see Jobs); nil before any.
	Usage *schemas.Usage `json:"usage,omitempty"`
	// Jobs maps each job id to its view: every job requested, plus jobs
	// of pipeline steps that reported without a request folded.
	Jobs map[string]*JobView `json:"jobs,omitempty"`
	// Signals are the newest MaxSignals signals, oldest first, each with
	// its acknowledgement once the orchestrator gave it.
	Signals []SignalView `json:"signals,omitempty"`
	// Kind is "backlog" for a backlog session (empty for pipelines): its
	// steps are its task runs and role runs (bootstrap, repair, review),
	// added as they are selected. Phase is the backlog's phase. Kind is
	// "loops" for a loops session: its steps are its loops (see Loops),
	// added as they are spawned.
	Kind  string `json:"kind,omitempty"`
	Phase string `json:"phase,omitempty"`
	// MaxSummaryIterations is a backlog's iterations per task run (the
	// MaxIterations of its steps).
	MaxSummaryIterations int `json:"maxSummaryIterations,omitempty"`
	// BlockedTasks counts a backlog's tasks that were blocked when it
	// reached phase done: it completed, but not all its work is done.
	BlockedTasks int `json:"blockedTasks,omitempty"`
	// Loops are the loops of a loops session (Kind "loops"), in spawn
	// order (a loop spawned again keeps its place). Each runs as the step
	// named after its id, added to Steps when it is spawned.
	Loops []LoopView `json:"loops,omitempty"`
	// LoopLevels are a loops session's levels, in pipeline order: what a
	// spawned loop's step and branch are.
	LoopLevels []LoopLevelView `json:"loopLevels,omitempty"`
	// Target is the branch a loops session's loops are merged into; nil
	// for other sessions.
	Target *TargetView `json:"target,omitempty"`
	// LastSeq is the stream sequence of the last event folded (0 when no
	// folded event came from the stream).
	LastSeq uint64 `json:"lastSeq"`
	// CopiesOnly is set while every event folded was a copy (Event.ForkOf
	// set): the history of a fork before its session.forked. Only then
	// are copies and session.forked folded; once the session has an event
	// of its own, they are ignored (a copy or session.forked into a live
	// session is a forgery).
	CopiesOnly bool `json:"copiesOnly,omitempty"`
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
	// MaxIterations is the step's iteration limit from the pipeline.
	MaxIterations int `json:"maxIterations,omitempty"`
	// Round is the round of the step's newest job (see
	// schemas.JobRequested.Round).
	Round int `json:"round,omitempty"`
	// Hold is set while the step is held by step.paused; cleared by
	// step.resumed. It sets Status unless the step completed or failed.
	Hold *Hold `json:"hold,omitempty"`
	// Wait is set by step.waiting until the step's next job.requested.
	Wait *Wait `json:"wait,omitempty"`
	// Approval is set by approval.requested while the step waits at its
	// approval gate; cleared by its next job.requested or its end.
	Approval *ApprovalWait `json:"approval,omitempty"`
	// Usage sums the usage of the step's jobs; nil before any.
	Usage *schemas.Usage `json:"usage,omitempty"`
	// CancelledJobs counts the step's jobs job.cancelled cancelled.
	CancelledJobs int `json:"cancelledJobs,omitempty"`
	// Invalidations counts step.invalidated events of the step;
	// LastInvalidation is the newest.
	Invalidations    int           `json:"invalidations,omitempty"`
	LastInvalidation *Invalidation `json:"lastInvalidation,omitempty"`
	// HintsDelivered counts the info-signal messages delivered in the
	// step's prompts; Hints are the newest MaxHints of them, oldest first.
	HintsDelivered int    `json:"hintsDelivered,omitempty"`
	Hints          []Hint `json:"hints,omitempty"`
	// Imported marks a step step.imported completed: its outputs
	// (Artifacts, with their digests, and ContentHash) were produced
	// outside loopbus, and no agent of the session ran it.
	Imported bool `json:"imported,omitempty"`
	// Outputs are the names of the outputs the pipeline declares for the
	// step, sorted, in a session loopbus import started (the only ones
	// that take step.imported): an import must bring exactly these.
	Outputs []string `json:"outputs,omitempty"`
}

// Loop statuses (LoopView.Status).
const (
	// LoopStatusRunning: the loop's step runs, or waits to run (a held
	// loop shows in its step's view).
	LoopStatusRunning = "running"
	// LoopStatusMerging: the loop passed with changes; its commits wait
	// for (or are in) their merge into the target branch.
	LoopStatusMerging   = "merging"
	LoopStatusCompleted = "completed"
	LoopStatusFailed    = "failed"
	// LoopStatusInvalidated: an ancestor was invalidated or iterated
	// again; the loop no longer stands until it is spawned again.
	LoopStatusInvalidated = "invalidated"
)

// LoopView is one loop of a loops session.
type LoopView struct {
	ID     string `json:"id"`
	Parent string `json:"parent,omitempty"`
	Level  string `json:"level"`
	// Index is the loop's position among its siblings, from 1 (0 for the
	// root).
	Index int    `json:"index"`
	Title string `json:"title,omitempty"`
	// Status is one of the LoopStatus constants.
	Status string `json:"status"`
	// Iterations are its step's iterations.
	Iterations int `json:"iterations"`
	// Branch is the loop's git branch, loopbus/<session>/<loop>, for the
	// loops of worktree levels.
	Branch string `json:"branch,omitempty"`
	// MergeCommit is the target branch's head its merge made.
	MergeCommit string `json:"mergeCommit,omitempty"`
	// Commit is the commit of the loop's latest iteration (of its current
	// run); empty when that iteration changed nothing.
	Commit string `json:"commit,omitempty"`
	// Rebases counts the iterations it got because its merge conflicted.
	Rebases int `json:"rebases,omitempty"`
	// Generation counts the loop's earlier spawns.
	Generation int `json:"generation,omitempty"`
}

// LoopLevelView is a level of a loops session.
type LoopLevelView struct {
	Name          string `json:"name"`
	MaxIterations int    `json:"maxIterations"`
	// Worktree: the level's loops work in git worktrees and are merged
	// into the target branch.
	Worktree bool `json:"worktree,omitempty"`
}

// TargetView is the branch a loops session's loops are merged into.
type TargetView struct {
	// Branch is the target branch, loopbus/<session>; empty when no level
	// works in a worktree.
	Branch string `json:"branch,omitempty"`
	// Base is the branch it started from, BaseCommit that branch's commit
	// when the session started.
	Base       string `json:"base,omitempty"`
	BaseCommit string `json:"baseCommit,omitempty"`
	// Head is the newest loop.merged head, else BaseCommit.
	Head string `json:"head,omitempty"`
	// Merges counts loop.merged events.
	Merges int `json:"merges,omitempty"`
	// Bundles bring a repository to Head, in order: the session's base
	// bundle, then each merge's.
	Bundles []schemas.ArtifactRef `json:"bundles,omitempty"`
	// Repo names the repository (its directory's base name).
	Repo string `json:"repo,omitempty"`
	// Task is the first line of the session's task.
	Task string `json:"task,omitempty"`
	// Unmerged are the task runs of a backlog with workdir: repo whose current
	// job left changes not merged into Branch yet (the run goes on,
	// passed and waits to merge, or merges), in the order they came: a
	// fork runs them again (its target starts at Head).
	Unmerged []string `json:"unmerged,omitempty"`
}

// Hold says why a session or step is held.
type Hold struct {
	// Kind is, for a session, "pause", "import", "signal" or "budget"; for a step,
	// the kind of step.paused: "pause", "stop" or "breaker".
	Kind   string    `json:"kind"`
	Reason string    `json:"reason,omitempty"`
	Since  time.Time `json:"since,omitzero"`
	// Raised marks a session stopped by its budget whose budget was set
	// again since (session.budget): the orchestrator resumes it or
	// records the stop again.
	Raised bool `json:"raised,omitempty"`
}

// ApprovalWait is a step's wait at its approval gate (approval.requested).
type ApprovalWait struct {
	JobID string    `json:"jobId,omitempty"`
	Since time.Time `json:"since,omitzero"`
	// Until is when its timeout elapses, and OnTimeout what happens then;
	// both absent without a timeout.
	Until     *time.Time `json:"until,omitempty"`
	OnTimeout string     `json:"onTimeout,omitempty"`
}

// Wait is a step's wait for a usage or rate limit to lift (step.waiting).
type Wait struct {
	JobID  string    `json:"jobId,omitempty"`
	Until  time.Time `json:"until"`
	Reason string    `json:"reason,omitempty"`
}

// Invalidation is one step.invalidated: the step runs again from its
// first iteration.
type Invalidation struct {
	// Cause is the step the invalidation named (the step or one it
	// depends on).
	Cause  string    `json:"cause,omitempty"`
	Reason string    `json:"reason,omitempty"`
	At     time.Time `json:"at,omitzero"`
}

// Hint is an info-signal message delivered in a job's prompt.
type Hint struct {
	JobID     string `json:"jobId,omitempty"`
	Iteration int    `json:"iteration"`
	Message   string `json:"message"`
}

// JobView is one agent job: what it ran for, how it ended and what it
// used. A job cancelled by job.cancelled stays cancelled whatever its
// worker reports afterwards.
type JobView struct {
	Step      string `json:"step"`
	Iteration int    `json:"iteration,omitempty"`
	Round     int    `json:"round,omitempty"`
	// Status is one of the JobStatus constants.
	Status string `json:"status"`
	Worker string `json:"worker,omitempty"`
	// Restarts counts the job.started events of the job after its
	// first: each is the agent run again, by a worker the job was handed
	// out to again.
	Restarts int `json:"restarts,omitempty"`
	// Usage is the job's newest usage report: a job reported twice counts
	// once, with its last report.
	Usage *schemas.Usage `json:"usage,omitempty"`
	// Reason is why the job was cancelled.
	Reason string `json:"reason,omitempty"`
	// Merge marks a loop's merge job (job.requested with worktree.merge):
	// not an iteration of its step, which it leaves as it is.
	Merge bool `json:"merge,omitempty"`
	// Verdict is the validator's word on the outputs of a completed job:
	// VerdictPassed or VerdictFailed (its newest validation.passed or
	// validation.failed); empty before one. A job whose agent exited 0
	// but whose outputs failed validation is Status completed, Verdict
	// failed.
	Verdict string `json:"verdict,omitempty"`
}

// Job verdicts (JobView.Verdict).
const (
	VerdictPassed = "passed"
	VerdictFailed = "failed"
)

// SignalView is a signal (signal.*) and its acknowledgement.
type SignalView struct {
	// ID is the signal event's id; the acknowledgement names it.
	ID string `json:"id,omitempty"`
	// Signal is the verb: stop, pause, resume, info, invalidate, approve
	// or reject.
	Signal  string `json:"signal"`
	Step    string `json:"step,omitempty"`
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
	// By is who sent it, as the sender said (approve and reject).
	By string    `json:"by,omitempty"`
	At time.Time `json:"at,omitzero"`
	// Result is "applied" or "ignored" once acknowledged, else empty.
	Result         string    `json:"result,omitempty"`
	Detail         string    `json:"detail,omitempty"`
	AcknowledgedAt time.Time `json:"acknowledgedAt,omitzero"`
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
// Control events fold as the orchestrator means them: session.paused and
// session.stopped hold a running session (Status paused or stopped, Hold
// says why) until session.resumed; step.paused holds a step until
// step.resumed; step.waiting makes a step wait until its next
// job.requested; job.cancelled marks a job cancelled for good and puts its
// step back to pending with the iteration not used up; step.invalidated
// resets a step to pending at iteration 0, keeping its usage and counters.
// Usage is summed per job (a job's last report replaces earlier ones), per
// step and for the session. Signals are kept with their acknowledgement.
// In a loops session, loop.spawned adds a loop and its step (or starts
// both over), a merge job (job.requested with worktree.merge) is a job
// that leaves its loop's step alone, and loop.* and the steps' events set
// the loops' statuses and the target branch (see LoopView, TargetView).
// A completed or failed session or step is never held.
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
		m := startManifest(ev)
		m.CopiesOnly = ev.ForkOf != ""
		return m
	}
	if ev.Session != m.ContentID {
		return m
	}
	if ev.Seq != 0 && ev.Seq <= m.LastSeq {
		return m
	}
	// A fork's history begins with copies of its origin's events, folded
	// as they were; its session.forked applies as below. Copies and
	// session.forked after an event of the session's own are forgeries
	// (the orchestrator refuses them): they would end or reset it.
	if (ev.ForkOf != "" || ev.Type == schemas.TypeSessionForked) && !m.CopiesOnly {
		return m
	}
	if ev.ForkOf == "" {
		m.CopiesOnly = false
	}
	if !ev.Time.IsZero() {
		m.UpdatedAt = ev.Time
	}
	if ev.Seq != 0 {
		m.LastSeq = ev.Seq
	}

	switch ev.Type {
	case schemas.TypeTaskSelected:
		if d, ok := dataAs[schemas.TaskSelected](ev.Data); ok && m.Kind == schemas.KindBacklog {
			m.runStep(d.ID, m.MaxSummaryIterations)
		}
	case schemas.TypeBacklogPhase:
		if d, ok := dataAs[schemas.BacklogPhase](ev.Data); ok && m.Kind == schemas.KindBacklog {
			m.Phase = d.Phase
			if d.Phase == schemas.PhaseDone {
				m.BlockedTasks = d.Counts[schemas.TaskBlocked]
			}
			if d.Phase == schemas.PhaseBootstrap || d.Phase == schemas.PhaseRepair || d.Phase == schemas.PhaseReview {
				m.runStep(d.Phase, m.MaxSummaryIterations)
			}
		}
	case schemas.TypeLoopSpawned:
		if d, ok := dataAs[schemas.LoopSpawned](ev.Data); ok {
			m.loopSpawned(d)
		}
	case schemas.TypeLoopMerged:
		if d, ok := dataAs[schemas.LoopMerged](ev.Data); ok {
			m.loopMerged(d)
		}
	case schemas.TypeLoopRebase:
		if d, ok := dataAs[schemas.LoopRebase](ev.Data); ok {
			m.loopRebase(d)
		}
	case schemas.TypeLoopInvalidated:
		if d, ok := dataAs[schemas.LoopInvalidated](ev.Data); ok {
			if lp := m.loop(orElse(d.Loop, ev.Step)); lp != nil {
				lp.Status = LoopStatusInvalidated
			}
		}

	case schemas.TypeJobRequested:
		d, ok := dataAs[schemas.JobRequested](ev.Data)
		if !ok {
			return m
		}
		name := orElse(d.Step, ev.Step)
		sv := m.step(name)
		if sv == nil {
			return m
		}
		id := orElse(d.JobID, ev.Job)
		if d.Worktree != nil && d.Worktree.Merge {
			// A merge job: a job of the loop, not an iteration of its
			// step.
			if id != "" {
				if j := m.job(id, name); j.Step == name {
					j.Iteration, j.Round, j.Merge = d.Iteration, d.Round, true
				}
			}
			return m
		}
		sv.Status = StepStatusInProgress
		sv.Imported = false // the step runs: what it shows is no longer the import's
		sv.Iterations = max(sv.Iterations, d.Iteration)
		sv.JobID = id
		sv.Worker = ""
		sv.Round = d.Round
		sv.Wait, sv.Approval = nil, nil
		for _, h := range d.Hints {
			sv.HintsDelivered++
			sv.Hints = append(sv.Hints, Hint{JobID: id, Iteration: d.Iteration, Message: paragraph(h)})
		}
		if n := len(sv.Hints) - MaxHints; n > 0 {
			sv.Hints = slices.Delete(sv.Hints, 0, n)
		}
		if id != "" {
			// A job keeps the step it was first known for, so the
			// step's usage sum stays right.
			if j := m.job(id, name); j.Step == name {
				j.Iteration, j.Round = d.Iteration, d.Round
			}
		}
		m.settle(sv)
		m.syncLoop(name)

	case schemas.TypeJobStarted:
		d, ok := dataAs[schemas.JobStarted](ev.Data)
		if !ok {
			return m
		}
		id := orElse(d.JobID, ev.Job)
		if j := m.Jobs[id]; j != nil && id != "" {
			if j.Worker != "" { // started before
				j.Restarts++
				m.Restarts++
			}
			j.Worker = d.Worker
			if j.Status == JobStatusRequested {
				j.Status = JobStatusRunning
			}
		}
		if sv := m.stepOfJob(id); sv != nil {
			sv.Worker = d.Worker
		}

	case schemas.TypeJobCompleted:
		d, ok := dataAs[schemas.JobCompleted](ev.Data)
		if !ok {
			return m
		}
		id := orElse(d.JobID, ev.Job)
		m.jobEnded(id, orElse(d.Step, ev.Step), d.Iteration, JobStatusCompleted, d.Worker, d.Usage)
		if d.Git != nil {
			m.loopCommit(id, d.Git)
			m.runCommit(id, d.Git)
		}

	case schemas.TypeValidationFailed:
		d, ok := dataAs[schemas.Verdict](ev.Data)
		if !ok {
			return m
		}
		id := orElse(d.JobID, ev.Job)
		if j := m.Jobs[id]; j != nil && id != "" {
			j.Verdict = VerdictFailed
		}
		if sv := m.stepOfJob(id); sv != nil {
			sv.LastFeedback = verdictFeedback(d)
		}

	case schemas.TypeValidationPassed:
		d, ok := dataAs[schemas.Verdict](ev.Data)
		if !ok {
			return m
		}
		id := orElse(d.JobID, ev.Job)
		if j := m.Jobs[id]; j != nil && id != "" {
			j.Verdict = VerdictPassed
		}

	case schemas.TypeJobFailed:
		d, ok := dataAs[schemas.JobFailed](ev.Data)
		if !ok {
			return m
		}
		id := orElse(d.JobID, ev.Job)
		m.jobEnded(id, orElse(d.Step, ev.Step), d.Iteration, JobStatusFailed, d.Worker, d.Usage)
		// A cancelled job's kill report is not the step's feedback.
		if sv := m.stepOfJob(id); sv != nil && !d.Cancelled && !m.cancelled(id) {
			msg := d.Error
			if strings.TrimSpace(msg) == "" {
				msg = fmt.Sprintf("job failed (exit code %d)", d.ExitCode)
			}
			sv.LastFeedback = paragraph(msg)
		}

	case schemas.TypeJobCancelled:
		d, ok := dataAs[schemas.JobCancelled](ev.Data)
		if !ok {
			return m
		}
		id := orElse(d.JobID, ev.Job)
		name := orElse(d.Step, ev.Step)
		if j := m.Jobs[id]; j != nil {
			name = orElse(j.Step, name)
		}
		sv := m.step(name)
		if sv == nil || id == "" {
			return m
		}
		j := m.job(id, name)
		if j.Status == JobStatusCancelled {
			return m // told twice
		}
		j.Status, j.Reason = JobStatusCancelled, paragraph(d.Reason)
		if j.Merge {
			return m // not an iteration of the step
		}
		if j.Iteration == 0 {
			j.Iteration = d.Iteration
		}
		sv.CancelledJobs++
		if sv.JobID == id && sv.Status != StepStatusCompleted && sv.Status != StepStatusFailed {
			// The cancelled iteration runs again: it is not used up.
			sv.Iterations = min(sv.Iterations, max(j.Iteration-1, 0))
			sv.Worker = ""
			m.settle(sv)
			m.syncLoop(name)
		}

	case schemas.TypeStepWaiting:
		d, ok := dataAs[schemas.StepWaiting](ev.Data)
		if !ok {
			return m
		}
		sv := m.step(orElse(d.Step, ev.Step))
		if sv == nil {
			return m
		}
		sv.Wait = &Wait{JobID: orElse(d.JobID, ev.Job), Until: d.Until, Reason: paragraph(d.Reason)}
		m.settle(sv)

	case schemas.TypeApprovalRequested:
		d, ok := dataAs[schemas.ApprovalRequested](ev.Data)
		if !ok {
			return m
		}
		sv := m.step(orElse(d.Step, ev.Step))
		if sv == nil {
			return m
		}
		sv.Approval = &ApprovalWait{JobID: orElse(d.JobID, ev.Job), Since: ev.Time, Until: d.Until, OnTimeout: d.OnTimeout}
		m.settle(sv)

	case schemas.TypeStepPaused:
		d, ok := dataAs[schemas.StepPaused](ev.Data)
		if !ok {
			return m
		}
		sv := m.step(orElse(d.Step, ev.Step))
		if sv == nil {
			return m
		}
		sv.Hold = &Hold{Kind: d.Kind, Reason: paragraph(d.Reason), Since: ev.Time}
		m.settle(sv)

	case schemas.TypeStepResumed:
		d, ok := dataAs[schemas.StepResumed](ev.Data)
		if !ok {
			return m
		}
		sv := m.step(orElse(d.Step, ev.Step))
		if sv == nil {
			return m
		}
		// Resuming also ends a rate-limit wait early (the orchestrator
		// dispatches as soon as the session may).
		sv.Hold, sv.Wait = nil, nil
		m.settle(sv)

	case schemas.TypeStepInvalidated:
		d, ok := dataAs[schemas.StepInvalidated](ev.Data)
		if !ok {
			return m
		}
		sv := m.step(orElse(d.Step, ev.Step))
		if sv == nil {
			return m
		}
		// The step starts over: what its earlier run produced no longer
		// stands. Usage, hints and the counters are history and stay.
		sv.Status = StepStatusPending
		sv.ContentHash, sv.SchemaVersion, sv.ErrorMessage, sv.LastFeedback = "", "", "", ""
		sv.CompletedAt, sv.Artifacts, sv.Wait, sv.Approval = nil, nil, nil, nil
		sv.Iterations, sv.JobID, sv.Worker = 0, "", ""
		sv.Invalidations++
		sv.LastInvalidation = &Invalidation{Cause: d.Cause, Reason: paragraph(d.Reason), At: ev.Time}
		m.settle(sv)
		if lp := m.loop(orElse(d.Step, ev.Step)); lp != nil {
			// The loop runs again: its earlier work no longer stands.
			lp.Status, lp.Commit, lp.MergeCommit = LoopStatusRunning, "", ""
		}
		m.syncLoop(orElse(d.Step, ev.Step))

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
		sv.Wait, sv.Hold, sv.Approval = nil, nil, nil // a finished step is never held
		if lp := m.loop(orElse(d.Step, ev.Step)); lp != nil {
			// A worktree loop that changed something is merged next.
			lp.Status = LoopStatusCompleted
			if lv := m.loopLevel(lp.Level); lv != nil && lv.Worktree && lp.Commit != "" {
				lp.Status = LoopStatusMerging
			}
		}
		m.syncLoop(orElse(d.Step, ev.Step))

	case schemas.TypeStepImported:
		if d, ok := dataAs[schemas.StepImported](ev.Data); ok {
			m.imported(d, ev.Time)
		}

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
		sv.Wait, sv.Hold, sv.Approval = nil, nil, nil
		if lp := m.loop(orElse(d.Step, ev.Step)); lp != nil {
			lp.Status = LoopStatusFailed
		}
		m.dropUnmerged(orElse(d.Step, ev.Step))
		m.syncLoop(orElse(d.Step, ev.Step))

	case schemas.TypeSessionPaused:
		if m.Terminal() {
			return m
		}
		d, _ := dataAs[schemas.SessionPaused](ev.Data)
		m.Hold = &Hold{Kind: schemas.PauseSignal, Since: ev.Time}
		if d != nil {
			m.Hold.Reason = paragraph(d.Reason)
		}
		m.Status = StatusPaused

	case schemas.TypeSessionStopped:
		if m.Terminal() {
			return m
		}
		d, _ := dataAs[schemas.SessionStopped](ev.Data)
		m.Hold = &Hold{Kind: schemas.StopSignal, Since: ev.Time}
		if d != nil {
			m.Hold.Kind = orElse(d.Kind, schemas.StopSignal)
			m.Hold.Reason = paragraph(d.Reason)
		}
		m.Status = StatusStopped

	case schemas.TypeSessionResumed:
		if m.Terminal() {
			return m
		}
		m.Hold = nil
		m.Status = StatusRunning

	case schemas.TypeSessionCompleted:
		// A pipeline completes once every step did; the orchestrator
		// dead-letters a completion before that (whoever sent it), so
		// readers of the stream must not end on it either.
		if m.Kind == "" && m.anyStepNot(StepStatusCompleted) || m.Status == StatusClosed {
			return m
		}
		m.Status = StatusCompleted
		m.Hold = nil
		if d, ok := dataAs[schemas.SessionCompleted](ev.Data); ok {
			m.Final = slices.Clone(d.Final)
		}

	case schemas.TypeSessionFailed:
		if m.Status == StatusClosed {
			return m
		}
		m.Status = StatusFailed
		m.Hold = nil
		if d, ok := dataAs[schemas.SessionFailed](ev.Data); ok {
			m.Error = d.Reason
			m.FailedStep = d.Step
		}

	case schemas.TypeSessionBudget:
		if d, ok := dataAs[schemas.SessionBudget](ev.Data); ok && !m.Terminal() {
			var b schemas.Budget
			if m.Budget != nil {
				b = *m.Budget
			}
			b = b.With(d.Budget)
			m.Budget = &b
			if m.StoppedByBudget() {
				h := *m.Hold
				h.Raised = true
				m.Hold = &h
			}
		}

	case schemas.TypeSessionRerun:
		if d, ok := dataAs[schemas.SessionRerun](ev.Data); ok {
			m.rerun(d, ev.Time)
		}

	case schemas.TypeSessionForked:
		if d, ok := dataAs[schemas.SessionForked](ev.Data); ok {
			m.fork(d, ev.Time)
		}

	case schemas.TypeSessionClosed:
		if m.Terminal() {
			return m
		}
		m.Status = StatusClosed
		m.Hold = nil
		if d, ok := dataAs[schemas.SessionClosed](ev.Data); ok {
			m.Error = paragraph(orElse(d.Reason, "closed"))
		}

	case schemas.TypeSignalAcknowledged:
		d, ok := dataAs[schemas.SignalAcknowledged](ev.Data)
		if !ok {
			return m
		}
		sg := m.signal(d.SignalID)
		if sg == nil {
			// The signal itself is older than the newest MaxSignals (or
			// was never folded): keep the answer anyway.
			sg = m.addSignal(SignalView{ID: d.SignalID, Signal: d.Signal, Step: d.Step})
		}
		sg.Result, sg.Detail, sg.AcknowledgedAt = d.Result, paragraph(d.Detail), ev.Time
		if (d.Signal == "approve" || d.Signal == "reject") && d.Result == schemas.SignalApplied {
			m.gateAnswered(d.Step)
		}

	case schemas.TypeApprovalExpired:
		if d, ok := dataAs[schemas.ApprovalExpired](ev.Data); ok {
			m.gateAnswered(orElse(d.Step, ev.Step))
		}

	case schemas.TypeSignalStop, schemas.TypeSignalPause, schemas.TypeSignalResume,
		schemas.TypeSignalInfo, schemas.TypeSignalInvalidate, schemas.TypeSignalApprove, schemas.TypeSignalReject:
		d, ok := dataAs[schemas.Signal](ev.Data)
		if !ok {
			return m
		}
		sv := SignalView{ID: ev.ID, Signal: strings.TrimPrefix(ev.Type, "loopbus.signal."),
			Step: d.Step, Reason: paragraph(d.Reason), Message: paragraph(d.Message), By: paragraph(d.By), At: ev.Time}
		if sg := m.signal(ev.ID); sg != nil {
			// A signal stored twice (another event id would be another
			// signal): keep its acknowledgement.
			sv.Result, sv.Detail, sv.AcknowledgedAt = sg.Result, sg.Detail, sg.AcknowledgedAt
			*sg = sv
			return m
		}
		m.addSignal(sv)
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
	if d.Pipeline.Kind == schemas.KindBacklog && d.Pipeline.Backlog != nil {
		m.Kind, m.MaxSummaryIterations = schemas.KindBacklog, d.Pipeline.Backlog.MaxSummaryIterations
		m.startTarget(ev.Session, d)
	}
	if d.Pipeline.Kind == schemas.KindLoops && d.Pipeline.Loops != nil {
		m.startLoops(ev.Session, d)
	}
	if d.Input != (schemas.ArtifactRef{}) {
		in := d.Input
		m.Input = &in
	}
	if d.Import != nil && m.Kind == "" {
		imp := *d.Import
		m.Import, m.Status = &imp, StatusPaused
		m.Hold = &Hold{Kind: HoldImport, Reason: "imported: the steps not imported run on loopbus resume " + ev.Session, Since: ev.Time}
	}
	for _, st := range d.Pipeline.Steps {
		if st.Name == "" || m.Steps[st.Name] != nil {
			continue // malformed pipeline: keep the first of duplicate names
		}
		m.Steps[st.Name] = &StepView{
			Status:        StepStatusPending,
			Requires:      slices.Clone(st.Requires),
			Final:         st.Final,
			MaxIterations: st.MaxIterations,
		}
		if m.Import != nil {
			m.Steps[st.Name].Outputs = outputNames(st)
		}
		m.StepOrder = append(m.StepOrder, st.Name)
	}
	var b schemas.Budget
	if d.Pipeline.Budget != nil {
		b = *d.Pipeline.Budget
	}
	if d.Budget != nil {
		b = b.Tighter(*d.Budget)
	}
	if b != (schemas.Budget{}) {
		m.Budget = &b
	}
	return m
}

// gateAnswered ends the wait of step at its approval gate (approved,
// rejected or timed out): the step is no longer awaiting approval, also
// when what follows (its completion, or its next iteration) waits for a
// paused session.
func (m *Manifest) gateAnswered(step string) {
	if sv := m.Steps[step]; sv != nil && sv.Approval != nil {
		sv.Approval = nil
		m.settle(sv)
	}
}

// anyStepNot reports whether a step of m is in another status than st.
func (m *Manifest) anyStepNot(st string) bool {
	for _, sv := range m.Steps {
		if sv.Status != st {
			return true
		}
	}
	return false
}

// settle sets the status of a step that has not completed or failed from
// its hold, its wait and its current job: a hold shows first, then a wait,
// then a current job that was not cancelled (in progress), else pending.
func (m *Manifest) settle(sv *StepView) {
	switch {
	case sv.Status == StepStatusCompleted || sv.Status == StepStatusFailed:
	case sv.Hold != nil:
		switch sv.Hold.Kind {
		case schemas.PauseStop:
			sv.Status = StepStatusStopped
		case schemas.PauseBreaker:
			sv.Status = StepStatusBreaker
		default:
			sv.Status = StepStatusPaused
		}
	case sv.Wait != nil:
		sv.Status = StepStatusWaiting
	case sv.Approval != nil:
		sv.Status = StepStatusAwaitingApproval
	case sv.JobID != "" && !m.cancelled(sv.JobID):
		sv.Status = StepStatusInProgress
	default:
		sv.Status = StepStatusPending
	}
}

// HoldImport is the kind of Hold of an imported session until its first
// resume.
const HoldImport = "import"

// imported applies step.imported as the orchestrator does: in a pipeline
// session loopbus import started, before its first job, a pending step
// whose required steps completed is completed with the imported
// artifacts, which must be exactly its declared outputs. Others are
// ignored (the orchestrator dead-letters them).
func (m *Manifest) imported(d *schemas.StepImported, at time.Time) {
	sv := m.Steps[d.Step]
	switch {
	case m.Kind != "" || m.Import == nil || m.Terminal() || len(m.Jobs) > 0 || len(d.Artifacts) == 0 || d.ContentHash != schemas.ContentHash(d.Artifacts):
		return
	case sv == nil || sv.Status != StepStatusPending:
		return
	case slices.ContainsFunc(sv.Requires, func(r string) bool { return m.Steps[r] == nil || m.Steps[r].Status != StepStatusCompleted }):
		return
	}
	got := make([]string, 0, len(d.Artifacts))
	for _, a := range d.Artifacts {
		got = append(got, a.Name)
	}
	slices.Sort(got)
	if !slices.Equal(got, sv.Outputs) {
		return // not exactly the step's declared outputs
	}
	sv.Status, sv.Imported = StepStatusCompleted, true
	sv.ContentHash, sv.SchemaVersion = d.ContentHash, d.SchemaVersion
	sv.Artifacts = slices.Clone(d.Artifacts)
	when := at
	if d.CompletedAt != nil {
		when = *d.CompletedAt
	}
	if !when.IsZero() {
		sv.CompletedAt = &when
	}
}

// outputNames are the names of st's declared outputs, sorted; nil for
// none.
func outputNames(st schemas.Step) []string {
	var names []string
	for _, o := range st.Outputs {
		names = append(names, o.Name)
	}
	slices.Sort(names)
	return names
}

// RerunView is the newest session.rerun of a session.
type RerunView struct {
	// Step is the step run again with its dependents; "" for every step.
	Step   string    `json:"step,omitempty"`
	Reason string    `json:"reason,omitempty"`
	At     time.Time `json:"at"`
}

// rerun applies session.rerun as the orchestrator does: a completed,
// failed or stopped pipeline session runs again; the step named and every
// step requiring it (all without one), and steps that had not completed,
// are pending again.
func (m *Manifest) rerun(d *schemas.SessionRerun, at time.Time) {
	switch {
	case m.Kind != "" || m.Status == StatusClosed || m.Status == StatusRunning || m.Status == StatusPaused:
		return
	case d.Step != "" && m.Steps[d.Step] == nil:
		return
	}
	again := map[string]bool{d.Step: true}
	for changed := true; changed; {
		changed = false
		for _, name := range m.StepOrder {
			sv := m.Steps[name]
			if sv == nil || again[name] {
				continue
			}
			if d.Step == "" || sv.Status != StepStatusCompleted || slices.ContainsFunc(sv.Requires, func(r string) bool { return again[r] }) {
				again[name], changed = true, true
			}
		}
	}
	for _, name := range m.StepOrder {
		if sv := m.Steps[name]; sv != nil && again[name] {
			sv.startOver()
		}
	}
	m.Status, m.Hold, m.Error, m.FailedStep, m.Final = StatusRunning, nil, "", "", nil
	m.Reruns++
	m.LastRerun = &RerunView{Step: d.Step, Reason: paragraph(d.Reason), At: at}
}

// startOver makes the step pending from scratch, as step.invalidated
// does: what its earlier run produced no longer stands; usage and counters
// are history and stay.
func (sv *StepView) startOver() {
	sv.Status = StepStatusPending
	sv.ContentHash, sv.SchemaVersion, sv.ErrorMessage, sv.LastFeedback = "", "", "", ""
	sv.CompletedAt, sv.Artifacts, sv.Wait, sv.Approval, sv.Hold = nil, nil, nil, nil, nil
	sv.Iterations, sv.JobID, sv.Worker = 0, "", ""
	sv.Imported = false
}

// ForkView is where a fork comes from: its origin session and the fork
// point there (stream sequence and event id).
type ForkView struct {
	Session string    `json:"session"`
	Seq     uint64    `json:"seq"`
	Event   string    `json:"event"`
	Reason  string    `json:"reason,omitempty"`
	At      time.Time `json:"at"`
}

// fork applies session.forked as the orchestrator does, to the manifest
// folded from the copied history (the origin's at the fork point): the
// session runs d's pipeline on d's input; a step keeps its results when
// it had completed, is not in d.Changed and requires no step that runs
// again; the others are pending from scratch. Steps the pipeline no
// longer has go. Jobs of the origin not finished at the fork point are
// not the fork's (it runs jobs of its own): they show as cancelled.
//
// A loops session's loop tree forks as the orchestrator forks it (see
// forkLoops); a backlog session keeps its task list and finished runs,
// and its runs not finished (with workdir: repo: not merged) start over.
// A fork's target branch is its own (see forkTarget).
func (m *Manifest) fork(d *schemas.SessionForked, at time.Time) {
	switch {
	case m.Status == StatusClosed || m.Terminal() && m.Kind != "":
		return // the orchestrator refuses it: closed for good, or a loops session's end
	case m.Kind == schemas.KindLoops && d.Pipeline.Kind == schemas.KindLoops && d.Pipeline.Loops != nil:
		m.forkLoops(d)
	case m.Kind == schemas.KindBacklog && d.Pipeline.Kind == schemas.KindBacklog && d.Pipeline.Backlog != nil:
		// The task list and the finished runs stand; the runs not
		// finished (with workdir: repo, not merged) run again from
		// scratch.
		for name, sv := range m.Steps {
			if sv.Status != StepStatusCompleted && sv.Status != StepStatusFailed || m.Target != nil && slices.Contains(m.Target.Unmerged, name) {
				sv.startOver()
			}
		}
		m.forkTarget()
	case m.Kind != "" || d.Pipeline.Kind != "" && d.Pipeline.Kind != schemas.KindPipeline:
		return // the orchestrator refuses it: not supported (yet)
	default:
		m.forkSteps(d)
	}
	for _, j := range m.Jobs {
		if j.Status == JobStatusRequested || j.Status == JobStatusRunning {
			j.Status, j.Reason = JobStatusCancelled, "not the fork's: the origin's job at the fork point"
		}
	}
	m.Pipeline, m.SourceHash = d.Pipeline.Name, d.SourceHash
	in := d.Input
	m.Input = &in
	// The fork runs under the origin's budget at the fork point (raises
	// by session.budget included), tightened by its own.
	var b schemas.Budget
	if m.Budget != nil {
		b = *m.Budget
	}
	if d.Budget != nil {
		b = b.Tighter(*d.Budget)
	}
	m.Budget = nil
	if b != (schemas.Budget{}) {
		m.Budget = &b
	}
	// A fork of an imported session is no import: it runs its steps.
	m.Import = nil
	m.Status, m.Hold, m.Error, m.FailedStep, m.Final = StatusRunning, nil, "", "", nil
	m.CreatedAt = at
	m.ForkedFrom = &ForkView{Session: d.Origin, Seq: d.Seq, Event: d.Event, Reason: paragraph(d.Reason), At: at}
}

// forkSteps forks a pipeline session's steps.
func (m *Manifest) forkSteps(d *schemas.SessionForked) {
	again := map[string]bool{}
	for _, st := range d.Pipeline.Steps {
		sv := m.Steps[st.Name]
		again[st.Name] = sv == nil || sv.Status != StepStatusCompleted || slices.Contains(d.Changed, st.Name)
	}
	for grew := true; grew; {
		grew = false
		for _, st := range d.Pipeline.Steps {
			if !again[st.Name] && slices.ContainsFunc(st.Requires, func(r string) bool { return again[r] }) {
				again[st.Name], grew = true, true
			}
		}
	}
	steps, order := make(map[string]*StepView, len(d.Pipeline.Steps)), make([]string, 0, len(d.Pipeline.Steps))
	for _, st := range d.Pipeline.Steps {
		if st.Name == "" || steps[st.Name] != nil {
			continue // malformed pipeline: keep the first of duplicate names
		}
		sv := m.Steps[st.Name]
		if sv == nil {
			sv = &StepView{Status: StepStatusPending}
		} else if again[st.Name] {
			sv.startOver()
		}
		sv.Requires, sv.Final, sv.MaxIterations = slices.Clone(st.Requires), st.Final, st.MaxIterations
		steps[st.Name] = sv
		order = append(order, st.Name)
	}
	m.Steps, m.StepOrder = steps, order
}

// job returns the view of job id, creating it (requested, of step) if new.
func (m *Manifest) job(id, step string) *JobView {
	if j := m.Jobs[id]; j != nil {
		return j
	}
	if m.Jobs == nil {
		m.Jobs = map[string]*JobView{}
	}
	j := &JobView{Step: step, Status: JobStatusRequested}
	m.Jobs[id] = j
	return j
}

// cancelled reports whether job id was cancelled.
func (m *Manifest) cancelled(id string) bool {
	j := m.Jobs[id]
	return j != nil && j.Status == JobStatusCancelled
}

// jobEnded records a job's result: its status (unless it was cancelled)
// and its usage, which replaces an earlier report of the same job. A job
// not requested before is recorded if it names a pipeline step.
func (m *Manifest) jobEnded(id, step string, iteration int, status, worker string, u *schemas.Usage) {
	if id == "" {
		return
	}
	j := m.Jobs[id]
	if j == nil {
		if m.step(step) == nil {
			return
		}
		j = m.job(id, step)
		j.Iteration = iteration
	}
	if j.Status != JobStatusCancelled {
		j.Status = status
	}
	j.Worker = orElse(worker, j.Worker)
	if u != nil && u.IsZero() {
		u = nil
	}
	if u == nil && j.Usage == nil {
		return
	}
	if u != nil {
		c := *u
		c.CostUSD = finite(c.CostUSD)
		u = &c
	}
	j.Usage = u
	m.sumUsage(j.Step)
}

// sumUsage recomputes the usage of step and of the session from the jobs'.
// Jobs are summed in id order so that the float sums, and so the fold, are
// deterministic.
func (m *Manifest) sumUsage(step string) {
	ids := make([]string, 0, len(m.Jobs))
	for id := range m.Jobs {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	var total, ofStep schemas.Usage
	for _, id := range ids {
		j := m.Jobs[id]
		if j == nil || j.Usage == nil {
			continue
		}
		addUsage(&total, *j.Usage)
		if j.Step == step {
			addUsage(&ofStep, *j.Usage)
		}
	}
	m.Usage = usagePtr(total)
	if sv := m.step(step); sv != nil {
		sv.Usage = usagePtr(ofStep)
	}
}

func addUsage(sum *schemas.Usage, u schemas.Usage) {
	sum.InputTokens += u.InputTokens
	sum.CachedTokens += u.CachedTokens
	sum.CacheWriteTokens += u.CacheWriteTokens
	sum.OutputTokens += u.OutputTokens
	sum.ReasoningTokens += u.ReasoningTokens
	sum.Turns += u.Turns
	// Models stay with each job: a sum by model would grow with every
	// model a session's agents name.
	c := finite(sum.CostUSD + u.CostUSD)
	if math.Abs(c) < 1e9 {
		// Rounded to a billionth of a dollar, so sums read 0.3, not
		// 0.30000000000000004.
		c = math.Round(c*1e9) / 1e9
	}
	sum.CostUSD = c
}

// finite clamps x to the float64 range (JSON has no infinities).
func finite(x float64) float64 {
	if math.IsInf(x, 0) || math.IsNaN(x) {
		return math.Copysign(math.MaxFloat64, x)
	}
	return x
}

// usagePtr returns &u, or nil for zero usage.
func usagePtr(u schemas.Usage) *schemas.Usage {
	if u.IsZero() {
		return nil
	}
	return &u
}

// signal returns the kept signal with event id id, or nil.
func (m *Manifest) signal(id string) *SignalView {
	if id == "" {
		return nil
	}
	for i := range m.Signals {
		if m.Signals[i].ID == id {
			return &m.Signals[i]
		}
	}
	return nil
}

// addSignal appends sg, drops the oldest beyond MaxSignals and returns
// the kept copy.
func (m *Manifest) addSignal(sg SignalView) *SignalView {
	m.Signals = append(m.Signals, sg)
	if n := len(m.Signals) - MaxSignals; n > 0 {
		m.Signals = slices.Delete(m.Signals, 0, n)
	}
	return &m.Signals[len(m.Signals)-1]
}

// runStep starts a new run of a backlog step (a task or a role) or of a
// loop's step: the step is added on its first run, with maxIterations,
// and pending again on later ones. It returns the step's view (nil for no
// name).
func (m *Manifest) runStep(name string, maxIterations int) *StepView {
	if name == "" {
		return nil
	}
	sv := m.Steps[name]
	if sv == nil {
		sv = &StepView{MaxIterations: maxIterations}
		m.Steps[name] = sv
		m.StepOrder = append(m.StepOrder, name)
	}
	sv.Status, sv.JobID, sv.Worker, sv.Wait = StepStatusPending, "", "", nil
	sv.Iterations, sv.ErrorMessage = 0, ""
	m.dropUnmerged(name)
	return sv
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
