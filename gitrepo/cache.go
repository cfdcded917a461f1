package gitrepo

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/loopbus/loopbus/schemas"
)

// Cache is a bare repository under root (root/<session>.git) that a worker
// or validator keeps per session. It is safe for concurrent use by the
// goroutines of one process: a mutex serializes the git commands that
// write its refs and objects. Commands ignore the user's global git
// configuration and hooks, and the cache's own configuration is put back
// as OpenCache wrote it before every use: agents work in the cache's
// worktrees, and what they write there with git config (a filter, a
// gpg.program, an include) must never run as the worker, nor carry into
// later jobs. An agent still running in another worktree of the same
// cache while a command starts could write it in between; agents of one
// session are one another's, so that race is left to the session.
type Cache struct {
	dir string
	mu  sync.Mutex
	// fetched holds the digests of the bundle artifacts already in the
	// cache (see FetchArtifacts); guarded by mu.
	fetched map[string]bool
	// admin maps each worktree this cache made (its absolute path) to its
	// git directory, read when it was made: what the worktree's .git file
	// says later is the agent's to change. Guarded by mu.
	admin map[string]string
}

// OpenCache opens the cache of session under root, creating root (mode
// 0700) and the bare repository root/<session>.git when missing. session
// must pass schemas.ValidateSessionID. A cache directory that is not this
// user's, or that others may write, is refused (ErrUnsafeCache).
func OpenCache(root, session string) (*Cache, error) {
	if err := schemas.ValidateSessionID(session); err != nil {
		return nil, err
	}
	root, err := filepath.Abs(root)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, fmt.Errorf("gitrepo: cache root: %w", err)
	}
	c := &Cache{dir: filepath.Join(root, session+".git"), fetched: map[string]bool{}}
	for _, d := range []string{root, c.dir} {
		if err := ownDir(d); err != nil {
			return nil, err
		}
	}
	if _, err := os.Stat(filepath.Join(c.dir, "HEAD")); errors.Is(err, fs.ErrNotExist) {
		if _, err := (gitCmd{isolated: true}).run(context.Background(), "init", "-q", "--bare", "--template=", "--initial-branch=main", c.dir); err != nil {
			return nil, fmt.Errorf("gitrepo: creating cache: %w", err)
		}
	} else if err != nil {
		return nil, fmt.Errorf("gitrepo: cache: %w", err)
	}
	if err := c.restoreConfig(); err != nil {
		return nil, err
	}
	return c, nil
}

// cacheConfig is the whole configuration of a cache: what git init --bare
// writes.
const cacheConfig = "[core]\n\trepositoryformatversion = 0\n\tfilemode = true\n\tbare = true\n"

// restoreConfig writes the cache's configuration file back to cacheConfig
// when anything else is there. Only that file configures git for the
// cache and its worktrees: the user's global and system files are not
// read (gitCmd.env), and a worktree's own config.worktree only with an
// extension cacheConfig does not enable.
func (c *Cache) restoreConfig() error {
	path := filepath.Join(c.dir, "config")
	if b, err := os.ReadFile(path); err == nil && string(b) == cacheConfig {
		return nil
	}
	f, err := os.CreateTemp(c.dir, "config.loopbus-")
	if err != nil {
		return fmt.Errorf("gitrepo: restoring the cache's configuration: %w", err)
	}
	_, err = f.WriteString(cacheConfig)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		// A rename replaces whatever is at path, a link included.
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		_ = os.Remove(f.Name())
		return fmt.Errorf("gitrepo: restoring the cache's configuration: %w", err)
	}
	return nil
}

// ownDir refuses dir when it exists and is not a directory of this user's
// that only this user may write.
func ownDir(dir string) error {
	fi, err := os.Lstat(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("gitrepo: cache: %w", err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !fi.IsDir() || !ok || st.Uid != uint32(os.Geteuid()) || fi.Mode().Perm()&0o022 != 0 {
		return fmt.Errorf("%w: %s (%s) is not a directory of this user's (uid %d) that only it may write; remove it",
			ErrUnsafeCache, dir, fi.Mode(), os.Geteuid())
	}
	return nil
}

// Dir returns the cache's git directory.
func (c *Cache) Dir() string { return c.dir }

func (c *Cache) git() gitCmd { return gitCmd{gitDir: c.dir, isolated: true} }

// keep points refs/loopbus/keep/<commit> at commit so that gc keeps it.
func (c *Cache) keep(ctx context.Context, commit string) error {
	_, err := c.git().run(ctx, "update-ref", "refs/loopbus/keep/"+commit, commit)
	return err
}

// FetchBundle brings every object of the bundle file at path (made by
// Bundle or BundleBase; its prerequisites must be in the cache) into the
// cache and keeps its tips under refs/loopbus/keep/<sha>. It is
// idempotent: a bundle whose tips are present is not unpacked again.
func (c *Cache) FetchBundle(ctx context.Context, path string) error {
	path, err := filepath.Abs(path)
	if err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.restoreConfig(); err != nil {
		return err
	}
	heads, err := c.git().unbundle(ctx, path)
	if err != nil {
		return fmt.Errorf("gitrepo: fetching bundle %s: %w: %w", filepath.Base(path), ErrBadBundle, err)
	}
	for _, h := range heads {
		if err := c.keep(ctx, h); err != nil {
			return err
		}
	}
	return nil
}

// Has reports whether commit is in the cache.
func (c *Cache) Has(ctx context.Context, commit string) bool {
	if checkRev("commit", commit) != nil || c.restoreConfig() != nil {
		return false
	}
	_, err := c.git().run(ctx, "cat-file", "-e", commit+"^{commit}")
	return err == nil
}

// Bundle writes to path a bundle of the commits reachable from tip but not
// from base (base "" = the whole history), whose one ref, HEAD, points at
// tip. When tip is reachable from base the bundle would be empty: it
// returns an error wrapping ErrEmpty and writes nothing.
func (c *Cache) Bundle(ctx context.Context, path, tip, base string) error {
	if err := c.restoreConfig(); err != nil {
		return err
	}
	return writeBundle(ctx, c.git(), path, tip, base)
}

// addWorktree makes dir a worktree of the cache at commit; mode is
// "-B <branch>" or "--detach". The caller holds c.mu.
func (c *Cache) addWorktree(ctx context.Context, dir, commit string, mode ...string) error {
	if err := checkRev("commit", commit); err != nil {
		return err
	}
	if _, err := c.git().run(ctx, "worktree", "prune"); err != nil {
		return err
	}
	args := append([]string{"worktree", "add", "-q", "-f"}, mode...)
	if _, err := c.git().run(ctx, append(args, dir, commit)...); err != nil {
		return err
	}
	gitDir, err := (gitCmd{dir: dir, isolated: true}).run(ctx, "rev-parse", "--absolute-git-dir")
	if err != nil {
		return err
	}
	if c.admin == nil {
		c.admin = map[string]string{}
	}
	c.admin[dir] = gitDir
	return nil
}

// Commit commits everything uncommitted in dir, a worktree this cache made
// (git add -A: new files included, .gitignore respected), as one commit
// authored and committed by id (missing fields from DefaultIdentity), with
// message followed by a blank line and the trailers in order as "Key:
// value" lines. When nothing is uncommitted it makes no commit. It returns
// HEAD afterwards. The user's global git configuration, hooks and any
// fsmonitor are ignored, and git is pointed at the worktree's own git
// directory: a .git file the agent rewrote (to a directory of its own,
// whose configuration would run its commands) is not read.
func (c *Cache) Commit(ctx context.Context, dir string, id schemas.GitIdentity, message string, trailers [][2]string) (head string, err error) {
	if dir, err = filepath.Abs(dir); err != nil {
		return "", err
	}
	c.mu.Lock()
	gitDir, ok := c.admin[dir]
	c.mu.Unlock()
	if !ok {
		return "", fmt.Errorf("gitrepo: %s is not a worktree of this cache", dir)
	}
	// The agent that worked here may have configured the cache.
	if err := c.restoreConfig(); err != nil {
		return "", err
	}
	return commit(ctx, gitCmd{dir: dir, gitDir: gitDir, workTree: dir, isolated: true, id: &id}, message, trailers)
}

// removeWorktree is RemoveWorktree without the lock.
func (c *Cache) removeWorktree(ctx context.Context, dir string) error {
	delete(c.admin, dir)
	if err := c.restoreConfig(); err != nil {
		return err
	}
	if _, err := c.git().run(ctx, "worktree", "remove", "--force", "--force", dir); err != nil {
		if _, serr := os.Stat(dir); !errors.Is(serr, fs.ErrNotExist) {
			return err
		}
	}
	_, err := c.git().run(ctx, "worktree", "prune")
	return err
}

// RemoveWorktree removes the worktree at dir, even with uncommitted
// changes, and prunes the cache's worktree records. A dir that is already
// gone is not an error.
func (c *Cache) RemoveWorktree(ctx context.Context, dir string) error {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.removeWorktree(ctx, dir)
}

// Prepare makes dir (which must not exist or be empty) a worktree of the
// cache on branch spec.Branch for one iteration of a loop, and returns a
// note for the agent ("" normally). The commits it names must be in the
// cache.
//
//   - From == "": the worktree is at Base.
//   - From != "" and FromBase is Base or "": the worktree is at From. If
//     From's tip commit carries the trailer Loopbus-Job (the worker's
//     commit of the previous iteration) it is soft-reset, so its work is
//     uncommitted again and the next Commit makes one commit for the loop.
//     Commits the agent made are kept.
//   - From != "" and FromBase != Base (the target branch moved): the loop's
//     commits since FromBase are rebased onto Base and the worker commit is
//     soft-reset as above. If the rebase conflicts, the worktree is reset
//     to Base and the note says the previous work was dropped, naming the
//     files.
//
// Commits Prepare makes name spec.Identity (or DefaultIdentity) as
// committer. On error the worktree is removed again.
func (c *Cache) Prepare(ctx context.Context, dir string, spec schemas.WorktreeSpec) (note string, err error) {
	if err := checkRev("base", spec.Base); err != nil {
		return "", err
	}
	if spec.Branch == "" {
		return "", errors.New("gitrepo: worktree spec names no branch")
	}
	if dir, err = filepath.Abs(dir); err != nil {
		return "", err
	}
	fromBase := spec.FromBase
	if fromBase == "" {
		fromBase = spec.Base
	}
	start := spec.Base
	if spec.From != "" {
		start = spec.From
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.restoreConfig(); err != nil {
		return "", err
	}
	if err := c.addWorktree(ctx, dir, start, "-B", spec.Branch); err != nil {
		return "", fmt.Errorf("gitrepo: preparing worktree: %w", err)
	}
	defer func() {
		if err != nil {
			_ = c.removeWorktree(context.WithoutCancel(ctx), dir)
		}
	}()
	if spec.From == "" {
		return "", nil
	}
	w := gitCmd{dir: dir, isolated: true, id: spec.Identity}
	if fromBase != spec.Base {
		if err := checkRev("fromBase", fromBase); err != nil {
			return "", err
		}
		if _, err := w.run(ctx, "rebase", "-q", "--onto", spec.Base, fromBase); err != nil {
			files := w.conflicts(ctx)
			_, _ = w.run(ctx, "rebase", "--abort")
			if len(files) == 0 {
				return "", fmt.Errorf("gitrepo: carrying work over: %w", err)
			}
			if _, err := w.run(ctx, "reset", "-q", "--hard", spec.Base); err != nil {
				return "", err
			}
			return fmt.Sprintf("The previous iteration's work conflicted with the new head of the target branch "+
				"(%s) in %s and was dropped; this worktree starts from the new head.",
				short(spec.Base), strings.Join(files, ", ")), nil
		}
	}
	return "", uncommitWorker(ctx, w, spec.Base, fromBase)
}

// uncommitWorker soft-resets HEAD when it is a worker commit (it carries
// the Loopbus-Job trailer) of the loop itself, not one of base or
// fromBase (another loop's work merged into the target branch).
func uncommitWorker(ctx context.Context, w gitCmd, base, fromBase string) error {
	job, err := w.run(ctx, "log", "-1", "--format=%(trailers:key="+TrailerJob+",valueonly)", "HEAD")
	if err != nil || strings.TrimSpace(job) == "" {
		return err
	}
	for _, b := range []string{base, fromBase} {
		if in, err := w.isAncestor(ctx, "HEAD", b); err != nil || in {
			return err
		}
	}
	_, err = w.run(ctx, "reset", "-q", "--soft", "HEAD~1")
	return err
}

// Merge puts the loop's commits (from's commits since fromBase) on top of
// base and returns the new head: from itself when fromBase is base (or "";
// a fast-forward, no new commits), else the commits rebased in a scratch
// worktree at dir with committer id and committer date date (authors and
// author dates are kept), so a retried merge of the same inputs with the
// same date yields the same commit ids. A zero date means now. The head
// is kept under refs/loopbus/keep. On a conflict it returns the
// conflicting files (sorted) and an error wrapping ErrConflict that names
// them. The scratch worktree is removed in every case.
func (c *Cache) Merge(ctx context.Context, dir string, base, from, fromBase string, id schemas.GitIdentity, date time.Time) (head string, conflict []string, err error) {
	for _, r := range [][2]string{{"base", base}, {"from", from}} {
		if err := checkRev(r[0], r[1]); err != nil {
			return "", nil, err
		}
	}
	if fromBase == "" || fromBase == base {
		if !c.Has(ctx, from) {
			return "", nil, fmt.Errorf("gitrepo: merge: commit %s is not in the cache", from)
		}
		return from, nil, nil
	}
	if err := checkRev("fromBase", fromBase); err != nil {
		return "", nil, err
	}
	if dir, err = filepath.Abs(dir); err != nil {
		return "", nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.restoreConfig(); err != nil {
		return "", nil, err
	}
	if err := c.addWorktree(ctx, dir, from, "--detach"); err != nil {
		return "", nil, fmt.Errorf("gitrepo: merge: %w", err)
	}
	defer func() {
		if rerr := c.removeWorktree(context.WithoutCancel(ctx), dir); rerr != nil && err == nil {
			err = rerr
		}
	}()
	w := gitCmd{dir: dir, isolated: true, id: &id}
	if !date.IsZero() {
		_, off := date.Zone()
		sign := '+'
		if off < 0 {
			sign, off = '-', -off
		}
		w.date = fmt.Sprintf("@%d %c%02d%02d", date.Unix(), sign, off/3600, off%3600/60)
	}
	if _, err := w.run(ctx, "rebase", "-q", "--onto", base, fromBase); err != nil {
		files := w.conflicts(ctx)
		_, _ = w.run(ctx, "rebase", "--abort")
		if len(files) == 0 {
			return "", nil, fmt.Errorf("gitrepo: merge: %w", err)
		}
		return "", files, fmt.Errorf("gitrepo: merging %s onto %s: %w in %s",
			short(from), short(base), ErrConflict, strings.Join(files, ", "))
	}
	if head, err = w.run(ctx, "rev-parse", "HEAD"); err != nil {
		return "", nil, err
	}
	return head, nil, c.keep(ctx, head)
}

func short(commit string) string {
	if len(commit) > 12 {
		return commit[:12]
	}
	return commit
}

// Caches hands out the repository caches under one root, one per session,
// each opened once per process so that its lock serializes every job's
// git writes. Safe for concurrent use.
type Caches struct {
	root string
	mu   sync.Mutex
	m    map[string]*Cache
}

// NewCaches returns the caches under root.
func NewCaches(root string) *Caches { return &Caches{root: root, m: map[string]*Cache{}} }

// Session returns the cache of session, opening it (see OpenCache) on
// first use.
func (cs *Caches) Session(session string) (*Cache, error) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if c := cs.m[session]; c != nil {
		return c, nil
	}
	c, err := OpenCache(cs.root, session)
	if err != nil {
		return nil, err
	}
	cs.m[session] = c
	return c, nil
}
