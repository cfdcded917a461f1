package e2e

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

// relaySteps: a quick step, a step whose agent can be held, and a step that
// fails validation once before it passes.
var relaySteps = []chaosStep{
	{name: "first"},
	{name: "held", requires: []string{"first"}, hold: true},
	{name: "last", requires: []string{"held"}, passAt: 2},
}

// diamondSteps: one step, a parallel pair after it, and a step joining
// them that fails validation once before it passes.
var diamondSteps = []chaosStep{
	{name: "a"},
	{name: "b1", requires: []string{"a"}},
	{name: "b2", requires: []string{"a"}},
	{name: "c", requires: []string{"b1", "b2"}, passAt: 2},
}

// stall is how long sessions may make no progress at all before a test
// calls it a hang; generous for binaries built with -race on a busy host.
const stall = 90 * time.Second

// checkRanOnce requires every agent of session to have run exactly once
// per iteration its step needs.
func checkRanOnce(t *testing.T, runs map[string]int, session string, steps []chaosStep) {
	t.Helper()
	for _, s := range steps {
		for it := 1; it <= s.iterations(); it++ {
			if n := runs[fmt.Sprintf("%s %s %d", session, s.name, it)]; n != 1 {
				t.Errorf("session %s: agent of %s iteration %d ran %d times, want 1", session, s.name, it, n)
			}
		}
	}
}

// checkStartedOnce requires every job to have been started exactly once.
func checkStartedOnce(t *testing.T, session string, started map[string][]chaosEvent) {
	t.Helper()
	for job, evs := range started {
		if len(evs) != 1 || evs[0].Data.Delivery != 1 {
			t.Errorf("session %s: job %s started %d times (deliveries %v), want once", session, job, len(evs), deliveries(evs))
		}
	}
}

func deliveries(evs []chaosEvent) []string {
	var out []string
	for _, e := range evs {
		out = append(out, fmt.Sprintf("%s#%d", e.Data.Worker, e.Data.Delivery))
	}
	return out
}

// TestChaosWorkerKilledMidJob: of two agent worker replicas, the one
// running a job is SIGKILLed mid-job. The job is redelivered to the other
// replica and completes, every step completes once, and the manifest equals
// that of an undisturbed session of the same pipeline and input.
func TestChaosWorkerKilledMidJob(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	ps := c.all(2, 1, 2*time.Second)
	pipe, input := c.writePipeline("relay", relaySteps)
	global := c.global()

	c.release("calm-1.held")
	c.submit(pipe, input, "calm-1")
	calm := loopbus(t, append([]string{"wait", "calm-1", "--json"}, global...)...)
	if calm.code != 0 {
		t.Fatalf("wait calm-1: exit %d\n%s", calm.code, calm.stderr)
	}

	c.submit(pipe, input, "kill-1")
	var first chaosEvent
	eventually(t, 120*time.Second, "the held agent of kill-1 to run", func() bool {
		c.checkAlive()
		if c.runs()["kill-1 held 1"] == 0 {
			return false
		}
		for _, e := range c.events()["kill-1"] {
			if e.Type == "loopbus.job.started" && e.Step == "held" {
				first = e
				return true
			}
		}
		return false
	})
	victim, survivor := first.Data.Worker, "worker-a"
	if victim == survivor {
		survivor = "worker-b"
	}
	if ps[victim] == nil || first.Data.Delivery != 1 {
		t.Fatalf("held job started by %q, delivery %d; want worker-a or worker-b, delivery 1", victim, first.Data.Delivery)
	}
	t.Logf("job %s runs on %s; killing it", first.jobID(), victim)
	if err := ps[victim].kill(); err != nil {
		t.Fatal(err)
	}
	c.release("kill-1.held")
	w := loopbus(t, append([]string{"wait", "kill-1", "--json"}, global...)...)
	if w.code != 0 {
		t.Fatalf("wait kill-1: exit %d\n%s", w.code, w.stderr)
	}

	all := c.events()
	checkStartedOnce(t, "calm-1", checkDecisions(t, "calm-1", all["calm-1"], relaySteps))
	started := checkDecisions(t, "kill-1", all["kill-1"], relaySteps)
	for job, evs := range started {
		if job == first.jobID() {
			continue
		}
		if len(evs) != 1 {
			t.Errorf("job %s started %d times (%v), want once", job, len(evs), deliveries(evs))
		}
	}
	// The survivor runs it once the victim's presence record expired
	// (bus.WorkerTTL): until then the job is handed back, as one whose
	// holder is still there, and the delivery count grows.
	held := started[first.jobID()]
	if got := deliveries(held); len(got) != 2 || got[0] != victim+"#1" || !strings.HasPrefix(got[1], survivor+"#") {
		t.Errorf("held job started as %v (worker#delivery), want %s#1 then %s once", got, victim, survivor)
	}
	for _, e := range all["kill-1"] {
		if e.Type == "loopbus.job.completed" && e.jobID() == first.jobID() && e.Data.Worker != survivor {
			t.Errorf("held job completed by %q, want %s", e.Data.Worker, survivor)
		}
	}
	runs := c.runs()
	if n := runs["kill-1 held 1"]; n != 2 {
		t.Errorf("held agent of kill-1 started %d times, want 2 (killed, then redelivered)", n)
	}
	checkRanOnce(t, runs, "kill-1", []chaosStep{relaySteps[0], relaySteps[2]})
	checkRanOnce(t, runs, "calm-1", relaySteps)

	got := parseManifest(t, w.stdout)
	if got.Status != "completed" {
		t.Fatalf("kill-1: %+v", got)
	}
	var worker struct {
		Steps map[string]struct {
			Worker string `json:"worker"`
		} `json:"steps"`
		Restarts int `json:"restarts"`
	}
	if err := json.Unmarshal([]byte(w.stdout), &worker); err != nil {
		t.Fatal(err)
	}
	if worker.Restarts != 1 {
		t.Errorf("manifest: %d restarts, want 1 (the held agent, run again on %s)", worker.Restarts, survivor)
	}
	if wk := worker.Steps["held"].Worker; wk != survivor {
		t.Errorf("manifest: held step ran on %q, want %s", wk, survivor)
	}
	if a, b := comparableManifest(t, calm.stdout), comparableManifest(t, w.stdout); !reflect.DeepEqual(a, b) {
		t.Errorf("manifest after the kill differs from the undisturbed one:\nundisturbed: %s\nkilled:      %s", mustJSON(a), mustJSON(b))
	}
}

// TestChaosOrchestratorKilledAtRandom: the orchestrator is SIGKILLed at
// random points (also while it catches up after a start) and started again,
// over and over, while at least 20 sessions run. Every session completes,
// no decision is recorded twice, no step runs after it completed, and no
// agent runs twice.
func TestChaosOrchestratorKilledAtRandom(t *testing.T) {
	t.Parallel()
	rng := chaosRand(t)
	c := newCluster(t)
	ps := c.all(2, 2, 10*time.Second)
	pipe, input := c.writePipeline("diamond", diamondSteps)
	// A quarter of the kills come while the orchestrator catches up after
	// its start, the others up to 2 s after it has caught up.
	k := startKiller(ps["orchestrator"], rand.New(rand.NewPCG(rng.Uint64(), rng.Uint64())), "caught up with the stream", func(r *rand.Rand) (time.Duration, bool) {
		if r.IntN(4) == 0 {
			return between(r, 0, 300*time.Millisecond), false // while it catches up
		}
		return between(r, 0, 2*time.Second), true
	}, 700*time.Millisecond)
	t.Cleanup(k.halt)

	const want = 20
	var sessions []string
	var all map[string][]chaosEvent
	covered := 0
	for round := 0; covered < want; round++ {
		if round == 3 {
			t.Fatalf("after %d sessions only %d ran while the orchestrator was killed; want %d", len(sessions), covered, want)
		}
		for wave := range 3 {
			var ws []string
			for i := range 10 {
				ws = append(ws, fmt.Sprintf("orch-%d-%d-%d", round, wave, i))
			}
			c.submit(pipe, input, ws...)
			sessions = append(sessions, ws...)
			time.Sleep(between(rng, 500*time.Millisecond, 3*time.Second))
		}
		all = c.waitTerminal(stall, sessions...)
		kills := k.killsSoFar()
		covered = 0
		for _, s := range sessions {
			if killedDuring(kills, all[s]) > 0 {
				covered++
			}
		}
	}
	kills := k.stop(t)
	most := 0
	runs := c.runs()
	for _, s := range sessions {
		most = max(most, killedDuring(kills, all[s]))
		checkStartedOnce(t, s, checkDecisions(t, s, all[s], diamondSteps))
		checkRanOnce(t, runs, s, diamondSteps)
	}
	t.Logf("%d sessions, %d orchestrator kills; %d sessions saw a kill, one saw %d", len(sessions), len(kills), covered, most)
}

// TestChaosValidatorKilledMidVerdict: the validator is SIGKILLed while the
// step's validate command runs and started again. The job completion is
// redelivered to it, exactly one verdict is recorded and acted upon, and
// the session completes.
func TestChaosValidatorKilledMidVerdict(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	ps := c.all(1, 1, 10*time.Second)
	steps := []chaosStep{{name: "make", holdCheck: true}, {name: "after", requires: []string{"make"}}}
	pipe, input := c.writePipeline("verdict", steps)
	c.submit(pipe, input, "val-1")
	const check = "check val-1 val-1.make.1"
	eventually(t, 120*time.Second, "the validate command of val-1 to run", func() bool {
		c.checkAlive()
		return c.runs()[check] > 0
	})
	if err := ps["validator"].restart(); err != nil {
		t.Fatal(err)
	}
	c.release("val-1.verdict")
	// The job completion comes back once the validator's ack wait (10s
	// here) has passed without a heartbeat.
	w := loopbus(t, append([]string{"wait", "val-1", "--json"}, c.global()...)...)
	if w.code != 0 {
		t.Fatalf("wait val-1: exit %d\n%s", w.code, w.stderr)
	}
	if m := parseManifest(t, w.stdout); m.Status != "completed" {
		t.Fatalf("val-1: %+v", m)
	}
	evs := c.events()["val-1"]
	checkStartedOnce(t, "val-1", checkDecisions(t, "val-1", evs, steps))
	runs := c.runs()
	checkRanOnce(t, runs, "val-1", steps)
	if n := runs[check]; n != 2 {
		t.Errorf("validate command ran %d times, want 2 (killed, then redelivered)", n)
	}
	for _, e := range evs {
		if e.Type == "loopbus.validation.failed" {
			t.Errorf("validation.failed of %s: the held check passes", e.jobID())
		}
	}
}

// TestChaosProjectorKilledMidUpdate: the projector is SIGKILLed at random
// points while sessions run and started again; then every view is dropped
// and rebuilt with --rebuild, which is killed at a random point too and
// followed by a plain projector. Each stored view ends up equal to a fold
// of the stream, and so does `status`.
func TestChaosProjectorKilledMidUpdate(t *testing.T) {
	t.Parallel()
	rng := chaosRand(t)
	c := newCluster(t)
	ps := c.all(2, 2, 10*time.Second)
	pipe, input := c.writePipeline("diamond", diamondSteps)
	projector := ps["projector"]
	k := startKiller(projector, rand.New(rand.NewPCG(rng.Uint64(), rng.Uint64())), "", func(r *rand.Rand) (time.Duration, bool) {
		return between(r, 0, 600*time.Millisecond), false
	}, 300*time.Millisecond)
	t.Cleanup(k.halt)

	var sessions []string
	for wave := range 2 {
		var ws []string
		for i := range 4 {
			ws = append(ws, fmt.Sprintf("proj-%d-%d", wave, i))
		}
		c.submit(pipe, input, ws...)
		sessions = append(sessions, ws...)
		time.Sleep(between(rng, 500*time.Millisecond, 2*time.Second))
	}
	all := c.waitTerminal(stall, sessions...)
	kills := k.stop(t)
	if len(kills) < 3 {
		t.Fatalf("the projector was killed %d times while sessions ran, want at least 3", len(kills))
	}
	t.Logf("projector killed %d times during %d sessions", len(kills), len(sessions))
	for _, s := range sessions {
		checkDecisions(t, s, all[s], diamondSteps)
	}
	c.checkViews(stall, sessions...)

	// Views are derived data: drop them all with the checkpoint, rebuild,
	// kill the rebuild at a random point, and let a plain projector go on
	// from the partly rebuilt views while new sessions run.
	if err := projector.kill(); err != nil {
		t.Fatal(err)
	}
	if n := c.views().dropAll(); n < len(sessions) {
		t.Fatalf("dropped %d keys, want at least the %d views", n, len(sessions))
	}
	if err := projector.start("--rebuild"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(between(rng, 0, 700*time.Millisecond))
	if err := projector.restart(); err != nil {
		t.Fatal(err)
	}
	more := []string{"proj-r-0", "proj-r-1"}
	c.submit(pipe, input, more...)
	sessions = append(sessions, more...)
	c.waitTerminal(stall, sessions...)
	c.checkViews(stall, sessions...)
}

// TestChaosNATSRestartMidSession: `loopbus nats` is SIGKILLed while an
// agent runs and started again on the same data directory and port; later
// once more at a random point of another session (before its last agent
// is released). No service is restarted: each reconnects by itself, both
// sessions complete, nothing runs twice in the first and no decision
// repeats in either, and the views stay current.
func TestChaosNATSRestartMidSession(t *testing.T) {
	t.Parallel()
	rng := chaosRand(t)
	c := newCluster(t)
	ps := c.all(1, 2, 30*time.Second)
	steps := []chaosStep{relaySteps[0], relaySteps[1], {name: "last", requires: []string{"held"}, passAt: 2, hold: true}}
	pipe, input := c.writePipeline("relay", steps)
	restartNATS := func(down time.Duration) {
		t.Helper()
		if err := c.nats.kill(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(down)
		if err := c.nats.start(); err != nil {
			t.Fatal(err)
		}
		c.waitNATS()
	}

	c.submit(pipe, input, "nats-1")
	eventually(t, 120*time.Second, "the held agent of nats-1 to run", func() bool {
		c.checkAlive()
		return c.runs()["nats-1 held 1"] > 0
	})
	restartNATS(between(rng, 500*time.Millisecond, 3*time.Second))
	c.release("nats-1.held")
	c.release("nats-1.last")
	w := loopbus(t, append([]string{"wait", "nats-1", "--json"}, c.global()...)...)
	if w.code != 0 {
		t.Fatalf("wait nats-1: exit %d\n%s", w.code, w.stderr)
	}

	// In nats-2 the server dies at a random point between the held agent's
	// release and the last step, whose agent waits until after the restart:
	// surely mid-session.
	c.submit(pipe, input, "nats-2")
	eventually(t, 120*time.Second, "the held agent of nats-2 to run", func() bool {
		c.checkAlive()
		return c.runs()["nats-2 held 1"] > 0
	})
	c.release("nats-2.held")
	time.Sleep(between(rng, 0, 1500*time.Millisecond))
	killedAt := time.Now()
	restartNATS(between(rng, 200*time.Millisecond, 2*time.Second))
	c.release("nats-2.last")
	all := c.waitTerminal(stall, "nats-1", "nats-2")
	t.Logf("second restart after %d events of nats-2", countBefore(all["nats-2"], killedAt))

	for label, p := range ps {
		if n := p.startCount(); n != 1 {
			t.Errorf("%s was started %d times; the test starts services once", label, n)
		}
	}
	checkStartedOnce(t, "nats-1", checkDecisions(t, "nats-1", all["nats-1"], steps))
	checkRanOnce(t, c.runs(), "nats-1", steps)
	// A job whose ack was lost with the server may legitimately run again
	// (at-least-once); decisions still may not repeat.
	checkDecisions(t, "nats-2", all["nats-2"], steps)
	c.checkViews(stall, "nats-1", "nats-2")
}

// countBefore counts the events whose time is before t.
func countBefore(evs []chaosEvent, t time.Time) int {
	n := 0
	for _, e := range evs {
		if e.Time.Before(t) {
			n++
		}
	}
	return n
}

// TestChaosCheckerCatchesBrokenInvariants: the invariants the chaos tests
// rely on reject each kind of broken history.
func TestChaosCheckerCatchesBrokenInvariants(t *testing.T) {
	t.Parallel()
	steps := []chaosStep{{name: "a"}, {name: "b", requires: []string{"a"}, passAt: 2}}
	e := func(typ, step string, iteration int) chaosEvent {
		ev := chaosEvent{Type: "loopbus." + typ, Session: "s", Step: step}
		if step != "" {
			ev.Job = fmt.Sprintf("s.%s.%d", step, iteration)
			ev.Data.JobID, ev.Data.Step, ev.Data.Iteration, ev.Data.Attempt = ev.Job, step, iteration, 1
			ev.Data.Delivery = 1
		}
		return ev
	}
	job := func(step string, iteration int, verdict string) []chaosEvent {
		return []chaosEvent{e("job.requested", step, iteration), e("job.started", step, iteration), e("tool.started", step, iteration),
			e("job.completed", step, iteration), e(verdict, step, iteration)}
	}
	valid := func() []chaosEvent {
		evs := []chaosEvent{e("session.started", "", 0)}
		evs = append(evs, job("a", 1, "validation.passed")...)
		evs = append(evs, e("step.completed", "a", 1))
		evs = append(evs, job("b", 1, "validation.failed")...)
		evs = append(evs, job("b", 2, "validation.passed")...)
		return append(evs, e("step.completed", "b", 2), e("session.completed", "", 0))
	}
	tests := []struct {
		name   string
		mutate func([]chaosEvent) []chaosEvent
		want   string // a problem containing this; "" for none
	}{
		{"valid history", func(evs []chaosEvent) []chaosEvent { return evs }, ""},
		{"step completed twice", func(evs []chaosEvent) []chaosEvent {
			return slices.Insert(evs, 7, e("step.completed", "a", 1))
		}, "step.completed a: 2, want 1"},
		{"job requested twice", func(evs []chaosEvent) []chaosEvent {
			return slices.Insert(evs, 2, e("job.requested", "a", 1))
		}, "job.requested a iteration 1 attempt 1: 2, want 1"},
		{"retry never requested", func(evs []chaosEvent) []chaosEvent {
			return slices.Delete(evs, 12, 13)
		}, "job.requested b iteration 2 attempt 1: 0, want 1"},
		{"requested before its requirement completed", func(evs []chaosEvent) []chaosEvent {
			evs[6], evs[7] = evs[7], evs[6]
			return evs
		}, "b requested before a, which it requires, completed"},
		{"ran after it completed", func(evs []chaosEvent) []chaosEvent {
			return slices.Insert(evs, 8, e("job.started", "a", 1))
		}, "loopbus.job.started of a after the step completed"},
		{"completed without a passed verdict", func(evs []chaosEvent) []chaosEvent {
			return slices.Delete(evs, 5, 6)
		}, "step.completed of a without a passed verdict"},
		{"two verdicts", func(evs []chaosEvent) []chaosEvent {
			return slices.Insert(evs, 6, e("validation.passed", "a", 1))
		}, "job s.a.1: 1 results and 2 verdicts"},
		{"session failed", func(evs []chaosEvent) []chaosEvent {
			return append(evs[:len(evs)-1], e("session.failed", "", 0))
		}, "session.failed: 1, want 0"},
		{"session completed twice", func(evs []chaosEvent) []chaosEvent {
			return append(evs, e("session.completed", "", 0))
		}, "session.completed: 2, want 1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			problems, started := decisionProblems(tt.mutate(valid()), steps)
			got := strings.Join(problems, "\n")
			switch {
			case tt.want == "" && len(problems) > 0:
				t.Errorf("problems in a valid history:\n%s", got)
			case tt.want != "" && !strings.Contains(got, tt.want):
				t.Errorf("problems do not contain %q:\n%s", tt.want, got)
			}
			if len(started["s.a.1"]) == 0 {
				t.Errorf("job.started of s.a.1 not returned: %v", started)
			}
		})
	}
}
