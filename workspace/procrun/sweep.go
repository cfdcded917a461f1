package procrun

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"os"
	"strconv"
	"syscall"
)

// RunIDVar is the environment variable that marks every process of one
// Run: the process gets it, and its descendants inherit it, including
// those that leave its process group (setsid, setpgid) and outlive it.
// When the run ends, sweep kills every process that still carries it.
const RunIDVar = "LOOPBUS_RUN_ID"

// newRunID returns a fresh run id: 16 random hex digits.
func newRunID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// maxSweeps bounds the passes of sweep: each kills what the last pass
// found; a process killed with SIGKILL forks no more, so a second pass
// finds only what was forked during the first.
const maxSweeps = 4

// sweep kills, with SIGKILL, every process of this user whose environment
// holds RunIDVar=id, and returns how many it killed. It reads /proc (Linux);
// where there is none, it does nothing. A process that cleared its
// environment before leaving the group escapes it.
func sweep(id string) int {
	marker := []byte(RunIDVar + "=" + id + "\x00")
	self := os.Getpid()
	killed := 0
	for range maxSweeps {
		found := 0
		entries, err := os.ReadDir("/proc")
		if err != nil {
			return killed
		}
		for _, e := range entries {
			pid, err := strconv.Atoi(e.Name())
			if err != nil || pid == self {
				continue
			}
			env, err := os.ReadFile("/proc/" + e.Name() + "/environ")
			if err != nil || !hasVar(env, marker) {
				continue
			}
			if syscall.Kill(pid, syscall.SIGKILL) == nil {
				found++
			}
		}
		killed += found
		if found == 0 {
			break
		}
	}
	return killed
}

// hasVar reports whether env (NUL-separated KEY=VALUE entries) holds
// marker (an entry with its NUL).
func hasVar(env, marker []byte) bool {
	return bytes.HasPrefix(env, marker) || bytes.Contains(env, append([]byte{0}, marker...))
}
