package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/loopbus/loopbus/internal/client"
	"github.com/rs/zerolog"
	"github.com/spf13/cobra"
)

func newDoctorCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "doctor",
		Short: "Check the NATS connection, stream, buckets, consumers and agent prerequisites",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := context.WithTimeout(cmd.Context(), 30*time.Second)
			defer cancel()
			print := func(c client.Check) {
				status := "ok  "
				if !c.OK {
					status = "FAIL"
				}
				fmt.Fprintf(g.stdout, "%s  %-22s %s\n", status, c.Name, c.Detail)
			}
			c, err := g.connect(ctx, "doctor", g.logger(zerolog.WarnLevel), false)
			if err != nil {
				print(client.Check{Name: "nats", Detail: err.Error()})
				return errFailed
			}
			defer c.close(g.stderr)
			where := "server at " + c.bus.ServerURL()
			if c.ownsServer() {
				where = "embedded on " + g.dataDir
			}
			failed := false
			checks := client.Doctor(ctx, c.bus, where)
			if g.natsURL == "" {
				dc := client.Check{Name: "data directory", OK: true, Detail: g.dataDir}
				if err := os.MkdirAll(g.dataDir, 0o700); err != nil {
					dc = client.Check{Name: "data directory", Detail: err.Error()}
				}
				checks = append(checks, dc)
			}
			for _, ch := range checks {
				print(ch)
				failed = failed || !ch.OK
			}
			if failed {
				return errFailed
			}
			return nil
		},
	}
}
