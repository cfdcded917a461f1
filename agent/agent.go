// Package agent is the one interface through which loopbus runs an agent: a
// Backend runs a Job (a prompt, a workspace, an environment) and streams
// what the agent does as Events; backends live in the packages below
// (exec, claude, codex run programs; openai and anthropic call a model's
// API and run its tools through modelapi) and are found by name in a
// Registry.
package agent

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/loopbus/loopbus/schemas"
)

// Backend runs agents of one kind (schemas.AgentSpec.Backend).
//
// Run runs job's agent until it exits, job.Timeout expires or ctx ends, and
// returns how the run ended. While it runs, it calls emit with each Event,
// in the order the agent reported them, from one goroutine at a time and
// never after Run has returned. When ctx ends, Run kills the agent and
// everything it started (its process group) and returns promptly with
// Result.Canceled set. Run returns an error only when the agent could not
// be started; an agent that fails reports it through its exit code and
// KindFailure events.
type Backend interface {
	Run(ctx context.Context, job Job, emit func(Event)) (Result, error)
}

// Job is one run of an agent.
type Job struct {
	// Spec is the agent as configured: backend, command, model, arguments,
	// tools. Env and SecretEnv in it are the caller's business: the
	// agent's environment is Env below.
	Spec schemas.AgentSpec
	// Dir is the agent's working directory (the workspace root, or the
	// worktree); it must exist.
	Dir string
	// Root is the directory the tools of a model-API backend are confined
	// to: Dir or a directory above it (the workspace that holds a
	// worktree beside in/ and out/); "" means Dir.
	Root string
	// Env is the agent's whole environment (KEY=VALUE).
	Env []string
	// Prompt is given to the agent (command-line agents read it on stdin).
	Prompt string
	// Timeout bounds the run; 0 means none.
	Timeout time.Duration
	// TailBytes is how many bytes of the end of the agent's output
	// Result.Tail keeps; 0 means procrun.DefaultTailBytes.
	TailBytes int
	// Forbidden are lane table keys (tool names, or prefixes ending in
	// "*"; see LaneTable.Keys) of tools the agent must not use. A backend
	// that can tell its agent so beforehand does (claude's
	// --disallowedTools); the caller stops an agent that uses one anyway.
	Forbidden []string
}

// Result is how a run ended.
type Result struct {
	// ExitCode is the agent's exit status; -1 if it was killed by a signal
	// or did not start.
	ExitCode int
	// Duration is how long the run took.
	Duration time.Duration
	// TimedOut reports that Job.Timeout expired and the agent was killed.
	TimedOut bool
	// Canceled reports that ctx ended and the agent was killed (or never
	// started).
	Canceled bool
	// Tail is the end of the agent's combined output, at most
	// Job.TailBytes bytes, starting with "…" when older output was
	// dropped. It is not masked: secrets are the caller's business.
	Tail string
}

// Kind is the kind of an Event.
type Kind int

const (
	// KindUnknown is a line of a type the backend does not know, or
	// malformed JSON: never fatal; the caller counts them. Raw names the
	// line's type ("invalid" when it has none), Text holds a malformed
	// line.
	KindUnknown Kind = iota
	// KindToolStart is a tool call that began (ToolID, Name, Category,
	// Input).
	KindToolStart
	// KindToolEnd is a tool call that ended (ToolID, Name, Category,
	// Output, IsError; Duration, ExitCode, TimedOut and Error if known).
	// Its ToolID is that of an earlier KindToolStart of the same run.
	KindToolEnd
	// KindMessage is text the agent wrote (Text).
	KindMessage
	// KindUsage is token usage and/or cost (Usage); a run's usage is the
	// sum of its KindUsage events.
	KindUsage
	// KindRateLimit is a usage or rate limit the agent hit (Text; ResetAt
	// if the agent said when it lifts). The run did not finish its work.
	KindRateLimit
	// KindFailure is the agent's own report that its run failed (Text says
	// why, or is empty).
	KindFailure
	// KindRetry is a request to the agent's model API that failed and
	// that the agent's own client retries (Text says why); the run goes
	// on. A caller counts them.
	KindRetry
	// KindStop is the agent's own word on how its run ended (Text: its
	// reason as the agent spells it, such as Claude Code's
	// terminal_reason "completed", "max_turns" or "api_error").
	KindStop
)

var kindNames = [...]string{"unknown", "tool-start", "tool-end", "message", "usage", "rate-limit", "failure", "retry", "stop"}

func (k Kind) String() string {
	if k >= 0 && int(k) < len(kindNames) {
		return kindNames[k]
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Event is one thing an agent did or reported. Only the fields listed for
// its Kind are meaningful.
type Event struct {
	Kind   Kind
	ToolID string
	Name   string
	// Category is what kind of tool it is: "shell", "edit", "read", "web",
	// "mcp", "agent", "internal" (the agent's own bookkeeping), "exec"
	// (the agent's own program) or "other" (unknown: heavy); a
	// LaneTable maps tools without an entry to a lane by it.
	Category string
	// Input, Output and Text are summaries of at most MaxSummary bytes,
	// except the Output of a tool that is the agent's process itself
	// (exec): that is its output tail, as in Result.Tail.
	Input    string
	Output   string
	IsError  bool
	Duration time.Duration
	// ExitCode, TimedOut and Error: a tool that is a process reports its
	// exit status (-1 when killed or not started), whether its time ran
	// out, and why it failed when not by its exit status.
	ExitCode int
	TimedOut bool
	Error    string
	Text     string
	Usage    Usage
	// Models is a KindUsage's Usage by model, when the agent reports it
	// so (Claude Code's modelUsage); Usage is their sum.
	Models  map[string]Usage
	ResetAt time.Time
	// Raw is the line's type (and subtype), for counting unknown lines.
	Raw string
}

// Usage is token usage and cost as reported by an agent; zero means not
// reported. InputTokens excludes the cached ones (CacheReadTokens) and
// those written to the cache (CacheWriteTokens); ReasoningTokens are
// counted in OutputTokens too. Turns counts the agent's requests to its
// model, when it says.
type Usage struct {
	InputTokens, OutputTokens, CacheReadTokens, CacheWriteTokens int64
	ReasoningTokens, Turns                                       int64
	CostUSD                                                      float64
}

// MaxSummary is the maximum size in bytes of Event.Input, Output and Text.
const MaxSummary = 2000

// Truncate cuts s to at most MaxSummary bytes on a rune boundary.
func Truncate(s string) string {
	if len(s) <= MaxSummary {
		return s
	}
	cut := MaxSummary
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut]
}

// Parser turns the lines of one run of a command-line agent into events.
// It is not safe for concurrent use.
type Parser interface {
	// Line parses one line (without the newline). Blank lines give nil.
	// Malformed JSON gives one KindUnknown event, never an error.
	Line(line []byte) []Event
}

// Tool is a tool an agent may use, as a lane table sees it.
type Tool struct{ Name, Category string }

// ToolPlanner is a Backend that can tell before a run some of the tools
// the agent will use (claude: its allowed tools; exec: its program), so
// that a caller lacking their lanes can leave the job to others.
type ToolPlanner interface {
	PlannedTools(spec schemas.AgentSpec) []Tool
}

// LaneDefaulter is a Backend whose tools have default lanes: lane table
// entries (see NewLaneTable) a configuration may override.
type LaneDefaulter interface {
	DefaultLanes() map[string]string
}

// ErrUnsupported is wrapped by Registry.Lookup's error for a backend name
// it does not hold.
var ErrUnsupported = errors.New("not supported")

// ErrOutput: the agent's output could not be read (its parser crashed on
// a line); the run's result is not to be trusted.
var ErrOutput = errors.New("unreadable agent output")

// Registry holds backends by name (schemas.BackendExec, BackendClaude,
// BackendCodex, ...).
type Registry map[string]Backend

// Lookup returns the backend named name, or an error wrapping
// ErrUnsupported that lists the names r holds.
func (r Registry) Lookup(name string) (Backend, error) {
	if b := r[name]; b != nil {
		return b, nil
	}
	return nil, fmt.Errorf("agent backend %q is %w by this worker (supported: %s)", name, ErrUnsupported,
		strings.Join(slices.Sorted(maps.Keys(r)), ", "))
}

// DefaultLanes returns the default lanes of r's backends (those that are
// LaneDefaulters) in one map; where two give a key, the backend whose name
// sorts last wins.
func (r Registry) DefaultLanes() map[string]string {
	all := map[string]string{}
	for _, name := range slices.Sorted(maps.Keys(r)) {
		if d, ok := r[name].(LaneDefaulter); ok {
			maps.Copy(all, d.DefaultLanes())
		}
	}
	return all
}
