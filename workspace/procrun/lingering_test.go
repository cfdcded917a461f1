package procrun

import (
	"os/exec"
	"path/filepath"
	"testing"
)

func TestInside(t *testing.T) {
	dir := t.TempDir()
	other := t.TempDir()
	start := func(t *testing.T, d string) {
		t.Helper()
		cmd := exec.Command("sleep", "60")
		cmd.Dir = d
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	}
	before := Now()
	if !before.ok {
		t.Fatal("no mark: /proc unreadable")
	}
	if Inside(before, dir) {
		t.Errorf("Inside: true with no process in %s", dir)
	}
	start(t, filepath.Join(dir))
	if !Inside(before, dir) {
		t.Errorf("Inside: false with a process started since the mark working in %s", dir)
	}
	if Inside(before, dir+"x") || Inside(before, other) {
		t.Errorf("Inside: true for a directory no process works in (a prefix of a name is not a parent)")
	}
	if !Inside(before, filepath.Dir(dir)) {
		t.Errorf("Inside: false for the parent of the directory a process works in")
	}
	// A process from before the mark is not looked at, also when others
	// were created since.
	after := Now()
	start(t, other)
	if m := Now(); m.last == after.last {
		t.Fatalf("no pid handed out for the process started after the mark")
	}
	if Inside(after, dir) {
		t.Errorf("Inside: true for a process that was there before the mark")
	}
	if !Inside(Mark{}, other) {
		t.Errorf("Inside with no mark: false, want true (cannot tell)")
	}
}

// TestSince: after a mark, new pids are above its last pid, or, once the
// counter came round, also at or below the last pid now.
func TestSince(t *testing.T) {
	for _, tt := range []struct {
		pid, markLast, last int
		want                bool
	}{
		{pid: 500, markLast: 400, last: 900, want: true},
		{pid: 400, markLast: 400, last: 900, want: false},
		{pid: 300, markLast: 400, last: 900, want: false},
		{pid: 30000, markLast: 400, last: 380, want: true},
		{pid: 350, markLast: 400, last: 380, want: true},
		{pid: 380, markLast: 400, last: 380, want: true},
		{pid: 390, markLast: 400, last: 380, want: false},
		{pid: 400, markLast: 400, last: 380, want: false},
	} {
		if got := since(tt.pid, tt.markLast, tt.last); got != tt.want {
			t.Errorf("since(%d, mark %d, last %d) = %v, want %v", tt.pid, tt.markLast, tt.last, got, tt.want)
		}
	}
}
