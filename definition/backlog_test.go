package definition

import (
	"errors"
	"io/fs"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/loopbus/loopbus/schemas"
)

// backlogDir returns a directory holding the files the test backlogs refer
// to.
func backlogDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"agent.sh":         "#!/bin/sh\n",
		"README.md":        "# demo\n",
		"docs/spec.md":     "spec\n",
		"other/README.md":  "# other\n",
		"docs/bad name.md": "x\n",
		"docs/sub/keep":    "",
	})
	return dir
}

// minimalBacklog is the smallest valid backlog file (7 lines); tests append
// top-level keys to it from line 8 on.
const minimalBacklog = `kind: backlog
name: demo
agents:
  a: {backend: exec, command: [echo]}
  b: {backend: claude}
roles:
  iterate: a
`

// defaultRoles returns the roles of a backlog whose only role is iterate:
// agent.
func defaultRoles(agent string) map[string][]string {
	return map[string][]string{
		schemas.RoleIterate:   {agent},
		schemas.RoleReview:    {agent},
		schemas.RoleRepair:    {agent},
		schemas.RoleBootstrap: {agent},
	}
}

// minimalWant returns the normalized minimalBacklog in dir, with every
// default, for tests to adjust.
func minimalWant(dir string) schemas.Pipeline {
	return schemas.Pipeline{
		Name:   "demo",
		Source: "p.yaml",
		Dir:    dir,
		Kind:   schemas.KindBacklog,
		Budget: &schemas.Budget{MaxIterations: 50},
		Backlog: &schemas.Backlog{
			Agents: map[string]schemas.AgentSpec{
				"a": {Backend: "exec", Command: []string{"echo"}},
				"b": {Backend: "claude"},
			},
			Roles:                defaultRoles("a"),
			Schedule:             schemas.ScheduleSingle,
			MaxParallel:          1,
			Project:              "demo",
			MaxSummaryIterations: 3,
			TimeoutMs:            600_000,
			ValidateTimeoutMs:    60_000,
		},
	}
}

func TestParseBacklog(t *testing.T) {
	dir := backlogDir(t)
	absReadme := filepath.Join(dir, "README.md")
	tests := []struct {
		name string
		yaml string
		want func() schemas.Pipeline
	}{
		{
			name: "every key",
			yaml: `kind: backlog
name: demo
project: Demo project
agents:
  claude:
    backend: claude
    model: sonnet
  helper:
    backend: exec
    command: [./agent.sh]
roles:
  iterate: [claude, helper]
  review: claude
  repair: [helper, claude]
  bootstrap: claude
schedule: odd-even
max_iterations: 40
max_parallel: 2
source_files: [README.md, docs/spec.md]
summary_iterations: 5
timeout: 30m
validate: [make, test]
validate_timeout: 2m
prompts:
  iterate: |
    Work on {{.Task.ID}}
  review: Review it
budget: {max_cost_usd: 5, max_iterations: 60}
breaker: {no_progress: 2}
`,
			want: func() schemas.Pipeline {
				return schemas.Pipeline{
					Name:    "demo",
					Source:  "p.yaml",
					Dir:     dir,
					Kind:    schemas.KindBacklog,
					Budget:  &schemas.Budget{MaxCostUSD: 5, MaxIterations: 40},
					Breaker: &schemas.Breaker{NoProgress: 2},
					Backlog: &schemas.Backlog{
						Agents: map[string]schemas.AgentSpec{
							"claude": {Backend: "claude", Model: "sonnet"},
							"helper": {Backend: "exec", Command: []string{filepath.Join(dir, "agent.sh")}},
						},
						Roles: map[string][]string{
							"iterate":   {"claude", "helper"},
							"review":    {"claude"},
							"repair":    {"helper", "claude"},
							"bootstrap": {"claude"},
						},
						Schedule:             schemas.ScheduleOddEven,
						MaxParallel:          2,
						SourceFiles:          []string{"README.md", "docs/spec.md"},
						Project:              "Demo project",
						Prompts:              map[string]string{"iterate": "Work on {{.Task.ID}}\n", "review": "Review it"},
						MaxSummaryIterations: 5,
						TimeoutMs:            1_800_000,
						Validate:             []string{"make", "test"},
						ValidateTimeoutMs:    120_000,
					},
				}
			},
		},
		{
			name: "defaults",
			yaml: minimalBacklog,
			want: func() schemas.Pipeline { return minimalWant(dir) },
		},
		{
			name: "null values are absent",
			yaml: minimalBacklog + "  review:\nproject:\nschedule:\nprompts:\n  iterate:\nsource_files:\nbudget:\n",
			want: func() schemas.Pipeline { return minimalWant(dir) },
		},
		{
			name: "budget.max_iterations alone replaces the default",
			yaml: minimalBacklog + "budget: {max_iterations: 80, max_tokens: 1000}\n",
			want: func() schemas.Pipeline {
				p := minimalWant(dir)
				p.Budget = &schemas.Budget{MaxIterations: 80, MaxTokens: 1000}
				return p
			},
		},
		{
			name: "budget.max_iterations tighter than max_iterations",
			yaml: minimalBacklog + "max_iterations: 30\nbudget: {max_iterations: 20}\n",
			want: func() schemas.Pipeline {
				p := minimalWant(dir)
				p.Budget = &schemas.Budget{MaxIterations: 20}
				return p
			},
		},
		{
			name: "max_iterations above the default",
			yaml: minimalBacklog + "max_iterations: 500\nmax_parallel: 16\nsummary_iterations: 100\n",
			want: func() schemas.Pipeline {
				p := minimalWant(dir)
				p.Budget = &schemas.Budget{MaxIterations: 500}
				p.Backlog.MaxParallel = 16
				p.Backlog.MaxSummaryIterations = 100
				return p
			},
		},
		{
			name: "round-robin over three agents, one given as a list of one",
			yaml: `kind: backlog
name: rr
agents:
  a: &cli {backend: claude}
  b: {<<: *cli, model: opus}
  c: {backend: codex}
roles:
  iterate: [c, a, b]
  review: [b]
schedule: round-robin
`,
			want: func() schemas.Pipeline {
				p := minimalWant(dir)
				p.Name, p.Backlog.Project = "rr", "rr"
				p.Backlog.Agents = map[string]schemas.AgentSpec{
					"a": {Backend: "claude"},
					"b": {Backend: "claude", Model: "opus"},
					"c": {Backend: "codex"},
				}
				p.Backlog.Roles = map[string][]string{"iterate": {"c", "a", "b"}, "review": {"b"}, "repair": {"c"}, "bootstrap": {"c"}}
				p.Backlog.Schedule = schemas.ScheduleRoundRobin
				return p
			},
		},
		{
			name: "round-robin with one agent",
			yaml: minimalBacklog + "schedule: round-robin\n",
			want: func() schemas.Pipeline {
				p := minimalWant(dir)
				p.Backlog.Schedule = schemas.ScheduleRoundRobin
				return p
			},
		},
		{
			name: "absolute source file kept as written",
			yaml: minimalBacklog + "source_files: [" + strconv.Quote(absReadme) + ", docs/../docs/spec.md]\n",
			want: func() schemas.Pipeline {
				p := minimalWant(dir)
				p.Backlog.SourceFiles = []string{absReadme, "docs/../docs/spec.md"}
				return p
			},
		},
		{
			name: "empty source_files",
			yaml: minimalBacklog + "source_files: []\n",
			want: func() schemas.Pipeline { return minimalWant(dir) },
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse("p.yaml", []byte(tt.yaml), dir)
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if want := tt.want(); !reflect.DeepEqual(got, want) {
				t.Errorf("Parse =\n%+v\n%+v\nwant\n%+v\n%+v", got, got.Backlog, want, want.Backlog)
			}
		})
	}
}

// TestParseKindPipeline: a pipeline file parses the same with kind pipeline
// as without kind.
func TestParseKindPipeline(t *testing.T) {
	dir := testDir(t)
	const body = "name: p\nsteps:\n  a: {agent: {backend: exec, command: [echo]}, prompt: go, outputs: [{name: a.txt}]}\n"
	tests := []struct {
		name string
		yaml string
	}{
		{name: "no kind", yaml: body},
		{name: "kind pipeline", yaml: "kind: pipeline\n" + body},
		{name: "kind pipeline last", yaml: body + "kind: pipeline\n"},
		{name: "null kind", yaml: "kind:\n" + body},
	}
	want := schemas.Pipeline{
		Name:   "p",
		Source: "p.yaml",
		Dir:    dir,
		Steps: []schemas.Step{{
			Name:              "a",
			Agent:             schemas.AgentSpec{Backend: "exec", Command: []string{"echo"}},
			Prompt:            "go",
			Outputs:           []schemas.Output{{Name: "a.txt"}},
			MaxIterations:     1,
			TimeoutMs:         600_000,
			ValidateTimeoutMs: 60_000,
			Final:             true,
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse("p.yaml", []byte(tt.yaml), dir)
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			// The step's line depends on where kind is; the rest must not.
			got.Steps[0].Line = 0
			if !reflect.DeepEqual(got, want) {
				t.Errorf("Parse = %+v, want %+v", got, want)
			}
		})
	}
}

func TestParseBacklogErrors(t *testing.T) {
	dir := backlogDir(t)
	const allowed = `(allowed: kind, name, project, agents, roles, schedule, max_iterations, max_parallel, source_files, summary_iterations, timeout, validate, validate_timeout, prompts, budget, breaker, workdir, target, approval, job_dispatch_timeout)`
	tests := []struct {
		name    string
		yaml    string
		wantErr []string // in order, each the prefix of one problem
	}{
		// Kinds and keys.
		{
			name:    "unknown kind",
			yaml:    "kind: workflow\nname: p\nbogus: 1\n",
			wantErr: []string{`p.yaml:1: kind: unknown kind "workflow" (kinds: pipeline, backlog, loops)`},
		},
		{
			name:    "kind not a string",
			yaml:    "kind: [backlog]\nname: p\n",
			wantErr: []string{`p.yaml:1: kind: want a string, got a list`},
		},
		{
			name:    "unknown key",
			yaml:    minimalBacklog + "stepz: {}\n",
			wantErr: []string{`p.yaml:8: stepz: unknown key "stepz" ` + allowed},
		},
		{
			name:    "steps in a backlog",
			yaml:    minimalBacklog + "steps:\n  a: {}\n",
			wantErr: []string{`p.yaml:8: steps: a file of kind backlog has no steps: its tasks come from the task file`},
		},
		{
			name:    "pipeline keys are not backlog keys",
			yaml:    "kind: pipeline\n" + minimalBacklog[len("kind: backlog\n"):],
			wantErr: []string{`p.yaml:1: steps: required`, `p.yaml:3: agents: unknown key "agents" (allowed: name, steps, budget, breaker, kind, job_dispatch_timeout)`, `p.yaml:6: roles: unknown key "roles"`},
		},

		// Name and project.
		{
			name:    "name missing",
			yaml:    strings.Replace(minimalBacklog, "name: demo\n", "", 1),
			wantErr: []string{`p.yaml:1: name: required`},
		},
		{
			name:    "bad name",
			yaml:    strings.Replace(minimalBacklog, "name: demo", "name: my demo", 1),
			wantErr: []string{`p.yaml:2: name: invalid pipeline name "my demo": character ' ' not allowed`},
		},
		{
			name:    "empty project",
			yaml:    minimalBacklog + "project: \" \"\n",
			wantErr: []string{`p.yaml:8: project: must not be empty`},
		},
		{
			name:    "project not a string",
			yaml:    minimalBacklog + "project: {a: b}\n",
			wantErr: []string{`p.yaml:8: project: want a string, got a mapping`},
		},

		// Agents.
		{
			name:    "agents missing",
			yaml:    "kind: backlog\nname: demo\nroles: {iterate: a}\n",
			wantErr: []string{`p.yaml:1: agents: required: a mapping from agent names to agents`},
		},
		{
			name:    "agents empty",
			yaml:    "kind: backlog\nname: demo\nagents: {}\nroles: {iterate: a}\n",
			wantErr: []string{`p.yaml:3: agents: must define at least one agent`},
		},
		{
			name:    "agents a list",
			yaml:    "kind: backlog\nname: demo\nagents: [a]\nroles: {iterate: a}\n",
			wantErr: []string{`p.yaml:3: agents: want a mapping, got a list`},
		},
		{
			name: "bad agent name and agent problems",
			yaml: `kind: backlog
name: demo
agents:
  a.b: {backend: claude}
  c: {backend: exec}
  d: {backend: gemini, cmd: [x]}
  e:
  f: {backend: exec, command: [echo], model: x}
roles:
  iterate: c
`,
			wantErr: []string{
				`p.yaml:4: agents."a.b": invalid agent name "a.b": character '.' not allowed`,
				`p.yaml:5: agents.c.command: required for the exec backend`,
				`p.yaml:6: agents.d.backend: unsupported backend "gemini" (supported: exec, claude, codex, openai, anthropic)`,
				`p.yaml:6: agents.d.cmd: unknown key "cmd" (allowed: backend, command, env, secret_env, model, permission_mode, allowed_tools, args, base_url, api_key_env, tools, max_turns, max_tokens, price, retry_wait, stream)`,
				`p.yaml:7: agents.e: want a mapping with keys backend, command`,
				`p.yaml:8: agents.f.model: not an option of the exec backend`,
			},
		},
		// Roles.
		{
			name:    "roles missing",
			yaml:    "kind: backlog\nname: demo\nagents: {a: {backend: claude}}\n",
			wantErr: []string{`p.yaml:1: roles: required: at least {iterate: AGENT}`},
		},
		{
			name:    "roles a list",
			yaml:    "kind: backlog\nname: demo\nagents: {a: {backend: claude}}\nroles: [a]\n",
			wantErr: []string{`p.yaml:4: roles: want a mapping, got a list`},
		},
		{
			name:    "iterate missing",
			yaml:    "kind: backlog\nname: demo\nagents: {a: {backend: claude}}\nroles:\n  review: a\n",
			wantErr: []string{`p.yaml:4: roles.iterate: required: the agent, or list of agents, that works the tasks`},
		},
		{
			name:    "iterate null",
			yaml:    "kind: backlog\nname: demo\nagents: {a: {backend: claude}}\nroles:\n  iterate:\n",
			wantErr: []string{`p.yaml:4: roles.iterate: required`},
		},
		{
			name:    "unknown role",
			yaml:    minimalBacklog + "  reviewer: a\n",
			wantErr: []string{`p.yaml:8: roles.reviewer: unknown role "reviewer" (allowed: iterate, review, repair, bootstrap)`},
		},
		{
			name: "unknown agents in roles",
			yaml: minimalBacklog + "  review: zed\n  repair: [b, \"y\"]\n",
			wantErr: []string{
				`p.yaml:8: roles.review: unknown agent "zed" (agents: a, b)`,
				`p.yaml:9: roles.repair[1]: unknown agent "y" (agents: a, b)`,
			},
		},
		{
			name: "agent listed twice, empty list, mapping",
			yaml: `kind: backlog
name: demo
agents: {a: {backend: claude}, b: {backend: codex}}
roles:
  iterate: [a, b, a]
  review: []
  repair: {a: 1}
  bootstrap: [[a]]
schedule: round-robin
`,
			wantErr: []string{
				`p.yaml:5: roles.iterate[2]: agent "a" is listed twice`,
				`p.yaml:6: roles.review: must name at least one agent`,
				`p.yaml:7: roles.repair: want an agent name or a list of them, got a mapping`,
				`p.yaml:8: roles.bootstrap[0]: want a string, got a list`,
			},
		},

		// Schedule.
		{
			name:    "unknown schedule",
			yaml:    minimalBacklog + "schedule: fifo\n",
			wantErr: []string{`p.yaml:8: schedule: unknown schedule "fifo" (schedules: single, odd-even, round-robin)`},
		},
		{
			name:    "odd-even with one agent",
			yaml:    minimalBacklog + "schedule: odd-even\n",
			wantErr: []string{`p.yaml:8: schedule: odd-even alternates two iterate agents, but roles.iterate (line 7) lists 1: a`},
		},
		{
			name:    "odd-even with three agents",
			yaml:    strings.Replace(minimalBacklog, "iterate: a", "iterate: [a, b, a2]", 1) + "schedule: odd-even\n",
			wantErr: []string{`p.yaml:7: roles.iterate[2]: unknown agent "a2" (agents: a, b)`, `p.yaml:8: schedule: odd-even alternates two iterate agents, but roles.iterate (line 7) lists 3: a, b, a2`},
		},
		{
			name:    "several iterate agents, default schedule",
			yaml:    strings.Replace(minimalBacklog, "iterate: a", "iterate: [a, b]", 1),
			wantErr: []string{`p.yaml:7: roles.iterate: schedule single runs only the first iterate agent, but roles.iterate lists 2: a, b; set schedule: odd-even or round-robin, or list one agent`},
		},
		{
			name:    "several iterate agents, schedule single",
			yaml:    strings.Replace(minimalBacklog, "iterate: a", "iterate: [a, b]", 1) + "schedule: single\n",
			wantErr: []string{`p.yaml:8: schedule: schedule single runs only the first iterate agent`},
		},

		// Numbers and durations.
		{
			name: "max_iterations, max_parallel, summary_iterations below range",
			yaml: minimalBacklog + "max_iterations: 0\nmax_parallel: 0\nsummary_iterations: -1\n",
			wantErr: []string{
				`p.yaml:8: max_iterations: want an integer > 0, got 0`,
				`p.yaml:9: max_parallel: want an integer from 1 to 16, got 0`,
				`p.yaml:10: summary_iterations: want an integer from 1 to 100, got -1`,
			},
		},
		{
			name: "above range and wrong types",
			yaml: minimalBacklog + "max_iterations: 2147483648\nmax_parallel: 17\nsummary_iterations: \"3\"\nbudget: {max_iterations: 1.5}\n",
			wantErr: []string{
				`p.yaml:8: max_iterations: must be at most 2147483647, got 2147483648`,
				`p.yaml:9: max_parallel: want an integer from 1 to 16, got 17`,
				`p.yaml:10: summary_iterations: want an integer from 1 to 100, got the string "3"`,
				`p.yaml:11: budget.max_iterations: want an integer > 0, got 1.5`,
			},
		},
		{
			name: "durations",
			yaml: minimalBacklog + "timeout: soon\nvalidate_timeout: 0s\n",
			wantErr: []string{
				`p.yaml:8: timeout: invalid duration "soon": want a Go duration such as 30s, 2m or 1h30m`,
				`p.yaml:9: validate_timeout: must be > 0, got "0s"`,
			},
		},
		{
			name:    "validate a string",
			yaml:    minimalBacklog + "validate: make test\n",
			wantErr: []string{`p.yaml:8: validate: want an argv list, not a string`},
		},
		{
			name:    "validate empty",
			yaml:    minimalBacklog + "validate: []\n",
			wantErr: []string{`p.yaml:8: validate: must not be empty`},
		},
		{
			name:    "budget and breaker",
			yaml:    minimalBacklog + "budget: {max_cost: 1}\nbreaker: {no_progress: 0}\n",
			wantErr: []string{`p.yaml:8: budget.max_cost: unknown key "max_cost" (allowed: max_cost_usd, max_tokens, max_iterations)`, `p.yaml:9: breaker.no_progress: want an integer > 0, got 0`},
		},

		// Source files.
		{
			name: "source files missing, not regular, empty",
			yaml: minimalBacklog + "source_files:\n  - docs/nope.md\n  - docs/sub\n  - \"\"\n  - /nonexistent/loopbus/README.md\n",
			wantErr: []string{
				`p.yaml:9: source_files[0]: source file docs/nope.md: no such file or directory`,
				`p.yaml:10: source_files[1]: source file docs/sub: not a regular file`,
				`p.yaml:11: source_files[2]: must not be empty`,
				`p.yaml:12: source_files[3]: source file /nonexistent/loopbus/README.md: no such file or directory`,
			},
		},
		{
			name: "source files with one base name, or a bad one",
			yaml: minimalBacklog + "source_files: [README.md, docs/spec.md, other/README.md, docs/bad name.md]\n",
			wantErr: []string{
				`p.yaml:8: source_files[2]: source file other/README.md has the base name of README.md (line 8); source files are stored as artifacts named by their base names`,
				`p.yaml:8: source_files[3]: source file docs/bad name.md: invalid artifact name "bad name.md": character ' ' not allowed`,
			},
		},
		{
			name:    "source_files a string",
			yaml:    minimalBacklog + "source_files: README.md\n",
			wantErr: []string{`p.yaml:8: source_files: want a list such as [README.md, docs/spec.md], got a string`},
		},

		// Prompts.
		{
			name: "prompts",
			yaml: minimalBacklog + "prompts:\n  iterate: \"  \"\n  reviews: x\n  repair: \"{{.Task\"\n  bootstrap: [x]\n",
			wantErr: []string{
				`p.yaml:9: prompts.iterate: must not be empty`,
				`p.yaml:10: prompts.reviews: unknown role "reviews" (allowed: iterate, review, repair, bootstrap)`,
				`p.yaml:11: prompts.repair: invalid template: template: repair:1: unclosed action`,
				`p.yaml:12: prompts.bootstrap: want a string, got a list`,
			},
		},
		{
			name:    "prompts a list",
			yaml:    minimalBacklog + "prompts: [x]\n",
			wantErr: []string{`p.yaml:8: prompts: want a mapping, got a list`},
		},

		// All at once, in file order.
		{
			name: "several problems",
			yaml: `kind: backlog
name: demo
steps: {}
agents:
  a: {backend: exec, command: [./agent.sh], env: {API_TOKEN: 0123456789abcdef0123}}
roles:
  iterate: [a, b]
schedule: odd-even
max_parallel: 99
`,
			wantErr: []string{
				`p.yaml:3: steps: a file of kind backlog has no steps`,
				`p.yaml:5: agents.a.env.API_TOKEN: values in env travel in events`,
				`p.yaml:7: roles.iterate[1]: unknown agent "b" (agents: a)`,
				`p.yaml:9: max_parallel: want an integer from 1 to 16, got 99`,
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

func TestParseBacklogErrorCauses(t *testing.T) {
	dir := backlogDir(t)
	_, err := Parse("p.yaml", []byte(minimalBacklog+"source_files: [nope.md, docs/bad name.md]\n"), dir)
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("errors.Is(err, fs.ErrNotExist) = false for %v", err)
	}
	if !errors.Is(err, schemas.ErrBadName) {
		t.Errorf("errors.Is(err, schemas.ErrBadName) = false for %v", err)
	}
}

func TestSourcePath(t *testing.T) {
	p := schemas.Pipeline{Dir: "/srv/demo"}
	tests := []struct {
		name string
		src  string
		want string
	}{
		{name: "relative", src: "docs/spec.md", want: "/srv/demo/docs/spec.md"},
		{name: "dot segments", src: "./docs/../README.md", want: "/srv/demo/README.md"},
		{name: "parent", src: "../shared/spec.md", want: "/srv/shared/spec.md"},
		{name: "absolute stays", src: "/etc/spec.md", want: "/etc/spec.md"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := SourcePath(p, tt.src); got != tt.want {
				t.Errorf("SourcePath(%q) = %q, want %q", tt.src, got, tt.want)
			}
		})
	}
}

// TestLoadBacklog: Load resolves the backlog's paths against the file's
// directory, whatever the working directory, and SourcePath finds its
// source files.
func TestLoadBacklog(t *testing.T) {
	dir := backlogDir(t)
	path := filepath.Join(dir, "backlog.yaml")
	writeFiles(t, dir, map[string]string{"backlog.yaml": `kind: backlog
name: demo
agents: {a: {backend: exec, command: [./agent.sh]}}
roles: {iterate: a}
source_files: [docs/spec.md]
validate: [./agent.sh, README.md]
`})
	p, err := Load(path)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if p.Source != path || p.Dir != dir || p.Kind != schemas.KindBacklog || p.Steps != nil {
		t.Errorf("Source, Dir, Kind, Steps = %q, %q, %q, %v; want %q, %q, backlog, nil", p.Source, p.Dir, p.Kind, p.Steps, path, dir)
	}
	if got, want := p.Backlog.Agents["a"].Command, []string{filepath.Join(dir, "agent.sh")}; !reflect.DeepEqual(got, want) {
		t.Errorf("agent command = %q, want %q", got, want)
	}
	if got, want := p.Backlog.Validate, []string{filepath.Join(dir, "agent.sh"), filepath.Join(dir, "README.md")}; !reflect.DeepEqual(got, want) {
		t.Errorf("validate = %q, want %q", got, want)
	}
	if got, want := SourcePath(p, p.Backlog.SourceFiles[0]), filepath.Join(dir, "docs", "spec.md"); got != want {
		t.Errorf("SourcePath = %q, want %q", got, want)
	}
}
