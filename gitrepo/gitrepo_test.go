package gitrepo

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/loopbus/loopbus/schemas"
)

// TestMain points HOME at an empty directory so that no git identity or
// configuration of whoever runs the tests is visible.
func TestMain(m *testing.M) {
	home, err := os.MkdirTemp("", "gitrepo-home-")
	if err != nil {
		panic(err)
	}
	os.Setenv("HOME", home)
	os.Setenv("XDG_CONFIG_HOME", filepath.Join(home, ".config"))
	os.Setenv("GIT_CONFIG_NOSYSTEM", "1")
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, "GIT_") && k != "GIT_CONFIG_NOSYSTEM" {
			os.Unsetenv(k)
		}
	}
	code := m.Run()
	os.RemoveAll(home)
	os.Exit(code)
}

var ctx = context.Background()

// git runs git in dir for a test, as "Test <test@example.com>".
func git(t *testing.T, dir string, args ...string) string {
	t.Helper()
	argv := append([]string{"-c", "user.name=Test", "-c", "user.email=test@example.com", "-c", "init.defaultBranch=main"}, args...)
	cmd := exec.Command("git", argv...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func read(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// newRepo makes a user repository on main with two commits.
func newRepo(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "repo")
	git(t, "", "init", "-q", "-b", "main", dir)
	write(t, filepath.Join(dir, "a.txt"), "alpha\n")
	write(t, filepath.Join(dir, ".gitignore"), "*.log\n")
	git(t, dir, "add", "-A")
	git(t, dir, "commit", "-q", "-m", "one")
	write(t, filepath.Join(dir, "b.txt"), "beta\n")
	git(t, dir, "add", "-A")
	git(t, dir, "commit", "-q", "-m", "two")
	return dir
}

// newCache opens a cache for session s holding the base of repo and
// returns it with the base commit and the base bundle's path.
func newCache(t *testing.T, repo string) (*Cache, string, string) {
	t.Helper()
	info, err := Inspect(ctx, repo, "")
	if err != nil {
		t.Fatal(err)
	}
	bundle := filepath.Join(t.TempDir(), "base.bundle")
	if err := BundleBase(ctx, repo, info.BaseCommit, bundle); err != nil {
		t.Fatal(err)
	}
	c, err := OpenCache(t.TempDir(), "s")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.FetchBundle(ctx, bundle); err != nil {
		t.Fatal(err)
	}
	return c, info.BaseCommit, bundle
}

// iterate runs one iteration of a loop: Prepare, edit, Commit as the
// worker, remove the worktree. It returns the worker's commit.
func iterate(t *testing.T, c *Cache, spec schemas.WorktreeSpec, job string, files map[string]string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "wt")
	if _, err := c.Prepare(ctx, dir, spec); err != nil {
		t.Fatal(err)
	}
	for name, content := range files {
		write(t, filepath.Join(dir, name), content)
	}
	head, err := c.Commit(ctx, dir, identity(spec.Identity), "iteration", workerTrailers(job))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.RemoveWorktree(ctx, dir); err != nil {
		t.Fatal(err)
	}
	return head
}

func workerTrailers(job string) [][2]string {
	return [][2]string{{TrailerSession, "s"}, {TrailerLoop, "l1"}, {TrailerJob, job}}
}

func TestBundleBaseFetchHas(t *testing.T) {
	t.Parallel()
	repo := newRepo(t)
	refsBefore := git(t, repo, "show-ref", "--head")
	c, base, bundle := newCache(t, repo)
	if got := git(t, repo, "show-ref", "--head"); got != refsBefore {
		t.Errorf("BundleBase changed the repository's refs:\n%s\n->\n%s", refsBefore, got)
	}
	if !c.Has(ctx, base) || !c.Has(ctx, base[:12]) {
		t.Fatal("base not in cache after FetchBundle")
	}
	if c.Has(ctx, strings.Repeat("0", 40)) || c.Has(ctx, "--all") {
		t.Fatal("Has reports a missing commit")
	}
	if err := c.FetchBundle(ctx, bundle); err != nil {
		t.Fatalf("second FetchBundle: %v", err)
	}
	if got := git(t, c.Dir(), "rev-parse", "refs/loopbus/keep/"+base); got != base {
		t.Errorf("keep ref = %q", got)
	}
	if lines := git(t, "", "bundle", "list-heads", bundle); lines != base+" HEAD" {
		t.Errorf("bundle heads = %q", lines)
	}
	if err := c.Bundle(ctx, filepath.Join(t.TempDir(), "e.bundle"), base, base); !errors.Is(err, ErrEmpty) {
		t.Errorf("Bundle(base, base) = %v, want ErrEmpty", err)
	}
	if err := c.FetchBundle(ctx, filepath.Join(t.TempDir(), "missing.bundle")); err == nil {
		t.Error("FetchBundle of a missing file succeeded")
	}
	if _, err := OpenCache(t.TempDir(), "bad/session"); err == nil {
		t.Error("OpenCache accepted a bad session id")
	}
	// Reopening finds the same repository.
	c2, err := OpenCache(filepath.Dir(c.Dir()), "s")
	if err != nil || !c2.Has(ctx, base) {
		t.Fatalf("reopen: %v", err)
	}
}

func TestPrepareCommit(t *testing.T) {
	t.Parallel()
	c, base, _ := newCache(t, newRepo(t))
	dir := filepath.Join(t.TempDir(), "wt")
	note, err := c.Prepare(ctx, dir, schemas.WorktreeSpec{Base: base, Branch: "loopbus/s/l1"})
	if err != nil || note != "" {
		t.Fatalf("Prepare = %q, %v", note, err)
	}
	if got := git(t, dir, "rev-parse", "HEAD"); got != base {
		t.Fatalf("HEAD = %s, want base %s", got, base)
	}
	if got := git(t, dir, "symbolic-ref", "--short", "HEAD"); got != "loopbus/s/l1" {
		t.Fatalf("branch = %s", got)
	}
	// Nothing to commit: no commit.
	head, err := c.Commit(ctx, dir, schemas.GitIdentity{}, "nothing", nil)
	if err != nil || head != base {
		t.Fatalf("empty Commit = %s, %v", head, err)
	}
	write(t, filepath.Join(dir, "new", "c.txt"), "gamma\n")
	write(t, filepath.Join(dir, "a.txt"), "alpha 2\n")
	write(t, filepath.Join(dir, "debug.log"), "ignored\n")
	head, err = c.Commit(ctx, dir, schemas.GitIdentity{}, "Do the thing\n\nBody.", workerTrailers("j1"))
	if err != nil {
		t.Fatal(err)
	}
	if head == base || git(t, dir, "rev-parse", "HEAD~1") != base {
		t.Fatalf("Commit made no commit on base: %s", head)
	}
	if got := git(t, dir, "log", "-1", "--format=%(trailers)"); got != "Loopbus-Session: s\nLoopbus-Loop: l1\nLoopbus-Job: j1" {
		t.Errorf("trailers = %q", got)
	}
	if got := git(t, dir, "log", "-1", "--format=%an <%ae>|%cn <%ce>|%s"); got != "loopbus <loopbus@localhost>|loopbus <loopbus@localhost>|Do the thing" {
		t.Errorf("identity = %q", got)
	}
	if got := git(t, dir, "show", "--name-only", "--format=", "HEAD"); got != "a.txt\nnew/c.txt" {
		t.Errorf("committed files = %q", got)
	}
	if _, err := c.Commit(ctx, dir, schemas.GitIdentity{}, "x", [][2]string{{"Bad Key", "v"}}); err == nil {
		t.Error("Commit accepted a bad trailer key")
	}
	id := schemas.GitIdentity{Name: "Ada", Email: "ada@example.com"}
	write(t, filepath.Join(dir, "d.txt"), "delta\n")
	if _, err := c.Commit(ctx, dir, id, "by ada", nil); err != nil {
		t.Fatal(err)
	}
	if got := git(t, dir, "log", "-1", "--format=%an <%ae>|%cn"); got != "Ada <ada@example.com>|Ada" {
		t.Errorf("identity = %q", got)
	}
	if err := c.RemoveWorktree(ctx, dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("worktree still there: %v", err)
	}
	if err := c.RemoveWorktree(ctx, dir); err != nil {
		t.Errorf("RemoveWorktree of a gone worktree: %v", err)
	}
}

// TestPrepareFrom runs an iteration on one machine and the next on another:
// the worker commit is uncommitted again, the agent's commit is kept.
func TestPrepareFrom(t *testing.T) {
	t.Parallel()
	repo := newRepo(t)
	a, base, baseBundle := newCache(t, repo)
	spec := schemas.WorktreeSpec{Base: base, Branch: "loopbus/s/l1"}
	dir := filepath.Join(t.TempDir(), "wt")
	if _, err := a.Prepare(ctx, dir, spec); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(dir, "agent.txt"), "by the agent\n")
	git(t, dir, "add", "agent.txt")
	git(t, dir, "commit", "-q", "-m", "agent commit")
	agent := git(t, dir, "rev-parse", "HEAD")
	write(t, filepath.Join(dir, "worker.txt"), "left uncommitted\n")
	from, err := a.Commit(ctx, dir, DefaultIdentity(), "iteration 1", workerTrailers("j1"))
	if err != nil {
		t.Fatal(err)
	}
	if err := a.RemoveWorktree(ctx, dir); err != nil {
		t.Fatal(err)
	}
	bundle := filepath.Join(t.TempDir(), "it1.bundle")
	if err := a.Bundle(ctx, bundle, from, base); err != nil {
		t.Fatal(err)
	}

	b, err := OpenCache(t.TempDir(), "s") // another machine
	if err != nil {
		t.Fatal(err)
	}
	if err := b.FetchBundle(ctx, bundle); err == nil {
		t.Fatal("FetchBundle without its prerequisite succeeded")
	}
	for _, p := range []string{baseBundle, bundle} {
		if err := b.FetchBundle(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	spec.From, spec.FromBase = from, base
	dir2 := filepath.Join(t.TempDir(), "wt")
	if note, err := b.Prepare(ctx, dir2, spec); err != nil || note != "" {
		t.Fatalf("Prepare = %q, %v", note, err)
	}
	if got := git(t, dir2, "rev-parse", "HEAD"); got != agent {
		t.Errorf("HEAD = %s, want the agent's commit %s", got, agent)
	}
	if got := read(t, filepath.Join(dir2, "worker.txt")); got != "left uncommitted\n" {
		t.Errorf("worker.txt = %q", got)
	}
	if got := git(t, dir2, "status", "--porcelain"); got != "A  worker.txt" {
		t.Errorf("status = %q, want worker.txt uncommitted", got)
	}
	// The next Commit makes one commit on the agent's.
	head, err := b.Commit(ctx, dir2, DefaultIdentity(), "iteration 2", workerTrailers("j2"))
	if err != nil || git(t, dir2, "rev-parse", "HEAD~1") != agent {
		t.Fatalf("Commit = %s, %v", head, err)
	}
}

// TestPrepareCarryOver moves the target branch under a loop: its work is
// rebased, or dropped with a note when it conflicts.
func TestPrepareCarryOver(t *testing.T) {
	t.Parallel()
	c, base, _ := newCache(t, newRepo(t))
	other := schemas.WorktreeSpec{Base: base, Branch: "loopbus/s/other"}
	moved := iterate(t, c, other, "o1", map[string]string{"b.txt": "beta moved\n"})
	conflicting := iterate(t, c, other, "o2", map[string]string{"a.txt": "alpha moved\n"})

	spec := schemas.WorktreeSpec{Base: base, Branch: "loopbus/s/l1"}
	from := iterate(t, c, spec, "j1", map[string]string{"a.txt": "alpha by loop\n", "c.txt": "gamma\n"})

	t.Run("clean", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "wt")
		s := spec
		s.From, s.FromBase, s.Base = from, base, moved
		if note, err := c.Prepare(ctx, dir, s); err != nil || note != "" {
			t.Fatalf("Prepare = %q, %v", note, err)
		}
		if got := git(t, dir, "rev-parse", "HEAD"); got != moved {
			t.Errorf("HEAD = %s, want new base %s", got, moved)
		}
		if got := git(t, dir, "status", "--porcelain"); got != "M  a.txt\nA  c.txt" {
			t.Errorf("status = %q", got)
		}
		if got := read(t, filepath.Join(dir, "b.txt")); got != "beta moved\n" {
			t.Errorf("b.txt = %q", got)
		}
		if err := c.RemoveWorktree(ctx, dir); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("unchanged", func(t *testing.T) {
		// The previous iteration changed nothing, so From is Base: another
		// loop's worker commit that must not be soft-reset.
		dir := filepath.Join(t.TempDir(), "wt")
		s := spec
		s.From, s.FromBase, s.Base = moved, moved, moved
		if note, err := c.Prepare(ctx, dir, s); err != nil || note != "" {
			t.Fatalf("Prepare = %q, %v", note, err)
		}
		if got := git(t, dir, "rev-parse", "HEAD"); got != moved {
			t.Errorf("HEAD = %s, want %s", got, moved)
		}
		if got := git(t, dir, "status", "--porcelain"); got != "" {
			t.Errorf("status = %q, want clean", got)
		}
		if err := c.RemoveWorktree(ctx, dir); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("conflict", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "wt")
		s := spec
		s.From, s.FromBase, s.Base = from, base, conflicting
		note, err := c.Prepare(ctx, dir, s)
		if err != nil || !strings.Contains(note, "a.txt") || !strings.Contains(note, "dropped") {
			t.Fatalf("Prepare = %q, %v", note, err)
		}
		if got := git(t, dir, "rev-parse", "HEAD"); got != conflicting {
			t.Errorf("HEAD = %s, want new base %s", got, conflicting)
		}
		if got := git(t, dir, "status", "--porcelain"); got != "" {
			t.Errorf("status = %q, want clean", got)
		}
		if err := c.RemoveWorktree(ctx, dir); err != nil {
			t.Fatal(err)
		}
	})
}

func TestMerge(t *testing.T) {
	t.Parallel()
	repo := newRepo(t)
	c, base, baseBundle := newCache(t, repo)
	l1 := iterate(t, c, schemas.WorktreeSpec{Base: base, Branch: "loopbus/s/l1"}, "j1", map[string]string{"a.txt": "alpha 1\n"})
	l2 := iterate(t, c, schemas.WorktreeSpec{Base: base, Branch: "loopbus/s/l2"}, "j2", map[string]string{"c.txt": "gamma\n"})
	l3 := iterate(t, c, schemas.WorktreeSpec{Base: base, Branch: "loopbus/s/l3"}, "j3", map[string]string{"a.txt": "alpha 3\n"})
	id := schemas.GitIdentity{Name: "Merger", Email: "merger@example.com"}
	date := time.Date(2025, 1, 2, 3, 4, 5, 0, time.FixedZone("x", 3600))
	scratch := filepath.Join(t.TempDir(), "merge")

	h1, conflict, err := c.Merge(ctx, scratch, base, l1, base, id, date)
	if err != nil || h1 != l1 || conflict != nil {
		t.Fatalf("fast-forward Merge = %s, %v, %v; want %s", h1, conflict, err, l1)
	}
	h2, _, err := c.Merge(ctx, scratch, h1, l2, base, id, date)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(scratch); !os.IsNotExist(err) {
		t.Errorf("scratch worktree left behind: %v", err)
	}
	if got := git(t, c.Dir(), "rev-parse", h2+"~1"); got != h1 {
		t.Errorf("merged parent = %s, want %s", got, h1)
	}
	if got := git(t, c.Dir(), "log", "-1", "--format=%an|%cn <%ce> %cI|%(trailers:key=Loopbus-Job,valueonly)", h2); got != "loopbus|Merger <merger@example.com> 2025-01-02T03:04:05+01:00|j2" {
		t.Errorf("merged commit = %q", got)
	}
	if got := git(t, c.Dir(), "show", h2+":a.txt") + git(t, c.Dir(), "show", h2+":c.txt"); got != "alpha 1gamma" {
		t.Errorf("merged tree = %q", got)
	}
	if got := git(t, c.Dir(), "rev-parse", "refs/loopbus/keep/"+h2); got != h2 {
		t.Errorf("merge head not kept: %q", got)
	}

	// Determinism: the same merge again, here and on another machine.
	again, _, err := c.Merge(ctx, scratch, h1, l2, base, id, date)
	if err != nil || again != h2 {
		t.Errorf("retried Merge = %s, %v; want %s", again, err, h2)
	}
	other, err := OpenCache(t.TempDir(), "s")
	if err != nil {
		t.Fatal(err)
	}
	for i, p := range []string{baseBundle, "", ""} {
		if i > 0 {
			p = filepath.Join(t.TempDir(), "b.bundle")
			if err := c.Bundle(ctx, p, []string{l1, l2}[i-1], base); err != nil {
				t.Fatal(err)
			}
		}
		if err := other.FetchBundle(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	if h, _, err := other.Merge(ctx, filepath.Join(t.TempDir(), "m"), h1, l2, base, id, date); err != nil || h != h2 {
		t.Errorf("Merge on another machine = %s, %v; want %s", h, err, h2)
	}
	if h, _, err := c.Merge(ctx, scratch, h1, l2, base, id, date.Add(time.Second)); err != nil || h == h2 {
		t.Errorf("Merge at another date = %s, %v; want a new commit", h, err)
	}

	// Conflict: l3 changed the line l1 changed.
	h, conflict, err := c.Merge(ctx, scratch, h2, l3, base, id, date)
	if !errors.Is(err, ErrConflict) || !strings.Contains(err.Error(), "a.txt") || h != "" {
		t.Fatalf("conflicting Merge = %q, %v", h, err)
	}
	if !reflect.DeepEqual(conflict, []string{"a.txt"}) {
		t.Errorf("conflict = %q", conflict)
	}
	if _, err := os.Stat(scratch); !os.IsNotExist(err) {
		t.Errorf("scratch worktree left behind after a conflict: %v", err)
	}
	if got := git(t, c.Dir(), "worktree", "list", "--porcelain"); strings.Contains(got, "merge") {
		t.Errorf("worktree still registered:\n%s", got)
	}
}

func TestPull(t *testing.T) {
	t.Parallel()
	repo := newRepo(t)
	c, base, _ := newCache(t, repo)
	l1 := iterate(t, c, schemas.WorktreeSpec{Base: base, Branch: "loopbus/s/l1"}, "j1", map[string]string{"a.txt": "alpha 1\n"})
	l2 := iterate(t, c, schemas.WorktreeSpec{Base: l1, Branch: "loopbus/s/l2"}, "j2", map[string]string{"c.txt": "gamma\n"})
	l3 := iterate(t, c, schemas.WorktreeSpec{Base: base, Branch: "loopbus/s/l3"}, "j3", map[string]string{"d.txt": "delta\n"})
	bundle := func(tip, from string) string {
		p := filepath.Join(t.TempDir(), "p.bundle")
		if err := c.Bundle(ctx, p, tip, from); err != nil {
			t.Fatal(err)
		}
		return p
	}
	// The user keeps working meanwhile: a dirty tree and a staged change.
	write(t, filepath.Join(repo, "a.txt"), "user edit\n")
	write(t, filepath.Join(repo, "untracked.txt"), "mine\n")
	write(t, filepath.Join(repo, "b.txt"), "staged\n")
	git(t, repo, "add", "b.txt")
	snapshot := func() string {
		return git(t, repo, "rev-parse", "HEAD") + git(t, repo, "symbolic-ref", "HEAD") +
			git(t, repo, "status", "--porcelain") + git(t, repo, "diff", "--cached") +
			read(t, filepath.Join(repo, "a.txt")) + read(t, filepath.Join(repo, "untracked.txt"))
	}
	before := snapshot()

	changed, err := Pull(ctx, repo, []string{bundle(l1, base)}, l1, "loopbus/s")
	if err != nil || !changed {
		t.Fatalf("Pull create = %v, %v", changed, err)
	}
	if got := git(t, repo, "rev-parse", "loopbus/s"); got != l1 {
		t.Errorf("branch = %s, want %s", got, l1)
	}
	if changed, err := Pull(ctx, repo, nil, l1, "loopbus/s"); err != nil || changed {
		t.Errorf("Pull same = %v, %v", changed, err)
	}
	if changed, err := Pull(ctx, repo, []string{bundle(l2, l1)}, l2, "loopbus/s"); err != nil || !changed {
		t.Errorf("Pull fast-forward = %v, %v", changed, err)
	}
	if _, err := Pull(ctx, repo, []string{bundle(l3, base)}, l3, "loopbus/s"); !errors.Is(err, ErrDiverged) {
		t.Errorf("Pull non-ancestor = %v, want ErrDiverged", err)
	}
	if got := git(t, repo, "rev-parse", "loopbus/s"); got != l2 {
		t.Errorf("branch = %s after refused Pull, want %s", got, l2)
	}
	if _, err := Pull(ctx, repo, nil, l2, "main"); !errors.Is(err, ErrCheckedOut) {
		t.Errorf("Pull onto the checked-out branch = %v, want ErrCheckedOut", err)
	}
	if _, err := Pull(ctx, repo, nil, l2, "-x"); err == nil {
		t.Error("Pull accepted a bad branch name")
	}
	if after := snapshot(); after != before {
		t.Errorf("Pull touched the user's work tree:\n%s\n->\n%s", before, after)
	}
}

func TestInspect(t *testing.T) {
	t.Parallel()
	if _, err := Inspect(ctx, t.TempDir(), ""); !errors.Is(err, ErrNotRepo) {
		t.Errorf("plain dir: %v, want ErrNotRepo", err)
	}
	if _, err := Inspect(ctx, filepath.Join(t.TempDir(), "nope"), ""); !errors.Is(err, ErrNotRepo) {
		t.Errorf("missing dir: %v, want ErrNotRepo", err)
	}
	repo := newRepo(t)
	if _, err := Inspect(ctx, filepath.Join(repo, ".git"), ""); !errors.Is(err, ErrNotRepo) {
		t.Errorf(".git dir: %v, want ErrNotRepo", err)
	}
	head := git(t, repo, "rev-parse", "HEAD")
	info, err := Inspect(ctx, filepath.Join(repo), "")
	if err != nil {
		t.Fatal(err)
	}
	want := RepoInfo{Dir: info.Dir, Branch: "main", Base: "main", BaseCommit: head}
	if !reflect.DeepEqual(info, want) {
		t.Errorf("Inspect = %+v, want %+v", info, want)
	}
	if real, _ := filepath.EvalSymlinks(repo); info.Dir != real && info.Dir != repo {
		t.Errorf("Dir = %s, want %s", info.Dir, repo)
	}
	write(t, filepath.Join(repo, "sub", "new.txt"), "x\n")
	git(t, repo, "config", "user.name", "Local")
	git(t, repo, "config", "user.email", "local@example.com")
	info, err = Inspect(ctx, filepath.Join(repo, "sub"), "main~1")
	if err != nil {
		t.Fatal(err)
	}
	if !info.Dirty || info.Identity == nil || *info.Identity != (schemas.GitIdentity{Name: "Local", Email: "local@example.com"}) ||
		info.BaseCommit != git(t, repo, "rev-parse", "HEAD~1") {
		t.Errorf("Inspect = %+v", info)
	}
	if _, err := Inspect(ctx, repo, "nope"); !errors.Is(err, ErrNoBranch) {
		t.Errorf("unknown base: %v, want ErrNoBranch", err)
	}
	git(t, repo, "checkout", "-q", "--detach")
	if _, err := Inspect(ctx, repo, ""); !errors.Is(err, ErrNoBranch) {
		t.Errorf("detached: %v, want ErrNoBranch", err)
	}
	if info, err := Inspect(ctx, repo, "main"); err != nil || info.Branch != "" || info.BaseCommit != head {
		t.Errorf("detached with base = %+v, %v", info, err)
	}
}

func TestConcurrent(t *testing.T) {
	t.Parallel()
	repo := newRepo(t)
	c, base, bundle := newCache(t, repo)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- func() error {
				if err := c.FetchBundle(ctx, bundle); err != nil {
					return err
				}
				dir := filepath.Join(t.TempDir(), "wt")
				if _, err := c.Prepare(ctx, dir, schemas.WorktreeSpec{Base: base, Branch: fmt.Sprintf("loopbus/s/l%d", i)}); err != nil {
					return err
				}
				if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%d.txt", i)), []byte("x\n"), 0o644); err != nil {
					return err
				}
				head, err := c.Commit(ctx, dir, DefaultIdentity(), "work", workerTrailers(fmt.Sprint(i)))
				if err != nil {
					return err
				}
				if !c.Has(ctx, head) {
					return fmt.Errorf("commit %s missing", head)
				}
				return c.RemoveWorktree(ctx, dir)
			}()
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
}

// TestCommitIgnoresARewrittenGitFile: an agent that points the worktree's
// .git file at a git directory of its own, whose configuration runs a
// command, gets neither its command run nor its directory committed to:
// Commit uses the git directory the worktree was made with.
func TestCommitIgnoresARewrittenGitFile(t *testing.T) {
	t.Parallel()
	c, base, _ := newCache(t, newRepo(t))
	dir := filepath.Join(t.TempDir(), "wt")
	if _, err := c.Prepare(ctx, dir, schemas.WorktreeSpec{Base: base, Branch: "loopbus/s/l1"}); err != nil {
		t.Fatal(err)
	}
	fake := filepath.Join(t.TempDir(), "fake.git")
	git(t, t.TempDir(), "init", "-q", fake)
	pwned := filepath.Join(t.TempDir(), "pwned")
	git(t, fake, "config", "core.fsmonitor", "touch "+pwned+"; false")
	git(t, fake, "config", "core.hooksPath", filepath.Dir(pwned))
	write(t, filepath.Join(dir, ".git"), "gitdir: "+filepath.Join(fake, ".git")+"\n")
	write(t, filepath.Join(dir, "work.txt"), "done\n")
	head, err := c.Commit(ctx, dir, DefaultIdentity(), "work", workerTrailers("j1"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(pwned); err == nil {
		t.Fatal("the agent's git configuration ran its command")
	}
	if !c.Has(ctx, head) || head == base {
		t.Errorf("the commit %s is not in the cache", head)
	}
	if _, err := c.Commit(ctx, t.TempDir(), DefaultIdentity(), "x", nil); err == nil {
		t.Error("Commit in a directory the cache did not make succeeded")
	}
}

// TestAgentGitConfigNeverRunsAsTheWorker: an agent that runs git config in
// its worktree writes the cache's configuration: a clean filter for every
// file, signing with a gpg.program of its own, an include of another file.
// The worker's commit runs none of them and succeeds; the cache's
// configuration is what OpenCache wrote again; a later worktree of the
// same cache, checked out from that commit (whose .gitattributes names the
// filter), runs none of them either.
func TestAgentGitConfigNeverRunsAsTheWorker(t *testing.T) {
	t.Parallel()
	c, base, _ := newCache(t, newRepo(t))
	dir := filepath.Join(t.TempDir(), "wt")
	if _, err := c.Prepare(ctx, dir, schemas.WorktreeSpec{Base: base, Branch: "loopbus/s/l1"}); err != nil {
		t.Fatal(err)
	}
	marks := t.TempDir()
	gpg := filepath.Join(marks, "gpg.sh")
	write(t, gpg, "#!/bin/sh\ntouch "+filepath.Join(marks, "gpg")+"\nexit 1\n")
	if err := os.Chmod(gpg, 0o755); err != nil {
		t.Fatal(err)
	}
	included := filepath.Join(marks, "included.cfg")
	write(t, included, "[core]\n\tfsmonitor = touch "+filepath.Join(marks, "include")+"; false\n")
	// The agent, with git's ordinary environment.
	git(t, dir, "config", "filter.evil.clean", "touch "+filepath.Join(marks, "clean")+"; cat")
	git(t, dir, "config", "filter.evil.smudge", "touch "+filepath.Join(marks, "smudge")+"; cat")
	git(t, dir, "config", "filter.evil.required", "true")
	git(t, dir, "config", "commit.gpgSign", "true")
	git(t, dir, "config", "gpg.program", gpg)
	git(t, dir, "config", "include.path", included)
	write(t, filepath.Join(dir, ".gitattributes"), "* filter=evil\n")
	write(t, filepath.Join(dir, "work.txt"), "done\n")
	if got := git(t, dir, "config", "--get", "gpg.program"); got != gpg {
		t.Fatalf("the agent's git config did not take: gpg.program is %q", got)
	}

	head, err := c.Commit(ctx, dir, DefaultIdentity(), "work", workerTrailers("j1"))
	if err != nil {
		t.Fatalf("commit after the agent configured the cache: %v", err)
	}
	if head == base || !c.Has(ctx, head) {
		t.Fatalf("no new commit in the cache (head %s)", head)
	}
	if got := read(t, filepath.Join(c.Dir(), "config")); got != cacheConfig {
		t.Errorf("the cache's configuration after the commit:\n%s\nwant what OpenCache wrote:\n%s", got, cacheConfig)
	}
	if err := c.RemoveWorktree(ctx, dir); err != nil {
		t.Fatal(err)
	}
	next := filepath.Join(t.TempDir(), "wt2")
	if _, err := c.Prepare(ctx, next, schemas.WorktreeSpec{Base: head, Branch: "loopbus/s/l2"}); err != nil {
		t.Fatal(err)
	}
	if got := read(t, filepath.Join(next, "work.txt")); got != "done\n" {
		t.Errorf("work.txt in the next worktree: %q", got)
	}
	for _, m := range []string{"clean", "smudge", "gpg", "include"} {
		if _, err := os.Stat(filepath.Join(marks, m)); err == nil {
			t.Errorf("the agent's %s command ran as the worker", m)
		}
	}
}

// TestCacheOfAnotherUserIsRefused: a cache directory others may write
// (planted in a shared work directory, say) is not opened.
func TestCacheOfAnotherUserIsRefused(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	planted := filepath.Join(root, "s.git")
	git(t, "", "init", "-q", "--bare", planted)
	git(t, planted, "config", "core.fsmonitor", "touch "+filepath.Join(root, "pwned")+"; false")
	if err := os.Chmod(planted, 0o777); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenCache(root, "s"); !errors.Is(err, ErrUnsafeCache) {
		t.Fatalf("OpenCache of a cache anyone may write: %v, want ErrUnsafeCache", err)
	}
	if err := os.Chmod(planted, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(root, 0o777); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenCache(root, "s"); !errors.Is(err, ErrUnsafeCache) {
		t.Fatalf("OpenCache under a root anyone may write: %v, want ErrUnsafeCache", err)
	}
}
