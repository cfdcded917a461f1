package client

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/loopbus/loopbus/agent"
	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/projections"
	"github.com/loopbus/loopbus/schemas"
)

// WorkerLister lists the agent workers present (bus.Bus does).
type WorkerLister interface {
	Workers(ctx context.Context) ([]bus.WorkerInfo, error)
}

// LanesFunc returns the tool lanes a job's agent needs, as far as its
// backend says in advance (agent.ToolPlanner); nil when it does not.
type LanesFunc func(spec schemas.AgentSpec) []string

// PlannedLanes returns a LanesFunc deciding lanes as a worker with the
// backends reg and the lane table would (see agentworker's missingLane).
// The table is this process's configuration: a worker configured with
// another table may decide otherwise.
func PlannedLanes(reg agent.Registry, table *agent.LaneTable) LanesFunc {
	return func(spec schemas.AgentSpec) []string {
		b, err := reg.Lookup(spec.Backend)
		if err != nil {
			return nil
		}
		p, ok := b.(agent.ToolPlanner)
		if !ok {
			return nil
		}
		var lanes []string
		for _, t := range p.PlannedTools(spec) {
			if l := table.Lane(t.Name, t.Category); !slices.Contains(lanes, l) {
				lanes = append(lanes, l)
			}
		}
		return sortLanes(lanes)
	}
}

// sortLanes orders lanes as agent.AllLanes does.
func sortLanes(lanes []string) []string {
	order := agent.AllLanes()
	slices.SortFunc(lanes, func(a, b string) int { return slices.Index(order, a) - slices.Index(order, b) })
	return lanes
}

// ServedLanes maps each lane to the ids of the workers present that serve it.
func ServedLanes(workers []bus.WorkerInfo) map[string][]string {
	out := map[string][]string{}
	for _, l := range agent.AllLanes() {
		out[l] = []string{}
	}
	for _, w := range workers {
		for _, l := range w.Lanes {
			out[l] = append(out[l], w.ID)
		}
	}
	return out
}

// UnservedLanes lists the lanes no worker present serves.
func UnservedLanes(workers []bus.WorkerInfo) []string {
	var out []string
	for _, l := range agent.AllLanes() {
		if len(ServedLanes(workers)[l]) == 0 {
			out = append(out, l)
		}
	}
	return out
}

// LaneWait is a job requested and not started yet.
type LaneWait struct {
	Job       string    `json:"job"`
	Step      string    `json:"step"`
	Requested time.Time `json:"requested,omitzero"`
	// Lanes are the lanes the job needs (by the LanesFunc given), Unserved
	// those no worker present serves.
	Lanes    []string `json:"lanes,omitempty"`
	Unserved []string `json:"unserved,omitempty"`
	// Message says it in words, e.g. "no worker for lane heavy".
	Message string `json:"message"`
}

// NoWorkerMessage says that no worker serves the lanes.
func NoWorkerMessage(lanes []string) string {
	if len(lanes) == 1 {
		return "no worker for lane " + lanes[0]
	}
	return "no worker for lanes " + strings.Join(lanes, ", ")
}

// SlowStart is how long a job whose lanes are served may wait for a
// worker before WaitingJobs names it.
const SlowStart = 30 * time.Second

// WaitingJobs returns the jobs of m (the session's manifest) that are
// requested and not started, and why they may wait: for each, the lanes it
// needs (by lanes) that none of workers serves. It reads the session's
// job.requested events for the jobs' agents. A job whose lanes are served
// is listed only once it has waited SlowStart.
func WaitingJobs(ctx context.Context, b Bus, m *projections.Manifest, workers []bus.WorkerInfo, lanes LanesFunc) ([]LaneWait, error) {
	if m == nil || m.Status != projections.StatusRunning {
		return nil, nil
	}
	waiting := map[string]bool{}
	for id, j := range m.Jobs {
		if j.Status == projections.JobStatusRequested {
			waiting[id] = true
		}
	}
	if len(waiting) == 0 {
		return nil, nil
	}
	evs, err := Events(ctx, b, m.ContentID, Until{})
	if err != nil {
		return nil, err
	}
	served := ServedLanes(workers)
	var out []LaneWait
	for _, ev := range evs {
		jr, ok := ev.Data.(*schemas.JobRequested)
		if !ok || !waiting[jr.JobID] {
			continue
		}
		delete(waiting, jr.JobID)
		w := LaneWait{Job: jr.JobID, Step: jr.Step, Requested: ev.Time}
		if lanes != nil {
			w.Lanes = lanes(jr.Agent)
		}
		if len(workers) == 0 {
			w.Unserved = w.Lanes
			w.Message = "no worker is running"
		} else {
			for _, l := range w.Lanes {
				if len(served[l]) == 0 {
					w.Unserved = append(w.Unserved, l)
				}
			}
			switch {
			case len(w.Unserved) > 0:
				w.Message = NoWorkerMessage(w.Unserved)
			case time.Since(ev.Time) > SlowStart:
				w.Message = "no worker started it yet (workers present serve its lanes: busy?)"
			default:
				continue // just requested: not worth a word
			}
		}
		out = append(out, w)
	}
	slices.SortFunc(out, func(a, b LaneWait) int { return a.Requested.Compare(b.Requested) })
	return out, nil
}

// WorkersCheck is doctor's finding about the workers present: which lanes
// each serves, and a warning naming the lanes none serves.
func WorkersCheck(ctx context.Context, wl WorkerLister) Check {
	ws, err := wl.Workers(ctx)
	if errors.Is(err, bus.ErrNoPresence) {
		return Check{Name: "workers", OK: true, Warn: true, Detail: err.Error() + ": provision the bucket once as a user allowed to (e.g. loopbus doctor as the admin) to see which workers run"}
	}
	if err != nil {
		return Check{Name: "workers", Detail: err.Error()}
	}
	if len(ws) == 0 {
		return Check{Name: "workers", OK: true, Warn: true, Detail: "no agent worker is running: jobs wait (start `loopbus agentworker`)"}
	}
	parts := make([]string, 0, len(ws))
	for _, w := range ws {
		parts = append(parts, fmt.Sprintf("%s [%s]", w.ID, strings.Join(w.Lanes, ",")))
	}
	detail := fmt.Sprintf("%d present: %s", len(ws), strings.Join(parts, "; "))
	if un := UnservedLanes(ws); len(un) > 0 {
		return Check{Name: "workers", OK: true, Warn: true, Detail: detail + "; " + NoWorkerMessage(un) + ": jobs that need it wait"}
	}
	return Check{Name: "workers", OK: true, Detail: detail}
}
