package main

import (
	"context"
	"time"

	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/client"
	"github.com/loopbus/loopbus/config"
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

// where is the connection flags a later command needs to reach this
// command's bus: --nats (its passwords and tokens hidden: a hint is
// printed, and credentials go in LOOPBUS_* variables), or --data when not
// the default.
func (g *globals) where() string {
	switch {
	case g.natsURL != "":
		return " --nats " + redactURLs(g.natsURL)
	case g.dataDir != config.DefaultDataDir():
		return " --data " + g.dataDir
	}
	return ""
}
