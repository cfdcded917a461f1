package procrun

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
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

// sweepTimeout bounds how long Run waits for a sweep: reading a process's
// environment can block on that process's memory.
const sweepTimeout = 2 * time.Second

// sweep kills, with SIGKILL, every process of this user that started no
// earlier than since (the run's leader, in clock ticks since boot) and
// whose environment holds RunIDVar=id, and returns how many it killed. It
// reads /proc (Linux); where there is none, it does nothing. Each process
// is held by a pidfd from before its environment is read until it is
// signalled, so a pid reused meanwhile is never killed. A process that
// cleared its environment before leaving the group escapes it.
func sweep(id string, since uint64) int {
	marker := []byte(RunIDVar + "=" + id + "\x00")
	self := os.Getpid()
	killed := map[int]bool{}
	for range maxSweeps {
		found := 0
		entries, err := os.ReadDir("/proc")
		if err != nil {
			break
		}
		for _, e := range entries {
			pid, err := strconv.Atoi(e.Name())
			if err != nil || pid == self || killed[pid] {
				continue
			}
			if st, ok := startTicks(pid); !ok || st < since {
				continue // older than the run: not of it
			}
			if kill(pid, marker) {
				killed[pid] = true
				found++
			}
		}
		if found == 0 {
			break
		}
	}
	return len(killed)
}

// kill sends SIGKILL to pid if its environment holds marker, through a
// pidfd opened first (or, where pidfds are missing, by pid).
func kill(pid int, marker []byte) bool {
	fd, err := unix.PidfdOpen(pid, 0)
	if errors.Is(err, unix.ENOSYS) {
		fd = -1
	} else if err != nil {
		return false // gone
	}
	if fd >= 0 {
		defer unix.Close(fd)
	}
	env, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
	if err != nil || !hasVar(env, marker) {
		return false
	}
	if fd >= 0 {
		return unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0) == nil
	}
	return syscall.Kill(pid, syscall.SIGKILL) == nil
}

// startTicks returns when pid started, in clock ticks since boot (field 22
// of /proc/PID/stat).
func startTicks(pid int) (uint64, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	// The command name, in parentheses, may hold spaces: fields count from
	// the last ')'. After it: state is field 3, starttime field 22.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, false
	}
	fields := bytes.Fields(b[i+1:])
	if len(fields) < 20 {
		return 0, false
	}
	n, err := strconv.ParseUint(string(fields[19]), 10, 64)
	return n, err == nil
}

// hasVar reports whether env (NUL-separated KEY=VALUE entries) holds
// marker (an entry with its NUL).
func hasVar(env, marker []byte) bool {
	return bytes.HasPrefix(env, marker) || bytes.Contains(env, append([]byte{0}, marker...))
}
