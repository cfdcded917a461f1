package tui

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/loopbus/loopbus/client"
)

// WriteSessions writes a session listing: as a JSON array when asJSON,
// else as a table of id, status, pipeline, steps done, cost and age
// (relative to now), newest first as given. An empty listing prints a
// line saying so (JSON: []).
func WriteSessions(w io.Writer, list []client.SessionSummary, asJSON bool, now time.Time) error {
	if asJSON {
		if list == nil {
			list = []client.SessionSummary{}
		}
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(list)
	}
	if len(list) == 0 {
		_, err := fmt.Fprintln(w, "no sessions")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SESSION\tSTATUS\tPIPELINE\tSTEPS\tCOST\tAGE")
	for _, s := range list {
		cost := "-"
		if s.CostUSD > 0 {
			cost = "$" + strconv.FormatFloat(s.CostUSD, 'f', 2, 64)
		}
		steps := fmt.Sprintf("%d/%d", s.StepsDone, s.Steps)
		switch {
		case s.Restarts == 1:
			steps += " (1 restart)"
		case s.Restarts > 1:
			steps += fmt.Sprintf(" (%d restarts)", s.Restarts)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", s.ID, s.Status, s.Pipeline, steps, cost, sessionsAge(now.Sub(s.Started)))
	}
	return tw.Flush()
}

// sessionsAge is d in the largest whole unit: 45s, 12m, 3h, 5d.
func sessionsAge(d time.Duration) string {
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", max(int(d/time.Second), 0))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d/time.Minute))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d/time.Hour))
	}
	return fmt.Sprintf("%dd", int(d/(24*time.Hour)))
}
