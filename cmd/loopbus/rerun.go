package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/client"
	"github.com/spf13/cobra"
)

// newRerunCmd is "loopbus rerun SESSION[/STEP]": a session.rerun that
// reopens a completed, failed or stopped session, then follows it as run
// does.
func newRerunCmd(g *globals) *cobra.Command {
	var reason string
	var detach, asJSON bool
	var workers int
	var out string
	cmd := &cobra.Command{
		Use:   "rerun SESSION[/STEP]",
		Short: "Run a completed, failed or stopped session again: a step and its dependents, or every step",
		Long: `Reopen a session that completed, failed or was stopped, in the same session:
STEP and every step that requires it, directly or not (every step without
STEP), run again in a new round, as do steps that had not completed; the
others keep their results. The rerun is an event (loopbus.session.rerun)
that the orchestrator acts on; the history before it stays (replay --until
shows every earlier state). A running or paused session is refused (use
signal invalidate or resume), and so is a closed one: closed is final.

Like run, rerun follows the session to its end and exits as run does (0
completed, 1 failed, 3 stopped by its budget, 5 closed, 130 interrupted);
--detach returns at once (it needs a running server: serve, or --nats).`,
		Example: `  loopbus rerun kit-1/summary --reason "agent fixed"
  loopbus rerun kit-1 --detach`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usageErr(fmt.Errorf("rerun: want SESSION or SESSION/STEP, got %d arguments", len(args)))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			target, err := client.ParseSignalTarget(args[0])
			if err != nil {
				return usageErr(err)
			}
			if target.All {
				return usageErr(errors.New("rerun: name one session (SESSION or SESSION/STEP), not all"))
			}
			if detach && out != "" {
				return usageErr(errors.New("rerun: --out needs the session followed to its end; it cannot go with --detach"))
			}
			submit := func(ctx context.Context, b *bus.Bus) (string, error) {
				p, err := client.Rerun(ctx, b, target.Session, target.Step, reason)
				for _, refusal := range []error{client.ErrNoSession, client.ErrBadInput, client.ErrSessionEnded} {
					if errors.Is(err, refusal) {
						return "", usageErr(err)
					}
				}
				if err != nil {
					return "", err
				}
				what := "every step"
				if target.Step != "" {
					what = "step " + target.Step + " and the steps after it"
				}
				return fmt.Sprintf("session %s reopened: %s run again (recorded at stream sequence %d)", target.Session, what, p.Seq), nil
			}
			return g.submitAndFollow(cmd.Context(), submit, target.Session, detach, asJSON, workers, out, "")
		},
	}
	cmd.Flags().StringVar(&reason, "reason", "", "why; kept in the history")
	cmd.Flags().BoolVar(&detach, "detach", false, "reopen and exit without following (needs a running server: serve, or --nats)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the final manifest as JSON on stdout (with --detach: the session)")
	cmd.Flags().StringVar(&out, "out", "", "when the session completes, write its final artifacts into this directory (created if missing)")
	cmd.Flags().IntVar(&workers, "concurrency", 4, "jobs run at once by the in-process worker (embedded mode)")
	return cmd
}
