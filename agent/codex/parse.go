package codex

// The Codex parser reads the JSONL stream of `codex exec --json` (the
// "experimental JSON" format of the Rust CLI). Format sources:
//
//   - github.com/openai/codex, codex-rs/exec/src/exec_events.rs: ThreadEvent
//     ("thread.started", "turn.started", "turn.completed" {usage:
//     input_tokens, cached_input_tokens, output_tokens}, "turn.failed" {error:
//     {message}}, "item.started", "item.updated", "item.completed",
//     "item.plan.delta", "request_user_input", "error" {message}) and the item
//     payloads (agent_message, plan, reasoning, command_execution {command,
//     aggregated_output, exit_code, status}, file_change {changes: [{path,
//     kind}], status}, mcp_tool_call {server, tool, arguments, result, error,
//     status}, collab_tool_call, web_search {query}, todo_list, error).
//   - codex-rs/exec/src/event_processor_with_jsonl_output.rs: which events
//     are emitted when; usage is the thread total; a non-retried error gives
//     an "error" line and then "turn.failed" with the same message; retries
//     are also reported as "error" lines ("Reconnecting... n/m").
//   - codex-rs/exec/src/cli.rs: the prompt is read from stdin when the
//     PROMPT argument is "-" (or omitted); --json (alias
//     --experimental-json); --model is a global option.
//   - codex-rs/exec/src/lib.rs: the process exits 1 when a fatal error was
//     seen or the turn failed.
//   - codex-rs/core/src/error.rs (UsageLimitReachedError): "You've hit your
//     usage limit. ... Try again at 3:28 PM." (local time, today) or "... try
//     again at Aug 8th, 2026 12:30 PM." or "Try again later."; older releases
//     said "try again in 3 days 6 hours 57 minutes".

import (
	"bytes"
	"encoding/json"
	"errors"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/loopbus/loopbus/agent"
)

// NewParser returns a Parser for the lines of one `codex exec --json` run.
// Tool items are matched by item id; an item seen only as completed (file
// changes) gives a start and an end; turn.completed gives a KindUsage; a
// fatal error gives a KindFailure (plus a KindRateLimit for usage, quota and
// rate limits) once, although Codex prints it in "error" and "turn.failed".
// now times tool calls (from an item's first line to its item.completed)
// and resolves the local wall-clock reset times of usage-limit messages;
// nil means time.Now.
func NewParser(now func() time.Time) agent.Parser {
	if now == nil {
		now = time.Now
	}
	return &codexParser{now: now, started: map[string]time.Time{}}
}

// codexParser keeps the start time of open tool items (for durations and to
// synthesise a start for items seen only as completed) and the last fatal
// error (Codex repeats it in turn.failed).
type codexParser struct {
	now       func() time.Time
	started   map[string]time.Time
	lastError string
}

// codexEvent is the union of the top-level line shapes we read.
type codexEvent struct {
	Type    string          `json:"type"`
	Item    json.RawMessage `json:"item"`
	Usage   *codexUsage     `json:"usage"`
	Error   *codexError     `json:"error"`
	Message string          `json:"message"`
}

type codexUsage struct {
	InputTokens           int64 `json:"input_tokens"`
	CachedInputTokens     int64 `json:"cached_input_tokens"`
	CacheWriteInputTokens int64 `json:"cache_write_input_tokens"`
	OutputTokens          int64 `json:"output_tokens"`
	ReasoningOutputTokens int64 `json:"reasoning_output_tokens"`
}

type codexError struct {
	Message string `json:"message"`
}

// codexItem is the union of the item payloads we read.
type codexItem struct {
	ID               string `json:"id"`
	Type             string `json:"type"`
	Text             string `json:"text"`
	Command          string `json:"command"`
	AggregatedOutput string `json:"aggregated_output"`
	ExitCode         *int   `json:"exit_code"`
	Status           string `json:"status"`
	Changes          []struct {
		Path string `json:"path"`
		Kind string `json:"kind"`
	} `json:"changes"`
	Server    string          `json:"server"`
	Tool      string          `json:"tool"`
	Arguments json.RawMessage `json:"arguments"`
	Result    *struct {
		Content           []json.RawMessage `json:"content"`
		StructuredContent json.RawMessage   `json:"structured_content"`
	} `json:"result"`
	Error  *codexError `json:"error"`
	Query  string      `json:"query"`
	Prompt string      `json:"prompt"`
}

// Line implements agent.Parser.
func (p *codexParser) Line(line []byte) []agent.Event {
	if len(strings.TrimSpace(string(line))) == 0 {
		return nil
	}
	var ev codexEvent
	if err := codexUnmarshal(line, &ev); err != nil || ev.Type == "" {
		return []agent.Event{{Kind: agent.KindUnknown, Raw: "invalid", Text: agent.Truncate(string(line))}}
	}
	switch ev.Type {
	case "thread.started", "turn.started", "item.plan.delta", "request_user_input":
		// Known, but nothing loopbus records.
		return nil
	case "turn.completed":
		var u codexUsage
		if ev.Usage != nil {
			u = *ev.Usage
		}
		return []agent.Event{{Kind: agent.KindUsage, Raw: ev.Type, Usage: agent.Usage{
			// Codex counts cached tokens (read and written) inside
			// input_tokens, and reasoning tokens inside output_tokens;
			// loopbus keeps the cached ones apart so that
			// Input+CacheRead+CacheWrite is the whole prompt.
			InputTokens:      max(u.InputTokens-u.CachedInputTokens-u.CacheWriteInputTokens, 0),
			CacheReadTokens:  u.CachedInputTokens,
			CacheWriteTokens: u.CacheWriteInputTokens,
			OutputTokens:     u.OutputTokens,
			ReasoningTokens:  u.ReasoningOutputTokens,
		}}}
	case "turn.failed":
		msg := "turn failed"
		if ev.Error != nil && ev.Error.Message != "" {
			msg = ev.Error.Message
		}
		if msg == p.lastError {
			// Already reported by the "error" line just before.
			return nil
		}
		return p.failure(ev.Type, msg)
	case "error":
		if strings.HasPrefix(ev.Message, "Reconnecting...") {
			// A failed request that Codex retries by itself ("Reconnecting...
			// 2/5 (... last status: 429 Too Many Requests)").
			return []agent.Event{{Kind: agent.KindRetry, Raw: ev.Type, Text: agent.Truncate(ev.Message)}}
		}
		p.lastError = ev.Message
		return p.failure(ev.Type, ev.Message)
	case "item.started", "item.updated", "item.completed":
		var it codexItem
		if err := codexUnmarshal(ev.Item, &it); err != nil || it.Type == "" {
			return []agent.Event{{Kind: agent.KindUnknown, Raw: ev.Type}}
		}
		return p.item(ev.Type, it)
	default:
		return []agent.Event{{Kind: agent.KindUnknown, Raw: ev.Type}}
	}
}

// codexUnmarshal is json.Unmarshal that tolerates a field of an unexpected
// type: that field stays zero and the rest of the line is still usable.
func codexUnmarshal(data []byte, v any) error {
	err := json.Unmarshal(data, v)
	var typeErr *json.UnmarshalTypeError
	if errors.As(err, &typeErr) {
		return nil
	}
	return err
}

// failure reports a fatal error, and a rate limit too when it is one.
func (p *codexParser) failure(raw, msg string) []agent.Event {
	obs := []agent.Event{{Kind: agent.KindFailure, Raw: raw, Text: agent.Truncate(msg)}}
	if codexIsLimit(msg) {
		obs = append(obs, agent.Event{Kind: agent.KindRateLimit, Raw: raw, Text: agent.Truncate(msg), ResetAt: codexResetAt(msg, p.now())})
	}
	return obs
}

// item maps one item event.
func (p *codexParser) item(evType string, it codexItem) []agent.Event {
	raw := evType + "/" + it.Type
	switch it.Type {
	case "agent_message", "plan":
		if evType != "item.completed" {
			return nil
		}
		return []agent.Event{{Kind: agent.KindMessage, Raw: raw, Text: agent.Truncate(it.Text)}}
	case "reasoning", "todo_list", "error":
		// Known: reasoning summaries, the to-do list and non-fatal warnings
		// are not recorded.
		return nil
	case "command_execution", "file_change", "mcp_tool_call", "web_search", "collab_tool_call":
	default:
		return []agent.Event{{Kind: agent.KindUnknown, Raw: raw}}
	}

	start := agent.Event{Kind: agent.KindToolStart, Raw: raw, ToolID: it.ID}
	switch it.Type {
	case "command_execution":
		start.Category, start.Name, start.Input = "shell", "shell", it.Command
	case "file_change":
		var b strings.Builder
		for i, c := range it.Changes {
			if i > 0 {
				b.WriteByte('\n')
			}
			b.WriteString(c.Kind + " " + c.Path)
		}
		start.Category, start.Name, start.Input = "edit", "file_change", b.String()
	case "mcp_tool_call":
		start.Category, start.Name, start.Input = "mcp", it.Server+"/"+it.Tool, codexCompact(it.Arguments)
	case "web_search":
		start.Category, start.Name, start.Input = "web", "web_search", it.Query
	case "collab_tool_call":
		start.Category, start.Name, start.Input = "agent", it.Tool, it.Prompt
	}
	start.Input = agent.Truncate(start.Input)

	begun, seen := p.started[it.ID]
	if evType != "item.completed" {
		if seen {
			// Progress on an open item (or a repeated start).
			return nil
		}
		p.started[it.ID] = p.now()
		return []agent.Event{start}
	}

	delete(p.started, it.ID)
	end := start
	end.Kind, end.Input = agent.KindToolEnd, ""
	if seen {
		end.Duration = p.now().Sub(begun)
	}
	switch it.Type {
	case "command_execution":
		end.Output = it.AggregatedOutput
		if it.ExitCode != nil {
			end.ExitCode = *it.ExitCode
		}
		end.IsError = end.ExitCode != 0 || codexFailedStatus(it.Status)
	case "mcp_tool_call":
		end.Output = codexMCPOutput(it)
		end.IsError = it.Error != nil || codexFailedStatus(it.Status)
	case "file_change", "collab_tool_call":
		end.Output = it.Status
		end.IsError = codexFailedStatus(it.Status)
	}
	end.Output = agent.Truncate(end.Output)
	if seen {
		return []agent.Event{end}
	}
	// Codex may emit an item only once it completed (file changes do):
	// report its start too so every end has a start.
	return []agent.Event{start, end}
}

func codexFailedStatus(s string) bool {
	return s == "failed" || s == "declined"
}

// codexMCPOutput summarises an MCP result: its error, else the text of its
// content blocks, else its structured content.
func codexMCPOutput(it codexItem) string {
	if it.Error != nil {
		return it.Error.Message
	}
	if it.Result == nil {
		return ""
	}
	var parts []string
	for _, c := range it.Result.Content {
		var block struct {
			Type string `json:"type"`
			Text string `json:"text"`
		}
		if json.Unmarshal(c, &block) == nil && block.Type == "text" {
			parts = append(parts, block.Text)
		} else {
			parts = append(parts, codexCompact(c))
		}
	}
	if len(parts) == 0 {
		return codexCompact(it.Result.StructuredContent)
	}
	return strings.Join(parts, "\n")
}

// codexCompact renders raw JSON on one line; null and absent give "".
func codexCompact(raw json.RawMessage) string {
	s := strings.TrimSpace(string(raw))
	if s == "" || s == "null" {
		return ""
	}
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		return s
	}
	return b.String()
}

// codexLimitMarkers are lower-case fragments of Codex's usage, quota and
// rate-limit error messages (core/src/error.rs and HTTP 429 texts).
var codexLimitMarkers = []string{
	"usage limit",
	"quota exceeded",
	"rate limit",
	"too many requests",
	"last status: 429",
}

func codexIsLimit(msg string) bool {
	m := strings.ToLower(msg)
	for _, marker := range codexLimitMarkers {
		if strings.Contains(m, marker) {
			return true
		}
	}
	return false
}

var (
	// "try again at 3:28 PM" (today) or "try again at Aug 8th, 2026 12:30 PM".
	codexAtRe = regexp.MustCompile(`(?i)try again at ((?:[A-Z][a-z]{2} \d{1,2}(?:st|nd|rd|th)?, \d{4} )?\d{1,2}:\d{2} ?[AP]M)`)
	// "try again in 3 days 6 hours 57 minutes" / "in 20s" / "in 1.5 seconds".
	codexInRe   = regexp.MustCompile(`(?i)try again in ((?:\d+(?:\.\d+)?\s*[a-z]+[\s,]*(?:and\s+)?)+)`)
	codexPartRe = regexp.MustCompile(`(?i)(\d+(?:\.\d+)?)\s*([a-z]+)`)
	codexOrdRe  = regexp.MustCompile(`(\d)(?:st|nd|rd|th),`)
)

// codexResetAt derives when a limit resets from Codex's message; Codex
// prints local wall-clock times, read in now's location. Zero when the
// message gives no time.
func codexResetAt(msg string, now time.Time) time.Time {
	if m := codexAtRe.FindStringSubmatch(msg); m != nil {
		s := strings.ReplaceAll(strings.ToUpper(m[1][len(m[1])-2:]), " ", "")
		body := strings.TrimSpace(m[1][:len(m[1])-2])
		if strings.Contains(body, ",") {
			body = codexOrdRe.ReplaceAllString(body, "$1,")
			if t, err := time.ParseInLocation("Jan 2, 2006 3:04 PM", body+" "+s, now.Location()); err == nil {
				return t
			}
			return time.Time{}
		}
		if t, err := time.ParseInLocation("3:04 PM", body+" "+s, now.Location()); err == nil {
			// A time of day without a date: the next such time (Codex
			// names a later day by its date, but the clocks may differ).
			y, mo, d := now.Date()
			at := time.Date(y, mo, d, t.Hour(), t.Minute(), 0, 0, now.Location())
			if !at.After(now) {
				at = at.AddDate(0, 0, 1)
			}
			return at
		}
		return time.Time{}
	}
	if m := codexInRe.FindStringSubmatch(msg); m != nil {
		var total time.Duration
		for _, part := range codexPartRe.FindAllStringSubmatch(m[1], -1) {
			n, err := strconv.ParseFloat(part[1], 64)
			if err != nil {
				return time.Time{}
			}
			unit := codexUnit(strings.ToLower(part[2]))
			if unit == 0 {
				continue
			}
			total += time.Duration(n * float64(unit))
		}
		if total > 0 {
			return now.Add(total)
		}
	}
	return time.Time{}
}

// codexUnit maps a unit word to its length; 0 for words that are not units.
func codexUnit(u string) time.Duration {
	switch u {
	case "d", "day", "days":
		return 24 * time.Hour
	case "h", "hr", "hrs", "hour", "hours":
		return time.Hour
	case "m", "min", "mins", "minute", "minutes":
		return time.Minute
	case "s", "sec", "secs", "second", "seconds":
		return time.Second
	case "ms":
		return time.Millisecond
	}
	return 0
}
