package bench

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/loopbus/loopbus/agentworker"
	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/client"
	"github.com/loopbus/loopbus/definition"
	"github.com/loopbus/loopbus/internal/testnats"
	"github.com/loopbus/loopbus/orchestrator"
	"github.com/loopbus/loopbus/schemas"
	"github.com/loopbus/loopbus/validator"
	"github.com/loopbus/loopbus/workspace"
)

// syncMode is one of the two durability settings every benchmark runs
// under, side by side.
type syncMode struct {
	// name appears in the benchmark name as fsync=<name>.
	name string
	// relaxed is bus.EmbeddedConfig.RelaxedSync.
	relaxed bool
}

// modes: "always" fsyncs before every acknowledgement (loopbus's default
// for its embedded server); "default" is nats-server's own default, a
// periodic flush. The quick sizes run "default" only.
func modes() []syncMode {
	all := []syncMode{{name: "always"}, {name: "default", relaxed: true}}
	if quick() {
		return all[1:]
	}
	return all
}

// quick reports whether the small sizes of `make bench-quick` apply.
func quick() bool { return os.Getenv("LOOPBUS_BENCH_QUICK") == "1" }

// size picks the quick or the full value.
func size(quickN, fullN int) int {
	if quick() {
		return quickN
	}
	return fullN
}

// startServer starts an embedded server on dir with mode's sync setting.
// Calling stop (also run at cleanup) shuts it down.
func startServer(tb testing.TB, dir string, mode syncMode) (srv *bus.Embedded) {
	tb.Helper()
	srv, err := bus.StartEmbedded(bus.EmbeddedConfig{DataDir: dir, RelaxedSync: mode.relaxed}, testnats.Logger(tb))
	if err != nil {
		tb.Fatalf("embedded NATS: %v", err)
	}
	tb.Cleanup(srv.Shutdown)
	return srv
}

// noopPipeline is a valid three-step chain a → b → c whose agent does
// nothing but create its (empty, required) output: the parser insists on
// at least one output per step.
const noopPipeline = `name: bench
steps:
  a:
    agent: {backend: exec, command: [touch, out/a.txt]}
    prompt: "step a of {{.Input.Name}}"
    outputs: [{name: a.txt}]
  b:
    requires: [a]
    agent: {backend: exec, command: [touch, out/b.txt]}
    prompt: "step b of {{.Input.Name}}"
    outputs: [{name: b.txt}]
  c:
    requires: [b]
    agent: {backend: exec, command: [touch, out/c.txt]}
    prompt: "step c of {{.Input.Name}}"
    outputs: [{name: c.txt}]
`

// chain returns noopPipeline's steps in order.
func chain() []string { return []string{"a", "b", "c"} }

func loadPipeline(tb testing.TB) schemas.Pipeline {
	tb.Helper()
	p, err := definition.Parse("bench.yaml", []byte(noopPipeline), tb.TempDir())
	if err != nil {
		tb.Fatalf("pipeline: %v", err)
	}
	return p
}

// system is one embedded server with the services of a deployment, each on
// its own connection, as separate processes would be; or, once serveMode
// is called, all on one in-process connection, as `loopbus serve` runs
// them.
type system struct {
	tb       testing.TB
	url      string
	srv      *bus.Embedded
	admin    *bus.Bus
	pipeline schemas.Pipeline
	input    string
	conns    []*bus.Bus
	// shared is the services' connection in serve mode; nil otherwise.
	shared *bus.Bus
	// reuse makes the workers and the validator reuse workspaces
	// (--reuse-workspaces).
	reuse bool
	// workDirs are the workers' work dirs.
	workDirs []string
}

func newSystem(tb testing.TB, mode syncMode) *system {
	tb.Helper()
	return newSystemOn(tb, startServer(tb, tb.TempDir(), mode))
}

// newSystemOn is newSystem on a running server.
func newSystemOn(tb testing.TB, srv *bus.Embedded) *system {
	tb.Helper()
	input := filepath.Join(tb.TempDir(), "in.md")
	if err := os.WriteFile(input, []byte("# Bench\n\nA short input.\n"), 0o600); err != nil {
		tb.Fatal(err)
	}
	s := &system{tb: tb, url: srv.URL(), srv: srv, pipeline: loadPipeline(tb), input: input}
	s.admin = s.connect("bench/admin")
	return s
}

// connect opens another connection to the system's server.
func (s *system) connect(source string) *bus.Bus {
	s.tb.Helper()
	b := testnats.Connect(s.tb, s.url, source)
	s.conns = append(s.conns, b)
	return b
}

// serveMode makes the services started from now on share one connection
// that reaches the server through memory, as in `loopbus serve`. The
// benchmark's own connections (submitting, watching) stay on the socket,
// as other commands' are.
func (s *system) serveMode() {
	s.tb.Helper()
	b := testnats.ConnectConfig(s.tb, bus.Config{URL: s.url, Name: "bench/serve", InProcess: s.srv.InProcess()}, "bench/serve", testnats.Logger(s.tb))
	s.conns = append(s.conns, b)
	s.shared = b
}

// service returns the connection for a service: the shared one in serve
// mode, else one of its own.
func (s *system) service(source string) *bus.Bus {
	s.tb.Helper()
	if s.shared != nil {
		return s.shared
	}
	return s.connect(source)
}

// closeConns closes every connection the system opened (stop the services
// first), so that the server can shut down quietly.
func (s *system) closeConns() {
	for _, b := range s.conns {
		b.Close()
	}
}

// run starts a service's Run on its own goroutine; the returned stop waits
// for it.
func (s *system) run(name string, run func(context.Context) error) (stop func()) {
	return testnats.Run(s.tb, name, run)
}

func (s *system) startOrchestrator() (stop func()) {
	s.tb.Helper()
	o, err := orchestrator.New(orchestrator.Config{}, s.service("bench/orchestrator"), testnats.Logger(s.tb), time.Now)
	if err != nil {
		s.tb.Fatal(err)
	}
	return s.run("orchestrator", o.Run)
}

func (s *system) startValidator() (stop func()) {
	s.tb.Helper()
	v, err := validator.New(validator.Config{WorkDir: s.tb.TempDir(), ReuseWorkspaces: s.reuse}, s.service("bench/validator"), testnats.Logger(s.tb), time.Now)
	if err != nil {
		s.tb.Fatal(err)
	}
	return s.run("validator", v.Run)
}

// startWorkers starts n agent-worker replicas, each its own Service with
// its own connection, ID and concurrency 1.
func (s *system) startWorkers(n int) (stop func()) {
	s.tb.Helper()
	var stops []func()
	for i := range n {
		id := "w" + strconv.Itoa(i+1)
		dir := s.tb.TempDir()
		s.workDirs = append(s.workDirs, dir)
		w, err := agentworker.New(agentworker.Config{ID: id, WorkDir: dir, ReuseWorkspaces: s.reuse}, s.service("bench/"+id), testnats.Logger(s.tb), time.Now)
		if err != nil {
			s.tb.Fatal(err)
		}
		stops = append(stops, s.run("agentworker "+id, w.Run))
	}
	return func() {
		for _, stop := range stops {
			stop()
		}
	}
}

// submit starts a session the way `loopbus run` does.
func (s *system) submit(ctx context.Context, session string) {
	s.tb.Helper()
	if _, err := client.Submit(ctx, s.admin, s.pipeline, s.input, session, time.Now()); err != nil {
		s.tb.Fatalf("submit %s: %v", session, err)
	}
}

// watchEnds delivers the session id of every session that completes; a
// failed session fails the benchmark (from the watcher's goroutine, so via
// Errorf and the channel closing).
func (s *system) watchEnds(ctx context.Context) <-chan string {
	ends := make(chan string, 1024)
	b := s.connect("bench/watch")
	go func() {
		defer close(ends)
		err := b.Read(ctx, bus.ReadOptions{
			Follow:   true,
			Subjects: []string{"loopbus.evt.*.session.completed", "loopbus.evt.*.session.failed"},
		}, func(ev schemas.Event) error {
			if ev.Type == schemas.TypeSessionFailed {
				s.tb.Errorf("session %s failed: %s", ev.Session, ev.Data.(*schemas.SessionFailed).Reason)
				return bus.ErrStop
			}
			ends <- ev.Session
			return nil
		})
		if err != nil {
			s.tb.Errorf("watch: %v", err)
		}
	}()
	return ends
}

// waitEnds waits for n session ends.
func waitEnds(tb testing.TB, ends <-chan string, n int, timeout time.Duration) {
	tb.Helper()
	deadline := time.After(timeout)
	for i := range n {
		select {
		case _, ok := <-ends:
			if !ok {
				tb.Fatalf("watcher stopped after %d of %d sessions", i, n)
			}
		case <-deadline:
			tb.Fatalf("only %d of %d sessions ended within %s", i, n, timeout)
		}
	}
}

// reused fails tb unless some worker kept a workspace for reuse.
func (s *system) reused(tb testing.TB) {
	tb.Helper()
	for _, d := range s.workDirs {
		es, err := os.ReadDir(d)
		if err != nil {
			tb.Fatal(err)
		}
		for _, e := range es {
			if strings.HasPrefix(e.Name(), workspace.IdlePrefix) {
				return
			}
		}
	}
	tb.Fatalf("no worker kept a workspace (%s*) under %v: reuse did not happen", workspace.IdlePrefix, s.workDirs)
}
