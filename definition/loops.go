package definition

import (
	"errors"
	"io/fs"
	"maps"
	"slices"
	"strings"
	"unicode"

	"github.com/goccy/go-yaml/ast"

	"github.com/loopbus/loopbus/definition/yamlread"
	"github.com/loopbus/loopbus/schemas"
)

const (
	// defaultLoopIterations bounds the iterations of one loop when its
	// level does not.
	defaultLoopIterations = 5
	// maxLoopDepth bounds the chain of levels from the root: a loop's id
	// joins the names of its ancestors' levels and their indexes, and must
	// stay within schemas.MaxIDLen characters.
	maxLoopDepth = 8
	// maxChildrenLimit bounds children.max.
	maxChildrenLimit = 1000
)

// loopsKeys returns the top-level keys of a loops file.
func loopsKeys() []string {
	return []string{"kind", "name", "target", "agent", "levels", "budget", "breaker", "job_dispatch_timeout"}
}

// levelKeys returns the keys of one level of a loops file.
func levelKeys() []string {
	return []string{
		"agent", "prompt", "outputs", "validate", "validate_timeout",
		"max_iterations", "timeout", "worktree", "children", "breaker", "approval",
	}
}

// loopSplits returns the splits a file may name, in the order messages
// list them.
func loopSplits() []string { return []string{schemas.SplitHeadings, schemas.SplitJSON} }

// levelInfo keeps the positions of a level's parts for the checks that
// span levels.
type levelInfo struct {
	entry yamlread.Entry // the level's key and value
	// child is the children.level entry; its Val is nil when the level
	// names no child level.
	child yamlread.Entry
	// bad is set when the level's children could not be decoded, so the
	// checks of the hierarchy would report spurious problems.
	bad bool
}

// loops decodes the top-level mapping of a file of kind loops into p.
func (l *loader) loops(top yamlread.Map, p *schemas.Pipeline) {
	p.Kind = schemas.KindLoops
	if i := slices.IndexFunc(top.Entries, func(e yamlread.Entry) bool { return e.Key == "steps" }); i >= 0 {
		e := top.Entries[i]
		l.Errorf(e.KeyPos, e.Field, "a file of kind loops has no steps: its loops are configured by levels (rename steps to levels, or remove kind for a pipeline)")
		top.Entries = slices.Delete(slices.Clone(top.Entries), i, i+1)
	}
	top = l.Only(top, loopsKeys(), "key")
	p.Name = l.name(top)
	lp := &schemas.Loops{}
	if e, ok := top.Get("target"); ok {
		lp.Base = l.target(e)
	}
	var def *schemas.AgentSpec
	if e, ok := top.Get("agent"); ok {
		a := l.agent(e)
		def = &a
	}
	if e, ok := top.Get("budget"); ok {
		p.Budget = l.budget(e)
	}
	if e, ok := top.Get("breaker"); ok {
		p.Breaker = l.breaker(e)
	}
	if e, ok := top.Get("job_dispatch_timeout"); ok {
		p.JobDispatchTimeoutMs = l.duration(e, 0)
	}
	p.Loops = lp

	le, ok := top.Get("levels")
	if !ok {
		l.Errorf(top.Pos, "levels", "required: a mapping from level names to levels, the first the root")
		return
	}
	levels, ok := l.Mapping(le.Val, le.KeyPos, le.Field, nil)
	if !ok {
		return
	}
	if len(levels.Entries) == 0 {
		l.Errorf(le.KeyPos, le.Field, "must define at least one level")
		return
	}
	names := make([]string, len(levels.Entries))
	for i, e := range levels.Entries {
		names[i] = e.Key
	}
	infos := make([]levelInfo, 0, len(levels.Entries))
	for _, e := range levels.Entries {
		lv, info := l.level(e, def, names)
		lp.Levels = append(lp.Levels, lv)
		infos = append(infos, info)
	}
	l.checkLevels(lp.Levels, infos)
}

// target decodes target: {base: BRANCH}; it returns the base, "" for the
// repository's current branch.
func (l *loader) target(e yamlread.Entry) string {
	m, ok := l.Mapping(e.Val, e.KeyPos, e.Field, []string{"base"})
	if !ok {
		return ""
	}
	be, ok := m.Get("base")
	if !ok {
		return ""
	}
	base, ok := l.Str(be)
	if !ok {
		return ""
	}
	switch {
	case base == "":
		l.Errorf(be.ValPos, be.Field, "must not be empty (leave target out for the current branch)")
	case strings.IndexFunc(base, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) >= 0:
		l.Errorf(be.ValPos, be.Field, "invalid branch %q: must not contain spaces", base)
	case strings.HasPrefix(base, "-"):
		l.Errorf(be.ValPos, be.Field, "invalid branch %q: must not start with \"-\" (it is passed to git)", base)
	default:
		return base
	}
	return ""
}

// level decodes one level; levels names every level of the file.
func (l *loader) level(e yamlread.Entry, def *schemas.AgentSpec, levels []string) (schemas.LoopLevel, levelInfo) {
	lv := schemas.LoopLevel{
		Name:              e.Key,
		Line:              e.KeyPos.Line,
		MaxIterations:     defaultLoopIterations,
		TimeoutMs:         defaultTimeout.Milliseconds(),
		ValidateTimeoutMs: defaultValidateTimeout.Milliseconds(),
	}
	info := levelInfo{entry: e}
	if err := schemas.ValidateStepName(e.Key); err != nil {
		l.Errorf(e.KeyPos, e.Field, "%s", renameErr(err, "level name"))
	} else if strings.Contains(e.Key, "-") {
		l.Errorf(e.KeyPos, e.Field, "invalid level name %q: must not contain \"-\" (loop ids join level names with \"-\")", e.Key)
	}
	m, ok := l.Mapping(e.Val, e.KeyPos, e.Field, levelKeys())
	if !ok {
		info.bad = true
		return lv, info
	}

	if we, ok := m.Get("worktree"); ok {
		if b, isBool := we.Val.(*ast.BoolNode); isBool {
			lv.Worktree = b.Value
		} else {
			l.Errorf(we.ValPos, we.Field, "want true or false, got %s", yamlread.Kind(we.Val))
		}
	}

	switch a, ok := m.Get("agent"); {
	case ok:
		lv.Agent = l.agent(a)
	case def != nil:
		lv.Agent = cloneAgent(*def)
	default:
		l.Errorf(e.KeyPos, yamlread.Join(e.Field, "agent"), "no agent: give the level an agent or the file a top-level agent")
	}

	if pe, ok := m.Get("prompt"); ok {
		lv.Prompt, lv.PromptPath = l.promptFile(pe, e.Key)
	}

	outputsOK := true
	if oe, ok := m.Get("outputs"); !ok {
		if !lv.Worktree {
			l.Errorf(e.KeyPos, yamlread.Join(e.Field, "outputs"), "required: at least one {name: ...} (only worktree levels may have none)")
		}
	} else if items, ok := l.Items(oe, "[{name: plan.md}]"); ok {
		if len(items) == 0 && !lv.Worktree {
			l.Errorf(oe.ValPos, oe.Field, "must list at least one output (only worktree levels may have none)")
		}
		var names []string
		for _, it := range items {
			out, at := l.output(it)
			switch {
			case out.Name == "":
				outputsOK = false
			case slices.Contains(names, out.Name):
				l.Errorf(at, yamlread.Join(it.Field, "name"), "output %q is listed twice in level %q", out.Name, e.Key)
			}
			names = append(names, out.Name)
			lv.Outputs = append(lv.Outputs, out)
		}
	} else {
		outputsOK = false
	}

	if ve, ok := m.Get("validate"); ok {
		// A worktree level's validate runs in its worktree, where relative
		// paths mean the repository's files.
		decode := l.argv
		if lv.Worktree {
			decode = l.rawArgv
		}
		if argv, ok := decode(ve); ok {
			lv.Validate = argv
		}
	}
	l.runLimits(m, &lv.MaxIterations, &lv.TimeoutMs, &lv.ValidateTimeoutMs, &lv.Breaker)
	if ae, ok := m.Get("approval"); ok {
		lv.Approval = l.approval(ae)
	}
	if ce, ok := m.Get("children"); ok {
		lv.Children = l.children(ce, &lv, levels, outputsOK, &info)
	}
	return lv, info
}

// cloneAgent returns a copy of a that shares no slice, map or pointer with
// it.
func cloneAgent(a schemas.AgentSpec) schemas.AgentSpec {
	a.Command = slices.Clone(a.Command)
	a.AllowedTools = slices.Clone(a.AllowedTools)
	a.Args = slices.Clone(a.Args)
	a.Env = maps.Clone(a.Env)
	a.SecretEnv = slices.Clone(a.SecretEnv)
	a.Tools = slices.Clone(a.Tools)
	if a.Price != nil {
		p := *a.Price
		if p.CachedInputPerMTok != nil {
			c := *p.CachedInputPerMTok
			p.CachedInputPerMTok = &c
		}
		a.Price = &p
	}
	return a
}

// promptFile reads the prompt template file a level names and returns its
// text and the path as written; "" names the built-in prompt.
func (l *loader) promptFile(e yamlread.Entry, level string) (text, path string) {
	path, ok := l.Str(e)
	if !ok || path == "" {
		return "", ""
	}
	raw, err := readSchema(underDir(l.dir, path))
	if err != nil {
		// The path as written says enough; the resolved one would only
		// repeat it.
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		l.Errorf(e.ValPos, e.Field, "prompt file %s: %w", path, err)
		return "", path
	}
	text = string(raw)
	if strings.TrimSpace(text) == "" {
		l.Errorf(e.ValPos, e.Field, "prompt file %s is empty (leave prompt out for the built-in prompt)", path)
		return "", path
	}
	if !l.prompt(e.ValPos, e.Field, path, "prompt file "+path+": ", text) {
		return "", path
	}
	return text, path
}

// children decodes a level's children and marks the output they are cut
// from as a report. levels names every level of the file; outputsOK is
// false when lv's outputs had problems (so from is not checked against
// them).
func (l *loader) children(e yamlread.Entry, lv *schemas.LoopLevel, levels []string, outputsOK bool, info *levelInfo) *schemas.LoopChildren {
	m, ok := l.Mapping(e.Val, e.KeyPos, e.Field, []string{"level", "from", "split", "path", "max"})
	if !ok {
		info.bad = true
		return nil
	}
	c := &schemas.LoopChildren{Max: schemas.DefaultMaxChildren}

	if le, ok := m.Get("level"); !ok {
		l.Errorf(e.KeyPos, yamlread.Join(e.Field, "level"), "required: the level of the loops this level spawns (levels: %s)", strings.Join(levels, ", "))
		info.bad = true
	} else if name, ok := l.Str(le); !ok {
		info.bad = true
	} else if !slices.Contains(levels, name) {
		l.Errorf(le.ValPos, le.Field, "unknown level %q (levels: %s)", name, strings.Join(levels, ", "))
		info.bad = true
	} else {
		c.Level = name
		info.child = le
	}

	splitOK := true
	se, hasSplit := m.Get("split")
	if hasSplit {
		if s, ok := l.Str(se); !ok {
			splitOK = false
		} else if !slices.Contains(loopSplits(), s) {
			l.Errorf(se.ValPos, se.Field, "unknown split %q (splits: %s; leave split out to give one child the whole output)", s, strings.Join(loopSplits(), ", "))
			splitOK = false
		} else {
			c.Split = s
		}
	}

	if fe, ok := m.Get("from"); !ok {
		if hasSplit && splitOK {
			l.Errorf(e.KeyPos, yamlread.Join(e.Field, "from"), "required with split %s: the output the children are cut from%s", c.Split, outputList(lv.Outputs))
		}
	} else if from, ok := l.Str(fe); ok {
		i := slices.IndexFunc(lv.Outputs, func(o schemas.Output) bool { return o.Name == from })
		switch {
		case i >= 0:
			c.From = from
			lv.Outputs[i].Report = true
			lv.Outputs[i].ReportText = c.Split != schemas.SplitJSON
		case outputsOK:
			l.Errorf(fe.ValPos, fe.Field, "%q is not an output of level %s%s", from, lv.Name, outputList(lv.Outputs))
		}
	}

	if pe, ok := m.Get("path"); ok {
		if path, ok := l.Str(pe); ok && splitOK {
			switch {
			case c.Split != schemas.SplitJSON:
				l.Errorf(pe.KeyPos, pe.Field, "only with split json (a JSON pointer to the array to split)")
			case !strings.HasPrefix(path, "/"):
				l.Errorf(pe.ValPos, pe.Field, "want a JSON pointer starting with \"/\", such as /items, got %q (leave path out to split the document itself)", path)
			default:
				c.Path = path
			}
		}
	}

	if me, ok := m.Get("max"); ok {
		c.Max = int(l.intIn(me, 1, maxChildrenLimit, schemas.DefaultMaxChildren))
	}
	return c
}

// outputList lists a level's outputs for messages, with a leading space.
func outputList(outs []schemas.Output) string {
	if len(outs) == 0 {
		return " (the level has no outputs)"
	}
	names := make([]string, len(outs))
	for i, o := range outs {
		names[i] = o.Name
	}
	return " (outputs: " + strings.Join(names, ", ") + ")"
}

// checkLevels checks the hierarchy the levels' children form: no cycle,
// every level but the root spawned by some level, and a chain from the root
// at most maxLoopDepth levels long. The last two are only checked when
// every level's children could be decoded.
func (l *loader) checkLevels(levels []schemas.LoopLevel, infos []levelInfo) {
	index := make(map[string]int, len(levels))
	for i, lv := range levels {
		index[lv.Name] = i
	}
	// Each level spawns loops of at most one level: next[i] is that
	// level's index, or -1.
	next := make([]int, len(levels))
	bad := false
	for i, lv := range levels {
		next[i] = -1
		if infos[i].bad {
			bad = true
		}
		if lv.Children != nil && lv.Children.Level != "" {
			next[i] = index[lv.Children.Level]
		}
	}
	childField := func(i int) (yamlread.Pos, string) {
		return infos[i].child.ValPos, infos[i].child.Field
	}
	names := func(chain []int) string {
		out := make([]string, len(chain))
		for i, c := range chain {
			out[i] = levels[c].Name
		}
		return strings.Join(out, " -> ")
	}

	// Cycles: with one edge out of each level, a walk that meets a level
	// of its own path has closed a cycle, reported rotated to start at its
	// earliest level.
	const (
		unvisited = iota
		active
		done
	)
	state := make([]int, len(levels))
	for start := range levels {
		var path []int
		i := start
		for i >= 0 && state[i] == unvisited {
			state[i] = active
			path = append(path, i)
			i = next[i]
		}
		if i >= 0 && state[i] == active {
			cycle := slices.Clone(path[slices.Index(path, i):])
			first := slices.Index(cycle, slices.Min(cycle))
			cycle = append(cycle[first:], cycle[:first]...)
			at, field := childField(cycle[0])
			l.Errorf(at, field, "cycle of children: %s", names(append(cycle, cycle[0])))
		}
		for _, p := range path {
			state[p] = done
		}
	}
	if bad {
		return
	}

	var chain []int
	onChain := make([]bool, len(levels))
	for i := 0; i >= 0 && !onChain[i]; i = next[i] {
		onChain[i] = true
		chain = append(chain, i)
	}
	if last := chain[len(chain)-1]; next[last] < 0 && len(chain) > maxLoopDepth {
		at, field := childField(chain[maxLoopDepth-1])
		l.Errorf(at, field, "too deep: the chain of levels from the root is %d long (%s); at most %d, so that loop ids stay within %d characters",
			len(chain), names(chain), maxLoopDepth, schemas.MaxIDLen)
	}

	named := make([]bool, len(levels))
	for _, n := range next {
		if n >= 0 {
			named[n] = true
		}
	}
	for i := 1; i < len(levels); i++ {
		// A level spawned only by levels that are never spawned
		// themselves is not reported: the problem is theirs.
		if !onChain[i] && !named[i] {
			e := infos[i].entry
			l.Errorf(e.KeyPos, e.Field, "never spawned: no level's children name it (the root is %s, the first level)", levels[0].Name)
		}
	}
}
