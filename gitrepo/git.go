// Package gitrepo moves code as data: git bundles, per-session repository
// caches, worktrees, the commits and merges of coding loops, and bringing a
// session's target branch into the user's repository.
package gitrepo

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/loopbus/loopbus/schemas"
)

// Errors callers can test for with errors.Is.
var (
	// ErrConflict: a merge or carry-over conflicted; the error message
	// names the files.
	ErrConflict = errors.New("conflict")
	// ErrDirty: the user's repository has uncommitted changes. Inspect
	// reports dirtiness without failing; callers that refuse wrap this.
	ErrDirty = errors.New("uncommitted changes")
	// ErrNotRepo: a directory is not inside a git work tree.
	ErrNotRepo = errors.New("not a git repository")
	// ErrNoBranch: no base branch could be resolved (detached HEAD, or a
	// name that resolves to no commit).
	ErrNoBranch = errors.New("no branch")
	// ErrEmpty: a bundle would hold no commits (tip is reachable from base).
	ErrEmpty = errors.New("empty bundle")
	// ErrBadBundle: a bundle cannot be read into the cache (not a bundle,
	// or it needs commits the cache lacks).
	ErrBadBundle = errors.New("unusable bundle")
	// ErrDiverged: Pull would have to move a branch to a commit that does
	// not descend from it.
	ErrDiverged = errors.New("branch diverged")
	// ErrCheckedOut: Pull was asked to move a branch checked out in a work
	// tree of the repository.
	ErrCheckedOut = errors.New("branch is checked out")
	// ErrUnsafeCache: a repository cache's directory belongs to another
	// user or others may write it, so its configuration could run their
	// commands as this user.
	ErrUnsafeCache = errors.New("unsafe repository cache")
)

// Trailer keys of commits loopbus makes.
const (
	TrailerSession = "Loopbus-Session"
	TrailerLoop    = "Loopbus-Loop"
	TrailerJob     = "Loopbus-Job"
)

// maxStderr bounds the git stderr quoted in error messages.
const maxStderr = 2048

// DefaultIdentity is used when the repository sets none:
// loopbus <loopbus@localhost>.
func DefaultIdentity() schemas.GitIdentity {
	return schemas.GitIdentity{Name: "loopbus", Email: "loopbus@localhost"}
}

// identity returns id with missing fields taken from DefaultIdentity.
func identity(id *schemas.GitIdentity) schemas.GitIdentity {
	d := DefaultIdentity()
	if id != nil && id.Name != "" {
		d.Name = id.Name
	}
	if id != nil && id.Email != "" {
		d.Email = id.Email
	}
	return d
}

// gitCmd describes how git is run.
type gitCmd struct {
	dir      string // working directory; "" for the current one
	gitDir   string // --git-dir (the bare cache, or a worktree's own)
	workTree string // --work-tree, with gitDir: git reads no .git in it
	// isolated ignores the user's global configuration and all hooks and
	// sets an identity: used for the cache and its worktrees, where
	// results must not depend on who runs them.
	isolated bool
	id       *schemas.GitIdentity // author and committer when isolated
	date     string               // committer date, git's "@unix +zone"
	stdin    string
}

// run runs git with args and returns its stdout without trailing newlines.
// Errors wrap the exec error (or the context's) and quote git's stderr.
func (g gitCmd) run(ctx context.Context, args ...string) (string, error) {
	argv := make([]string, 0, len(args)+3)
	if g.gitDir != "" {
		argv = append(argv, "--git-dir="+g.gitDir)
	}
	if g.workTree != "" {
		argv = append(argv, "--work-tree="+g.workTree)
	}
	if g.isolated {
		// Besides restoring the cache's configuration (Cache.restoreConfig),
		// the settings that run a command or sign are fixed here: the
		// command line outranks every file.
		argv = append(argv, "-c", "core.hooksPath="+os.DevNull, "-c", "core.fsmonitor=false",
			"-c", "commit.gpgSign=false", "-c", "tag.gpgSign=false", "-c", "core.attributesFile="+os.DevNull)
	}
	argv = append(argv, args...)
	cmd := exec.CommandContext(ctx, "git", argv...)
	cmd.Dir = g.dir
	cmd.Env = g.env()
	cmd.WaitDelay = 5 * time.Second
	if g.stdin != "" {
		cmd.Stdin = strings.NewReader(g.stdin)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return stdout.String(), fmt.Errorf("git %s: %w%s", describe(args), err, quote(stderr.String()))
	}
	return strings.TrimRight(stdout.String(), "\n"), nil
}

// env is the process environment without GIT_* variables (a caller's
// GIT_DIR must not redirect us), plus ours.
func (g gitCmd) env() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "GIT_") {
			env = append(env, kv)
		}
	}
	env = append(env, "GIT_TERMINAL_PROMPT=0", "GIT_CONFIG_NOSYSTEM=1", "GIT_OPTIONAL_LOCKS=0")
	if g.isolated {
		id := identity(g.id)
		env = append(env, "GIT_CONFIG_GLOBAL="+os.DevNull,
			"GIT_AUTHOR_NAME="+id.Name, "GIT_AUTHOR_EMAIL="+id.Email,
			"GIT_COMMITTER_NAME="+id.Name, "GIT_COMMITTER_EMAIL="+id.Email)
	}
	if g.date != "" {
		env = append(env, "GIT_COMMITTER_DATE="+g.date)
	}
	return env
}

func describe(args []string) string {
	s := strings.Join(args, " ")
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}

// quote formats git's stderr for an error message: trimmed, bounded to its
// last maxStderr bytes (where git puts the fatal line).
func quote(stderr string) string {
	s := strings.TrimSpace(stderr)
	if s == "" {
		return ""
	}
	if len(s) > maxStderr {
		s = "…" + s[len(s)-maxStderr:]
	}
	return ": " + s
}

// exitCode is git's exit status in err, or -1.
func exitCode(err error) int {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	return -1
}

// checkRev refuses revisions git could take for options.
func checkRev(what, rev string) error {
	if rev == "" || strings.HasPrefix(rev, "-") || strings.ContainsAny(rev, "\x00\n") {
		return fmt.Errorf("gitrepo: invalid %s %q", what, rev)
	}
	return nil
}

// resolve returns the full id of the commit rev names.
func (g gitCmd) resolve(ctx context.Context, rev string) (string, error) {
	if err := checkRev("revision", rev); err != nil {
		return "", err
	}
	id, err := g.run(ctx, "rev-parse", "--verify", "-q", rev+"^{commit}")
	if err != nil {
		return "", fmt.Errorf("gitrepo: %q names no commit here: %w", rev, err)
	}
	return id, nil
}

// isAncestor reports whether a is an ancestor of (or equal to) b.
func (g gitCmd) isAncestor(ctx context.Context, a, b string) (bool, error) {
	_, err := g.run(ctx, "merge-base", "--is-ancestor", a, b)
	if err == nil {
		return true, nil
	}
	if exitCode(err) == 1 {
		return false, nil
	}
	return false, err
}

// conflicts lists the unmerged files of the work tree, sorted.
func (g gitCmd) conflicts(ctx context.Context) []string {
	out, err := g.run(ctx, "diff", "--name-only", "--diff-filter=U", "-z")
	if err != nil {
		return nil
	}
	var files []string
	for _, f := range strings.Split(out, "\x00") {
		if f != "" {
			files = append(files, f)
		}
	}
	sort.Strings(files)
	return files
}

// bundleHeads lists the commits a bundle file's refs point at.
func (g gitCmd) bundleHeads(ctx context.Context, path string) ([]string, error) {
	out, err := g.run(ctx, "bundle", "list-heads", path)
	if err != nil {
		return nil, err
	}
	var heads []string
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) > 0 {
			heads = append(heads, f[0])
		}
	}
	if len(heads) == 0 {
		return nil, fmt.Errorf("gitrepo: bundle %s lists no refs", path)
	}
	return heads, nil
}

// unbundle brings the objects of the bundle at path into the repository g
// runs in unless all its tips are there already, and returns the tips.
func (g gitCmd) unbundle(ctx context.Context, path string) ([]string, error) {
	heads, err := g.bundleHeads(ctx, path)
	if err != nil {
		return nil, err
	}
	for _, h := range heads {
		if _, err := g.run(ctx, "cat-file", "-e", h+"^{commit}"); err != nil {
			_, err := g.run(ctx, "bundle", "unbundle", path)
			return heads, err
		}
	}
	return heads, nil
}

// writeBundle writes to path a bundle with one ref, HEAD, pointing at the
// commit tip, holding the commits reachable from tip but not from base
// ("" for all). src runs in the repository holding the commits. The
// bundle is made in a throwaway repository that borrows src's objects
// (alternates) and has HEAD detached at tip, so src's refs and HEAD are
// never touched.
func writeBundle(ctx context.Context, src gitCmd, path, tip, base string) error {
	path, err := filepath.Abs(path)
	if err != nil {
		return err
	}
	if tip, err = src.resolve(ctx, tip); err != nil {
		return err
	}
	if base != "" {
		if base, err = src.resolve(ctx, base); err != nil {
			return err
		}
		if in, err := src.isAncestor(ctx, tip, base); err != nil {
			return err
		} else if in {
			return fmt.Errorf("%w: %s has no commits that %s lacks", ErrEmpty, tip, base)
		}
	}
	objects, err := src.run(ctx, "rev-parse", "--path-format=absolute", "--git-path", "objects")
	if err != nil {
		return err
	}
	format, err := src.run(ctx, "rev-parse", "--show-object-format")
	if err != nil {
		return err
	}
	tmp, err := os.MkdirTemp("", "loopbus-bundle-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	iso := gitCmd{isolated: true}
	if _, err := iso.run(ctx, "init", "-q", "--bare", "--template=", "--object-format="+format, tmp); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(tmp, "objects", "info"), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(tmp, "objects", "info", "alternates"), []byte(objects+"\n"), 0o644); err != nil {
		return err
	}
	iso.gitDir = tmp
	if _, err := iso.run(ctx, "update-ref", "--no-deref", "HEAD", tip); err != nil {
		return err
	}
	args := []string{"bundle", "create", "-q", path, "HEAD"}
	if base != "" {
		args = append(args, "^"+base)
	}
	_, err = iso.run(ctx, args...)
	return err
}

// commit commits everything uncommitted in w's worktree (see
// Cache.Commit).
func commit(ctx context.Context, w gitCmd, message string, trailers [][2]string) (head string, err error) {
	msg := strings.TrimSpace(message)
	if msg == "" {
		msg = "loopbus"
	}
	if len(trailers) > 0 {
		msg += "\n"
		for _, t := range trailers {
			if !validTrailerKey(t[0]) || strings.ContainsAny(t[1], "\r\n") {
				return "", fmt.Errorf("gitrepo: invalid trailer %q: %q", t[0], t[1])
			}
			msg += "\n" + t[0] + ": " + t[1]
		}
	}
	if _, err := w.run(ctx, "add", "-A"); err != nil {
		return "", err
	}
	if _, err := w.run(ctx, "diff", "--cached", "--quiet"); exitCode(err) == 1 {
		w.stdin = msg + "\n"
		if _, err := w.run(ctx, "commit", "-q", "--no-verify", "--cleanup=whitespace", "-F", "-"); err != nil {
			return "", err
		}
		w.stdin = ""
	} else if err != nil {
		return "", err
	}
	return w.run(ctx, "rev-parse", "HEAD")
}

func validTrailerKey(k string) bool {
	if k == "" {
		return false
	}
	for _, c := range k {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}
