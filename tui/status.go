package tui

import (
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/loopbus/loopbus/projections"
	"github.com/loopbus/loopbus/schemas"
)

// WriteStatus writes a session's manifest m to w, as `loopbus status`
// shows it: with asJSON the manifest as indented JSON; else for people the
// session with its state, cost against its budget and runs, then one line
// per step with its state, iterations, tokens and cost (those two columns
// only when agents reported usage or a budget bounds it), content hash and
// detail, then a loops session's loop tree and target branch, then the
// five newest signals. now places wait times in the day.
// It returns the first write error.
func WriteStatus(w io.Writer, m *projections.Manifest, asJSON bool, now time.Time) error {
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(m)
	}
	fmt.Fprintf(w, "session   %s\npipeline  %s\nstatus    %s\nsource    %s\nupdated   %s (stream seq %d)\n",
		m.ContentID, m.Pipeline, SessionState(m), m.SourceHash, m.UpdatedAt.UTC().Format(time.RFC3339), m.LastSeq)
	if f := m.ForkedFrom; f != nil {
		fmt.Fprintf(w, "forked    from %s at stream seq %d (event %s)\n", f.Session, f.Seq, f.Event)
	}
	if m.Kind == schemas.KindBacklog {
		fmt.Fprintf(w, "backlog   phase %s (the tasks: loopbus tasks %s)\n", OrDash(m.Phase), m.ContentID)
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
	if m.Restarts > 0 {
		fmt.Fprintf(w, "restarts  %d (agents run again: their jobs were handed out again after a worker was lost)\n", m.Restarts)
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
		fmt.Fprintf(tw, "%s\t%s\t%s\t", name, OneLine(StepState(st, now), 80), iterations(st))
		if usage {
			tokens, cost := "-", "-"
			if u := st.Usage; u != nil {
				tokens = ShortTokens(u.InputTokens) + "/" + ShortTokens(u.OutputTokens)
				cost = Money(u.CostUSD)
			}
			fmt.Fprintf(tw, "%s\t%s\t", tokens, cost)
		}
		fmt.Fprintf(tw, "%s\t%s\n", st.ContentHash, OneLine(stepDetail(st), 100))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if err := writeLoops(w, m, now); err != nil {
		return err
	}
	if len(m.Signals) > 0 {
		fmt.Fprintln(w, "\nsignals (newest last)")
		tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		for _, sg := range m.Signals[max(0, len(m.Signals)-5):] {
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", sg.At.Local().Format("15:04:05"), signalName(sg), OneLine(signalText(sg), 60), OneLine(signalAnswer(sg), 80))
		}
		return tw.Flush()
	}
	return nil
}
