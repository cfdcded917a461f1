package procrun

import (
	"os"
	"strconv"
	"strings"
)

// Mark is a point in the machine's process history: the last pid handed
// out and the kernel's fork count then. Processes created after it have
// higher pids, unless the pid counter has come round since (see
// sweepScope).
type Mark struct {
	last  int
	forks uint64
	ok    bool
}

// Now returns a mark of the processes created so far.
func Now() Mark {
	forks, ok := forkCount()
	last, ok1 := readInt("/proc/sys/kernel/ns_last_pid")
	return Mark{last: last, forks: forks, ok: ok && ok1}
}

// Inside reports whether a process created after m, still alive, has its
// working directory at dir or below it: one of a run that escaped the
// sweep (it cleared its environment and left the process group) yet
// still works there. It says true when it cannot tell: no /proc, or the
// pid counter may have come round since m. A process of another user
// whose directory cannot be read, or one that was there before m and
// moved in later, is not seen.
func Inside(m Mark, dir string) bool {
	if !m.ok {
		return true
	}
	now, ok := forkCount()
	last, ok1 := readInt("/proc/sys/kernel/ns_last_pid")
	pidMax, ok2 := readInt("/proc/sys/kernel/pid_max")
	switch {
	case !ok || !ok1 || !ok2:
		return true
	case now < m.forks || now-m.forks >= uint64(pidMax) || last < m.last:
		return true // the pid counter may have come round
	case last == m.last:
		return false // no process since
	}
	names, err := procEntries()
	if err != nil {
		return true
	}
	self := os.Getpid()
	for _, name := range names {
		if name == "" || name[0] < '0' || name[0] > '9' {
			continue
		}
		pid, err := strconv.Atoi(name)
		if err != nil || pid <= m.last || pid == self {
			continue
		}
		cwd, err := os.Readlink("/proc/" + name + "/cwd")
		if err == nil && (cwd == dir || strings.HasPrefix(cwd, dir+"/")) {
			return true
		}
	}
	return false
}
