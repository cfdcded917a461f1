package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/client"
	"github.com/loopbus/loopbus/orchestrator"
)

// doctorDecisionBound is how long doctor lets a session go owed a
// decision: twice the orchestrator's watchdog bound, by which its
// watchdog has made the decision if it runs.
const doctorDecisionBound = 2 * orchestrator.DefaultStallAfter

// doctorMaxSessions bounds the sessions not finished (the newest) that
// doctor looks at for decisions owed.
const doctorMaxSessions = 200

// decisionsCheck is doctor's "decisions" line: it fails when sessions not
// finished have been owed a decision by the orchestrator for bound or
// longer with nothing stored since; what is owed is what the
// orchestrator's own rules make of each session's history
// (orchestrator.Owed), the question its watchdog asks. Such sessions wait
// for ever for an orchestrator that is down, or one whose decisions are
// lost.
func decisionsCheck(ctx context.Context, b *bus.Bus, bound time.Duration, now time.Time) client.Check {
	const name = "decisions"
	quiet, running, err := client.QuietSessions(ctx, b, bound, now, doctorMaxSessions)
	if err != nil {
		return client.Check{Name: name, Detail: err.Error()}
	}
	var owed []string
	for _, q := range quiet {
		evs, err := orchestrator.Owed(q.ID, orchestrator.HistoryOf(ctx, b), now.Add(-bound))
		if err != nil {
			return client.Check{Name: name, Detail: fmt.Sprintf("session %s: %v", q.ID, err)}
		}
		if len(evs) > 0 {
			owed = append(owed, fmt.Sprintf("%s (after %s %s ago)", q.ID, strings.TrimPrefix(q.Last.Type, "loopbus."), now.Sub(q.Last.Stored).Round(time.Second)))
		}
	}
	looked := fmt.Sprintf("%d not finished", running)
	if running > doctorMaxSessions {
		looked = fmt.Sprintf("the newest %d of %d not finished", doctorMaxSessions, running)
	}
	if len(owed) == 0 {
		return client.Check{Name: name, OK: true, Detail: fmt.Sprintf("no session owed a decision for %s or more (%s looked at)", bound, looked)}
	}
	shown := owed[:min(len(owed), 5)]
	more := ""
	if len(owed) > len(shown) {
		more = fmt.Sprintf(", and %d more", len(owed)-len(shown))
	}
	return client.Check{Name: name, Detail: fmt.Sprintf(
		"%d sessions owed a decision by the orchestrator for %s or more (%s looked at): %s%s. Is the orchestrator running? Its watchdog makes such a decision within %s, logging an error; a restart makes them too",
		len(owed), bound, looked, strings.Join(shown, ", "), more, orchestrator.DefaultStallAfter)}
}
