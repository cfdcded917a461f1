// Package schemas is loopbus's event catalogue: event type names, the Go
// types of every event's data, the versioned JSON Schemas external tools use
// (embedded from v1/), and helpers to validate ids, names and artifacts.
//
// It depends on nothing else in loopbus; every other package depends on it.
package schemas

import (
	"encoding/json"
	"time"
)

// Event type names. The subject of an event is
// loopbus.evt.<session>.<entity>.<verb> for type loopbus.<entity>.<verb>.
const (
	TypeSessionStarted   = "loopbus.session.started"
	TypeSessionCompleted = "loopbus.session.completed"
	TypeSessionFailed    = "loopbus.session.failed"
	TypeJobRequested     = "loopbus.job.requested"
	TypeJobStarted       = "loopbus.job.started"
	TypeJobHeartbeat     = "loopbus.job.heartbeat"
	TypeJobReleased      = "loopbus.job.released"
	TypeJobCompleted     = "loopbus.job.completed"
	TypeJobFailed        = "loopbus.job.failed"
	TypeToolStarted      = "loopbus.tool.started"
	TypeToolCompleted    = "loopbus.tool.completed"
	TypeAgentMessage     = "loopbus.agent.message"
	TypeArtifactStored   = "loopbus.artifact.stored"
	TypeValidationPassed = "loopbus.validation.passed"
	TypeValidationFailed = "loopbus.validation.failed"
	TypeStepCompleted    = "loopbus.step.completed"
	TypeStepFailed       = "loopbus.step.failed"
)

// Event is one loopbus event: the CloudEvent attributes loopbus uses plus the
// typed data. Data is a pointer to the struct registered for Type (for
// example *SessionStarted for TypeSessionStarted). Seq is the stream sequence
// the event was stored at; it is zero for events not read from the stream.
type Event struct {
	ID          string
	Source      string
	Type        string
	Session     string
	Step        string
	Job         string
	Causation   string
	Correlation string
	Time        time.Time
	Data        any
	Seq         uint64
	// Stored is when the stream stored the event; zero for events not read from the stream.
	Stored time.Time
	// Signer is the public key (an nkey, "U…") whose signature the bus
	// verified when it read the event; empty when the bus trusts no keys
	// (no --trust file) or for events not read from the stream.
	Signer string
	// ForkOf is set on a copy of another session's event in a fork's
	// history (see SessionForked): the id of the event it copies. A copy
	// is history, stored on its own subject (HistorySubjectFor), and no
	// service acts on it.
	ForkOf string
}

// Subject returns the CloudEvent subject: the session, or session/step when
// the event concerns one step.
func (e Event) Subject() string {
	if e.Step == "" {
		return e.Session
	}
	return e.Session + "/" + e.Step
}

// ArtifactRef names an artifact stored in the write-once artifact stream. Events
// carry references only, never artifact bytes.
type ArtifactRef struct {
	// Name is the artifact's file name (a safe base name, see ValidateName).
	Name string `json:"name"`
	// Object is the artifact key holding the bytes.
	Object string `json:"object"`
	// Digest is "sha256:" followed by 64 lowercase hex digits.
	Digest string `json:"digest"`
	// Size is the byte length.
	Size int64 `json:"size"`
	// ContentType is a MIME type guessed from the name when stored.
	ContentType string `json:"contentType,omitempty"`
	// Step is the step that produced it; empty for the session input.
	Step string `json:"step,omitempty"`
}

// Pipeline is the normalized pipeline definition carried in session.started:
// everything a service needs, with file references already resolved (schema
// contents inlined), so services on other machines need only the bus.
type Pipeline struct {
	Name string `json:"name"`
	// Source is the pipeline file as the user named it (for messages only).
	Source string `json:"source,omitempty"`
	// Dir is the absolute directory of the pipeline file; relative paths in
	// agent and validate commands were resolved against it.
	Dir string `json:"dir,omitempty"`
	// Steps in file order.
	Steps []Step `json:"steps"`
	// Budget bounds what a session of the pipeline may spend.
	Budget *Budget `json:"budget,omitempty"`
	// Breaker sets the circuit breaker's thresholds for every step.
	Breaker *Breaker `json:"breaker,omitempty"`
	// JobDispatchTimeoutMs, when set, fails a job that no worker started
	// within it (job_dispatch_timeout), in milliseconds.
	JobDispatchTimeoutMs int64 `json:"jobDispatchTimeoutMs,omitempty"`
	// Kind is "pipeline" (empty means the same) or "backlog": then Steps
	// is empty and Backlog says how tasks are worked.
	Kind    string   `json:"kind,omitempty"`
	Backlog *Backlog `json:"backlog,omitempty"`
	// Loops is the hierarchy of a pipeline of kind loops.
	Loops *Loops `json:"loops,omitempty"`
}

// Step is one normalized pipeline step.
type Step struct {
	Name     string    `json:"name"`
	Agent    AgentSpec `json:"agent"`
	Prompt   string    `json:"prompt"`
	Requires []string  `json:"requires,omitempty"`
	Outputs  []Output  `json:"outputs,omitempty"`
	// Validate is an optional argv run by the validator after schema checks.
	Validate []string `json:"validate,omitempty"`
	// MaxIterations is the number of attempts allowed when a job fails or its
	// validation fails; at least 1.
	MaxIterations int `json:"maxIterations"`
	// TimeoutMs bounds one agent run, in milliseconds.
	TimeoutMs int64 `json:"timeoutMs"`
	// ValidateTimeoutMs bounds the validate command, in milliseconds.
	ValidateTimeoutMs int64 `json:"validateTimeoutMs,omitempty"`
	Final             bool  `json:"final,omitempty"`
	// Breaker overrides the pipeline's circuit breaker thresholds.
	Breaker *Breaker `json:"breaker,omitempty"`
	// Approval, when set, is a gate: the step waits after its validation
	// passed until it is approved or rejected (see Approval).
	Approval *Approval `json:"approval,omitempty"`
	// Line is the line of the step in the pipeline file (for messages).
	Line int `json:"line,omitempty"`
}

// AgentSpec selects an agent backend and its options.
type AgentSpec struct {
	// Backend names the backend: "exec" runs Command as argv; "claude"
	// and "codex" run those CLIs and read their JSON event streams.
	Backend string `json:"backend"`
	// Command is the argv for the exec backend; for claude and codex,
	// optionally the program (and leading arguments) to run instead of
	// "claude" or "codex".
	Command []string `json:"command,omitempty"`
	// Model, for claude and codex.
	Model string `json:"model,omitempty"`
	// PermissionMode and AllowedTools, for claude.
	PermissionMode string   `json:"permissionMode,omitempty"`
	AllowedTools   []string `json:"allowedTools,omitempty"`
	// Args are extra arguments appended to the claude or codex command.
	Args []string `json:"args,omitempty"`
	// Env adds variables to the agent's environment. Its values travel in
	// events: secrets belong in the worker's environment (see SecretEnv).
	Env map[string]string `json:"env,omitempty"`
	// SecretEnv names variables of the worker's environment whose values
	// are secret: the worker masks them in everything it publishes or logs
	// and refuses outputs that contain them. Only the names travel.
	SecretEnv []string `json:"secretEnv,omitempty"`

	// The options below are those of the model-API backends (openai,
	// anthropic), which call the model themselves and run its tools.

	// BaseURL is the API's address as the vendor's SDK takes it (OpenAI:
	// ending in /v1; Anthropic: the host root); "" means the worker's
	// $OPENAI_BASE_URL or $ANTHROPIC_BASE_URL, else the public API.
	BaseURL string `json:"baseUrl,omitempty"`
	// APIKeyEnv names the worker's environment variable holding the API
	// key; "" means OPENAI_API_KEY or ANTHROPIC_API_KEY. Only the name
	// travels; the worker masks the value as a secret.
	APIKeyEnv string `json:"apiKeyEnv,omitempty"`
	// Tools are the tools the model may call (read_file, write_file,
	// edit_file, list_files, run); empty means all of them.
	Tools []string `json:"tools,omitempty"`
	// MaxTurns bounds the model calls of one job; 0 means 40.
	MaxTurns int `json:"maxTurns,omitempty"`
	// MaxTokens bounds the output tokens of one model call; 0 means 8192.
	MaxTokens int64 `json:"maxTokens,omitempty"`
	// Price turns the API's token counts into a cost; nil means none.
	Price *Price `json:"price,omitempty"`
	// RetryWaitMs is the longest rate-limit wait (Retry-After) waited out
	// inside the job; a longer one fails the job as rate limited. 0 means
	// 30 seconds.
	RetryWaitMs int64 `json:"retryWaitMs,omitempty"`
	// NoStream asks for whole responses instead of streamed ones (for
	// servers whose streaming of tool calls is broken).
	NoStream bool `json:"noStream,omitempty"`
}

// ModelTools returns the tools the model-API backends offer a model
// (AgentSpec.Tools), in the order they offer them.
func ModelTools() []string {
	return []string{"read_file", "write_file", "edit_file", "list_files", "run"}
}

// Price is what a model's tokens cost, in US dollars per million.
type Price struct {
	InputPerMTok  float64 `json:"inputPerMTok"`
	OutputPerMTok float64 `json:"outputPerMTok"`
	// CachedInputPerMTok prices input tokens read from the prompt cache;
	// nil means InputPerMTok.
	CachedInputPerMTok *float64 `json:"cachedInputPerMTok,omitempty"`
}

// Agent backends (AgentSpec.Backend).
const (
	BackendExec   = "exec"
	BackendClaude = "claude"
	BackendCodex  = "codex"
	// BackendOpenAI and BackendAnthropic call a model's API themselves and
	// run the tools it asks for.
	BackendOpenAI    = "openai"
	BackendAnthropic = "anthropic"
)

// Output declares one artifact a step must produce.
type Output struct {
	Name string `json:"name"`
	// SchemaPath is the schema file as written in the pipeline (for messages).
	SchemaPath string `json:"schemaPath,omitempty"`
	// Schema is the JSON Schema document the artifact must satisfy, inlined.
	Schema json.RawMessage `json:"schema,omitempty"`
	// SchemaVersion identifies the schema: its "version" or "$id" member, or
	// "sha256:" and 12 hex digits of its bytes.
	SchemaVersion string `json:"schemaVersion,omitempty"`
	// Report asks the validator to carry the output's content (JSON, at
	// most MaxReportBytes) in validation.passed.
	Report bool `json:"report,omitempty"`
	// ReportText carries a Report output that is text, not JSON, as a JSON
	// string (a loop level's children are cut from it).
	ReportText bool `json:"reportText,omitempty"`
}

// SessionStarted starts a session. Emitted by the CLI.
type SessionStarted struct {
	Pipeline Pipeline    `json:"pipeline"`
	Input    ArtifactRef `json:"input"`
	// SourceHash is the first 16 hex digits of the input's sha-256.
	SourceHash string `json:"sourceHash"`
	// Budget is the session's own budget (loopbus run --max-cost-usd …);
	// it applies together with the pipeline's.
	Budget *Budget `json:"budget,omitempty"`
	// Backlog holds a backlog session's source files and imported tasks.
	Backlog *BacklogStart `json:"backlog,omitempty"`
	// Loops holds a loops session's task and repository.
	Loops *LoopsStart `json:"loops,omitempty"`
	// DefinitionFiles are the files under the pipeline's directory that
	// its agent and validate commands name (scripts), stored so that they
	// travel with the session: a worker needs nothing but the bus.
	DefinitionFiles []DefinitionFile `json:"definitionFiles,omitempty"`
	// Import marks a session made by loopbus import: it starts paused,
	// and its first events may be step.imported.
	Import *ImportStart `json:"import,omitempty"`
}

// DefinitionFile is a file of the pipeline's directory stored for the
// session. Commands name it by its absolute path, Pipeline.Dir joined with
// Path; workers and validators run their own copy.
type DefinitionFile struct {
	// Path is relative to Pipeline.Dir, slash-separated, without "..".
	Path     string      `json:"path"`
	Artifact ArtifactRef `json:"artifact"`
	// Executable keeps the file's execute permission.
	Executable bool `json:"executable,omitempty"`
}

// Feedback is what an earlier failed iteration of a step left for the next.
type Feedback struct {
	Iteration int `json:"iteration"`
	// Kind is "validation" (the validator rejected the outputs), "job" (the
	// agent run itself failed), "merge" (a loop's merge conflicted) or
	// "child" (a child loop used up its iterations).
	Kind   string            `json:"kind"`
	Errors []ValidationError `json:"errors,omitempty"`
	// Message summarizes the failure in one paragraph.
	Message string `json:"message,omitempty"`
	// RetryHint tells the agent what to change.
	RetryHint string `json:"retryHint,omitempty"`
}

// JobRequested asks an agent worker to run one iteration of a step.
// Emitted by the orchestrator.
type JobRequested struct {
	JobID     string        `json:"jobId"`
	Step      string        `json:"step"`
	Iteration int           `json:"iteration"`
	Attempt   int           `json:"attempt"`
	Agent     AgentSpec     `json:"agent"`
	Prompt    string        `json:"prompt"`
	Inputs    []ArtifactRef `json:"inputs"`
	Outputs   []Output      `json:"outputs,omitempty"`
	Validate  []string      `json:"validate,omitempty"`
	TimeoutMs int64         `json:"timeoutMs"`
	// ValidateTimeoutMs bounds the validate command, in milliseconds.
	ValidateTimeoutMs int64 `json:"validateTimeoutMs,omitempty"`
	// Dir is the pipeline directory (see Pipeline.Dir).
	Dir      string     `json:"dir,omitempty"`
	Feedback []Feedback `json:"feedback,omitempty"`
	// Round counts the step's runs cut short by a stop or an invalidation
	// before this one (0 at first); it keeps job ids unique.
	Round int `json:"round,omitempty"`
	// Hints are messages of info signals given since the step's previous
	// job, oldest first; the prompt ends with them.
	Hints []string `json:"hints,omitempty"`
	// Files are small inputs carried inline (a loop's task and its part
	// of the parent's artifact), written to in/.
	Files []InlineFile `json:"files,omitempty"`
	// Worktree makes the job run in a git worktree (loops levels with
	// worktree: true), or merge (Worktree.Merge).
	Worktree *WorktreeSpec `json:"worktree,omitempty"`
	// DefinitionFiles are the session's (see SessionStarted): the worker
	// and the validator run their own copies in place of Dir's.
	DefinitionFiles []DefinitionFile `json:"definitionFiles,omitempty"`
}

// JobStarted reports that a worker took a job. Emitted by agentworker.
type JobStarted struct {
	JobID  string `json:"jobId"`
	Worker string `json:"worker"`
	// Delivery is JetStream's delivery count: above 1, an earlier worker
	// took the job and did not finish it.
	Delivery int `json:"delivery"`
	// LeaseMs is set by a worker that signs its events: it states a sign
	// of life about the job (a job.heartbeat or any progress) at least
	// every third of it, and another worker may take the job over only
	// once it has been silent that long or released it.
	LeaseMs int64 `json:"leaseMs,omitempty"`
}

// JobHeartbeat says the worker holding a job still runs it. A worker that
// signs its events sends one every third of its lease (JobStarted.LeaseMs).
type JobHeartbeat struct {
	JobID    string `json:"jobId"`
	Worker   string `json:"worker"`
	Delivery int    `json:"delivery"`
}

// JobReleased says the worker holding a job handed it back unfinished
// (it is shutting down): another worker may take it over at once.
type JobReleased struct {
	JobID    string `json:"jobId"`
	Worker   string `json:"worker"`
	Delivery int    `json:"delivery"`
	Reason   string `json:"reason,omitempty"`
}

// ToolStarted reports one tool job (for the exec backend: the agent process).
type ToolStarted struct {
	JobID  string `json:"jobId"`
	ToolID string `json:"toolId"`
	Name   string `json:"name"`
	Lane   string `json:"lane,omitempty"`
	Input  string `json:"input,omitempty"`
}

// ToolCompleted reports the end of one tool job.
type ToolCompleted struct {
	JobID      string `json:"jobId"`
	ToolID     string `json:"toolId"`
	Name       string `json:"name"`
	Lane       string `json:"lane,omitempty"`
	Status     string `json:"status"` // ok | error | timeout
	ExitCode   int    `json:"exitCode"`
	DurationMs int64  `json:"durationMs"`
	Output     string `json:"output,omitempty"`
	Error      string `json:"error,omitempty"`
}

// AgentMessage is text an agent wrote while it worked (claude and codex
// backends), truncated. Emitted by agentworker.
type AgentMessage struct {
	JobID string `json:"jobId"`
	Text  string `json:"text"`
}

// ArtifactStored reports an artifact written to the artifact stream.
type ArtifactStored struct {
	JobID    string      `json:"jobId"`
	Artifact ArtifactRef `json:"artifact"`
}

// Usage is the resources an agent run reported.
type Usage struct {
	// InputTokens counts every input token, cached ones included.
	InputTokens int64 `json:"inputTokens,omitempty"`
	// CachedTokens are the input tokens read from the API's prompt cache,
	// when it says.
	CachedTokens int64 `json:"cachedTokens,omitempty"`
	// CacheWriteTokens are the input tokens written to the prompt cache
	// (counted in InputTokens too), when the API says.
	CacheWriteTokens int64 `json:"cacheWriteTokens,omitempty"`
	OutputTokens     int64 `json:"outputTokens,omitempty"`
	// ReasoningTokens are the output tokens spent thinking (counted in
	// OutputTokens too), when the API says.
	ReasoningTokens int64 `json:"reasoningTokens,omitempty"`
	// Turns counts the agent's requests to its model, when it says.
	Turns   int64   `json:"turns,omitempty"`
	CostUSD float64 `json:"costUsd,omitempty"`
	// Models is the usage by model, when the agent says (Claude Code's
	// modelUsage); their Models are empty.
	Models map[string]Usage `json:"models,omitempty"`
}

// IsZero reports whether u reports nothing.
func (u Usage) IsZero() bool {
	return u.InputTokens == 0 && u.CachedTokens == 0 && u.CacheWriteTokens == 0 && u.OutputTokens == 0 &&
		u.ReasoningTokens == 0 && u.Turns == 0 && u.CostUSD == 0 && len(u.Models) == 0
}

// JobCompleted reports an agent run that exited 0 and produced every
// declared output. Emitted by agentworker.
type JobCompleted struct {
	JobID     string `json:"jobId"`
	Step      string `json:"step"`
	Iteration int    `json:"iteration"`
	// RequestSeq is the stream sequence of the job.requested event, so the
	// validator can read the declared outputs and validate command.
	RequestSeq uint64        `json:"requestSeq"`
	Worker     string        `json:"worker"`
	ExitCode   int           `json:"exitCode"`
	DurationMs int64         `json:"durationMs"`
	Artifacts  []ArtifactRef `json:"artifacts"`
	OutputTail string        `json:"outputTail,omitempty"`
	Usage      *Usage        `json:"usage,omitempty"`
	// IgnoredLines counts lines of the agent's event stream of types
	// loopbus does not know (claude and codex backends).
	IgnoredLines int `json:"ignoredLines,omitempty"`
	// APIRetries counts the requests to its model API that the agent's
	// own client retried (claude's api_retry lines, codex's
	// "Reconnecting..." errors).
	APIRetries int `json:"apiRetries,omitempty"`
	// StopReason is the agent's own word on how its run ended (claude's
	// terminal_reason: "completed", "max_turns", "api_error", ...).
	StopReason string `json:"stopReason,omitempty"`
	// Git is the commit a worktree job left.
	Git *GitResult `json:"git,omitempty"`
}

// JobFailed reports an agent run that failed: non-zero exit, time-out,
// missing or unsafe outputs. Emitted by agentworker.
type JobFailed struct {
	JobID      string `json:"jobId"`
	Step       string `json:"step"`
	Iteration  int    `json:"iteration"`
	Worker     string `json:"worker"`
	ExitCode   int    `json:"exitCode"`
	DurationMs int64  `json:"durationMs"`
	Error      string `json:"error"`
	OutputTail string `json:"outputTail,omitempty"`
	Usage      *Usage `json:"usage,omitempty"`
	// Retryable is true when the failure is not the agent's output's fault
	// (for example the worker could not fetch an input).
	Retryable bool `json:"retryable,omitempty"`
	// RateLimited is set when the agent hit a usage or rate limit; ResetAt
	// is when it lifts, if the agent said.
	RateLimited bool       `json:"rateLimited,omitempty"`
	ResetAt     *time.Time `json:"resetAt,omitempty"`
	// Cancelled is set when the worker killed the agent because the job
	// was cancelled (job.cancelled).
	Cancelled bool `json:"cancelled,omitempty"`
	// IgnoredLines, APIRetries and StopReason: see JobCompleted.
	IgnoredLines int    `json:"ignoredLines,omitempty"`
	APIRetries   int    `json:"apiRetries,omitempty"`
	StopReason   string `json:"stopReason,omitempty"`
	// Conflict lists the files a merge job conflicted on.
	Conflict []string `json:"conflict,omitempty"`
}

// ValidationError is one problem found in an artifact.
type ValidationError struct {
	Artifact string `json:"artifact,omitempty"`
	// Pointer is the JSON pointer of the offending value ("" for the root).
	Pointer string `json:"pointer"`
	Message string `json:"message"`
	// Source is "schema" or "command".
	Source string `json:"source,omitempty"`
}

// DisplayPointer writes the root pointer "" as "(root)" for people.
func DisplayPointer(p string) string {
	if p == "" {
		return "(root)"
	}
	return p
}

// String renders the error for people: "artifact pointer: message", or the
// message alone for errors not about one artifact (a validate command's).
func (e ValidationError) String() string {
	if e.Artifact == "" {
		return e.Message
	}
	return e.Artifact + " " + DisplayPointer(e.Pointer) + ": " + e.Message
}

// Verdict is the data of validation.passed and validation.failed.
type Verdict struct {
	JobID     string            `json:"jobId"`
	Step      string            `json:"step"`
	Iteration int               `json:"iteration"`
	Artifacts []ArtifactRef     `json:"artifacts"`
	Errors    []ValidationError `json:"errors,omitempty"`
	RetryHint string            `json:"retryHint,omitempty"`
	// Reports carry the content of passed outputs declared with
	// Output.Report.
	Reports []Report `json:"reports,omitempty"`
}

// StepCompleted records a step whose outputs passed validation.
// Emitted by the orchestrator.
type StepCompleted struct {
	Step       string        `json:"step"`
	JobID      string        `json:"jobId"`
	Iterations int           `json:"iterations"`
	Artifacts  []ArtifactRef `json:"artifacts"`
	// ContentHash is 16 hex digits identifying the artifacts (see
	// schemas.ContentHash).
	ContentHash   string `json:"contentHash"`
	SchemaVersion string `json:"schemaVersion,omitempty"`
}

// StepFailed records a step that used up its iterations or cannot run.
type StepFailed struct {
	Step       string `json:"step"`
	Iterations int    `json:"iterations"`
	Error      string `json:"error"`
}

// SessionCompleted records a session whose every step completed.
type SessionCompleted struct {
	Final []ArtifactRef `json:"final"`
}

// SessionFailed records a session that cannot complete.
type SessionFailed struct {
	Step   string `json:"step,omitempty"`
	Reason string `json:"reason"`
}
