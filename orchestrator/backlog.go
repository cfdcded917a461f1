package orchestrator

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/loopbus/loopbus/backlog"
	"github.com/loopbus/loopbus/schemas"
)

// A backlog session runs each task as a step named after the task, and each
// role run (bootstrap, repair, review) as a step named after the role; the
// step machinery (feedback, retries, rate-limit waits, breaker, signals,
// budgets, approval gates by role) is the pipelines'. What differs is decided here: which step runs
// next (task selection and phases) and what a passed run changes (task.*
// events from the agent's summary).

// Role steps of a backlog session; task ids may not take these names.
var roleSteps = backlog.ReservedIDs()

// BacklogState is a backlog session's state beyond its steps.
type BacklogState struct {
	Def   schemas.Backlog
	Start schemas.BacklogStart
	Tasks *backlog.List
	Phase string
	// PhaseRuns counts entries into each phase (role steps' rounds).
	PhaseRuns map[string]int
	// Runs counts each task's selections.
	Runs map[string]int
	// Hints are info messages for the session's next job.
	Hints []string
}

func newBacklogState(d *schemas.SessionStarted) *BacklogState {
	b := &BacklogState{Def: *d.Pipeline.Backlog, Tasks: backlog.NewList(), PhaseRuns: map[string]int{}, Runs: map[string]int{}}
	if d.Backlog != nil {
		b.Start = *d.Backlog
	}
	return b
}

func (b *BacklogState) clone() *BacklogState {
	c := *b
	c.Tasks = b.Tasks.Clone()
	c.PhaseRuns, c.Runs = maps.Clone(b.PhaseRuns), maps.Clone(b.Runs)
	c.Hints = slices.Clone(b.Hints)
	return &c
}

// evolve applies task.* and backlog.phase events.
func (b *BacklogState) evolve(s *Session, ev schemas.Event) {
	b.Tasks.Apply(ev)
	switch d := ev.Data.(type) {
	case *schemas.TaskSelected:
		if b.Tasks.Tasks[d.ID] == nil {
			return
		}
		b.Runs[d.ID] = max(b.Runs[d.ID], d.Run)
		prev := s.Steps[d.ID]
		st := &Step{Def: b.stepDef(d.ID, d.Agent, s), Status: StepPending, Round: d.Run - 1}
		if prev != nil {
			st.Hints, st.Hold = prev.Hints, prev.Hold
		}
		s.Steps[d.ID] = st
	case *schemas.BacklogPhase:
		b.Phase = d.Phase
		if !slices.Contains(roleSteps, d.Phase) {
			return
		}
		b.PhaseRuns[d.Phase]++
		prev := s.Steps[d.Phase]
		agent := b.roleAgent(d.Phase)
		st := &Step{Def: b.stepDef(d.Phase, agent, s), Status: StepPending, Round: b.PhaseRuns[d.Phase] - 1}
		if prev != nil {
			st.Hints, st.Hold = prev.Hints, prev.Hold
		}
		s.Steps[d.Phase] = st
	}
}

// roleAgent returns the agent of a role: its first, or iterate's first.
func (b *BacklogState) roleAgent(role string) string {
	if a := b.Def.Roles[role]; len(a) > 0 {
		return a[0]
	}
	if a := b.Def.Roles[schemas.RoleIterate]; len(a) > 0 {
		return a[0]
	}
	return ""
}

// selections counts the task runs selected so far: the schedule's run
// number.
func (b *BacklogState) selections() int {
	n := 0
	for _, r := range b.Runs {
		n += r
	}
	return n
}

// iterateAgent returns the agent of the n-th task run (from 1) by the
// schedule.
func (b *BacklogState) iterateAgent(n int) string {
	agents := b.Def.Roles[schemas.RoleIterate]
	switch {
	case len(agents) == 0:
		return ""
	case b.Def.Schedule == schemas.ScheduleOddEven && len(agents) > 1:
		if n%2 == 0 {
			return agents[1]
		}
		return agents[0]
	case b.Def.Schedule == schemas.ScheduleRoundRobin:
		return agents[(n-1)%len(agents)]
	}
	return agents[0]
}

// stepDef is the step a run of a task or role executes.
func (b *BacklogState) stepDef(name, agent string, s *Session) *schemas.Step {
	def := &schemas.Step{Name: name, Agent: b.Def.Agents[agent], MaxIterations: max(b.Def.MaxSummaryIterations, 1), TimeoutMs: b.Def.TimeoutMs}
	role := schemas.RoleIterate
	if slices.Contains(roleSteps, name) {
		role = name
	}
	if a, ok := b.Def.Approval[role]; ok {
		def.Approval = &a
	}
	switch name {
	case schemas.PhaseBootstrap, schemas.PhaseRepair:
		def.Outputs = []schemas.Output{{Name: backlog.FileName, Schema: backlog.FileSchema(), SchemaVersion: "task-file/1", Report: true}}
	case schemas.PhaseReview:
		def.Outputs = []schemas.Output{{Name: backlog.SummaryName, Schema: backlog.SummarySchema(backlog.ReviewTaskID), SchemaVersion: "task-summary/1", Report: true}}
	default:
		def.Outputs = []schemas.Output{{Name: backlog.SummaryName, Schema: backlog.SummarySchema(name), SchemaVersion: "task-summary/1", Report: true}}
		def.Validate, def.ValidateTimeoutMs = b.Def.Validate, b.Def.ValidateTimeoutMs
	}
	return def
}

// checkReport decodes a passed run's report and checks it against the task
// list; a report that does not fit turns the verdict into a failure fed
// back to the next iteration, as a schema error would be.
func (b *BacklogState) checkReport(st *Step, v *schemas.Verdict) {
	name := st.Def.Outputs[0].Name
	var raw json.RawMessage
	for _, r := range v.Reports {
		if r.Name == name {
			raw = r.Content
		}
	}
	var errs []schemas.ValidationError
	switch {
	case raw == nil:
		errs = []schemas.ValidationError{{Artifact: name, Message: "the verdict carries no report of " + name, Source: "schema"}}
	case name == backlog.FileName:
		f, ferrs := backlog.ParseFile(name, raw)
		if errs = ferrs; len(errs) == 0 {
			st.FileTasks = f.Tasks
		}
	default:
		var sum backlog.Summary
		if err := json.Unmarshal(raw, &sum); err != nil {
			errs = []schemas.ValidationError{{Artifact: name, Message: err.Error(), Source: "schema"}}
			break
		}
		_, errs = b.Tasks.CheckNew(sum.NewTasks, "/new_tasks")
		for i := range errs {
			errs[i].Artifact = name
		}
		st.Summary = &sum
	}
	if len(errs) > 0 {
		st.Outcome, st.Passed, st.Summary, st.FileTasks = outcomeFailed, nil, nil, nil
		st.Failure = &schemas.Feedback{Iteration: v.Iteration, Kind: "validation", Errors: errs,
			RetryHint: "Fix the listed problems in " + name + " and write the file again in full."}
		st.repeat(verdictSignature(&schemas.Verdict{Errors: errs, Artifacts: v.Artifacts}))
	}
}

// phase enters a backlog phase.
func (d *decider) phase(phase, reason string) {
	b := d.s.Backlog
	d.emit(schemas.TypeBacklogPhase, "", &schemas.BacklogPhase{Phase: phase, Reason: reason, Counts: b.Tasks.Counts()},
		"phase", phase, strconv.Itoa(b.PhaseRuns[phase]+1), strconv.Itoa(len(b.Tasks.Tasks)))
}

// addTasks records tasks added by a run or an import.
func (d *decider) addTasks(tasks []schemas.Task, by, reason string) {
	for _, t := range tasks {
		t.CreatedAt, t.UpdatedAt = nil, nil
		d.emit(schemas.TypeTaskAdded, "", &schemas.TaskAdded{Task: t, By: by, Reason: reason}, "task", t.ID, "by", by)
	}
}

// backlogStart enters the first phase of a backlog session.
func (d *decider) backlogStart() {
	b := d.s.Backlog
	switch {
	case len(b.Start.ImportErrors) > 0:
		d.phase(schemas.PhaseRepair, fmt.Sprintf("the imported task file has %d problem(s); the repair agent fixes it", len(b.Start.ImportErrors)))
	case len(b.Start.Tasks) > 0:
		d.addTasks(b.Start.Tasks, "import", "imported from the task file")
		d.phase(schemas.PhaseIterate, fmt.Sprintf("imported %d task(s)", len(b.Start.Tasks)))
	default:
		d.phase(schemas.PhaseBootstrap, "no tasks: the bootstrap agent proposes them from the source files")
	}
}

// finishRun applies a backlog run whose report passed, then completes its
// step.
func (d *decider) finishRun(st *Step) {
	b := d.s.Backlog
	name := st.Def.Name
	var skipped []string
	switch name {
	case schemas.PhaseBootstrap, schemas.PhaseRepair:
		// Tasks added by hand during the run keep their ids: the file's
		// tasks with those ids are left out (and said so).
		var fresh []schemas.Task
		for _, t := range st.FileTasks {
			if b.Tasks.Tasks[t.ID] == nil {
				fresh = append(fresh, t)
			} else {
				skipped = append(skipped, t.ID)
			}
		}
		d.addTasks(fresh, st.JobID, name+" run")
	case schemas.PhaseReview:
		if sum := st.Summary; sum != nil {
			added, errs := b.Tasks.CheckNew(sum.NewTasks, "/new_tasks")
			if len(errs) == 0 {
				d.addTasks(added, st.JobID, "review: "+firstLine(sum.Summary))
			}
		}
	default:
		sum := st.Summary
		if sum == nil {
			break
		}
		added, errs := b.Tasks.CheckNew(sum.NewTasks, "/new_tasks")
		run := strconv.Itoa(b.Runs[name])
		up := &schemas.TaskUpdated{ID: name, Status: sum.Status, Files: sum.Files, Note: sum.Summary, By: st.JobID, Reason: "summary of run " + run}
		if sum.Status == schemas.TaskBlocked || sum.Blockers != nil {
			bl := slices.Clone(sum.Blockers)
			if bl == nil {
				bl = []string{}
			}
			up.Blockers = &bl
		}
		if len(errs) > 0 {
			// Only a concurrent change (tasks add) can make tasks that
			// passed their check collide now: say so rather than drop them.
			up.Note += "\n(new tasks not added: " + backlog.FormatErrors(errs) + ")"
			added = nil
		}
		d.emit(schemas.TypeTaskUpdated, name, up, freeParts(st, "task", name, "run", run)...)
		d.addTasks(added, st.JobID, "found while working on "+name)
	}
	d.emit(schemas.TypeStepCompleted, name, &schemas.StepCompleted{
		Step: name, JobID: st.JobID, Iterations: st.Iteration, Artifacts: st.Passed,
		ContentHash: schemas.ContentHash(st.Passed), SchemaVersion: schemas.StepSchemaVersion(*st.Def),
	}, freeParts(st, roundParts(st, name)...)...)
	busy := d.s.busyTask
	switch {
	case name == schemas.PhaseBootstrap || name == schemas.PhaseRepair:
		reason := fmt.Sprintf("%s added %d task(s)", name, len(st.FileTasks)-len(skipped))
		if len(skipped) > 0 {
			reason += fmt.Sprintf("; %s already added meanwhile, kept as they were", strings.Join(skipped, ", "))
		}
		d.phase(schemas.PhaseIterate, reason)
	case name == schemas.PhaseReview && st.Summary != nil && len(st.Summary.NewTasks) > 0:
		d.phase(schemas.PhaseIterate, fmt.Sprintf("review added %d task(s)", len(st.Summary.NewTasks)))
	case name == schemas.PhaseReview:
		if _, _, ok := b.Tasks.Select(busy); ok {
			// Tasks added or reopened by hand while the review ran.
			d.phase(schemas.PhaseIterate, "review found nothing to add, but tasks became runnable while it ran")
			break
		}
		d.phase(schemas.PhaseDone, "review found nothing to add")
	}
}

// blockTask ends a task run that failed for reason (its agent never wrote
// a usable summary, or its approval timed out with on_timeout: fail): the
// task is blocked (it is tried again after progress) and the backlog goes
// on.
func (d *decider) blockTask(st *Step, reason string) {
	b := d.s.Backlog
	name := st.Def.Name
	blockers := []string{reason}
	run := strconv.Itoa(b.Runs[name])
	d.emit(schemas.TypeTaskUpdated, name, &schemas.TaskUpdated{ID: name, Status: schemas.TaskBlocked, Blockers: &blockers, By: "orchestrator", Reason: "run " + run + " failed"},
		"task", name, "run", run, "blocked")
	d.emit(schemas.TypeStepFailed, name, &schemas.StepFailed{Step: name, Iterations: st.Iteration, Error: reason}, roundParts(st, name)...)
}

// busyTask reports whether a task cannot be selected now: its run is
// running or due, or (workdir: repo) its passed work waits to merge.
func (s *Session) busyTask(id string) bool {
	if st := s.Steps[id]; st != nil && st.active() {
		return true
	}
	if s.Loops != nil {
		if lp := s.Loops.Loops[id]; lp != nil && lp.Status == LoopMerging {
			return true
		}
	}
	return false
}

// active reports whether a backlog step is running or due to run.
func (st *Step) active() bool { return st.Status == StepPending || st.Status == StepRunning }

// backlogFill selects tasks while workers are free, moves to review when
// nothing is left to run, and completes the session when the review found
// nothing. It reports whether it emitted anything.
func (d *decider) backlogFill() bool {
	s, b := d.s, d.s.Backlog
	if s.Status != StatusRunning {
		return false
	}
	activeCount := 0
	for _, st := range s.Steps {
		if st.active() {
			activeCount++
		}
	}
	changed := false
	switch b.Phase {
	case schemas.PhaseIterate:
		busy := s.busyTask
		for activeCount < max(b.Def.MaxParallel, 1) {
			id, why, ok := b.Tasks.Select(busy)
			if !ok {
				break
			}
			run := b.Runs[id] + 1
			agent := b.iterateAgent(b.selections() + 1)
			d.emit(schemas.TypeTaskSelected, id, &schemas.TaskSelected{ID: id, Run: run, Agent: agent, Reason: why}, "task", id, "run", strconv.Itoa(run))
			activeCount++
			changed = true
		}
		if activeCount == 0 && (s.Loops == nil || s.Loops.idle()) {
			reason := "no runnable task left"
			if w := b.Tasks.Waiting(); len(w) > 0 {
				reason += ": " + strings.Join(w, "; ")
			}
			d.phase(schemas.PhaseReview, reason)
			changed = true
		}
	case schemas.PhaseDone:
		// With workdir: repo, the last passed runs are merged first.
		if s.canComplete() {
			d.emit(schemas.TypeSessionCompleted, "", &schemas.SessionCompleted{Final: []schemas.ArtifactRef{}})
			changed = true
		}
	}
	return changed
}

// backlogPromptData is what a backlog run's prompt template sees, beside
// PromptData's members.
type backlogPromptData struct {
	PromptData
	Role    string
	Project string
	// Task is the task of an iterate run (nil otherwise); TaskJSON is it as
	// JSON.
	Task     *schemas.Task
	TaskJSON string
	// TaskList is the task list, one line per task.
	TaskList string
	// Sources are the names of the source files in in/.
	Sources []string
	// ImportErrors lists the imported task file's problems (repair runs).
	ImportErrors string
	// Output is the file the run must write in out/.
	Output string
}

func backlogJobRequest(prompts *PromptCache, s *Session, st *Step, iteration, attempt int, feedback []schemas.Feedback) (*schemas.JobRequested, error) {
	b := s.Backlog
	name := st.Def.Name
	inputs := slices.Clone(b.Start.Sources)
	var names []string
	for _, a := range inputs {
		names = append(names, a.Name)
	}
	role := schemas.RoleIterate
	if slices.Contains(roleSteps, name) {
		role = name
	}
	if role == schemas.RoleRepair {
		inputs = append(inputs, s.Input)
	}
	hints := slices.Concat(st.Hints, b.Hints)
	data := backlogPromptData{
		PromptData: PromptData{Input: s.Input, Feedback: schemas.FormatFeedback(feedback), Iteration: iteration, Session: s.ID, Step: name, Hints: formatHints(hints)},
		Role:       role, Project: orElse(b.Def.Project, s.Pipeline.Name), TaskList: taskLines(b.Tasks), Sources: names, Output: st.Def.Outputs[0].Name,
	}
	if t := b.Tasks.Tasks[name]; t != nil && role == schemas.RoleIterate {
		tc := *t
		data.Task = &tc
		j, _ := json.MarshalIndent(tc, "", "  ")
		data.TaskJSON = string(j)
	}
	if role == schemas.RoleRepair {
		data.ImportErrors = backlog.FormatErrors(b.Start.ImportErrors)
	}
	text := b.Def.Prompts[role]
	if text == "" {
		text = defaultPrompts[role]
	}
	prompt, err := renderPrompt(prompts, text, data, data.Feedback, data.Hints)
	if err != nil {
		return nil, err
	}
	if len(prompt) > MaxPromptBytes {
		return nil, fmt.Errorf("the rendered prompt is %d bytes, over the %d-byte limit", len(prompt), MaxPromptBytes)
	}
	jr := &schemas.JobRequested{
		JobID: JobID(s.ID, name, iteration, attempt, st.Round), Step: name, Iteration: iteration, Attempt: attempt,
		Agent: st.Def.Agent, Prompt: prompt, Inputs: inputs, Outputs: st.Def.Outputs,
		Validate: st.Def.Validate, TimeoutMs: st.Def.TimeoutMs, ValidateTimeoutMs: st.Def.ValidateTimeoutMs,
		Dir: s.Pipeline.Dir, Feedback: feedback, Round: st.Round, Hints: hints,
	}
	if s.Loops != nil {
		// workdir: repo: the run works in a worktree at the target's head.
		if lp := s.Loops.Loops[name]; lp != nil {
			jr.Worktree = s.Loops.worktreeSpec(s.ID, lp)
		}
	}
	return jr, nil
}

func orElse(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// taskLines renders the task list for prompts: one line per task.
func taskLines(l *backlog.List) string {
	if len(l.Tasks) == 0 {
		return "(no tasks)\n"
	}
	var sb strings.Builder
	for _, t := range l.Sorted() {
		fmt.Fprintf(&sb, "- %s [%s]", t.ID, t.Status)
		if t.Priority > 0 {
			fmt.Fprintf(&sb, " p%d", t.Priority)
		}
		sb.WriteString(" " + t.Title)
		if len(t.DependsOn) > 0 {
			sb.WriteString(" (depends on " + strings.Join(t.DependsOn, ", ") + ")")
		}
		sb.WriteString("\n")
	}
	return sb.String()
}
