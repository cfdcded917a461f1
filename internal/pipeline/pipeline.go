// Package pipeline loads pipeline files: YAML documents naming the steps of
// an agent pipeline, their agents, prompts, outputs and dependencies. It
// validates them and returns the normalized schemas.Pipeline that a session
// carries, with defaults applied, relative paths resolved and output schemas
// inlined, so that no other service needs the file.
//
// A pipeline file looks like this (paths are relative to its directory):
//
//	name: writing-kit
//	budget: {max_cost_usd: 2.5, max_tokens: 2000000, max_iterations: 20}
//	breaker: {no_progress: 3, identical_failures: 3}
//	steps:
//	  summary:
//	    agent: {backend: exec, command: [sh, agents/summarize.sh], env: {K: V}, secret_env: [API_TOKEN]}
//	    prompt: "Summarize {{.Input.Name}}"
//	    outputs: [{name: summary.json, schema: schemas/summary.schema.json}]
//	    max_iterations: 3
//	    timeout: 2m
//	    breaker: {no_progress: 2}
//	  ideas:
//	    requires: [summary]
//	    agent: {backend: exec, command: [sh, agents/ideas.sh]}
//	    prompt: "List ideas"
//	    outputs: [{name: ideas.json}]
//	    validate: [sh, -c, "test -s \"$LOOPBUS_OUTPUT_DIR/ideas.json\""]
//	    validate_timeout: 30s
//	    final: true
//
// A file with kind: backlog describes a task backlog instead of steps: the
// agents that work a task list and how (paths are relative to its
// directory; every key but name, agents and roles is optional, shown here
// with its default where it has one):
//
//	kind: backlog
//	name: demo
//	project: demo                          # default: name
//	agents:                                # each as a step's agent
//	  claude: {backend: claude, model: sonnet}
//	  helper: {backend: exec, command: [./agent.sh]}
//	roles:                                 # an agent or a list of agents
//	  iterate: [claude, helper]            # required
//	  review: claude                       # review, repair, bootstrap:
//	  repair: claude                       # default: the first iterate agent
//	  bootstrap: claude
//	schedule: odd-even                     # single (default), odd-even, round-robin
//	max_iterations: 50                     # agent runs of the session
//	max_parallel: 1                        # 1 to 16
//	source_files: [README.md, docs/spec.md]
//	summary_iterations: 3
//	timeout: 10m                           # per agent run
//	validate: [make, test]
//	validate_timeout: 1m
//	prompts: {iterate: "..."}              # role: template
//	budget: {max_cost_usd: 5}
//	breaker: {no_progress: 3}
//
// Every problem is reported with the file, line and dotted field path it
// concerns, and all problems of a file are reported at once (see Errors).
package pipeline

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/template"
	"time"

	"github.com/goccy/go-yaml/ast"

	"github.com/loopbus/loopbus/internal/workspace"
	"github.com/loopbus/loopbus/schemas"
)

const (
	backendList = "exec, claude, codex"

	defaultTimeout         = 10 * time.Minute
	defaultValidateTimeout = time.Minute
	maxIterationsLimit     = 100

	// maxSchemaBytes bounds an output schema file.
	maxSchemaBytes = 1 << 20
)

// Load reads the pipeline file at path and returns its normalized
// definition; see Parse. Relative paths in the file resolve against the
// file's directory. An error reading the file is returned as is (it does not
// wrap ErrInvalid); problems in its content are reported as Errors.
func Load(path string) (schemas.Pipeline, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return schemas.Pipeline{}, fmt.Errorf("read pipeline: %w", err)
	}
	return Parse(path, data, filepath.Dir(path))
}

// Parse validates the pipeline document data and returns its normalized
// definition: steps in file order with their lines, defaults applied
// (timeout 10m, validate_timeout 1m, max_iterations 1), exactly one step
// final, agent and validate commands with relative paths made absolute
// against dir, and output schemas read (relative to dir) and inlined.
// Source is set to name and Dir to dir made absolute. Budget, Breaker and
// each step's Breaker are nil when the file sets none of their fields; a
// step's breaker holds only the thresholds the step sets (it overrides the
// pipeline's field by field).
//
// A file whose kind is backlog is returned with Kind backlog, no steps,
// Backlog set (roles all present, defaults applied: schedule single,
// max_parallel 1, summary_iterations 3, timeout 10m, validate_timeout 1m,
// project the name) and Budget.MaxIterations set from max_iterations and
// budget.max_iterations (the tighter; 50 when neither is set). Its source
// files must exist; they are kept as written (see SourcePath). A file
// without kind, or of kind pipeline, is returned with Kind empty.
//
// Parse reads schema files and checks whether command arguments name files
// under dir, but runs nothing. name is used in messages only. When data has
// problems, Parse returns a zero Pipeline and a non-empty Errors listing all
// of them in file order; each wraps ErrInvalid.
func Parse(name string, data []byte, dir string) (schemas.Pipeline, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return schemas.Pipeline{}, fmt.Errorf("pipeline %s: directory: %w", name, err)
	}
	l := &loader{file: name, dir: abs}
	p := l.pipeline(data)
	if len(l.errs) > 0 {
		slices.SortStableFunc(l.errs, func(a, b *Error) int {
			if a.Line != b.Line {
				return a.Line - b.Line
			}
			return a.Column - b.Column
		})
		return schemas.Pipeline{}, l.errs
	}
	return p, nil
}

// loader holds the state of one Parse call.
type loader struct {
	file    string
	dir     string
	aliases map[*ast.AliasNode]ast.Node
	errs    Errors
}

// errorf records a problem at p in field. A %w verb in format also sets the
// problem's Err.
func (l *loader) errorf(p pos, field, format string, args ...any) {
	err := fmt.Errorf(format, args...)
	l.errs = append(l.errs, &Error{
		File:   l.file,
		Line:   p.line,
		Column: p.col,
		Field:  field,
		Msg:    oneLine(err.Error()),
		Err:    errors.Unwrap(err),
	})
}

// oneLine joins the lines of a multi-line message (such as a schema
// compiler's report) with "; " so each problem stays on one line.
func oneLine(msg string) string {
	if !strings.Contains(msg, "\n") {
		return msg
	}
	var parts []string
	for line := range strings.Lines(msg) {
		if line = strings.TrimSpace(line); line != "" {
			parts = append(parts, line)
		}
	}
	return strings.Join(parts, "; ")
}

// stepInfo keeps the positions of a step's parts for the checks that span
// steps.
type stepInfo struct {
	requires []pos // each requires item
	final    pos   // the final key
	outputs  []pos // each output's name
	// bad is set when the step's dependencies could not be decoded, so the
	// graph checks would report spurious problems.
	bad bool
}

// pipeline decodes and checks the whole document.
func (l *loader) pipeline(data []byte) schemas.Pipeline {
	p := schemas.Pipeline{Source: l.file, Dir: l.dir}
	body, ok := l.document(data)
	if !ok {
		return p
	}
	if _, isMap := body.(*ast.MappingNode); !isMap {
		l.mapping(body, posOf(body), "", pipelineKeys())
		return p
	}
	// The keys allowed depend on the kind, so they are checked after it
	// is known.
	top, _ := l.mapping(body, posOf(body), "", nil)
	switch l.fileKind(top) {
	case schemas.KindBacklog:
		l.backlog(top, &p)
		return p
	case schemas.KindPipeline:
	default:
		return p
	}
	top = l.only(top, pipelineKeys(), "key")
	if be, ok := top.get("budget"); ok {
		p.Budget = l.budget(be)
	}
	if be, ok := top.get("breaker"); ok {
		p.Breaker = l.breaker(be)
	}
	p.Name = l.name(top)
	se, ok := top.get("steps")
	if !ok {
		l.errorf(top.pos, "steps", "required: a mapping from step names to steps")
		return p
	}
	steps, ok := l.mapping(se.val, se.keyPos, "steps", nil)
	if !ok {
		return p
	}
	if len(steps.entries) == 0 {
		l.errorf(se.keyPos, "steps", "must define at least one step")
		return p
	}
	infos := make([]stepInfo, 0, len(steps.entries))
	for _, e := range steps.entries {
		s, info := l.step(e)
		p.Steps = append(p.Steps, s)
		infos = append(infos, info)
	}
	l.checkOutputs(p.Steps, infos)
	graphOK := l.checkGraph(p.Steps, infos)
	l.checkFinal(p.Steps, infos, se.keyPos, graphOK)
	return p
}

// pipelineKeys returns the top-level keys of a pipeline file.
func pipelineKeys() []string { return []string{"name", "steps", "budget", "breaker", "kind"} }

// fileKind returns the kind of the file: pipeline when top has no kind, ""
// when its kind is not one of the kinds (the problem is reported).
func (l *loader) fileKind(top mapNode) string {
	e, ok := top.get("kind")
	if !ok {
		return schemas.KindPipeline
	}
	k, ok := l.str(e)
	if !ok {
		return ""
	}
	if k != schemas.KindPipeline && k != schemas.KindBacklog {
		l.errorf(e.valPos, e.field, "unknown kind %q (kinds: %s, %s)", k, schemas.KindPipeline, schemas.KindBacklog)
		return ""
	}
	return k
}

// name decodes the required name of a pipeline or backlog file: it follows
// the step-name rules.
func (l *loader) name(top mapNode) string {
	e, ok := top.get("name")
	if !ok {
		l.errorf(top.pos, "name", "required")
		return ""
	}
	s, ok := l.str(e)
	if !ok {
		return ""
	}
	if err := schemas.ValidateStepName(s); err != nil {
		l.errorf(e.valPos, e.field, "%s", renameErr(err, "pipeline name"))
	}
	return s
}

// renameErr returns the message of a schemas.ErrBadStepName error with
// "step name" replaced by what, for names that follow the step-name rules.
func renameErr(err error, what string) string {
	msg := err.Error()
	if rest, cut := strings.CutPrefix(msg, schemas.ErrBadStepName.Error()); cut {
		return "invalid " + what + rest
	}
	return msg
}

// step decodes one step.
func (l *loader) step(e entry) (schemas.Step, stepInfo) {
	s := schemas.Step{
		Name:              e.key,
		Line:              e.keyPos.line,
		MaxIterations:     1,
		TimeoutMs:         defaultTimeout.Milliseconds(),
		ValidateTimeoutMs: defaultValidateTimeout.Milliseconds(),
	}
	var info stepInfo
	if err := schemas.ValidateStepName(e.key); err != nil {
		l.errorf(e.keyPos, e.field, "%w", err)
	}
	m, ok := l.mapping(e.val, e.keyPos, e.field, []string{
		"requires", "agent", "prompt", "outputs", "validate",
		"max_iterations", "timeout", "validate_timeout", "final", "breaker",
	})
	if !ok {
		info.bad = true
		return s, info
	}

	if a, ok := m.get("agent"); ok {
		s.Agent = l.agent(a)
	} else {
		l.errorf(e.keyPos, join(e.field, "agent"), "required: {backend: exec, command: [...]}")
	}

	if pe, ok := m.get("prompt"); !ok {
		l.errorf(e.keyPos, join(e.field, "prompt"), "required")
	} else if text, ok := l.str(pe); ok {
		s.Prompt = text
		if strings.TrimSpace(text) == "" {
			l.errorf(pe.valPos, pe.field, "must not be empty")
		} else if _, err := template.New(e.key).Option("missingkey=error").Parse(text); err != nil {
			l.errorf(pe.valPos, pe.field, "invalid template: %w", err)
		}
	}

	if re, ok := m.get("requires"); ok {
		if names, at, ok := l.list(re, "[step-a, step-b]"); ok && len(names) > 0 {
			s.Requires, info.requires = names, at
		} else if !ok {
			info.bad = true
		}
	}

	if oe, ok := m.get("outputs"); !ok {
		l.errorf(e.keyPos, join(e.field, "outputs"), "required: at least one {name: ..., schema: ...}")
	} else if items, ok := l.items(oe, "[{name: out.json}]"); ok {
		if len(items) == 0 {
			l.errorf(oe.valPos, oe.field, "must list at least one output")
		}
		for _, it := range items {
			out, at := l.output(it)
			s.Outputs = append(s.Outputs, out)
			info.outputs = append(info.outputs, at)
		}
	}

	if ve, ok := m.get("validate"); ok {
		if argv, ok := l.argv(ve); ok {
			s.Validate = argv
		}
	}
	if ie, ok := m.get("max_iterations"); ok {
		s.MaxIterations = l.iterations(ie)
	}
	if te, ok := m.get("timeout"); ok {
		s.TimeoutMs = l.duration(te, s.TimeoutMs)
	}
	if te, ok := m.get("validate_timeout"); ok {
		s.ValidateTimeoutMs = l.duration(te, s.ValidateTimeoutMs)
	}
	if be, ok := m.get("breaker"); ok {
		s.Breaker = l.breaker(be)
	}
	if fe, ok := m.get("final"); ok {
		info.final = fe.keyPos
		if b, isBool := fe.val.(*ast.BoolNode); isBool {
			s.Final = b.Value
		} else {
			l.errorf(fe.valPos, fe.field, "want true or false, got %s", kind(fe.val))
		}
	}
	return s, info
}

// agent decodes a step's agent.
func (l *loader) agent(e entry) schemas.AgentSpec {
	var a schemas.AgentSpec
	m, ok := l.mapping(e.val, e.keyPos, e.field, []string{"backend", "command", "env", "secret_env", "model", "permission_mode", "allowed_tools", "args"})
	if !ok {
		return a
	}
	if se, ok := m.get("secret_env"); ok {
		a.SecretEnv = l.secretEnv(se)
	}
	if be, ok := m.get("backend"); !ok {
		l.errorf(e.keyPos, join(e.field, "backend"), "required (supported: %s)", backendList)
	} else if b, ok := l.str(be); ok {
		a.Backend = b
		if b != schemas.BackendExec && b != schemas.BackendClaude && b != schemas.BackendCodex {
			l.errorf(be.valPos, be.field, "unsupported backend %q (supported: %s)", b, backendList)
		}
	}
	// Options of the agent CLIs: only where they mean something.
	for _, o := range []struct {
		key      string
		backends []string
		list     *[]string
		str      *string
	}{
		{key: "model", backends: []string{schemas.BackendClaude, schemas.BackendCodex}, str: &a.Model},
		{key: "permission_mode", backends: []string{schemas.BackendClaude}, str: &a.PermissionMode},
		{key: "allowed_tools", backends: []string{schemas.BackendClaude}, list: &a.AllowedTools},
		{key: "args", backends: []string{schemas.BackendClaude, schemas.BackendCodex}, list: &a.Args},
	} {
		oe, ok := m.get(o.key)
		if !ok {
			continue
		}
		if a.Backend != "" && !slices.Contains(o.backends, a.Backend) {
			l.errorf(oe.keyPos, oe.field, "not an option of the %s backend (only of %s)", a.Backend, strings.Join(o.backends, " and "))
			continue
		}
		if o.str != nil {
			*o.str, _ = l.str(oe)
		} else if vals, _, ok := l.list(oe, "[a, b]"); ok {
			*o.list = vals
		}
	}
	if ce, ok := m.get("command"); ok {
		if argv, ok := l.argv(ce); ok {
			a.Command = argv
		}
	} else if a.Backend == schemas.BackendExec {
		l.errorf(e.keyPos, join(e.field, "command"), "required for the exec backend: an argv list such as [sh, agent.sh]")
	}
	if ee, ok := m.get("env"); ok {
		if env, ok := l.mapping(ee.val, ee.keyPos, ee.field, nil); ok {
			for _, v := range env.entries {
				if v.key == "" || strings.ContainsAny(v.key, "=\x00") {
					l.errorf(v.keyPos, v.field, "invalid environment variable name %q", v.key)
					continue
				}
				val, ok := l.str(v)
				if !ok {
					continue
				}
				if slices.Contains(a.SecretEnv, v.key) || workspace.LooksSecret(v.key) && len(val) >= workspace.MinSecretLen {
					l.errorf(v.keyPos, v.field, "values in env travel in events; set %s in the worker's environment and list it in secret_env", v.key)
					continue
				}
				if a.Env == nil {
					a.Env = make(map[string]string)
				}
				a.Env[v.key] = val
			}
		}
	}
	return a
}

// secretEnv decodes secret_env: a list of environment variable names (see
// workspace.ValidateSecretName), each listed once.
func (l *loader) secretEnv(e entry) []string {
	names, at, ok := l.list(e, "[API_TOKEN]")
	if !ok {
		return nil
	}
	var out []string
	for i, n := range names {
		field := fmt.Sprintf("%s[%d]", e.field, i)
		switch err := workspace.ValidateSecretName(n); {
		case err != nil:
			l.errorf(at[i], field, "%w", err)
		case slices.Contains(out, n):
			l.errorf(at[i], field, "%s is listed twice", n)
		default:
			out = append(out, n)
		}
	}
	return out
}

// argv decodes a command: a non-empty list of strings whose first element
// is not empty. Relative paths in it are resolved against the pipeline's
// directory: the first element when it contains a slash, any other element
// when it names an existing regular file there.
func (l *loader) argv(e entry) ([]string, bool) {
	if _, isSeq := e.val.(*ast.SequenceNode); !isSeq {
		if _, isStr := scalarText(e.val); isStr {
			l.errorf(e.valPos, e.field, "want an argv list, not a string: write [sh, -c, \"...\"] to run a shell command")
			return nil, false
		}
	}
	argv, at, ok := l.list(e, "[sh, -c, \"...\"]")
	if !ok {
		return nil, false
	}
	if len(argv) == 0 {
		l.errorf(e.valPos, e.field, "must not be empty")
		return nil, false
	}
	if argv[0] == "" {
		l.errorf(at[0], e.field+"[0]", "program must not be empty")
		return nil, false
	}
	for i, arg := range argv {
		if arg == "" || filepath.IsAbs(arg) {
			continue
		}
		path := filepath.Join(l.dir, arg)
		if i == 0 {
			if strings.Contains(arg, "/") {
				argv[i] = path
			}
			continue
		}
		if fi, err := os.Stat(path); err == nil && fi.Mode().IsRegular() {
			argv[i] = path
		}
	}
	return argv, true
}

// output decodes one element of outputs and returns it with the position
// of its name.
func (l *loader) output(it entry) (schemas.Output, pos) {
	var out schemas.Output
	m, ok := l.mapping(it.val, it.valPos, it.field, []string{"name", "schema"})
	if !ok {
		return out, it.valPos
	}
	at := m.pos
	if ne, ok := m.get("name"); !ok {
		l.errorf(m.pos, join(it.field, "name"), "required")
	} else if name, ok := l.str(ne); ok {
		at = ne.valPos
		if err := schemas.ValidateName(name); err != nil {
			l.errorf(ne.valPos, ne.field, "%w", err)
		} else {
			out.Name = name
		}
	}
	if se, ok := m.get("schema"); ok {
		if path, ok := l.str(se); ok {
			l.schema(se, path, &out)
		}
	}
	return out, at
}

// schema reads, checks and inlines the output schema at path.
func (l *loader) schema(e entry, path string, out *schemas.Output) {
	if path == "" {
		l.errorf(e.valPos, e.field, "must not be empty")
		return
	}
	full := path
	if !filepath.IsAbs(full) {
		full = filepath.Join(l.dir, full)
	}
	raw, err := readSchema(full)
	if err != nil {
		l.errorf(e.valPos, e.field, "schema file %s: %w", path, err)
		return
	}
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		l.errorf(e.valPos, e.field, "schema file %s is not valid JSON: %w", path, err)
		return
	}
	if _, err := schemas.CompileArtifactSchema(path, raw); err != nil {
		l.errorf(e.valPos, e.field, "%w", err)
		return
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, raw); err != nil {
		l.errorf(e.valPos, e.field, "schema file %s is not valid JSON: %w", path, err)
		return
	}
	out.SchemaPath = path
	out.Schema = json.RawMessage(compact.Bytes())
	out.SchemaVersion = schemas.SchemaVersionOf(raw)
}

// readSchema reads a schema file, refusing anything but a regular file of at
// most maxSchemaBytes (a pipeline naming /dev/zero must not hang Parse).
func readSchema(path string) ([]byte, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("not a regular file")
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	raw, err := io.ReadAll(io.LimitReader(f, maxSchemaBytes+1))
	if err != nil {
		return nil, err
	}
	if len(raw) > maxSchemaBytes {
		return nil, fmt.Errorf("larger than %d bytes", maxSchemaBytes)
	}
	return raw, nil
}

// iterations decodes max_iterations; it returns the default on error.
func (l *loader) iterations(e entry) int {
	bad := func() int {
		l.errorf(e.valPos, e.field, "want an integer from 1 to %d, got %s", maxIterationsLimit, describe(e.val))
		return 1
	}
	n, ok := e.val.(*ast.IntegerNode)
	if !ok {
		return bad()
	}
	switch v := n.Value.(type) {
	case int64:
		if v >= 1 && v <= maxIterationsLimit {
			return int(v)
		}
	case uint64:
		if v >= 1 && v <= maxIterationsLimit {
			return int(v)
		}
	}
	return bad()
}

// budget decodes the pipeline's budget: max_cost_usd (a number > 0),
// max_tokens and max_iterations (integers > 0). It returns nil when no
// bound is set (an empty mapping, or one with problems).
func (l *loader) budget(e entry) *schemas.Budget {
	m, ok := l.mapping(e.val, e.keyPos, e.field, []string{"max_cost_usd", "max_tokens", "max_iterations"})
	if !ok {
		return nil
	}
	var b schemas.Budget
	if ce, ok := m.get("max_cost_usd"); ok {
		b.MaxCostUSD = l.positiveNumber(ce)
	}
	if te, ok := m.get("max_tokens"); ok {
		b.MaxTokens = l.positiveInt(te, math.MaxInt64)
	}
	if ie, ok := m.get("max_iterations"); ok {
		b.MaxIterations = int(l.positiveInt(ie, math.MaxInt32))
	}
	if b == (schemas.Budget{}) {
		return nil
	}
	return &b
}

// breaker decodes circuit breaker thresholds, of the pipeline or of one
// step: no_progress and identical_failures, integers >= 1. It returns nil
// when no threshold is set; unset ones are left zero (the orchestrator
// takes them from the pipeline, then from the defaults).
func (l *loader) breaker(e entry) *schemas.Breaker {
	m, ok := l.mapping(e.val, e.keyPos, e.field, []string{"no_progress", "identical_failures"})
	if !ok {
		return nil
	}
	var b schemas.Breaker
	if ne, ok := m.get("no_progress"); ok {
		b.NoProgress = int(l.positiveInt(ne, math.MaxInt32))
	}
	if fe, ok := m.get("identical_failures"); ok {
		b.IdenticalFailures = int(l.positiveInt(fe, math.MaxInt32))
	}
	if b == (schemas.Breaker{}) {
		return nil
	}
	return &b
}

// positiveInt decodes an integer from 1 to limit; it returns 0 on error.
func (l *loader) positiveInt(e entry, limit int64) int64 {
	tooLarge := false
	if n, ok := e.val.(*ast.IntegerNode); ok {
		switch v := n.Value.(type) {
		case int64:
			if v >= 1 && v <= limit {
				return v
			}
			tooLarge = v > limit
		case uint64:
			if v >= 1 && v <= uint64(limit) {
				return int64(v)
			}
			tooLarge = v > uint64(limit)
		}
	}
	if tooLarge {
		l.errorf(e.valPos, e.field, "must be at most %d, got %s", limit, describeValue(e.val))
	} else {
		l.errorf(e.valPos, e.field, "want an integer > 0, got %s", describeValue(e.val))
	}
	return 0
}

// positiveNumber decodes a finite number > 0; it returns 0 on error.
func (l *loader) positiveNumber(e entry) float64 {
	var v float64
	switch n := e.val.(type) {
	case *ast.IntegerNode:
		switch x := n.Value.(type) {
		case int64:
			v = float64(x)
		case uint64:
			v = float64(x)
		}
	case *ast.FloatNode:
		v = n.Value
	}
	if v > 0 && !math.IsInf(v, 0) {
		return v
	}
	l.errorf(e.valPos, e.field, "want a number > 0, got %s", describeValue(e.val))
	return 0
}

// describeValue shows a resolved value for messages about numbers: a
// number or boolean as written, a string quoted and named as one (so "5"
// in quotes is not mistaken for 5), anything else by its kind.
func describeValue(n ast.Node) string {
	switch n.(type) {
	case *ast.StringNode, *ast.LiteralNode:
		s, _ := scalarText(n)
		return fmt.Sprintf("the string %q", s)
	}
	if s, ok := scalarText(n); ok {
		return s
	}
	return kind(n)
}

// duration decodes a positive Go duration into milliseconds; it returns def
// on error.
func (l *loader) duration(e entry, def int64) int64 {
	text, ok := l.str(e)
	if !ok {
		return def
	}
	d, err := time.ParseDuration(text)
	switch {
	case err != nil:
		l.errorf(e.valPos, e.field, "invalid duration %q: want a Go duration such as 30s, 2m or 1h30m", text)
	case d <= 0:
		l.errorf(e.valPos, e.field, "must be > 0, got %q", text)
	case d < time.Millisecond:
		l.errorf(e.valPos, e.field, "must be at least 1ms, got %q", text)
	default:
		return d.Milliseconds()
	}
	return def
}

// describe shows a resolved scalar's text, or its kind for anything else.
func describe(n ast.Node) string {
	if s, ok := scalarText(n); ok {
		return fmt.Sprintf("%q", s)
	}
	return kind(n)
}

// checkOutputs reports output names used more than once in the pipeline:
// the artifacts of a session share one namespace.
func (l *loader) checkOutputs(steps []schemas.Step, infos []stepInfo) {
	type owner struct {
		step string
		line int
	}
	seen := make(map[string]owner)
	for i, s := range steps {
		for j, o := range s.Outputs {
			if o.Name == "" {
				continue
			}
			field := stepField(s.Name, fmt.Sprintf("outputs[%d].name", j))
			at := infos[i].outputs[j]
			switch prev, dup := seen[o.Name]; {
			case !dup:
				seen[o.Name] = owner{s.Name, at.line}
			case prev.step == s.Name:
				l.errorf(at, field, "output %q is listed twice in step %q", o.Name, s.Name)
			default:
				l.errorf(at, field, "output %q of step %q is also produced by step %q (line %d); output names must be unique across the pipeline",
					o.Name, s.Name, prev.step, prev.line)
			}
		}
	}
}

// checkGraph reports requires naming unknown steps or a step twice, and
// dependency cycles. It reports false when the graph has any such problem.
func (l *loader) checkGraph(steps []schemas.Step, infos []stepInfo) bool {
	ok := true
	index := make(map[string]int, len(steps))
	for i, s := range steps {
		index[s.Name] = i
	}
	edges := make([][]int, len(steps))
	for i, s := range steps {
		if infos[i].bad {
			ok = false
		}
		for j, r := range s.Requires {
			field := stepField(s.Name, fmt.Sprintf("requires[%d]", j))
			at := infos[i].requires[j]
			t, known := index[r]
			switch {
			case !known:
				l.errorf(at, field, "unknown step %q (steps: %s)", r, stepNames(steps))
				ok = false
			case slices.Index(s.Requires, r) < j:
				l.errorf(at, field, "step %q is listed twice", r)
				ok = false
			default:
				edges[i] = append(edges[i], t)
			}
		}
	}

	// Depth-first search in file order; every back edge closes a cycle.
	// Each cycle is rotated to start at its earliest step, so the report
	// does not depend on where the search entered it.
	const (
		unvisited = iota
		active
		done
	)
	state := make([]int, len(steps))
	var stack []int
	seen := make(map[string]bool)
	var visit func(int)
	visit = func(i int) {
		state[i] = active
		stack = append(stack, i)
		for _, t := range edges[i] {
			switch state[t] {
			case unvisited:
				visit(t)
			case active:
				cycle := slices.Clone(stack[slices.Index(stack, t):])
				first := slices.Index(cycle, slices.Min(cycle))
				cycle = append(cycle[first:], cycle[:first]...)
				names := make([]string, 0, len(cycle)+1)
				for _, c := range cycle {
					names = append(names, steps[c].Name)
				}
				path := strings.Join(append(names, names[0]), " -> ")
				if seen[path] {
					continue
				}
				seen[path] = true
				from, next := cycle[0], steps[cycle[1%len(cycle)]].Name
				j := slices.Index(steps[from].Requires, next)
				l.errorf(infos[from].requires[j], stepField(steps[from].Name, fmt.Sprintf("requires[%d]", j)),
					"dependency cycle: %s", path)
				ok = false
			}
		}
		stack = stack[:len(stack)-1]
		state[i] = done
	}
	for i := range steps {
		if state[i] == unvisited {
			visit(i)
		}
	}
	return ok
}

// checkFinal makes sure exactly one step is final: at most one may be
// marked; when none is, the only step nothing requires becomes final.
// Ambiguity is only reported when the dependency graph is sound.
func (l *loader) checkFinal(steps []schemas.Step, infos []stepInfo, stepsPos pos, graphOK bool) {
	first := -1
	for i, s := range steps {
		if !s.Final {
			continue
		}
		if first < 0 {
			first = i
			continue
		}
		l.errorf(infos[i].final, stepField(s.Name, "final"),
			"only one step may be final; step %q (line %d) is already final", steps[first].Name, infos[first].final.line)
	}
	if first >= 0 || !graphOK {
		return
	}
	required := make(map[string]bool)
	for _, s := range steps {
		for _, r := range s.Requires {
			required[r] = true
		}
	}
	var sinks []int
	for i, s := range steps {
		if !required[s.Name] {
			sinks = append(sinks, i)
		}
	}
	switch len(sinks) {
	case 0: // every step is in a cycle, reported already
	case 1:
		steps[sinks[0]].Final = true
	default:
		names := make([]string, len(sinks))
		for i, s := range sinks {
			names[i] = steps[s].Name
		}
		l.errorf(stepsPos, "steps", "cannot tell which step is final: %s are required by no other step; mark one with final: true",
			strings.Join(names, ", "))
	}
}

// stepField returns the dotted path of field rest of step name.
func stepField(name, rest string) string {
	return join("steps", name) + "." + rest
}

// stepNames lists the steps' names for messages.
func stepNames(steps []schemas.Step) string {
	names := make([]string, len(steps))
	for i, s := range steps {
		names[i] = s.Name
	}
	return strings.Join(names, ", ")
}
