package schemas

import (
	"encoding/json"
	"time"
)

// Event types of task backlogs and hooks. A backlog session's task list is
// the fold of its task.* events; backlog.phase records where the session is
// (bootstrap, repair, iterate, review, done). Hook runners record each run of
// a hook command as hook.completed or hook.failed.
const (
	TypeTaskAdded     = "loopbus.task.added"
	TypeTaskUpdated   = "loopbus.task.updated"
	TypeTaskSelected  = "loopbus.task.selected"
	TypeBacklogPhase  = "loopbus.backlog.phase"
	TypeHookCompleted = "loopbus.hook.completed"
	TypeHookFailed    = "loopbus.hook.failed"
)

// Task statuses.
const (
	TaskTodo    = "todo"
	TaskDoing   = "doing"
	TaskDone    = "done"
	TaskBlocked = "blocked"
)

// TaskStatuses lists the task statuses in their display order.
func TaskStatuses() []string { return []string{TaskTodo, TaskDoing, TaskDone, TaskBlocked} }

// Task is one task of a backlog, in the shape of a task file's tasks (its
// members are snake_case as in to-do.json).
type Task struct {
	// ID is 1 to 64 characters from A-Z, a-z, 0-9, _ and - (see
	// ValidateStepName): a task runs as a step of that name.
	ID          string `json:"id"`
	Title       string `json:"title"`
	Description string `json:"description,omitempty"`
	Reference   string `json:"reference,omitempty"`
	// Priority: 1 is the highest; 0 means unset and sorts after every set
	// priority.
	Priority  int        `json:"priority,omitempty"`
	Status    string     `json:"status"`
	Details   string     `json:"details,omitempty"`
	Steps     []string   `json:"steps,omitempty"`
	Blockers  []string   `json:"blockers,omitempty"`
	Tags      []string   `json:"tags,omitempty"`
	Files     []string   `json:"files,omitempty"`
	DependsOn []string   `json:"depends_on,omitempty"`
	Notes     []string   `json:"notes,omitempty"`
	CreatedAt *time.Time `json:"created_at,omitempty"`
	UpdatedAt *time.Time `json:"updated_at,omitempty"`
}

// TaskAdded adds a task to a backlog session's task list. Emitted by the
// orchestrator (imported files, agents' new tasks) or the CLI (tasks add).
type TaskAdded struct {
	Task Task `json:"task"`
	// By says who added it: "import", "cli", or the job whose agent did.
	By string `json:"by"`
	// Reason says why, for people reading the history.
	Reason string `json:"reason,omitempty"`
}

// TaskUpdated changes a task. Only the members present change: Status,
// Blockers (replaced, an empty list clears them), Files (added) and Note
// (appended to the task's notes).
type TaskUpdated struct {
	ID       string    `json:"id"`
	Status   string    `json:"status,omitempty"`
	Blockers *[]string `json:"blockers,omitempty"`
	Files    []string  `json:"files,omitempty"`
	Note     string    `json:"note,omitempty"`
	By       string    `json:"by"`
	Reason   string    `json:"reason,omitempty"`
}

// TaskSelected records that a task was picked for the next agent run (its
// status becomes doing). Emitted by the orchestrator.
type TaskSelected struct {
	ID string `json:"id"`
	// Run counts the task's selections, from 1.
	Run int `json:"run"`
	// Agent is the agent (by its name in the backlog file) that runs it.
	Agent string `json:"agent"`
	// Reason says why this task: its status, priority and dependencies.
	Reason string `json:"reason,omitempty"`
}

// Backlog phases.
const (
	PhaseBootstrap = "bootstrap"
	PhaseRepair    = "repair"
	PhaseIterate   = "iterate"
	PhaseReview    = "review"
	PhaseDone      = "done"
)

// BacklogPhase records that a backlog session entered a phase. Emitted by
// the orchestrator.
type BacklogPhase struct {
	Phase  string `json:"phase"`
	Reason string `json:"reason"`
	// Counts are the tasks per status when the phase began.
	Counts map[string]int `json:"counts,omitempty"`
}

// Backlog is the normalized backlog of a pipeline of kind backlog.
type Backlog struct {
	// Agents by name.
	Agents map[string]AgentSpec `json:"agents"`
	// Roles name the agents of each role: iterate (run tasks), review,
	// repair and bootstrap. Iterate may list several, used by Schedule;
	// the others use their first.
	Roles map[string][]string `json:"roles"`
	// Schedule picks the iterate agent of each run: single (the first),
	// odd-even (first on odd runs, second on even), round-robin.
	Schedule string `json:"schedule"`
	// MaxParallel is how many independent tasks run at once; at least 1.
	MaxParallel int `json:"maxParallel"`
	// SourceFiles are the files given to every agent run, as written.
	SourceFiles []string `json:"sourceFiles,omitempty"`
	// Project names the project in exported task files.
	Project string `json:"project,omitempty"`
	// Prompts override the built-in prompt of a role (Go templates).
	Prompts map[string]string `json:"prompts,omitempty"`
	// MaxSummaryIterations bounds the runs of one selection whose summary
	// is rejected; the task is then blocked. Default 3.
	MaxSummaryIterations int `json:"maxSummaryIterations"`
	// TimeoutMs bounds one agent run.
	TimeoutMs int64 `json:"timeoutMs"`
	// Validate is an optional argv the validator runs after each task run
	// (tests, linters), as for a pipeline step.
	Validate          []string `json:"validate,omitempty"`
	ValidateTimeoutMs int64    `json:"validateTimeoutMs,omitempty"`
	// Workdir is "" (each run in a fresh workspace) or "repo": each run's
	// agent works in a git worktree of the session's repository, and a
	// passed task run's commits are merged into the target branch, as a
	// loops session's code loops are. Base is the branch it starts from
	// ("" for the repository's current branch).
	Workdir string `json:"workdir,omitempty"`
	Base    string `json:"base,omitempty"`
	// Approval holds the approval gates by role (bootstrap, repair,
	// iterate: every task run, review): a run of a gated role waits after
	// its report passed until it is approved or rejected.
	Approval map[string]Approval `json:"approval,omitempty"`
}

// Workdirs of a backlog.
const (
	WorkdirWorkspace = "workspace"
	WorkdirRepo      = "repo"
)

// Backlog roles and schedules.
const (
	RoleIterate   = "iterate"
	RoleReview    = "review"
	RoleRepair    = "repair"
	RoleBootstrap = "bootstrap"

	ScheduleSingle     = "single"
	ScheduleOddEven    = "odd-even"
	ScheduleRoundRobin = "round-robin"
)

// Pipeline kinds.
const (
	KindPipeline = "pipeline"
	KindBacklog  = "backlog"
)

// BacklogStart is what session.started carries for a backlog session.
type BacklogStart struct {
	// Sources are the source files, stored as artifacts.
	Sources []ArtifactRef `json:"sources,omitempty"`
	// Tasks is the imported task file when it was valid (the session
	// starts iterating), with TaskFile its stored copy.
	Tasks    []Task       `json:"tasks,omitempty"`
	TaskFile *ArtifactRef `json:"taskFile,omitempty"`
	// ImportErrors list why the imported task file is invalid: the session
	// starts with a repair run.
	ImportErrors []ValidationError `json:"importErrors,omitempty"`
}

// Report is the content of an output declared with Output.Report, carried
// in validation.passed so deciders need not fetch it.
type Report struct {
	Name    string          `json:"name"`
	Content json.RawMessage `json:"content"`
}

// MaxReportBytes bounds an output carried as a report.
const MaxReportBytes = 128 << 10

// HookRun is the data of hook.completed and hook.failed: one run of a hook
// command for one event. Emitted by the hook runner.
type HookRun struct {
	// Hook is the hook's name in the hooks file.
	Hook string `json:"hook"`
	// EventID, EventType and EventSeq identify the event the hook ran for.
	EventID   string `json:"eventId"`
	EventType string `json:"eventType"`
	EventSeq  uint64 `json:"eventSeq"`
	// Runner names the hook runner (its durable consumer).
	Runner     string `json:"runner"`
	ExitCode   int    `json:"exitCode"`
	DurationMs int64  `json:"durationMs"`
	TimedOut   bool   `json:"timedOut,omitempty"`
	Error      string `json:"error,omitempty"`
	OutputTail string `json:"outputTail,omitempty"`
}
