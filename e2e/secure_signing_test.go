package e2e

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/schemas"
	"github.com/rs/zerolog"
)

// TestSecureSignedEvents runs the secure example with signed events: each
// service signs with its own key, and every process trusts only the keys
// of the trust file for their roles. A second worker, a legitimate member
// of the agentworker role, completes a job the first worker started, with
// its own artifact, after claiming to take the job over at a redelivery
// that never happened; an unsigned completion is published too. All are
// dead-lettered with the reason, and the step completes with the first
// worker's output.
func TestSecureSignedEvents(t *testing.T) {
	t.Parallel()
	out := newOutputs()
	srv := startSecureNATS(t, out, false)
	url, pw, as := srv.url, srv.pw, srv.as

	keys := t.TempDir()
	pub := map[string]string{}
	for _, k := range []string{"orchestrator", "validator", "worker1", "worker2", "client"} {
		r := loopbus(t, "keygen", filepath.Join(keys, k+".seed"))
		if r.code != 0 || !strings.HasPrefix(r.stdout, "U") {
			t.Fatalf("keygen %s: exit %d\n%s%s", k, r.code, r.stdout, r.stderr)
		}
		pub[k] = strings.TrimSpace(r.stdout)
	}
	trust := filepath.Join(keys, "trust.yaml")
	writeFiles(t, keys, map[string]string{"trust.yaml": "orchestrator: [" + pub["orchestrator"] + "]\nvalidator: [" + pub["validator"] + "]\n" +
		"agentworker:\n  - " + pub["worker1"] + "\n  - " + pub["worker2"] + "\nclient: [" + pub["client"] + "]\n"})
	seed := func(k string) string { return filepath.Join(keys, k+".seed") }
	signed := func(key string) []string {
		return []string{"LOOPBUS_SIGN_KEY=" + seed(key), "LOOPBUS_TRUST=" + trust}
	}
	srv.provision(t)
	out.start(t, "orchestrator", signed("orchestrator"), as("orchestrator", "orchestrator")...)
	out.start(t, "validator", signed("validator"), as("validator", "validator")...)
	out.start(t, "projector", []string{"LOOPBUS_TRUST=" + trust}, as("projector", "projector")...)
	out.start(t, "agentworker", signed("worker1"), as("agentworker", "agentworker")...)

	dir := t.TempDir()
	release := filepath.Join(dir, "release")
	writeFiles(t, dir, map[string]string{
		"agent.sh": "set -eu\nwhile [ ! -e " + release + " ]; do sleep 0.1; done\necho genuine > \"$LOOPBUS_OUTPUT_DIR/out.txt\"\n",
		"in.txt":   "input\n",
		"pipeline.yaml": `name: signed
steps:
  write:
    agent: {backend: exec, command: [sh, agent.sh]}
    prompt: write it
    outputs: [{name: out.txt}]
`,
	})
	client := func(args ...string) result {
		t.Helper()
		return loopbus(t, append(as("client", args...), "--sign-key", seed("client"), "--trust", trust)...)
	}
	if r := client("run", filepath.Join(dir, "pipeline.yaml"), "--input", filepath.Join(dir, "in.txt"), "--session", "sig-1", "--detach"); r.code != 0 {
		t.Fatalf("run as client: exit %d\n%s", r.code, r.stderr)
	}
	eventually(t, 60*time.Second, "the first worker to start the job", func() bool {
		r := client("events", "--session", "sig-1", "--type", "job.started", "--json")
		return r.code == 0 && strings.Contains(r.stdout, "job.started")
	})

	// The second worker's forgery, through the bus as the agentworker user.
	cat, err := schemas.NewCatalogue()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	connect := func(key string) *bus.Bus {
		b, err := bus.Connect(ctx, bus.Config{URL: url, User: "agentworker", Password: pw["agentworker"], SignKeyFile: key, TrustFile: trust, ConnectTimeout: 10 * time.Second},
			"loopbus/agentworker/evil", cat, zerolog.Nop())
		if err != nil {
			t.Fatalf("connect as agentworker: %v", err)
		}
		t.Cleanup(b.Close)
		return b
	}
	evil := connect(seed("worker2"))
	var req schemas.Event
	err = evil.Read(ctx, bus.ReadOptions{Subjects: []string{"loopbus.evt.sig-1.job.requested"}}, func(ev schemas.Event) error {
		req = ev
		return nil
	})
	if err != nil || req.Data == nil {
		t.Fatalf("read the job request: %v", err)
	}
	jr := req.Data.(*schemas.JobRequested)
	ref, err := evil.PutArtifact(ctx, "sig-1/forged/out.txt", "out.txt", strings.NewReader("forged\n"))
	if err != nil {
		t.Fatalf("store the forged artifact: %v", err)
	}
	forge := func(b *bus.Bus, id, typ string, data any) {
		t.Helper()
		ev := schemas.Event{ID: id, Type: typ, Session: "sig-1", Step: jr.Step, Job: jr.JobID, Causation: req.ID, Data: data}
		if _, err := b.Publish(ctx, ev); err != nil {
			t.Fatalf("publish the forged %s: %v", typ, err)
		}
	}
	// A takeover claimed while worker1 holds the job and is heard from:
	// no redelivery happened, whatever delivery count it states.
	forge(evil, "forged-takeover", schemas.TypeJobStarted, &schemas.JobStarted{JobID: jr.JobID, Worker: "evil", Delivery: 2, LeaseMs: 30_000})
	forge(evil, "forged-stored", schemas.TypeArtifactStored, &schemas.ArtifactStored{JobID: jr.JobID, Artifact: ref})
	forge(evil, "forged-result", schemas.TypeJobCompleted, &schemas.JobCompleted{JobID: jr.JobID, Step: jr.Step, Iteration: jr.Iteration,
		RequestSeq: req.Seq, Worker: "evil", Artifacts: []schemas.ArtifactRef{ref}})
	// And one signed by no key at all.
	forge(connect(""), "unsigned-result", schemas.TypeJobCompleted, &schemas.JobCompleted{JobID: jr.JobID, Step: jr.Step, Iteration: jr.Iteration,
		RequestSeq: req.Seq, Worker: "nobody", Artifacts: []schemas.ArtifactRef{ref}})

	dlq := func() string {
		r := client("dlq", "--json")
		return r.stdout
	}
	eventually(t, 60*time.Second, "the orchestrator to dead-letter the forgeries", func() bool {
		d := dlq()
		return strings.Contains(d, "but job "+jr.JobID+" is held by") && strings.Contains(d, "not signed") &&
			strings.Contains(d, "takes job "+jr.JobID+" over from")
	})
	if err := os.WriteFile(release, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if r := client("wait", "sig-1"); r.code != 0 {
		t.Fatalf("wait: exit %d\n%s\norchestrator:\n%s", r.code, r.stderr, out.all["orchestrator"]())
	}
	exportDir := t.TempDir()
	if r := client("export", "sig-1", "--dir", exportDir); r.code != 0 {
		t.Fatalf("export: exit %d\n%s", r.code, r.stderr)
	}
	got, err := os.ReadFile(filepath.Join(exportDir, "artifacts", "out.txt"))
	if err != nil || string(got) != "genuine\n" {
		t.Fatalf("the step's output is %q (%v), want the first worker's", got, err)
	}
	// A fork, signed by the client: its copies of the workers' and the
	// orchestrator's events are trusted as the client's copies, and the
	// orchestrator reads sig-1's own (verified) history to start it.
	r := client("events", "--session", "sig-1", "--type", "step.completed", "--json")
	var done cloudEvent
	if err := json.Unmarshal([]byte(strings.TrimSpace(r.stdout)), &done); err != nil || done.ID == "" {
		t.Fatalf("step.completed of sig-1: %v\n%s%s", err, r.stdout, r.stderr)
	}
	if r := client("fork", "sig-1", "--at", done.ID, "--as", "sig-2"); r.code != 0 || !strings.Contains(r.stderr, "kept: write") {
		t.Fatalf("fork as client: exit %d\n%s\norchestrator:\n%s", r.code, r.stderr, out.all["orchestrator"]())
	}
	if d := dlq(); strings.Contains(d, "sig-2") {
		t.Errorf("events of the fork were dead-lettered:\n%s", d)
	}
	out.stopAll()
	for _, svc := range []string{"orchestrator", "validator", "projector", "agentworker"} {
		if log := out.all[svc](); strings.Contains(log, "Permissions Violation") {
			t.Errorf("%s was refused something:\n%s", svc, log)
		}
	}
}
