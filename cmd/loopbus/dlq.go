package main

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"

	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/schemas"
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
				byConsumer := map[string]int{}
				total := 0
				err := b.DeadLetters(ctx, func(dl bus.DeadLetter) error {
					if s, ok := schemas.SessionOfSubject(dl.Subject); session != "" && (!ok || s != session) {
						return nil
					}
					total++
					byConsumer[dl.Consumer]++
					if asJSON {
						line, err := json.Marshal(dl)
						if err != nil {
							return err
						}
						_, err = g.stdout.Write(append(line, '\n'))
						return err
					}
					_, err := fmt.Fprintf(g.stdout, "%6d  %s  event seq %-6d %-40s by %-12s %s\n", dl.Seq,
						dl.Stored.Format("2006-01-02T15:04:05.000Z"), dl.SourceSeq, dl.Subject, dl.Consumer, dl.Reason)
					return err
				})
				if err != nil {
					return err
				}
				if !asJSON {
					// The count goes to stderr so that stdout stays one line per letter.
					fmt.Fprintf(g.stderr, "%d dead letter(s)", total)
					for _, c := range slices.Sorted(maps.Keys(byConsumer)) {
						fmt.Fprintf(g.stderr, ", %d by %s", byConsumer[c], c)
					}
					fmt.Fprintln(g.stderr)
				}
				return nil
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print one JSON object per dead letter (data base64-encoded)")
	cmd.Flags().StringVar(&session, "session", "", "only dead letters published on this session's subjects")
	return cmd
}
