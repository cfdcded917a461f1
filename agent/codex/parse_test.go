package codex

import (
	"bufio"
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/loopbus/loopbus/agent"
)

// codexStepClock is a clock that advances by step on every reading, so that
// durations in tests are exact.
type codexStepClock struct {
	t    time.Time
	step time.Duration
}

func (c *codexStepClock) now() time.Time {
	c.t = c.t.Add(c.step)
	return c.t
}

var codexT0 = time.Date(2030, 3, 10, 10, 0, 0, 0, time.UTC)

// codexParse feeds lines to a fresh parser whose clock starts at codexT0
// and ticks one second per reading.
func codexParse(t *testing.T, lines ...string) []agent.Event {
	t.Helper()
	clock := &codexStepClock{t: codexT0, step: time.Second}
	p := NewParser(clock.now)
	var got []agent.Event
	for _, l := range lines {
		got = append(got, p.Line([]byte(l))...)
	}
	return got
}

// codexSameObs compares observations, times with Equal.
func codexSameObs(t *testing.T, got, want []agent.Event) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("got %d observations, want %d:\ngot  %+v\nwant %+v", len(got), len(want), got, want)
	}
	for i := range got {
		g, w := got[i], want[i]
		if !g.ResetAt.Equal(w.ResetAt) {
			t.Errorf("obs %d: ResetAt = %v, want %v", i, g.ResetAt, w.ResetAt)
		}
		g.ResetAt, w.ResetAt = time.Time{}, time.Time{}
		if !reflect.DeepEqual(g, w) {
			t.Errorf("obs %d:\ngot  %+v\nwant %+v", i, g, w)
		}
	}
}

func TestCodexLine(t *testing.T) {
	const limitAt = `You've hit your usage limit. Visit https://chatgpt.com/codex/settings/usage to purchase more credits or try again at 3:28 PM.`
	long := strings.Repeat("x", agent.MaxSummary+500)
	tests := []struct {
		name  string
		lines []string
		want  []agent.Event
	}{
		{name: "blank", lines: []string{"", "   "}, want: nil},
		{name: "thread and turn start", lines: []string{
			`{"type":"thread.started","thread_id":"0199a213-81c0-7800-8aa1-bbab2a035a53"}`,
			`{"type":"turn.started"}`,
		}, want: nil},
		{name: "command ok", lines: []string{
			`{"type":"item.started","item":{"id":"item_1","type":"command_execution","command":"bash -lc ls","aggregated_output":"","exit_code":null,"status":"in_progress"}}`,
			`{"type":"item.completed","item":{"id":"item_1","type":"command_execution","command":"bash -lc ls","aggregated_output":"README.md\n","exit_code":0,"status":"completed"}}`,
		}, want: []agent.Event{
			{Kind: agent.KindToolStart, ToolID: "item_1", Name: "shell", Category: "shell", Input: "bash -lc ls", Raw: "item.started/command_execution"},
			{Kind: agent.KindToolEnd, ToolID: "item_1", Name: "shell", Category: "shell", Output: "README.md\n", Duration: time.Second, Raw: "item.completed/command_execution"},
		}},
		{name: "command non-zero exit", lines: []string{
			`{"type":"item.started","item":{"id":"item_2","type":"command_execution","command":"make test","aggregated_output":"","exit_code":null,"status":"in_progress"}}`,
			`{"type":"item.updated","item":{"id":"item_2","type":"command_execution","command":"make test","aggregated_output":"make: ","exit_code":null,"status":"in_progress"}}`,
			`{"type":"item.completed","item":{"id":"item_2","type":"command_execution","command":"make test","aggregated_output":"make: no rule","exit_code":2,"status":"failed"}}`,
		}, want: []agent.Event{
			{Kind: agent.KindToolStart, ToolID: "item_2", Name: "shell", Category: "shell", Input: "make test", Raw: "item.started/command_execution"},
			{Kind: agent.KindToolEnd, ToolID: "item_2", Name: "shell", Category: "shell", Output: "make: no rule", IsError: true, ExitCode: 2, Duration: time.Second, Raw: "item.completed/command_execution"},
		}},
		{name: "command declined without exit code", lines: []string{
			`{"type":"item.started","item":{"id":"item_3","type":"command_execution","command":"rm -rf /","aggregated_output":"","exit_code":null,"status":"in_progress"}}`,
			`{"type":"item.completed","item":{"id":"item_3","type":"command_execution","command":"rm -rf /","aggregated_output":"","exit_code":null,"status":"declined"}}`,
		}, want: []agent.Event{
			{Kind: agent.KindToolStart, ToolID: "item_3", Name: "shell", Category: "shell", Input: "rm -rf /", Raw: "item.started/command_execution"},
			{Kind: agent.KindToolEnd, ToolID: "item_3", Name: "shell", Category: "shell", IsError: true, Duration: time.Second, Raw: "item.completed/command_execution"},
		}},
		{name: "command output truncated, odd field type tolerated", lines: []string{
			`{"type":"item.completed","item":{"id":"item_4","type":"command_execution","command":"yes","aggregated_output":"` + long + `","exit_code":"0","status":"completed"}}`,
		}, want: []agent.Event{
			{Kind: agent.KindToolStart, ToolID: "item_4", Name: "shell", Category: "shell", Input: "yes", Raw: "item.completed/command_execution"},
			{Kind: agent.KindToolEnd, ToolID: "item_4", Name: "shell", Category: "shell", Output: long[:agent.MaxSummary], Raw: "item.completed/command_execution"},
		}},
		{name: "file change seen only completed", lines: []string{
			`{"type":"item.completed","item":{"id":"item_5","type":"file_change","changes":[{"path":"out.txt","kind":"add"},{"path":"main.go","kind":"update"}],"status":"completed"}}`,
		}, want: []agent.Event{
			{Kind: agent.KindToolStart, ToolID: "item_5", Name: "file_change", Category: "edit", Input: "add out.txt\nupdate main.go", Raw: "item.completed/file_change"},
			{Kind: agent.KindToolEnd, ToolID: "item_5", Name: "file_change", Category: "edit", Output: "completed", Raw: "item.completed/file_change"},
		}},
		{name: "file change first seen as update, failed", lines: []string{
			`{"type":"item.updated","item":{"id":"item_6","type":"file_change","changes":[{"path":"a.go","kind":"delete"}],"status":"in_progress"}}`,
			`{"type":"item.updated","item":{"id":"item_6","type":"file_change","changes":[{"path":"a.go","kind":"delete"}],"status":"in_progress"}}`,
			`{"type":"item.completed","item":{"id":"item_6","type":"file_change","changes":[{"path":"a.go","kind":"delete"}],"status":"failed"}}`,
		}, want: []agent.Event{
			{Kind: agent.KindToolStart, ToolID: "item_6", Name: "file_change", Category: "edit", Input: "delete a.go", Raw: "item.updated/file_change"},
			{Kind: agent.KindToolEnd, ToolID: "item_6", Name: "file_change", Category: "edit", Output: "failed", IsError: true, Duration: time.Second, Raw: "item.completed/file_change"},
		}},
		{name: "mcp tool ok", lines: []string{
			`{"type":"item.started","item":{"id":"item_7","type":"mcp_tool_call","server":"docs","tool":"search","arguments":{"q": "nats"},"result":null,"error":null,"status":"in_progress"}}`,
			`{"type":"item.completed","item":{"id":"item_7","type":"mcp_tool_call","server":"docs","tool":"search","arguments":{"q":"nats"},"result":{"content":[{"type":"text","text":"hit 1"},{"type":"image","data":"AA=="}],"structured_content":null},"error":null,"status":"completed"}}`,
		}, want: []agent.Event{
			{Kind: agent.KindToolStart, ToolID: "item_7", Name: "docs/search", Category: "mcp", Input: `{"q":"nats"}`, Raw: "item.started/mcp_tool_call"},
			{Kind: agent.KindToolEnd, ToolID: "item_7", Name: "docs/search", Category: "mcp", Output: "hit 1\n{\"type\":\"image\",\"data\":\"AA==\"}", Duration: time.Second, Raw: "item.completed/mcp_tool_call"},
		}},
		{name: "mcp tool failed", lines: []string{
			`{"type":"item.started","item":{"id":"item_8","type":"mcp_tool_call","server":"db","tool":"query","arguments":null,"result":null,"error":null,"status":"in_progress"}}`,
			`{"type":"item.completed","item":{"id":"item_8","type":"mcp_tool_call","server":"db","tool":"query","arguments":null,"result":null,"error":{"message":"connection refused"},"status":"failed"}}`,
		}, want: []agent.Event{
			{Kind: agent.KindToolStart, ToolID: "item_8", Name: "db/query", Category: "mcp", Raw: "item.started/mcp_tool_call"},
			{Kind: agent.KindToolEnd, ToolID: "item_8", Name: "db/query", Category: "mcp", Output: "connection refused", IsError: true, Duration: time.Second, Raw: "item.completed/mcp_tool_call"},
		}},
		{name: "web search", lines: []string{
			`{"type":"item.started","item":{"id":"item_9","type":"web_search","query":"nats jetstream kv","action":{"type":"search","query":"nats jetstream kv"}}}`,
			`{"type":"item.completed","item":{"id":"item_9","type":"web_search","query":"nats jetstream kv","action":{"type":"search","query":"nats jetstream kv"}}}`,
		}, want: []agent.Event{
			{Kind: agent.KindToolStart, ToolID: "item_9", Name: "web_search", Category: "web", Input: "nats jetstream kv", Raw: "item.started/web_search"},
			{Kind: agent.KindToolEnd, ToolID: "item_9", Name: "web_search", Category: "web", Duration: time.Second, Raw: "item.completed/web_search"},
		}},
		{name: "agent message", lines: []string{
			`{"type":"item.completed","item":{"id":"item_10","type":"agent_message","text":"Wrote out.txt."}}`,
		}, want: []agent.Event{
			{Kind: agent.KindMessage, Text: "Wrote out.txt.", Raw: "item.completed/agent_message"},
		}},
		{name: "reasoning, todo list and warning items are ignored", lines: []string{
			`{"type":"item.completed","item":{"id":"item_11","type":"reasoning","text":"**Thinking**"}}`,
			`{"type":"item.started","item":{"id":"item_12","type":"todo_list","items":[{"text":"a","completed":false}]}}`,
			`{"type":"item.completed","item":{"id":"item_13","type":"error","message":"model rerouted"}}`,
		}, want: nil},
		{name: "usage", lines: []string{
			`{"type":"turn.completed","usage":{"input_tokens":24763,"cached_input_tokens":24448,"output_tokens":122}}`,
		}, want: []agent.Event{
			{Kind: agent.KindUsage, Usage: agent.Usage{InputTokens: 315, CacheReadTokens: 24448, OutputTokens: 122}, Raw: "turn.completed"},
		}},
		{name: "turn failed", lines: []string{
			`{"type":"turn.failed","error":{"message":"stream disconnected before completion"}}`,
		}, want: []agent.Event{
			{Kind: agent.KindFailure, Text: "stream disconnected before completion", Raw: "turn.failed"},
		}},
		{name: "turn failed without error", lines: []string{`{"type":"turn.failed"}`}, want: []agent.Event{
			{Kind: agent.KindFailure, Text: "turn failed", Raw: "turn.failed"},
		}},
		{name: "error then the same turn failure reported once", lines: []string{
			`{"type":"error","message":"Reconnecting... 1/5 (stream disconnected before completion)"}`,
			`{"type":"error","message":"unexpected status 400 Bad Request: bad model"}`,
			`{"type":"turn.failed","error":{"message":"unexpected status 400 Bad Request: bad model"}}`,
		}, want: []agent.Event{
			{Kind: agent.KindRetry, Text: "Reconnecting... 1/5 (stream disconnected before completion)", Raw: "error"},
			{Kind: agent.KindFailure, Text: "unexpected status 400 Bad Request: bad model", Raw: "error"},
		}},
		{name: "usage limit today", lines: []string{
			`{"type":"error","message":"` + limitAt + `"}`,
			`{"type":"turn.failed","error":{"message":"` + limitAt + `"}}`,
		}, want: []agent.Event{
			{Kind: agent.KindFailure, Text: limitAt, Raw: "error"},
			{Kind: agent.KindRateLimit, Text: limitAt, ResetAt: time.Date(2030, 3, 10, 15, 28, 0, 0, time.UTC), Raw: "error"},
		}},
		{name: "usage limit with date in turn.failed only", lines: []string{
			`{"type":"turn.failed","error":{"message":"You've hit your usage limit. Try again at Aug 8th, 2031 12:30 PM."}}`,
		}, want: []agent.Event{
			{Kind: agent.KindFailure, Text: "You've hit your usage limit. Try again at Aug 8th, 2031 12:30 PM.", Raw: "turn.failed"},
			{Kind: agent.KindRateLimit, Text: "You've hit your usage limit. Try again at Aug 8th, 2031 12:30 PM.", ResetAt: time.Date(2031, 8, 8, 12, 30, 0, 0, time.UTC), Raw: "turn.failed"},
		}},
		{name: "usage limit later", lines: []string{
			`{"type":"error","message":"You've hit your usage limit. Try again later."}`,
		}, want: []agent.Event{
			{Kind: agent.KindFailure, Text: "You've hit your usage limit. Try again later.", Raw: "error"},
			{Kind: agent.KindRateLimit, Text: "You've hit your usage limit. Try again later.", Raw: "error"},
		}},
		{name: "retry limit on 429", lines: []string{
			`{"type":"error","message":"exceeded retry limit, last status: 429 Too Many Requests"}`,
		}, want: []agent.Event{
			{Kind: agent.KindFailure, Text: "exceeded retry limit, last status: 429 Too Many Requests", Raw: "error"},
			{Kind: agent.KindRateLimit, Text: "exceeded retry limit, last status: 429 Too Many Requests", Raw: "error"},
		}},
		{name: "unknown top-level type", lines: []string{`{"type":"session.compacted"}`}, want: []agent.Event{
			{Kind: agent.KindUnknown, Raw: "session.compacted"},
		}},
		{name: "unknown item type", lines: []string{`{"type":"item.started","item":{"id":"item_0","type":"image_generation"}}`}, want: []agent.Event{
			{Kind: agent.KindUnknown, Raw: "item.started/image_generation"},
		}},
		{name: "item that is not an object", lines: []string{`{"type":"item.completed","item":"x"}`}, want: []agent.Event{
			{Kind: agent.KindUnknown, Raw: "item.completed"},
		}},
		{name: "malformed JSON", lines: []string{`{"type":"item.completed","item":{`}, want: []agent.Event{
			{Kind: agent.KindUnknown, Raw: "invalid", Text: `{"type":"item.completed","item":{`},
		}},
		{name: "JSON without a type", lines: []string{`[1,2]`}, want: []agent.Event{
			{Kind: agent.KindUnknown, Raw: "invalid", Text: `[1,2]`},
		}},
		{name: "legacy event envelope", lines: []string{`{"id":"0","msg":{"type":"agent_message","message":"hi"}}`}, want: []agent.Event{
			{Kind: agent.KindUnknown, Raw: "invalid", Text: `{"id":"0","msg":{"type":"agent_message","message":"hi"}}`},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			codexSameObs(t, codexParse(t, tt.lines...), tt.want)
		})
	}
}

func TestCodexResetAt(t *testing.T) {
	zone := time.FixedZone("UTC+2", 2*3600)
	now := time.Date(2030, 3, 10, 10, 0, 0, 0, zone)
	tests := []struct {
		name string
		msg  string
		want time.Time
	}{
		{name: "time today, local zone", msg: "You've hit your usage limit. Try again at 3:28 PM.", want: time.Date(2030, 3, 10, 15, 28, 0, 0, zone)},
		{name: "morning, already past: the next", msg: "… send a request to your admin or try again at 9:05 AM.", want: time.Date(2030, 3, 11, 9, 5, 0, 0, zone)},
		{name: "date", msg: "... purchase more credits or try again at Mar 21st, 2030 1:02 AM.", want: time.Date(2030, 3, 21, 1, 2, 0, 0, zone)},
		{name: "date 11th", msg: "try again at Nov 11th, 2030 12:00 PM.", want: time.Date(2030, 11, 11, 12, 0, 0, 0, zone)},
		{name: "relative", msg: "You've hit your usage limit. To get more access now, send a request to your admin or try again in 3 days 6 hours 57 minutes.", want: now.Add(78*time.Hour + 57*time.Minute)},
		{name: "relative seconds", msg: "Rate limit reached. Please try again in 1.5s.", want: now.Add(1500 * time.Millisecond)},
		{name: "later", msg: "You've hit your usage limit. Try again later.", want: time.Time{}},
		{name: "no time", msg: "Quota exceeded. Check your plan and billing details.", want: time.Time{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := codexResetAt(tt.msg, now); !got.Equal(tt.want) {
				t.Errorf("codexResetAt(%q) = %v, want %v", tt.msg, got, tt.want)
			}
		})
	}
}

func TestCodexIsLimit(t *testing.T) {
	tests := []struct {
		msg  string
		want bool
	}{
		{"You've hit your usage limit. Try again later.", true},
		{"Quota exceeded. Check your plan and billing details.", true},
		{"Rate limit reached for gpt-5 in organization org-x on tokens per min.", true},
		{"exceeded retry limit, last status: 429 Too Many Requests", true},
		{"stream disconnected before completion", false},
		{"Codex ran out of room in the model's context window.", false},
	}
	for _, tt := range tests {
		if got := codexIsLimit(tt.msg); got != tt.want {
			t.Errorf("codexIsLimit(%q) = %v, want %v", tt.msg, got, tt.want)
		}
	}
}

func TestArgv(t *testing.T) {
	tests := []struct {
		name  string
		model string
		extra []string
		want  []string
	}{
		{name: "defaults", want: []string{"codex", "exec", "--json", "--sandbox", "workspace-write", "--skip-git-repo-check", "-"}},
		{name: "model", model: "gpt-5-codex", want: []string{"codex", "exec", "--json", "--model", "gpt-5-codex", "--sandbox", "workspace-write", "--skip-git-repo-check", "-"}},
		{name: "extra args before the prompt", model: "o3", extra: []string{"--skip-git-repo-check", "-c", "model_reasoning_effort=high"},
			want: []string{"codex", "exec", "--json", "--model", "o3", "--sandbox", "workspace-write", "--skip-git-repo-check", "-c", "model_reasoning_effort=high", "-"}},
		{name: "a sandbox of the user's", extra: []string{"--sandbox=read-only"},
			want: []string{"codex", "exec", "--json", "--skip-git-repo-check", "--sandbox=read-only", "-"}},
		{name: "no sandbox at all", extra: []string{"--dangerously-bypass-approvals-and-sandbox"},
			want: []string{"codex", "exec", "--json", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox", "-"}},
		{name: "short sandbox flag", extra: []string{"-s", "danger-full-access"},
			want: []string{"codex", "exec", "--json", "--skip-git-repo-check", "-s", "danger-full-access", "-"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Argv(tt.model, tt.extra); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Argv = %q, want %q", got, tt.want)
			}
		})
	}
}

// TestCodexFakeExecutable runs testdata/fake-codex with the argv of
// Argv and the prompt on stdin, and parses its stdout line by line.
func TestCodexFakeExecutable(t *testing.T) {
	fake, err := filepath.Abs("testdata/fake-codex")
	if err != nil {
		t.Fatal(err)
	}
	const prompt = "Write out.txt"
	tests := []struct {
		scenario  string
		wantExit  int
		wantKinds []agent.Kind
		check     func(t *testing.T, obs []agent.Event, outDir string)
	}{
		{scenario: "success", wantExit: 0,
			wantKinds: []agent.Kind{agent.KindToolStart, agent.KindToolEnd, agent.KindToolStart, agent.KindToolEnd, agent.KindMessage, agent.KindUsage},
			check: func(t *testing.T, obs []agent.Event, outDir string) {
				if obs[1].IsError || obs[1].Output != "README.md\nsrc\n" || obs[1].Duration != time.Second {
					t.Errorf("command end = %+v", obs[1])
				}
				if obs[2].Category != "edit" || obs[2].Input != "add out.txt" {
					t.Errorf("file change start = %+v", obs[2])
				}
				if obs[4].Text != "Wrote out.txt." {
					t.Errorf("message = %q", obs[4].Text)
				}
				if want := (agent.Usage{InputTokens: 315, CacheReadTokens: 24448, OutputTokens: 122}); obs[5].Usage != want {
					t.Errorf("usage = %+v, want %+v", obs[5].Usage, want)
				}
				b, err := os.ReadFile(filepath.Join(outDir, "out.txt"))
				if err != nil || string(b) != prompt+"\n" {
					t.Errorf("out.txt = %q, %v; want the prompt", b, err)
				}
			}},
		{scenario: "failed", wantExit: 1,
			wantKinds: []agent.Kind{agent.KindToolStart, agent.KindToolEnd, agent.KindFailure},
			check: func(t *testing.T, obs []agent.Event, _ string) {
				if !obs[1].IsError {
					t.Errorf("command end not an error: %+v", obs[1])
				}
				if !strings.Contains(obs[2].Text, "stream disconnected") {
					t.Errorf("failure = %q", obs[2].Text)
				}
			}},
		{scenario: "rate_limit", wantExit: 1,
			wantKinds: []agent.Kind{agent.KindRetry, agent.KindFailure, agent.KindRateLimit},
			check: func(t *testing.T, obs []agent.Event, _ string) {
				if want := time.Date(2031, 8, 8, 12, 30, 0, 0, time.UTC); !obs[2].ResetAt.Equal(want) {
					t.Errorf("ResetAt = %v, want %v", obs[2].ResetAt, want)
				}
			}},
		{scenario: "recorded/rate-limit-429", wantExit: 1,
			wantKinds: []agent.Kind{agent.KindRetry, agent.KindRetry, agent.KindRetry, agent.KindRetry, agent.KindRetry, agent.KindFailure, agent.KindRateLimit},
			check: func(t *testing.T, obs []agent.Event, _ string) {
				if want := "Reconnecting... 5/5 (exceeded retry limit, last status: 429 Too Many Requests)"; obs[4].Text != want {
					t.Errorf("last retry %q, want %q", obs[4].Text, want)
				}
				if want := "exceeded retry limit, last status: 429 Too Many Requests"; obs[6].Text != want || !obs[6].ResetAt.IsZero() {
					t.Errorf("rate limit %+v, want %q without a reset time", obs[6], want)
				}
			}},
		{scenario: "recorded/usage-limit", wantExit: 1,
			wantKinds: []agent.Kind{agent.KindFailure, agent.KindRateLimit},
			check: func(t *testing.T, obs []agent.Event, _ string) {
				// "try again at 6:00 AM", read at 10:00: the next morning.
				if want := time.Date(2030, 3, 11, 6, 0, 0, 0, time.UTC); !obs[1].ResetAt.Equal(want) {
					t.Errorf("ResetAt = %v, want %v", obs[1].ResetAt, want)
				}
			}},
		{scenario: "recorded/tool-exit-3", wantExit: 0,
			wantKinds: []agent.Kind{agent.KindToolStart, agent.KindToolEnd, agent.KindMessage, agent.KindUsage},
			check: func(t *testing.T, obs []agent.Event, _ string) {
				if e := obs[1]; !e.IsError || e.ExitCode != 3 || e.Output != "out\nerr\n" || e.Input != "" {
					t.Errorf("tool end %+v, want a failure with exit code 3", e)
				}
				if want := (agent.Usage{InputTokens: 200, CacheReadTokens: 40, OutputTokens: 60, ReasoningTokens: 20}); obs[3].Usage != want {
					t.Errorf("usage %+v, want %+v", obs[3].Usage, want)
				}
			}},
		{scenario: "unknown", wantExit: 0,
			wantKinds: []agent.Kind{agent.KindUnknown, agent.KindUnknown, agent.KindUnknown, agent.KindMessage, agent.KindUsage},
			check: func(t *testing.T, obs []agent.Event, _ string) {
				raws := []string{obs[0].Raw, obs[1].Raw, obs[2].Raw}
				if want := []string{"item.started/image_generation", "session.compacted", "invalid"}; !reflect.DeepEqual(raws, want) {
					t.Errorf("unknown raws = %q, want %q", raws, want)
				}
			}},
	}
	for _, tt := range tests {
		t.Run(tt.scenario, func(t *testing.T) {
			outDir := t.TempDir()
			argv := Argv("gpt-5-codex", []string{"--skip-git-repo-check"})
			cmd := exec.Command(fake, argv[1:]...)
			cmd.Env = append(os.Environ(), "FAKE_CODEX_SCENARIO="+tt.scenario, "LOOPBUS_OUTPUT_DIR="+outDir)
			cmd.Stdin = strings.NewReader(prompt)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			stdout, err := cmd.Output()
			exit := 0
			var exitErr *exec.ExitError
			if errors.As(err, &exitErr) {
				exit = exitErr.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			if exit != tt.wantExit {
				t.Fatalf("exit %d, want %d; stderr: %s", exit, tt.wantExit, stderr.String())
			}

			clock := &codexStepClock{t: codexT0, step: time.Second}
			p := NewParser(clock.now)
			var obs []agent.Event
			sc := bufio.NewScanner(bytes.NewReader(stdout))
			sc.Buffer(make([]byte, 0, 64*1024), 16<<20)
			for sc.Scan() {
				obs = append(obs, p.Line(sc.Bytes())...)
			}
			if err := sc.Err(); err != nil {
				t.Fatal(err)
			}
			var kinds []agent.Kind
			for _, o := range obs {
				kinds = append(kinds, o.Kind)
			}
			if !reflect.DeepEqual(kinds, tt.wantKinds) {
				t.Fatalf("kinds = %v, want %v\n%+v", kinds, tt.wantKinds, obs)
			}
			tt.check(t, obs, outDir)
		})
	}
}
