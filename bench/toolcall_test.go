package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/loopbus/loopbus/agent"
	"github.com/loopbus/loopbus/agent/openai"
	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/internal/modelserver"
	"github.com/loopbus/loopbus/schemas"
)

// BenchmarkToolCall measures what the worker adds to each tool call of a
// model-API agent. A scripted OpenAI-compatible server (streaming) asks for
// `calls` read_file calls, one per turn, then ends; a job of it runs
// through a real worker and bus (each call a tool.started and a
// tool.completed, with the job's workspace, result and artifacts around
// it), and, side by side in the same run, through the backend alone (no
// worker, no bus, events dropped). The same two with no tool call give
// each way's fixed cost, so that
//
//	worker_us/call = (worker job with calls − worker job without) / calls
//	direct_us/call = (backend alone with calls − without) / calls
//
// and overhead_us/call is their difference: the worker's cost per tool
// call (its events published and acknowledged), on top of the model's
// turn and the tool itself. Medians over the rounds; the overhead is the
// median of each round's own difference, as the four jobs of a round run
// back to back and the machine's pace drifts between rounds.
func BenchmarkToolCall(b *testing.B) {
	mode := modes()[len(modes())-1] // the default fsync, as the summary reports
	b.Run("fsync="+mode.name, func(b *testing.B) {
		calls, rounds := 50, size(9, 15)
		ms := modelserver.New(b)
		replies := make([]modelserver.Reply, calls)
		for i := range replies {
			replies[i] = modelserver.Reply{Usage: modelserver.Usage{Input: 100, Output: 10},
				Calls: []modelserver.Call{{Name: "read_file", Args: `{"path":"prompt.md"}`}}}
		}
		ms.Add("calls", modelserver.Script{Replies: replies})
		ms.Add("none", modelserver.Script{})
		spec := func(name string) schemas.AgentSpec {
			return schemas.AgentSpec{Backend: schemas.BackendOpenAI, Model: "bench", BaseURL: ms.OpenAIURL(name), Tools: []string{"read_file"}, MaxTurns: calls + 1}
		}

		sys := newSystem(b, mode)
		sys.startWorkers(1)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		results := sys.watchResults(ctx)

		var worker, workerNone, direct, directNone []time.Duration
		b.ResetTimer()
		for i := range b.N * rounds {
			worker = append(worker, sys.timeJob(b, results, fmt.Sprintf("calls%d", i), spec("calls")))
			workerNone = append(workerNone, sys.timeJob(b, results, fmt.Sprintf("none%d", i), spec("none")))
			direct = append(direct, timeDirect(b, spec("calls"), calls))
			directNone = append(directNone, timeDirect(b, spec("none"), 0))
		}
		b.StopTimer()
		per := func(with, without []time.Duration) float64 {
			return float64(median(with)-median(without)) / float64(time.Microsecond) / float64(calls)
		}
		overheads := make([]time.Duration, len(worker))
		for i := range worker {
			overheads[i] = (worker[i] - workerNone[i]) - (direct[i] - directNone[i])
		}
		b.ReportMetric(per(worker, workerNone), "worker_us/call")
		b.ReportMetric(per(direct, directNone), "direct_us/call")
		b.ReportMetric(float64(median(overheads))/float64(time.Microsecond)/float64(calls), "overhead_us/call")
		b.ReportMetric(0, "ns/op")
	})
}

func median(ds []time.Duration) time.Duration {
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

// watchResults follows every job's result and sends its job id.
func (s *system) watchResults(ctx context.Context) <-chan string {
	out := make(chan string, 64)
	b := s.connect("bench/results")
	go func() {
		err := b.Read(ctx, bus.ReadOptions{Follow: true, Subjects: []string{"loopbus.evt.*.job.completed", "loopbus.evt.*.job.failed"}},
			func(ev schemas.Event) error {
				if ev.Type == schemas.TypeJobFailed {
					s.tb.Errorf("job %s failed: %s", ev.Job, ev.Data.(*schemas.JobFailed).Error)
				}
				out <- ev.Job
				return nil
			})
		if err != nil && ctx.Err() == nil {
			s.tb.Errorf("watch results: %v", err)
		}
	}()
	return out
}

// timeJob publishes a job of spec (session id) and returns how long it
// took to its result.
func (s *system) timeJob(tb testing.TB, results <-chan string, id string, spec schemas.AgentSpec) time.Duration {
	tb.Helper()
	jobID := id + ".step.1"
	jr := &schemas.JobRequested{JobID: jobID, Step: "step", Iteration: 1, Attempt: 1, Agent: spec,
		Prompt: "Read prompt.md, again and again.", Inputs: []schemas.ArtifactRef{}, TimeoutMs: 60000}
	start := time.Now()
	_, err := s.admin.Publish(context.Background(), schemas.Event{
		ID: schemas.DeterministicID(id, "job.requested"), Type: schemas.TypeJobRequested, Session: id, Step: "step", Job: jobID,
		Correlation: id, Time: start, Data: jr,
	})
	if err != nil {
		tb.Fatal(err)
	}
	timeout := time.After(2 * time.Minute)
	for {
		select {
		case got := <-results:
			if got == jobID {
				return time.Since(start)
			}
		case <-timeout:
			tb.Fatalf("job %s: no result", jobID)
		}
	}
}

// timeDirect runs spec's agent with the backend alone, in a workspace like
// the worker's, and returns how long it took.
func timeDirect(tb testing.TB, spec schemas.AgentSpec, calls int) time.Duration {
	tb.Helper()
	dir := tb.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "prompt.md"), []byte("Read prompt.md, again and again."), 0o600); err != nil {
		tb.Fatal(err)
	}
	n := 0
	start := time.Now()
	res, err := openai.Backend{}.Run(context.Background(), agent.Job{Spec: spec, Dir: dir, Prompt: "Read prompt.md, again and again.",
		Env: []string{"PATH=" + os.Getenv("PATH")}}, func(ev agent.Event) {
		if ev.Kind == agent.KindToolEnd {
			n++
		}
	})
	took := time.Since(start)
	if err != nil || res.ExitCode != 0 || n != calls {
		tb.Fatalf("direct run: %+v, %v, %d tool calls, want %d", res, err, n, calls)
	}
	return took
}
