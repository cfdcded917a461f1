package definition

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/loopbus/loopbus/schemas"
)

// loopsDir returns a directory holding the files the test loops files refer
// to.
func loopsDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"agents/agent.sh":           "#!/bin/sh\n",
		"checks/spec.sh":            "#!/bin/sh\n",
		"test.sh":                   "#!/bin/sh\n",
		"prompts/plan.md":           "Plan {{.Task}}\n",
		"prompts/spec.md":           "Specify {{.Input}}\n",
		"prompts/bad.md":            "Broken {{end}}\n",
		"prompts/empty.md":          " \n",
		"prompts/dir/keep":          "",
		"schemas/items.schema.json": `{"type": "object", "required": ["items"]}`,
	})
	return dir
}

const validLoops = `kind: loops
name: add-feature
target: {base: release/1.2}
agent: {backend: exec, command: [sh, agents/agent.sh], env: {MODE: fast}}
budget: {max_cost_usd: 5}
breaker: {no_progress: 3}
levels:
  plan:
    agent: {backend: claude, model: opus}
    prompt: prompts/plan.md
    outputs: [{name: plan.md}, {name: notes.txt}]
    validate: [sh, -c, "grep -q '^## ' \"$LOOPBUS_OUTPUT_DIR/plan.md\""]
    validate_timeout: 30s
    max_iterations: 5
    timeout: 10m
    children: {level: spec, from: plan.md, split: headings}
  spec:
    prompt: prompts/spec.md
    outputs: [{name: spec.json, schema: schemas/items.schema.json}]
    validate: [sh, checks/spec.sh]
    timeout: 1h
    breaker: {identical_failures: 2}
    children: {level: code, from: spec.json, split: json, path: /items, max: 20}
  code:
    worktree: true
    validate: [sh, test.sh]
    max_iterations: 10
    children: {level: review}
  review:
    prompt: ""
    outputs: [{name: review.md}]
`

func TestParseLoops(t *testing.T) {
	dir := loopsDir(t)
	got, err := Parse("p.yaml", []byte(validLoops), dir)
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	defAgent := func() schemas.AgentSpec {
		return schemas.AgentSpec{
			Backend: "exec",
			Command: []string{"sh", filepath.Join(dir, "agents/agent.sh")},
			Env:     map[string]string{"MODE": "fast"},
		}
	}
	want := schemas.Pipeline{
		Name:    "add-feature",
		Source:  "p.yaml",
		Dir:     dir,
		Kind:    schemas.KindLoops,
		Budget:  &schemas.Budget{MaxCostUSD: 5},
		Breaker: &schemas.Breaker{NoProgress: 3},
		Loops: &schemas.Loops{
			Base: "release/1.2",
			Levels: []schemas.LoopLevel{
				{
					Name:       "plan",
					Agent:      schemas.AgentSpec{Backend: "claude", Model: "opus"},
					Prompt:     "Plan {{.Task}}\n",
					PromptPath: "prompts/plan.md",
					Outputs: []schemas.Output{
						{Name: "plan.md", Report: true, ReportText: true},
						{Name: "notes.txt"},
					},
					Validate:          []string{"sh", "-c", `grep -q '^## ' "$LOOPBUS_OUTPUT_DIR/plan.md"`},
					MaxIterations:     5,
					TimeoutMs:         600_000,
					ValidateTimeoutMs: 30_000,
					Children:          &schemas.LoopChildren{Level: "spec", From: "plan.md", Split: schemas.SplitHeadings, Max: schemas.DefaultMaxChildren},
					Line:              8,
				},
				{
					Name:       "spec",
					Agent:      defAgent(),
					Prompt:     "Specify {{.Input}}\n",
					PromptPath: "prompts/spec.md",
					Outputs: []schemas.Output{{
						Name:          "spec.json",
						SchemaPath:    "schemas/items.schema.json",
						Schema:        json.RawMessage(`{"type":"object","required":["items"]}`),
						SchemaVersion: schemas.SchemaVersionOf([]byte(`{"type": "object", "required": ["items"]}`)),
						Report:        true,
					}},
					Validate:          []string{"sh", filepath.Join(dir, "checks/spec.sh")},
					MaxIterations:     5,
					TimeoutMs:         3_600_000,
					ValidateTimeoutMs: 60_000,
					Children:          &schemas.LoopChildren{Level: "code", From: "spec.json", Split: schemas.SplitJSON, Path: "/items", Max: 20},
					Breaker:           &schemas.Breaker{IdenticalFailures: 2},
					Line:              17,
				},
				{
					Name:              "code",
					Agent:             defAgent(),
					Validate:          []string{"sh", "test.sh"}, // as written: it runs in the worktree
					MaxIterations:     10,
					TimeoutMs:         600_000,
					ValidateTimeoutMs: 60_000,
					Worktree:          true,
					Children:          &schemas.LoopChildren{Level: "review", Max: schemas.DefaultMaxChildren},
					Line:              24,
				},
				{
					Name:              "review",
					Agent:             defAgent(),
					Outputs:           []schemas.Output{{Name: "review.md"}},
					MaxIterations:     5,
					TimeoutMs:         600_000,
					ValidateTimeoutMs: 60_000,
					Line:              29,
				},
			},
		},
	}
	if !reflect.DeepEqual(got, want) {
		g, _ := json.MarshalIndent(got, "", "  ")
		w, _ := json.MarshalIndent(want, "", "  ")
		t.Errorf("Parse mismatch\ngot:  %s\nwant: %s", g, w)
	}
	if len(got.Steps) != 0 {
		t.Errorf("Steps = %v, want none", got.Steps)
	}
	if got.Loops.Level("code") == nil || !got.Loops.NeedsRepo() {
		t.Errorf("Level(code) = nil or NeedsRepo false")
	}

	// Levels that take the top-level agent do not share its slices and
	// maps.
	spec, code := got.Loops.Level("spec"), got.Loops.Level("code")
	spec.Agent.Command[0] = "changed"
	spec.Agent.Env["MODE"] = "changed"
	if code.Agent.Command[0] != "sh" || code.Agent.Env["MODE"] != "fast" {
		t.Errorf("levels share the top-level agent: code's agent is %+v", code.Agent)
	}
}

// TestParseLoopsMinimal checks the defaults of a file that sets only what
// it must.
func TestParseLoopsMinimal(t *testing.T) {
	dir := loopsDir(t)
	got, err := Parse("p.yaml", []byte("kind: loops\nname: m\nlevels:\n  code:\n    agent: {backend: codex}\n    worktree: true\n"), dir)
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	want := schemas.Pipeline{
		Name:   "m",
		Source: "p.yaml",
		Dir:    dir,
		Kind:   schemas.KindLoops,
		Loops: &schemas.Loops{Levels: []schemas.LoopLevel{{
			Name:              "code",
			Agent:             schemas.AgentSpec{Backend: "codex"},
			MaxIterations:     5,
			TimeoutMs:         600_000,
			ValidateTimeoutMs: 60_000,
			Worktree:          true,
			Line:              4,
		}}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Parse = %+v, want %+v", got, want)
	}
}

// chainLevels returns n levels l1 ... ln, each spawning the next, starting
// at line 5 after loopsHead.
func chainLevels(n int) string {
	var b strings.Builder
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&b, "  l%d:\n    outputs: [{name: o.md}]\n", i)
		if i < n {
			fmt.Fprintf(&b, "    children: {level: l%d, from: o.md}\n", i+1)
		}
	}
	return b.String()
}

// loopsHead starts a loops file; its levels start at line 5.
const loopsHead = "kind: loops\nname: demo\nagent: {backend: claude}\nlevels:\n"

func TestParseLoopsDepth(t *testing.T) {
	dir := loopsDir(t)
	p, err := Parse("p.yaml", []byte(loopsHead+chainLevels(maxLoopDepth)), dir)
	if err != nil {
		t.Fatalf("Parse of %d levels: %v", maxLoopDepth, err)
	}
	if n := len(p.Loops.Levels); n != maxLoopDepth {
		t.Errorf("got %d levels, want %d", n, maxLoopDepth)
	}
}

func TestParseLoopsErrors(t *testing.T) {
	dir := loopsDir(t)
	const plan = "  plan:\n    outputs: [{name: plan.md}]\n" // lines 5-6
	tests := []struct {
		name    string
		yaml    string
		wantErr []string // in order, each the prefix of one problem
	}{
		// Keys.
		{
			name: "unknown top-level key",
			yaml: "kind: loops\nname: demo\nagent: {backend: claude}\nsteps: {}\nlevelz: {}\nlevels:\n" + "  plan:\n    outputs: [{name: plan.md}]\n",
			wantErr: []string{
				`p.yaml:4: steps: a file of kind loops has no steps: its loops are configured by levels (rename steps to levels, or remove kind for a pipeline)`,
				`p.yaml:5: levelz: unknown key "levelz" (allowed: kind, name, target, agent, levels, budget, breaker, job_dispatch_timeout)`,
			},
		},
		{
			name:    "unknown level key",
			yaml:    loopsHead + plan + "    requires: [x]\n",
			wantErr: []string{`p.yaml:7: levels.plan.requires: unknown key "requires" (allowed: agent, prompt, outputs, validate, validate_timeout, max_iterations, timeout, worktree, children, breaker, approval)`},
		},
		{
			name:    "name and levels missing",
			yaml:    "kind: loops\nagent: {backend: claude}\n",
			wantErr: []string{`p.yaml:1: name: required`, `p.yaml:1: levels: required: a mapping from level names to levels, the first the root`},
		},
		{
			name:    "no levels",
			yaml:    "kind: loops\nname: demo\nlevels: {}\n",
			wantErr: []string{`p.yaml:3: levels: must define at least one level`},
		},
		{
			name:    "levels not a mapping",
			yaml:    "kind: loops\nname: demo\nlevels: [plan]\n",
			wantErr: []string{`p.yaml:3: levels: want a mapping, got a list`},
		},
		{
			name:    "level not a mapping",
			yaml:    loopsHead + "  plan: go\n",
			wantErr: []string{`p.yaml:5: levels.plan: want a mapping with keys agent, prompt,`},
		},

		// Level names.
		{
			name:    "level name with a dash",
			yaml:    loopsHead + "  add-tests:\n    outputs: [{name: plan.md}]\n",
			wantErr: []string{`p.yaml:5: levels.add-tests: invalid level name "add-tests": must not contain "-" (loop ids join level names with "-")`},
		},
		{
			name:    "level name with a space",
			yaml:    loopsHead + "  a b:\n    outputs: [{name: plan.md}]\n",
			wantErr: []string{`p.yaml:5: levels."a b": invalid level name "a b": character ' ' not allowed (use A-Z, a-z, 0-9, _ and -)`},
		},

		// Agents, prompts, outputs.
		{
			name:    "missing agent",
			yaml:    "kind: loops\nname: demo\nlevels:\n" + plan,
			wantErr: []string{`p.yaml:4: levels.plan.agent: no agent: give the level an agent or the file a top-level agent`},
		},
		{
			name:    "bad top-level agent",
			yaml:    "kind: loops\nname: demo\nagent: {backend: exec}\nlevels:\n" + plan,
			wantErr: []string{`p.yaml:3: agent.command: required for the exec backend`},
		},
		{
			name:    "prompt file missing",
			yaml:    loopsHead + plan + "    prompt: prompts/nope.md\n",
			wantErr: []string{`p.yaml:7: levels.plan.prompt: prompt file prompts/nope.md: no such file or directory`},
		},
		{
			name:    "prompt not a file",
			yaml:    loopsHead + plan + "    prompt: prompts/dir\n",
			wantErr: []string{`p.yaml:7: levels.plan.prompt: prompt file prompts/dir: not a regular file`},
		},
		{
			name:    "prompt file empty",
			yaml:    loopsHead + plan + "    prompt: prompts/empty.md\n",
			wantErr: []string{`p.yaml:7: levels.plan.prompt: prompt file prompts/empty.md is empty (leave prompt out for the built-in prompt)`},
		},
		{
			name:    "bad template",
			yaml:    loopsHead + plan + "    prompt: prompts/bad.md\n",
			wantErr: []string{`p.yaml:7: levels.plan.prompt: prompt file prompts/bad.md: invalid template: template: prompts/bad.md:1:`},
		},
		{
			name:    "missing outputs",
			yaml:    loopsHead + "  plan:\n    prompt: prompts/plan.md\n",
			wantErr: []string{`p.yaml:5: levels.plan.outputs: required: at least one {name: ...} (only worktree levels may have none)`},
		},
		{
			name:    "empty outputs",
			yaml:    loopsHead + "  plan:\n    outputs: []\n",
			wantErr: []string{`p.yaml:6: levels.plan.outputs: must list at least one output (only worktree levels may have none)`},
		},
		{
			name:    "output listed twice",
			yaml:    loopsHead + "  plan:\n    outputs: [{name: plan.md}, {name: plan.md}]\n",
			wantErr: []string{`p.yaml:6: levels.plan.outputs[1].name: output "plan.md" is listed twice in level "plan"`},
		},
		{
			name:    "worktree not a boolean",
			yaml:    loopsHead + plan + "    worktree: yes please\n",
			wantErr: []string{`p.yaml:7: levels.plan.worktree: want true or false, got a string`},
		},
		{
			name:    "worktree validate not a list",
			yaml:    loopsHead + "  code:\n    worktree: true\n    validate: make test\n",
			wantErr: []string{`p.yaml:7: levels.code.validate: want an argv list, not a string`},
		},
		{
			name: "bad limits",
			yaml: loopsHead + plan + "    max_iterations: 101\n    timeout: soon\n    validate_timeout: 0s\n",
			wantErr: []string{
				`p.yaml:7: levels.plan.max_iterations: want an integer from 1 to 100, got "101"`,
				`p.yaml:8: levels.plan.timeout: invalid duration "soon"`,
				`p.yaml:9: levels.plan.validate_timeout: must be > 0, got "0s"`,
			},
		},

		// Children.
		{
			name:    "unknown child level",
			yaml:    loopsHead + plan + "    children: {level: spek}\n  spec:\n    outputs: [{name: spec.md}]\n",
			wantErr: []string{`p.yaml:7: levels.plan.children.level: unknown level "spek" (levels: plan, spec)`},
		},
		{
			name:    "child level missing",
			yaml:    loopsHead + plan + "    children: {from: plan.md}\n",
			wantErr: []string{`p.yaml:7: levels.plan.children.level: required: the level of the loops this level spawns (levels: plan)`},
		},
		{
			name:    "cycle",
			yaml:    loopsHead + plan + "    children: {level: spec}\n  spec:\n    outputs: [{name: spec.md}]\n    children: {level: plan}\n",
			wantErr: []string{`p.yaml:7: levels.plan.children.level: cycle of children: plan -> spec -> plan`},
		},
		{
			name:    "level spawning itself",
			yaml:    loopsHead + plan + "    children: {level: plan}\n",
			wantErr: []string{`p.yaml:7: levels.plan.children.level: cycle of children: plan -> plan`},
		},
		{
			name:    "cycle away from the root",
			yaml:    loopsHead + plan + "  a:\n    outputs: [{name: a.md}]\n    children: {level: b}\n  b:\n    outputs: [{name: b.md}]\n    children: {level: a}\n",
			wantErr: []string{`p.yaml:9: levels.a.children.level: cycle of children: a -> b -> a`},
		},
		{
			name:    "unreachable level",
			yaml:    loopsHead + plan + "  spec:\n    outputs: [{name: spec.md}]\n",
			wantErr: []string{`p.yaml:7: levels.spec: never spawned: no level's children name it (the root is plan, the first level)`},
		},
		{
			name:    "unreachable chain reported at its top",
			yaml:    loopsHead + plan + "  spec:\n    outputs: [{name: spec.md}]\n    children: {level: code}\n  code:\n    worktree: true\n",
			wantErr: []string{`p.yaml:7: levels.spec: never spawned: no level's children name it`},
		},
		{
			name:    "from not an output",
			yaml:    loopsHead + plan + "    children: {level: spec, from: spec.md}\n  spec:\n    outputs: [{name: spec.md}]\n",
			wantErr: []string{`p.yaml:7: levels.plan.children.from: "spec.md" is not an output of level plan (outputs: plan.md)`},
		},
		{
			name:    "from of a level without outputs",
			yaml:    loopsHead + "  code:\n    worktree: true\n    children: {level: review, from: diff.txt, split: headings}\n  review:\n    outputs: [{name: r.md}]\n",
			wantErr: []string{`p.yaml:7: levels.code.children.from: "diff.txt" is not an output of level code (the level has no outputs)`},
		},
		{
			name:    "split without from",
			yaml:    loopsHead + plan + "    children: {level: spec, split: headings}\n  spec:\n    outputs: [{name: spec.md}]\n",
			wantErr: []string{`p.yaml:7: levels.plan.children.from: required with split headings: the output the children are cut from (outputs: plan.md)`},
		},
		{
			name:    "bad split",
			yaml:    loopsHead + plan + "    children: {level: spec, from: plan.md, split: lines}\n  spec:\n    outputs: [{name: spec.md}]\n",
			wantErr: []string{`p.yaml:7: levels.plan.children.split: unknown split "lines" (splits: headings, json; leave split out to give one child the whole output)`},
		},
		{
			name:    "path without json",
			yaml:    loopsHead + plan + "    children: {level: spec, from: plan.md, split: headings, path: /items}\n  spec:\n    outputs: [{name: spec.md}]\n",
			wantErr: []string{`p.yaml:7: levels.plan.children.path: only with split json (a JSON pointer to the array to split)`},
		},
		{
			name:    "path without split",
			yaml:    loopsHead + plan + "    children: {level: spec, from: plan.md, path: /items}\n  spec:\n    outputs: [{name: spec.md}]\n",
			wantErr: []string{`p.yaml:7: levels.plan.children.path: only with split json`},
		},
		{
			name:    "path not a pointer",
			yaml:    loopsHead + plan + "    children: {level: spec, from: plan.md, split: json, path: items}\n  spec:\n    outputs: [{name: spec.md}]\n",
			wantErr: []string{`p.yaml:7: levels.plan.children.path: want a JSON pointer starting with "/", such as /items, got "items" (leave path out to split the document itself)`},
		},
		{
			name: "max out of range",
			yaml: loopsHead + plan + "    children: {level: spec, max: 0}\n  spec:\n    outputs: [{name: spec.md}]\n    children: {level: code, max: 1001}\n  code:\n    worktree: true\n",
			wantErr: []string{
				`p.yaml:7: levels.plan.children.max: want an integer from 1 to 1000, got 0`,
				`p.yaml:10: levels.spec.children.max: want an integer from 1 to 1000, got 1001`,
			},
		},
		{
			name:    "unknown children key",
			yaml:    loopsHead + plan + "    children: {level: spec, each: heading}\n  spec:\n    outputs: [{name: spec.md}]\n",
			wantErr: []string{`p.yaml:7: levels.plan.children.each: unknown key "each" (allowed: level, from, split, path, max)`},
		},
		{
			name:    "too deep",
			yaml:    loopsHead + chainLevels(maxLoopDepth+1),
			wantErr: []string{`p.yaml:28: levels.l8.children.level: too deep: the chain of levels from the root is 9 long (l1 -> l2 -> l3 -> l4 -> l5 -> l6 -> l7 -> l8 -> l9); at most 8, so that loop ids stay within 64 characters`},
		},

		// Target.
		{
			name:    "target base starting with a dash",
			yaml:    "kind: loops\nname: demo\ntarget: {base: --orphan}\nagent: {backend: claude}\nlevels:\n" + "  plan:\n    outputs: [{name: plan.md}]\n",
			wantErr: []string{`p.yaml:3: target.base: invalid branch "--orphan": must not start with "-" (it is passed to git)`},
		},
		{
			name:    "target base with a space",
			yaml:    "kind: loops\nname: demo\ntarget: {base: \"my branch\"}\nagent: {backend: claude}\nlevels:\n" + "  plan:\n    outputs: [{name: plan.md}]\n",
			wantErr: []string{`p.yaml:3: target.base: invalid branch "my branch": must not contain spaces`},
		},
		{
			name:    "target base empty",
			yaml:    "kind: loops\nname: demo\ntarget: {base: \"\"}\nagent: {backend: claude}\nlevels:\n" + "  plan:\n    outputs: [{name: plan.md}]\n",
			wantErr: []string{`p.yaml:3: target.base: must not be empty (leave target out for the current branch)`},
		},
		{
			name:    "target unknown key",
			yaml:    "kind: loops\nname: demo\ntarget: {branch: main}\nagent: {backend: claude}\nlevels:\n" + "  plan:\n    outputs: [{name: plan.md}]\n",
			wantErr: []string{`p.yaml:3: target.branch: unknown key "branch" (allowed: base)`},
		},
		{
			name:    "target not a mapping",
			yaml:    "kind: loops\nname: demo\ntarget: main\nagent: {backend: claude}\nlevels:\n" + "  plan:\n    outputs: [{name: plan.md}]\n",
			wantErr: []string{`p.yaml:3: target: want a mapping with keys base, got a string`},
		},

		// Budget and breaker, as in pipelines.
		{
			name: "bad budget and breaker",
			yaml: "kind: loops\nname: demo\nbudget: {max_cost_usd: 0}\nbreaker: {no_progress: 0}\nagent: {backend: claude}\nlevels:\n" + "  plan:\n    outputs: [{name: plan.md}]\n",
			wantErr: []string{
				`p.yaml:3: budget.max_cost_usd: want a number > 0, got 0`,
				`p.yaml:4: breaker.no_progress: want an integer > 0, got 0`,
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse("p.yaml", []byte(tt.yaml), dir)
			if err == nil {
				t.Fatalf("Parse succeeded, want %q", tt.wantErr)
			}
			checkInvalid(t, err)
			var errs Errors
			if !errors.As(err, &errs) {
				t.Fatalf("error %T is not Errors", err)
			}
			if len(errs) != len(tt.wantErr) {
				t.Fatalf("got %d problems, want %d:\n%v", len(errs), len(tt.wantErr), err)
			}
			for i, w := range tt.wantErr {
				if !strings.HasPrefix(errs[i].Error(), w) {
					t.Errorf("problem %d = %q, want prefix %q", i, errs[i].Error(), w)
				}
			}
		})
	}
}

func TestParseLoopsErrorCauses(t *testing.T) {
	dir := loopsDir(t)
	_, err := Parse("p.yaml", []byte(loopsHead+"  plan:\n    prompt: prompts/nope.md\n    outputs: [{name: ../x}]\n"), dir)
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("errors.Is(err, fs.ErrNotExist) = false for %v", err)
	}
	if !errors.Is(err, schemas.ErrBadName) {
		t.Errorf("errors.Is(err, schemas.ErrBadName) = false for %v", err)
	}
}

func FuzzParseLoops(f *testing.F) {
	dir := f.TempDir()
	for _, seed := range []string{
		validLoops,
		loopsHead + chainLevels(3),
		loopsHead + "  a: {outputs: [{name: a}], children: {level: b, from: a, split: json, path: /x}}\n  b: {worktree: true, children: {level: a}}\n",
		"kind: loops\nname: x\ntarget: {base: -x}\nlevels: {a-b: {children: {level: a-b, split: headings}}}\n",
		"kind: loops\nlevels: [1]\n",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := Parse("fuzz.yaml", data, dir)
		if err != nil {
			checkInvalid(t, err)
			return
		}
		if p.Kind == schemas.KindLoops && (p.Loops == nil || len(p.Loops.Levels) == 0) {
			t.Errorf("valid loops file without levels: %+v", p)
		}
	})
}

// TestLoadCodingExamples holds the example loops files to the parser: the
// scripted one and those documented for Claude Code and for a model API.
func TestLoadCodingExamples(t *testing.T) {
	for _, name := range []string{"loops.yaml", "loops-claude.yaml", "loops-model.yaml"} {
		t.Run(name, func(t *testing.T) {
			p, err := Load(filepath.Join("..", "examples", "coding", name))
			if err != nil {
				t.Fatal(err)
			}
			if p.Kind != schemas.KindLoops || len(p.Loops.Levels) != 3 || !p.Loops.Levels[2].Worktree || p.Loops.Base != "main" {
				t.Errorf("%s: kind %q, loops %+v", name, p.Kind, p.Loops)
			}
		})
	}
}
