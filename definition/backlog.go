package definition

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/goccy/go-yaml/ast"

	"github.com/loopbus/loopbus/definition/yamlread"
	"github.com/loopbus/loopbus/schemas"
)

const (
	// defaultBacklogIterations bounds the agent runs of a backlog session
	// when the file sets neither max_iterations nor budget.max_iterations.
	defaultBacklogIterations = 50
	// maxParallelLimit bounds max_parallel: every parallel run is a
	// workspace and an agent process.
	maxParallelLimit         = 16
	defaultSummaryIterations = 3
)

// backlogKeys returns the top-level keys of a backlog file.
func backlogKeys() []string {
	return []string{
		"kind", "name", "project", "agents", "roles", "schedule",
		"max_iterations", "max_parallel", "source_files", "summary_iterations",
		"timeout", "validate", "validate_timeout", "prompts", "budget", "breaker",
		"workdir", "target", "approval", "job_dispatch_timeout",
	}
}

// backlogRoles returns the roles, in the order messages list them.
func backlogRoles() []string {
	return []string{schemas.RoleIterate, schemas.RoleReview, schemas.RoleRepair, schemas.RoleBootstrap}
}

// backlogSchedules returns the schedules, in the order messages list them.
func backlogSchedules() []string {
	return []string{schemas.ScheduleSingle, schemas.ScheduleOddEven, schemas.ScheduleRoundRobin}
}

// SourcePath returns where the source file src of the backlog p is: src
// itself when it is absolute, else src under p.Dir (the directory of the
// backlog file, for a Pipeline from Load or Parse).
func SourcePath(p schemas.Pipeline, src string) string {
	return underDir(p.Dir, src)
}

// underDir resolves path against dir unless it is absolute.
func underDir(dir, path string) string {
	if filepath.IsAbs(path) {
		return path
	}
	return filepath.Join(dir, path)
}

// backlog decodes the top-level mapping of a file of kind backlog into p.
func (l *loader) backlog(top yamlread.Map, p *schemas.Pipeline) {
	p.Kind = schemas.KindBacklog
	// steps is the likeliest mistake (a pipeline file given a kind), so it
	// gets its own message rather than "unknown key".
	if i := slices.IndexFunc(top.Entries, func(e yamlread.Entry) bool { return e.Key == "steps" }); i >= 0 {
		e := top.Entries[i]
		l.Errorf(e.KeyPos, e.Field, "a file of kind backlog has no steps: its tasks come from the task file (remove steps, or kind for a pipeline)")
		top.Entries = slices.Delete(slices.Clone(top.Entries), i, i+1)
	}
	top = l.Only(top, backlogKeys(), "key")

	b := &schemas.Backlog{
		Schedule:             schemas.ScheduleSingle,
		MaxParallel:          1,
		MaxSummaryIterations: defaultSummaryIterations,
		TimeoutMs:            defaultTimeout.Milliseconds(),
		ValidateTimeoutMs:    defaultValidateTimeout.Milliseconds(),
	}
	p.Name = l.name(top)
	b.Project = p.Name
	if e, ok := top.Get("project"); ok {
		if s, ok := l.Str(e); ok {
			if strings.TrimSpace(s) == "" {
				l.Errorf(e.ValPos, e.Field, "must not be empty (leave project out to use the name)")
			} else {
				b.Project = s
			}
		}
	}

	agents, names, agentsOK := l.backlogAgents(top)
	b.Agents = agents
	iterate := l.roles(top, b, names, agentsOK)
	l.schedule(top, b, iterate)

	if e, ok := top.Get("max_parallel"); ok {
		b.MaxParallel = int(l.intIn(e, 1, maxParallelLimit, 1))
	}
	if e, ok := top.Get("summary_iterations"); ok {
		b.MaxSummaryIterations = int(l.intIn(e, 1, maxIterationsLimit, defaultSummaryIterations))
	}
	if e, ok := top.Get("timeout"); ok {
		b.TimeoutMs = l.duration(e, b.TimeoutMs)
	}
	if e, ok := top.Get("workdir"); ok {
		if w, ok := l.Str(e); ok {
			switch w {
			case schemas.WorkdirRepo:
				b.Workdir = w
			case schemas.WorkdirWorkspace:
			default:
				l.Errorf(e.ValPos, e.Field, "unknown workdir %q (workdirs: workspace, the default: a fresh directory per run; repo: a git worktree of --repo, merged when the run passes)", w)
			}
		}
	}
	if e, ok := top.Get("target"); ok {
		if b.Workdir != schemas.WorkdirRepo {
			l.Errorf(e.KeyPos, e.Field, "only with workdir: repo")
		} else {
			b.Base = l.target(e)
		}
	}
	if e, ok := top.Get("validate"); ok {
		// In a worktree the command runs in the repository: its arguments
		// are the repository's, kept as written.
		argv, ok := l.argv(e)
		if b.Workdir == schemas.WorkdirRepo {
			argv, ok = l.rawArgv(e)
		}
		if ok {
			b.Validate = argv
		}
	}
	if e, ok := top.Get("validate_timeout"); ok {
		b.ValidateTimeoutMs = l.duration(e, b.ValidateTimeoutMs)
	}
	if e, ok := top.Get("source_files"); ok {
		b.SourceFiles = l.sourceFiles(e)
	}
	if e, ok := top.Get("prompts"); ok {
		b.Prompts = l.prompts(e)
	}

	// max_iterations is the backlog's name for budget.max_iterations; when
	// both are set the tighter applies, when neither the default does.
	var budget schemas.Budget
	if e, ok := top.Get("budget"); ok {
		if fb := l.budget(e); fb != nil {
			budget = *fb
		}
	}
	iterations := 0
	if e, ok := top.Get("max_iterations"); ok {
		iterations = int(l.positiveInt(e, math.MaxInt32))
	}
	if iterations == 0 && budget.MaxIterations == 0 {
		iterations = defaultBacklogIterations
	}
	budget = budget.Tighter(schemas.Budget{MaxIterations: iterations})
	p.Budget = &budget
	if e, ok := top.Get("breaker"); ok {
		p.Breaker = l.breaker(e)
	}
	if e, ok := top.Get("job_dispatch_timeout"); ok {
		p.JobDispatchTimeoutMs = l.duration(e, 0)
	}
	if e, ok := top.Get("approval"); ok {
		b.Approval = l.phaseApprovals(e)
	}
	p.Backlog = b
}

// phaseApprovals decodes a backlog's approval gates: a mapping from roles
// (bootstrap, repair, iterate, review) to gates, each as a step's
// approval. A null gate is absent; nil is returned when none is set.
func (l *loader) phaseApprovals(e yamlread.Entry) map[string]schemas.Approval {
	if _, scalar := yamlread.Scalar(e.Val); scalar {
		// approval: required, as on a step: say what a backlog takes.
		l.Errorf(e.ValPos, e.Field, "want a mapping from roles to gates, such as {iterate: required} (roles: %s), got %s",
			strings.Join(backlogRoles(), ", "), describeValue(e.Val))
		return nil
	}
	m, ok := l.Mapping(e.Val, e.KeyPos, e.Field, nil)
	if !ok {
		return nil
	}
	m = l.Only(m, backlogRoles(), "role")
	var out map[string]schemas.Approval
	for _, r := range m.Entries {
		if a := l.approval(r); a != nil {
			if out == nil {
				out = map[string]schemas.Approval{}
			}
			out[r.Key] = *a
		}
	}
	return out
}

// backlogAgents decodes agents: a non-empty mapping from agent names
// (step-name rules) to agents, each decoded as a step's agent. It returns
// the names in file order, and ok false when agents is missing or not a
// non-empty mapping (so roles cannot be checked against it).
func (l *loader) backlogAgents(top yamlread.Map) (map[string]schemas.AgentSpec, []string, bool) {
	e, ok := top.Get("agents")
	if !ok {
		l.Errorf(top.Pos, "agents", "required: a mapping from agent names to agents such as {backend: claude}")
		return nil, nil, false
	}
	m, ok := l.Mapping(e.Val, e.KeyPos, e.Field, nil)
	if !ok {
		return nil, nil, false
	}
	if len(m.Entries) == 0 {
		l.Errorf(e.KeyPos, e.Field, "must define at least one agent")
		return nil, nil, false
	}
	agents := make(map[string]schemas.AgentSpec, len(m.Entries))
	names := make([]string, 0, len(m.Entries))
	for _, a := range m.Entries {
		if err := schemas.ValidateStepName(a.Key); err != nil {
			l.Errorf(a.KeyPos, a.Field, "%s", renameErr(err, "agent name"))
		}
		agents[a.Key] = l.agent(a)
		names = append(names, a.Key)
	}
	return agents, names, true
}

// roles decodes roles into b.Roles: iterate is required, review, repair
// and bootstrap default to the first iterate agent. Each role is an agent
// name or a non-empty list of distinct names; when checkNames is set, each
// must be one of names. It returns the iterate entry (zero when absent).
func (l *loader) roles(top yamlread.Map, b *schemas.Backlog, names []string, checkNames bool) yamlread.Entry {
	e, ok := top.Get("roles")
	if !ok {
		l.Errorf(top.Pos, "roles", "required: at least {iterate: AGENT} or {iterate: [AGENT, AGENT]}")
		return yamlread.Entry{}
	}
	m, ok := l.Mapping(e.Val, e.KeyPos, e.Field, nil)
	if !ok {
		return yamlread.Entry{}
	}
	m = l.Only(m, backlogRoles(), "role")
	b.Roles = make(map[string][]string, len(backlogRoles()))
	for _, r := range m.Entries {
		if r.Val == nil {
			continue // null is absent, as everywhere in the file
		}
		b.Roles[r.Key] = l.roleAgents(r, names, checkNames)
	}
	it, ok := m.Get(schemas.RoleIterate)
	if !ok {
		l.Errorf(e.KeyPos, yamlread.Join(e.Field, schemas.RoleIterate), "required: the agent, or list of agents, that works the tasks")
		return yamlread.Entry{}
	}
	if first := b.Roles[schemas.RoleIterate]; len(first) > 0 {
		for _, role := range backlogRoles() {
			if _, set := b.Roles[role]; !set {
				b.Roles[role] = slices.Clone(first[:1])
			}
		}
	}
	return it
}

// roleAgents decodes one role: an agent name or a list of them.
func (l *loader) roleAgents(e yamlread.Entry, names []string, checkNames bool) []string {
	var agents []string
	var at []yamlread.Pos
	var fields []string
	if s, isScalar := yamlread.Scalar(e.Val); isScalar {
		agents, at, fields = []string{s}, []yamlread.Pos{e.ValPos}, []string{e.Field}
	} else {
		if _, isSeq := e.Val.(*ast.SequenceNode); !isSeq {
			l.Errorf(e.ValPos, e.Field, "want an agent name or a list of them, got %s", yamlread.Kind(e.Val))
			return nil
		}
		var items []yamlread.Entry
		var ok bool
		if agents, items, ok = l.Strings(e, "[agent-a, agent-b]"); !ok {
			return nil
		}
		if len(agents) == 0 {
			l.Errorf(e.ValPos, e.Field, "must name at least one agent")
			return nil
		}
		for _, it := range items {
			at, fields = append(at, it.ValPos), append(fields, it.Field)
		}
	}
	for i, a := range agents {
		switch {
		case checkNames && !slices.Contains(names, a):
			l.Errorf(at[i], fields[i], "unknown agent %q (agents: %s)", a, strings.Join(names, ", "))
		case slices.Index(agents, a) < i:
			l.Errorf(at[i], fields[i], "agent %q is listed twice", a)
		}
	}
	return agents
}

// schedule decodes schedule into b.Schedule and checks it against the
// iterate agents: odd-even takes exactly two, single exactly one (a second
// agent would never run).
func (l *loader) schedule(top yamlread.Map, b *schemas.Backlog, iterate yamlread.Entry) {
	e, set := top.Get("schedule")
	if set {
		s, ok := l.Str(e)
		if !ok {
			return
		}
		if !slices.Contains(backlogSchedules(), s) {
			l.Errorf(e.ValPos, e.Field, "unknown schedule %q (schedules: %s)", s, strings.Join(backlogSchedules(), ", "))
			return
		}
		b.Schedule = s
	}
	agents := b.Roles[schemas.RoleIterate]
	if len(agents) == 0 {
		return // missing or invalid, reported already
	}
	switch {
	case b.Schedule == schemas.ScheduleOddEven && len(agents) != 2:
		l.Errorf(e.ValPos, e.Field, "odd-even alternates two iterate agents, but roles.iterate (line %d) lists %d: %s",
			iterate.ValPos.Line, len(agents), strings.Join(agents, ", "))
	case b.Schedule == schemas.ScheduleSingle && len(agents) > 1:
		msg := fmt.Sprintf("schedule single runs only the first iterate agent, but roles.iterate lists %d: %s; set schedule: odd-even or round-robin, or list one agent",
			len(agents), strings.Join(agents, ", "))
		if set {
			l.Errorf(e.ValPos, e.Field, "%s", msg)
		} else {
			l.Errorf(iterate.ValPos, iterate.Field, "%s", msg)
		}
	}
}

// intIn decodes an integer from lo to hi (lo >= 0); it returns def on
// error.
func (l *loader) intIn(e yamlread.Entry, lo, hi, def int64) int64 {
	if n, ok := e.Val.(*ast.IntegerNode); ok {
		switch v := n.Value.(type) {
		case int64:
			if v >= lo && v <= hi {
				return v
			}
		case uint64:
			if v >= uint64(lo) && v <= uint64(hi) {
				return int64(v)
			}
		}
	}
	l.Errorf(e.ValPos, e.Field, "want an integer from %d to %d, got %s", lo, hi, describeValue(e.Val))
	return def
}

// sourceFiles decodes source_files: paths of existing regular files,
// relative to the file's directory or absolute, kept as written. Their base
// names name their artifacts, so they must be valid artifact names and
// distinct.
func (l *loader) sourceFiles(e yamlread.Entry) []string {
	paths, items, ok := l.Strings(e, "[README.md, docs/spec.md]")
	if !ok {
		return nil
	}
	type first struct {
		path string
		line int
	}
	bases := make(map[string]first, len(paths))
	var out []string
	for i, src := range paths {
		at, field := items[i].ValPos, items[i].Field
		if src == "" {
			l.Errorf(at, field, "must not be empty")
			continue
		}
		fi, err := os.Stat(underDir(l.dir, src))
		if err != nil {
			// The path as written says enough; the resolved one would
			// only repeat it.
			var pe *fs.PathError
			if errors.As(err, &pe) {
				err = pe.Err
			}
			l.Errorf(at, field, "source file %s: %w", src, err)
			continue
		}
		if !fi.Mode().IsRegular() {
			l.Errorf(at, field, "source file %s: not a regular file", src)
			continue
		}
		base := filepath.Base(src)
		if err := schemas.ValidateName(base); err != nil {
			l.Errorf(at, field, "source file %s: %w", src, err)
			continue
		}
		if prev, dup := bases[base]; dup {
			l.Errorf(at, field, "source file %s has the base name of %s (line %d); source files are stored as artifacts named by their base names",
				src, prev.path, prev.line)
			continue
		}
		bases[base] = first{src, at.Line}
		out = append(out, src)
	}
	return out
}

// prompts decodes prompts: a mapping from roles to non-empty Go templates
// that replace the role's built-in prompt.
func (l *loader) prompts(e yamlread.Entry) map[string]string {
	m, ok := l.Mapping(e.Val, e.KeyPos, e.Field, nil)
	if !ok {
		return nil
	}
	m = l.Only(m, backlogRoles(), "role")
	var out map[string]string
	for _, pe := range m.Entries {
		if pe.Val == nil {
			continue // null is absent: the built-in prompt
		}
		text, ok := l.Str(pe)
		if !ok {
			continue
		}
		if strings.TrimSpace(text) == "" {
			l.Errorf(pe.ValPos, pe.Field, "must not be empty")
			continue
		}
		if !l.prompt(pe.ValPos, pe.Field, pe.Key, "", text) {
			continue
		}
		if out == nil {
			out = make(map[string]string)
		}
		out[pe.Key] = text
	}
	return out
}
