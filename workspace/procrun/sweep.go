package procrun

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"math"
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

// sweepScope says which processes a sweep looks at: those started no
// earlier than since (the run's leader, in clock ticks since boot). When
// the kernel's fork count was read before the leader was started, and
// fewer processes were created since then than there are pids, the pid
// counter cannot have come round again: every process started since has
// a pid above the leader's, and the others are not even looked at.
type sweepScope struct {
	since   uint64
	leader  int
	forks   uint64
	forksOK bool
}

// minPID is the highest pid the sweep may skip (0: none).
func (sc sweepScope) minPID() int {
	if !sc.forksOK {
		return 0
	}
	now, ok := forkCount()
	last, ok1 := readInt("/proc/sys/kernel/ns_last_pid")
	limit, ok2 := wrapLimit()
	if !ok || !ok1 || !ok2 {
		return 0
	}
	return skippable(sc.leader, sc.forks, now, last, limit)
}

// skippable is the highest pid a sweep may skip: the leader's, if the
// last pid handed out is not below it and fewer than limit processes
// were created since forks (so the counter did not come round, see
// wrapLimit); else 0.
func skippable(leader int, forks, now uint64, last, limit int) int {
	if now < forks || last < leader || now-forks >= uint64(max(limit, 0)) {
		return 0
	}
	return leader
}

// wrapLimit bounds the processes that may be created before the pid
// counter can come round to a pid handed out before them: it starts
// again at 300 once it reaches pid_max and skips the pids in use, so
// fewer than pid_max - 300 - (tasks alive) forks can do it. Tasks come
// and go; at most half of pid_max is trusted.
func wrapLimit() (int, bool) {
	pidMax, ok := readInt("/proc/sys/kernel/pid_max")
	if !ok {
		return 0, false
	}
	var buf [128]byte
	b, ok := readProc("/proc/loadavg", buf[:])
	if !ok {
		return 0, false
	}
	// "0.34 0.87 1.21 2/79 10087": the fourth field is running/total.
	f := bytes.Fields(b)
	if len(f) < 4 {
		return 0, false
	}
	_, total, found := bytes.Cut(f[3], []byte("/"))
	tasks, ok := parseUint(total)
	if !found || !ok || tasks > uint64(pidMax) {
		return 0, false
	}
	return min(pidMax/2, pidMax-300-int(tasks)), true
}

// forkCount is the number of processes and threads created since boot
// ("processes" in /proc/stat).
func forkCount() (uint64, bool) {
	var buf [16 << 10]byte
	b, ok := readProc("/proc/stat", buf[:])
	if !ok {
		return 0, false
	}
	return field(b, "processes ")
}

// field returns the number on the line of b (a /proc file) that starts
// with key, the file's first line aside.
func field(b []byte, key string) (uint64, bool) {
	i := bytes.Index(b, []byte("\n"+key))
	if i < 0 {
		return 0, false
	}
	line := b[i+1+len(key):]
	if j := bytes.IndexByte(line, '\n'); j >= 0 {
		line = line[:j]
	}
	return parseUint(bytes.TrimSpace(line))
}

func readInt(path string) (int, bool) {
	var buf [64]byte
	b, ok := readProc(path, buf[:])
	if !ok {
		return 0, false
	}
	n, ok := parseUint(bytes.TrimSpace(b))
	return int(n), ok && n <= math.MaxInt32
}

// readProc returns the contents of a file of /proc, read into buf when
// they fit, else into a new buffer. /proc's files say they are empty and
// are made as they are read: os.ReadFile would start small and grow its
// buffer several times for each, and a run reads several.
func readProc(path string, buf []byte) ([]byte, bool) {
	fd, err := syscall.Open(path, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	for errors.Is(err, syscall.EINTR) {
		fd, err = syscall.Open(path, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	}
	if err != nil {
		return nil, false
	}
	n := 0
	for n < len(buf) {
		k, err := syscall.Read(fd, buf[n:])
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil {
			_ = syscall.Close(fd)
			return nil, false
		}
		if k == 0 {
			_ = syscall.Close(fd)
			return buf[:n], true
		}
		n += k
	}
	_ = syscall.Close(fd)
	b, err := os.ReadFile(path) // larger than buf
	return b, err == nil
}

// parseUint parses decimal digits (at most 19, so it cannot overflow)
// without making a string of them.
func parseUint(b []byte) (uint64, bool) {
	if len(b) == 0 || len(b) > 19 {
		return 0, false
	}
	var n uint64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + uint64(c-'0')
	}
	return n, true
}

// sweep kills, with SIGKILL, every process of this user that started no
// earlier than sc.since (the run's leader, in clock ticks since boot) and
// whose environment holds RunIDVar=id, and returns how many it killed. It
// reads /proc (Linux); where there is none, it does nothing. Each process
// is held by a pidfd from before its environment is read until it is
// signalled, so a pid reused meanwhile is never killed. One caught in the
// middle of an exec is looked at once its new environment is laid out
// (see environ). A process that cleared its environment before leaving
// the group escapes it, and so does one whose main thread has exited (its
// environment can no longer be read), or one given a pid out of turn
// (which takes privileges over the pid namespace) when the sweep looks
// only at the pids handed out since the leader.
func sweep(id string, sc sweepScope) int {
	marker := []byte(RunIDVar + "=" + id + "\x00")
	killed := map[int]bool{}
	for range maxSweeps {
		found := 0
		// Processes forked later have higher pids still. Asked again each
		// pass, in case the pid counter came round during the last.
		skip := sc.minPID()
		pids, err := pidsAfter(skip)
		if err != nil {
			break
		}
		for _, pid := range pids {
			if pid <= skip || killed[pid] {
				continue
			}
			if st, ok := startTicks(pid); !ok || st < sc.since {
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

// maxProbe bounds the pids looked at one by one instead of listing
// /proc. Listing walks every process on the machine (about 25 µs with 65
// processes, more on a busy machine); a pid that is not in use costs a
// failed open of about 1 µs, one in use (a thread's id too) a read of its
// stat file, as listing would cost for it. Past a few dozen, listing is
// cheaper.
const maxProbe = 32

// pidsAfter returns the pids to look at for processes created after the
// pid low, low being 0 (no bound) or a pid the counter has not come round
// past since (the caller's to know: see sweepScope.minPID). With low set
// and at most maxProbe pids handed out after it, those pids, in order,
// this process's excluded, whether in use or not, ids of threads among
// them (/proc answers for those too); otherwise every process in /proc
// but this one (unsorted).
func pidsAfter(low int) ([]int, error) {
	if low > 0 {
		if last, ok := readInt("/proc/sys/kernel/ns_last_pid"); ok && probeRange(low, last) {
			return pidRange(low, last), nil
		}
	}
	return otherProcesses()
}

// probeRange reports whether the pids after low up to the last one
// handed out are few enough to look at one by one.
func probeRange(low, last int) bool {
	return low > 0 && last >= low && last-low <= maxProbe
}

// pidRange returns the pids after low up to last, this process's
// excluded.
func pidRange(low, last int) []int {
	self := os.Getpid()
	pids := make([]int, 0, last-low)
	for pid := low + 1; pid <= last; pid++ {
		if pid != self {
			pids = append(pids, pid)
		}
	}
	return pids
}

// otherProcesses lists the pids of the processes in /proc but this one
// (unsorted).
func otherProcesses() ([]int, error) {
	names, err := procEntries()
	if err != nil {
		return nil, err
	}
	self := os.Getpid()
	pids := make([]int, 0, len(names))
	for _, name := range names {
		if name == "" || name[0] < '0' || name[0] > '9' {
			continue // self, sys, meminfo…: not a process (and no error to make)
		}
		if pid, err := strconv.Atoi(name); err == nil && pid != self {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// procEntries lists the names in /proc (unsorted).
func procEntries() ([]string, error) {
	d, err := os.Open("/proc")
	if err != nil {
		return nil, err
	}
	defer d.Close()
	return d.Readdirnames(-1)
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
	env, ok := environ(pid)
	if !ok || !hasVar(env, marker) {
		return false
	}
	if fd >= 0 {
		return unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0) == nil
	}
	// A thread's id (probed, not listed) reads its process's environment,
	// and kill(2) would signal that process: leave it to its own pid, so
	// that it is counted once.
	if t, ok := threadGroup(strconv.Itoa(pid)); !ok || t != pid {
		return false
	}
	return syscall.Kill(pid, syscall.SIGKILL) == nil
}

// threadGroup returns the id of the process that the task pid (a /proc
// entry: a process's or a thread's id) belongs to (Tgid in its status).
func threadGroup(pid string) (int, bool) {
	var buf [4 << 10]byte
	b, ok := readProc("/proc/"+pid+"/status", buf[:])
	if !ok {
		return 0, false
	}
	n, ok := field(b, "Tgid:")
	return int(n), ok && n <= math.MaxInt32
}

// startTicks returns when pid started, in clock ticks since boot (field 22
// of /proc/PID/stat).
func startTicks(pid int) (uint64, bool) {
	st, ok := readStat(pid)
	return st.start, ok
}

// procStat holds the fields of /proc/PID/stat that the sweep reads.
type procStat struct {
	state byte
	// flags are the kernel's PF_* flags of the task.
	flags uint64
	// start is when the process started, in clock ticks since boot.
	start uint64
	// envEnd is where its environment ends in its memory: 0 while an
	// exec has replaced its memory but not yet laid out the new
	// program's arguments and environment (or for a process without
	// memory: a zombie, a kernel thread).
	envEnd uint64
}

// Task flags (PF_* of the kernel) that mean the process has, or will
// have, no environment to read: it is exiting (its memory is dropped
// before it becomes a zombie), or it is a kernel thread.
const (
	pfExiting = 0x00000004
	pfKthread = 0x00200000
)

// readStat reads the fields of procStat from /proc/PID/stat: state
// (field 3), flags (9), starttime (22) and env_end (51). Kernels before
// 3.5 lack env_end (read as 0): there environ waits execWait for every
// process of the run's time with an empty environment.
func readStat(pid int) (procStat, bool) {
	var buf [1 << 10]byte
	b, ok := readProc("/proc/"+strconv.Itoa(pid)+"/stat", buf[:])
	if !ok {
		return procStat{}, false
	}
	// The command name, in parentheses, may hold spaces: fields count from
	// the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return procStat{}, false
	}
	var st procStat
	rest := b[i+1:]
	for field := 3; field <= 51; field++ {
		rest = bytes.TrimLeft(rest, " ")
		end := bytes.IndexAny(rest, " \n")
		if end < 0 {
			end = len(rest)
		}
		if end == 0 {
			// Fewer fields: starttime is required, env_end is not.
			return st, field > 22
		}
		v := rest[:end]
		switch field {
		case 3:
			st.state = v[0]
		case 9:
			if st.flags, ok = parseUint(v); !ok {
				return procStat{}, false
			}
		case 22:
			if st.start, ok = parseUint(v); !ok {
				return procStat{}, false
			}
		case 51:
			st.envEnd, _ = parseUint(v)
		}
		rest = rest[end:]
	}
	return st, true
}

// execWait bounds how long kill waits for a process in the middle of an
// exec to lay out its new environment: that takes microseconds, or
// longer while the new program is read from a slow disk.
const execWait = 200 * time.Millisecond

// environ reads the environment of pid, held by the caller (a pidfd, so
// that the pid is not reused meanwhile). A process caught in the middle of
// an exec shows an empty environment until the new program's is laid out:
// environ waits for that (execWait at most), so that a process of a run
// that was exec'ing when the run ended is not taken for one without the
// run's mark. It reports false if the environment cannot be read.
func environ(pid int) ([]byte, bool) {
	path := "/proc/" + strconv.Itoa(pid) + "/environ"
	deadline := time.Now().Add(execWait)
	for pause := 50 * time.Microsecond; ; pause = min(2*pause, 5*time.Millisecond) {
		env, err := os.ReadFile(path)
		if err != nil || len(env) > 0 {
			return env, err == nil
		}
		st, ok := readStat(pid)
		switch {
		case !ok || st.state == 'Z' || st.flags&(pfExiting|pfKthread) != 0:
			return nil, false // gone, dying, or never had an environment
		case st.envEnd != 0:
			// Laid out: empty, or the exec finished since the first read.
			env, err = os.ReadFile(path)
			return env, err == nil
		case time.Now().After(deadline):
			return nil, false
		}
		time.Sleep(pause)
	}
}

// hasVar reports whether env (NUL-separated KEY=VALUE entries) holds
// marker (an entry with its NUL).
func hasVar(env, marker []byte) bool {
	return bytes.HasPrefix(env, marker) || bytes.Contains(env, append([]byte{0}, marker...))
}
