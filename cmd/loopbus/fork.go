package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/client"
	"github.com/loopbus/loopbus/definition"
	"github.com/loopbus/loopbus/schemas"
	"github.com/spf13/cobra"
)

// newForkCmd is "loopbus fork SESSION --at SEQ|EVENT-ID": a new session
// whose history is SESSION's up to that point, followed as run does.
func newForkCmd(g *globals) *cobra.Command {
	var at, as, pipeline, input, reason, out string
	var detach, asJSON bool
	var workers int
	cmd := &cobra.Command{
		Use:   "fork SESSION --at SEQ|EVENT-ID [--as NEW] [--pipeline FILE] [--input FILE]",
		Short: "Start a new session from another's history up to an event, and follow it to the end",
		Long: `Start a new session whose history is SESSION's up to the event at stream
sequence SEQ (or with id EVENT-ID), included: those events are copied into
it with new ids, then a loopbus.session.forked event names the origin and
the fork point, and the new session goes on live. SESSION is not written to.

Steps that had completed at the fork point keep their results; steps that
had not (running, failed or never started) run again, in jobs of the new
session. --pipeline runs the new session with another pipeline file: a step
whose definition (or a script it names) changed runs again, with every step
that requires it; --input gives it another input (then every step runs
again). The fork runs under SESSION's budget at the fork point, raises by
loopbus budget included, tightened by a changed pipeline's budget. The
fork's id is --as (default SESSION-fork-XXXX); an id in use is refused, as
is a fork of a session that is itself the 16th fork of a chain.

A loops session forks its loop tree by the same rule: loops that had
completed keep their results and their subtrees, unless --pipeline changed
their level; the others run again, and the loops under them are spawned
anew when they pass. A backlog session keeps its task list as it was at
the fork point and the runs that had finished; runs not finished run
again, and a role changed by --pipeline runs its later runs with its new
definition. A loops session whose levels work in git worktrees, and a
backlog with workdir: repo, fork their target branch too: the fork's is
its own (loopbus/NEW), starting where SESSION's was at the fork point,
with the loops or task runs merged by then; those not merged by then run
again on it and merge into it ('loopbus pull NEW --repo DIR' brings it).
When --pipeline runs again a loop merged before the fork point (its
level, or one above it, changed), or a backlog run of a changed role
that had completed before it, the work after it was built on it: the
fork point moves back to the event before that merge or completion (fork
says so), and the fork runs it again, and what came after. A loops or
backlog session forked at or after its end forks from a running session:
the point moves back to the event before the decision that ended it (fork
says so), and the loops or runs that decision completed or failed run
again in the fork. Refused: a backlog file that switches between workdir:
repo and not, and a session forked at or after its session.closed.

Like run, fork follows the new session to its end and exits as run does (0
completed, 1 failed, 2 usage errors, 3 stopped by its budget, 5 closed, 130
interrupted); --detach prints the new session's id and returns at once (it
needs a running server: serve, or --nats); 'loopbus wait NEW' follows it.`,
		Example: `  loopbus fork kit-1 --at 42 --pipeline pipeline.yaml
  loopbus fork kit-1 --at 6f1c2a… --as kit-1-try2 --input brief-v2.md --detach`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usageErr(fmt.Errorf("fork: want SESSION, got %d arguments", len(args)))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if at == "" {
				return usageErr(fmt.Errorf("fork: --at SEQ|EVENT-ID is required (see %s events %s)", g.program, args[0]))
			}
			if detach && out != "" {
				return usageErr(errors.New("fork: --out needs the session followed to its end; it cannot go with --detach"))
			}
			req := client.ForkRequest{Origin: args[0], At: at, As: as, Input: input, Reason: reason}
			if req.As == "" {
				if err := schemas.ValidateSessionID(req.Origin); err != nil {
					return usageErr(err)
				}
				req.As = client.NewForkID(req.Origin)
			}
			if pipeline != "" {
				p, err := definition.Load(pipeline)
				if err != nil {
					return usageErr(err)
				}
				req.Pipeline = &p
			}
			submit := func(ctx context.Context, b *bus.Bus) (string, error) {
				f, err := client.Fork(ctx, b, req)
				for _, refusal := range []error{client.ErrNoSession, client.ErrBadInput, client.ErrSessionExists} {
					if errors.Is(err, refusal) {
						return "", usageErr(err)
					}
				}
				if err != nil {
					return "", err
				}
				if moved := f.MovedBack(); moved != "" {
					fmt.Fprintln(g.stderr, moved)
				}
				what := fmt.Sprintf("session %s forked from %s at stream sequence %d (%s); %d events copied", f.Session, req.Origin, f.Point.Seq,
					strings.TrimPrefix(f.Point.Type, "loopbus."), f.Event.Data.(*schemas.SessionForked).Copied)
				if len(f.Kept) > 0 {
					what += "; kept: " + strings.Join(f.Kept, ", ")
				}
				if len(f.Again) > 0 {
					what += "; to run: " + strings.Join(f.Again, ", ")
				}
				return what, nil
			}
			return g.submitAndFollow(cmd.Context(), submit, req.As, detach, asJSON, workers, out, "")
		},
	}
	cmd.Flags().StringVar(&at, "at", "", "the fork point: a stream sequence or an event id of SESSION (see loopbus events SESSION); required")
	cmd.Flags().StringVar(&as, "as", "", "the new session's id ([A-Za-z0-9_-], at most 64); default SESSION-fork-<random>")
	cmd.Flags().StringVar(&pipeline, "pipeline", "", "run the fork with this pipeline (loops, backlog) file: changed steps (levels, roles) and their dependents (subtrees) run again")
	cmd.Flags().StringVar(&input, "input", "", "run the fork on this input file (every step runs again)")
	cmd.Flags().StringVar(&reason, "reason", "", "why; kept in the history")
	cmd.Flags().BoolVar(&detach, "detach", false, "fork and exit without following (needs a running server: serve, or --nats)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the final manifest as JSON on stdout (with --detach: the session)")
	cmd.Flags().StringVar(&out, "out", "", "when the fork completes, write its final artifacts into this directory (created if missing)")
	cmd.Flags().IntVar(&workers, "concurrency", 4, "jobs run at once by the in-process worker (embedded mode)")
	return cmd
}

// writeForks lists the forks of session (the sessions forked from it) and
// where each forked it; nothing when it has none.
func writeForks(ctx context.Context, w io.Writer, b *bus.Bus, session string) error {
	forks, err := client.Forks(ctx, b, session)
	if err != nil || len(forks) == 0 {
		return err
	}
	fmt.Fprintln(w, "\nforks")
	for _, f := range forks {
		fmt.Fprintf(w, "  %s\tat stream seq %d (event %s)\n", f.Session, f.Seq, f.Event)
	}
	return nil
}
