package main

import (
	"context"

	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/schemas"
	"github.com/loopbus/loopbus/tui"
	"github.com/spf13/cobra"
)

func newDLQCmd(g *globals) *cobra.Command {
	var asJSON bool
	var session string
	cmd := &cobra.Command{
		Use:   "dlq",
		Short: "List dead letters: messages on the event stream that no service could accept, with the reason",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if session != "" {
				if err := schemas.ValidateSessionID(session); err != nil {
					return usageErr(err)
				}
			}
			return g.readOnly(cmd, func(ctx context.Context, b *bus.Bus) error {
				list := tui.NewDeadLetters(g.stdout, asJSON)
				err := b.DeadLetters(ctx, func(dl bus.DeadLetter) error {
					if s, ok := schemas.SessionOfSubject(dl.Subject); session != "" && (!ok || s != session) {
						return nil
					}
					return list.Add(dl)
				})
				if err != nil {
					return err
				}
				if !asJSON {
					// The count goes to stderr so that stdout stays one line per letter.
					list.Total(g.stderr)
				}
				return nil
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print one JSON object per dead letter (data base64-encoded)")
	cmd.Flags().StringVar(&session, "session", "", "only dead letters published on this session's subjects")
	return cmd
}
