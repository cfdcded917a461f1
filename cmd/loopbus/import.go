package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/client"
	"github.com/loopbus/loopbus/definition"
	"github.com/loopbus/loopbus/schemas"
	"github.com/loopbus/loopbus/tui"
	"github.com/spf13/cobra"
)

// newImportCmd is "loopbus import DIR --pipeline FILE": a session made
// from a Looplia session folder, its finished steps imported, waiting
// for a resume (at once with --resume).
func newImportCmd(g *globals) *cobra.Command {
	var pipeline, input, session, out string
	var resume, detach, asJSON bool
	var workers int
	cmd := &cobra.Command{
		Use:   "import DIR --pipeline FILE",
		Short: "Start a session from a Looplia session folder: its finished steps are imported, the rest run on resume",
		Long: `Turn a Looplia session folder (content.md, session.json if Looplia 0.5 or
later made it, and the step artifacts: summary.json, ideas.json, ...) into a
session of the pipeline FILE. content.md is the session's input unless
--input names another file.

A step is imported as completed when every output it declares is a file of
DIR that satisfies the output's schema, every step it requires is imported
too, and session.json, when there is one, records it completed (under the
step's name, or Looplia's name for its output: summary.json analyzing,
ideas.json generating_ideas, outline.json building_outline, writing-kit.json
assembling_kit). When session.json's sourceHash is not the input's, the
source changed since: nothing is imported and every step runs. Imported
steps are recorded as step.imported events with their artifacts' hashes;
their agents never run, and the steps after them get the imported artifacts
as inputs.

The session waits (paused) until 'loopbus resume SESSION' runs the steps
not imported; with --resume, import resumes it at once and follows it to its
end like run (same exit codes; --detach returns at once).`,
		Example: `  loopbus import ./article-1 --pipeline writing-kit.yaml
  loopbus import ./article-1 --pipeline writing-kit.yaml --session kit-1 --resume`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usageErr(fmt.Errorf("import: want one session folder DIR, got %d arguments", len(args)))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if pipeline == "" {
				return usageErr(errors.New("import: --pipeline FILE is required (the pipeline whose steps the folder's artifacts belong to)"))
			}
			if !resume && (detach || out != "") {
				return usageErr(errors.New("import: --detach and --out go with --resume"))
			}
			if detach && out != "" {
				return usageErr(errors.New("import: --out needs the session followed to its end; it cannot go with --detach"))
			}
			p, err := definition.Load(pipeline)
			if err != nil {
				return usageErr(err)
			}
			if session == "" {
				session = client.NewSessionID(p.Name, time.Now())
			} else if err := schemas.ValidateSessionID(session); err != nil {
				return usageErr(err)
			}
			plan, err := client.PlanImport(p, args[0], input)
			if err != nil {
				return usageErr(err)
			}
			if plan.SourceChanged {
				fmt.Fprintf(g.stderr, "the source changed: %s records sourceHash %s, the input's is %s; nothing is imported as completed, every step runs\n",
					client.LoopliaManifest, plan.ManifestSourceHash, plan.SourceHash)
			}
			do := func(ctx context.Context, b *bus.Bus) (client.ImportResult, error) {
				res, err := client.Import(ctx, b, p, plan, session, time.Now())
				if errors.Is(err, client.ErrBadInput) || errors.Is(err, client.ErrSessionExists) {
					return res, usageErr(err)
				}
				return res, err
			}
			if !resume {
				return g.withBus(cmd, "import", func(ctx context.Context, b *bus.Bus) error {
					res, err := do(ctx, b)
					if err != nil {
						return err
					}
					if asJSON {
						enc := json.NewEncoder(g.stdout)
						enc.SetIndent("", "  ")
						return enc.Encode(tui.ImportSummary(plan, res, g.where()))
					}
					return tui.WriteImport(g.stdout, plan, res, g.where())
				})
			}
			submit := func(ctx context.Context, b *bus.Bus) (string, error) {
				res, err := do(ctx, b)
				if err != nil {
					return "", err
				}
				if _, err := client.Resume(ctx, b, session, "imported", time.Now()); err != nil {
					return "", err
				}
				return tui.ImportText(plan, res, false, ""), nil
			}
			return g.submitAndFollow(cmd.Context(), submit, session, detach, asJSON, workers, out, "")
		},
	}
	cmd.Flags().StringVar(&pipeline, "pipeline", "", "the pipeline file (required)")
	cmd.Flags().StringVar(&input, "input", "", "the session's input (default: DIR/content.md)")
	cmd.Flags().StringVar(&session, "session", "", "session id ([A-Za-z0-9_-], at most 64; a new one); default <pipeline>-<date>-<random>")
	cmd.Flags().BoolVar(&resume, "resume", false, "resume the session at once and follow it to its end, as run does")
	cmd.Flags().BoolVar(&detach, "detach", false, "with --resume: resume and exit without following (needs a running server: serve, or --nats)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print what was imported as JSON (with --resume: the final manifest)")
	cmd.Flags().StringVar(&out, "out", "", "with --resume: when the session completes, write its final artifacts into this directory")
	cmd.Flags().IntVar(&workers, "concurrency", 4, "jobs run at once by the in-process worker (embedded mode, with --resume)")
	return cmd
}

// newResumeCmd is "loopbus resume SESSION": a resume signal (as signal
// resume), then the session followed to its end as run does.
func newResumeCmd(g *globals) *cobra.Command {
	var reason, out string
	var detach, asJSON bool
	var workers int
	cmd := &cobra.Command{
		Use:   "resume SESSION",
		Short: "Resume a paused, stopped or imported session and follow it to its end",
		Long: `Send the session a resume signal (as 'loopbus signal resume SESSION' does): a
paused or stopped session, or one loopbus import made, runs on. Then follow
it to its end as run does, with the same exit codes (0 completed, 1 failed,
3 stopped by its budget, 5 closed, 130 interrupted); --detach returns at
once (it needs a running server: serve, or --nats). A session that runs
already is followed; the orchestrator acknowledges the signal as ignored.`,
		Example: `  loopbus resume kit-1
  loopbus resume kit-1 --reason "summary reviewed" --detach`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usageErr(fmt.Errorf("resume: want SESSION, got %d arguments", len(args)))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			session := args[0]
			if err := schemas.ValidateSessionID(session); err != nil {
				return usageErr(err)
			}
			if detach && out != "" {
				return usageErr(errors.New("resume: --out needs the session followed to its end; it cannot go with --detach"))
			}
			submit := func(ctx context.Context, b *bus.Bus) (string, error) {
				sent, err := client.Resume(ctx, b, session, reason, time.Now())
				if errors.Is(err, client.ErrNoSession) || errors.Is(err, client.ErrBadInput) {
					return "", usageErr(err)
				}
				if err != nil {
					return "", err
				}
				return fmt.Sprintf("session %s: resume sent (recorded at stream sequence %d)", session, sent.Seq), nil
			}
			return g.submitAndFollow(cmd.Context(), submit, session, detach, asJSON, workers, out, "")
		},
	}
	cmd.Flags().StringVar(&reason, "reason", "", "why; kept in the history")
	cmd.Flags().BoolVar(&detach, "detach", false, "resume and exit without following (needs a running server: serve, or --nats)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the final manifest as JSON on stdout (with --detach: the session)")
	cmd.Flags().StringVar(&out, "out", "", "when the session completes, write its final artifacts into this directory (created if missing)")
	cmd.Flags().IntVar(&workers, "concurrency", 4, "jobs run at once by the in-process worker (embedded mode)")
	return cmd
}
