package definition

import (
	"reflect"
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
			agent: `{backend: codex, command: [/opt/codex/bin/codex], model: gpt-5-codex, args: [--full-auto]}`,
			want:  schemas.AgentSpec{Backend: "codex", Command: []string{"/opt/codex/bin/codex"}, Model: "gpt-5-codex", Args: []string{"--full-auto"}},
		},
		{
			name:  "claude alone",
			agent: `{backend: claude}`,
			want:  schemas.AgentSpec{Backend: "claude"},
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
