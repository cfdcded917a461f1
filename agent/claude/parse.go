package claude

// Parser for Claude Code's `claude -p --output-format stream-json --verbose`.
//
// The format is not formally specified; this follows public descriptions and
// captured streams:
//   - Claude Code CLI reference and headless mode docs (code.claude.com/docs):
//     -p/--print reads the prompt from stdin when no prompt argument is given,
//     stream-json with -p requires --verbose, flags --model, --permission-mode,
//     --allowedTools (alias --allowed-tools).
//   - Agent SDK message types (SDKSystemMessage, SDKAssistantMessage,
//     SDKUserMessage, SDKResultMessage with subtype success | error_max_turns |
//     error_during_execution | error_max_budget_usd |
//     error_max_structured_output_retries, total_cost_usd, usage,
//     SDKRateLimitEvent with rate_limit_info.status allowed | allowed_warning |
//     rejected and resetsAt in Unix seconds).
//   - Captured lines in github.com/humanlayer/humanlayer (claudecode-go),
//     github.com/littlebearapps/untether (stream-json cheatsheet) and
//     github.com/link-assistant/hive-mind (JSON examples).
//   - Usage-limit shapes: github.com/anthropics/claude-code issues #18663,
//     #21111, #49640 ("You've hit your limit · resets 1pm (Europe/Lisbon)",
//     rate_limit_event interleaving), the older "Claude AI usage limit
//     reached|<epoch>" result text, and a captured 5-hour cutoff: a
//     rate_limit_event with status "rejected", an assistant message with
//     "error":"rate_limit", then a result with subtype "success", is_error
//     true, api_error_status 429 and the limit text.

import (
	"bytes"
	"encoding/json"
	"errors"
	"regexp"
	"strconv"
	"strings"
	"time"
	_ "time/tzdata" // reset texts name IANA zones; hosts may lack a zoneinfo database

	"github.com/loopbus/loopbus/agent"
)

// NewParser returns a Parser for the lines of one `claude -p --output-format
// stream-json --verbose` run. Tool results are matched to their tool_use by
// id; a result's token usage and total_cost_usd become a KindUsage, an
// error result a KindFailure; a usage limit may be reported twice (by a
// rejected rate_limit_event and by the error result that follows it). now
// times tool calls (from the tool_use line to its tool_result line) and
// resolves "resets 3pm (Zone)" texts; nil means time.Now.
func NewParser(now func() time.Time) agent.Parser {
	if now == nil {
		now = time.Now
	}
	return &claudeParser{now: now, tools: map[string]claudeTool{}}
}

type claudeTool struct {
	name, category string
	started        time.Time
}

type claudeParser struct {
	now   func() time.Time
	tools map[string]claudeTool // open tool calls by tool_use id
	// rejectedReset is the resetsAt of the last rejected rate_limit_event, so
	// the limit result that follows (whose text has no date) gets a ResetAt.
	rejectedReset time.Time
	// retryDelay is the wait of the last system/api_retry line that
	// retried a 429: Claude Code's own estimate (Retry-After, or its
	// backoff) of when the API takes requests again.
	retryDelay time.Duration
	// apiStatus is the HTTP status of the API error an assistant line
	// reported (api_error_status), 0 if none.
	apiStatus int
}

// claudeLine is the union of the top-level fields we read.
type claudeLine struct {
	Type         string          `json:"type"`
	Subtype      string          `json:"subtype"`
	Message      json.RawMessage `json:"message"`
	IsError      bool            `json:"is_error"`
	Result       string          `json:"result"`
	Errors       []string        `json:"errors"`
	TotalCostUSD float64         `json:"total_cost_usd"`
	Usage        claudeUsage     `json:"usage"`
	// ModelUsage is a result's usage by model.
	ModelUsage     map[string]claudeModelUsage `json:"modelUsage"`
	NumTurns       int64                       `json:"num_turns"`
	TerminalReason string                      `json:"terminal_reason"`
	// APIErrorStatus is the HTTP status of the API error that ended the
	// turn (assistant and result lines); Error its kind ("rate_limit").
	APIErrorStatus int    `json:"api_error_status"`
	Error          string `json:"error"`
	// api_retry lines: attempt of max_retries, the wait before it, and
	// the status and kind of the error retried.
	Attempt       int   `json:"attempt"`
	MaxRetries    int   `json:"max_retries"`
	RetryDelayMs  int64 `json:"retry_delay_ms"`
	ErrorStatus   int   `json:"error_status"`
	RateLimitInfo *struct {
		Status        string `json:"status"`
		ResetsAt      int64  `json:"resetsAt"`
		RateLimitType string `json:"rateLimitType"`
	} `json:"rate_limit_info"`
}

type claudeUsage struct {
	InputTokens              int64 `json:"input_tokens"`
	OutputTokens             int64 `json:"output_tokens"`
	CacheReadInputTokens     int64 `json:"cache_read_input_tokens"`
	CacheCreationInputTokens int64 `json:"cache_creation_input_tokens"`
	OutputTokensDetails      *struct {
		ThinkingTokens int64 `json:"thinking_tokens"`
	} `json:"output_tokens_details"`
}

// claudeModelUsage is one model's entry in a result's modelUsage.
type claudeModelUsage struct {
	InputTokens              int64   `json:"inputTokens"`
	OutputTokens             int64   `json:"outputTokens"`
	CacheReadInputTokens     int64   `json:"cacheReadInputTokens"`
	CacheCreationInputTokens int64   `json:"cacheCreationInputTokens"`
	ThinkingTokens           int64   `json:"thinkingTokens"`
	CostUSD                  float64 `json:"costUSD"`
}

type claudeMessage struct {
	// Content is an array of blocks, or a plain string for user prompts.
	Content json.RawMessage `json:"content"`
}

type claudeBlock struct {
	Type      string          `json:"type"`
	Text      string          `json:"text"`
	ID        string          `json:"id"`
	Name      string          `json:"name"`
	Input     json.RawMessage `json:"input"`
	ToolUseID string          `json:"tool_use_id"`
	Content   json.RawMessage `json:"content"`
	IsError   bool            `json:"is_error"`
}

// Line implements agent.Parser.
func (p *claudeParser) Line(line []byte) []agent.Event {
	line = bytes.TrimSpace(line)
	if len(line) == 0 {
		return nil
	}
	var l claudeLine
	err := json.Unmarshal(line, &l)
	var typeErr *json.UnmarshalTypeError
	if errors.As(err, &typeErr) {
		// A field of an unexpected type is left zero; the rest is still usable.
		err = nil
	}
	if err != nil || l.Type == "" {
		return []agent.Event{{Kind: agent.KindUnknown, Raw: "invalid", Text: agent.Truncate(string(line))}}
	}
	raw := l.Type
	if l.Subtype != "" {
		raw += "/" + l.Subtype
	}
	switch l.Type {
	case "assistant":
		return p.assistant(l, raw)
	case "user":
		return p.user(l, raw)
	case "result":
		return p.result(l, raw)
	case "rate_limit_event":
		return p.rateLimit(l, raw)
	case "system":
		if l.Subtype == "api_retry" {
			return p.retry(l, raw)
		}
		// init, hooks, compaction: informational only.
		return nil
	case "stream_event":
		// Partial-message deltas: the whole message follows.
		return nil
	}
	return []agent.Event{{Kind: agent.KindUnknown, Raw: raw}}
}

// blocks returns the content blocks of a message, or nil if the content is a
// plain string or absent.
func claudeBlocks(msg json.RawMessage) ([]claudeBlock, bool) {
	var m claudeMessage
	if len(msg) == 0 || json.Unmarshal(msg, &m) != nil {
		return nil, false
	}
	var bs []claudeBlock
	if len(m.Content) == 0 || m.Content[0] != '[' {
		return nil, true
	}
	if json.Unmarshal(m.Content, &bs) != nil {
		return nil, false
	}
	return bs, true
}

// retry reports an api_retry line: Claude Code retries a failed request
// by itself, up to max_retries times.
func (p *claudeParser) retry(l claudeLine, raw string) []agent.Event {
	why := l.Error
	if l.ErrorStatus != 0 {
		why = strings.TrimSpace(strconv.Itoa(l.ErrorStatus) + " " + why)
	}
	if why == "" {
		why = "an API error"
	}
	delay := time.Duration(l.RetryDelayMs) * time.Millisecond
	if l.ErrorStatus == 429 || l.Error == "rate_limit" {
		p.retryDelay = delay
	}
	text := "the API answered " + why + ": retry " + strconv.Itoa(l.Attempt)
	if l.MaxRetries > 0 {
		text += " of " + strconv.Itoa(l.MaxRetries)
	}
	text += " in " + delay.Round(100*time.Millisecond).String()
	return []agent.Event{{Kind: agent.KindRetry, Text: text, Raw: raw}}
}

func (p *claudeParser) assistant(l claudeLine, raw string) []agent.Event {
	if l.APIErrorStatus != 0 {
		// A synthetic message that reports the API error ending the turn.
		p.apiStatus = l.APIErrorStatus
	}
	bs, ok := claudeBlocks(l.Message)
	if !ok {
		return []agent.Event{{Kind: agent.KindUnknown, Raw: raw}}
	}
	var obs []agent.Event
	var now time.Time
	for _, b := range bs {
		switch b.Type {
		case "text":
			if strings.TrimSpace(b.Text) != "" {
				obs = append(obs, agent.Event{Kind: agent.KindMessage, Text: agent.Truncate(b.Text), Raw: raw})
			}
		case "tool_use":
			if now.IsZero() {
				now = p.now()
			}
			category := category(b.Name)
			p.tools[b.ID] = claudeTool{name: b.Name, category: category, started: now}
			obs = append(obs, agent.Event{
				Kind: agent.KindToolStart, ToolID: b.ID, Name: b.Name, Category: category,
				Input: agent.Truncate(claudeCompact(b.Input)), Raw: raw,
			})
		}
		// thinking and other block kinds carry nothing loopbus records.
	}
	return obs
}

func (p *claudeParser) user(l claudeLine, raw string) []agent.Event {
	bs, ok := claudeBlocks(l.Message)
	if !ok {
		return []agent.Event{{Kind: agent.KindUnknown, Raw: raw}}
	}
	var obs []agent.Event
	var now time.Time
	for _, b := range bs {
		if b.Type != "tool_result" {
			continue // echoed prompt text and the like
		}
		if now.IsZero() {
			now = p.now()
		}
		text := claudeResultText(b.Content)
		o := agent.Event{
			Kind: agent.KindToolEnd, ToolID: b.ToolUseID, IsError: b.IsError,
			Output: agent.Truncate(text), Raw: raw,
		}
		if t, ok := p.tools[b.ToolUseID]; ok {
			o.Name, o.Category = t.name, t.category
			if t.category == "shell" && b.IsError {
				o.ExitCode = claudeExitCode(text)
			}
			if d := now.Sub(t.started); d > 0 {
				o.Duration = d
			}
			delete(p.tools, b.ToolUseID)
		}
		obs = append(obs, o)
	}
	return obs
}

func (p *claudeParser) result(l claudeLine, raw string) []agent.Event {
	u := agent.Usage{
		InputTokens:      l.Usage.InputTokens,
		OutputTokens:     l.Usage.OutputTokens,
		CacheReadTokens:  l.Usage.CacheReadInputTokens,
		CacheWriteTokens: l.Usage.CacheCreationInputTokens,
		Turns:            l.NumTurns,
		CostUSD:          l.TotalCostUSD,
	}
	if d := l.Usage.OutputTokensDetails; d != nil {
		u.ReasoningTokens = d.ThinkingTokens
	}
	var models map[string]agent.Usage
	if len(l.ModelUsage) > 0 {
		models = make(map[string]agent.Usage, len(l.ModelUsage))
		for name, m := range l.ModelUsage {
			models[name] = agent.Usage{
				InputTokens: m.InputTokens, OutputTokens: m.OutputTokens,
				CacheReadTokens: m.CacheReadInputTokens, CacheWriteTokens: m.CacheCreationInputTokens,
				ReasoningTokens: m.ThinkingTokens, CostUSD: m.CostUSD,
			}
		}
	}
	status := l.APIErrorStatus
	if status == 0 {
		status = p.apiStatus
	}
	isErr := l.IsError || (l.Subtype != "" && l.Subtype != "success")
	text := l.Result
	if text == "" && len(l.Errors) > 0 {
		text = strings.Join(l.Errors, "; ")
	}
	var obs []agent.Event
	if l.TerminalReason != "" {
		obs = append(obs, agent.Event{Kind: agent.KindStop, Text: agent.Truncate(l.TerminalReason), Raw: raw})
	}
	if u != (agent.Usage{}) {
		obs = append(obs, agent.Event{Kind: agent.KindUsage, Usage: u, Models: models, Raw: raw})
	}
	// Only an error result counts as a limit: a successful answer may well
	// talk about usage limits.
	switch {
	case isErr && claudeLimitRe.MatchString(text):
		// An epoch in the text is exact; else the rejected event's resetsAt
		// beats a time of day read from the text.
		reset := claudeParseEpoch(text)
		if reset.IsZero() {
			reset = p.rejectedReset
		}
		if reset.IsZero() {
			reset = claudeParseReset(text, p.now())
		}
		obs = append(obs, agent.Event{Kind: agent.KindRateLimit, Text: agent.Truncate(text), ResetAt: reset, Raw: raw})
	case isErr && status == 429:
		// A rate limit Claude Code gave up retrying ("API Error: Request
		// rejected (429) · ..."): try again after its last wait, when it
		// retried (else the caller's default wait).
		var reset time.Time
		if p.retryDelay > 0 {
			reset = p.now().Add(p.retryDelay).UTC()
		}
		obs = append(obs, agent.Event{Kind: agent.KindRateLimit, Text: agent.Truncate(text), ResetAt: reset, Raw: raw})
	}
	if isErr {
		// The result text of a success is the last message again.
		obs = append(obs, agent.Event{Kind: agent.KindFailure, Text: agent.Truncate(text), Raw: raw})
	}
	return obs
}

func (p *claudeParser) rateLimit(l claudeLine, raw string) []agent.Event {
	info := l.RateLimitInfo
	if info == nil || info.Status != "rejected" {
		// "allowed" and "allowed_warning" are status reports, not hits.
		return nil
	}
	o := agent.Event{Kind: agent.KindRateLimit, Text: "rate limit rejected", Raw: raw}
	if info.RateLimitType != "" {
		o.Text = info.RateLimitType + " limit rejected"
	}
	if info.ResetsAt > 0 {
		o.ResetAt = time.Unix(info.ResetsAt, 0).UTC()
		p.rejectedReset = o.ResetAt
	}
	return []agent.Event{o}
}

// claudeCategories are Claude Code's built-in tools by category (see
// agent.Event.Category), as the init line of Claude Code 2.1 lists them
// and older releases named them. "internal" tools keep the agent's own
// state (its to-do list, scheduled wake-ups, findings): no files, no
// programs, no network.
var claudeCategories = map[string]string{
	"Bash": "shell", "BashOutput": "shell", "KillShell": "shell", "KillBash": "shell",
	"Monitor": "shell", "PowerShell": "shell",
	"Edit": "edit", "Write": "edit", "MultiEdit": "edit", "NotebookEdit": "edit",
	"EnterWorktree": "edit", "ExitWorktree": "edit",
	"Read": "read", "Glob": "read", "Grep": "read", "LS": "read", "NotebookRead": "read",
	"ToolSearch": "read", "Skill": "read", "ListAgents": "read",
	"TaskGet": "read", "TaskList": "read", "CronList": "read",
	"WebFetch": "web", "WebSearch": "web",
	// The subagent tool was renamed from Task to Agent; Task names it
	// still in 2.1's tool list.
	"Task": "agent", "Agent": "agent", "SendMessage": "agent", "Workflow": "agent", "TaskStop": "agent",
	"TodoWrite": "internal", "TaskCreate": "internal", "TaskUpdate": "internal",
	"CronCreate": "internal", "CronDelete": "internal", "ScheduleWakeup": "internal",
	"ReportFindings": "internal", "EnterPlanMode": "internal", "ExitPlanMode": "internal",
}

// category maps a Claude Code tool name to its category (see
// agent.Event.Category): "other" for a tool this table does not know,
// which the lane table puts in the heavy lane.
func category(name string) string {
	if c, ok := claudeCategories[name]; ok {
		return c
	}
	if strings.HasPrefix(name, "mcp__") {
		return "mcp"
	}
	return "other"
}

// claudeExitRe is how Claude Code's Bash tool starts the result of a
// command that exited non-zero: "Exit code 3\n<output>".
var claudeExitRe = regexp.MustCompile(`^Exit code (-?\d+)\b`)

// claudeExitCode is the exit status a failed Bash result names, 0 if it
// names none (a tool error of another kind).
func claudeExitCode(text string) int {
	m := claudeExitRe.FindStringSubmatch(text)
	if m == nil {
		return 0
	}
	n, err := strconv.Atoi(m[1])
	if err != nil {
		return 0
	}
	return n
}

// claudeResultText flattens tool_result content: a string, or an array of
// blocks of which text blocks are kept.
func claudeResultText(c json.RawMessage) string {
	if len(c) == 0 {
		return ""
	}
	var s string
	if json.Unmarshal(c, &s) == nil {
		return s
	}
	var bs []claudeBlock
	if json.Unmarshal(c, &bs) != nil {
		return claudeCompact(c)
	}
	parts := make([]string, 0, len(bs))
	for _, b := range bs {
		switch b.Type {
		case "text":
			parts = append(parts, b.Text)
		default:
			parts = append(parts, "["+b.Type+"]")
		}
	}
	return strings.Join(parts, "\n")
}

func claudeCompact(j json.RawMessage) string {
	if len(j) == 0 {
		return ""
	}
	var b bytes.Buffer
	if json.Compact(&b, j) != nil {
		return string(j)
	}
	return b.String()
}

// claudeLimitRe matches the usage-limit texts Claude Code has printed over
// time: "Claude AI usage limit reached|<epoch>", "You've hit your limit ·
// resets 3pm (Zone)", "You've hit your session limit · resets 9:50pm (UTC)",
// "5-hour limit reached · resets 2pm".
var claudeLimitRe = regexp.MustCompile(`(?i)usage limit reached|hit your (?:[a-z-]+ )?limit|limit reached\s*[·∙•]\s*resets`)

var (
	claudeEpochRe = regexp.MustCompile(`limit reached\|(\d{9,13})`)
	// "resets 3pm (Europe/Lisbon)", "resets 3:30am (UTC)",
	// "resets Jan 21, 5am (Etc/GMT-9)", "resets Apr 23 at 4pm (America/Recife)".
	claudeResetRe = regexp.MustCompile(`(?i)resets\s+(?:([A-Z][a-z]{2})\s+(\d{1,2})(?:,|\s+at)?\s+)?(\d{1,2})(?::(\d{2}))?\s*(am|pm)\s*(?:\(([^)]+)\))?`)
)

// claudeParseEpoch returns the time of a "limit reached|<epoch>" text, or
// the zero time.
func claudeParseEpoch(text string) time.Time {
	m := claudeEpochRe.FindStringSubmatch(text)
	if m == nil {
		return time.Time{}
	}
	n, _ := strconv.ParseInt(m[1], 10, 64)
	if n > 1e12 { // milliseconds
		return time.UnixMilli(n).UTC()
	}
	return time.Unix(n, 0).UTC()
}

// claudeParseReset extracts the reset time from a usage-limit text, or the
// zero time. Times without a date are the next such time after now; a text
// without a zone is read in now's location.
func claudeParseReset(text string, now time.Time) time.Time {
	if t := claudeParseEpoch(text); !t.IsZero() {
		return t
	}
	m := claudeResetRe.FindStringSubmatch(text)
	if m == nil {
		return time.Time{}
	}
	loc := now.Location()
	if m[6] != "" {
		l, err := time.LoadLocation(strings.TrimSpace(m[6]))
		if err != nil {
			return time.Time{}
		}
		loc = l
	}
	hour, _ := strconv.Atoi(m[3])
	minute, _ := strconv.Atoi(m[4]) // "" gives 0
	if hour < 1 || hour > 12 || minute > 59 {
		return time.Time{}
	}
	hour %= 12
	if strings.EqualFold(m[5], "pm") {
		hour += 12
	}
	local := now.In(loc)
	if m[1] != "" {
		mon, err := time.Parse("Jan", m[1])
		if err != nil {
			return time.Time{}
		}
		day, _ := strconv.Atoi(m[2])
		t := time.Date(local.Year(), mon.Month(), day, hour, minute, 0, 0, loc)
		if t.Before(local.Add(-24 * time.Hour)) { // "Jan 2" seen in late December
			t = t.AddDate(1, 0, 0)
		}
		return t.UTC()
	}
	t := time.Date(local.Year(), local.Month(), local.Day(), hour, minute, 0, 0, loc)
	if !t.After(local) {
		t = t.AddDate(0, 0, 1)
	}
	return t.UTC()
}
