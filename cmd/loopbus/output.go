package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/loopbus/loopbus/client"
	"github.com/loopbus/loopbus/projections"
	"github.com/loopbus/loopbus/schemas"
	"github.com/rs/zerolog"
	"github.com/spf13/cobra"
)

func newDoctorCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "doctor",
		Short: "Check the NATS connection, stream, buckets, consumers and agent prerequisites",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := context.WithTimeout(cmd.Context(), 30*time.Second)
			defer cancel()
			print := func(c client.Check) {
				status := "ok  "
				if !c.OK {
					status = "FAIL"
				}
				fmt.Fprintf(g.stdout, "%s  %-22s %s\n", status, c.Name, c.Detail)
			}
			c, err := g.connect(ctx, "doctor", g.logger(zerolog.WarnLevel), false)
			if err != nil {
				print(client.Check{Name: "nats", Detail: err.Error()})
				return errFailed
			}
			defer c.close(g.stderr)
			where := "server at " + c.bus.ServerURL()
			if c.ownsServer() {
				where = "embedded on " + g.dataDir
			}
			failed := false
			checks := client.Doctor(ctx, c.bus, where)
			if g.natsURL == "" {
				dc := client.Check{Name: "data directory", OK: true, Detail: g.dataDir}
				if err := os.MkdirAll(g.dataDir, 0o700); err != nil {
					dc = client.Check{Name: "data directory", Detail: err.Error()}
				}
				checks = append(checks, dc)
			}
			for _, ch := range checks {
				print(ch)
				failed = failed || !ch.OK
			}
			if failed {
				return errFailed
			}
			return nil
		},
	}
}

// printManifest writes a manifest as indented JSON, or for people: the
// session with its state, cost against its budget and recent signals, then
// one line per step with its state, iterations, tokens and cost. now places
// wait times in the day.
func printManifest(w io.Writer, m *projections.Manifest, asJSON bool, now time.Time) error {
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(m)
	}
	fmt.Fprintf(w, "session   %s\npipeline  %s\nstatus    %s\nsource    %s\nupdated   %s (stream seq %d)\n",
		m.ContentID, m.Pipeline, sessionState(m), m.SourceHash, m.UpdatedAt.UTC().Format(time.RFC3339), m.LastSeq)
	if m.Kind == schemas.KindBacklog {
		fmt.Fprintf(w, "backlog   phase %s (the tasks: loopbus tasks %s)\n", orDash(m.Phase), m.ContentID)
	}
	if m.Error != "" {
		fmt.Fprintf(w, "error     %s\n", m.Error)
	}
	if s := costLine(m); s != "" {
		fmt.Fprintf(w, "cost      %s\n", s)
	}
	if s := tokenLine(m); s != "" {
		fmt.Fprintf(w, "tokens    %s\n", s)
	}
	if b := m.Budget; b != nil && b.MaxIterations > 0 {
		fmt.Fprintf(w, "runs      %d of %d\n", len(m.Jobs), b.MaxIterations)
	}
	fmt.Fprintln(w)
	// Tokens and cost columns only where agents report usage or a budget
	// bounds it.
	usage := m.Usage != nil || m.Budget != nil
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if usage {
		fmt.Fprintln(tw, "STEP\tSTATUS\tITER\tTOKENS IN/OUT\tCOST\tHASH\tDETAIL")
	} else {
		fmt.Fprintln(tw, "STEP\tSTATUS\tITER\tHASH\tDETAIL")
	}
	for _, name := range m.StepOrder {
		st := m.Steps[name]
		if st == nil {
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t", name, oneLine(stepState(st, now), 80), iterations(st))
		if usage {
			tokens, cost := "-", "-"
			if u := st.Usage; u != nil {
				tokens = shortTokens(u.InputTokens) + "/" + shortTokens(u.OutputTokens)
				cost = money(u.CostUSD)
			}
			fmt.Fprintf(tw, "%s\t%s\t", tokens, cost)
		}
		fmt.Fprintf(tw, "%s\t%s\n", st.ContentHash, oneLine(stepDetail(st), 100))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(m.Signals) > 0 {
		fmt.Fprintln(w, "\nsignals (newest last)")
		tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		for _, sg := range m.Signals[max(0, len(m.Signals)-5):] {
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", sg.At.Local().Format("15:04:05"), signalName(sg), oneLine(signalText(sg), 60), oneLine(signalAnswer(sg), 80))
		}
		return tw.Flush()
	}
	return nil
}

// sessionState is the session's status for people: "stopped: reason",
// "stopped by the budget: reason", "paused: reason" or the plain status
// (a failure's reason is the manifest's Error).
func sessionState(m *projections.Manifest) string {
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

// stepState is a step's status for people: "waiting until 15:04:05 (usage
// limit)", "paused: reason", "stopped: reason", "breaker open: reason", or
// the plain status. Wait times on another day than now show the date.
func stepState(st *projections.StepView, now time.Time) string {
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
		s := "waiting until " + clock(st.Wait.Until, now)
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
	}
	if n := st.CancelledJobs; n > 0 {
		parts = append(parts, plural(n, "job")+" cancelled")
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
		parts = append(parts, plural(n, "hint")+" delivered")
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
		return money(cost) + " of " + money(limit)
	case cost != 0:
		return money(cost)
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
	s := thousands(u.InputTokens) + " in, " + thousands(u.OutputTokens) + " out"
	if limit > 0 {
		s += " (" + thousands(u.InputTokens+u.OutputTokens) + " of " + thousands(limit) + ")"
	}
	return s
}

// signalName is the verb, with the step it targets: "stop", "info ideas".
func signalName(sg projections.SignalView) string {
	if sg.Step != "" {
		return sg.Signal + " " + sg.Step
	}
	return sg.Signal
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

// clock is t on the local clock, "15:04:05", with the date when t falls on
// another day than ref.
func clock(t, ref time.Time) string {
	t, ref = t.Local(), ref.Local()
	y, m, d := t.Date()
	if ry, rm, rd := ref.Date(); y != ry || m != rm || d != rd {
		return t.Format("2006-01-02 15:04:05")
	}
	return t.Format("15:04:05")
}

// money is a dollar amount with two decimals, more for small amounts (at
// most four): $0.50, $0.105, $0.0312, $12.40.
func money(c float64) string {
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

// thousands writes n with comma separators: 12,345.
func thousands(n int64) string {
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

// shortTokens writes a token count compactly: 830, 5.1k, 2.3M.
func shortTokens(n int64) string {
	switch a := max(n, -n); {
	case a >= 1_000_000:
		return strconv.FormatFloat(float64(n)/1e6, 'f', 1, 64) + "M"
	case a >= 1000:
		return strconv.FormatFloat(float64(n)/1e3, 'f', 1, 64) + "k"
	}
	return strconv.FormatInt(n, 10)
}

// plural is "1 job", "2 jobs".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return strconv.Itoa(n) + " " + noun + "s"
}

// oneLine folds s into one line of at most n runes, ending with "…" when
// cut.
func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:max(n-1, 0)]) + "…"
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
