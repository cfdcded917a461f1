package orchestrator

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/loopbus/loopbus/schemas"
)

// A loops session runs each loop of its hierarchy as a step named after the
// loop's id (the root's level name, then <parent>-001, <parent>-002, …), so
// feedback, retries, rate-limit waits, the breaker, signals, budgets and
// approval gates (a level's approval: its loops complete, and spawn their
// children, only once approved) are the pipelines'. What differs is decided here: which loops exist (spawned
// from a passed parent's artifact), and how a worktree loop's commits reach
// the target branch (a merge queue, one merge job at a time, in pass
// order).

// Loop statuses.
const (
	LoopRunning     = "running"
	LoopMerging     = "merging"
	LoopCompleted   = "completed"
	LoopFailed      = "failed"
	LoopInvalidated = "invalidated"
)

// StepInvalidatedLoop is the status of the step of a loop that no longer
// stands (an ancestor was invalidated): nothing runs for it until it is
// spawned again.
const StepInvalidatedLoop = "invalidated"

// MaxRebases bounds the iterations a loop gets because its merge
// conflicted; they do not count against max_iterations.
const MaxRebases = 5

// MaxChildErrors bounds how often a loop re-iterates because a child used
// up its iterations; after that the session fails.
const MaxChildErrors = 2

// LoopsState is a loops session's state beyond its steps.
type LoopsState struct {
	Def   schemas.Loops
	Start schemas.LoopsStart
	Loops map[string]*Loop
	// Head is the target branch's head; Bundles bring a worker's cache to
	// it, in order.
	Head    string
	Bundles []schemas.ArtifactRef
	// Queue holds the passed worktree loops waiting to merge, in pass
	// order; Merging is the one whose merge job (MergeJob, attempt
	// MergeAttempt) runs.
	Queue        []string
	Merging      string
	MergeJob     string
	MergeAttempt int
	// MergeResult and MergeFailure hold the merge job's report until it is
	// decided on.
	MergeResult  *schemas.GitResult
	MergeFailure *schemas.JobFailed
	// Merges counts the merges (and merge job requests: MergeRequests)
	// of the session; they keep ids unique.
	Merges, MergeRequests int
}

// Loop is one loop of the hierarchy.
type Loop struct {
	ID, Parent, Level string
	Index, Generation int
	Input, InputName  string
	Status            string
	// Base is the commit the loop's next iteration starts from (worktree
	// levels); Candidate the commit of its latest iteration, Passed the
	// one whose validation passed (merged next).
	Base      string
	Candidate *schemas.GitResult
	Passed    *schemas.GitResult
	// Rebases counts iterations after conflicting merges.
	Rebases int
	// MergeCommit is the target head its merge made.
	MergeCommit string
	// ChildErrors counts re-iterations because a child failed.
	ChildErrors int
	// Parts are the children's inputs cut from a passed artifact, kept
	// until they are spawned.
	Parts []string
}

// Levels of the loops a backlog with workdir: repo registers: its task runs
// are merged, its role runs (bootstrap, repair, review) work on the head
// but are not.
const (
	backlogTaskLevel = "task"
	backlogRoleLevel = "role"
)

// backlogLoops is the loop levels of a backlog with workdir: repo.
func backlogLoops() schemas.Loops {
	return schemas.Loops{Levels: []schemas.LoopLevel{{Name: backlogTaskLevel, Worktree: true}, {Name: backlogRoleLevel, Worktree: true}}}
}

func newLoopsState(def schemas.Loops, d *schemas.SessionStarted) *LoopsState {
	l := &LoopsState{Def: def, Loops: map[string]*Loop{}}
	if d.Loops != nil {
		l.Start = *d.Loops
		l.Head = d.Loops.BaseCommit
		if d.Loops.Bundle != nil {
			l.Bundles = []schemas.ArtifactRef{*d.Loops.Bundle}
		}
	}
	return l
}

func (l *LoopsState) clone() *LoopsState {
	c := *l
	c.Loops = make(map[string]*Loop, len(l.Loops))
	for k, v := range l.Loops {
		lc := *v
		lc.Parts = slices.Clone(v.Parts)
		c.Loops[k] = &lc
	}
	c.Bundles = slices.Clone(l.Bundles)
	c.Queue = slices.Clone(l.Queue)
	return &c
}

// descendants returns the ids of the loops under id, sorted.
func (l *LoopsState) descendants(id string) []string {
	var out []string
	for k := range l.Loops {
		if strings.HasPrefix(k, id+"-") {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

// ChildID names the index-th child (from 1) of loop parent.
func ChildID(parent string, index int) string { return fmt.Sprintf("%s-%03d", parent, index) }

// BranchOf names a loop's branch.
func BranchOf(session, loop string) string { return "loopbus/" + session + "/" + loop }

// TargetOf names a session's target branch.
func TargetOf(session string) string { return "loopbus/" + session }

// evolveLoops applies the events that concern the loop tree; it runs after
// the step machinery has applied ev.
func (l *LoopsState) evolve(s *Session, ev schemas.Event) {
	switch d := ev.Data.(type) {
	case *schemas.TaskSelected:
		if s.Steps[d.ID] != nil && s.Backlog != nil {
			l.Loops[d.ID] = &Loop{ID: d.ID, Level: backlogTaskLevel, Status: LoopRunning, Base: l.Head}
		}
	case *schemas.BacklogPhase:
		if s.Steps[d.Phase] != nil && slices.Contains(roleSteps, d.Phase) {
			l.Loops[d.Phase] = &Loop{ID: d.Phase, Level: backlogRoleLevel, Status: LoopRunning, Base: l.Head}
		}
	case *schemas.LoopSpawned:
		lv := l.Def.Level(d.Level)
		if lv == nil {
			return
		}
		l.Loops[d.Loop] = &Loop{ID: d.Loop, Parent: d.Parent, Level: d.Level, Index: d.Index, Generation: d.Generation,
			Input: d.Input, InputName: d.InputName, Status: LoopRunning, Base: l.Head}
		if p := l.Loops[d.Parent]; p != nil {
			p.Parts = nil // spawned
		}
		st := &Step{Def: loopStepDef(d.Loop, lv), Status: StepPending}
		if prev := s.Steps[d.Loop]; prev != nil {
			// Job ids of the earlier generation stay unique.
			st.Round, st.Hints, st.Hold = prev.Round+1, prev.Hints, prev.Hold
		}
		s.Steps[d.Loop] = st
	case *schemas.JobCompleted:
		if d.Git == nil {
			return
		}
		if d.JobID == l.MergeJob && l.MergeJob != "" {
			g := *d.Git
			l.MergeResult = &g
			return
		}
		if st, lp := s.Steps[d.Step], l.Loops[d.Step]; st != nil && lp != nil && st.JobID == d.JobID && st.Status == StepRunning {
			g := *d.Git
			lp.Candidate = &g
		}
	case *schemas.JobFailed:
		if d.JobID == l.MergeJob && l.MergeJob != "" {
			f := *d
			l.MergeFailure = &f
		}
	case *schemas.StepCompleted:
		lp := l.Loops[d.Step]
		if lp == nil {
			return
		}
		if lv := l.Def.Level(lp.Level); lv != nil && lv.Worktree && lp.Level != backlogRoleLevel && lp.Candidate != nil && lp.Candidate.Changed {
			lp.Status, lp.Passed = LoopMerging, lp.Candidate
			l.Queue = append(l.Queue, lp.ID)
			return
		}
		lp.Status = LoopCompleted
	case *schemas.StepFailed:
		if lp := l.Loops[d.Step]; lp != nil {
			lp.Status = LoopFailed
		}
	case *schemas.StepInvalidated:
		lp := l.Loops[d.Step]
		if lp == nil {
			return
		}
		lp.Status, lp.Candidate, lp.Passed, lp.Parts, lp.Base, lp.MergeCommit = LoopRunning, nil, nil, nil, l.Head, ""
		l.unqueue(lp.ID)
		if d.Cause != d.Step {
			// A child used up its iterations: the loop iterates again
			// with the child's last failure as feedback.
			lp.ChildErrors++
			if st := s.Steps[d.Step]; st != nil {
				st.Feedback = []schemas.Feedback{{Iteration: 1, Kind: "child", Message: d.Reason}}
			}
		}
	case *schemas.LoopInvalidated:
		lp := l.Loops[d.Loop]
		if lp == nil {
			return
		}
		lp.Status, lp.Parts = LoopInvalidated, nil
		l.unqueue(lp.ID)
		if st := s.Steps[d.Loop]; st != nil {
			st.Status, st.Outcome, st.Passed, st.Failure = StepInvalidatedLoop, outcomeNone, nil, nil
		}
	case *schemas.JobRequested:
		if d.Worktree != nil && d.Worktree.Merge && slices.Contains(l.Queue, d.Step) && (l.Merging == "" || l.Merging == d.Step) {
			l.Merging, l.MergeJob, l.MergeAttempt, l.MergeResult, l.MergeFailure = d.Step, d.JobID, max(d.Attempt, 1), nil, nil
			if d.Attempt <= 1 {
				l.MergeRequests++
			}
		}
	case *schemas.LoopMerged:
		lp := l.Loops[d.Loop]
		if lp == nil {
			return
		}
		if d.Head != l.Head && d.Bundle.Object != "" {
			l.Bundles = append(l.Bundles, d.Bundle)
		}
		l.Head = d.Head
		lp.Status, lp.MergeCommit = LoopCompleted, d.Head
		l.Merges++
		l.unqueue(lp.ID)
	case *schemas.LoopRebase:
		lp := l.Loops[d.Loop]
		if lp == nil {
			return
		}
		lp.Base = d.Head
		if len(d.Conflict) == 0 {
			return
		}
		// Its merge conflicted: it iterates again on the new head.
		l.unqueue(lp.ID)
		lp.Status, lp.Candidate, lp.Passed = LoopRunning, nil, nil
		lp.Rebases++
		if st := s.Steps[d.Loop]; st != nil {
			st.Status, st.Outcome, st.Passed = StepRunning, outcomeFailed, nil
			st.Failure = &schemas.Feedback{Iteration: st.Iteration, Kind: "merge", Message: d.Reason,
				RetryHint: "Do the work again on the new head of the target branch; keep the changes merged meanwhile."}
			st.Free++
		}
	}
}

// unqueue takes id out of the merge queue and forgets its merge job.
func (l *LoopsState) unqueue(id string) {
	l.Queue = slices.DeleteFunc(l.Queue, func(q string) bool { return q == id })
	if l.Merging == id {
		l.Merging, l.MergeJob, l.MergeResult, l.MergeFailure = "", "", nil, nil
	}
}

// loopStepDef is the step a loop of level lv runs.
func loopStepDef(id string, lv *schemas.LoopLevel) *schemas.Step {
	return &schemas.Step{Name: id, Agent: lv.Agent, Prompt: lv.Prompt, Outputs: lv.Outputs, Validate: lv.Validate,
		MaxIterations: max(lv.MaxIterations, 1), TimeoutMs: lv.TimeoutMs, ValidateTimeoutMs: lv.ValidateTimeoutMs, Breaker: lv.Breaker, Line: lv.Line,
		Approval: lv.Approval}
}

// checkParts cuts a passed loop's children inputs from its report; a report
// that yields none (or too many) turns the verdict into a failure fed back
// to the next iteration.
func (l *LoopsState) checkParts(st *Step, v *schemas.Verdict) {
	lp := l.Loops[st.Def.Name]
	if lp == nil {
		return
	}
	lv := l.Def.Level(lp.Level)
	if lv == nil || lv.Children == nil {
		return
	}
	c := lv.Children
	if c.From == "" {
		lp.Parts = []string{""}
		return
	}
	var raw json.RawMessage
	for _, r := range v.Reports {
		if r.Name == c.From {
			raw = r.Content
		}
	}
	parts, err := SplitArtifact(raw, c)
	if err == nil && len(parts) > max(c.Max, 1) && c.Max > 0 {
		err = fmt.Errorf("it yields %d children, over the level's max of %d", len(parts), c.Max)
	}
	if err != nil {
		errs := []schemas.ValidationError{{Artifact: c.From, Message: err.Error(), Source: "schema"}}
		st.Outcome, st.Passed = outcomeFailed, nil
		st.Failure = &schemas.Feedback{Iteration: v.Iteration, Kind: "validation", Errors: errs,
			RetryHint: "Write " + c.From + " again so that it can be split into the loops of level " + c.Level + "."}
		st.repeat(verdictSignature(&schemas.Verdict{Errors: errs, Artifacts: v.Artifacts}))
		return
	}
	lp.Parts = parts
}

// SplitArtifact cuts a report's content into children's inputs: with split
// headings, one part per "## " section (the heading line included); with
// json, one part per item of the array at c.Path, each as JSON; with none,
// the whole artifact. It fails when there is nothing to cut.
func SplitArtifact(raw json.RawMessage, c *schemas.LoopChildren) ([]string, error) {
	if raw == nil {
		return nil, fmt.Errorf("the verdict carries no content of %s", c.From)
	}
	if c.Split == schemas.SplitJSON {
		var doc any
		if err := json.Unmarshal(raw, &doc); err != nil {
			return nil, fmt.Errorf("not JSON: %w", err)
		}
		v, ok := pointer(doc, c.Path)
		arr, isArr := v.([]any)
		if !ok || !isArr {
			return nil, fmt.Errorf("no JSON array at %s", schemas.DisplayPointer(c.Path))
		}
		if len(arr) == 0 {
			return nil, fmt.Errorf("the array at %s is empty: no child to spawn", schemas.DisplayPointer(c.Path))
		}
		out := make([]string, 0, len(arr))
		for _, it := range arr {
			b, _ := json.MarshalIndent(it, "", "  ")
			out = append(out, string(b)+"\n")
		}
		return out, nil
	}
	var text string
	if err := json.Unmarshal(raw, &text); err != nil {
		text = string(raw)
	}
	if c.Split == schemas.SplitNone {
		return []string{text}, nil
	}
	var out []string
	var cur *strings.Builder
	fence := false
	for line := range strings.Lines(text) {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fence = !fence
		}
		if !fence && strings.HasPrefix(line, "## ") {
			cur = &strings.Builder{}
			out = append(out, "")
		}
		if cur != nil {
			cur.WriteString(line)
			out[len(out)-1] = cur.String()
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no \"## \" heading: each section under one becomes a child")
	}
	return out, nil
}

// pointer resolves a JSON pointer in doc.
func pointer(doc any, p string) (any, bool) {
	if p == "" {
		return doc, true
	}
	for _, tok := range strings.Split(strings.TrimPrefix(p, "/"), "/") {
		tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
		switch v := doc.(type) {
		case map[string]any:
			x, ok := v[tok]
			if !ok {
				return nil, false
			}
			doc = x
		case []any:
			i, err := strconv.Atoi(tok)
			if err != nil || i < 0 || i >= len(v) {
				return nil, false
			}
			doc = v[i]
		default:
			return nil, false
		}
	}
	return doc, true
}

// spawn records the loops a loop's parts call for.
func (d *decider) spawn(lp *Loop) {
	l := d.s.Loops
	lv := l.Def.Level(lp.Level)
	if lv == nil || lv.Children == nil {
		return
	}
	parts := lp.Parts
	gen := d.s.Steps[lp.ID].Round
	for i, part := range parts {
		id := ChildID(lp.ID, i+1)
		var childGen int
		if prev := l.Loops[id]; prev != nil {
			childGen = prev.Generation + 1
		}
		sp := &schemas.LoopSpawned{Loop: id, Parent: lp.ID, Level: lv.Children.Level, Index: i + 1, Generation: childGen}
		if lv.Children.From != "" {
			sp.Input, sp.InputName, sp.InputDigest, sp.Title = part, lv.Children.From, schemas.Digest([]byte(part)), schemas.Title(part, 120)
		}
		d.emit(schemas.TypeLoopSpawned, id, sp, "loop", id, "parent-round", strconv.Itoa(gen), "gen", strconv.Itoa(childGen))
	}
}

// loopsFill spawns the root, runs the merge queue, and completes the
// session when every loop is done. It reports whether it emitted anything.
func (d *decider) loopsFill() bool {
	s, l := d.s, d.s.Loops
	if len(l.Loops) == 0 {
		root := l.Def.Levels[0].Name
		d.emit(schemas.TypeLoopSpawned, root, &schemas.LoopSpawned{Loop: root, Level: root, Title: schemas.Title(l.Start.Task, 120)}, "loop", root)
		return true
	}
	changed := false
	// Children of loops that completed (or were merged) and are not
	// spawned yet.
	for _, id := range sortedLoopIDs(l) {
		if lp := l.Loops[id]; lp.Status == LoopCompleted && len(lp.Parts) > 0 {
			d.spawn(lp)
			changed = true
		}
	}
	if d.s.terminal() {
		return true
	}
	if d.mergeQueue() {
		changed = true
	}
	if !changed && s.canComplete() {
		d.emit(schemas.TypeSessionCompleted, "", &schemas.SessionCompleted{Final: []schemas.ArtifactRef{}})
		changed = true
	}
	return changed
}

// mergeQueue acts on the merge job's report and requests the next merge.
// It reports whether it emitted anything.
func (d *decider) mergeQueue() bool {
	s, l := d.s, d.s.Loops
	changed := false
	if l.Merging != "" {
		switch {
		case l.MergeResult != nil:
			d.merged()
			changed = true
		case l.MergeFailure != nil && len(l.MergeFailure.Conflict) > 0:
			d.conflicted()
			changed = true
		case l.MergeFailure != nil && l.MergeFailure.Retryable && l.MergeAttempt < MaxAttempts && s.Status == StatusRunning:
			d.requestMerge(l.Merging, l.MergeAttempt+1)
			changed = true
		case l.MergeFailure != nil:
			d.fail(l.Merging, s.Steps[l.Merging].Iteration, "merging into "+l.Start.Target+" failed: "+firstLine(l.MergeFailure.Error))
			return true
		}
	}
	if l.Merging == "" && len(l.Queue) > 0 && s.Status == StatusRunning {
		d.requestMerge(l.Queue[0], 1)
		changed = true
	}
	return changed
}

// idle reports whether nothing waits to merge.
func (l *LoopsState) idle() bool { return len(l.Queue) == 0 && l.Merging == "" }

func sortedLoopIDs(l *LoopsState) []string { return slices.Sorted(maps.Keys(l.Loops)) }

// requestMerge asks a worker to merge the loop at the head of the queue.
func (d *decider) requestMerge(id string, attempt int) {
	s, l := d.s, d.s.Loops
	lp := l.Loops[id]
	st := s.Steps[id]
	n := l.MergeRequests + 1
	if attempt > 1 {
		n = l.MergeRequests
	}
	jobID := s.ID + "." + lp.ID + ".merge" + strconv.Itoa(n)
	if attempt > 1 {
		jobID += ".a" + strconv.Itoa(attempt)
	}
	spec := &schemas.WorktreeSpec{
		Bundles: appendBundle(l.Bundles, lp.Passed.Bundle), Base: l.Head, From: lp.Passed.Commit, FromBase: lp.Passed.Base,
		Branch: TargetOf(s.ID), Identity: l.Start.Identity, Merge: true,
	}
	jr := &schemas.JobRequested{JobID: jobID, Step: lp.ID, Iteration: max(st.Iteration, 1), Attempt: attempt, Agent: st.Def.Agent,
		Prompt: "merge " + lp.ID + " into " + TargetOf(s.ID), Inputs: []schemas.ArtifactRef{}, TimeoutMs: st.Def.TimeoutMs,
		Round: st.Round, Worktree: spec}
	d.emit(schemas.TypeJobRequested, lp.ID, jr, "merge", strconv.Itoa(n), "attempt", strconv.Itoa(attempt))
}

// merged records a merge and tells the running worktree loops to rebase.
func (d *decider) merged() {
	s, l := d.s, d.s.Loops
	id, res := l.Merging, l.MergeResult
	prev := l.Head
	m := &schemas.LoopMerged{Loop: id, JobID: l.MergeJob, Head: res.Commit, Previous: prev, Position: l.Merges + 1}
	if res.Bundle != nil {
		m.Bundle = *res.Bundle
	}
	d.emit(schemas.TypeLoopMerged, id, m,
		"merged", id, strconv.Itoa(l.Merges+1))
	if res.Commit == prev {
		return
	}
	for _, other := range sortedLoopIDs(l) {
		lp := l.Loops[other]
		lv := l.Def.Level(lp.Level)
		if other == id || lp.Status != LoopRunning || lv == nil || !lv.Worktree {
			continue
		}
		d.emit(schemas.TypeLoopRebase, other, &schemas.LoopRebase{Loop: other, Head: res.Commit, Cause: id,
			Reason: id + " was merged into " + TargetOf(s.ID)}, "rebase", other, strconv.Itoa(l.Merges))
	}
}

// conflicted gives a loop whose merge conflicted another iteration on the
// new head, or fails it when it has had MaxRebases of them.
func (d *decider) conflicted() {
	s, l := d.s, d.s.Loops
	id, f := l.Merging, l.MergeFailure
	lp := l.Loops[id]
	if lp.Rebases >= MaxRebases {
		d.fail(id, s.Steps[id].Iteration, fmt.Sprintf("its merge into %s conflicted %d times (last on %s)", TargetOf(s.ID), lp.Rebases+1, strings.Join(f.Conflict, ", ")))
		return
	}
	reason := fmt.Sprintf("Merging this loop's commits into %s conflicted on %s (changes merged meanwhile). The next iteration starts from the new head.",
		TargetOf(s.ID), strings.Join(f.Conflict, ", "))
	d.emit(schemas.TypeLoopRebase, id, &schemas.LoopRebase{Loop: id, Head: l.Head, Cause: id, Conflict: f.Conflict, Reason: reason},
		"conflict", id, l.MergeJob)
}

// loopFailed handles a loop that failed for reason (it used up its
// iterations, or its approval timed out with on_timeout: fail): its
// parent iterates again with the failure as feedback (at most
// MaxChildErrors times), or the session fails.
func (d *decider) loopFailed(st *Step, reason string) {
	l := d.s.Loops
	lp := l.Loops[st.Def.Name]
	var parent *Loop
	if lp != nil {
		parent = l.Loops[lp.Parent]
	}
	if parent == nil || parent.ChildErrors >= MaxChildErrors {
		d.fail(st.Def.Name, st.Iteration, reason)
		return
	}
	d.emit(schemas.TypeStepFailed, st.Def.Name, &schemas.StepFailed{Step: st.Def.Name, Iterations: st.Iteration, Error: reason}, roundParts(st, st.Def.Name)...)
	why := fmt.Sprintf("child loop %s failed: %s", lp.ID, reason)
	d.invalidateLoop(parent.ID, lp.ID, why, d.trigger.ID)
}

// invalidateLoop re-runs loop id: its descendants are cancelled and
// invalidated, and it runs again (spawning its children anew when it
// passes). It returns the loops invalidated.
func (d *decider) invalidateLoop(id, cause, reason, causeID string) []string {
	s, l := d.s, d.s.Loops
	var names []string
	for _, c := range l.descendants(id) {
		lp := l.Loops[c]
		if lp.Status == LoopInvalidated {
			continue
		}
		if st := s.Steps[c]; st != nil {
			d.cancel(st, "loop "+id+" invalidated")
		}
		d.emit(schemas.TypeLoopInvalidated, c, &schemas.LoopInvalidated{Loop: c, Cause: id, Reason: reason}, "loop", c, causeID)
		names = append(names, c)
	}
	st := s.Steps[id]
	d.cancel(st, "loop "+id+" invalidated")
	d.emit(schemas.TypeStepInvalidated, id, &schemas.StepInvalidated{Step: id, Cause: cause, Reason: reason}, id, causeID)
	return append([]string{id}, names...)
}

// LoopPromptData is what a loop's prompt template sees.
type LoopPromptData struct {
	PromptData
	// Task is the session's task; Input the loop's part of its parent's
	// artifact ("" for the root).
	Task, Input string
	// Loop, Parent and Level place the loop in the tree.
	Loop, Parent, Level string
	// Worktree is set for loops that work in a git worktree.
	Worktree bool
	// Outputs are the files the loop must write in out/.
	Outputs []string
}

// defaultLoopPrompt is the prompt of a level without one.
const defaultLoopPrompt = `You are loop {{.Loop}} (level {{.Level}}) of a coding session.

## The task

{{.Task}}
{{- if .Input}}

## Your part of it (from {{.Parent}})

{{.Input}}
{{- end}}
{{if .Worktree}}
Your working directory is a git worktree of the repository: change the code there. Commit if you like; what you leave uncommitted is committed for you when the validation passes.
{{- end}}
{{- if .Outputs}}
Write {{range $i, $o := .Outputs}}{{if $i}}, {{end}}$LOOPBUS_OUTPUT_DIR/{{$o}}{{end}}.
{{- end}}
`

func loopJobRequest(prompts *PromptCache, s *Session, st *Step, iteration, attempt int, feedback []schemas.Feedback) (*schemas.JobRequested, error) {
	l := s.Loops
	lp := l.Loops[st.Def.Name]
	if lp == nil {
		return nil, fmt.Errorf("no loop %s", st.Def.Name)
	}
	lv := l.Def.Level(lp.Level)
	if lv == nil {
		return nil, fmt.Errorf("loop %s: no level %s", lp.ID, lp.Level)
	}
	var outs []string
	for _, o := range lv.Outputs {
		outs = append(outs, o.Name)
	}
	data := LoopPromptData{
		PromptData: PromptData{Input: s.Input, Feedback: schemas.FormatFeedback(feedback), Iteration: iteration, Session: s.ID, Step: lp.ID, Hints: formatHints(st.Hints)},
		Task:       l.Start.Task, Input: lp.Input, Loop: lp.ID, Parent: lp.Parent, Level: lp.Level, Worktree: lv.Worktree, Outputs: outs,
	}
	text := st.Def.Prompt
	if text == "" {
		text = defaultLoopPrompt
	}
	prompt, err := renderPrompt(prompts, text, data, data.Feedback, data.Hints)
	if err != nil {
		return nil, err
	}
	if len(prompt) > MaxPromptBytes {
		return nil, fmt.Errorf("the rendered prompt is %d bytes, over the %d-byte limit", len(prompt), MaxPromptBytes)
	}
	jr := &schemas.JobRequested{
		JobID: JobID(s.ID, lp.ID, iteration, attempt, st.Round), Step: lp.ID, Iteration: iteration, Attempt: attempt,
		Agent: st.Def.Agent, Prompt: prompt, Inputs: []schemas.ArtifactRef{s.Input}, Outputs: st.Def.Outputs,
		Validate: st.Def.Validate, TimeoutMs: st.Def.TimeoutMs, ValidateTimeoutMs: st.Def.ValidateTimeoutMs,
		Dir: s.Pipeline.Dir, Feedback: feedback, Round: st.Round, Hints: slices.Clone(st.Hints),
	}
	if lp.InputName != "" {
		jr.Files = []schemas.InlineFile{{Name: lp.InputName, Content: lp.Input}}
	}
	if lv.Worktree {
		jr.Worktree = l.worktreeSpec(s.ID, lp)
	}
	return jr, nil
}

// worktreeSpec says where a worktree loop's next iteration starts: its
// base, carrying its previous iteration's commit.
func (l *LoopsState) worktreeSpec(session string, lp *Loop) *schemas.WorktreeSpec {
	spec := &schemas.WorktreeSpec{Bundles: slices.Clone(l.Bundles), Base: lp.Base, Branch: BranchOf(session, lp.ID), Identity: l.Start.Identity}
	if c := lp.Candidate; c != nil && c.Changed {
		spec.From, spec.FromBase = c.Commit, c.Base
		spec.Bundles = appendBundle(spec.Bundles, c.Bundle)
	}
	return spec
}

func cancelledLoops(names []string) string {
	if len(names) == 0 {
		return ""
	}
	return "; invalidated (spawned again when it passes): " + strings.Join(names, ", ")
}

// appendBundle returns bundles plus b (when there is one), as a new slice.
func appendBundle(bundles []schemas.ArtifactRef, b *schemas.ArtifactRef) []schemas.ArtifactRef {
	out := slices.Clone(bundles)
	if b != nil {
		out = append(out, *b)
	}
	return out
}
