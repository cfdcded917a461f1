package e2e

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/loopbus/loopbus/internal/testnats"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestHostileInput publishes, while a session is in flight, every kind of
// message that is not a valid loopbus event on that session's own subjects.
// Each lands in the dead-letter stream once, with a reason; the services
// keep running; the session completes as if nothing had happened.
func TestHostileInput(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	release := filepath.Join(dir, "release")
	writeFiles(t, dir, map[string]string{
		"first.sh":  "set -eu\ni=0\nwhile [ ! -e \"$RELEASE\" ]; do sleep 0.1; i=$((i+1)); [ $i -lt 1200 ] || exit 9; done\necho first > \"$LOOPBUS_OUTPUT_DIR/a.txt\"\n",
		"second.sh": "set -eu\ncat \"$LOOPBUS_INPUT_DIR/a.txt\" > \"$LOOPBUS_OUTPUT_DIR/b.txt\"\n",
		"input.txt": "x\n",
		"pipeline.yaml": `name: hostile
steps:
  first:
    agent: {backend: exec, command: [sh, first.sh], env: {RELEASE: ` + release + `}}
    prompt: first
    outputs: [{name: a.txt}]
    validate: [sh, -c, "grep -q first \"$LOOPBUS_OUTPUT_DIR/a.txt\""]
  second:
    requires: [first]
    agent: {backend: exec, command: [sh, second.sh]}
    prompt: second
    outputs: [{name: b.txt}]
`,
	})
	addr := testnats.FreeAddr(t)
	url := "nats://" + addr
	logPath := filepath.Join(dir, "serve.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	srv := exec.Command(binary, "serve", "--data", t.TempDir(), "--listen", addr, "--log-level", "info")
	srv.Env = testEnv(t)
	srv.Stdout, srv.Stderr = logf, logf
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- srv.Wait() }()
	t.Cleanup(func() {
		_ = srv.Process.Kill()
		<-exited
		logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("serve log:\n%s", b)
		}
	})
	global := []string{"--nats", url}
	const session = "live"
	r := loopbus(t, append([]string{"run", filepath.Join(dir, "pipeline.yaml"), "--input", filepath.Join(dir, "input.txt"), "--session", session, "--detach"}, global...)...)
	if r.code != 0 {
		t.Fatalf("run --detach: exit %d\n%s", r.code, r.stderr)
	}
	eventually(t, 60*time.Second, "the first job to start", func() bool {
		return count(events(t, global, session), "loopbus.job.started", "first") > 0
	})

	// A valid event of the session to mutate: its session.started, raw.
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	stream, err := js.Stream(ctx, "LOOPBUS")
	if err != nil {
		t.Fatal(err)
	}
	startMsg, err := stream.GetLastMsgForSubject(ctx, "loopbus.evt."+session+".session.started")
	if err != nil {
		t.Fatal(err)
	}
	jobMsg, err := stream.GetLastMsgForSubject(ctx, "loopbus.evt."+session+".job.started")
	if err != nil {
		t.Fatal(err)
	}
	mutate := func(raw []byte, f func(map[string]any)) []byte {
		t.Helper()
		var ce map[string]any
		if err := json.Unmarshal(raw, &ce); err != nil {
			t.Fatal(err)
		}
		f(ce)
		out, err := json.Marshal(ce)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	startID := startMsg.Header.Get(nats.MsgIdHdr)

	subj := func(entityVerb string) string { return "loopbus.evt." + session + "." + entityVerb }
	hostile := []struct {
		name    string
		subject string
		msgID   string // Nats-Msg-Id; empty sends none
		data    []byte
		reason  string // the dead letter's reason must contain this
	}{
		{name: "not JSON", subject: subj("job.started"), msgID: "h1", data: []byte("\xff\x00 garbage"), reason: "not JSON"},
		{name: "JSON, not a CloudEvent", subject: subj("job.started"), msgID: "h2", data: []byte(`{"hello":"world"}`), reason: "no specversion"},
		{name: "wrong specversion", subject: subj("job.started"), msgID: "h3", data: mutate(jobMsg.Data, func(m map[string]any) { m["specversion"] = "0.3"; m["id"] = "h3" }), reason: `specversion "0.3"`},
		{name: "missing required attribute", subject: subj("job.started"), msgID: "h4", data: mutate(jobMsg.Data, func(m map[string]any) { delete(m, "source"); m["id"] = "h4" }), reason: "source"},
		{name: "unknown type", subject: subj("job.exploded"), msgID: "h5", data: mutate(jobMsg.Data, func(m map[string]any) { m["type"] = "loopbus.job.exploded"; m["id"] = "h5" }), reason: "unknown type"},
		{name: "data failing its schema", subject: subj("job.started"), msgID: "h6", data: mutate(jobMsg.Data, func(m map[string]any) { m["data"] = map[string]any{"jobId": ""}; m["id"] = "h6" }), reason: "job.started"},
		{name: "over the size limit", subject: subj("job.started"), msgID: "h7", data: mutate(jobMsg.Data, func(m map[string]any) { m["padding"] = strings.Repeat("x", 600<<10); m["id"] = "h7" }), reason: "byte limit"},
		{name: "at the server's payload limit", subject: subj("job.started"), msgID: "h7b", data: mutate(jobMsg.Data, func(m map[string]any) { m["padding"] = strings.Repeat("x", 1000<<10); m["id"] = "h7b" }), reason: "byte limit"},
		{name: "another session's event on this session's subject", subject: subj("job.started"), msgID: "h8", data: mutate(jobMsg.Data, func(m map[string]any) { m["session"] = "other"; m["subject"] = "other/first"; m["id"] = "h8" }), reason: "belongs on"},
		{name: "replayed id, no de-duplication header", subject: subj("session.started"), data: startMsg.Data, reason: "no Nats-Msg-Id header"},
		{name: "replayed id, another de-duplication header", subject: subj("session.started"), msgID: "h10", data: startMsg.Data, reason: "is not the event id " + `"` + startID + `"`},
	}
	for _, h := range hostile {
		m := nats.NewMsg(h.subject)
		m.Data = h.data
		if h.msgID != "" {
			m.Header.Set(nats.MsgIdHdr, h.msgID)
		}
		ack, err := js.PublishMsg(ctx, m)
		if err != nil {
			t.Fatalf("%s: publish: %v", h.name, err)
		}
		if ack.Duplicate {
			t.Fatalf("%s: the server dropped it as a duplicate; the test must store it", h.name)
		}
	}

	// Every one is dead-lettered once, with its reason.
	type letter struct {
		Subject   string `json:"subject"`
		SourceSeq uint64 `json:"sourceSeq"`
		Reason    string `json:"reason"`
		Consumer  string `json:"consumer"`
		Size      int    `json:"size"`
	}
	var letters []letter
	eventually(t, 60*time.Second, "a dead letter for every hostile message", func() bool {
		r := loopbus(t, append([]string{"dlq", "--json"}, global...)...)
		if r.code != 0 {
			t.Fatalf("dlq: exit %d\n%s", r.code, r.stderr)
		}
		letters = letters[:0]
		sc := bufio.NewScanner(strings.NewReader(r.stdout))
		sc.Buffer(make([]byte, 4<<20), 4<<20)
		for sc.Scan() {
			var l letter
			if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
				t.Fatalf("dlq --json: %v", err)
			}
			letters = append(letters, l)
		}
		return len(letters) >= len(hostile)
	})
	time.Sleep(time.Second) // a second copy by another reader would show up by now
	r = loopbus(t, append([]string{"dlq", "--session", session}, global...)...)
	if want := fmt.Sprintf("%d dead letter(s)", len(hostile)); r.code != 0 || !strings.Contains(r.stderr, want) {
		t.Errorf("dlq: exit %d, stderr %q, want it to count %q\n%s", r.code, r.stderr, want, r.stdout)
	}
	if len(letters) != len(hostile) {
		t.Fatalf("%d dead letters for %d hostile messages: %+v", len(letters), len(hostile), letters)
	}
	// Letters are stored as readers reach them, and different readers may
	// reach two messages in either order; the messages were stored in the
	// order of hostile.
	slices.SortFunc(letters, func(a, b letter) int { return cmp.Compare(a.SourceSeq, b.SourceSeq) })
	for i, h := range hostile {
		if l := letters[i]; l.Subject != h.subject || !strings.Contains(l.Reason, h.reason) || l.Consumer == "" || l.Size != len(h.data) {
			t.Errorf("%s: dead letter %+v, want subject %s, size %d and a reason containing %q", h.name, l, h.subject, len(h.data), h.reason)
		}
	}
	if d := loopbus(t, append([]string{"doctor"}, global...)...); !strings.Contains(d.stdout, fmt.Sprintf("%d dead letters", len(hostile))) {
		t.Errorf("doctor does not count the dead letters:\n%s", d.stdout)
	}

	// The session in flight is unaffected.
	if err := os.WriteFile(release, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	w := loopbus(t, append([]string{"wait", session, "--json"}, global...)...)
	if w.code != 0 {
		t.Fatalf("wait: exit %d\n%s", w.code, w.stderr)
	}
	m := parseManifest(t, w.stdout)
	if m.Status != "completed" || m.Steps["first"].Iterations != 1 || m.Steps["second"].Iterations != 1 {
		t.Errorf("manifest %+v", m)
	}
	evs := events(t, global, session)
	for _, typ := range []string{"loopbus.session.started", "loopbus.session.completed"} {
		if n := count(evs, typ, ""); n != 1 {
			t.Errorf("%d %s, want 1", n, typ)
		}
	}
	for _, step := range []string{"first", "second"} {
		if n := count(evs, "loopbus.job.requested", step); n != 1 {
			t.Errorf("%d job.requested for %s, want 1", n, step)
		}
		if n := count(evs, "loopbus.step.completed", step); n != 1 {
			t.Errorf("%d step.completed for %s, want 1", n, step)
		}
	}
	select {
	case err := <-exited:
		t.Fatalf("serve exited: %v", err)
	default:
	}
}
