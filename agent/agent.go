// Package agent turns the line-delimited JSON streams of agent command-line
// tools (Claude Code, Codex) into backend-neutral observations that loopbus
// records as events.
package agent

import (
	"time"
	"unicode/utf8"
)

// Kind is the kind of an Observation.
type Kind int

const (
	// KindUnknown is a line of a type we do not know (or malformed JSON): it is
	// ignored and counted by Raw, never fatal.
	KindUnknown Kind = iota
	// KindToolStart is a tool call that began (ToolID, Name, Category, Input).
	KindToolStart
	// KindToolEnd is a tool call that ended (ToolID, Name, Category, Output,
	// IsError, Duration if known).
	KindToolEnd
	// KindMessage is assistant/agent text (Text).
	KindMessage
	// KindUsage is token usage and/or cost (Usage).
	KindUsage
	// KindRateLimit is a usage or rate limit that was hit (Text, ResetAt if
	// known).
	KindRateLimit
	// KindFailure is a failed run (Text is the error message).
	KindFailure
	// KindResult is the final result (Text is the result text, IsError, Usage).
	KindResult
)

// Observation is what one line of an agent CLI's JSON stream means to loopbus.
// Only the fields listed for its Kind are meaningful.
type Observation struct {
	Kind   Kind
	ToolID string
	Name   string
	// Category is what kind of tool it is: "shell", "edit", "read", "web",
	// "mcp", "agent" or "other"; a LaneTable maps tools without an entry
	// to a lane by it.
	Category string
	Input    string // summary, at most MaxSummary bytes
	Output   string // summary, at most MaxSummary bytes
	IsError  bool
	Duration time.Duration
	Text     string // at most MaxSummary bytes
	Usage    Usage
	ResetAt  time.Time
	Raw      string // the line's "type" (and subtype), for counting unknowns
}

// Usage is token usage and cost as reported by an agent CLI; zero means not
// reported.
type Usage struct {
	InputTokens, OutputTokens, CacheReadTokens, CacheWriteTokens int64
	CostUSD                                                      float64
}

// MaxSummary is the maximum size in bytes of Observation.Input, Output and Text.
const MaxSummary = 2000

// Parser turns the lines of one run into observations. It is not safe for
// concurrent use.
type Parser interface {
	// Line parses one line (without the newline). Blank lines give nil.
	// Malformed JSON gives one KindUnknown observation, never an error.
	Line(line []byte) []Observation
}

// truncate cuts s to at most MaxSummary bytes on a rune boundary.
func truncate(s string) string {
	if len(s) <= MaxSummary {
		return s
	}
	cut := MaxSummary
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut]
}
