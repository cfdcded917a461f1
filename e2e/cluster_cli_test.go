//go:build cluster

package e2e

import (
	"encoding/json"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestClusterCLIWithoutQuorum: with two of three nodes frozen (SIGSTOP),
// the streams have no leader. `sessions --json` through the node still
// running does not hang and prints nothing half-made: it gives up within
// its bound, exits non-zero and says that JetStream did not answer,
// naming the server it went through. Once the nodes run again it answers.
func TestClusterCLIWithoutQuorum(t *testing.T) {
	t.Parallel()
	c := startCluster(t, t.TempDir())
	n1 := []string{"--nats", c.nodes[0].url, "--replicas", "3"}
	if r := loopbus(t, append([]string{"sessions", "--json"}, n1...)...); r.code != 0 || strings.TrimSpace(r.stdout) != "[]" {
		t.Fatalf("sessions on a healthy cluster: exit %d, %q\n%s", r.code, r.stdout, r.stderr)
	}
	if !within(90*time.Second, func() bool { return c.allLed("") }) {
		t.Fatalf("the streams were not all led in 90s\n%s", tails(c.all))
	}
	frozen := c.nodes[1:]
	for _, n := range frozen {
		if err := n.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
	}
	thawed := false
	thaw := func() {
		if !thawed {
			thawed = true
			for _, n := range frozen {
				_ = n.cmd.Process.Signal(syscall.SIGCONT)
			}
		}
	}
	t.Cleanup(thaw) // before the processes' own cleanup stops them

	start := time.Now()
	r := loopbus(t, append([]string{"sessions", "--json"}, n1...)...)
	took := time.Since(start)
	t.Logf("sessions without a quorum: exit %d after %v: %s", r.code, took.Round(100*time.Millisecond), strings.TrimSpace(r.stderr))
	if r.code == 0 {
		t.Fatalf("sessions without a quorum: exit 0, stdout %q", r.stdout)
	}
	if strings.TrimSpace(r.stdout) != "" {
		t.Errorf("sessions without a quorum printed %q on stdout; want nothing", r.stdout)
	}
	for _, want := range []string{"no answer from JetStream", "n1"} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("the error does not say %q:\n%s", want, r.stderr)
		}
	}
	// The bound is 20 s for looking up the streams or for the read
	// (whichever finds no answer), each attempt at most 10 s: under the
	// minute.
	if took > time.Minute {
		t.Errorf("sessions gave up only after %v", took)
	}

	thaw()
	if !within(90*time.Second, func() bool { return c.allLed("") }) {
		t.Fatalf("the streams were not led again in 90s after the nodes ran again\n%s", tails(c.all))
	}
	r = loopbus(t, append([]string{"sessions", "--json"}, n1...)...)
	var list []json.RawMessage
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &list) != nil {
		t.Fatalf("sessions after the nodes ran again: exit %d, %q\n%s", r.code, r.stdout, r.stderr)
	}
}
