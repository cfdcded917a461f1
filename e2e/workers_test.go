package e2e

import (
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestNoWorkerForLane (issue 18): the only worker runs the no-net lane and
// a step's agent may use Bash (heavy) and WebFetch (net). The job waits
// (no job_dispatch_timeout), and at once status, status --json and doctor
// say that no worker serves those lanes; doctor lists the worker and its
// lanes and warns without failing.
func TestNoWorkerForLane(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	c.service("orchestrator", "orchestrator")
	c.service("validator", "validator", "--ack-wait", "10s")
	c.service("projector", "projector")
	c.service("worker-a", "agentworker", "--id", "worker-a", "--lanes", "no-net", "--ack-wait", "10s", "--work-dir", filepath.Join(c.dir, "work-a"))
	writeFiles(t, c.dir, map[string]string{
		"lanes.yaml": `name: lanes
steps:
  shell:
    agent: {backend: claude, command: [false], allowed_tools: [Read, Bash, WebFetch]}
    prompt: "Run the build."
    outputs: [{name: out.txt}]
`,
		"in.txt": "x\n",
	})
	res := loopbus(t, append([]string{"run", filepath.Join(c.dir, "lanes.yaml"), "--input", filepath.Join(c.dir, "in.txt"), "--session", "nolane-1", "--detach"}, c.global()...)...)
	if res.code != 0 {
		t.Fatalf("run --detach: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	const want = "no worker for lanes net, heavy"
	var st result
	deadline := time.Now().Add(30 * time.Second)
	for {
		st = loopbus(t, append([]string{"status", "nolane-1"}, c.global()...)...)
		if strings.Contains(st.stdout, want) || time.Now().After(deadline) {
			break
		}
		time.Sleep(300 * time.Millisecond)
	}
	if st.code != 0 || !strings.Contains(st.stdout, want) || !strings.Contains(st.stdout, "(step shell)") {
		t.Fatalf("status: exit %d, want a line saying %q for step shell\n%s%s", st.code, want, st.stdout, st.stderr)
	}
	js := loopbus(t, append([]string{"status", "nolane-1", "--json"}, c.global()...)...)
	for _, s := range []string{`"waiting": [`, `"unserved": [`, `"heavy"`, `"message": "` + want + `"`, `"contentId": "nolane-1"`} {
		if !strings.Contains(js.stdout, s) {
			t.Errorf("status --json lacks %s\n%s", s, js.stdout)
		}
	}
	doc := loopbus(t, append([]string{"doctor"}, c.global()...)...)
	if doc.code != 0 || !strings.Contains(doc.stdout, "warn  workers") || !strings.Contains(doc.stdout, "worker-a [no-net]") ||
		!strings.Contains(doc.stdout, want) {
		t.Errorf("doctor: exit %d, want 0 with a warning listing worker-a [no-net] and saying %q\n%s%s", doc.code, want, doc.stdout, doc.stderr)
	}
}
