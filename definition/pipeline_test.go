package definition

import (
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/loopbus/loopbus/schemas"
)

const summarySchema = `{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "version": "summary/1",
  "type": "object",
  "required": ["summary"],
  "properties": {"summary": {"type": "string"}}
}
`

// writeFiles creates files (path relative to dir → content) under dir.
func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		path := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// testDir returns a directory holding the agents and schemas the test
// pipelines refer to.
func testDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"agents/summarize.sh":          "#!/bin/sh\n",
		"agents/ideas.sh":              "#!/bin/sh\n",
		"schemas/summary.schema.json":  summarySchema,
		"schemas/plain.schema.json":    `{"type": "object"}`,
		"schemas/broken.json":          `{"type": "object",`,
		"schemas/invalid.schema.json":  `{"type": 12}`,
		"schemas/dir.schema.json/keep": "",
	})
	return dir
}

// checkInvalid asserts err is a validation error in every documented way.
func checkInvalid(t *testing.T, err error) {
	t.Helper()
	if !errors.Is(err, ErrInvalid) {
		t.Errorf("errors.Is(err, ErrInvalid) = false for %v", err)
	}
	var one *Error
	if !errors.As(err, &one) {
		t.Errorf("errors.As(err, *Error) = false for %v", err)
	}
	var all Errors
	if !errors.As(err, &all) || len(all) == 0 {
		t.Errorf("errors.As(err, Errors) = false or empty for %v", err)
	}
	for _, e := range all {
		if e == nil {
			t.Fatalf("nil *Error in %v", err)
		}
		if strings.Contains(e.Error(), "\n") {
			t.Errorf("error spans several lines: %q", e.Error())
		}
	}
}

func TestParseValid(t *testing.T) {
	dir := testDir(t)
	compactSummary := `{"$schema":"https://json-schema.org/draft/2020-12/schema","version":"summary/1","type":"object","required":["summary"],"properties":{"summary":{"type":"string"}}}`
	tests := []struct {
		name string
		yaml string
		want schemas.Pipeline
	}{
		{
			name: "full",
			yaml: `name: writing-kit
steps:
  summary:
    agent: {backend: exec, command: [sh, agents/summarize.sh, --mode, fast], env: {K: V, N: 1}}
    prompt: "Summarize {{.Input.Name}}"
    outputs: [{name: summary.json, schema: schemas/summary.schema.json}]
    max_iterations: 3
    timeout: 2m
  ideas:
    requires: [summary]
    agent: {backend: exec, command: [./agents/ideas.sh, missing.sh, /bin/true]}
    prompt: |
      Ideas from {{range .Artifacts}}{{.Name}} {{end}}
    outputs:
      - name: ideas.json
        schema: schemas/plain.schema.json
    validate: [sh, -c, "grep -q hook \"$LOOPBUS_OUTPUT_DIR/ideas.json\""]
    validate_timeout: 30s
  writing-kit:
    requires: [ideas, summary]
    agent: {backend: exec, command: [sh, agents/ideas.sh]}
    prompt: Write {{.Step}}
    outputs: [{name: kit.md}]
`,
			want: schemas.Pipeline{
				Name:   "writing-kit",
				Source: "p.yaml",
				Dir:    dir,
				Steps: []schemas.Step{
					{
						Name: "summary",
						Agent: schemas.AgentSpec{
							Backend: "exec",
							Command: []string{"sh", filepath.Join(dir, "agents/summarize.sh"), "--mode", "fast"},
							Env:     map[string]string{"K": "V", "N": "1"},
						},
						Prompt: "Summarize {{.Input.Name}}",
						Outputs: []schemas.Output{{
							Name:          "summary.json",
							SchemaPath:    "schemas/summary.schema.json",
							Schema:        json.RawMessage(compactSummary),
							SchemaVersion: "summary/1",
						}},
						MaxIterations:     3,
						TimeoutMs:         120_000,
						ValidateTimeoutMs: 60_000,
						Line:              3,
					},
					{
						Name:     "ideas",
						Requires: []string{"summary"},
						Agent: schemas.AgentSpec{
							Backend: "exec",
							Command: []string{filepath.Join(dir, "agents/ideas.sh"), "missing.sh", "/bin/true"},
						},
						Prompt: "Ideas from {{range .Artifacts}}{{.Name}} {{end}}\n",
						Outputs: []schemas.Output{{
							Name:          "ideas.json",
							SchemaPath:    "schemas/plain.schema.json",
							Schema:        json.RawMessage(`{"type":"object"}`),
							SchemaVersion: schemas.SchemaVersionOf([]byte(`{"type": "object"}`)),
						}},
						Validate:          []string{"sh", "-c", `grep -q hook "$LOOPBUS_OUTPUT_DIR/ideas.json"`},
						MaxIterations:     1,
						TimeoutMs:         600_000,
						ValidateTimeoutMs: 30_000,
						Line:              9,
					},
					{
						Name:     "writing-kit",
						Requires: []string{"ideas", "summary"},
						Agent: schemas.AgentSpec{
							Backend: "exec",
							Command: []string{"sh", filepath.Join(dir, "agents/ideas.sh")},
						},
						Prompt:            "Write {{.Step}}",
						Outputs:           []schemas.Output{{Name: "kit.md"}},
						MaxIterations:     1,
						TimeoutMs:         600_000,
						ValidateTimeoutMs: 60_000,
						Final:             true,
						Line:              19,
					},
				},
			},
		},
		{
			name: "anchors, merge keys, numeric argv and an explicit final with a second sink",
			yaml: `# comment first
name: p
steps:
  a:
    agent: &exec {backend: exec, command: [sleep, 10]}
    prompt: a
    outputs: [{name: a.txt}]
    final: true
  b:
    agent: {<<: *exec, env: {X: "1"}}
    prompt: b
    outputs: [{name: b.txt}]
    final: false
`,
			want: schemas.Pipeline{
				Name:   "p",
				Source: "p.yaml",
				Dir:    dir,
				Steps: []schemas.Step{
					{
						Name:              "a",
						Agent:             schemas.AgentSpec{Backend: "exec", Command: []string{"sleep", "10"}},
						Prompt:            "a",
						Outputs:           []schemas.Output{{Name: "a.txt"}},
						MaxIterations:     1,
						TimeoutMs:         600_000,
						ValidateTimeoutMs: 60_000,
						Final:             true,
						Line:              4,
					},
					{
						Name:              "b",
						Agent:             schemas.AgentSpec{Backend: "exec", Command: []string{"sleep", "10"}, Env: map[string]string{"X": "1"}},
						Prompt:            "b",
						Outputs:           []schemas.Output{{Name: "b.txt"}},
						MaxIterations:     1,
						TimeoutMs:         600_000,
						ValidateTimeoutMs: 60_000,
						Line:              9,
					},
				},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse("p.yaml", []byte(tt.yaml), dir)
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				g, _ := json.MarshalIndent(got, "", "  ")
				w, _ := json.MarshalIndent(tt.want, "", "  ")
				t.Errorf("Parse mismatch\ngot:  %s\nwant: %s", g, w)
			}
		})
	}
}

func TestParseErrors(t *testing.T) {
	dir := testDir(t)
	tests := []struct {
		name    string
		yaml    string
		wantErr string
	}{
		// Unknown keys at each level.
		{
			name: "unknown top-level key",
			yaml: `name: p
stepz: {}
steps:
  a: {agent: {backend: exec, command: [echo]}, prompt: go, outputs: [{name: a.txt}]}
`,
			wantErr: `p.yaml:2: stepz: unknown key "stepz" (allowed: name, steps, budget, breaker, kind, job_dispatch_timeout)`,
		},
		{
			name: "unknown step key",
			yaml: `name: p
steps:
  a:
    agent: {backend: exec, command: [echo]}
    prompt: go
    outputs: [{name: a.txt}]
    retries: 3
`,
			wantErr: `p.yaml:7: steps.a.retries: unknown key "retries" (allowed: requires, agent, prompt, outputs, validate, max_iterations, timeout, validate_timeout, final, breaker, approval)`,
		},
		{
			name: "unknown agent key",
			yaml: `name: p
steps:
  a:
    agent:
      backend: exec
      cmd: [echo]
    prompt: go
    outputs: [{name: a.txt}]
`,
			wantErr: `p.yaml:6: steps.a.agent.cmd: unknown key "cmd" (allowed: backend, command, env, secret_env, model, permission_mode, allowed_tools, args, base_url, api_key_env, tools, max_turns, max_tokens, price, retry_wait, stream)`,
		},
		{
			name: "unknown output key",
			yaml: `name: p
steps:
  a:
    agent: {backend: exec, command: [echo]}
    prompt: go
    outputs:
      - name: a.txt
        format: json
`,
			wantErr: `p.yaml:8: steps.a.outputs[0].format: unknown key "format" (allowed: name, schema)`,
		},

		// Missing fields.
		{
			name: "missing name",
			yaml: `steps:
  a: {agent: {backend: exec, command: [echo]}, prompt: go, outputs: [{name: a.txt}]}
`,
			wantErr: `p.yaml:1: name: required`,
		},
		{
			name: "bad pipeline name",
			yaml: `name: my pipeline
steps:
  a: {agent: {backend: exec, command: [echo]}, prompt: go, outputs: [{name: a.txt}]}
`,
			wantErr: `p.yaml:1: name: invalid pipeline name "my pipeline": character ' ' not allowed`,
		},
		{
			name:    "missing steps",
			yaml:    "name: p\n",
			wantErr: `p.yaml:1: steps: required`,
		},
		{
			name:    "empty steps",
			yaml:    "name: p\nsteps: {}\n",
			wantErr: `p.yaml:2: steps: must define at least one step`,
		},
		{
			name: "steps not a mapping",
			yaml: `name: p
steps: [a, b]
`,
			wantErr: `p.yaml:2: steps: want a mapping, got a list`,
		},
		{
			name: "bad step name",
			yaml: `name: p
steps:
  a.b: {agent: {backend: exec, command: [echo]}, prompt: go, outputs: [{name: a.txt}]}
`,
			wantErr: `p.yaml:3: steps."a.b": invalid step name "a.b"`,
		},
		{
			name: "step is null",
			yaml: `name: p
steps:
  a:
`,
			wantErr: `p.yaml:3: steps.a: want a mapping with keys requires, agent`,
		},
		{
			name: "missing agent",
			yaml: `name: p
steps:
  a:
    prompt: go
    outputs: [{name: a.txt}]
`,
			wantErr: `p.yaml:3: steps.a.agent: required`,
		},
		{
			name: "missing backend",
			yaml: `name: p
steps:
  a:
    agent: {command: [echo]}
    prompt: go
    outputs: [{name: a.txt}]
`,
			wantErr: `p.yaml:4: steps.a.agent.backend: required (supported: exec, claude, codex, openai, anthropic)`,
		},
		{
			name: "unsupported backend",
			yaml: `name: p
steps:
  a:
    agent: {backend: gemini, command: [echo]}
    prompt: go
    outputs: [{name: a.txt}]
`,
			wantErr: `p.yaml:4: steps.a.agent.backend: unsupported backend "gemini" (supported: exec, claude, codex, openai, anthropic)`,
		},
		{
			name: "claude option on the exec backend",
			yaml: `name: p
steps:
  a:
    agent: {backend: exec, command: [echo], model: sonnet}
    prompt: go
    outputs: [{name: a.txt}]
`,
			wantErr: `p.yaml:4: steps.a.agent.model: not an option of the exec backend (only of claude, codex, openai and anthropic)`,
		},
		{
			name: "claude-only option on codex",
			yaml: `name: p
steps:
  a:
    agent:
      backend: codex
      allowed_tools: [Bash]
    prompt: go
    outputs: [{name: a.txt}]
`,
			wantErr: `p.yaml:6: steps.a.agent.allowed_tools: not an option of the codex backend (only of claude)`,
		},
		{
			name: "missing command",
			yaml: `name: p
steps:
  a:
    agent: {backend: exec}
    prompt: go
    outputs: [{name: a.txt}]
`,
			wantErr: `p.yaml:4: steps.a.agent.command: required for the exec backend`,
		},
		{
			name: "empty command",
			yaml: `name: p
steps:
  a:
    agent: {backend: exec, command: []}
    prompt: go
    outputs: [{name: a.txt}]
`,
			wantErr: `p.yaml:4: steps.a.agent.command: must not be empty`,
		},
		{
			name: "command element not a string",
			yaml: `name: p
steps:
  a:
    agent:
      backend: exec
      command:
        - echo
        - {x: 1}
    prompt: go
    outputs: [{name: a.txt}]
`,
			wantErr: `p.yaml:8: steps.a.agent.command[1]: want a string, got a mapping`,
		},
		{
			name: "command as string",
			yaml: `name: p
steps:
  a:
    agent: {backend: exec, command: "echo hi"}
    prompt: go
    outputs: [{name: a.txt}]
`,
			wantErr: `p.yaml:4: steps.a.agent.command: want an argv list, not a string: write [sh, -c, "..."]`,
		},
		{
			name: "bad env name",
			yaml: `name: p
steps:
  a:
    agent: {backend: exec, command: [echo], env: {"A=B": x}}
    prompt: go
    outputs: [{name: a.txt}]
`,
			wantErr: `p.yaml:4: steps.a.agent.env."A=B": invalid environment variable name "A=B"`,
		},
		{
			name: "missing prompt",
			yaml: `name: p
steps:
  a:
    agent: {backend: exec, command: [echo]}
    outputs: [{name: a.txt}]
`,
			wantErr: `p.yaml:3: steps.a.prompt: required`,
		},
		{
			name: "empty prompt",
			yaml: `name: p
steps:
  a:
    agent: {backend: exec, command: [echo]}
    prompt: "  "
    outputs: [{name: a.txt}]
`,
			wantErr: `p.yaml:5: steps.a.prompt: must not be empty`,
		},
		{
			name: "bad template",
			yaml: `name: p
steps:
  a:
    agent: {backend: exec, command: [echo]}
    prompt: "Summarize {{.Input.Name"
    outputs: [{name: a.txt}]
`,
			wantErr: `p.yaml:5: steps.a.prompt: invalid template: template: a:1: unclosed action`,
		},
		{
			name: "missing outputs",
			yaml: `name: p
steps:
  a:
    agent: {backend: exec, command: [echo]}
    prompt: go
`,
			wantErr: `p.yaml:3: steps.a.outputs: required`,
		},
		{
			name: "empty outputs",
			yaml: `name: p
steps:
  a:
    agent: {backend: exec, command: [echo]}
    prompt: go
    outputs: []
`,
			wantErr: `p.yaml:6: steps.a.outputs: must list at least one output`,
		},
		{
			name: "output without name",
			yaml: `name: p
steps:
  a:
    agent: {backend: exec, command: [echo]}
    prompt: go
    outputs:
      - schema: schemas/plain.schema.json
`,
			wantErr: `p.yaml:7: steps.a.outputs[0].name: required`,
		},

		// Unsafe output names.
		{
			name: "output name with ..",
			yaml: `name: p
steps:
  a:
    agent: {backend: exec, command: [echo]}
    prompt: go
    outputs: [{name: ../x}]
`,
			wantErr: `p.yaml:6: steps.a.outputs[0].name: invalid artifact name "../x": must be a file name, not a path`,
		},
		{
			name: "absolute output name",
			yaml: `name: p
steps:
  a:
    agent: {backend: exec, command: [echo]}
    prompt: go
    outputs: [{name: /etc/passwd}]
`,
			wantErr: `p.yaml:6: steps.a.outputs[0].name: invalid artifact name "/etc/passwd": must be a file name, not a path`,
		},
		{
			name: "output name with separator",
			yaml: `name: p
steps:
  a:
    agent: {backend: exec, command: [echo]}
    prompt: go
    outputs: [{name: a/b}]
`,
			wantErr: `p.yaml:6: steps.a.outputs[0].name: invalid artifact name "a/b": must be a file name, not a path`,
		},
		{
			name: "output name ..",
			yaml: `name: p
steps:
  a:
    agent: {backend: exec, command: [echo]}
    prompt: go
    outputs: [{name: ".."}]
`,
			wantErr: `p.yaml:6: steps.a.outputs[0].name: invalid artifact name "..": must not be . or ..`,
		},

		// Output names across the pipeline.
		{
			name: "duplicate output across steps",
			yaml: `name: p
steps:
  a: {agent: {backend: exec, command: [echo]}, prompt: go, outputs: [{name: out.json}]}
  b:
    requires: [a]
    agent: {backend: exec, command: [echo]}
    prompt: go
    outputs: [{name: out.json}]
`,
			wantErr: `p.yaml:8: steps.b.outputs[0].name: output "out.json" of step "b" is also produced by step "a" (line 3)`,
		},
		{
			name: "duplicate output in one step",
			yaml: `name: p
steps:
  a:
    agent: {backend: exec, command: [echo]}
    prompt: go
    outputs:
      - name: out.json
      - name: out.json
`,
			wantErr: `p.yaml:8: steps.a.outputs[1].name: output "out.json" is listed twice in step "a"`,
		},

		// Dependencies.
		{
			name: "unknown requires",
			yaml: `name: p
steps:
  a: {agent: {backend: exec, command: [echo]}, prompt: go, outputs: [{name: a.txt}]}
  b:
    requires: [a, summary]
    agent: {backend: exec, command: [echo]}
    prompt: go
    outputs: [{name: b.txt}]
`,
			wantErr: `p.yaml:5: steps.b.requires[1]: unknown step "summary" (steps: a, b)`,
		},
		{
			name: "requires as string",
			yaml: `name: p
steps:
  a:
    requires: b
    agent: {backend: exec, command: [echo]}
    prompt: go
    outputs: [{name: a.txt}]
  b: {agent: {backend: exec, command: [echo]}, prompt: go, outputs: [{name: b.txt}]}
`,
			wantErr: `p.yaml:4: steps.a.requires: want a list such as [step-a, step-b], got a string`,
		},
		{
			name: "requires twice",
			yaml: `name: p
steps:
  a: {agent: {backend: exec, command: [echo]}, prompt: go, outputs: [{name: a.txt}]}
  b:
    requires: [a, a]
    agent: {backend: exec, command: [echo]}
    prompt: go
    outputs: [{name: b.txt}]
`,
			wantErr: `p.yaml:5: steps.b.requires[1]: step "a" is listed twice`,
		},
		{
			name: "self cycle",
			yaml: `name: p
steps:
  a:
    requires: [a]
    agent: {backend: exec, command: [echo]}
    prompt: go
    outputs: [{name: a.txt}]
`,
			wantErr: `p.yaml:4: steps.a.requires[0]: dependency cycle: a -> a`,
		},
		{
			name: "three-cycle entered from outside",
			yaml: `name: p
steps:
  x:
    requires: [b]
    agent: {backend: exec, command: [echo]}
    prompt: go
    outputs: [{name: x.txt}]
  a:
    requires: [b]
    agent: {backend: exec, command: [echo]}
    prompt: go
    outputs: [{name: a.txt}]
  b:
    requires: [c]
    agent: {backend: exec, command: [echo]}
    prompt: go
    outputs: [{name: b.txt}]
  c:
    requires: [x, a]
    agent: {backend: exec, command: [echo]}
    prompt: go
    outputs: [{name: c.txt}]
`,
			wantErr: `p.yaml:4: steps.x.requires[0]: dependency cycle: x -> b -> c -> x`,
		},
		{
			name: "three-cycle path",
			yaml: `name: p
steps:
  a:
    requires: [b]
    agent: {backend: exec, command: [echo]}
    prompt: go
    outputs: [{name: a.txt}]
  b:
    requires: [c]
    agent: {backend: exec, command: [echo]}
    prompt: go
    outputs: [{name: b.txt}]
  c:
    requires: [a]
    agent: {backend: exec, command: [echo]}
    prompt: go
    outputs: [{name: c.txt}]
`,
			wantErr: `p.yaml:4: steps.a.requires[0]: dependency cycle: a -> b -> c -> a`,
		},

		// Durations and iterations.
		{
			name: "bad duration",
			yaml: `name: p
steps:
  a:
    agent: {backend: exec, command: [echo]}
    prompt: go
    outputs: [{name: a.txt}]
    timeout: soon
`,
			wantErr: `p.yaml:7: steps.a.timeout: invalid duration "soon"`,
		},
		{
			name: "duration without unit",
			yaml: `name: p
steps:
  a:
    agent: {backend: exec, command: [echo]}
    prompt: go
    outputs: [{name: a.txt}]
    validate: [echo]
    validate_timeout: 30
`,
			wantErr: `p.yaml:8: steps.a.validate_timeout: invalid duration "30"`,
		},
		{
			name: "zero duration",
			yaml: `name: p
steps:
  a:
    agent: {backend: exec, command: [echo]}
    prompt: go
    outputs: [{name: a.txt}]
    timeout: 0s
`,
			wantErr: `p.yaml:7: steps.a.timeout: must be > 0, got "0s"`,
		},
		{
			name: "negative duration",
			yaml: `name: p
steps:
  a:
    agent: {backend: exec, command: [echo]}
    prompt: go
    outputs: [{name: a.txt}]
    validate_timeout: -1m
`,
			wantErr: `p.yaml:7: steps.a.validate_timeout: must be > 0, got "-1m"`,
		},
		{
			name: "sub-millisecond duration",
			yaml: `name: p
steps:
  a:
    agent: {backend: exec, command: [echo]}
    prompt: go
    outputs: [{name: a.txt}]
    timeout: 10us
`,
			wantErr: `p.yaml:7: steps.a.timeout: must be at least 1ms, got "10us"`,
		},
		{
			name: "zero max_iterations",
			yaml: `name: p
steps:
  a:
    agent: {backend: exec, command: [echo]}
    prompt: go
    outputs: [{name: a.txt}]
    max_iterations: 0
`,
			wantErr: `p.yaml:7: steps.a.max_iterations: want an integer from 1 to 100, got "0"`,
		},
		{
			name: "too many max_iterations",
			yaml: `name: p
steps:
  a:
    agent: {backend: exec, command: [echo]}
    prompt: go
    outputs: [{name: a.txt}]
    max_iterations: 101
`,
			wantErr: `p.yaml:7: steps.a.max_iterations: want an integer from 1 to 100, got "101"`,
		},
		{
			name: "non-integer max_iterations",
			yaml: `name: p
steps:
  a:
    agent: {backend: exec, command: [echo]}
    prompt: go
    outputs: [{name: a.txt}]
    max_iterations: 2.5
`,
			wantErr: `p.yaml:7: steps.a.max_iterations: want an integer from 1 to 100, got "2.5"`,
		},
		{
			name: "string max_iterations",
			yaml: `name: p
steps:
  a:
    agent: {backend: exec, command: [echo]}
    prompt: go
    outputs: [{name: a.txt}]
    max_iterations: three
`,
			wantErr: `p.yaml:7: steps.a.max_iterations: want an integer from 1 to 100, got "three"`,
		},

		// Final.
		{
			name: "final not a boolean",
			yaml: `name: p
steps:
  a:
    agent: {backend: exec, command: [echo]}
    prompt: go
    outputs: [{name: a.txt}]
    final: "yes"
`,
			wantErr: `p.yaml:7: steps.a.final: want true or false, got a string`,
		},
		{
			name: "two finals",
			yaml: `name: p
steps:
  a:
    agent: {backend: exec, command: [echo]}
    prompt: go
    outputs: [{name: a.txt}]
    final: true
  b:
    agent: {backend: exec, command: [echo]}
    prompt: go
    outputs: [{name: b.txt}]
    final: true
`,
			wantErr: `p.yaml:12: steps.b.final: only one step may be final; step "a" (line 7) is already final`,
		},
		{
			name: "ambiguous sinks",
			yaml: `name: p
steps:
  a: {agent: {backend: exec, command: [echo]}, prompt: go, outputs: [{name: a.txt}]}
  b: {requires: [a], agent: {backend: exec, command: [echo]}, prompt: go, outputs: [{name: b.txt}]}
  c: {requires: [a], agent: {backend: exec, command: [echo]}, prompt: go, outputs: [{name: c.txt}]}
`,
			wantErr: `p.yaml:2: steps: cannot tell which step is final: b, c are required by no other step; mark one with final: true`,
		},

		// Schemas.
		{
			name: "missing schema file",
			yaml: `name: p
steps:
  a:
    agent: {backend: exec, command: [echo]}
    prompt: go
    outputs:
      - name: a.json
        schema: schemas/nope.json
`,
			wantErr: `p.yaml:8: steps.a.outputs[0].schema: schema file schemas/nope.json: stat `,
		},
		{
			name: "schema not JSON",
			yaml: `name: p
steps:
  a:
    agent: {backend: exec, command: [echo]}
    prompt: go
    outputs:
      - name: a.json
        schema: schemas/broken.json
`,
			wantErr: `p.yaml:8: steps.a.outputs[0].schema: schema file schemas/broken.json is not valid JSON`,
		},
		{
			name: "schema does not compile",
			yaml: `name: p
steps:
  a:
    agent: {backend: exec, command: [echo]}
    prompt: go
    outputs:
      - name: a.json
        schema: schemas/invalid.schema.json
`,
			wantErr: `p.yaml:8: steps.a.outputs[0].schema: invalid JSON Schema schemas/invalid.schema.json: `,
		},
		{
			name: "schema is a directory",
			yaml: `name: p
steps:
  a:
    agent: {backend: exec, command: [echo]}
    prompt: go
    outputs: [{name: a.json, schema: schemas/dir.schema.json}]
`,
			wantErr: `p.yaml:6: steps.a.outputs[0].schema: schema file schemas/dir.schema.json: not a regular file`,
		},

		// Validate.
		{
			name: "validate as string",
			yaml: `name: p
steps:
  a:
    agent: {backend: exec, command: [echo]}
    prompt: go
    outputs: [{name: a.txt}]
    validate: grep -q x a.txt
`,
			wantErr: `p.yaml:7: steps.a.validate: want an argv list, not a string: write [sh, -c, "..."] to run a shell command`,
		},
		{
			name: "validate empty",
			yaml: `name: p
steps:
  a:
    agent: {backend: exec, command: [echo]}
    prompt: go
    outputs: [{name: a.txt}]
    validate: []
`,
			wantErr: `p.yaml:7: steps.a.validate: must not be empty`,
		},

		// The document itself.
		{
			name: "YAML syntax error",
			yaml: `name: p
steps:
  a: {agent: [echo
`,
			wantErr: `p.yaml:3: YAML syntax error: `,
		},
		{
			name: "duplicate key",
			yaml: `name: p
name: q
`,
			wantErr: `p.yaml:2: YAML syntax error: mapping key "name" already defined`,
		},
		{
			name:    "empty file",
			yaml:    "# nothing\n",
			wantErr: `p.yaml: file is empty`,
		},
		{
			name:    "not a mapping",
			yaml:    "- a\n- b\n",
			wantErr: `p.yaml:1: want a mapping with keys name, steps, budget, breaker, kind, job_dispatch_timeout, got a list`,
		},
		{
			name: "two documents",
			yaml: `name: p
---
name: q
`,
			wantErr: `p.yaml:3: only one YAML document is allowed`,
		},
		{
			name: "unknown alias",
			yaml: `name: p
steps:
  a: {agent: *agent, prompt: go, outputs: [{name: a.txt}]}
`,
			wantErr: `p.yaml:3: YAML alias *agent refers to no preceding anchor &agent`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse("p.yaml", []byte(tt.yaml), dir)
			if err == nil {
				t.Fatalf("Parse succeeded, want error containing %q", tt.wantErr)
			}
			t.Log(err)
			checkInvalid(t, err)
			if !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("Parse error:\n%v\nwant it to contain:\n%s", err, tt.wantErr)
			}
		})
	}
}

func TestParseReportsAllErrorsInOrder(t *testing.T) {
	dir := testDir(t)
	yaml := `name: p
steps:
  a:
    agent: {backend: exec, command: [echo]}
    prompt: go
    outputs: [{name: ../a}]
    timeout: 0s
  b:
    requires: [zzz]
    agent: {backend: ssh, command: [echo]}
    outputs: [{name: b.txt}]
`
	_, err := Parse("p.yaml", []byte(yaml), dir)
	checkInvalid(t, err)
	var errs Errors
	if !errors.As(err, &errs) {
		t.Fatalf("error %T is not Errors", err)
	}
	want := []string{
		`p.yaml:6: steps.a.outputs[0].name: invalid artifact name "../a"`,
		`p.yaml:7: steps.a.timeout: must be > 0`,
		`p.yaml:8: steps.b.prompt: required`,
		`p.yaml:9: steps.b.requires[0]: unknown step "zzz"`,
		`p.yaml:10: steps.b.agent.backend: unsupported backend "ssh"`,
	}
	if len(errs) != len(want) {
		t.Fatalf("got %d errors, want %d:\n%v", len(errs), len(want), err)
	}
	for i, w := range want {
		if !strings.HasPrefix(errs[i].Error(), w) {
			t.Errorf("error %d = %q, want prefix %q", i, errs[i].Error(), w)
		}
	}
	if lines := strings.Split(err.Error(), "\n"); len(lines) != len(want) {
		t.Errorf("Error() has %d lines, want %d", len(lines), len(want))
	}
	var first *Error
	if !errors.As(err, &first) || first != errs[0] {
		t.Errorf("errors.As(*Error) = %v, want the first error", first)
	}
}

func TestParseErrorCauses(t *testing.T) {
	dir := testDir(t)
	yaml := `name: p
steps:
  a:
    agent: {backend: exec, command: [echo]}
    prompt: go
    outputs: [{name: ../a}, {name: b.json, schema: missing.json}]
`
	_, err := Parse("p.yaml", []byte(yaml), dir)
	if !errors.Is(err, schemas.ErrBadName) {
		t.Errorf("errors.Is(err, schemas.ErrBadName) = false for %v", err)
	}
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("errors.Is(err, fs.ErrNotExist) = false for %v", err)
	}
}

func TestLoad(t *testing.T) {
	dir := testDir(t)
	path := filepath.Join(dir, "pipeline.yaml")
	writeFiles(t, dir, map[string]string{"pipeline.yaml": `name: p
steps:
  a: {agent: {backend: exec, command: [agents/summarize.sh]}, prompt: go, outputs: [{name: a.txt}]}
`})
	p, err := Load(path)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if p.Source != path || p.Dir != dir {
		t.Errorf("Source, Dir = %q, %q; want %q, %q", p.Source, p.Dir, path, dir)
	}
	if got, want := p.Steps[0].Agent.Command[0], filepath.Join(dir, "agents/summarize.sh"); got != want {
		t.Errorf("command[0] = %q, want %q", got, want)
	}
	if !p.Steps[0].Final {
		t.Errorf("only step is not final")
	}

	_, err = Load(filepath.Join(dir, "missing.yaml"))
	if err == nil || errors.Is(err, ErrInvalid) || !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Load(missing) = %v, want a not-exist error that is not ErrInvalid", err)
	}
}

func TestErrorFormat(t *testing.T) {
	tests := []struct {
		name string
		err  *Error
		want string
	}{
		{"full", &Error{File: "p.yaml", Line: 3, Column: 5, Field: "steps.a", Msg: "bad"}, "p.yaml:3: steps.a: bad"},
		{"no line", &Error{File: "p.yaml", Field: "steps", Msg: "bad"}, "p.yaml: steps: bad"},
		{"no field", &Error{File: "p.yaml", Line: 2, Msg: "bad"}, "p.yaml:2: bad"},
		{"no file", &Error{Line: 2, Field: "name", Msg: "bad"}, "line 2: name: bad"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.err.Error(); got != tt.want {
				t.Errorf("Error() = %q, want %q", got, tt.want)
			}
			if !errors.Is(tt.err, ErrInvalid) {
				t.Errorf("errors.Is(ErrInvalid) = false")
			}
		})
	}
}

func FuzzParse(f *testing.F) {
	dir := f.TempDir()
	for _, seed := range []string{
		`name: p
steps:
  a: {agent: {backend: exec, command: [sh, a.sh]}, prompt: "{{.Input.Name}}", outputs: [{name: a.txt}]}
  b:
    requires: [a]
    agent: &x {backend: exec, command: [echo, 1]}
    prompt: |
      go
    outputs: [{name: b.txt, schema: s.json}]
    validate: [sh, -c, "true"]
    timeout: 1m
    max_iterations: 2
    final: true
`,
		"name: p\nsteps: {a: {requires: [a]}}\n",
		"a: &a {<<: *a}\nb: *a\n",
		"steps:\n  a: [1, b\n",
		"---\n...\n",
		"name: p\nsteps:\n  a:\n    agent: {<<: [*q]}\n",
		"name: p\nbudget: {max_cost_usd: 0.5, max_tokens: 9223372036854775808, max_iterations: .inf}\nbreaker: {no_progress: 1}\nsteps:\n  a: {breaker: {identical_failures: -1}}\n",
		"kind: backlog\nname: b\nagents: {a: &a {backend: claude}, b: *a}\nroles: {iterate: [a, b], review: b}\nschedule: odd-even\nmax_parallel: 2\nsource_files: [s.json, /]\nprompts: {iterate: \"{{.Task.ID}}\"}\nsteps: {}\n",
		"kind: [x]\n",
		"name: p\nsteps:\n  a:\n    agent: {backend: openai, model: m, base_url: \"http://[::1]:8000/v1\", api_key_env: K, tools: [run, run], max_turns: 1000, max_tokens: 0, price: {input_per_mtok: .nan, output_per_mtok: 1e400}, retry_wait: 1h0m0.001s, stream: false}\n    prompt: go\n    outputs: [{name: a.txt}]\n",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		_, err := Parse("fuzz.yaml", data, dir)
		if err == nil {
			return
		}
		checkInvalid(t, err)
	})
}
