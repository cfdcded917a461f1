package procrun

import (
	"errors"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"syscall"
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
// still works there. dir must be a path with no links in it, as the
// kernel shows working directories. It says true when it cannot tell: no
// /proc, so many processes created since m that the pid counter may have
// come round past m's last pid (see wrapLimit; once round, below it, is
// allowed for), or a process of this user created since hides its
// directory. It is a check against
// processes left behind by mistake, not against one bent on staying:
// such a process can keep the directory open, or work there from one
// thread or from another mount namespace, and not be seen.
func Inside(m Mark, dir string) bool {
	if !m.ok {
		return true
	}
	now, ok := forkCount()
	last, ok1 := readInt("/proc/sys/kernel/ns_last_pid")
	limit, ok2 := wrapLimit()
	switch {
	case !ok || !ok1 || !ok2:
		return true
	case now < m.forks || now-m.forks >= uint64(max(limit, 0)):
		return true // the pid counter may have come round past m.last
	case last == m.last:
		return false // no process since
	}
	var pids []int
	probed := probeRange(m.last, last)
	if probed {
		pids = pidRange(m.last, last) // no need to list /proc
	} else {
		var err error
		if pids, err = otherProcesses(); err != nil {
			return true
		}
	}
	uid := uint32(os.Getuid())
	for _, pid := range pids {
		if !since(pid, m.last, last) {
			continue
		}
		name := strconv.Itoa(pid)
		cwd, err := os.Readlink("/proc/" + name + "/cwd")
		switch {
		case err == nil:
			if (cwd == dir || strings.HasPrefix(cwd, dir+"/")) && (!probed || newGroup(name, m.last, last)) {
				return true
			}
		case !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, syscall.ESRCH) && ownedBy(name, uid) && (!probed || newGroup(name, m.last, last)):
			return true // this user's, and hiding where it works
		}
	}
	return false
}

// newGroup reports whether the task pid (a process's or, when probed, a
// thread's id) belongs to a process created after the mark whose last pid
// was markLast, last being the last pid now: a new thread of an older
// process is not one the mark is about, as listing /proc would not show
// it. It says true when it cannot tell.
func newGroup(pid string, markLast, last int) bool {
	t, ok := threadGroup(pid)
	return !ok || since(t, markLast, last)
}

// ownedBy reports whether the process pid (a /proc entry) runs as uid.
func ownedBy(pid string, uid uint32) bool {
	var st syscall.Stat_t
	return syscall.Stat("/proc/"+pid, &st) == nil && st.Uid == uid
}

// since reports whether pid may have been handed out after a mark whose
// last pid was markLast, last being the last pid now: pids above
// markLast, or, if the counter came round (once: see wrapLimit), also
// those up to last.
func since(pid, markLast, last int) bool {
	if last < markLast {
		return pid > markLast || pid <= last
	}
	return pid > markLast
}
