package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/loopbus/loopbus/hooks"
	"github.com/loopbus/loopbus/schemas"
	"github.com/oklog/run"
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
	var mu sync.Mutex
	cfg.OnRun = func(r hooks.Run) {
		mu.Lock()
		defer mu.Unlock()
		printHookRun(g.stderr, time.Now(), r)
	}
	// Say when the consumer exists: with start new, events stored before
	// that do not run hooks.
	var s *hooks.Service
	cfg.OnReady = func() {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(g.stderr, "hooks: waiting for events (consumer %s, %d hook(s), subjects %s)\n",
			cfg.Durable(), len(cfg.Hooks), strings.Join(s.Subjects(), " "))
	}
	ctx := cmd.Context()
	c, err := g.connect(ctx, "hooks", log, true)
	if err != nil {
		return err
	}
	defer c.close(g.stderr)
	s, err = hooks.New(cfg, c.bus, log.With().Str("service", "hooks").Logger(), time.Now)
	if err != nil {
		return usageErr(err)
	}
	var group run.Group
	actx, cancel := context.WithCancel(ctx)
	group.Add(func() error {
		if err := s.Run(actx); err != nil {
			return fmt.Errorf("hooks: %w", err)
		}
		if actx.Err() == nil {
			return errors.New("hooks stopped")
		}
		return nil
	}, func(error) { cancel() })
	addSignals(&group, ctx)
	err = group.Run()
	cancel()
	if err != nil && !isSignal(err) {
		return err
	}
	return nil
}

// printHookRun prints one run as a line: when, which hook for which event,
// and how it ended.
func printHookRun(w io.Writer, at time.Time, r hooks.Run) {
	res := r.Result
	what := fmt.Sprintf("%s hook %s for %s #%d (session %s)", at.Format("15:04:05"), res.Hook, res.EventType, res.EventSeq, r.Event.Session)
	dur := (time.Duration(res.DurationMs) * time.Millisecond).String()
	switch {
	case r.Skipped:
		fmt.Fprintf(w, "%s: already ran before a restart, skipped\n", what)
	case r.Type == schemas.TypeHookCompleted:
		fmt.Fprintf(w, "%s: exit 0 in %s\n", what, dur)
	default:
		line := fmt.Sprintf("%s: FAILED in %s: %s", what, dur, res.Error)
		if tail := hookTailLine(res.OutputTail); tail != "" {
			line += ": " + tail
		}
		fmt.Fprintln(w, line)
	}
}

// hookTailLine returns the last non-empty line of text, trimmed.
func hookTailLine(text string) string {
	lines := strings.Split(strings.TrimSpace(text), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}
