package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/client"
	"github.com/loopbus/loopbus/projections"
	"github.com/loopbus/loopbus/tui"
	"github.com/spf13/cobra"
)

func newSessionsCmd(g *globals) *cobra.Command {
	var f client.SessionFilter
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "sessions",
		Short: "List sessions, newest first: status, pipeline, steps done, cost and age",
		Example: `  loopbus sessions
  loopbus sessions --status running,paused --since 24h
  loopbus sessions --pipeline writing-kit --limit 5 --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := f.Validate(); err != nil {
				return usageErr(err)
			}
			return g.readOnly(cmd, func(ctx context.Context, b *bus.Bus) error {
				list, err := client.New(b).Sessions(ctx, f)
				if err != nil {
					return err
				}
				return tui.WriteSessions(g.stdout, list, asJSON, time.Now())
			})
		},
	}
	cmd.Flags().StringSliceVar(&f.Status, "status", nil, "only sessions in these states, comma-separated: running, paused, stopped, completed, failed")
	cmd.Flags().StringVar(&f.Pipeline, "pipeline", "", "only sessions of this pipeline or backlog (its name)")
	cmd.Flags().DurationVar(&f.MaxAge, "since", 0, "only sessions started within this long (e.g. 2h, 30m)")
	cmd.Flags().IntVar(&f.Limit, "limit", 0, "at most this many sessions (the newest)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print a JSON array of sessions")
	return cmd
}

// finalArtifacts tells, once a session completed, where its results are:
// with out, it writes the final artifacts there and lists them; else it
// names them and the command that fetches them.
func (g *globals) finalArtifacts(ctx context.Context, c *conn, m *projections.Manifest, out string) error {
	if m.Status != projections.StatusCompleted || len(m.Final) == 0 {
		return nil
	}
	if out != "" {
		paths, err := client.New(c.bus).WriteFinal(ctx, m, out)
		if err != nil {
			return fmt.Errorf("--out %s: %w", out, err)
		}
		fmt.Fprintf(g.stderr, "final artifacts written: %s\n", strings.Join(paths, ", "))
		return nil
	}
	names := make([]string, len(m.Final))
	for i, a := range m.Final {
		names[i] = fmt.Sprintf("%s (%d bytes)", a.Name, a.Size)
	}
	where := ""
	switch {
	case g.natsURL != "":
		where = " --nats " + g.natsURL
	case g.dataDir != defaultDataDir():
		where = " --data " + g.dataDir
	}
	fmt.Fprintf(g.stderr, "final artifacts: %s\nget them with: loopbus export %s --dir DIR%s   (or next time: run --out DIR)\n", strings.Join(names, ", "), m.ContentID, where)
	return nil
}
