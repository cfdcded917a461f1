package definition

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/loopbus/loopbus/schemas"
	"github.com/loopbus/loopbus/workspace"
)

// agentPipeline is a one-step pipeline whose agent mapping is agent.
func agentPipeline(agent string) string {
	return "name: p\nsteps:\n  a:\n    agent: " + agent + "\n    prompt: go\n    outputs: [{name: a.txt}]\n"
}

func TestParseSecretEnv(t *testing.T) {
	tests := []struct {
		name    string
		agent   string
		want    []string
		wantEnv map[string]string
	}{
		{
			name:  "names only travel",
			agent: `{backend: exec, command: [echo], secret_env: [API_TOKEN, deploy_pw, _X1]}`,
			want:  []string{"API_TOKEN", "deploy_pw", "_X1"},
		},
		{
			name:  "absent",
			agent: `{backend: exec, command: [echo]}`,
		},
		{
			name:  "empty list",
			agent: `{backend: exec, command: [echo], secret_env: []}`,
		},
		{
			// Short values of secret-looking names are not masked, so they
			// may stay in env (MAX_TOKENS: 4096 is no secret).
			name:    "short value of a secret-looking name",
			agent:   `{backend: exec, command: [echo], env: {MAX_TOKENS: "4096", TOKENIZERS_PARALLELISM: "false", STYLE: a-long-plain-value}}`,
			wantEnv: map[string]string{"MAX_TOKENS": "4096", "TOKENIZERS_PARALLELISM": "false", "STYLE": "a-long-plain-value"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := Parse("p.yaml", []byte(agentPipeline(tt.agent)), t.TempDir())
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			got := p.Steps[0].Agent
			if !slices.Equal(got.SecretEnv, tt.want) {
				t.Errorf("SecretEnv = %q, want %q", got.SecretEnv, tt.want)
			}
			if len(got.Env) != len(tt.wantEnv) {
				t.Errorf("Env = %v, want %v", got.Env, tt.wantEnv)
			}
			for k, v := range tt.wantEnv {
				if got.Env[k] != v {
					t.Errorf("Env[%s] = %q, want %q", k, got.Env[k], v)
				}
			}
		})
	}
}

func TestParseSecretEnvErrors(t *testing.T) {
	tests := []struct {
		name    string
		agent   string
		wantErr string
		// wantCause, if set, must be found with errors.Is.
		wantCause error
	}{
		{
			name:    "not a list",
			agent:   `{backend: exec, command: [echo], secret_env: API_TOKEN}`,
			wantErr: `p.yaml:4: steps.a.agent.secret_env: want a list such as [API_TOKEN], got a string`,
		},
		{
			name:      "name with a dash",
			agent:     `{backend: exec, command: [echo], secret_env: [API-TOKEN]}`,
			wantErr:   `p.yaml:4: steps.a.agent.secret_env[0]: invalid secret variable name "API-TOKEN"`,
			wantCause: workspace.ErrBadSecretName,
		},
		{
			name:      "name starting with a digit",
			agent:     `{backend: exec, command: [echo], secret_env: [1TOKEN]}`,
			wantErr:   `steps.a.agent.secret_env[0]: invalid secret variable name "1TOKEN"`,
			wantCause: workspace.ErrBadSecretName,
		},
		{
			name:      "empty name",
			agent:     `{backend: exec, command: [echo], secret_env: [""]}`,
			wantErr:   `steps.a.agent.secret_env[0]: invalid secret variable name: must not be empty`,
			wantCause: workspace.ErrBadSecretName,
		},
		{
			name:      "loopbus's own variable",
			agent:     `{backend: exec, command: [echo], secret_env: [OK_TOKEN, LOOPBUS_TOKEN]}`,
			wantErr:   `p.yaml:4: steps.a.agent.secret_env[1]: invalid secret variable name "LOOPBUS_TOKEN": LOOPBUS_* variables are loopbus's own`,
			wantCause: workspace.ErrBadSecretName,
		},
		{
			name:    "listed twice",
			agent:   `{backend: exec, command: [echo], secret_env: [A_TOKEN, A_TOKEN]}`,
			wantErr: `p.yaml:4: steps.a.agent.secret_env[1]: A_TOKEN is listed twice`,
		},
		{
			name:    "listed name set in env",
			agent:   `{backend: exec, command: [echo], env: {DEPLOY_PW: x}, secret_env: [DEPLOY_PW]}`,
			wantErr: `p.yaml:4: steps.a.agent.env.DEPLOY_PW: values in env travel in events; set DEPLOY_PW in the worker's environment and list it in secret_env`,
		},
		{
			name:    "secret-looking name in env",
			agent:   `{backend: exec, command: [echo], env: {API_TOKEN: sk-123456789}}`,
			wantErr: `p.yaml:4: steps.a.agent.env.API_TOKEN: values in env travel in events; set API_TOKEN in the worker's environment and list it in secret_env`,
		},
		{
			name: "secret-looking name in a block mapping",
			agent: `
      backend: exec
      command: [echo]
      env:
        STYLE: brief
        db_password: correct-horse-battery`,
			wantErr: `p.yaml:9: steps.a.agent.env.db_password: values in env travel in events`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse("p.yaml", []byte(agentPipeline(tt.agent)), t.TempDir())
			if err == nil {
				t.Fatalf("Parse succeeded, want error containing %q", tt.wantErr)
			}
			checkInvalid(t, err)
			if !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("Parse error:\n%v\nwant it to contain:\n%s", err, tt.wantErr)
			}
			if tt.wantCause != nil && !errors.Is(err, tt.wantCause) {
				t.Errorf("errors.Is(err, %v) = false for %v", tt.wantCause, err)
			}
			// The message names the variable, never an env value.
			for _, v := range []string{"sk-123456789", "correct-horse-battery"} {
				if strings.Contains(err.Error(), v) {
					t.Errorf("error shows the value %q: %v", v, err)
				}
			}
		})
	}
}

// TestParseHostileOutputNames: declared output names that could escape
// out/ are refused with the file and line, before anything runs.
func TestParseHostileOutputNames(t *testing.T) {
	tests := []struct {
		name    string
		output  string // the YAML text of the name, quoted as needed
		wantErr string
	}{
		{name: "parent", output: `../x`, wantErr: `p.yaml:6: steps.a.outputs[0].name: invalid artifact name "../x": must be a file name, not a path`},
		{name: "absolute", output: `/etc/passwd`, wantErr: `p.yaml:6: steps.a.outputs[0].name: invalid artifact name "/etc/passwd"`},
		{name: "subdirectory", output: `a/b`, wantErr: `p.yaml:6: steps.a.outputs[0].name: invalid artifact name "a/b"`},
		{name: "backslash", output: `'a\b'`, wantErr: `p.yaml:6: steps.a.outputs[0].name: invalid artifact name "a\\b": must be a file name, not a path`},
		{name: "empty", output: `""`, wantErr: `p.yaml:6: steps.a.outputs[0].name: invalid artifact name "": must not be empty`},
		{name: "dot", output: `"."`, wantErr: `p.yaml:6: steps.a.outputs[0].name: invalid artifact name ".": must not be . or ..`},
		{name: "dot dot", output: `".."`, wantErr: `p.yaml:6: steps.a.outputs[0].name: invalid artifact name "..": must not be . or ..`},
		{name: "NUL", output: `"a\0b"`, wantErr: `p.yaml:6: steps.a.outputs[0].name: invalid artifact name "a\x00b": character '\x00' not allowed`},
		{name: "newline", output: `"a\nb"`, wantErr: `p.yaml:6: steps.a.outputs[0].name: invalid artifact name "a\nb"`},
		{name: "non-ASCII", output: `"caf\u00e9.txt"`, wantErr: `p.yaml:6: steps.a.outputs[0].name: invalid artifact name "café.txt": character 'é' not allowed`},
		{name: "leading dash", output: `-rf`, wantErr: `p.yaml:6: steps.a.outputs[0].name: invalid artifact name "-rf": must not start with -`},
		// Raw invalid UTF-8 bytes in the file: refused (by the YAML reader
		// or by the name check), with a line.
		{name: "non-UTF-8 bytes", output: "\"a\xff\xfeb\"", wantErr: `p.yaml:6: steps.a.outputs[0].name: invalid artifact name`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			yaml := "name: p\nsteps:\n  a:\n    agent: {backend: exec, command: [echo]}\n    prompt: go\n    outputs: [{name: " + tt.output + "}]\n"
			p, err := Parse("p.yaml", []byte(yaml), t.TempDir())
			if err == nil {
				t.Fatalf("Parse succeeded with outputs %+v, want error containing %q", p.Steps[0].Outputs, tt.wantErr)
			}
			t.Log(err)
			checkInvalid(t, err)
			if !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("Parse error:\n%v\nwant it to contain:\n%s", err, tt.wantErr)
			}
		})
	}
}

// TestParsedOutputNamesAreSafe: whatever Parse accepts as an output name
// passes schemas.ValidateName, so the worker's own check never disagrees.
func TestParsedOutputNamesAreSafe(t *testing.T) {
	for _, name := range []string{"a.txt", "..a", "a..b", "_x", ".hidden", strings.Repeat("n", 128)} {
		p, err := Parse("p.yaml", []byte("name: p\nsteps:\n  a:\n    agent: {backend: exec, command: [echo]}\n    prompt: go\n    outputs: [{name: '"+name+"'}]\n"), t.TempDir())
		if err != nil {
			t.Errorf("Parse with output %q: %v", name, err)
			continue
		}
		if got := p.Steps[0].Outputs[0].Name; got != name || schemas.ValidateName(got) != nil {
			t.Errorf("output name %q parsed as %q (ValidateName: %v)", name, got, schemas.ValidateName(got))
		}
	}
}
