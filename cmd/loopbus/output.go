package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/projections"
	"github.com/loopbus/loopbus/schemas"
	"github.com/rs/zerolog"
	"github.com/spf13/cobra"
)

func printManifest(w io.Writer, m *projections.Manifest, asJSON bool) error {
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(m)
	}
	fmt.Fprintf(w, "session   %s\npipeline  %s\nstatus    %s\nsource    %s\nupdated   %s (stream seq %d)\n",
		m.ContentID, m.Pipeline, m.Status, m.SourceHash, m.UpdatedAt.UTC().Format(time.RFC3339), m.LastSeq)
	if m.Error != "" {
		fmt.Fprintf(w, "error     %s\n", m.Error)
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "STEP\tSTATUS\tITER\tHASH\tDETAIL")
	for _, name := range m.StepOrder {
		st := m.Steps[name]
		if st == nil {
			continue
		}
		detail := st.ErrorMessage
		if detail == "" && st.Status == projections.StepStatusInProgress && st.Worker != "" {
			detail = "on " + st.Worker
		}
		if detail == "" && st.LastFeedback != "" && st.Status != projections.StepStatusCompleted {
			detail = "last feedback: " + st.LastFeedback
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", name, st.Status, st.Iterations, st.ContentHash, oneLine(detail, 100))
	}
	return tw.Flush()
}

func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

// summarize is the one-line description of an event for `events`.
func summarize(e schemas.Event) string {
	switch d := e.Data.(type) {
	case *schemas.SessionStarted:
		return fmt.Sprintf("pipeline=%s input=%s steps=%d", d.Pipeline.Name, d.Input.Name, len(d.Pipeline.Steps))
	case *schemas.JobRequested:
		return fmt.Sprintf("job=%s iteration=%d", d.JobID, d.Iteration)
	case *schemas.JobStarted:
		return fmt.Sprintf("job=%s worker=%s delivery=%d", d.JobID, d.Worker, d.Delivery)
	case *schemas.ToolStarted:
		return fmt.Sprintf("tool=%s %s", d.Name, oneLine(d.Input, 60))
	case *schemas.ToolCompleted:
		return fmt.Sprintf("tool=%s status=%s exit=%d %dms", d.Name, d.Status, d.ExitCode, d.DurationMs)
	case *schemas.ArtifactStored:
		return fmt.Sprintf("%s %d bytes %s", d.Artifact.Name, d.Artifact.Size, schemas.ShortHash(d.Artifact.Digest))
	case *schemas.JobCompleted:
		return fmt.Sprintf("job=%s exit=%d %dms artifacts=%d", d.JobID, d.ExitCode, d.DurationMs, len(d.Artifacts))
	case *schemas.JobFailed:
		return fmt.Sprintf("job=%s %s", d.JobID, oneLine(d.Error, 80))
	case *schemas.Verdict:
		if len(d.Errors) == 0 {
			return fmt.Sprintf("job=%s", d.JobID)
		}
		return fmt.Sprintf("job=%s errors=%d first: %s", d.JobID, len(d.Errors), oneLine(d.Errors[0].Pointer+" "+d.Errors[0].Message, 60))
	case *schemas.StepCompleted:
		return fmt.Sprintf("iterations=%d hash=%s", d.Iterations, d.ContentHash)
	case *schemas.StepFailed:
		return oneLine(d.Error, 80)
	case *schemas.SessionCompleted:
		return fmt.Sprintf("final=%d artifacts", len(d.Final))
	case *schemas.SessionFailed:
		return oneLine(d.Reason, 80)
	}
	return ""
}

// progress prints a line per meaningful event while `run`/`wait` follow a
// session.
type progress struct {
	mu    sync.Mutex
	w     io.Writer
	start map[string]time.Time
}

func newProgress(w io.Writer) *progress { return &progress{w: w, start: map[string]time.Time{}} }

func (p *progress) event(ev schemas.Event, m *projections.Manifest) {
	p.mu.Lock()
	defer p.mu.Unlock()
	ts := ev.Time.Local().Format("15:04:05")
	switch d := ev.Data.(type) {
	case *schemas.JobRequested:
		p.start[d.JobID] = ev.Time
		fmt.Fprintf(p.w, "%s  → %s: iteration %d queued\n", ts, d.Step, d.Iteration)
	case *schemas.JobStarted:
		fmt.Fprintf(p.w, "%s    %s: running on %s%s\n", ts, ev.Step, d.Worker, redelivery(d.Delivery))
	case *schemas.JobFailed:
		fmt.Fprintf(p.w, "%s  ✗ %s: iteration %d failed: %s\n", ts, d.Step, d.Iteration, oneLine(d.Error, 120))
	case *schemas.Verdict:
		if ev.Type == schemas.TypeValidationFailed {
			msgs := make([]string, 0, len(d.Errors))
			for _, e := range d.Errors {
				msgs = append(msgs, strings.TrimSpace(e.Artifact+" "+e.Pointer+" "+e.Message))
			}
			fmt.Fprintf(p.w, "%s  ✗ %s: iteration %d failed validation: %s\n", ts, d.Step, d.Iteration, oneLine(strings.Join(msgs, "; "), 160))
		}
	case *schemas.StepCompleted:
		took := ""
		if t, ok := p.start[d.JobID]; ok {
			took = fmt.Sprintf(" in %s", ev.Time.Sub(t).Round(time.Millisecond))
		}
		fmt.Fprintf(p.w, "%s  ✓ %s completed%s (iterations %d, hash %s)\n", ts, d.Step, took, d.Iterations, d.ContentHash)
	case *schemas.StepFailed:
		fmt.Fprintf(p.w, "%s  ✗ %s failed: %s\n", ts, d.Step, oneLine(d.Error, 200))
	case *schemas.SessionCompleted:
		fmt.Fprintf(p.w, "%s  ✓ session %s completed in %s\n", ts, ev.Session, ev.Time.Sub(m.CreatedAt).Round(time.Millisecond))
	}
}

func redelivery(n int) string {
	if n > 1 {
		return fmt.Sprintf(" (delivery %d: an earlier worker did not finish)", n)
	}
	return ""
}

func newDoctorCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "doctor",
		Short: "Check the NATS connection, stream, buckets, consumers and agent prerequisites",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := context.WithTimeout(cmd.Context(), 30*time.Second)
			defer cancel()
			failed := 0
			check := func(name string, err error, detail string) {
				if err != nil {
					failed++
					fmt.Fprintf(g.stdout, "FAIL  %-22s %v\n", name, err)
					return
				}
				fmt.Fprintf(g.stdout, "ok    %-22s %s\n", name, detail)
			}
			c, err := g.connect(ctx, "doctor", g.logger(zerolog.WarnLevel))
			if err != nil {
				check("nats", err, "")
				return errSessionFailed
			}
			defer c.close()
			nc := c.bus.Conn()
			mode := "server at " + nc.ConnectedUrlRedacted()
			if c.ownsServer() {
				mode = "embedded on " + g.dataDir
			}
			check("nats", nil, fmt.Sprintf("%s, version %s", mode, nc.ConnectedServerVersion()))
			if !atLeast(nc.ConnectedServerVersion(), 2, 12) {
				check("server version", fmt.Errorf("%s is older than 2.12: atomic batches are unavailable", nc.ConnectedServerVersion()), "")
			}
			js := c.bus.JetStream()
			if s, err := js.Stream(ctx, c.bus.StreamName()); err != nil {
				check("event stream", err, "")
			} else {
				info, err := s.Info(ctx)
				if err == nil {
					cfg := info.Config
					var bad []string
					if !cfg.DenyDelete || !cfg.DenyPurge {
						bad = append(bad, "delete/purge allowed")
					}
					if !cfg.AllowAtomicPublish {
						bad = append(bad, "atomic publish off")
					}
					if len(bad) > 0 {
						err = fmt.Errorf("%s: %s", cfg.Name, strings.Join(bad, ", "))
					}
				}
				if err != nil {
					check("event stream", err, "")
				} else {
					check("event stream", nil, fmt.Sprintf("%s: %d events, %d bytes, replicas %d", info.Config.Name, info.State.Msgs, info.State.Bytes, info.Config.Replicas))
				}
				for _, name := range []string{"agentworker", "validator"} {
					cons, err := s.Consumer(ctx, name)
					if err != nil {
						check("consumer "+name, fmt.Errorf("not created yet (start the %s service)", name), "")
						continue
					}
					ci, err := cons.Info(ctx)
					if err != nil {
						check("consumer "+name, err, "")
						continue
					}
					check("consumer "+name, nil, fmt.Sprintf("%d pending, %d in progress, %d redelivered", ci.NumPending, ci.NumAckPending, ci.NumRedelivered))
				}
			}
			if s, err := js.Stream(ctx, bus.DefaultDLQStream); err == nil {
				if info, err := s.Info(ctx); err == nil {
					detail := "empty"
					if info.State.Msgs > 0 {
						detail = fmt.Sprintf("%d dead letters: inspect with 'nats stream view %s' or any NATS client", info.State.Msgs, bus.DefaultDLQStream)
					}
					check("dead letters", nil, detail)
				}
			}
			if _, err := exec.LookPath("sh"); err != nil {
				check("sh", err, "")
			} else {
				check("sh", nil, "found (exec agents and validate commands)")
			}
			if g.natsURL == "" {
				if err := os.MkdirAll(g.dataDir, 0o700); err != nil {
					check("data directory", err, "")
				} else {
					check("data directory", nil, g.dataDir)
				}
			}
			if failed > 0 {
				return errSessionFailed
			}
			return nil
		},
	}
}

// atLeast reports whether a "major.minor.patch" version is at least
// major.minor.
func atLeast(version string, major, minor int) bool {
	var a, b int
	if _, err := fmt.Sscanf(version, "%d.%d", &a, &b); err != nil {
		return false
	}
	return a > major || a == major && b >= minor
}
