package main

import (
	"context"
	"os"
	"time"

	"github.com/loopbus/loopbus/client"
	"github.com/loopbus/loopbus/tui"
	"github.com/rs/zerolog"
	"github.com/spf13/cobra"
)

func newDoctorCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "doctor",
		Short: "Check the NATS connection, stream, buckets, consumers, agent prerequisites, and sessions owed a decision",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := context.WithTimeout(cmd.Context(), 30*time.Second)
			defer cancel()
			c, err := g.connect(ctx, "doctor", g.logger(zerolog.WarnLevel), false)
			if err != nil {
				tui.WriteChecks(g.stdout, []client.Check{{Name: "nats", Detail: err.Error()}})
				return errFailed
			}
			defer g.disconnect(c)
			where := "server at " + c.Bus.ServerURL()
			if c.OwnsServer() {
				where = "embedded on " + g.dataDir
			}
			checks := client.Doctor(ctx, c.Bus, where)
			checks = append(checks, decisionsCheck(ctx, c.Bus, doctorDecisionBound, time.Now()))
			if g.natsURL == "" {
				dc := client.Check{Name: "data directory", OK: true, Detail: g.dataDir}
				if err := os.MkdirAll(g.dataDir, 0o700); err != nil {
					dc = client.Check{Name: "data directory", Detail: err.Error()}
				}
				checks = append(checks, dc)
			}
			if !tui.WriteChecks(g.stdout, checks) {
				return errFailed
			}
			return nil
		},
	}
}
