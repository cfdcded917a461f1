package main

import (
	"fmt"
	"os"
	"os/user"
	"time"

	"github.com/loopbus/loopbus/client"
	"github.com/spf13/cobra"
)

// newApproveCmd is "loopbus approve SESSION/STEP [--comment C]": a
// signal.approve for a step waiting at its approval gate.
func newApproveCmd(g *globals) *cobra.Command {
	return newApprovalCmd(g, "approve")
}

// newRejectCmd is "loopbus reject SESSION/STEP --reason R": a
// signal.reject; the reason is the next iteration's feedback.
func newRejectCmd(g *globals) *cobra.Command {
	return newApprovalCmd(g, "reject")
}

func newApprovalCmd(g *globals, verb string) *cobra.Command {
	var text, by string
	var wait time.Duration
	var asJSON bool
	cmd := &cobra.Command{
		Use: verb + " SESSION/STEP",
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usageErr(fmt.Errorf("%s: want SESSION/STEP (a step awaiting approval), got %d arguments", verb, len(args)))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			target, err := client.ParseSignalTarget(args[0])
			if err != nil {
				return usageErr(err)
			}
			if by == "" {
				by = whoAmI()
			}
			req := client.SignalRequest{Verb: verb, Target: target, Reason: text, By: by}
			if err := req.Check(); err != nil {
				return usageErr(err)
			}
			if wait < 0 {
				return usageErr(fmt.Errorf("--wait %s: want 0 (do not wait) or more", wait))
			}
			return g.signal(cmd.Context(), req, wait, asJSON)
		},
	}
	if verb == "approve" {
		cmd.Short = "Approve a step waiting at its approval gate: it completes"
		cmd.Long = `Approve a step of a session that waits at its approval gate (approval: required
in the pipeline): the step completes with the outputs that passed validation
and the steps after it run. The approval is a signal.approve event naming who
(--by, default your user name) and the optional --comment; the orchestrator
answers with signal.acknowledged, printed here. When the step is not
awaiting approval, the orchestrator ignores it and this exits 1.

STEP is a pipeline's step, a loop's id in a loops session (approving it
spawns its children) or a backlog's task id or role (bootstrap, repair,
review): loop levels and backlog roles take approval too.`
		cmd.Example = `  loopbus approve kit-1/summary --comment "reads well"
  loopbus approve feature-1/plan-001
  loopbus approve backlog-1/T003`
		cmd.Flags().StringVar(&text, "comment", "", "an optional comment, kept in the history")
	} else {
		cmd.Short = "Reject a step waiting at its approval gate: another iteration runs with the reason as feedback"
		cmd.Long = `Reject a step of a session that waits at its approval gate: another iteration
of the step runs, its prompt carrying --reason (required) as feedback, and
waits at the gate again when its outputs pass. A rejected iteration does not
count against max_iterations (one rejected by the gate's timeout does). The rejection is a signal.reject event naming
who (--by, default your user name) and why; the orchestrator answers with
signal.acknowledged, printed here. When the step is not awaiting approval,
the orchestrator ignores it and this exits 1.`
		cmd.Example = `  loopbus reject kit-1/summary --reason "too long: at most 100 words"`
		cmd.Flags().StringVar(&text, "reason", "", "why (required): the feedback of the next iteration")
	}
	cmd.Flags().StringVar(&by, "by", "", "who approves or rejects (default: your user name)")
	cmd.Flags().DurationVar(&wait, "wait", 10*time.Second, "how long to wait for the orchestrator's acknowledgement (0: do not wait)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the result as JSON")
	return cmd
}

// whoAmI is the user name approvals are recorded under by default.
func whoAmI() string {
	if u, err := user.Current(); err == nil && u.Username != "" {
		return u.Username
	}
	return os.Getenv("USER")
}
