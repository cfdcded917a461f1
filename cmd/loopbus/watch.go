package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/loopbus/loopbus/client"
	"github.com/loopbus/loopbus/projections"
	"github.com/loopbus/loopbus/schemas"
	"github.com/loopbus/loopbus/serve"
	"github.com/loopbus/loopbus/tui"
	"github.com/spf13/cobra"
)

func newWatchCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "watch SESSION",
		Short: "Watch a session live: steps, running tools, cost, waits, breakers and signals",
		Long: `Watch a session live from the event stream, from its start.

On a terminal a live screen shows the session and its steps with their
state, iterations and cost, tools running now, the agents' latest message,
the cost against the budget, recent signals and a timeline of the events.
Keys act on the selected session or step (up/down or k/j select it):
p pauses, r resumes, s stops (press s or y again to confirm), h sends a
hint (type it, enter sends it as an info signal), pgup/pgdown scroll the
timeline, ? lists the keys, q or Ctrl-C stops watching (the session goes
on). Otherwise one line is printed per event.

Exits 0 when the session completes, 1 when it fails and 3 when its budget
stops it (the reason on stderr), 130 when you stop watching. A paused
session, or one stopped by a signal, is watched on until it ends.
watch reads, and sends only the signals you ask for: it runs none of the
services that work on the session.`,
		Example: `  loopbus watch kit-1
  loopbus watch kit-1 --nats nats://127.0.0.1:4222 | grep tool`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withConn(cmd, "watch", func(ctx context.Context, c *serve.Conn) error {
				if err := client.Exists(ctx, c.Bus, args[0]); err != nil {
					return err
				}
				ctx, stop := notifyContext(ctx)
				defer stop()
				return g.watch(ctx, c, args[0])
			})
		},
	}
}

// watch shows a session until it ends or ctx does; quitting the live
// screen ends it too.
func (g *globals) watch(ctx context.Context, c *serve.Conn, session string) error {
	if c.OwnsServer() {
		// Nothing but this command serves the data directory, so nothing
		// will move an unfinished session on.
		if m, err := client.Status(ctx, c.Bus, session); err == nil && !m.Terminal() {
			fmt.Fprintf(g.stderr, "no loopbus server runs on this data directory: session %s progresses only while '%s serve' or '%s wait %s' runs\n", session, g.program, g.program, session)
		}
	}
	ctx, quit := context.WithCancel(ctx)
	defer quit()
	view, stopView := tui.NewView(g.stdout, tui.Options{Signaler: signaler(c, !c.OwnsServer()), OnQuit: quit})
	m, err := client.Watch(ctx, c.Bus, session, view)
	stopView()
	switch {
	case ctx.Err() != nil:
		return errInterrupted
	case err != nil:
		return err
	}
	return sessionEnd(g.stderr, m, g.program)
}

// sessionEnd is how watching a session ended: nil when it completed,
// errFailed when it failed, errStopped when its budget stopped it,
// errBlocked when a backlog completed with blocked tasks; the
// reason goes to w, naming the binary as program.
func sessionEnd(w io.Writer, m *projections.Manifest, program string) error {
	switch tui.WriteEnd(w, m, program) {
	case tui.Failed:
		return errFailed
	case tui.StoppedByBudget:
		return errStopped
	case tui.CompletedBlocked:
		return errBlocked
	case tui.Closed:
		return errClosed
	}
	return nil
}

// followView is what run and wait show while they follow a session: the
// live screen when w is a terminal, sending its signals over c, else the
// progress lines they always printed. Quitting the screen is Ctrl-C.
// stop draws the last screen; it may be called more than once.
func followView(w io.Writer, c *serve.Conn) (onEvent func(schemas.Event, *projections.Manifest), stop func()) {
	if !tui.IsTerminal(w) {
		return tui.NewProgress(w).Event, func() {}
	}
	// An orchestrator runs: in-process in embedded mode, else with --nats.
	return tui.NewView(w, tui.Options{Follow: true, Signaler: signaler(c, true), OnQuit: interrupt})
}

// signaler sends the live screen's signals over c, waiting for the
// orchestrator's answer when one runs.
func signaler(c *serve.Conn, orchestrated bool) tui.Signaler {
	s := client.Signaler{Bus: c.Bus}
	if orchestrated {
		// The screen stays live meanwhile; a busy orchestrator may answer
		// late, and an answer is worth waiting for.
		s.Wait = 45 * time.Second
	}
	return s
}

// interrupt raises SIGINT in this process: quitting the live screen is
// Ctrl-C, which a terminal in raw mode does not turn into a signal.
func interrupt() {
	if p, err := os.FindProcess(os.Getpid()); err == nil {
		_ = p.Signal(os.Interrupt)
	}
}
