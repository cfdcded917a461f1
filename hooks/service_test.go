package hooks

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/internal/testnats"
	"github.com/loopbus/loopbus/schemas"
	"github.com/nats-io/nats.go"
)

const waitTimeout = 30 * time.Second

// recorder is a hook command that saves its stdin and environment as
// $OUT/<seq>-<hook>.stdin and .env and appends "<hook> <event id>" to
// $OUT/lines, after sleeping $DELAY seconds (default 0).
const recorder = `#!/bin/sh
set -eu
n="$OUT/$LOOPBUS_EVENT_SEQ-$LOOPBUS_HOOK"
cat > "$n.stdin"
env > "$n.env"
touch "$OUT/started-$LOOPBUS_HOOK-$LOOPBUS_EVENT_ID"
sleep "${DELAY:-0}"
echo "$LOOPBUS_HOOK $LOOPBUS_EVENT_ID" >> "$OUT/lines"
`

// writeRecorder writes the recorder script into a new directory and
// returns its path and the output directory.
func writeRecorder(t *testing.T) (script, out string) {
	t.Helper()
	dir := t.TempDir()
	script = filepath.Join(dir, "rec.sh")
	if err := os.WriteFile(script, []byte(recorder), 0o755); err != nil {
		t.Fatal(err)
	}
	out = filepath.Join(dir, "out")
	if err := os.Mkdir(out, 0o755); err != nil {
		t.Fatal(err)
	}
	return script, out
}

// recHook returns a hook named name running the recorder for types.
func recHook(name, script, out string, types ...string) Hook {
	return Hook{Name: name, Types: types, Command: []string{script}, Env: map[string]string{"OUT": out}, Timeout: waitTimeout}
}

// lines returns the recorder's lines.
func lines(t *testing.T, out string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(out, "lines"))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimRight(string(b), "\n"), "\n")
}

// publishTask publishes a task.updated event with id id in session and
// returns it as stored.
func publishTask(t *testing.T, b *bus.Bus, session, id string) schemas.Event {
	t.Helper()
	ev := schemas.Event{
		ID: id, Type: schemas.TypeTaskUpdated, Session: session, Step: "t1", Job: "job-" + id,
		Correlation: "corr-" + session, Time: time.Now(),
		Data: &schemas.TaskUpdated{ID: "t1", Status: schemas.TaskDone, By: "cli"},
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	res, err := b.Publish(ctx, ev)
	if err != nil {
		t.Fatalf("publish %s: %v", id, err)
	}
	ev.Seq = res.Seq
	ev.Source = b.Source()
	return ev
}

// outcomes returns the hook.* events in the stream.
func outcomes(t *testing.T, b *bus.Bus) []schemas.Event {
	t.Helper()
	return testnats.Events(t, b, schemas.SubjectPrefix+".*.hook.*")
}

// waitOutcomes waits until the stream holds at least n hook.* events.
func waitOutcomes(t *testing.T, b *bus.Bus, n int) []schemas.Event {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for {
		evs := outcomes(t, b)
		if len(evs) >= n {
			return evs
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %d hook outcomes; have %d", n, len(evs))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitFile waits until path exists.
func waitFile(t *testing.T, path string) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for {
		if _, err := os.Stat(path); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", path)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// runs collects what OnRun reports.
type runs struct {
	mu   sync.Mutex
	list []Run
}

func (r *runs) add(x Run) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.list = append(r.list, x)
}

func (r *runs) get() []Run {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.list)
}

func newService(t *testing.T, cfg Config, b Bus) *Service {
	t.Helper()
	s, err := New(cfg, b, testnats.Logger(t), time.Now)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// hookRun returns an outcome's data.
func hookRun(t *testing.T, ev schemas.Event) *schemas.HookRun {
	t.Helper()
	r, ok := ev.Data.(*schemas.HookRun)
	if !ok {
		t.Fatalf("%s carries %T, not HookRun", ev.Type, ev.Data)
	}
	return r
}

// TestHookGetsEventAndEnv: the hook reads on stdin the very CloudEvent the
// stream stores, gets the event's LOOPBUS_* variables and its own env but
// none of the runner's LOOPBUS_* settings, and its outcome is published in
// the event's session with the deterministic id, causation and correlation.
func TestHookGetsEventAndEnv(t *testing.T) {
	t.Setenv("LOOPBUS_PASSWORD", "runner-secret-password")
	t.Setenv("HOOKS_TEST_BASE", "from-runner")
	b, _ := testnats.Bus(t)
	script, out := writeRecorder(t)
	h := recHook("rec", script, out, schemas.TypeTaskUpdated)
	h.Env["CHANNEL"] = "builds"
	s := newService(t, Config{Runner: "r1", Hooks: []Hook{h}}, b.WithSource("loopbus/hooks/test"))
	testnats.Run(t, "hooks", s.Run)
	// The consumer starts at new events: wait until it exists.
	waitConsumer(t, b, "hooks-r1")
	ev := publishTask(t, b, "s1", "e1")
	got := waitOutcomes(t, b, 1)

	stored, err := storedBytes(b, ev.Seq)
	if err != nil {
		t.Fatal(err)
	}
	stdin, err := os.ReadFile(filepath.Join(out, strconv.FormatUint(ev.Seq, 10)+"-rec.stdin"))
	if err != nil {
		t.Fatal(err)
	}
	if string(stdin) != string(stored) {
		t.Errorf("stdin is not the stored CloudEvent:\n got %s\nwant %s", stdin, stored)
	}
	envText, err := os.ReadFile(filepath.Join(out, strconv.FormatUint(ev.Seq, 10)+"-rec.env"))
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{}
	for line := range strings.Lines(string(envText)) {
		if k, v, ok := strings.Cut(strings.TrimSuffix(line, "\n"), "="); ok {
			env[k] = v
		}
	}
	want := map[string]string{
		"LOOPBUS_EVENT_ID":      "e1",
		"LOOPBUS_EVENT_TYPE":    schemas.TypeTaskUpdated,
		"LOOPBUS_EVENT_SUBJECT": "s1/t1",
		"LOOPBUS_EVENT_SOURCE":  b.Source(),
		"LOOPBUS_EVENT_TIME":    ev.Time.UTC().Format(time.RFC3339Nano),
		"LOOPBUS_EVENT_SEQ":     strconv.FormatUint(ev.Seq, 10),
		"LOOPBUS_SESSION":       "s1",
		"LOOPBUS_STEP":          "t1",
		"LOOPBUS_JOB":           "job-e1",
		"LOOPBUS_HOOK":          "rec",
		"LOOPBUS_RUNNER":        "r1",
		"CHANNEL":               "builds",
		"HOOKS_TEST_BASE":       "from-runner",
	}
	for k, v := range want {
		if env[k] != v {
			t.Errorf("$%s = %q, want %q", k, env[k], v)
		}
	}
	if v, ok := env["LOOPBUS_PASSWORD"]; ok {
		t.Errorf("the hook got the runner's LOOPBUS_PASSWORD=%q", v)
	}

	o := got[0]
	if o.Type != schemas.TypeHookCompleted || o.Session != "s1" || o.Causation != "e1" || o.Correlation != "corr-s1" ||
		o.ID != schemas.DeterministicID("s1", "hook", "r1", "rec", "e1") || o.Source != "loopbus/hooks/test" {
		t.Errorf("outcome %s id %s session %s causation %s correlation %s source %s", o.Type, o.ID, o.Session, o.Causation, o.Correlation, o.Source)
	}
	r := hookRun(t, o)
	if r.Hook != "rec" || r.EventID != "e1" || r.EventType != schemas.TypeTaskUpdated || r.EventSeq != ev.Seq || r.Runner != "r1" || r.ExitCode != 0 || r.TimedOut || r.Error != "" {
		t.Errorf("outcome data %+v", r)
	}
}

// waitConsumer waits until the durable consumer exists.
func waitConsumer(t *testing.T, b *bus.Bus, name string) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := b.JetStream().Consumer(ctx, b.StreamName(), name)
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("consumer %s: %v", name, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// storedBytes returns the payload the stream stores at seq.
func storedBytes(b *bus.Bus, seq uint64) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	st, err := b.JetStream().Stream(ctx, b.StreamName())
	if err != nil {
		return nil, err
	}
	m, err := st.GetMsg(ctx, seq)
	if err != nil {
		return nil, err
	}
	return m.Data, nil
}

// TestFailedRuns: non-zero exits, time-outs and commands that cannot start
// are recorded as hook.failed with what went wrong; secret values in the
// output are masked.
func TestFailedRuns(t *testing.T) {
	t.Setenv("HOOKS_TEST_WEBHOOK", "https://hooks.example/T000/B000/secretpart")
	tests := []struct {
		name       string
		hook       Hook
		wantType   string
		wantExit   int
		wantTimed  bool
		wantError  string
		wantTail   []string
		noTail     []string
		minElapsed time.Duration
	}{
		{
			name:      "non-zero exit",
			hook:      Hook{Command: []string{"sh", "-c", "echo to-stdout; echo to-stderr >&2; exit 3"}},
			wantType:  schemas.TypeHookFailed,
			wantExit:  3,
			wantError: "exited with code 3",
			wantTail:  []string{"to-stdout", "to-stderr"},
		},
		{
			name:       "timeout",
			hook:       Hook{Command: []string{"sh", "-c", "echo waiting; sleep 30"}, Timeout: 300 * time.Millisecond},
			wantType:   schemas.TypeHookFailed,
			wantExit:   -1,
			wantTimed:  true,
			wantError:  "timed out after 300ms",
			wantTail:   []string{"waiting"},
			minElapsed: 300 * time.Millisecond,
		},
		{
			name:      "cannot start",
			hook:      Hook{Command: []string{"/nonexistent/hook-program"}},
			wantType:  schemas.TypeHookFailed,
			wantExit:  -1,
			wantError: "could not start",
		},
		{
			name:     "secrets masked",
			hook:     Hook{Command: []string{"sh", "-c", `echo "posting to $HOOKS_TEST_WEBHOOK"`}, SecretEnv: []string{"HOOKS_TEST_WEBHOOK"}},
			wantType: schemas.TypeHookCompleted,
			wantTail: []string{"posting to [secret HOOKS_TEST_WEBHOOK]"},
			noTail:   []string{"secretpart"},
		},
	}
	b, _ := testnats.Bus(t)
	var hooks []Hook
	for i, tt := range tests {
		h := tt.hook
		h.Name = fmt.Sprintf("h%d", i)
		h.Types = []string{schemas.TypeTaskUpdated}
		h.Sessions = []string{fmt.Sprintf("s%d", i)}
		hooks = append(hooks, h)
	}
	s := newService(t, Config{Start: StartAll, Hooks: hooks}, b)
	for i := range tests {
		publishTask(t, b, fmt.Sprintf("s%d", i), fmt.Sprintf("e%d", i))
	}
	testnats.Run(t, "hooks", s.Run)
	got := waitOutcomes(t, b, len(tests))
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := got[i]
			r := hookRun(t, o)
			if o.Type != tt.wantType || r.Hook != hooks[i].Name || r.ExitCode != tt.wantExit || r.TimedOut != tt.wantTimed {
				t.Errorf("%s: %s exit %d timedOut %v, want %s exit %d timedOut %v", r.Hook, o.Type, r.ExitCode, r.TimedOut, tt.wantType, tt.wantExit, tt.wantTimed)
			}
			if !strings.Contains(r.Error, tt.wantError) || (tt.wantError == "") != (r.Error == "") {
				t.Errorf("error %q, want %q", r.Error, tt.wantError)
			}
			for _, s := range tt.wantTail {
				if !strings.Contains(r.OutputTail, s) {
					t.Errorf("output tail %q lacks %q", r.OutputTail, s)
				}
			}
			for _, s := range tt.noTail {
				if strings.Contains(r.OutputTail, s) {
					t.Errorf("output tail %q shows %q", r.OutputTail, s)
				}
			}
			if time.Duration(r.DurationMs)*time.Millisecond < tt.minElapsed {
				t.Errorf("duration %dms, want at least %s", r.DurationMs, tt.minElapsed)
			}
		})
	}
}

// TestRestart: a runner stopped mid-stream and started again runs every
// matching event's hooks exactly once, in stream order, and publishes one
// outcome per run; events of other types and hook.* events run nothing.
func TestRestart(t *testing.T) {
	b, _ := testnats.Bus(t)
	script, out := writeRecorder(t)
	a := recHook("a", script, out, schemas.TypeTaskUpdated)
	a.Env["DELAY"] = "0.1"
	// c sees every event, hook.* ones included: it must run for task
	// events only.
	c := Hook{Name: "c", Subjects: []string{"loopbus.evt.>"}, Command: []string{script}, Env: map[string]string{"OUT": out}, Timeout: waitTimeout}
	cfg := Config{Start: StartAll, Hooks: []Hook{a, c}}
	var ids []string
	publish := func(n int) {
		for range n {
			id := fmt.Sprintf("e%02d", len(ids))
			ids = append(ids, id)
			publishTask(t, b, "s"+strconv.Itoa(len(ids)%3), id)
		}
	}
	publish(8)
	stop := testnats.Run(t, "first runner", newService(t, cfg, b).Run)
	waitFile(t, filepath.Join(out, "started-a-e03"))
	stop()
	first := len(lines(t, out))
	if first == 0 || first >= 2*8 {
		t.Fatalf("the first runner ran %d hooks, want some but not all of 16", first)
	}
	if n := len(outcomes(t, b)); n != first {
		t.Errorf("after a graceful stop: %d runs but %d outcomes", first, n)
	}
	publish(8)
	stop = testnats.Run(t, "second runner", newService(t, cfg, b).Run)
	waitOutcomes(t, b, 2*len(ids))
	stop()

	var want []string
	for _, id := range ids {
		want = append(want, "a "+id, "c "+id)
	}
	if got := lines(t, out); !slices.Equal(got, want) {
		t.Errorf("runs, in order:\n got %q\nwant %q", got, want)
	}
	seen := map[string]bool{}
	for _, o := range outcomes(t, b) {
		r := hookRun(t, o)
		key := r.Hook + " " + r.EventID
		if seen[key] {
			t.Errorf("two outcomes for %s", key)
		}
		seen[key] = true
	}
	if len(seen) != len(want) {
		t.Errorf("%d distinct outcomes, want %d", len(seen), len(want))
	}
}

// TestStopBetweenHooks: told to stop while the first of two hooks of an
// event runs, the runner lets it finish, publishes its outcome and hands
// the event back; the next runner runs only the second hook.
func TestStopBetweenHooks(t *testing.T) {
	b, _ := testnats.Bus(t)
	script, out := writeRecorder(t)
	a := recHook("a", script, out, schemas.TypeTaskUpdated)
	a.Env["DELAY"] = "0.5"
	second := recHook("b", script, out, schemas.TypeTaskUpdated)
	cfg := Config{Start: StartAll, Hooks: []Hook{a, second}}
	publishTask(t, b, "s1", "e1")
	stop := testnats.Run(t, "first runner", newService(t, cfg, b).Run)
	waitFile(t, filepath.Join(out, "started-a-e1"))
	stop()
	if got := lines(t, out); !slices.Equal(got, []string{"a e1"}) {
		t.Fatalf("after stopping during hook a: runs %q, want [a e1]", got)
	}
	if got := outcomes(t, b); len(got) != 1 || hookRun(t, got[0]).Hook != "a" {
		t.Fatalf("after stopping during hook a: %d outcomes, want a's", len(got))
	}
	var seen runs
	cfg.OnRun = seen.add
	stop = testnats.Run(t, "second runner", newService(t, cfg, b).Run)
	waitOutcomes(t, b, 2)
	stop()
	if got := lines(t, out); !slices.Equal(got, []string{"a e1", "b e1"}) {
		t.Errorf("runs %q, want [a e1] [b e1]", got)
	}
	rs := seen.get()
	if len(rs) != 2 || !rs[0].Skipped || rs[0].Result.Hook != "a" || rs[1].Skipped || rs[1].Result.Hook != "b" {
		t.Errorf("second runner reported %+v, want a skipped and b run", rs)
	}
}

// TestCrashBeforeAck: the runner's connection dies after it published an
// event's outcomes and before it acknowledged the event (as when the
// process is killed there). The event is delivered again to the next
// runner, which finds the outcomes and runs nothing again.
func TestCrashBeforeAck(t *testing.T) {
	srv := testnats.Server(t)
	b1 := testnats.Connect(t, srv.URL(), "runner-1")
	script, out := writeRecorder(t)
	cfg := Config{Start: StartAll, AckWait: time.Second, Hooks: []Hook{
		recHook("a", script, out, schemas.TypeTaskUpdated),
		recHook("b", script, out, schemas.TypeTaskUpdated),
	}}
	publishTask(t, b1, "s1", "e1")
	publishTask(t, b1, "s1", "e2")

	s1 := newService(t, cfg, b1)
	s1.beforeAck = func(ev schemas.Event) error {
		b1.Conn().Close() // the process dies: no ack, no nak
		return errors.New("crashed")
	}
	done := make(chan error, 1)
	go func() { done <- s1.Run(context.Background()) }()
	select {
	case err := <-done:
		if !errors.Is(err, nats.ErrConnectionClosed) {
			t.Fatalf("first runner: Run returned %v, want the closed connection", err)
		}
	case <-time.After(waitTimeout):
		t.Fatal("first runner did not stop after its connection closed")
	}
	if got := lines(t, out); !slices.Equal(got, []string{"a e1", "b e1"}) {
		t.Fatalf("first runner ran %q, want a and b for e1", got)
	}

	b2 := testnats.Connect(t, srv.URL(), "runner-2")
	if n := len(outcomes(t, b2)); n != 2 {
		t.Fatalf("%d outcomes published before the crash, want 2", n)
	}
	var seen runs
	cfg.OnRun = seen.add
	stop := testnats.Run(t, "second runner", newService(t, cfg, b2).Run)
	// e1 comes back once its ack wait has passed, before e2: at most one
	// event is out at a time, so order holds across the crash.
	skipped := func() []string {
		var out []string
		for _, r := range seen.get() {
			if r.Skipped {
				out = append(out, r.Result.Hook+" "+r.Event.ID)
			}
		}
		return out
	}
	deadline := time.Now().Add(waitTimeout)
	for len(seen.get()) < 4 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	stop()
	if got := skipped(); !slices.Equal(got, []string{"a e1", "b e1"}) {
		t.Errorf("second runner skipped %q, want a e1 and b e1; runs %+v", got, seen.get())
	}
	if got, want := lines(t, out), []string{"a e1", "b e1", "a e2", "b e2"}; !slices.Equal(got, want) {
		t.Errorf("runs %q, want each hook once per event, in stream order", got)
	}
	if n := len(outcomes(t, b2)); n != 4 {
		t.Errorf("%d outcomes, want 4", n)
	}
}

// TestPublished checks the skip lookup on its own: it finds this runner's
// outcomes of the event, not other runners' or other events'.
func TestPublished(t *testing.T) {
	b, _ := testnats.Bus(t)
	e1 := publishTask(t, b, "s1", "e1")
	e2 := publishTask(t, b, "s1", "e2")
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	outcome := func(runner, hook string, ev schemas.Event) {
		t.Helper()
		_, err := b.Publish(ctx, schemas.Event{
			ID: OutcomeID(ev.Session, runner, hook, ev.ID), Type: schemas.TypeHookCompleted, Session: ev.Session, Causation: ev.ID,
			Data: &schemas.HookRun{Hook: hook, EventID: ev.ID, EventType: ev.Type, EventSeq: ev.Seq, Runner: runner},
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	s := newService(t, Config{Runner: "mine", Hooks: []Hook{{Name: "a", Types: []string{schemas.TypeTaskUpdated}, Command: []string{"true"}}}}, b)
	tests := []struct {
		name  string
		setup func()
		ev    schemas.Event
		want  []string
	}{
		{"nothing yet", func() {}, e1, nil},
		{"other runner", func() { outcome("other", "a", e1) }, e1, nil},
		{"other event", func() { outcome("mine", "b", e2) }, e1, nil},
		{"this event", func() { outcome("mine", "a", e1); outcome("mine", "c", e1) }, e1, []string{"a", "c"}},
		{"the other event", func() {}, e2, []string{"b"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.setup()
			done, err := s.published(ctx, tt.ev)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for h := range done {
				got = append(got, h)
			}
			slices.Sort(got)
			if !slices.Equal(got, tt.want) {
				t.Errorf("published(%s) = %q, want %q", tt.ev.ID, got, tt.want)
			}
		})
	}
}

// TestStart: a runner with start new ignores events stored before its
// consumer was created; one with start all runs for them too. Runners are
// independent of each other.
func TestStart(t *testing.T) {
	b, _ := testnats.Bus(t)
	script, out := writeRecorder(t)
	publishTask(t, b, "s1", "old")
	newRunner := newService(t, Config{Runner: "fresh", Hooks: []Hook{recHook("n", script, out, schemas.TypeTaskUpdated)}}, b)
	allRunner := newService(t, Config{Runner: "full", Start: StartAll, Hooks: []Hook{recHook("f", script, out, schemas.TypeTaskUpdated)}}, b)
	stopNew := testnats.Run(t, "new", newRunner.Run)
	waitConsumer(t, b, "hooks-fresh")
	stopAll := testnats.Run(t, "all", allRunner.Run)
	publishTask(t, b, "s1", "new")
	waitOutcomes(t, b, 3)
	stopNew()
	stopAll()
	got := lines(t, out)
	slices.Sort(got)
	if want := []string{"f new", "f old", "n new"}; !slices.Equal(got, want) {
		t.Errorf("runs %q, want %q", got, want)
	}
}

// TestSubjects: the consumer's filters cover the hooks without overlaps
// (which JetStream refuses), and the server accepts them.
func TestSubjects(t *testing.T) {
	b, _ := testnats.Bus(t)
	script, out := writeRecorder(t)
	h := recHook("chat", script, out, schemas.TypeTaskUpdated, "loopbus.session.*")
	h.Subjects = []string{"loopbus.evt.*.task.>"}
	s := newService(t, Config{Hooks: []Hook{h}}, b)
	if got, want := s.Subjects(), []string{"loopbus.evt.*.session.*", "loopbus.evt.*.task.>"}; !slices.Equal(got, want) {
		t.Errorf("Subjects() = %q, want %q", got, want)
	}
	testnats.Run(t, "hooks", s.Run)
	waitConsumer(t, b, "hooks-hooks")
	publishTask(t, b, "s1", "e1")
	waitOutcomes(t, b, 1)
}

func TestNew(t *testing.T) {
	b, _ := testnats.Bus(t)
	if _, err := New(Config{}, b, testnats.Logger(t), time.Now); !errors.Is(err, ErrInvalid) {
		t.Errorf("New without hooks: %v, want ErrInvalid", err)
	}
	ok := Config{Hooks: []Hook{{Name: "a", Types: []string{schemas.TypeTaskUpdated}, Command: []string{"true"}}}}
	if _, err := New(ok, nil, testnats.Logger(t), time.Now); err == nil {
		t.Error("New without a bus: no error")
	}
}
