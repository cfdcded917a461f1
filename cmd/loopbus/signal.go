package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/loopbus/loopbus/client"
	"github.com/loopbus/loopbus/schemas"
	"github.com/rs/zerolog"
	"github.com/spf13/cobra"
)

// signalResult is one line of `signal` output: what became of the signal
// sent to one session.
type signalResult struct {
	Signal  string `json:"signal"`
	Target  string `json:"target"`
	Session string `json:"session"`
	Step    string `json:"step,omitempty"`
	ID      string `json:"id"`
	Seq     uint64 `json:"seq"`
	// Result is applied or ignored (the orchestrator's acknowledgement), or
	// recorded (no acknowledgement yet: the orchestrator acts on the signal
	// when it runs).
	Result string `json:"result"`
	Detail string `json:"detail,omitempty"`
}

// resultRecorded is the result of a signal not acknowledged (yet).
const resultRecorded = "recorded"

func newSignalCmd(g *globals) *cobra.Command {
	var reason, message string
	var wait time.Duration
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "signal stop|pause|resume|info|invalidate TARGET",
		Short: "Stop, pause, resume, hint or invalidate sessions (TARGET: SESSION, SESSION/STEP or all)",
		Long: `Send a signal to a session, one step of it, or every running session (all):

  stop        cancel running jobs; nothing more runs until resume
  pause       dispatch nothing new; running jobs finish
  resume      run a stopped or paused session or step again
  info        add --message (at most 4 KiB) to the next iteration's prompt
  invalidate  run SESSION/STEP again from its first iteration (and the steps after it)

The signal is an event in the stream: the orchestrator acts on it and answers
with signal.acknowledged, printed here as applied or ignored. A signal the
orchestrator has not answered within --wait is still recorded and takes
effect when the orchestrator runs. "all" means every session started and
neither completed nor failed (read from the stream), one signal each.`,
		Example: `  loopbus signal pause kit-1 --reason "reviewing the summary"
  loopbus signal info kit-1/ideas --message "Prefer case studies."
  loopbus signal invalidate kit-1/summary --reason "article revised"
  loopbus signal stop all --json`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) != 2 {
				return usageErr(fmt.Errorf("signal: want a signal (stop, pause, resume, info or invalidate) and a TARGET (SESSION, SESSION/STEP or all), got %d arguments", len(args)))
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
	cmd.Flags().StringVar(&message, "message", "", "info only: the hint for the next iteration's prompt (at most 4 KiB)")
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
	defer c.close(g.stderr)
	dests, err := client.ResolveSignalTarget(ctx, c.bus, req.Target)
	if errors.Is(err, client.ErrNoSession) || errors.Is(err, client.ErrBadInput) {
		return usageErr(err)
	} else if err != nil {
		return err
	}
	if len(dests) == 0 {
		fmt.Fprintf(g.stderr, "no running session (none started and not yet completed or failed): nothing to %s\n", req.Verb)
		return nil
	}
	sent, sendErr := client.SendSignal(ctx, c.bus, req, dests, time.Now())

	emit := func(r signalResult) {
		if asJSON {
			_ = json.NewEncoder(g.stdout).Encode(r)
			return
		}
		who := r.Session
		if r.Step != "" {
			who += "/" + r.Step
		}
		if r.Result == resultRecorded {
			fmt.Fprintf(g.stdout, "%s %s: recorded at stream sequence %d — %s\n", r.Signal, who, r.Seq, r.Detail)
			return
		}
		if r.Detail == "" {
			fmt.Fprintf(g.stdout, "%s %s: %s\n", r.Signal, who, r.Result)
			return
		}
		fmt.Fprintf(g.stdout, "%s %s: %s — %s\n", r.Signal, who, r.Result, r.Detail)
	}
	result := func(s client.SentSignal) signalResult {
		sig := s.Event.Data.(*schemas.Signal)
		return signalResult{Signal: req.Verb, Target: sig.Target, Session: s.Event.Session, Step: sig.Step, ID: s.Event.ID, Seq: s.Seq}
	}

	var acks map[string]*schemas.SignalAcknowledged
	why := ""
	interrupted := false
	switch {
	case sendErr != nil:
		why = "the other signals were not sent"
	case c.ownsServer():
		// This command started the server, so no orchestrator is
		// connected to it: nothing could answer.
		session := "SESSION"
		if len(dests) == 1 {
			session = dests[0].Session
		}
		why = fmt.Sprintf("no orchestrator runs on this data directory; 'loopbus serve' or 'loopbus wait %s' runs one", session)
	case wait == 0:
		why = "not waiting for an acknowledgement: --wait 0"
	default:
		why = fmt.Sprintf("the orchestrator did not answer within %s", wait)
		sigCtx, stop := notifyContext()
		wctx, cancel := context.WithTimeout(sigCtx, wait)
		acks, err = client.AwaitSignalAcks(wctx, c.bus, sent, func(s client.SentSignal, a *schemas.SignalAcknowledged) {
			r := result(s)
			r.Result, r.Detail = a.Result, a.Detail
			emit(r)
		})
		interrupted = sigCtx.Err() != nil
		cancel()
		stop()
		if err != nil {
			return err
		}
		if interrupted {
			why = "interrupted while waiting for the orchestrator"
		}
	}
	for _, s := range sent {
		if acks[s.Event.ID] != nil {
			continue
		}
		r := result(s)
		r.Result = resultRecorded
		r.Detail = "takes effect when the orchestrator runs (" + why + ")"
		emit(r)
	}
	switch {
	case sendErr != nil:
		return sendErr
	case interrupted:
		return errInterrupted
	}
	return nil
}
