package workspace

import (
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/loopbus/loopbus/schemas"
)

// IdlePrefix starts the names of the emptied workspaces a Pool keeps in
// its base directory. Session ids never start with a dot, so no workspace
// of a job is ever named so.
const IdlePrefix = ".idle-"

// MaxIdle bounds the emptied workspaces one Pool keeps: one per job that
// ran at once, up to this many.
const MaxIdle = 16

// Pool makes workspaces under one base directory, as Create does, and
// takes them back emptied for the next job: making a file or directory
// costs the file system several times more than emptying one (and, on
// ext4 without a journal, more the more it removed lately), and a job's
// workspace is three directories and two files before any input. A kept
// workspace is renamed to IdlePrefix+RANDOM while it waits and to the next
// job's session.name-RANDOM when it is taken, and is taken only if it
// still holds nothing but its empty in/ and out/ and its emptied prompt
// and feedback files, with the modes Create and WriteText give them;
// anything else is removed and a new one made. Close removes what the
// pool keeps. A Pool is safe for concurrent use.
type Pool struct {
	base string

	mu      sync.Mutex
	idle    []string
	closed  bool
	noReuse bool // the file system cannot rename without replacing
}

// NewPool returns a pool of workspaces under base. Nothing is made until
// the first Create.
func NewPool(base string) (*Pool, error) {
	abs, err := filepath.Abs(base)
	if err != nil {
		return nil, fmt.Errorf("workspace: %w", err)
	}
	return &Pool{base: abs}, nil
}

// Create returns an empty workspace named session.name-RANDOM under the
// pool's base: a kept one renamed, or a new one. session and name must be
// safe tokens.
func (p *Pool) Create(session, name string) (*Workspace, error) {
	if err := checkNames(session, name); err != nil {
		return nil, err
	}
	prefix := session + "." + name + "-"
	for {
		idle := p.take()
		if idle == "" {
			break
		}
		root, err := rename(idle, filepath.Join(p.base, prefix))
		if err != nil {
			p.unsupported(err)
			_ = os.RemoveAll(idle)
			continue
		}
		if clean(root) {
			w := layout(root)
			w.pool = p
			return w, nil
		}
		// Something wrote into it while it waited, or changed its modes.
		_ = os.RemoveAll(root)
	}
	w, err := create(p.base, prefix)
	if err != nil {
		return nil, err
	}
	w.pool = p
	return w, nil
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
		errs = append(errs, os.RemoveAll(d))
	}
	return errors.Join(errs...)
}

// take returns a kept workspace, or "" when there is none.
func (p *Pool) take() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := len(p.idle)
	if n == 0 {
		return ""
	}
	d := p.idle[n-1]
	p.idle = p.idle[:n-1]
	return d
}

// unsupported stops reuse for good when the file system cannot rename a
// directory without replacing what is at the new name.
func (p *Pool) unsupported(err error) {
	if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) {
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
	if full || !empty(w.Root) {
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
	p.idle = append(p.idle, idle)
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
func empty(root string) bool {
	r, err := os.OpenRoot(root)
	if err != nil {
		return false
	}
	defer r.Close()
	names, ok := list(r, ".")
	if !ok || !privateDir(r, ".") {
		return false
	}
	dirs := 0
	for _, name := range names {
		switch {
		case name == "in" || name == "out":
			if !privateDir(r, name) || !emptyDir(r, name) {
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
func clean(root string) bool {
	r, err := os.OpenRoot(root)
	if err != nil {
		return false
	}
	defer r.Close()
	names, ok := list(r, ".")
	if !ok || !privateDir(r, ".") {
		return false
	}
	dirs := 0
	for _, name := range names {
		if isKept(name) {
			fi, err := r.Lstat(name)
			if err != nil || !ownFile(fi) || fi.Mode().Perm() != 0o600 || fi.Size() != 0 {
				return false
			}
			continue
		}
		if name != "in" && name != "out" || !privateDir(r, name) {
			return false
		}
		f, err := r.Open(name)
		if err != nil {
			return false
		}
		_, err = f.Readdirnames(1)
		_ = f.Close()
		if !errors.Is(err, io.EOF) {
			return false
		}
		dirs++
	}
	return dirs == 2
}

// privateDir reports whether name in r is a directory (not a link) of
// mode 0700.
func privateDir(r *os.Root, name string) bool {
	fi, err := r.Lstat(name)
	return err == nil && fi.IsDir() && fi.Mode().Perm() == 0o700 && fi.Mode()&(os.ModeSetuid|os.ModeSetgid|os.ModeSticky) == 0
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
