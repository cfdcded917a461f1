package definition

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/loopbus/loopbus/schemas"
)

// TestParseAgentCLIs: the claude and codex backends with their options;
// command is optional for them (it overrides the program).
func TestParseAgentCLIs(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		agent string
		want  schemas.AgentSpec
	}{
		{
			name:  "claude with every option",
			agent: `{backend: claude, model: sonnet, permission_mode: acceptEdits, allowed_tools: [Bash, Edit], args: [--max-turns, "5"]}`,
			want:  schemas.AgentSpec{Backend: "claude", Model: "sonnet", PermissionMode: "acceptEdits", AllowedTools: []string{"Bash", "Edit"}, Args: []string{"--max-turns", "5"}},
		},
		{
			name:  "codex with a model and another program",
			agent: `{backend: codex, command: [/opt/codex/bin/codex], model: gpt-5-codex, args: [-c, model_reasoning_effort=high]}`,
			want:  schemas.AgentSpec{Backend: "codex", Command: []string{"/opt/codex/bin/codex"}, Model: "gpt-5-codex", Args: []string{"-c", "model_reasoning_effort=high"}},
		},
		{
			name:  "claude alone",
			agent: `{backend: claude}`,
			want:  schemas.AgentSpec{Backend: "claude"},
		},
		{
			name:  "openai alone: the worker's environment names the model",
			agent: `{backend: openai}`,
			want:  schemas.AgentSpec{Backend: "openai"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p, err := Parse("p.yaml", []byte("name: p\nsteps:\n  a:\n    agent: "+tt.agent+"\n    prompt: go\n    outputs: [{name: a.txt}]\n"), t.TempDir())
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if got := p.Steps[0].Agent; !reflect.DeepEqual(got, tt.want) {
				t.Errorf("agent %+v, want %+v", got, tt.want)
			}
		})
	}
}

// apiAgentFile returns a pipeline whose one step's agent is a block
// mapping with the given lines (each "key: value\n"): the agent key is on
// line 6, the first of lines on line 7.
func apiAgentFile(lines string) string {
	var b strings.Builder
	b.WriteString("name: p\nsteps:\n  a:\n    prompt: go\n    outputs: [{name: a.txt}]\n    agent:\n")
	for line := range strings.Lines(lines) {
		b.WriteString("      " + line)
	}
	return b.String()
}

// problems returns err's problems one per element, checking that err is a
// validation error.
func problems(t *testing.T, err error) []string {
	t.Helper()
	if err == nil {
		return nil
	}
	checkInvalid(t, err)
	var errs Errors
	if !errors.As(err, &errs) {
		t.Fatalf("error %T is not Errors", err)
	}
	out := make([]string, len(errs))
	for i, e := range errs {
		out[i] = e.Error()
	}
	return out
}

// TestParseAgentModelAPI: the openai and anthropic backends with their
// options.
func TestParseAgentModelAPI(t *testing.T) {
	t.Parallel()
	f := func(v float64) *float64 { return &v }
	tests := []struct {
		name  string
		agent string
		want  schemas.AgentSpec
	}{
		{
			name:  "openai alone",
			agent: `{backend: openai, model: gpt-4.1-mini}`,
			want:  schemas.AgentSpec{Backend: "openai", Model: "gpt-4.1-mini"},
		},
		{
			name: "openai with every option",
			agent: `{backend: openai, model: gpt-4.1-mini, base_url: "http://127.0.0.1:8000/v1", api_key_env: LOCAL_KEY,
                tools: [read_file, list_files, run], max_turns: 40, max_tokens: 8192,
                price: {input_per_mtok: 0.40, output_per_mtok: 1.60, cached_input_per_mtok: 0.1},
                retry_wait: 30s, stream: false, env: {MODE: fast}, secret_env: [LOCAL_KEY]}`,
			want: schemas.AgentSpec{
				Backend: "openai", Model: "gpt-4.1-mini", BaseURL: "http://127.0.0.1:8000/v1", APIKeyEnv: "LOCAL_KEY",
				Tools: []string{"read_file", "list_files", "run"}, MaxTurns: 40, MaxTokens: 8192,
				Price:       &schemas.Price{InputPerMTok: 0.4, OutputPerMTok: 1.6, CachedInputPerMTok: f(0.1)},
				RetryWaitMs: 30_000, NoStream: true, Env: map[string]string{"MODE": "fast"}, SecretEnv: []string{"LOCAL_KEY"},
			},
		},
		{
			name: "anthropic at the limits",
			agent: `{backend: anthropic, model: claude-sonnet-4-5, base_url: "https://[::1]:8443",
                tools: [read_file, write_file, edit_file, list_files, run], max_turns: 1000, max_tokens: 1000000,
                price: {input_per_mtok: 3, output_per_mtok: 15}, retry_wait: 1h, stream: true}`,
			want: schemas.AgentSpec{
				Backend: "anthropic", Model: "claude-sonnet-4-5", BaseURL: "https://[::1]:8443",
				Tools:    []string{"read_file", "write_file", "edit_file", "list_files", "run"},
				MaxTurns: 1000, MaxTokens: 1_000_000, Price: &schemas.Price{InputPerMTok: 3, OutputPerMTok: 15}, RetryWaitMs: 3_600_000,
			},
		},
		{
			name:  "anthropic with small bounds and free tokens",
			agent: `{backend: anthropic, model: m, max_turns: 1, max_tokens: 1, retry_wait: 1m30s, price: {input_per_mtok: 0, output_per_mtok: 0.0, cached_input_per_mtok: 0}}`,
			want: schemas.AgentSpec{
				Backend: "anthropic", Model: "m", MaxTurns: 1, MaxTokens: 1, RetryWaitMs: 90_000,
				Price: &schemas.Price{CachedInputPerMTok: f(0)},
			},
		},
		{
			name:  "null options are left out",
			agent: `{backend: openai, model: m, tools: null, price: ~, stream: null}`,
			want:  schemas.AgentSpec{Backend: "openai", Model: "m"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p, err := Parse("p.yaml", []byte("name: p\nsteps:\n  a:\n    agent: "+tt.agent+"\n    prompt: go\n    outputs: [{name: a.txt}]\n"), t.TempDir())
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if got := p.Steps[0].Agent; !reflect.DeepEqual(got, tt.want) {
				g, _ := json.Marshal(got)
				w, _ := json.Marshal(tt.want)
				t.Errorf("agent %s, want %s", g, w)
			}
		})
	}
}

// TestParseAgentModelAPIErrors: every bad value of the model-API options
// is reported with file, line and field, and nothing else is.
func TestParseAgentModelAPIErrors(t *testing.T) {
	t.Parallel()
	const (
		openai = "backend: openai\nmodel: m\n" // lines 7-8; options from line 9
		f      = "p.yaml:9: steps.a.agent."
	)
	tests := []struct {
		name  string
		lines string
		want  []string
	}{
		// model
		{"model empty", "backend: anthropic\nmodel: \"\"\n", []string{`p.yaml:8: steps.a.agent.model: must not be empty: name the model to call, or omit model for the worker's $ANTHROPIC_MODEL`}},
		{"model a list", "backend: openai\nmodel: [a]\n", []string{`p.yaml:8: steps.a.agent.model: want a string, got a list`}},

		// base_url
		{"base_url empty", openai + "base_url: \"\"\n", []string{f + `base_url: must not be empty: omit base_url for the backend's default`}},
		{"base_url ftp", openai + "base_url: ftp://example.com/v1\n", []string{f + `base_url: want an http or https URL such as http://127.0.0.1:8000/v1, got "ftp://example.com/v1"`}},
		{"base_url without scheme", openai + "base_url: 127.0.0.1:8000/v1\n", []string{f + `base_url: want an http or https URL such as http://127.0.0.1:8000/v1, got "127.0.0.1:8000/v1"`}},
		{"base_url host only", openai + "base_url: localhost:8000\n", []string{f + `base_url: want an http or https URL such as http://127.0.0.1:8000/v1, got "localhost:8000"`}},
		{"base_url without host", openai + "base_url: http:///v1\n", []string{f + `base_url: want an http or https URL such as http://127.0.0.1:8000/v1, got "http:///v1"`}},
		{"base_url with an upper-case scheme", openai + "base_url: HTTPS://example.com/v1\n", []string{f + `base_url: want an http or https URL such as http://127.0.0.1:8000/v1, got "HTTPS://example.com/v1"`}},
		{"base_url with a port only", openai + "base_url: http://:8000/v1\n", []string{f + `base_url: want an http or https URL such as http://127.0.0.1:8000/v1, got "http://:8000/v1"`}},
		{"base_url unparsable", openai + "base_url: \"http://[::1\"\n", []string{f + `base_url: want an http or https URL such as http://127.0.0.1:8000/v1, got "http://[::1"`}},
		{"base_url with credentials", openai + "base_url: https://me:sk-123@example.com/v1\n", []string{f + `base_url: must not hold credentials: the URL travels in events; put the key in the worker's environment and name it in api_key_env`}},
		{"base_url a mapping", openai + "base_url: {host: x}\n", []string{f + `base_url: want a string, got a mapping`}},

		// api_key_env
		{"api_key_env with a digit first", openai + "api_key_env: 1KEY\n", []string{f + `api_key_env: invalid secret variable name "1KEY": want letters, digits and _, not starting with a digit`}},
		{"api_key_env with a dash", openai + "api_key_env: MY-KEY\n", []string{f + `api_key_env: invalid secret variable name "MY-KEY": want letters, digits and _, not starting with a digit`}},
		{"api_key_env empty", openai + "api_key_env: \"\"\n", []string{f + `api_key_env: invalid secret variable name: must not be empty`}},
		{"api_key_env of loopbus", openai + "api_key_env: LOOPBUS_KEY\n", []string{f + `api_key_env: invalid secret variable name "LOOPBUS_KEY": LOOPBUS_* variables are loopbus's own and never passed to agents`}},

		// tools
		{"tools empty", openai + "tools: []\n", []string{f + `tools: must not be empty: omit tools for all of them (read_file, write_file, edit_file, list_files, run)`}},
		{"tools unknown", openai + "tools: [read_file, bash]\n", []string{f + `tools[1]: unknown tool "bash" (tools: read_file, write_file, edit_file, list_files, run)`}},
		{"tools twice", openai + "tools: [run, read_file, run]\n", []string{f + `tools[2]: run is listed twice`}},
		{"tools a string", openai + "tools: run\n", []string{f + `tools: want a list such as [read_file, run], got a string`}},
		{"tools not strings", openai + "tools: [[run]]\n", []string{f + `tools[0]: want a string, got a list`}},

		// max_turns, max_tokens
		{"max_turns zero", openai + "max_turns: 0\n", []string{f + `max_turns: want an integer > 0, got 0`}},
		{"max_turns negative", openai + "max_turns: -3\n", []string{f + `max_turns: want an integer > 0, got -3`}},
		{"max_turns over the limit", openai + "max_turns: 1001\n", []string{f + `max_turns: must be at most 1000, got 1001`}},
		{"max_turns a fraction", openai + "max_turns: 2.5\n", []string{f + `max_turns: want an integer > 0, got 2.5`}},
		{"max_turns quoted", openai + "max_turns: \"5\"\n", []string{f + `max_turns: want an integer > 0, got the string "5"`}},
		{"max_tokens zero", openai + "max_tokens: 0\n", []string{f + `max_tokens: want an integer > 0, got 0`}},
		{"max_tokens over the limit", openai + "max_tokens: 1000001\n", []string{f + `max_tokens: must be at most 1000000, got 1000001`}},

		// price
		{"price without input", openai + "price: {output_per_mtok: 1}\n", []string{f + `price.input_per_mtok: required: US dollars per million input tokens`}},
		{"price empty", openai + "price: {}\n", []string{
			f + `price.input_per_mtok: required: US dollars per million input tokens`,
			f + `price.output_per_mtok: required: US dollars per million output tokens`,
		}},
		{"price negative and not a number", openai + "price:\n  input_per_mtok: -1\n  output_per_mtok: cheap\n  cached_input_per_mtok: -0.5\n", []string{
			`p.yaml:10: steps.a.agent.price.input_per_mtok: want a number >= 0, got -1`,
			`p.yaml:11: steps.a.agent.price.output_per_mtok: want a number >= 0, got the string "cheap"`,
			`p.yaml:12: steps.a.agent.price.cached_input_per_mtok: want a number >= 0, got -0.5`,
		}},
		{"price infinite", openai + "price: {input_per_mtok: .inf, output_per_mtok: 1}\n", []string{f + `price.input_per_mtok: want a number >= 0, got .inf`}},
		{"price unknown key", openai + "price: {input_per_mtok: 1, output_per_mtok: 1, cache_per_mtok: 1}\n", []string{f + `price.cache_per_mtok: unknown key "cache_per_mtok" (allowed: input_per_mtok, output_per_mtok, cached_input_per_mtok)`}},
		{"price a number", openai + "price: 3\n", []string{f + `price: want a mapping with keys input_per_mtok, output_per_mtok, cached_input_per_mtok, got a number`}},

		// retry_wait
		{"retry_wait without unit", openai + "retry_wait: 30\n", []string{f + `retry_wait: invalid duration "30": want a Go duration such as 30s, 2m or 1h30m`}},
		{"retry_wait zero", openai + "retry_wait: 0s\n", []string{f + `retry_wait: must be > 0, got "0s"`}},
		{"retry_wait negative", openai + "retry_wait: -1s\n", []string{f + `retry_wait: must be > 0, got "-1s"`}},
		{"retry_wait over an hour", openai + "retry_wait: 61m\n", []string{f + `retry_wait: must be at most 1h, got "61m"`}},

		// stream
		{"stream quoted", openai + "stream: \"false\"\n", []string{f + `stream: want true or false, got a string`}},
		{"stream a number", openai + "stream: 0\n", []string{f + `stream: want true or false, got a number`}},

		// several at once, in file order
		{"several", "backend: anthropic\nmax_turns: 0\ntools: [grep]\n", []string{
			`p.yaml:8: steps.a.agent.max_turns: want an integer > 0, got 0`,
			`p.yaml:9: steps.a.agent.tools[0]: unknown tool "grep" (tools: read_file, write_file, edit_file, list_files, run)`,
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := Parse("p.yaml", []byte(apiAgentFile(tt.lines)), t.TempDir())
			if got := problems(t, err); !slices.Equal(got, tt.want) {
				t.Errorf("problems:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tt.want, "\n"))
			}
		})
	}
}

// TestParseAgentWrongBackend: each option is refused, at its key, by the
// backends it means nothing to.
func TestParseAgentWrongBackend(t *testing.T) {
	t.Parallel()
	apiOnly := "openai and anthropic"
	tests := []struct {
		option   string // "key: value"
		backends []string
		only     string
	}{
		{"base_url: http://127.0.0.1:8000/v1", []string{"exec", "claude", "codex"}, apiOnly},
		{"api_key_env: OPENAI_API_KEY", []string{"exec", "claude", "codex"}, apiOnly},
		{"tools: [read_file]", []string{"exec", "claude", "codex"}, apiOnly},
		{"max_turns: 40", []string{"exec", "claude", "codex"}, apiOnly},
		{"max_tokens: 8192", []string{"exec", "claude", "codex"}, apiOnly},
		{"price: {input_per_mtok: 1, output_per_mtok: 2}", []string{"exec", "claude", "codex"}, apiOnly},
		{"retry_wait: 30s", []string{"exec", "claude", "codex"}, apiOnly},
		{"stream: false", []string{"exec", "claude", "codex"}, apiOnly},
		{"model: m", []string{"exec"}, "claude, codex, openai and anthropic"},
		{"command: [my-agent]", []string{"openai", "anthropic"}, "exec, claude and codex"},
		{"permission_mode: acceptEdits", []string{"exec", "codex", "openai", "anthropic"}, "claude"},
		{"allowed_tools: [Bash]", []string{"exec", "codex", "openai", "anthropic"}, "claude"},
		{"args: [--verbose]", []string{"exec", "openai", "anthropic"}, "claude and codex"},
	}
	for _, tt := range tests {
		key, _, _ := strings.Cut(tt.option, ":")
		for _, b := range tt.backends {
			t.Run(b+"/"+key, func(t *testing.T) {
				t.Parallel()
				lines := "backend: " + b + "\n"
				switch b {
				case "exec":
					lines += "command: [echo]\n"
				case "openai", "anthropic":
					lines += "model: m\n"
				default:
					lines += "env: {}\n"
				}
				_, err := Parse("p.yaml", []byte(apiAgentFile(lines+tt.option+"\n")), t.TempDir())
				want := []string{fmt.Sprintf("p.yaml:9: steps.a.agent.%s: not an option of the %s backend (only of %s)", key, b, tt.only)}
				if got := problems(t, err); !slices.Equal(got, want) {
					t.Errorf("problems:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
				}
			})
		}
	}

	// An unsupported backend is reported alone, not its options.
	t.Run("unsupported backend", func(t *testing.T) {
		t.Parallel()
		_, err := Parse("p.yaml", []byte(apiAgentFile("backend: gemini\nbase_url: http://x\nmax_turns: 3\n")), t.TempDir())
		want := []string{`p.yaml:7: steps.a.agent.backend: unsupported backend "gemini" (supported: exec, claude, codex, openai, anthropic)`}
		if got := problems(t, err); !slices.Equal(got, want) {
			t.Errorf("problems:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
	})
}

// TestParseLoopsModelAPI: a loops file with an openai agent at top level,
// taken by the levels without their own, and an anthropic one on a level.
func TestParseLoopsModelAPI(t *testing.T) {
	t.Parallel()
	const file = `kind: loops
name: api
agent: {backend: openai, model: gpt-4.1-mini, api_key_env: OPENAI_API_KEY, tools: [read_file, run], price: {input_per_mtok: 0.4, output_per_mtok: 1.6, cached_input_per_mtok: 0.1}}
levels:
  plan:
    outputs: [{name: plan.md}]
    children: {level: code, from: plan.md, split: headings}
  code:
    agent:
      backend: anthropic
      model: claude-sonnet-4-5
      max_tokens: 16000
      retry_wait: 2m
      stream: false
    worktree: true
    children: {level: review}
  review:
    outputs: [{name: review.md}]
`
	p, err := Parse("p.yaml", []byte(file), t.TempDir())
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	cached := 0.1
	top := schemas.AgentSpec{
		Backend: "openai", Model: "gpt-4.1-mini", APIKeyEnv: "OPENAI_API_KEY", Tools: []string{"read_file", "run"},
		Price: &schemas.Price{InputPerMTok: 0.4, OutputPerMTok: 1.6, CachedInputPerMTok: &cached},
	}
	code := schemas.AgentSpec{Backend: "anthropic", Model: "claude-sonnet-4-5", MaxTokens: 16000, RetryWaitMs: 120_000, NoStream: true}
	for name, want := range map[string]schemas.AgentSpec{"plan": top, "code": code, "review": top} {
		lv := p.Loops.Level(name)
		if lv == nil {
			t.Fatalf("no level %s", name)
		}
		if !reflect.DeepEqual(lv.Agent, want) {
			g, _ := json.Marshal(lv.Agent)
			w, _ := json.Marshal(want)
			t.Errorf("level %s: agent %s, want %s", name, g, w)
		}
	}

	// Levels that take the top-level agent share none of its slices and
	// pointers.
	plan, review := p.Loops.Level("plan"), p.Loops.Level("review")
	plan.Agent.Tools[0] = "changed"
	plan.Agent.Price.InputPerMTok = 99
	*plan.Agent.Price.CachedInputPerMTok = 99
	if review.Agent.Tools[0] != "read_file" || review.Agent.Price.InputPerMTok != 0.4 || *review.Agent.Price.CachedInputPerMTok != 0.1 {
		t.Errorf("levels share the top-level agent: review's agent is %+v, price %+v", review.Agent, *review.Agent.Price)
	}

	// A level's own agent is checked as a step's is.
	_, err = Parse("p.yaml", []byte("kind: loops\nname: api\nagent: {backend: openai}\nlevels:\n  plan:\n    agent: {backend: anthropic, model: m, tools: [bash]}\n    outputs: [{name: plan.md}]\n"), t.TempDir())
	want := []string{
		`p.yaml:6: levels.plan.agent.tools[0]: unknown tool "bash" (tools: read_file, write_file, edit_file, list_files, run)`,
	}
	if got := problems(t, err); !slices.Equal(got, want) {
		t.Errorf("problems:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestCloneAgent: a clone shares nothing with the original.
func TestCloneAgent(t *testing.T) {
	t.Parallel()
	cached := 0.5
	a := schemas.AgentSpec{
		Backend: "openai", Command: []string{"x"}, AllowedTools: []string{"Bash"}, Args: []string{"-v"},
		Env: map[string]string{"K": "V"}, SecretEnv: []string{"S"}, Tools: []string{"run"},
		Price: &schemas.Price{InputPerMTok: 1, OutputPerMTok: 2, CachedInputPerMTok: &cached},
	}
	c := cloneAgent(a)
	if !reflect.DeepEqual(c, a) {
		t.Fatalf("clone %+v differs from %+v", c, a)
	}
	c.Command[0], c.AllowedTools[0], c.Args[0], c.Env["K"], c.SecretEnv[0], c.Tools[0] = "y", "y", "y", "y", "y", "y"
	c.Price.InputPerMTok = 9
	*c.Price.CachedInputPerMTok = 9
	if a.Command[0] != "x" || a.AllowedTools[0] != "Bash" || a.Args[0] != "-v" || a.Env["K"] != "V" || a.SecretEnv[0] != "S" ||
		a.Tools[0] != "run" || a.Price.InputPerMTok != 1 || cached != 0.5 {
		t.Errorf("changing the clone changed the original: %+v, price %+v, cached %v", a, *a.Price, cached)
	}
	if c := cloneAgent(schemas.AgentSpec{Backend: "claude"}); c.Price != nil || c.Tools != nil {
		t.Errorf("clone of an agent without price or tools: %+v", c)
	}
}
