package tui

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/loopbus/loopbus/projections"
	"github.com/loopbus/loopbus/schemas"
)

// SessionState is the session's status for people: "stopped: reason",
// "stopped by the budget: reason", "paused: reason" or the plain status
// (a failure's reason is the manifest's Error).
func SessionState(m *projections.Manifest) string {
	s := m.Status
	if h := m.Hold; h != nil && (s == projections.StatusStopped || s == projections.StatusPaused) {
		if strings.HasPrefix(h.Reason, s) {
			return h.Reason // "stopped by signal: …" says it all
		}
		if h.Kind == schemas.StopBudget {
			s += " by the budget"
		}
		if h.Reason != "" {
			s += ": " + h.Reason
		}
	}
	return s
}

// StepState is a step's status for people: "waiting until 15:04:05 (usage
// limit)", "paused: reason", "stopped: reason", "breaker open: reason", or
// the plain status. Wait times on another day than now show the date.
func StepState(st *projections.StepView, now time.Time) string {
	withReason := func(s string) string {
		if st.Hold != nil && st.Hold.Reason != "" {
			return s + ": " + st.Hold.Reason
		}
		return s
	}
	switch st.Status {
	case projections.StepStatusWaiting:
		if st.Wait == nil {
			return "waiting"
		}
		s := "waiting until " + Clock(st.Wait.Until, now)
		if st.Wait.Reason != "" {
			s += " (" + st.Wait.Reason + ")"
		}
		return s
	case projections.StepStatusPaused:
		return withReason("paused")
	case projections.StepStatusStopped:
		return withReason("stopped")
	case projections.StepStatusBreaker:
		return withReason("breaker open")
	case projections.StepStatusAwaitingApproval:
		s := "awaiting approval"
		if a := st.Approval; a != nil && a.Until != nil {
			s += " until " + Clock(*a.Until, now)
			if a.OnTimeout != "" {
				s += " (then " + a.OnTimeout + ")"
			}
		}
		return s
	}
	return st.Status
}

// stepDetail is what else matters about a step: its error, where it
// runs, its last feedback while unfinished, cancelled jobs,
// invalidations and hints.
func stepDetail(st *projections.StepView) string {
	var parts []string
	switch {
	case st.ErrorMessage != "":
		parts = append(parts, st.ErrorMessage)
	case st.Status == projections.StepStatusInProgress && st.Worker != "":
		parts = append(parts, "on "+st.Worker)
	case st.Imported:
		parts = append(parts, "imported (its agent did not run)")
	}
	if n := st.CancelledJobs; n > 0 {
		parts = append(parts, Plural(n, "job")+" cancelled")
	}
	if n := st.Invalidations; n > 0 {
		s := "invalidated"
		if n > 1 {
			s += fmt.Sprintf(" %d times", n)
		}
		if inv := st.LastInvalidation; inv != nil && inv.Cause != "" {
			s += " (by " + inv.Cause + ")"
		}
		parts = append(parts, s)
	}
	if n := st.HintsDelivered; n > 0 {
		parts = append(parts, Plural(n, "hint")+" delivered")
	}
	if st.ErrorMessage == "" && st.LastFeedback != "" && st.Status != projections.StepStatusCompleted {
		parts = append(parts, "last feedback: "+st.LastFeedback)
	}
	return strings.Join(parts, "; ")
}

// iterations is "used/limit", or the count used when the limit is unknown.
func iterations(st *projections.StepView) string {
	if st.MaxIterations > 0 {
		return fmt.Sprintf("%d/%d", st.Iterations, st.MaxIterations)
	}
	return strconv.Itoa(st.Iterations)
}

// costLine is "$0.12 of $0.50" (without a cost budget, the cost alone);
// empty when there is neither cost nor a cost budget.
func costLine(m *projections.Manifest) string {
	var cost float64
	if m.Usage != nil {
		cost = m.Usage.CostUSD
	}
	limit := 0.0
	if m.Budget != nil {
		limit = m.Budget.MaxCostUSD
	}
	switch {
	case limit > 0:
		return Money(cost) + " of " + Money(limit)
	case cost != 0:
		return Money(cost)
	}
	return ""
}

// tokenLine is "12,345 in, 2,345 out (14,690 of 100,000)"; empty without
// usage or a token budget.
func tokenLine(m *projections.Manifest) string {
	var u schemas.Usage
	if m.Usage != nil {
		u = *m.Usage
	}
	limit := int64(0)
	if m.Budget != nil {
		limit = m.Budget.MaxTokens
	}
	if u.InputTokens == 0 && u.OutputTokens == 0 && limit == 0 {
		return ""
	}
	s := Thousands(u.InputTokens) + " in, " + Thousands(u.OutputTokens) + " out"
	if limit > 0 {
		s += " (" + Thousands(u.InputTokens+u.OutputTokens) + " of " + Thousands(limit) + ")"
	}
	return s
}

// budgetText is the session's budget: "$0.50, 100,000 tokens, 12 runs".
func budgetText(m *projections.Manifest) string {
	if m == nil || m.Budget == nil {
		return ""
	}
	var parts []string
	if b := m.Budget; b.MaxCostUSD > 0 {
		parts = append(parts, Money(b.MaxCostUSD))
	}
	if b := m.Budget; b.MaxTokens > 0 {
		parts = append(parts, Thousands(b.MaxTokens)+" tokens")
	}
	if b := m.Budget; b.MaxIterations > 0 {
		parts = append(parts, Plural(b.MaxIterations, "run"))
	}
	return strings.Join(parts, ", ")
}

// signalName is the verb, with the step it targets: "stop", "hint ideas".
func signalName(sg projections.SignalView) string {
	if sg.Step != "" {
		return schemas.SignalName(sg.Signal) + " " + sg.Step
	}
	return schemas.SignalName(sg.Signal)
}

// signalText is an info signal's message, else the signal's reason.
func signalText(sg projections.SignalView) string {
	if sg.Message != "" {
		return sg.Message
	}
	return sg.Reason
}

// signalAnswer is "applied: detail", "ignored: detail", or "not
// acknowledged yet".
func signalAnswer(sg projections.SignalView) string {
	if sg.Result == "" {
		return "not acknowledged yet"
	}
	if sg.Detail != "" {
		return sg.Result + ": " + sg.Detail
	}
	return sg.Result
}

// Clock is t on the local clock, "15:04:05", with the date when t falls on
// another day than ref: "2006-01-02 15:04:05".
func Clock(t, ref time.Time) string {
	t, ref = t.Local(), ref.Local()
	y, m, d := t.Date()
	if ry, rm, rd := ref.Date(); y != ry || m != rm || d != rd {
		return t.Format("2006-01-02 15:04:05")
	}
	return t.Format("15:04:05")
}

// Duration rounds d for people: 850ms, 41.3s, 2m05s, 1h02m.
func Duration(d time.Duration) string {
	switch {
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		return d.Round(100 * time.Millisecond).String()
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	}
	return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
}

// Money is a dollar amount with two decimals, more for small amounts (at
// most four, trailing zeros beyond two dropped): $0.50, $0.105, $0.0312,
// $12.40.
func Money(c float64) string {
	prec := 2
	switch a := math.Abs(c); {
	case a == 0 || a >= 1:
	case a >= 0.1:
		prec = 3
	default:
		prec = 4
	}
	s := strconv.FormatFloat(c, 'f', prec, 64)
	for prec > 2 && strings.HasSuffix(s, "0") {
		s, prec = s[:len(s)-1], prec-1
	}
	return "$" + s
}

// Thousands writes n with comma separators: 12,345.
func Thousands(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, r := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(r)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// ShortTokens writes a token count compactly: 830, 5.1k, 2.3M.
func ShortTokens(n int64) string {
	switch a := max(n, -n); {
	case a >= 1_000_000:
		return strconv.FormatFloat(float64(n)/1e6, 'f', 1, 64) + "M"
	case a >= 1000:
		return strconv.FormatFloat(float64(n)/1e3, 'f', 1, 64) + "k"
	}
	return strconv.FormatInt(n, 10)
}

// Plural is the count with its noun: "1 job", "2 jobs" (the noun takes an
// s for any count but 1).
func Plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return strconv.Itoa(n) + " " + noun + "s"
}

// OneLine folds s into one line (runs of white space, newlines included,
// become one space) of at most n runes, ending with "…" when cut.
func OneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:max(n-1, 0)]) + "…"
}

// OrDash is s, or "-" when s is empty.
func OrDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// cut shortens line to width runes, ending with "…" when cut.
func cut(line string, width int) string {
	if width <= 0 || utf8.RuneCountInString(line) <= width {
		return line
	}
	r := []rune(line)
	return string(r[:width-1]) + "…"
}
