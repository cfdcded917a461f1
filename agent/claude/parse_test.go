package claude

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

// claudeT0 is the start of the test clock.
var claudeT0 = time.Date(2026, 7, 16, 12, 0, 0, 0, time.UTC)

// claudeTestClock returns a clock that starts at claudeT0 and advances one
// second per call, so tool durations count the clock reads between lines.
func claudeTestClock() func() time.Time {
	t := claudeT0.Add(-time.Second)
	return func() time.Time {
		t = t.Add(time.Second)
		return t
	}
}

func TestClaudeLine(t *testing.T) {
	const (
		bashUse    = `{"type":"assistant","message":{"id":"msg_1","role":"assistant","content":[{"type":"tool_use","id":"toolu_1","name":"Bash","input":{"command": "ls -la"}}],"usage":{"input_tokens":4,"output_tokens":9}},"session_id":"s"}`
		rejected   = `{"type":"rate_limit_event","rate_limit_info":{"status":"rejected","resetsAt":1784238600,"rateLimitType":"five_hour"},"session_id":"s"}`
		limitText  = "You've hit your session limit · resets 9:50pm (UTC)"
		limitRes   = `{"type":"result","subtype":"success","is_error":true,"api_error_status":429,"result":"` + limitText + `","total_cost_usd":0,"usage":{"input_tokens":0,"output_tokens":0}}`
		resultBody = `"duration_ms":16049,"num_turns":3,"session_id":"s","total_cost_usd":0.0421,"usage":{"input_tokens":18,"cache_creation_input_tokens":1730,"cache_read_input_tokens":44950,"output_tokens":135}`
	)
	usage := agent.Usage{InputTokens: 18, OutputTokens: 135, CacheReadTokens: 44950, CacheWriteTokens: 1730, Turns: 3, CostUSD: 0.0421}
	long := strings.Repeat("é", agent.MaxSummary) // 2 bytes a rune: must be cut on a rune boundary
	tests := []struct {
		name  string
		prior []string // lines fed first; their observations are not checked
		line  string
		want  []agent.Event
	}{
		{name: "blank", line: "  ", want: nil},
		{name: "system init", line: `{"type":"system","subtype":"init","session_id":"s","tools":["Bash"],"model":"claude-sonnet-4-5"}`, want: nil},
		{name: "system hook", line: `{"type":"system","subtype":"hook_response","session_id":"s"}`, want: nil},
		{name: "stream event", line: `{"type":"stream_event","event":{"type":"content_block_delta"}}`, want: nil},
		{
			name: "assistant text",
			line: `{"type":"assistant","message":{"content":[{"type":"text","text":"Planning next steps."}]}}`,
			want: []agent.Event{{Kind: agent.KindMessage, Text: "Planning next steps.", Raw: "assistant"}},
		},
		{
			name: "assistant text truncated on rune boundary",
			line: `{"type":"assistant","message":{"content":[{"type":"text","text":"` + long + `"}]}}`,
			want: []agent.Event{{Kind: agent.KindMessage, Text: strings.Repeat("é", agent.MaxSummary/2), Raw: "assistant"}},
		},
		{
			name: "assistant thinking and blank text give nothing",
			line: `{"type":"assistant","message":{"content":[{"type":"thinking","thinking":"hmm"},{"type":"text","text":"  "}]}}`,
			want: nil,
		},
		{
			name: "bash tool_use",
			line: bashUse,
			want: []agent.Event{{Kind: agent.KindToolStart, ToolID: "toolu_1", Name: "Bash", Category: "shell", Input: `{"command":"ls -la"}`, Raw: "assistant"}},
		},
		{
			name: "text and tool_use in one message",
			line: `{"type":"assistant","message":{"content":[{"type":"text","text":"Reading."},{"type":"tool_use","id":"toolu_2","name":"Read","input":{"file_path":"/a"}}]}}`,
			want: []agent.Event{
				{Kind: agent.KindMessage, Text: "Reading.", Raw: "assistant"},
				{Kind: agent.KindToolStart, ToolID: "toolu_2", Name: "Read", Category: "read", Input: `{"file_path":"/a"}`, Raw: "assistant"},
			},
		},
		{
			name: "tool_use input truncated",
			line: `{"type":"assistant","message":{"content":[{"type":"tool_use","id":"toolu_3","name":"Write","input":{"content":"` + strings.Repeat("x", 3000) + `"}}]}}`,
			want: []agent.Event{{Kind: agent.KindToolStart, ToolID: "toolu_3", Name: "Write", Category: "edit", Input: (`{"content":"` + strings.Repeat("x", 3000))[:agent.MaxSummary], Raw: "assistant"}},
		},
		{
			name:  "tool_result string content matched to its start",
			prior: []string{bashUse},
			line:  `{"type":"user","message":{"role":"user","content":[{"tool_use_id":"toolu_1","type":"tool_result","content":"total 2\nREADME.md","is_error":false}]}}`,
			want:  []agent.Event{{Kind: agent.KindToolEnd, ToolID: "toolu_1", Name: "Bash", Category: "shell", Output: "total 2\nREADME.md", Duration: time.Second, Raw: "user"}},
		},
		{
			name:  "tool_result array content with error",
			prior: []string{bashUse},
			line:  `{"type":"user","message":{"role":"user","content":[{"tool_use_id":"toolu_1","type":"tool_result","content":[{"type":"text","text":"exit 2"},{"type":"image","source":{}}],"is_error":true}]}}`,
			want:  []agent.Event{{Kind: agent.KindToolEnd, ToolID: "toolu_1", Name: "Bash", Category: "shell", Output: "exit 2\n[image]", IsError: true, Duration: time.Second, Raw: "user"}},
		},
		{
			name: "tool_result without a start",
			line: `{"type":"user","message":{"content":[{"tool_use_id":"toolu_9","type":"tool_result","content":"ok"}]}}`,
			want: []agent.Event{{Kind: agent.KindToolEnd, ToolID: "toolu_9", Output: "ok", Raw: "user"}},
		},
		{
			name:  "tool_result matches only once",
			prior: []string{bashUse, `{"type":"user","message":{"content":[{"tool_use_id":"toolu_1","type":"tool_result","content":"a"}]}}`},
			line:  `{"type":"user","message":{"content":[{"tool_use_id":"toolu_1","type":"tool_result","content":"b"}]}}`,
			want:  []agent.Event{{Kind: agent.KindToolEnd, ToolID: "toolu_1", Output: "b", Raw: "user"}},
		},
		{name: "user prompt string", line: `{"type":"user","message":{"role":"user","content":"hello"}}`, want: nil},
		{
			name: "result success",
			line: `{"type":"result","subtype":"success","is_error":false,"result":"All done.",` + resultBody + `}`,
			want: []agent.Event{
				{Kind: agent.KindUsage, Usage: usage, Raw: "result/success"},
			},
		},
		{
			name: "success result mentioning a limit is not a rate limit",
			line: `{"type":"result","subtype":"success","is_error":false,"result":"Docs say: Claude AI usage limit reached|1749924000",` + resultBody + `}`,
			want: []agent.Event{
				{Kind: agent.KindUsage, Usage: usage, Raw: "result/success"},
			},
		},
		{
			name: "result error_max_turns",
			line: `{"type":"result","subtype":"error_max_turns","is_error":false,` + resultBody + `}`,
			want: []agent.Event{
				{Kind: agent.KindUsage, Usage: usage, Raw: "result/error_max_turns"},
				{Kind: agent.KindFailure, Raw: "result/error_max_turns"},
			},
		},
		{
			name: "result error_during_execution with errors",
			line: `{"type":"result","subtype":"error_during_execution","is_error":true,"errors":["boom","bang"]}`,
			want: []agent.Event{{Kind: agent.KindFailure, Text: "boom; bang", Raw: "result/error_during_execution"}},
		},
		{
			name: "result api error flagged by is_error",
			line: `{"type":"result","subtype":"success","is_error":true,"result":"API Error: 500"}`,
			want: []agent.Event{{Kind: agent.KindFailure, Text: "API Error: 500", Raw: "result/success"}},
		},
		{
			name: "result usage limit with epoch",
			line: `{"type":"result","subtype":"success","is_error":true,"result":"Claude AI usage limit reached|1749924000"}`,
			want: []agent.Event{
				{Kind: agent.KindRateLimit, Text: "Claude AI usage limit reached|1749924000", ResetAt: time.Unix(1749924000, 0).UTC(), Raw: "result/success"},
				{Kind: agent.KindFailure, Text: "Claude AI usage limit reached|1749924000", Raw: "result/success"},
			},
		},
		{
			name: "result usage limit with time of day",
			line: limitRes,
			want: []agent.Event{
				{Kind: agent.KindRateLimit, Text: limitText, ResetAt: time.Date(2026, 7, 16, 21, 50, 0, 0, time.UTC), Raw: "result/success"},
				{Kind: agent.KindFailure, Text: limitText, Raw: "result/success"},
			},
		},
		{
			name: "result usage limit in a zone, hour already past today",
			line: `{"type":"result","subtype":"success","is_error":true,"result":"You've hit your limit · resets 1pm (Europe/Lisbon)"}`,
			// 13:00 in Lisbon (UTC+1 in July) is 12:00Z, not after the clock: tomorrow.
			want: []agent.Event{
				{Kind: agent.KindRateLimit, Text: "You've hit your limit · resets 1pm (Europe/Lisbon)", ResetAt: time.Date(2026, 7, 17, 12, 0, 0, 0, time.UTC), Raw: "result/success"},
				{Kind: agent.KindFailure, Text: "You've hit your limit · resets 1pm (Europe/Lisbon)", Raw: "result/success"},
			},
		},
		{
			name: "result usage limit with a date",
			line: `{"type":"result","subtype":"success","is_error":true,"result":"You've hit your limit · resets Jul 21, 5am (Etc/GMT-9)"}`,
			want: []agent.Event{
				{Kind: agent.KindRateLimit, Text: "You've hit your limit · resets Jul 21, 5am (Etc/GMT-9)", ResetAt: time.Date(2026, 7, 20, 20, 0, 0, 0, time.UTC), Raw: "result/success"},
				{Kind: agent.KindFailure, Text: "You've hit your limit · resets Jul 21, 5am (Etc/GMT-9)", Raw: "result/success"},
			},
		},
		{
			name: "result usage limit in an unknown zone has no reset",
			line: `{"type":"result","subtype":"success","is_error":true,"result":"You've hit your limit · resets 3pm (Mars/Olympus)"}`,
			want: []agent.Event{
				{Kind: agent.KindRateLimit, Text: "You've hit your limit · resets 3pm (Mars/Olympus)", Raw: "result/success"},
				{Kind: agent.KindFailure, Text: "You've hit your limit · resets 3pm (Mars/Olympus)", Raw: "result/success"},
			},
		},
		{
			name:  "result usage limit takes the rejected event's reset",
			prior: []string{rejected},
			line:  limitRes,
			want: []agent.Event{
				{Kind: agent.KindRateLimit, Text: limitText, ResetAt: time.Unix(1784238600, 0).UTC(), Raw: "result/success"},
				{Kind: agent.KindFailure, Text: limitText, Raw: "result/success"},
			},
		},
		{
			name: "rate_limit_event rejected",
			line: rejected,
			want: []agent.Event{{Kind: agent.KindRateLimit, Text: "five_hour limit rejected", ResetAt: time.Unix(1784238600, 0).UTC(), Raw: "rate_limit_event"}},
		},
		{
			name: "rate_limit_event rejected without reset",
			line: `{"type":"rate_limit_event","rate_limit_info":{"status":"rejected"}}`,
			want: []agent.Event{{Kind: agent.KindRateLimit, Text: "rate limit rejected", Raw: "rate_limit_event"}},
		},
		{name: "rate_limit_event allowed", line: `{"type":"rate_limit_event","rate_limit_info":{"status":"allowed","resetsAt":1771390800}}`, want: nil},
		{name: "rate_limit_event warning", line: `{"type":"rate_limit_event","rate_limit_info":{"status":"allowed_warning","resetsAt":1771390800,"utilization":0.91}}`, want: nil},
		{name: "rate_limit_event bare", line: `{"type":"rate_limit_event"}`, want: nil},
		{name: "unknown type", line: `{"type":"telemetry_blip","x":1}`, want: []agent.Event{{Kind: agent.KindUnknown, Raw: "telemetry_blip"}}},
		{name: "unknown type with subtype", line: `{"type":"control_request","subtype":"can_use_tool"}`, want: []agent.Event{{Kind: agent.KindUnknown, Raw: "control_request/can_use_tool"}}},
		{name: "malformed", line: `{"type":"assistant","message":{"content":[{"type":"text","text":"partial`, want: []agent.Event{{Kind: agent.KindUnknown, Raw: "invalid", Text: `{"type":"assistant","message":{"content":[{"type":"text","text":"partial`}}},
		{name: "not an object", line: `[1,2]`, want: []agent.Event{{Kind: agent.KindUnknown, Raw: "invalid", Text: "[1,2]"}}},
		{name: "no type", line: `{"foo":1}`, want: []agent.Event{{Kind: agent.KindUnknown, Raw: "invalid", Text: `{"foo":1}`}}},
		{name: "assistant without message", line: `{"type":"assistant"}`, want: []agent.Event{{Kind: agent.KindUnknown, Raw: "assistant"}}},
		{
			name: "field of an unexpected type is tolerated",
			line: `{"type":"result","subtype":"success","is_error":false,"result":"ok","duration_ms":"slow","total_cost_usd":"free"}`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := NewParser(claudeTestClock())
			for _, l := range tt.prior {
				p.Line([]byte(l))
			}
			got := p.Line([]byte(tt.line))
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Line(%.80q)\n got %+v\nwant %+v", tt.line, got, tt.want)
			}
		})
	}
}

func TestCategory(t *testing.T) {
	tests := []struct{ name, want string }{
		{"Bash", "shell"}, {"Edit", "edit"}, {"Write", "edit"}, {"MultiEdit", "edit"},
		{"NotebookEdit", "edit"}, {"Read", "read"}, {"Glob", "read"}, {"Grep", "read"},
		{"LS", "read"}, {"WebFetch", "web"}, {"WebSearch", "web"},
		{"mcp__github__create_issue", "mcp"}, {"Task", "agent"}, {"Agent", "agent"},
		{"TodoWrite", "internal"}, {"ScheduleWakeup", "internal"}, {"Monitor", "shell"},
		{"SendMessage", "agent"}, {"Workflow", "agent"}, {"ToolSearch", "read"},
		{"EnterWorktree", "edit"}, {"SomeFutureTool", "other"}, {"", "other"},
	}
	for _, tt := range tests {
		if got := category(tt.name); got != tt.want {
			t.Errorf("category(%q) = %q, want %q", tt.name, got, tt.want)
		}
	}
}

func TestArgv(t *testing.T) {
	base := []string{"claude", "-p", "--output-format", "stream-json", "--verbose"}
	tests := []struct {
		name                       string
		model, mode                string
		allowed, disallowed, extra []string
		want                       []string
	}{
		{name: "bare", want: base},
		{name: "model", model: "sonnet", want: append(append([]string{}, base...), "--model", "sonnet")},
		{name: "permission mode", mode: "acceptEdits", want: append(append([]string{}, base...), "--permission-mode", "acceptEdits")},
		{name: "allowed tools joined", allowed: []string{"Read", "Bash(git log:*)"}, want: append(append([]string{}, base...), "--allowedTools", "Read,Bash(git log:*)")},
		{
			name: "all", model: "opus", mode: "plan", allowed: []string{"Edit"}, extra: []string{"--max-turns", "5"},
			want: append(append([]string{}, base...), "--model", "opus", "--permission-mode", "plan", "--allowedTools", "Edit", "--max-turns", "5"),
		},
		{name: "empty allowed list omitted", allowed: []string{}, extra: []string{"--add-dir", "/x"}, want: append(append([]string{}, base...), "--add-dir", "/x")},
		{name: "disallowed tools joined", disallowed: []string{"Bash", "WebFetch"}, want: append(append([]string{}, base...), "--disallowedTools", "Bash,WebFetch")},
		{
			name: "allowed and disallowed before extra", allowed: []string{"Read"}, disallowed: []string{"Bash"}, extra: []string{"--max-turns", "5"},
			want: append(append([]string{}, base...), "--allowedTools", "Read", "--disallowedTools", "Bash", "--max-turns", "5"),
		},
		{name: "empty disallowed list omitted", disallowed: []string{}, want: base},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Argv(tt.model, tt.mode, tt.allowed, tt.disallowed, tt.extra); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Argv() = %q, want %q", got, tt.want)
			}
		})
	}
}

// runFakeClaude runs testdata/fake-claude for a scenario with prompt on stdin
// and returns the parsed observations, the exit code and the directory given
// as LOOPBUS_OUTPUT_DIR.
func runFakeClaude(t *testing.T, scenario, prompt string) ([]agent.Event, int, string) {
	t.Helper()
	script, err := filepath.Abs(filepath.Join("testdata", "fake-claude"))
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	cmd := exec.Command(script)
	cmd.Env = append(os.Environ(), "FAKE_CLAUDE_SCENARIO="+scenario, "LOOPBUS_OUTPUT_DIR="+out)
	cmd.Stdin = strings.NewReader(prompt)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	code := 0
	if err := cmd.Run(); err != nil {
		var exit *exec.ExitError
		if !errors.As(err, &exit) {
			t.Fatalf("run fake-claude: %v", err)
		}
		code = exit.ExitCode()
	}
	if stderr.Len() > 0 {
		t.Errorf("stderr: %s", stderr.String())
	}
	p := NewParser(claudeTestClock())
	var obs []agent.Event
	sc := bufio.NewScanner(&stdout)
	sc.Buffer(make([]byte, 0, 64*1024), 10<<20)
	for sc.Scan() {
		obs = append(obs, p.Line(sc.Bytes())...)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return obs, code, out
}

func TestClaudeFakeExecutable(t *testing.T) {
	successUsage := agent.Usage{InputTokens: 18, OutputTokens: 135, CacheReadTokens: 44950, CacheWriteTokens: 1730, Turns: 3, CostUSD: 0.0421337}
	errUsage := agent.Usage{InputTokens: 4, OutputTokens: 20, CacheReadTokens: 12000, CacheWriteTokens: 900, Turns: 2, CostUSD: 0.0123}
	limit := "You've hit your session limit · resets 9:50pm (UTC)"
	tests := []struct {
		name     string
		scenario string
		wantCode int
		wantFile bool
		want     []agent.Event
	}{
		{
			name: "success", scenario: "success", wantCode: 0, wantFile: true,
			want: []agent.Event{
				{Kind: agent.KindMessage, Text: "Received a prompt of 13 bytes. Let me look around.", Raw: "assistant"},
				{Kind: agent.KindToolStart, ToolID: "toolu_01Bash", Name: "Bash", Category: "shell", Input: `{"command":"ls -la","description":"List files"}`, Raw: "assistant"},
				{Kind: agent.KindToolEnd, ToolID: "toolu_01Bash", Name: "Bash", Category: "shell", Output: "total 8\ndrwxr-xr-x 2 u u 4096 .\n-rw-r--r-- 1 u u   12 notes.md", Duration: time.Second, Raw: "user"},
				{Kind: agent.KindToolStart, ToolID: "toolu_02Edit", Name: "Edit", Category: "edit", Input: `{"file_path":"/tmp/work/notes.md","old_string":"draft","new_string":"final"}`, Raw: "assistant"},
				{Kind: agent.KindToolEnd, ToolID: "toolu_02Edit", Name: "Edit", Category: "edit", Output: "<tool_use_error>File has not been read yet. Read it first before writing to it.</tool_use_error>", IsError: true, Duration: time.Second, Raw: "user"},
				{Kind: agent.KindMessage, Text: "Wrote out.txt.", Raw: "assistant"},
				{Kind: agent.KindUsage, Usage: successUsage, Raw: "result/success"},
			},
		},
		{
			name: "rate limit", scenario: "rate_limit", wantCode: 1,
			want: []agent.Event{
				{Kind: agent.KindRateLimit, Text: "five_hour limit rejected", ResetAt: time.Unix(1784238600, 0).UTC(), Raw: "rate_limit_event"},
				{Kind: agent.KindMessage, Text: limit, Raw: "assistant"},
				{Kind: agent.KindUsage, Usage: agent.Usage{Turns: 1}, Raw: "result/success"},
				{Kind: agent.KindRateLimit, Text: limit, ResetAt: time.Unix(1784238600, 0).UTC(), Raw: "result/success"},
				{Kind: agent.KindFailure, Text: limit, Raw: "result/success"},
			},
		},
		{
			name: "error", scenario: "error", wantCode: 1,
			want: []agent.Event{
				{Kind: agent.KindToolStart, ToolID: "toolu_03Bash", Name: "Bash", Category: "shell", Input: `{"command":"make test"}`, Raw: "assistant"},
				{Kind: agent.KindToolEnd, ToolID: "toolu_03Bash", Name: "Bash", Category: "shell", Output: "make: *** No rule to make target 'test'.  Stop.", IsError: true, Duration: time.Second, Raw: "user"},
				{Kind: agent.KindUsage, Usage: errUsage, Raw: "result/error_during_execution"},
				{Kind: agent.KindFailure, Text: "API Error: 500 Internal server error", Raw: "result/error_during_execution"},
			},
		},
		{
			name: "unknown", scenario: "unknown", wantCode: 0,
			want: []agent.Event{
				{Kind: agent.KindUnknown, Raw: "telemetry_blip"},
				{Kind: agent.KindUnknown, Raw: "invalid", Text: `{"type":"assistant","message":{"content":[{"type":"text","text":"partial`},
				{Kind: agent.KindMessage, Text: "Still here.", Raw: "assistant"},
				{Kind: agent.KindUsage, Usage: agent.Usage{InputTokens: 3, OutputTokens: 4, Turns: 1, CostUSD: 0.001}, Raw: "result/success"},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, code, out := runFakeClaude(t, tt.scenario, "Write out.txt")
			if code != tt.wantCode {
				t.Errorf("exit code = %d, want %d", code, tt.wantCode)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("observations:\n got %+v\nwant %+v", got, tt.want)
			}
			b, err := os.ReadFile(filepath.Join(out, "out.txt"))
			switch {
			case tt.wantFile && (err != nil || string(b) != "done\n"):
				t.Errorf("out.txt = %q, %v; want \"done\\n\"", b, err)
			case !tt.wantFile && err == nil:
				t.Errorf("out.txt written in scenario %s", tt.scenario)
			}
		})
	}
}
