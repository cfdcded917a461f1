package schemas

import (
	"fmt"
	"regexp"
	"strings"
)

// Event types of loop hierarchies (pipelines of kind loops). Each loop runs
// as a step named after its id; these events record what steps cannot say:
// where a loop sits in the tree, how its work reaches the target branch and
// when it no longer stands.
const (
	TypeLoopSpawned     = "loopbus.loop.spawned"
	TypeLoopMerged      = "loopbus.loop.merged"
	TypeLoopRebase      = "loopbus.loop.rebase"
	TypeLoopInvalidated = "loopbus.loop.invalidated"
)

// KindLoops is the pipeline kind of loop hierarchies.
const KindLoops = "loops"

// Ways a level's children are cut from its parent's artifact.
const (
	SplitNone     = ""         // one child, given the whole artifact
	SplitHeadings = "headings" // one child per "## " section
	SplitJSON     = "json"     // one child per item of a JSON array
)

// Loops is the normalized loop hierarchy of a pipeline of kind loops: one
// Loop type, configured per level. The first level is the root.
type Loops struct {
	// Base is the branch the target branch starts from; empty means the
	// repository's current branch when the session starts.
	Base string `json:"base,omitempty"`
	// Levels in file order; Levels[0] is the root's.
	Levels []LoopLevel `json:"levels"`
}

// Level returns the level named name, or nil.
func (l *Loops) Level(name string) *LoopLevel {
	for i := range l.Levels {
		if l.Levels[i].Name == name {
			return &l.Levels[i]
		}
	}
	return nil
}

// NeedsRepo reports whether a level works in a git worktree.
func (l *Loops) NeedsRepo() bool {
	for _, lv := range l.Levels {
		if lv.Worktree {
			return true
		}
	}
	return false
}

// LoopLevel configures every loop of one level.
type LoopLevel struct {
	Name  string    `json:"name"`
	Agent AgentSpec `json:"agent"`
	// Prompt is the template text (read from the file the level names).
	Prompt string `json:"prompt"`
	// PromptPath is the prompt file as written (for messages).
	PromptPath string   `json:"promptPath,omitempty"`
	Outputs    []Output `json:"outputs,omitempty"`
	Validate   []string `json:"validate,omitempty"`
	// MaxIterations bounds the iterations of one loop; at least 1.
	MaxIterations     int   `json:"maxIterations"`
	TimeoutMs         int64 `json:"timeoutMs"`
	ValidateTimeoutMs int64 `json:"validateTimeoutMs,omitempty"`
	// Worktree runs the level's agents in a git worktree of the session's
	// repository; a passed loop's commits are merged into the target
	// branch.
	Worktree bool `json:"worktree,omitempty"`
	// Children says which loops a passed loop of this level spawns.
	Children *LoopChildren `json:"children,omitempty"`
	Breaker  *Breaker      `json:"breaker,omitempty"`
	// Approval, when set, is a gate: each loop of the level waits after
	// its validation passed until it is approved (it completes, then
	// spawns its children or is merged) or rejected.
	Approval *Approval `json:"approval,omitempty"`
	Line     int       `json:"line,omitempty"`
}

// LoopChildren says how a passed loop spawns its children.
type LoopChildren struct {
	Level string `json:"level"`
	// From names the output the children are cut from; each child gets its
	// part as in/<From>.
	From string `json:"from,omitempty"`
	// Split is "", headings or json.
	Split string `json:"split,omitempty"`
	// Path is the JSON pointer of the array to split (split json); ""
	// means the document itself.
	Path string `json:"path,omitempty"`
	// Max bounds the children of one loop.
	Max int `json:"max,omitempty"`
}

// DefaultMaxChildren bounds a loop's children when the file does not.
const DefaultMaxChildren = 50

// LoopsStart is what session.started carries for a loops session.
type LoopsStart struct {
	// Task is the work the session does (--task, --task-file).
	Task string `json:"task"`
	// Repo names the repository for people (its directory's base name);
	// empty when no level works in a worktree.
	Repo string `json:"repo,omitempty"`
	// Base is the branch the target starts from, BaseCommit its commit
	// when the session started, and Bundle a git bundle holding it.
	Base       string       `json:"base,omitempty"`
	BaseCommit string       `json:"baseCommit,omitempty"`
	Bundle     *ArtifactRef `json:"bundle,omitempty"`
	// Target is the branch the session's loops are merged into:
	// loopbus/<session>.
	Target string `json:"target,omitempty"`
	// Identity names the author of the commits loopbus makes: the
	// repository's own user.name and user.email when it sets them.
	Identity *GitIdentity `json:"identity,omitempty"`
}

// GitIdentity is a commit author.
type GitIdentity struct {
	Name  string `json:"name"`
	Email string `json:"email"`
}

// InlineFile is a small input carried in the event itself: a worker writes
// it to in/<Name>.
type InlineFile struct {
	Name    string `json:"name"`
	Content string `json:"content"`
}

// WorktreeSpec tells a worker which commit a job's git worktree starts
// from and how to get it: fetch Bundles in order into its repository cache
// (each needs only commits of the ones before it).
type WorktreeSpec struct {
	Bundles []ArtifactRef `json:"bundles"`
	// Base is the commit the loop's work is based on (the target branch's
	// head when the loop started or was last rebased).
	Base string `json:"base"`
	// From is the commit of the loop's previous iteration ("" at first);
	// FromBase the base it was made on. When FromBase differs from Base,
	// the work is carried over onto Base, or dropped if it conflicts.
	From     string `json:"from,omitempty"`
	FromBase string `json:"fromBase,omitempty"`
	// Branch is the loop's branch: loopbus/<session>/<loop>.
	Branch   string       `json:"branch"`
	Identity *GitIdentity `json:"identity,omitempty"`
	// Merge asks for a merge instead of an agent run: From's commits since
	// FromBase are put on top of Base (fast-forward when they are the
	// same commit) and the result is the target branch's new head.
	Merge bool `json:"merge,omitempty"`
}

// GitResult is the commit a worktree job left: its iteration's work, or a
// merge's new head. Bundle holds the commits since Base (nil when Commit is
// Base).
type GitResult struct {
	Commit string       `json:"commit"`
	Base   string       `json:"base"`
	Bundle *ArtifactRef `json:"bundle,omitempty"`
	// Changed is false when the iteration changed nothing (Commit is
	// Base).
	Changed bool `json:"changed,omitempty"`
}

// LoopSpawned records a loop of the hierarchy. Emitted by the orchestrator:
// the root when the session starts, children when their parent passed (or
// was merged).
type LoopSpawned struct {
	Loop   string `json:"loop"`
	Parent string `json:"parent,omitempty"`
	Level  string `json:"level"`
	// Index is the child's position among its siblings, from 1 (0 for the
	// root).
	Index int `json:"index"`
	// Input is the part of the parent's artifact the loop works on, given
	// to it as in/<InputName>; InputDigest its sha-256.
	Input       string `json:"input,omitempty"`
	InputName   string `json:"inputName,omitempty"`
	InputDigest string `json:"inputDigest,omitempty"`
	// Title is the first line of the input (a section's heading).
	Title string `json:"title,omitempty"`
	// Generation counts the loop's earlier spawns (after invalidations).
	Generation int `json:"generation,omitempty"`
}

// LoopMerged records that a passed loop's commits are on the target
// branch, which now points at Head.
type LoopMerged struct {
	Loop  string `json:"loop"`
	JobID string `json:"jobId"`
	Head  string `json:"head"`
	// Previous is the head before the merge.
	Previous string `json:"previous"`
	// Bundle holds the commits from Previous to Head.
	Bundle ArtifactRef `json:"bundle"`
	// Position counts the merges of the session, from 1.
	Position int `json:"position"`
}

// LoopRebase tells a loop that the target branch moved: its next iteration
// starts from Head. Conflict lists the files its own merge conflicted on
// (the loop then gets an iteration that does not count against
// max_iterations).
type LoopRebase struct {
	Loop     string   `json:"loop"`
	Head     string   `json:"head"`
	Cause    string   `json:"cause"`
	Conflict []string `json:"conflict,omitempty"`
	Reason   string   `json:"reason,omitempty"`
}

// LoopInvalidated records that a loop no longer stands: an ancestor was
// invalidated or re-iterated. Its job is cancelled and its unmerged work
// dropped; the ancestor spawns its children again when it passes.
type LoopInvalidated struct {
	Loop   string `json:"loop"`
	Cause  string `json:"cause"`
	Reason string `json:"reason,omitempty"`
}

// Title returns text's first non-empty line without heading marks (a
// section's heading), cut to at most max bytes on a character boundary;
// "" when text has none.
func Title(text string, max int) string {
	for line := range strings.Lines(text) {
		if t := strings.TrimSpace(strings.TrimLeft(line, "# ")); t != "" {
			if len(t) > max {
				t = strings.ToValidUTF8(t[:max], "")
			}
			return t
		}
	}
	return ""
}

// definitionPath is the shape of DefinitionFile.Path.
var definitionPath = regexp.MustCompile(`^[A-Za-z0-9_-][A-Za-z0-9._-]*(/[A-Za-z0-9_-][A-Za-z0-9._-]*)*$`)

// ValidateDefinitionPath accepts a DefinitionFile.Path: relative,
// slash-separated segments of A-Z, a-z, 0-9, ., _ and -, none starting with
// a dot (so never ".."), at most 1024 bytes. Errors wrap ErrBadName.
func ValidateDefinitionPath(p string) error {
	if len(p) > 1024 || !definitionPath.MatchString(p) {
		return fmt.Errorf("%w: definition file path %q: want a relative path of segments of A-Z, a-z, 0-9, ., _ and -, none starting with a dot", ErrBadName, p)
	}
	return nil
}
