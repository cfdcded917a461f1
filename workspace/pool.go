package workspace

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/loopbus/loopbus/schemas"
	"github.com/loopbus/loopbus/workspace/procrun"
)

// IdlePrefix starts the names of the emptied workspaces a Pool keeps in
// its base directory. Session ids never start with a dot, so no workspace
// of a job is ever named so.
const IdlePrefix = ".idle-"

// MaxIdle bounds the emptied workspaces one Pool keeps: one per job that
// ran at once, up to this many.
const MaxIdle = 16

// Pool makes workspaces under one base directory, as Create does, and,
// when asked to reuse them, takes them back emptied for the next job:
// making a file or directory costs the file system several times more
// than emptying one (and, on ext4 without a journal, more the more it
// removed lately), and a job's workspace is three directories and two
// files before any input.
//
// A workspace is taken back only if no process created since it was
// handed out still works in it (see procrun.Inside: one that escaped the
// run's sweep would otherwise write into the next job's files), and only
// if it is still the directory the pool made (not a link or another
// directory put in its place) with in/ and out/ directories of mode 0700
// on the same device; the prompt and feedback files are kept, emptied,
// when they are regular files of mode 0600 with no other name. Everything
// else in it is removed, without following links. A kept workspace is
// renamed to IdlePrefix+RANDOM while it waits and to the next job's
// session.name-RANDOM when it is taken, and is handed out only if it is
// still that directory and holds nothing but its empty in/ and out/ and
// emptied prompt and feedback files; anything else is removed and a new
// one made. Close removes what the pool keeps. A Pool is safe for
// concurrent use.
//
// Reuse is for agents that run unconfined, as the worker's user: a
// process of theirs left behind can reach any workspace under base by its
// name anyway. procrun.Inside catches processes left working in the
// workspace by mistake; one bent on staying can keep the directory, or
// the prompt or feedback file, open, or see it through a sandbox's mount,
// and would then see the next job's files, which a new directory would
// not have shown it.
type Pool struct {
	base   string
	spread sync.Once // makes base, checks it and marks it (spreadSubdirs) before the first workspace
	// unsafe is PrivateDir's refusal of base, returned by every Create.
	unsafe error

	mu sync.Mutex
	// resolved is base with its links resolved, as the kernel shows
	// processes' working directories; "" until base exists.
	resolved string
	idle     []idleWorkspace
	closed   bool
	noReuse  bool // not asked to, or the file system cannot rename without replacing
}

// idleWorkspace is a kept workspace: its path and the directory's
// identity.
type idleWorkspace struct {
	path string
	id   fileID
}

// fileID identifies a file: device and inode.
type fileID struct{ dev, ino uint64 }

// idOf returns fi's identity.
func idOf(fi os.FileInfo) (fileID, bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fileID{}, false
	}
	return fileID{dev: st.Dev, ino: st.Ino}, true
}

// NewPool returns a pool of workspaces under base. With reuse false it
// keeps none: Create makes a new workspace and Remove deletes it, as the
// package's Create and Workspace.Remove do. Nothing is made until the
// first Create.
func NewPool(base string, reuse bool) (*Pool, error) {
	abs, err := filepath.Abs(base)
	if err != nil {
		return nil, fmt.Errorf("workspace: %w", err)
	}
	return &Pool{base: abs, noReuse: !reuse}, nil
}

// Create returns an empty workspace named session.name-RANDOM under the
// pool's base: a kept one renamed, or a new one. session and name must be
// safe tokens. Before the first new one is made, base is made if missing
// and refused, for good, when another user could change it (PrivateDir);
// then (links resolved) it is marked so that ext4 spreads workspaces over
// the disk's block groups (spreadSubdirs).
func (p *Pool) Create(session, name string) (*Workspace, error) {
	if err := checkNames(session, name); err != nil {
		return nil, err
	}
	prefix := session + "." + name + "-"
	for {
		idle, ok := p.take()
		if !ok {
			break
		}
		root, err := rename(idle.path, filepath.Join(p.base, prefix))
		if err != nil {
			p.unsupported(err)
			_ = os.RemoveAll(idle.path)
			continue
		}
		if clean(root, idle.id) {
			return p.handOut(root, idle.id), nil
		}
		// Something wrote into it while it waited, changed its modes or
		// put something else in its place: removed (a link, not what it
		// points to).
		_ = os.RemoveAll(root)
	}
	p.spread.Do(func() {
		// Before the first workspace, so that an empty base counts as
		// one made to be the work dir; a missing one is made as create
		// would make it.
		if p.unsafe = PrivateDir(p.base); p.unsafe == nil {
			if base := p.resolvedBase(); base != "" {
				spreadSubdirs(base)
			}
		}
	})
	if p.unsafe != nil {
		return nil, p.unsafe
	}
	w, err := create(p.base, prefix)
	if err != nil || !p.reusing() {
		return w, err
	}
	fi, err := os.Lstat(w.Root)
	id, ok := fileID{}, false
	if err == nil {
		id, ok = idOf(fi)
	}
	if !ok {
		return w, nil // never taken back: Remove deletes it
	}
	return p.handOut(w.Root, id), nil
}

// handOut returns the workspace at root, the directory id, as the pool's.
func (p *Pool) handOut(root string, id fileID) *Workspace {
	w := layout(root)
	w.pool, w.id, w.mark = p, id, procrun.Now()
	return w
}

// resolvedBase returns base with its links resolved, or "" if it cannot.
func (p *Pool) resolvedBase() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.resolved == "" {
		p.resolved, _ = filepath.EvalSymlinks(p.base)
	}
	return p.resolved
}

// Close removes the workspaces the pool keeps; workspaces handed out and
// removed after Close are deleted, not kept.
func (p *Pool) Close() error {
	p.mu.Lock()
	idle := p.idle
	p.idle, p.closed = nil, true
	p.mu.Unlock()
	var errs []error
	for _, d := range idle {
		errs = append(errs, os.RemoveAll(d.path))
	}
	return errors.Join(errs...)
}

// reusing reports whether the pool keeps workspaces.
func (p *Pool) reusing() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return !p.noReuse && !p.closed
}

// take returns a kept workspace, if there is one.
func (p *Pool) take() (idleWorkspace, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := len(p.idle)
	if n == 0 {
		return idleWorkspace{}, false
	}
	d := p.idle[n-1]
	p.idle = p.idle[:n-1]
	return d, true
}

// unsupported stops reuse for good when the file system cannot rename a
// directory without replacing what is at the new name, or renaming so is
// not allowed here.
func (p *Pool) unsupported(err error) {
	if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EPERM) {
		p.mu.Lock()
		p.noReuse = true
		p.mu.Unlock()
	}
}

// put empties w and keeps it. kept is false when it did neither, which
// leaves w for its caller to remove; err is that of removing it after a
// Close that came while it was emptied.
func (p *Pool) put(w *Workspace) (kept bool, err error) {
	p.mu.Lock()
	full := p.closed || p.noReuse || len(p.idle) >= MaxIdle
	p.mu.Unlock()
	if full || !empty(w.Root, w.id) {
		return false, nil
	}
	// A process created during the job that still works in it would
	// write into the next job's files. The kernel shows a process's
	// directory with the links in base's path resolved.
	if base := p.resolvedBase(); base == "" || procrun.Inside(w.mark, filepath.Join(base, filepath.Base(w.Root))) {
		return false, nil
	}
	idle, err := rename(w.Root, filepath.Join(p.base, IdlePrefix))
	if err != nil {
		p.unsupported(err)
		return false, nil
	}
	p.mu.Lock()
	if p.closed || len(p.idle) >= MaxIdle {
		p.mu.Unlock()
		return true, os.RemoveAll(idle)
	}
	p.idle = append(p.idle, idleWorkspace{path: idle, id: w.id})
	p.mu.Unlock()
	return true, nil
}

// rename moves the directory dir to prefix+RANDOM, never over an existing
// entry, and returns the new path.
func rename(dir, prefix string) (string, error) {
	for range 100 {
		to := prefix + strconv.FormatUint(uint64(rand.Uint32()), 10)
		err := unix.Renameat2(unix.AT_FDCWD, dir, unix.AT_FDCWD, to, unix.RENAME_NOREPLACE)
		if err == nil {
			return to, nil
		}
		if !errors.Is(err, unix.EEXIST) {
			return "", err
		}
	}
	return "", fmt.Errorf("workspace: no free name %s*", prefix)
}

// isKept reports whether name is one of the files a kept workspace may
// hold besides in/ and out/: the prompt and feedback files, emptied.
// Reusing their inodes spares the file system two more files made and
// removed per job.
func isKept(name string) bool { return name == "prompt.md" || name == "feedback.md" }

// empty removes everything in the workspace at root but in/ and out/,
// and everything in those, without following links, and empties the
// prompt and feedback files if they are still files of their own (else
// removes them). It reports whether root, in/ and out/ are left
// directories of mode 0700 (an agent may have replaced or re-moded any of
// them); Create checks again, with clean, when it takes the workspace.
func empty(root string, id fileID) bool {
	r, names, ok := openListed(root, id)
	if !ok {
		return false
	}
	defer r.Close()
	dirs := 0
	for _, name := range names {
		switch {
		case name == "in" || name == "out":
			if !privateDir(r, name, id.dev) || !emptyDir(r, name) {
				return false
			}
			dirs++
		case isKept(name) && truncate(r, name):
		default:
			if r.RemoveAll(name) != nil {
				return false
			}
		}
	}
	return dirs == 2
}

// emptyDir removes everything in the directory name of r.
func emptyDir(r *os.Root, name string) bool {
	sub, err := r.OpenRoot(name)
	if err != nil {
		return false
	}
	defer sub.Close()
	inner, ok := list(sub, ".")
	for _, n := range inner {
		if ok && sub.RemoveAll(n) != nil {
			ok = false
		}
	}
	return ok
}

// truncate empties the file name of r and reports whether it did: only
// a regular file of mode 0600 with no other name (a hard link would make
// the file someone else's too) is emptied.
func truncate(r *os.Root, name string) bool {
	f, err := r.OpenFile(name, os.O_WRONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return false
	}
	defer f.Close()
	fi, err := f.Stat()
	return err == nil && ownFile(fi) && fi.Mode().Perm() == 0o600 && f.Truncate(0) == nil
}

// ownFile reports whether fi is a regular file with one name.
func ownFile(fi os.FileInfo) bool {
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && fi.Mode().IsRegular() && st.Nlink == 1
}

// clean reports whether the workspace at root holds in/ and out/, both
// empty, and at most the emptied prompt and feedback files, and root,
// in/ and out/ are directories of mode 0700.
func clean(root string, id fileID) bool {
	r, names, ok := openListed(root, id)
	if !ok {
		return false
	}
	defer r.Close()
	dirs := 0
	for _, name := range names {
		if isKept(name) {
			fi, err := r.Lstat(name)
			if err != nil || !ownFile(fi) || fi.Mode().Perm() != 0o600 || fi.Size() != 0 {
				return false
			}
			continue
		}
		if name != "in" && name != "out" || !privateDir(r, name, id.dev) {
			return false
		}
		if inner, ok := list(r, name); !ok || len(inner) > 0 {
			return false
		}
		dirs++
	}
	return dirs == 2
}

// openOwn opens the workspace at root if it is the directory id, of
// mode 0700, and not a link to it: an agent may have put a link or
// another directory in its place, or moved it away and linked to it. The
// directory is opened without following a link and checked; the Root is
// then opened on that open directory (through /proc/self/fd), so what is
// done through it is done in the directory checked.
func openOwn(root string, id fileID) (*os.Root, bool) {
	fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, false
	}
	dir := os.NewFile(uintptr(fd), root)
	defer dir.Close()
	fi, err := dir.Stat()
	if got, ok := idOf(fi); err != nil || !ok || got != id || !private(fi) {
		return nil, false
	}
	r, err := os.OpenRoot("/proc/self/fd/" + strconv.Itoa(fd))
	if err != nil {
		return nil, false
	}
	if opened, err := r.Stat("."); err != nil || !os.SameFile(opened, fi) {
		_ = r.Close()
		return nil, false
	}
	return r, true
}

// openListed opens the workspace at root (see openOwn) and lists it.
func openListed(root string, id fileID) (*os.Root, []string, bool) {
	r, ok := openOwn(root, id)
	if !ok {
		return nil, nil, false
	}
	names, ok := list(r, ".")
	if !ok {
		_ = r.Close()
		return nil, nil, false
	}
	return r, names, true
}

// privateDir reports whether name in r is a directory (not a link) of
// mode 0700 on device dev (not a mount).
func privateDir(r *os.Root, name string, dev uint64) bool {
	fi, err := r.Lstat(name)
	if err != nil || !private(fi) {
		return false
	}
	got, ok := idOf(fi)
	return ok && got.dev == dev
}

// private reports whether fi is a directory of mode 0700 with no special
// bits.
func private(fi os.FileInfo) bool {
	return fi.IsDir() && fi.Mode().Perm() == 0o700 && fi.Mode()&(os.ModeSetuid|os.ModeSetgid|os.ModeSticky) == 0
}

// list returns the names in the directory name of r.
func list(r *os.Root, name string) ([]string, bool) {
	f, err := r.Open(name)
	if err != nil {
		return nil, false
	}
	defer f.Close()
	names, err := f.Readdirnames(-1)
	return names, err == nil
}

// checkNames refuses a session id or workspace name that is not a safe
// token.
func checkNames(session, name string) error {
	if err := schemas.ValidateSessionID(session); err != nil {
		return err
	}
	return schemas.ValidateName(name)
}
