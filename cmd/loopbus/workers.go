package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/loopbus/loopbus/agent"
	"github.com/loopbus/loopbus/agentworker"
	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/client"
	"github.com/loopbus/loopbus/config"
	"github.com/loopbus/loopbus/projections"
	"github.com/loopbus/loopbus/tui"
)

// jobLanes decides the lanes of a job's agent with the built-in backends
// and this process's lane table (the lanes of the config files), as a
// worker with the same configuration would.
func jobLanes() (client.LanesFunc, error) {
	_, table, err := config.WorkerLanes(nil)
	if err != nil {
		return nil, err
	}
	reg := agentworker.Builtin()
	lt, err := agent.NewLaneTable(reg.DefaultLanes(), table)
	if err != nil {
		return nil, err
	}
	return client.PlannedLanes(reg, lt), nil
}

// statusWithWorkers is status --json's output when jobs wait: the manifest
// and, under "waiting", the jobs requested and not started with the lanes
// no worker present serves.
type statusWithWorkers struct {
	*projections.Manifest
	Waiting []client.LaneWait `json:"waiting,omitempty"`
}

// writeStatus writes the manifest (tui.WriteStatus) and the jobs waiting
// for a worker: "job J (step S) waiting 2m: no worker for lane heavy".
func writeStatus(ctx context.Context, w io.Writer, b *bus.Bus, m *projections.Manifest, asJSON bool) error {
	waits, err := waitingJobs(ctx, b, m)
	if err != nil {
		waits = []client.LaneWait{{Message: "cannot tell which workers are present: " + err.Error()}}
	}
	if asJSON && len(waits) > 0 {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(statusWithWorkers{Manifest: m, Waiting: waits})
	}
	now := time.Now()
	if err := tui.WriteStatus(w, m, asJSON, now); err != nil {
		return err
	}
	if asJSON {
		return nil
	}
	for _, wt := range waits {
		if wt.Job == "" {
			fmt.Fprintf(w, "workers   %s\n", wt.Message)
			continue
		}
		fmt.Fprintf(w, "waiting   job %s (step %s) requested %s ago: %s\n", wt.Job, wt.Step, now.Sub(wt.Requested).Round(time.Second), wt.Message)
	}
	return writeForks(ctx, w, b, m.ContentID)
}

func waitingJobs(ctx context.Context, b *bus.Bus, m *projections.Manifest) ([]client.LaneWait, error) {
	if m == nil || m.Status != projections.StatusRunning {
		return nil, nil
	}
	ws, err := b.Workers(ctx)
	if errors.Is(err, bus.ErrNoPresence) {
		return nil, nil // presence is off: status says nothing of workers
	}
	if err != nil {
		return nil, err
	}
	lanes, err := jobLanes()
	if err != nil {
		return nil, err
	}
	return client.WaitingJobs(ctx, b, m, ws, lanes)
}
