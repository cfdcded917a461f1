package schemas

import (
	"encoding/json"
	"slices"
	"strings"
)

// TypeSessionForked starts a session as a fork of another: its history is
// the origin's up to the fork point (copied events, see Event.ForkOf),
// then it goes on live. Stated by people and tools (the client role).
const TypeSessionForked = "loopbus.session.forked"

// HistoryEntity is the subject token under which a session's copied
// history lies: the copy of an event of type loopbus.<entity>.<verb> is
// stored on loopbus.evt.<session>.history.<entity>.<verb>. The services'
// consumers (workers on job.requested, the validator on job.completed)
// filter on five-token subjects, so copied history never reaches them;
// readers of a session's whole history (loopbus.evt.<session>.>) see it.
const HistoryEntity = "history"

// MaxForkCopies bounds the events a fork copies: they are committed with
// its session.forked in one atomic batch (JetStream takes at most 1000
// messages in one), so a fork exists whole or not at all.
const MaxForkCopies = 999

// MaxForkDepth bounds a chain of forks (a fork of a fork of …) that the
// orchestrator reads back to build a fork's first state.
const MaxForkDepth = 16

// SessionForked starts a session from the history of Origin up to the
// fork point: the event Event, stored at stream sequence Seq. The Copied
// events before it in the new session are copies of the origin's events
// up to that point (each with Event.ForkOf set); they are history, which
// the orchestrator does not take from them: it reads the origin's own
// history up to Seq (events verified as the origin's) to build the fork's
// state, and checks that the origin has Copied events up to Seq (at most
// MaxForkCopies: it reads no further). It does not count the copies in
// the fork's history; it refuses a copy into a session that exists, so
// none follow session.forked.
//
// Pipeline, Input, SourceHash and DefinitionFiles are what the fork runs
// with, as session.started carries them: the origin's, or a changed
// pipeline or input. The fork runs under the origin's budget at the fork
// point (raises by session.budget included) tightened by Budget, which
// loopbus fork sets to that budget, tightened by a changed pipeline's
// budget. Steps that completed at the fork point and
// are not in Changed (see ChangedSteps) keep their results; the others,
// and every step requiring one of them, directly or not, run again.
//
// A loops session forks its loop tree by the same rule: a loop that
// completed at the fork point and whose level is not in Changed (see
// ChangedLevels) keeps its results and its children; a loop that had not
// completed, or whose level changed, runs again in a new round, and the
// loops under it are dropped (it spawns them anew when it passes). When
// its levels work in git worktrees, the fork merges into a target branch
// of its own (loopbus/<fork>) that starts at the origin's target head at
// the fork point (its start's bundle and those of its loop.merged events
// up to there bring it). A fork that would run again (or drop) a loop
// merged by then is refused: its commits are in that head, and later
// merges were built on them; loopbus fork moves its point back before
// the decision that merged it instead.
//
// A backlog session forks with its task list, phase and run counts as
// they were at the fork point: runs that had finished keep their
// results, runs not finished run again; Changed lists the roles whose
// definition differs (see ChangedRoles). A fork whose changed role had
// completed runs is refused (their changes are in the task list it
// keeps, and later runs worked on it; loopbus fork moves its point back
// before the first of them instead), as is a backlog with workdir: repo.
type SessionForked struct {
	Origin string `json:"origin"`
	Seq    uint64 `json:"seq"`
	Event  string `json:"event"`
	Copied int    `json:"copied"`
	// Pipeline is the whole normalized pipeline the fork runs.
	Pipeline        Pipeline         `json:"pipeline"`
	Input           ArtifactRef      `json:"input"`
	SourceHash      string           `json:"sourceHash"`
	Budget          *Budget          `json:"budget,omitempty"`
	DefinitionFiles []DefinitionFile `json:"definitionFiles,omitempty"`
	// Changed are the steps (for a loops session, the levels; for a
	// backlog, the roles) whose definition differs from the origin's (all of them when the input
	// changed), in pipeline order.
	Changed []string `json:"changed,omitempty"`
	// Reason says why, for people reading the history.
	Reason string `json:"reason,omitempty"`
}

// ChangedSteps returns the steps of next, in its order, that a fork of a
// session that ran old must run again whatever they did: every step when
// inputChanged (any step may read the input); else the steps old does not
// have, those whose definition differs, and those whose definition names
// a file of the pipeline's directory whose content (or presence) changed
// (scripts travel as DefinitionFiles); every step when the pipeline's
// directory moved (relative paths in commands name other files).
func ChangedSteps(old, next Pipeline, oldFiles, nextFiles []DefinitionFile, inputChanged bool) []string {
	files := changedFiles(oldFiles, nextFiles)
	var out []string
	for _, st := range next.Steps {
		i := slices.IndexFunc(old.Steps, func(o Step) bool { return o.Name == st.Name })
		if inputChanged || i < 0 || definitionChanged(old.Steps[i], st, files) || old.Dir != next.Dir {
			out = append(out, st.Name)
		}
	}
	return out
}

// ChangedLevels is ChangedSteps for loops sessions: the levels of next,
// in its order, whose loops (and their subtrees) a fork of a session that
// ran old must run again whatever they did: every level when inputChanged
// or the pipeline's directory moved; else the levels old does not have,
// those whose definition differs (its children's spec included), and
// those naming a file of the pipeline's directory that changed.
func ChangedLevels(old, next Pipeline, oldFiles, nextFiles []DefinitionFile, inputChanged bool) []string {
	if next.Loops == nil {
		return nil
	}
	var was []LoopLevel
	if old.Loops != nil {
		was = old.Loops.Levels
	}
	files := changedFiles(oldFiles, nextFiles)
	var out []string
	for _, lv := range next.Loops.Levels {
		i := slices.IndexFunc(was, func(o LoopLevel) bool { return o.Name == lv.Name })
		if inputChanged || i < 0 || definitionChanged(was[i], lv, files) || old.Dir != next.Dir {
			out = append(out, lv.Name)
		}
	}
	return out
}

// changedFiles returns the paths of the definition files whose content
// (or presence, or executable bit) differs between old and next.
func changedFiles(oldFiles, nextFiles []DefinitionFile) []string {
	var files []string
	digest := func(fs []DefinitionFile, path string) string {
		i := slices.IndexFunc(fs, func(f DefinitionFile) bool { return f.Path == path })
		if i < 0 {
			return ""
		}
		if fs[i].Executable {
			return fs[i].Artifact.Digest + " executable"
		}
		return fs[i].Artifact.Digest
	}
	for _, fs := range [][]DefinitionFile{oldFiles, nextFiles} {
		for _, f := range fs {
			if digest(oldFiles, f.Path) != digest(nextFiles, f.Path) && !slices.Contains(files, f.Path) {
				files = append(files, f.Path)
			}
		}
	}
	return files
}

// definitionChanged reports whether a step's or level's definition
// differs between old and next, or names one of the changed files.
func definitionChanged(old, next any, files []string) bool {
	a, _ := json.Marshal(old)
	b, _ := json.Marshal(next)
	if string(a) != string(b) {
		return true
	}
	return slices.ContainsFunc(files, func(f string) bool { return strings.Contains(string(b), f) })
}

// HistorySubjectFor returns the stream subject of the copy, in session's
// history, of an event of type typ (see HistoryEntity).
func HistorySubjectFor(session, typ string) (string, error) {
	if err := ValidateSessionID(session); err != nil {
		return "", err
	}
	ev, err := EntityVerb(typ)
	if err != nil {
		return "", err
	}
	return SubjectPrefix + "." + session + "." + HistoryEntity + "." + ev, nil
}

// OnStreamSubject reports whether subject is e's StreamSubject, without
// making it (readers check every event they read against the subject it
// was stored on). It reports false when StreamSubject fails: for an
// invalid session id or type.
func (e Event) OnStreamSubject(subject string) bool {
	ev, err := EntityVerb(e.Type)
	if err != nil || ValidateSessionID(e.Session) != nil {
		return false
	}
	rest, ok := strings.CutPrefix(subject, SubjectPrefix+".")
	if rest, ok = cutToken(rest, e.Session, ok); !ok {
		return false
	}
	if e.ForkOf != "" {
		if rest, ok = cutToken(rest, HistoryEntity, true); !ok {
			return false
		}
	}
	return rest == ev
}

// cutToken returns s after prefix and a dot, and whether s starts so (and
// ok was true).
func cutToken(s, prefix string, ok bool) (string, bool) {
	if !ok || len(s) <= len(prefix) || s[:len(prefix)] != prefix || s[len(prefix)] != '.' {
		return "", false
	}
	return s[len(prefix)+1:], true
}

// StreamSubject returns the stream subject of e: SubjectFor its session
// and type, or HistorySubjectFor them when e is a copy (ForkOf set).
func (e Event) StreamSubject() (string, error) {
	if e.ForkOf != "" {
		return HistorySubjectFor(e.Session, e.Type)
	}
	return SubjectFor(e.Session, e.Type)
}

// ChangedRoles is ChangedSteps for backlog sessions: the roles (iterate,
// bootstrap, repair, review) of next whose runs a fork of a session that
// ran old must run with another definition: every role when inputChanged
// or the pipeline's directory moved; else those whose agents, prompt,
// approval gate or run bounds differ, or that name a changed file of the
// pipeline's directory. The schedule, parallelism, source files and
// workdir are the backlog's, not a role's: they count for every role.
func ChangedRoles(old, next Pipeline, oldFiles, nextFiles []DefinitionFile, inputChanged bool) []string {
	if next.Backlog == nil {
		return nil
	}
	files := changedFiles(oldFiles, nextFiles)
	role := func(b *Backlog, r string) any {
		if b == nil {
			return nil
		}
		names := b.Roles[r]
		if len(names) == 0 && r != RoleIterate {
			names = b.Roles[RoleIterate][:min(1, len(b.Roles[RoleIterate]))]
		}
		agents := make([]AgentSpec, 0, len(names))
		for _, n := range names {
			agents = append(agents, b.Agents[n])
		}
		type shared struct {
			Schedule, Project, Workdir, Base  string
			MaxParallel, MaxSummaryIterations int
			TimeoutMs, ValidateTimeoutMs      int64
			SourceFiles, Validate             []string
		}
		return struct {
			Agents   []AgentSpec
			Prompt   string
			Approval *Approval
			Shared   shared
		}{agents, b.Prompts[r], approvalOf(b, r), shared{b.Schedule, b.Project, b.Workdir, b.Base, b.MaxParallel, b.MaxSummaryIterations,
			b.TimeoutMs, b.ValidateTimeoutMs, b.SourceFiles, b.Validate}}
	}
	var out []string
	for _, r := range []string{RoleBootstrap, RoleIterate, RoleRepair, RoleReview} {
		if inputChanged || old.Backlog == nil || old.Dir != next.Dir || definitionChanged(role(old.Backlog, r), role(next.Backlog, r), files) {
			out = append(out, r)
		}
	}
	return out
}

func approvalOf(b *Backlog, role string) *Approval {
	if a, ok := b.Approval[role]; ok {
		return &a
	}
	return nil
}
