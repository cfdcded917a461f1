// Package definition parses the files users write, pipelines, backlogs and
// loop hierarchies, reporting every problem as FILE:LINE: FIELD. A pipeline
// is a YAML document naming the steps of an agent pipeline, their agents,
// prompts, outputs and dependencies. It validates them and returns the
// normalized schemas.Pipeline that a session carries, with defaults
// applied, relative paths resolved and output schemas inlined, so that no
// other service needs the file.
//
// A pipeline file looks like this (paths are relative to its directory):
//
//	name: writing-kit
//	budget: {max_cost_usd: 2.5, max_tokens: 2000000, max_iterations: 20}
//	breaker: {no_progress: 3, identical_failures: 3}
//	job_dispatch_timeout: 10m   # optional: fail a job no worker started by then
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
// An agent's backend is exec (command is the argv to run), claude or codex
// (those CLIs; options model, args, command to run another program, and
// for claude permission_mode and allowed_tools), or openai or anthropic,
// which call a model's API themselves and run the tools it asks for (every
// option is optional):
//
//	agent:
//	  backend: openai                      # or anthropic
//	  model: gpt-4.1-mini                  # default: the worker's $OPENAI_MODEL ($ANTHROPIC_MODEL)
//	  base_url: http://127.0.0.1:8000/v1   # default: the worker's $OPENAI_BASE_URL, else the vendor's API
//	  api_key_env: MY_KEY                  # default: OPENAI_API_KEY (ANTHROPIC_API_KEY)
//	  tools: [read_file, run]              # default: read_file, write_file, edit_file, list_files, run
//	  max_turns: 40                        # model calls of a job, 1 to 1000
//	  max_tokens: 8192                     # output tokens of a call, 1 to 1000000
//	  price: {input_per_mtok: 0.4, output_per_mtok: 1.6, cached_input_per_mtok: 0.1}
//	  retry_wait: 30s                      # longest rate-limit wait within a job, at most 1h
//	  stream: true                         # false asks for whole responses
//
// Every backend takes env and secret_env.
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
// A file with kind: loops describes a hierarchy of loops: levels in order,
// the first the root, each loop of a level spawning loops of the level its
// children name, cut from one of its outputs (defaults shown; prompt is a
// template file, omitted for the built-in prompt):
//
//	kind: loops
//	name: add-feature
//	target: {base: main}                   # default: the current branch
//	agent: {backend: claude}               # for levels without their own
//	levels:
//	  plan:
//	    prompt: prompts/plan.md
//	    outputs: [{name: plan.md}]
//	    max_iterations: 5
//	    timeout: 10m
//	    children: {level: code, from: plan.md, split: headings, max: 50}
//	  code:
//	    worktree: true                     # runs in a git worktree
//	    validate: [sh, test.sh]            # kept as written: runs there
//
// Every problem is reported with the file, line and dotted field path it
// concerns, and all problems of a file are reported at once (see Errors).
package definition

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/goccy/go-yaml/ast"

	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/definition/yamlread"
	"github.com/loopbus/loopbus/schemas"
	"github.com/loopbus/loopbus/workspace"
)

const (
	backendList = "exec, claude, codex, openai, anthropic"

	// Limits of the model-API backends' options.
	maxTurnsLimit  = 1000
	maxTokensLimit = 1_000_000
	maxRetryWait   = time.Hour // retryWait's message says 1h

	defaultTimeout         = 10 * time.Minute
	defaultValidateTimeout = time.Minute
	maxIterationsLimit     = 100

	// MaxSteps bounds a pipeline's steps.
	MaxSteps = 200

	// maxSchemaBytes bounds an output schema file.
	maxSchemaBytes = 1 << 20

	// MaxDefinitionBytes bounds a definition as a session carries it (its
	// JSON in session.started, beside the input's reference and the
	// definition files' list), leaving room within bus.MaxEventBytes.
	MaxDefinitionBytes = bus.MaxEventBytes - 64<<10
)

// part is a sizeable piece of a definition (a prompt, a schema), kept with
// its place for the message that the whole is too large.
type part struct {
	pos   yamlread.Pos
	field string
	what  string
	size  int
}

// checkSize refuses a definition whose JSON is over MaxDefinitionBytes, at
// the place of its largest part.
func (l *loader) checkSize(p schemas.Pipeline) {
	raw, err := json.Marshal(p)
	if err != nil || len(raw) <= MaxDefinitionBytes || len(l.parts) == 0 {
		if err == nil && len(raw) > MaxDefinitionBytes {
			l.Errorf(yamlread.Pos{Line: 1}, "", "the definition is %d bytes as a session carries it, over the limit of %d", len(raw), MaxDefinitionBytes)
		}
		return
	}
	big := l.parts[0]
	for _, pt := range l.parts[1:] {
		if pt.size > big.size {
			big = pt
		}
	}
	l.Errorf(big.pos, big.field, "the definition is %d bytes as a session carries it, over the limit of %d (an event's size, less room for the rest); its largest part is this %s, %d bytes: move long text into input files the agent reads",
		len(raw), MaxDefinitionBytes, big.what, big.size)
}

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
// of kind loops is returned with Kind loops, no steps and Loops set: its
// levels in file order with prompt files read, agents defaulted from the
// top-level agent and defaults applied (max_iterations 5, timeout 10m,
// validate_timeout 1m, children.max 50), each children's from output marked
// as a report. A file without kind, or of kind pipeline, is returned with
// Kind empty.
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
	l := &loader{dir: abs}
	l.File = name
	l.Empty = "file is empty: want a mapping with name and steps"
	p := l.pipeline(data)
	if len(l.Errs) == 0 {
		l.checkSize(p)
	}
	for _, e := range l.Errs {
		e.Msg = oneLine(e.Msg)
	}
	if err := l.Err(); err != nil {
		return schemas.Pipeline{}, err
	}
	return p, nil
}

// loader holds the state of one Parse call: the reader of the file (which
// expands merge keys and collects the problems) and the directory relative
// paths resolve against.
type loader struct {
	yamlread.Reader[invalid]
	dir string
	// parts are the definition's prompts and schemas, for checkSize.
	parts []part
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
	requires []yamlread.Entry // each requires item
	final    yamlread.Pos     // the final key
	outputs  []yamlread.Pos   // each output's name
	// bad is set when the step's dependencies could not be decoded, so the
	// graph checks would report spurious problems.
	bad bool
}

// pipeline decodes and checks the whole document.
func (l *loader) pipeline(data []byte) schemas.Pipeline {
	p := schemas.Pipeline{Source: l.File, Dir: l.dir}
	body, ok := l.Document(data)
	if !ok {
		return p
	}
	if _, isMap := body.(*ast.MappingNode); !isMap {
		l.Mapping(body, yamlread.PosOf(body), "", pipelineKeys())
		return p
	}
	// The keys allowed depend on the kind, so they are checked after it
	// is known.
	top, _ := l.Mapping(body, yamlread.PosOf(body), "", nil)
	switch l.fileKind(top) {
	case schemas.KindBacklog:
		l.backlog(top, &p)
		return p
	case schemas.KindLoops:
		l.loops(top, &p)
		return p
	case schemas.KindPipeline:
	default:
		return p
	}
	top = l.Only(top, pipelineKeys(), "key")
	if be, ok := top.Get("budget"); ok {
		p.Budget = l.budget(be)
	}
	if be, ok := top.Get("breaker"); ok {
		p.Breaker = l.breaker(be)
	}
	if te, ok := top.Get("job_dispatch_timeout"); ok {
		p.JobDispatchTimeoutMs = l.duration(te, 0)
	}
	p.Name = l.name(top)
	se, ok := top.Get("steps")
	if !ok {
		l.Errorf(top.Pos, "steps", "required: a mapping from step names to steps")
		return p
	}
	steps, ok := l.Mapping(se.Val, se.KeyPos, "steps", nil)
	if !ok {
		return p
	}
	if len(steps.Entries) == 0 {
		l.Errorf(se.KeyPos, "steps", "must define at least one step")
		return p
	}
	if len(steps.Entries) > MaxSteps {
		l.Errorf(se.KeyPos, "steps", "%d steps, over the limit of %d: a session carries its whole pipeline", len(steps.Entries), MaxSteps)
		return p
	}
	infos := make([]stepInfo, 0, len(steps.Entries))
	for _, e := range steps.Entries {
		s, info := l.step(e)
		p.Steps = append(p.Steps, s)
		infos = append(infos, info)
	}
	l.checkOutputs(p.Steps, infos)
	graphOK := l.checkGraph(p.Steps, infos)
	l.checkFinal(p.Steps, infos, se.KeyPos, graphOK)
	return p
}

// pipelineKeys returns the top-level keys of a pipeline file.
func pipelineKeys() []string {
	return []string{"name", "steps", "budget", "breaker", "kind", "job_dispatch_timeout"}
}

// fileKind returns the kind of the file: pipeline when top has no kind, ""
// when its kind is not one of the kinds (the problem is reported).
func (l *loader) fileKind(top yamlread.Map) string {
	e, ok := top.Get("kind")
	if !ok {
		return schemas.KindPipeline
	}
	k, ok := l.Str(e)
	if !ok {
		return ""
	}
	kinds := []string{schemas.KindPipeline, schemas.KindBacklog, schemas.KindLoops}
	if !slices.Contains(kinds, k) {
		l.Errorf(e.ValPos, e.Field, "unknown kind %q (kinds: %s)", k, strings.Join(kinds, ", "))
		return ""
	}
	return k
}

// name decodes the required name of a pipeline, backlog or loops file: it
// follows the step-name rules.
func (l *loader) name(top yamlread.Map) string {
	e, ok := top.Get("name")
	if !ok {
		l.Errorf(top.Pos, "name", "required")
		return ""
	}
	s, ok := l.Str(e)
	if !ok {
		return ""
	}
	if err := schemas.ValidateStepName(s); err != nil {
		l.Errorf(e.ValPos, e.Field, "%s", renameErr(err, "pipeline name"))
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
func (l *loader) step(e yamlread.Entry) (schemas.Step, stepInfo) {
	s := schemas.Step{
		Name:              e.Key,
		Line:              e.KeyPos.Line,
		MaxIterations:     1,
		TimeoutMs:         defaultTimeout.Milliseconds(),
		ValidateTimeoutMs: defaultValidateTimeout.Milliseconds(),
	}
	var info stepInfo
	if err := schemas.ValidateStepName(e.Key); err != nil {
		l.Errorf(e.KeyPos, e.Field, "%w", err)
	}
	m, ok := l.Mapping(e.Val, e.KeyPos, e.Field, []string{
		"requires", "agent", "prompt", "outputs", "validate",
		"max_iterations", "timeout", "validate_timeout", "final", "breaker", "approval",
	})
	if !ok {
		info.bad = true
		return s, info
	}

	if a, ok := m.Get("agent"); ok {
		s.Agent = l.agent(a)
	} else {
		l.Errorf(e.KeyPos, yamlread.Join(e.Field, "agent"), "required: {backend: exec, command: [...]}")
	}

	if pe, ok := m.Get("prompt"); !ok {
		l.Errorf(e.KeyPos, yamlread.Join(e.Field, "prompt"), "required")
	} else if text, ok := l.Str(pe); ok {
		s.Prompt = text
		if strings.TrimSpace(text) == "" {
			l.Errorf(pe.ValPos, pe.Field, "must not be empty")
		} else {
			l.prompt(pe.ValPos, pe.Field, e.Key, "", text)
		}
	}

	if re, ok := m.Get("requires"); ok {
		if names, items, ok := l.Strings(re, "[step-a, step-b]"); ok && len(names) > 0 {
			s.Requires, info.requires = names, items
		} else if !ok {
			info.bad = true
		}
	}

	if oe, ok := m.Get("outputs"); !ok {
		l.Errorf(e.KeyPos, yamlread.Join(e.Field, "outputs"), "required: at least one {name: ..., schema: ...}")
	} else if items, ok := l.Items(oe, "[{name: out.json}]"); ok {
		if len(items) == 0 {
			l.Errorf(oe.ValPos, oe.Field, "must list at least one output")
		}
		for _, it := range items {
			out, at := l.output(it)
			s.Outputs = append(s.Outputs, out)
			info.outputs = append(info.outputs, at)
		}
	}

	if ve, ok := m.Get("validate"); ok {
		if argv, ok := l.argv(ve); ok {
			s.Validate = argv
		}
	}
	l.runLimits(m, &s.MaxIterations, &s.TimeoutMs, &s.ValidateTimeoutMs, &s.Breaker)
	if fe, ok := m.Get("final"); ok {
		info.final = fe.KeyPos
		s.Final, _ = l.boolean(fe)
	}
	if ae, ok := m.Get("approval"); ok {
		s.Approval = l.approval(ae)
	}
	return s, info
}

// approval decodes a step's approval gate: "required", or a mapping
// {timeout: 24h, on_timeout: fail|reject|approve} (both optional; fail
// is the default). It returns nil on error.
func (l *loader) approval(e yamlread.Entry) *schemas.Approval {
	if _, null := e.Val.(*ast.NullNode); null || e.Val == nil {
		return nil
	}
	if text, ok := yamlread.Scalar(e.Val); ok {
		if _, isStr := e.Val.(*ast.StringNode); isStr && text == "required" {
			return &schemas.Approval{}
		}
		l.Errorf(e.ValPos, e.Field, "want required or {timeout: 24h, on_timeout: fail|reject|approve}, got %s", describeValue(e.Val))
		return nil
	}
	m, ok := l.Mapping(e.Val, e.KeyPos, e.Field, []string{"timeout", "on_timeout"})
	if !ok {
		return nil
	}
	a := &schemas.Approval{}
	if te, ok := m.Get("timeout"); ok {
		a.TimeoutMs = l.duration(te, 0)
	}
	if oe, ok := m.Get("on_timeout"); ok {
		if text, ok := l.Str(oe); ok {
			switch text {
			case schemas.OnTimeoutFail, schemas.OnTimeoutReject, schemas.OnTimeoutApprove:
				a.OnTimeout = text
				if a.TimeoutMs == 0 {
					if _, set := m.Get("timeout"); !set {
						l.Errorf(oe.KeyPos, oe.Field, "applies only with a timeout: add timeout: 24h (or another duration)")
					}
				}
			default:
				l.Errorf(oe.ValPos, oe.Field, "want fail, reject or approve, got %q", text)
			}
		}
	}
	return a
}

// runLimits decodes the keys that bound a step's or a loop level's runs
// (max_iterations, timeout, validate_timeout, breaker) into their fields,
// which hold the defaults.
func (l *loader) runLimits(m yamlread.Map, iterations *int, timeoutMs, validateTimeoutMs *int64, breaker **schemas.Breaker) {
	if ie, ok := m.Get("max_iterations"); ok {
		*iterations = l.iterations(ie)
	}
	if te, ok := m.Get("timeout"); ok {
		*timeoutMs = l.duration(te, *timeoutMs)
	}
	if te, ok := m.Get("validate_timeout"); ok {
		*validateTimeoutMs = l.duration(te, *validateTimeoutMs)
	}
	if be, ok := m.Get("breaker"); ok {
		*breaker = l.breaker(be)
	}
}

// agent decodes a step's agent.
func (l *loader) agent(e yamlread.Entry) schemas.AgentSpec {
	var a schemas.AgentSpec
	m, ok := l.Mapping(e.Val, e.KeyPos, e.Field, agentKeys())
	if !ok {
		return a
	}
	if se, ok := m.Get("secret_env"); ok {
		a.SecretEnv = l.secretEnv(se)
	}
	known := false
	if be, ok := m.Get("backend"); !ok {
		l.Errorf(e.KeyPos, yamlread.Join(e.Field, "backend"), "required (supported: %s)", backendList)
	} else if b, ok := l.Str(be); ok {
		a.Backend = b
		known = slices.Contains(backends(), b)
		if !known {
			l.Errorf(be.ValPos, be.Field, "unsupported backend %q (supported: %s)", b, backendList)
		}
	}
	// Options of the backends: only where they mean something (and only
	// checked against a backend that exists).
	const (
		exec      = schemas.BackendExec
		claude    = schemas.BackendClaude
		codex     = schemas.BackendCodex
		openai    = schemas.BackendOpenAI
		anthropic = schemas.BackendAnthropic
	)
	api := []string{openai, anthropic}
	str := func(p *string) func(yamlread.Entry) {
		return func(oe yamlread.Entry) { *p, _ = l.Str(oe) }
	}
	list := func(p *[]string) func(yamlread.Entry) {
		return func(oe yamlread.Entry) {
			if vals, _, ok := l.Strings(oe, "[a, b]"); ok {
				*p = vals
			}
		}
	}
	for _, o := range []struct {
		key      string
		backends []string
		decode   func(yamlread.Entry)
	}{
		{key: "command", backends: []string{exec, claude, codex}, decode: func(ce yamlread.Entry) {
			if argv, ok := l.argv(ce); ok {
				a.Command = argv
			}
		}},
		{key: "model", backends: []string{claude, codex, openai, anthropic}, decode: func(me yamlread.Entry) {
			if s, ok := l.Str(me); ok {
				a.Model = s
				if s == "" && slices.Contains(api, a.Backend) {
					l.Errorf(me.ValPos, me.Field, "must not be empty: name the model to call, or omit model for the worker's $%s_MODEL", strings.ToUpper(a.Backend))
				}
			}
		}},
		{key: "permission_mode", backends: []string{claude}, decode: str(&a.PermissionMode)},
		{key: "allowed_tools", backends: []string{claude}, decode: list(&a.AllowedTools)},
		{key: "args", backends: []string{claude, codex}, decode: list(&a.Args)},
		{key: "base_url", backends: api, decode: func(ue yamlread.Entry) { a.BaseURL = l.baseURL(ue) }},
		{key: "api_key_env", backends: api, decode: func(ke yamlread.Entry) {
			if s, ok := l.Str(ke); ok {
				if err := workspace.ValidateSecretName(s); err != nil {
					l.Errorf(ke.ValPos, ke.Field, "%w", err)
				} else {
					a.APIKeyEnv = s
				}
			}
		}},
		{key: "tools", backends: api, decode: func(te yamlread.Entry) { a.Tools = l.modelTools(te) }},
		{key: "max_turns", backends: api, decode: func(te yamlread.Entry) { a.MaxTurns = int(l.positiveInt(te, maxTurnsLimit)) }},
		{key: "max_tokens", backends: api, decode: func(te yamlread.Entry) { a.MaxTokens = l.positiveInt(te, maxTokensLimit) }},
		{key: "price", backends: api, decode: func(pe yamlread.Entry) { a.Price = l.price(pe) }},
		{key: "retry_wait", backends: api, decode: func(we yamlread.Entry) { a.RetryWaitMs = l.retryWait(we) }},
		{key: "stream", backends: api, decode: func(se yamlread.Entry) {
			if b, ok := l.boolean(se); ok {
				a.NoStream = !b
			}
		}},
	} {
		oe, ok := m.Get(o.key)
		if !ok {
			continue
		}
		if known && !slices.Contains(o.backends, a.Backend) {
			l.Errorf(oe.KeyPos, oe.Field, "not an option of the %s backend (only of %s)", a.Backend, andList(o.backends))
			continue
		}
		o.decode(oe)
	}
	if _, ok := m.Get("command"); !ok && a.Backend == exec {
		l.Errorf(e.KeyPos, yamlread.Join(e.Field, "command"), "required for the exec backend: an argv list such as [sh, agent.sh]")
	}
	if ee, ok := m.Get("env"); ok {
		if env, ok := l.Mapping(ee.Val, ee.KeyPos, ee.Field, nil); ok {
			for _, v := range env.Entries {
				if v.Key == "" || strings.ContainsAny(v.Key, "=\x00") {
					l.Errorf(v.KeyPos, v.Field, "invalid environment variable name %q", v.Key)
					continue
				}
				val, ok := l.Str(v)
				if !ok {
					continue
				}
				if slices.Contains(a.SecretEnv, v.Key) || workspace.LooksSecret(v.Key) && len(val) >= workspace.MinSecretLen {
					l.Errorf(v.KeyPos, v.Field, "values in env travel in events; set %s in the worker's environment and list it in secret_env", v.Key)
					continue
				}
				if a.Env == nil {
					a.Env = make(map[string]string)
				}
				a.Env[v.Key] = val
			}
		}
	}
	return a
}

// backends returns the agent backends a file may name.
func backends() []string {
	return []string{schemas.BackendExec, schemas.BackendClaude, schemas.BackendCodex, schemas.BackendOpenAI, schemas.BackendAnthropic}
}

// agentKeys returns the keys of an agent; which of them a backend takes is
// checked by agent.
func agentKeys() []string {
	return []string{
		"backend", "command", "env", "secret_env", "model", "permission_mode", "allowed_tools", "args",
		"base_url", "api_key_env", "tools", "max_turns", "max_tokens", "price", "retry_wait", "stream",
	}
}

// andList joins names for messages: "a", "a and b", "a, b and c".
func andList(names []string) string {
	if len(names) <= 1 {
		return strings.Join(names, "")
	}
	return strings.Join(names[:len(names)-1], ", ") + " and " + names[len(names)-1]
}

// baseURL decodes a model API's base_url: an http or https URL (scheme
// in lowercase) with a host and without credentials (the URL travels in
// events), kept as written. It returns "" on error.
func (l *loader) baseURL(e yamlread.Entry) string {
	s, ok := l.Str(e)
	if !ok {
		return ""
	}
	u, err := url.Parse(s)
	switch {
	case s == "":
		l.Errorf(e.ValPos, e.Field, "must not be empty: omit base_url for the backend's default")
	case err != nil || (u.Scheme != "http" && u.Scheme != "https") || !strings.HasPrefix(s, u.Scheme+"://") || u.Hostname() == "":
		l.Errorf(e.ValPos, e.Field, "want an http or https URL such as http://127.0.0.1:8000/v1, got %q", s)
	case u.User != nil:
		l.Errorf(e.ValPos, e.Field, "must not hold credentials: the URL travels in events; put the key in the worker's environment and name it in api_key_env")
	default:
		return s
	}
	return ""
}

// modelTools decodes the tools a model-API backend offers: a non-empty
// list of schemas.ModelTools, each listed once.
func (l *loader) modelTools(e yamlread.Entry) []string {
	names, items, ok := l.Strings(e, "[read_file, run]")
	if !ok {
		return nil
	}
	all := schemas.ModelTools()
	if len(names) == 0 {
		l.Errorf(e.ValPos, e.Field, "must not be empty: omit tools for all of them (%s)", strings.Join(all, ", "))
		return nil
	}
	var out []string
	for i, n := range names {
		switch {
		case !slices.Contains(all, n):
			l.Errorf(items[i].ValPos, items[i].Field, "unknown tool %q (tools: %s)", n, strings.Join(all, ", "))
		case slices.Contains(out, n):
			l.Errorf(items[i].ValPos, items[i].Field, "%s is listed twice", n)
		default:
			out = append(out, n)
		}
	}
	return out
}

// price decodes a model's price: input_per_mtok and output_per_mtok
// (required) and cached_input_per_mtok, US dollars per million tokens,
// numbers >= 0. It returns nil when the value is not a mapping.
func (l *loader) price(e yamlread.Entry) *schemas.Price {
	m, ok := l.Mapping(e.Val, e.KeyPos, e.Field, []string{"input_per_mtok", "output_per_mtok", "cached_input_per_mtok"})
	if !ok {
		return nil
	}
	var p schemas.Price
	for _, f := range []struct {
		key, what string
		v         *float64
	}{
		{"input_per_mtok", "input", &p.InputPerMTok},
		{"output_per_mtok", "output", &p.OutputPerMTok},
	} {
		if fe, ok := m.Get(f.key); ok {
			*f.v = l.nonNegativeNumber(fe)
		} else {
			l.Errorf(e.KeyPos, yamlread.Join(e.Field, f.key), "required: US dollars per million %s tokens", f.what)
		}
	}
	if ce, ok := m.Get("cached_input_per_mtok"); ok {
		v := l.nonNegativeNumber(ce)
		p.CachedInputPerMTok = &v
	}
	return &p
}

// retryWait decodes retry_wait, a duration (see duration) of at most
// maxRetryWait, into milliseconds; it returns 0 on error.
func (l *loader) retryWait(e yamlread.Entry) int64 {
	ms := l.duration(e, 0)
	if ms > maxRetryWait.Milliseconds() {
		text, _ := yamlread.Scalar(e.Val)
		l.Errorf(e.ValPos, e.Field, "must be at most 1h, got %q", text)
		return 0
	}
	return ms
}

// boolean decodes true or false; ok is false, and the problem reported,
// for anything else.
func (l *loader) boolean(e yamlread.Entry) (v, ok bool) {
	b, isBool := e.Val.(*ast.BoolNode)
	if !isBool {
		l.Errorf(e.ValPos, e.Field, "want true or false, got %s", yamlread.Kind(e.Val))
		return false, false
	}
	return b.Value, true
}

// secretEnv decodes secret_env: a list of environment variable names (see
// workspace.ValidateSecretName), each listed once.
func (l *loader) secretEnv(e yamlread.Entry) []string {
	names, items, ok := l.Strings(e, "[API_TOKEN]")
	if !ok {
		return nil
	}
	var out []string
	for i, n := range names {
		switch err := workspace.ValidateSecretName(n); {
		case err != nil:
			l.Errorf(items[i].ValPos, items[i].Field, "%w", err)
		case slices.Contains(out, n):
			l.Errorf(items[i].ValPos, items[i].Field, "%s is listed twice", n)
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
func (l *loader) argv(e yamlread.Entry) ([]string, bool) {
	argv, ok := l.rawArgv(e)
	if !ok {
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

// rawArgv decodes a command as argv does but keeps it as written, for
// commands that run elsewhere than the file's directory.
func (l *loader) rawArgv(e yamlread.Entry) ([]string, bool) {
	if _, isSeq := e.Val.(*ast.SequenceNode); !isSeq {
		if _, isStr := yamlread.Scalar(e.Val); isStr {
			l.Errorf(e.ValPos, e.Field, "want an argv list, not a string: write [sh, -c, \"...\"] to run a shell command")
			return nil, false
		}
	}
	argv, items, ok := l.Strings(e, "[sh, -c, \"...\"]")
	if !ok {
		return nil, false
	}
	if len(argv) == 0 {
		l.Errorf(e.ValPos, e.Field, "must not be empty")
		return nil, false
	}
	if argv[0] == "" {
		l.Errorf(items[0].ValPos, items[0].Field, "program must not be empty")
		return nil, false
	}
	return argv, true
}

// output decodes one element of outputs and returns it with the position
// of its name.
func (l *loader) output(it yamlread.Entry) (schemas.Output, yamlread.Pos) {
	var out schemas.Output
	m, ok := l.Mapping(it.Val, it.ValPos, it.Field, []string{"name", "schema"})
	if !ok {
		return out, it.ValPos
	}
	at := m.Pos
	if ne, ok := m.Get("name"); !ok {
		l.Errorf(m.Pos, yamlread.Join(it.Field, "name"), "required")
	} else if name, ok := l.Str(ne); ok {
		at = ne.ValPos
		if err := schemas.ValidateName(name); err != nil {
			l.Errorf(ne.ValPos, ne.Field, "%w", err)
		} else {
			out.Name = name
		}
	}
	if se, ok := m.Get("schema"); ok {
		if path, ok := l.Str(se); ok {
			l.schema(se, path, &out)
		}
	}
	return out, at
}

// schema reads, checks and inlines the output schema at path.
func (l *loader) schema(e yamlread.Entry, path string, out *schemas.Output) {
	if path == "" {
		l.Errorf(e.ValPos, e.Field, "must not be empty")
		return
	}
	full := path
	if !filepath.IsAbs(full) {
		full = filepath.Join(l.dir, full)
	}
	raw, err := readSchema(full)
	if err != nil {
		l.Errorf(e.ValPos, e.Field, "schema file %s: %w", path, err)
		return
	}
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		l.Errorf(e.ValPos, e.Field, "schema file %s is not valid JSON: %w", path, err)
		return
	}
	if _, err := schemas.CompileArtifactSchema(path, raw); err != nil {
		l.Errorf(e.ValPos, e.Field, "%w", err)
		return
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, raw); err != nil {
		l.Errorf(e.ValPos, e.Field, "schema file %s is not valid JSON: %w", path, err)
		return
	}
	out.SchemaPath = path
	out.Schema = json.RawMessage(compact.Bytes())
	l.parts = append(l.parts, part{pos: e.ValPos, field: e.Field, what: "schema", size: compact.Len()})
	out.SchemaVersion = schemas.SchemaVersionOf(raw)
}

// prompt checks a prompt template (its size, then ParsePrompt; name names
// it in the template's messages, and prefix starts the message of a
// problem) and keeps its size for checkSize. It reports whether the
// template is good.
func (l *loader) prompt(pos yamlread.Pos, field, name, prefix, text string) bool {
	if len(text) > MaxPromptBytes {
		l.Errorf(pos, field, "%sthe template is %d bytes; a prompt renders to at most %d: move long text into input files the agent reads", prefix, len(text), MaxPromptBytes)
		return false
	}
	if _, err := ParsePrompt(name, text); err != nil {
		l.Errorf(pos, field, "%sinvalid template: %w", prefix, err)
		return false
	}
	l.parts = append(l.parts, part{pos: pos, field: field, what: "prompt", size: len(text)})
	return true
}

// readSchema reads a schema file (or a loop level's prompt file), refusing
// anything but a regular file of at most maxSchemaBytes (a pipeline naming
// /dev/zero must not hang Parse).
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
func (l *loader) iterations(e yamlread.Entry) int {
	bad := func() int {
		l.Errorf(e.ValPos, e.Field, "want an integer from 1 to %d, got %s", maxIterationsLimit, describe(e.Val))
		return 1
	}
	n, ok := e.Val.(*ast.IntegerNode)
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
func (l *loader) budget(e yamlread.Entry) *schemas.Budget {
	m, ok := l.Mapping(e.Val, e.KeyPos, e.Field, []string{"max_cost_usd", "max_tokens", "max_iterations"})
	if !ok {
		return nil
	}
	var b schemas.Budget
	if ce, ok := m.Get("max_cost_usd"); ok {
		b.MaxCostUSD = l.positiveNumber(ce)
	}
	if te, ok := m.Get("max_tokens"); ok {
		b.MaxTokens = l.positiveInt(te, math.MaxInt64)
	}
	if ie, ok := m.Get("max_iterations"); ok {
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
func (l *loader) breaker(e yamlread.Entry) *schemas.Breaker {
	m, ok := l.Mapping(e.Val, e.KeyPos, e.Field, []string{"no_progress", "identical_failures"})
	if !ok {
		return nil
	}
	var b schemas.Breaker
	if ne, ok := m.Get("no_progress"); ok {
		b.NoProgress = int(l.positiveInt(ne, math.MaxInt32))
	}
	if fe, ok := m.Get("identical_failures"); ok {
		b.IdenticalFailures = int(l.positiveInt(fe, math.MaxInt32))
	}
	if b == (schemas.Breaker{}) {
		return nil
	}
	return &b
}

// positiveInt decodes an integer from 1 to limit; it returns 0 on error.
func (l *loader) positiveInt(e yamlread.Entry, limit int64) int64 {
	tooLarge := false
	if n, ok := e.Val.(*ast.IntegerNode); ok {
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
		l.Errorf(e.ValPos, e.Field, "must be at most %d, got %s", limit, describeValue(e.Val))
	} else {
		l.Errorf(e.ValPos, e.Field, "want an integer > 0, got %s", describeValue(e.Val))
	}
	return 0
}

// positiveNumber decodes a finite number > 0; it returns 0 on error.
func (l *loader) positiveNumber(e yamlread.Entry) float64 {
	if v, ok := number(e.Val); ok && v > 0 {
		return v
	}
	l.Errorf(e.ValPos, e.Field, "want a number > 0, got %s", describeValue(e.Val))
	return 0
}

// nonNegativeNumber decodes a finite number >= 0; it returns 0 on error.
func (l *loader) nonNegativeNumber(e yamlread.Entry) float64 {
	if v, ok := number(e.Val); ok && v >= 0 {
		return v
	}
	l.Errorf(e.ValPos, e.Field, "want a number >= 0, got %s", describeValue(e.Val))
	return 0
}

// number returns the value of a finite integer or float node.
func number(n ast.Node) (float64, bool) {
	var v float64
	switch n := n.(type) {
	case *ast.IntegerNode:
		switch x := n.Value.(type) {
		case int64:
			v = float64(x)
		case uint64:
			v = float64(x)
		default:
			return 0, false
		}
	case *ast.FloatNode:
		v = n.Value
	default:
		return 0, false
	}
	if math.IsInf(v, 0) || math.IsNaN(v) {
		return 0, false
	}
	return v, true
}

// describeValue shows a resolved value for messages about numbers: a
// number or boolean as written, a string quoted and named as one (so "5"
// in quotes is not mistaken for 5), anything else by its kind.
func describeValue(n ast.Node) string {
	switch n.(type) {
	case *ast.StringNode, *ast.LiteralNode:
		s, _ := yamlread.Scalar(n)
		return fmt.Sprintf("the string %q", s)
	}
	if s, ok := yamlread.Scalar(n); ok {
		return s
	}
	return yamlread.Kind(n)
}

// duration decodes a positive Go duration into milliseconds; it returns def
// on error.
func (l *loader) duration(e yamlread.Entry, def int64) int64 {
	text, ok := l.Str(e)
	if !ok {
		return def
	}
	d, err := time.ParseDuration(text)
	switch {
	case err != nil:
		l.Errorf(e.ValPos, e.Field, "invalid duration %q: want a Go duration such as 30s, 2m or 1h30m", text)
	case d <= 0:
		l.Errorf(e.ValPos, e.Field, "must be > 0, got %q", text)
	case d < time.Millisecond:
		l.Errorf(e.ValPos, e.Field, "must be at least 1ms, got %q", text)
	default:
		return d.Milliseconds()
	}
	return def
}

// describe shows a resolved scalar's text, or its kind for anything else.
func describe(n ast.Node) string {
	if s, ok := yamlread.Scalar(n); ok {
		return fmt.Sprintf("%q", s)
	}
	return yamlread.Kind(n)
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
				seen[o.Name] = owner{s.Name, at.Line}
			case prev.step == s.Name:
				l.Errorf(at, field, "output %q is listed twice in step %q", o.Name, s.Name)
			default:
				l.Errorf(at, field, "output %q of step %q is also produced by step %q (line %d); output names must be unique across the pipeline",
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
			at := infos[i].requires[j].ValPos
			t, known := index[r]
			switch {
			case !known:
				l.Errorf(at, field, "unknown step %q (steps: %s)", r, stepNames(steps))
				ok = false
			case slices.Index(s.Requires, r) < j:
				l.Errorf(at, field, "step %q is listed twice", r)
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
				l.Errorf(infos[from].requires[j].ValPos, stepField(steps[from].Name, fmt.Sprintf("requires[%d]", j)),
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
func (l *loader) checkFinal(steps []schemas.Step, infos []stepInfo, stepsPos yamlread.Pos, graphOK bool) {
	first := -1
	for i, s := range steps {
		if !s.Final {
			continue
		}
		if first < 0 {
			first = i
			continue
		}
		l.Errorf(infos[i].final, stepField(s.Name, "final"),
			"only one step may be final; step %q (line %d) is already final", steps[first].Name, infos[first].final.Line)
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
		l.Errorf(stepsPos, "steps", "cannot tell which step is final: %s are required by no other step; mark one with final: true",
			strings.Join(names, ", "))
	}
}

// stepField returns the dotted path of field rest of step name.
func stepField(name, rest string) string {
	return yamlread.Join("steps", name) + "." + rest
}

// stepNames lists the steps' names for messages.
func stepNames(steps []schemas.Step) string {
	names := make([]string, len(steps))
	for i, s := range steps {
		names[i] = s.Name
	}
	return strings.Join(names, ", ")
}
