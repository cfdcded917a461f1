package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/loopbus/loopbus/client"
	"github.com/loopbus/loopbus/schemas"
	"github.com/loopbus/loopbus/tui"
	"github.com/rs/zerolog"
	"github.com/spf13/cobra"
)

func newSignalCmd(g *globals) *cobra.Command {
	var reason, message string
	var wait time.Duration
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "signal stop|pause|resume|hint|invalidate TARGET",
		Short: "Stop, pause, resume, hint or invalidate sessions (TARGET: SESSION, SESSION/STEP or all)",
		Long: `Send a signal to a session, one step of it, or every running session (all):

  stop        cancel running jobs; nothing more runs until resume
  pause       dispatch nothing new; running jobs finish
  resume      run a stopped or paused session or step again
  hint        add --message (at most 4 KiB) to the next iteration's prompt
              (its event is loopbus.signal.info; "info" is accepted for it)
  invalidate  run SESSION/STEP again from its first iteration (and the steps after it)

The signal is an event in the stream: the orchestrator acts on it and answers
with signal.acknowledged, printed here as applied or ignored. A signal the
orchestrator has not answered within --wait is still recorded and takes
effect when the orchestrator runs. "all" means every session started and
neither completed nor failed (read from the stream), one signal each.`,
		Example: `  loopbus signal pause kit-1 --reason "reviewing the summary"
  loopbus signal hint kit-1/ideas --message "Prefer case studies."
  loopbus signal invalidate kit-1/summary --reason "article revised"
  loopbus signal stop all --json`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) != 2 {
				return usageErr(fmt.Errorf("signal: want a signal (stop, pause, resume, hint or invalidate) and a TARGET (SESSION, SESSION/STEP or all), got %d arguments", len(args)))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			target, err := client.ParseSignalTarget(args[1])
			if err != nil {
				return usageErr(err)
			}
			req := client.SignalRequest{Verb: args[0], Target: target, Reason: reason, Message: message}
			if err := req.Check(); err != nil {
				return usageErr(err)
			}
			if wait < 0 {
				return usageErr(fmt.Errorf("--wait %s: want 0 (do not wait) or more", wait))
			}
			return g.signal(cmd.Context(), req, wait, asJSON)
		},
	}
	cmd.Flags().StringVar(&reason, "reason", "", "why (stop, pause, resume, invalidate); kept in the history")
	cmd.Flags().StringVar(&message, "message", "", "hint only: the text for the next iteration's prompt (at most 4 KiB)")
	cmd.Flags().DurationVar(&wait, "wait", 10*time.Second, "how long to wait for the orchestrator's acknowledgement (0: do not wait)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print one JSON object per session")
	return cmd
}

// signal sends req to the sessions its target selects and prints, per
// session, the orchestrator's acknowledgement or that the signal is
// recorded. Unknown sessions and steps are usage errors.
func (g *globals) signal(ctx context.Context, req client.SignalRequest, wait time.Duration, asJSON bool) error {
	if ctx == nil {
		ctx = context.Background()
	}
	c, err := g.connect(ctx, "signal", g.logger(zerolog.WarnLevel), false)
	if err != nil {
		return err
	}
	defer g.disconnect(c)
	opts := client.SignalReport{Wait: wait, Now: time.Now()}
	if c.OwnsServer() {
		// This command started the server, so no orchestrator is
		// connected to it: nothing could answer.
		opts.NoAnswer = func(dests []client.SignalDest) string {
			session := "SESSION"
			if len(dests) == 1 {
				session = dests[0].Session
			}
			return fmt.Sprintf("no orchestrator runs on this data directory; '%s serve' or '%s wait %s' runs one", g.program, g.program, session)
		}
	}
	sigCtx, stop := notifyContext(context.Background())
	defer stop()
	opts.Interrupt = sigCtx
	ignored := false
	err = client.Report(ctx, c.Bus, req, opts, func(r client.SignalResult) {
		ignored = ignored || r.Result == schemas.SignalIgnored
		_ = tui.WriteSignalResult(g.stdout, r, asJSON)
	})
	switch {
	case err == nil && ignored && (req.Verb == "approve" || req.Verb == "reject"):
		// A script approving a gate must see that nothing happened.
		return errFailed
	case errors.Is(err, client.ErrNoneRunning):
		fmt.Fprintln(g.stderr, err)
		return nil
	case errors.Is(err, client.ErrNoSession) || errors.Is(err, client.ErrBadInput):
		return usageErr(err)
	case sigCtx.Err() != nil && errors.Is(err, sigCtx.Err()):
		return errInterrupted
	}
	return err
}
