package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/hooks"
	"github.com/loopbus/loopbus/tui"
	"github.com/rs/zerolog"
	"github.com/spf13/cobra"
)

func newHooksCmd(g *globals) *cobra.Command {
	var file, runner string
	var ackWait time.Duration
	cmd := &cobra.Command{
		Use:   "hooks --config HOOKS.yaml",
		Short: "Run commands for events (chat notifiers, CI triggers, post-iteration scripts) from a hooks file",
		Long: `hooks runs the commands of a hooks file for the events they name, each with the
event as a structured CloudEvent on stdin and LOOPBUS_EVENT_* variables in its
environment, and records every run as loopbus.hook.completed or
loopbus.hook.failed in the event's session. Events are handled in stream order
through the runner's durable consumer hooks-<runner>: a restarted runner
continues where it stopped, without running a hook twice for one event.
hook.* events never run hooks. One line per run is printed on stderr.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if file == "" {
				return usageErr(errors.New("hooks: --config HOOKS.yaml is required"))
			}
			cfg, err := hooks.Load(file)
			if err != nil {
				return usageErr(err)
			}
			if cmd.Flags().Changed("runner") {
				cfg.Runner = runner
			}
			cfg.AckWait = ackWait
			if err := cfg.Validate(); err != nil {
				return usageErr(err)
			}
			return g.runHooks(cmd, cfg)
		},
	}
	cmd.Flags().StringVar(&file, "config", "", "hooks file (YAML) naming the hooks and their events (required)")
	cmd.Flags().StringVar(&runner, "runner", "", "runner name, overriding the file's: the durable consumer is hooks-<runner>")
	cmd.Flags().DurationVar(&ackWait, "ack-wait", 30*time.Second, "an event whose runner was killed mid-hook is delivered again after this long")
	return cmd
}

func (g *globals) runHooks(cmd *cobra.Command, cfg hooks.Config) error {
	// Each run is printed as a line; the log adds detail at --log-level info.
	log := g.logger(zerolog.WarnLevel).With().Str("process", "hooks").Logger()
	out := tui.NewHookLog(g.stderr)
	cfg.OnRun = out.Run
	var s *hooks.Service
	cfg.OnReady = func() { out.Ready(cfg.Durable(), len(cfg.Hooks), s.Subjects()) }
	return g.runService(cmd.Context(), "hooks", func(ctx context.Context, b *bus.Bus, _ zerolog.Logger) error {
		var err error
		if s, err = hooks.New(cfg, b, log.With().Str("service", "hooks").Logger(), time.Now); err != nil {
			return usageErr(err)
		}
		if err := s.Run(ctx); err != nil {
			return fmt.Errorf("hooks: %w", err)
		}
		if ctx.Err() == nil {
			return errors.New("hooks stopped")
		}
		return nil
	})
}
