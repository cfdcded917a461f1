package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/client"
	"github.com/loopbus/loopbus/schemas"
	"github.com/spf13/cobra"
)

func newBudgetCmd(g *globals) *cobra.Command {
	var reason string
	var asJSON bool
	var budget schemas.Budget
	cmd := &cobra.Command{
		Use:   "budget SESSION [--max-cost-usd N] [--max-tokens N] [--max-iterations N]",
		Short: "Set a session's budget; a session its budget stopped goes on when the new bound allows",
		Long: `Set the budget of a session that has not ended: each bound given replaces
the one in force (the pipeline's, tightened by run's --max-* flags, or an
earlier budget command); the others stay. A session stopped by its budget
resumes when the new bounds let it go on, and dispatches what was pending.
The change is an event (loopbus.session.budget) that the orchestrator acts
on when it runs (serve, the Procfile, or wait SESSION in embedded mode).`,
		Example: `  loopbus budget kit-1 --max-cost-usd 5
  loopbus budget kit-1 --max-iterations 40 --reason "two more tasks"`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			for _, f := range []struct {
				name string
				ok   bool
			}{
				{"max-cost-usd", budget.MaxCostUSD > 0},
				{"max-tokens", budget.MaxTokens > 0},
				{"max-iterations", budget.MaxIterations > 0},
			} {
				if fl := cmd.Flags().Lookup(f.name); fl.Changed && !f.ok {
					return usageErr(fmt.Errorf("budget: --%s must be > 0, got %s", f.name, fl.Value))
				}
			}
			return g.withBus(cmd, "budget", func(ctx context.Context, b *bus.Bus) error {
				p, err := client.SetBudget(ctx, b, args[0], budget, reason)
				if err != nil {
					return err
				}
				return g.printControl(p, asJSON, "budget of %s set: %s", args[0], budgetText(budget))
			})
		},
	}
	cmd.Flags().Float64Var(&budget.MaxCostUSD, "max-cost-usd", 0, "the session may spend up to this many US dollars in all")
	cmd.Flags().Int64Var(&budget.MaxTokens, "max-tokens", 0, "the session's agents may use this many tokens in all (input plus output)")
	cmd.Flags().IntVar(&budget.MaxIterations, "max-iterations", 0, "the session may run its agents this many times in all")
	cmd.Flags().StringVar(&reason, "reason", "", "why; kept in the history")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the event written as JSON")
	return cmd
}

func newCloseCmd(g *globals) *cobra.Command {
	var reason string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "close SESSION",
		Short: "Close a session for good: its running jobs are cancelled, nothing reopens it",
		Long: `Close a session that has not ended, for good: the orchestrator cancels
its running jobs and dispatches nothing more; no signal or budget reopens it.
Its status is closed everywhere (status, sessions, the dashboard); wait and
watch exit 5. The close is an event (loopbus.session.closed).`,
		Example: `  loopbus close kit-1 --reason "superseded by kit-2"`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withBus(cmd, "close", func(ctx context.Context, b *bus.Bus) error {
				p, err := client.CloseSession(ctx, b, args[0], reason)
				if err != nil {
					return err
				}
				return g.printControl(p, asJSON, "session %s closed", args[0])
			})
		},
	}
	cmd.Flags().StringVar(&reason, "reason", "", "why; kept in the history")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the event written as JSON")
	return cmd
}

// printControl prints what budget or close wrote: a line, or with asJSON
// the session, event id, type and stream sequence.
func (g *globals) printControl(p client.Published, asJSON bool, format string, args ...any) error {
	if asJSON {
		return json.NewEncoder(g.stdout).Encode(map[string]any{"session": p.Event.Session, "id": p.Event.ID, "type": p.Event.Type, "seq": p.Seq})
	}
	_, err := fmt.Fprintf(g.stdout, format+" (recorded at stream sequence %d)\n", append(args, p.Seq)...)
	return err
}

func budgetText(b schemas.Budget) string {
	var parts []string
	if b.MaxCostUSD > 0 {
		parts = append(parts, fmt.Sprintf("max cost $%.2f", b.MaxCostUSD))
	}
	if b.MaxTokens > 0 {
		parts = append(parts, fmt.Sprintf("max %d tokens", b.MaxTokens))
	}
	if b.MaxIterations > 0 {
		parts = append(parts, fmt.Sprintf("max %d agent runs", b.MaxIterations))
	}
	return strings.Join(parts, ", ")
}
