package workspace_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/loopbus/loopbus/workspace"
)

func newPool(t *testing.T, base string) *workspace.Pool {
	t.Helper()
	p, err := workspace.NewPool(base, true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func poolCreate(t *testing.T, p *workspace.Pool, session, name string) *workspace.Workspace {
	t.Helper()
	w, err := p.Create(session, name)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	return w
}

// entries lists base's entries, sorted.
func entries(t *testing.T, base string) []string {
	t.Helper()
	es, err := os.ReadDir(base)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range es {
		names = append(names, e.Name())
	}
	return names
}

// keptOne fails t unless base holds exactly one kept workspace, and
// returns its path.
func keptOne(t *testing.T, base string) string {
	t.Helper()
	left := entries(t, base)
	if len(left) != 1 || !strings.HasPrefix(left[0], workspace.IdlePrefix) {
		t.Fatalf("work dir holds %v, want one kept workspace (%s*)", left, workspace.IdlePrefix)
	}
	return filepath.Join(base, left[0])
}

// hold opens dir and returns its identity. The open directory keeps its
// inode taken even once the directory is removed, so a new directory never
// gets its number (file systems hand freed inode numbers out again at
// once).
func hold(t *testing.T, dir string) os.FileInfo {
	t.Helper()
	f, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.Close() })
	fi, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	return fi
}

// assertFresh fails unless w is laid out as a new workspace of session
// and name under base: empty in/ and out/ of mode 0700 and at most empty
// prompt and feedback files of mode 0600, with no other name.
func assertFresh(t *testing.T, w *workspace.Workspace, base, session, name string) {
	t.Helper()
	if filepath.Dir(w.Root) != base || !strings.HasPrefix(filepath.Base(w.Root), session+"."+name+"-") {
		t.Fatalf("root %s: want %s.%s-* under %s", w.Root, session, name, base)
	}
	got := slices.DeleteFunc(entries(t, w.Root), func(n string) bool {
		if n != "prompt.md" && n != "feedback.md" {
			return false
		}
		fi, err := os.Lstat(filepath.Join(w.Root, n))
		if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o600 || fi.Size() != 0 || fi.Sys().(*syscall.Stat_t).Nlink != 1 {
			t.Fatalf("%s: %v (%v), want an empty file of mode 0600 with one name", n, fi, err)
		}
		return true
	})
	if !slices.Equal(got, []string{"in", "out"}) {
		t.Fatalf("workspace holds %v besides the prompt and feedback files, want only in and out", got)
	}
	for _, d := range []string{w.Root, w.In, w.Out} {
		fi, err := os.Lstat(d)
		if err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o700 {
			t.Fatalf("%s: %v (%v), want a directory of mode 0700", d, fi, err)
		}
	}
	for _, d := range []string{w.In, w.Out} {
		if got := entries(t, d); len(got) != 0 {
			t.Fatalf("%s holds %v, want nothing", d, got)
		}
	}
}

// fill writes what an agent might leave: files everywhere, a nested
// directory, a read-only file and a link out of the workspace.
func fill(t *testing.T, w *workspace.Workspace, outside string) {
	t.Helper()
	writeFile(t, w.PromptFile, "prompt")
	writeFile(t, w.FeedbackFile, "")
	writeFile(t, filepath.Join(w.In, "in.md"), "input")
	writeFile(t, filepath.Join(w.Out, "b.txt"), "output")
	if err := os.MkdirAll(filepath.Join(w.Out, "deep", "er"), 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(w.Out, "deep", "er", "f"), "x")
	if err := os.WriteFile(filepath.Join(w.Root, "ro"), []byte("x"), 0o400); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(w.Out, "link")); err != nil {
		t.Fatal(err)
	}
}

func TestPoolReusesEmptiedWorkspace(t *testing.T) {
	base := filepath.Join(t.TempDir(), "work")
	outside := t.TempDir()
	writeFile(t, filepath.Join(outside, "keep"), "not the workspace's")
	p := newPool(t, base)
	w := poolCreate(t, p, "s1", "a-1-1")
	assertFresh(t, w, base, "s1", "a-1-1")
	before := hold(t, w.Root)
	fill(t, w, outside)
	if err := w.Remove(); err != nil {
		t.Fatalf("Remove: %v", err)
	}
	// Nothing of the job is left; only the emptied workspace, kept.
	if got := entries(t, keptOne(t, base)); !slices.Equal(got, []string{"feedback.md", "in", "out", "prompt.md"}) {
		t.Fatalf("kept workspace holds %v, want in, out and the emptied prompt and feedback files", got)
	}
	if got := entries(t, outside); !slices.Equal(got, []string{"keep"}) {
		t.Fatalf("outside the workspace: %v, want keep untouched", got)
	}

	w2 := poolCreate(t, p, "s2", "b-1-1")
	assertFresh(t, w2, base, "s2", "b-1-1")
	after, err := os.Stat(w2.Root)
	if err != nil {
		t.Fatal(err)
	}
	if !os.SameFile(before, after) {
		t.Errorf("second workspace is a new directory, want the first one reused")
	}
	if got := entries(t, base); len(got) != 1 || got[0] != filepath.Base(w2.Root) {
		t.Errorf("work dir holds %v, want only %s", got, filepath.Base(w2.Root))
	}

	// Close removes what the pool keeps; a workspace removed after it
	// is deleted.
	if err := w2.Remove(); err != nil {
		t.Fatal(err)
	}
	w3 := poolCreate(t, p, "s3", "c-1-1")
	if err := p.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := w3.Remove(); err != nil {
		t.Fatal(err)
	}
	if got := entries(t, base); len(got) != 0 {
		t.Errorf("after Close and Remove the work dir holds %v, want nothing", got)
	}
	w4 := poolCreate(t, p, "s4", "d-1-1")
	assertFresh(t, w4, base, "s4", "d-1-1")
	if err := w4.Remove(); err != nil {
		t.Fatal(err)
	}
	if got := entries(t, base); len(got) != 0 {
		t.Errorf("a closed pool kept %v", got)
	}
}

// TestPoolRefusesTamperedWorkspace: a workspace whose agent changed what
// a new one is made of, or that something wrote into while it waited, is
// removed, never handed to the next job.
func TestPoolRefusesTamperedWorkspace(t *testing.T) {
	outside := t.TempDir()
	writeFile(t, filepath.Join(outside, "keep"), "not the workspace's")
	victim := filepath.Join(t.TempDir(), "victim")
	writeFile(t, victim, "someone else's")
	cases := []struct {
		name   string
		tamper func(t *testing.T, w *workspace.Workspace)
		// idle runs on the kept workspace while it waits (nil: none).
		idle func(t *testing.T, dir string)
		// reused: only the tampered file is removed; the workspace is
		// kept and handed out again.
		reused bool
	}{
		{name: "in re-moded", tamper: func(t *testing.T, w *workspace.Workspace) { chmod(t, w.In, 0o755) }},
		{name: "root re-moded", tamper: func(t *testing.T, w *workspace.Workspace) { chmod(t, w.Root, 0o777) }},
		{name: "out setgid", tamper: func(t *testing.T, w *workspace.Workspace) { chmod(t, w.Out, 0o700|os.ModeSetgid) }},
		{name: "out a link", tamper: func(t *testing.T, w *workspace.Workspace) {
			if err := os.RemoveAll(w.Out); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(outside, w.Out); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "in removed", tamper: func(t *testing.T, w *workspace.Workspace) {
			if err := os.RemoveAll(w.In); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "prompt a hard link", reused: true, tamper: func(t *testing.T, w *workspace.Workspace) {
			if err := os.Remove(w.PromptFile); err != nil {
				t.Fatal(err)
			}
			if err := os.Link(victim, w.PromptFile); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "feedback a link", reused: true, tamper: func(t *testing.T, w *workspace.Workspace) {
			if err := os.Remove(w.FeedbackFile); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(filepath.Join(outside, "keep"), w.FeedbackFile); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "prompt re-moded", reused: true, tamper: func(t *testing.T, w *workspace.Workspace) { chmod(t, w.PromptFile, 0o644) }},
		{name: "feedback a directory", reused: true, tamper: func(t *testing.T, w *workspace.Workspace) {
			if err := os.Remove(w.FeedbackFile); err != nil {
				t.Fatal(err)
			}
			if err := os.MkdirAll(filepath.Join(w.FeedbackFile, "x"), 0o700); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "prompt written while kept", idle: func(t *testing.T, dir string) {
			writeFile(t, filepath.Join(dir, "prompt.md"), "stale prompt")
		}},
		{name: "written while kept", idle: func(t *testing.T, dir string) {
			writeFile(t, filepath.Join(dir, "out", "b.txt"), "stale output")
		}},
		{name: "entry added while kept", idle: func(t *testing.T, dir string) {
			writeFile(t, filepath.Join(dir, "notes"), "stale")
		}},
		{name: "re-moded while kept", idle: func(t *testing.T, dir string) { chmod(t, dir, 0o755) }},
	}
	for _, tt := range cases {
		t.Run(tt.name, func(t *testing.T) {
			base := t.TempDir()
			p := newPool(t, base)
			w := poolCreate(t, p, "s1", "a-1-1")
			before := hold(t, w.Root)
			fill(t, w, outside)
			if tt.tamper != nil {
				tt.tamper(t, w)
			}
			if err := w.Remove(); err != nil {
				t.Fatalf("Remove: %v", err)
			}
			if tt.idle != nil || tt.reused {
				kept := keptOne(t, base)
				if tt.idle != nil {
					tt.idle(t, kept)
				}
			} else if left := entries(t, base); len(left) != 0 {
				t.Fatalf("tampered workspace kept: work dir holds %v", left)
			}
			w2 := poolCreate(t, p, "s2", "b-1-1")
			assertFresh(t, w2, base, "s2", "b-1-1")
			after, err := os.Stat(w2.Root)
			if err != nil {
				t.Fatal(err)
			}
			if reused := os.SameFile(before, after); reused != tt.reused {
				t.Errorf("workspace handed out again: %v, want %v", reused, tt.reused)
			}
			if got := entries(t, base); len(got) != 1 {
				t.Errorf("work dir holds %v, want only the new workspace", got)
			}
			if err := w2.WriteText("the next prompt", "the next feedback"); err != nil {
				t.Fatalf("WriteText: %v", err)
			}
			for path, want := range map[string]string{filepath.Join(outside, "keep"): "not the workspace's", victim: "someone else's", w2.PromptFile: "the next prompt", w2.FeedbackFile: "the next feedback"} {
				if b, err := os.ReadFile(path); err != nil || string(b) != want {
					t.Errorf("%s holds %q (%v), want %q", path, b, err, want)
				}
			}
			if got := entries(t, outside); !slices.Equal(got, []string{"keep"}) {
				t.Errorf("outside the workspace: %v, want keep untouched", got)
			}
		})
	}
}

func chmod(t *testing.T, path string, mode os.FileMode) {
	t.Helper()
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
}

// TestPoolConcurrent: jobs running at once each get a workspace of their
// own, however the pool hands them round, and it keeps at most MaxIdle.
func TestPoolConcurrent(t *testing.T) {
	base := t.TempDir()
	p := newPool(t, base)
	const workers, rounds = 8, 40
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for g := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range rounds {
				w, err := p.Create(fmt.Sprintf("s%d", g), fmt.Sprintf("x-%d", i))
				if err != nil {
					errs <- err
					return
				}
				// Another job's file here would mean two jobs share it.
				mine := filepath.Join(w.Out, "owner")
				if err := os.WriteFile(mine, []byte(w.Root), 0o600); err != nil {
					errs <- err
					return
				}
				if es, err := os.ReadDir(w.Out); err != nil || len(es) != 1 {
					errs <- fmt.Errorf("%s: out holds %d entries (%v), want this job's only", w.Root, len(es), err)
					return
				}
				if b, err := os.ReadFile(mine); err != nil || string(b) != w.Root {
					errs <- fmt.Errorf("%s: owner file %q (%v)", w.Root, b, err)
					return
				}
				if err := w.Remove(); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if got := entries(t, base); len(got) > workers || len(got) > workspace.MaxIdle {
		t.Errorf("work dir holds %d entries, want at most %d kept", len(got), min(workers, workspace.MaxIdle))
	}

	// More workspaces given back at once than MaxIdle: the rest are deleted.
	var held []*workspace.Workspace
	for i := range workspace.MaxIdle + 4 {
		held = append(held, poolCreate(t, p, "s", fmt.Sprintf("y-%d", i)))
	}
	for _, w := range held {
		if err := w.Remove(); err != nil {
			t.Fatal(err)
		}
	}
	if got := entries(t, base); len(got) != workspace.MaxIdle {
		t.Errorf("work dir holds %d entries, want the %d kept", len(got), workspace.MaxIdle)
	}
}

func TestPoolRefusesUnsafeNames(t *testing.T) {
	base := filepath.Join(t.TempDir(), "work")
	p := newPool(t, base)
	for _, tt := range [][2]string{{"../x", "a"}, {"s1", "../a"}, {"", "a"}, {".idle-1", "a"}} {
		if w, err := p.Create(tt[0], tt[1]); err == nil {
			t.Errorf("Create(%q, %q) = %s, want an error", tt[0], tt[1], w.Root)
		}
	}
	if _, err := os.Stat(base); !os.IsNotExist(err) {
		t.Errorf("refused names made the work dir (%v)", err)
	}
}

// TestWriteTextRefusesLinks: the prompt and feedback files are written
// only if they are the workspace's own (a kept workspace has them
// already): never through a link to another file.
func TestWriteTextRefusesLinks(t *testing.T) {
	for _, link := range []func(oldname, newname string) error{os.Link, os.Symlink} {
		w := create(t)
		victim := filepath.Join(t.TempDir(), "victim")
		writeFile(t, victim, "someone else's")
		if err := link(victim, w.PromptFile); err != nil {
			t.Fatal(err)
		}
		if err := w.WriteText("the prompt", ""); err == nil {
			t.Errorf("WriteText through a link to another file: no error")
		}
		if b, err := os.ReadFile(victim); err != nil || string(b) != "someone else's" {
			t.Errorf("the linked file holds %q (%v), want it untouched", b, err)
		}
	}
}

// TestPoolRefusesReplacedRoot: an agent (or a process left over) that
// puts a link or another directory where the workspace was gets nothing
// done through it: what it points to is untouched and never handed out.
func TestPoolRefusesReplacedRoot(t *testing.T) {
	// decoy looks like a kept workspace: empty in/ and out/ of mode 0700,
	// and a file of someone else's.
	decoy := func(t *testing.T) string {
		d := filepath.Join(t.TempDir(), "decoy")
		for _, sub := range []string{"in", "out"} {
			if err := os.MkdirAll(filepath.Join(d, sub), 0o700); err != nil {
				t.Fatal(err)
			}
		}
		chmod(t, d, 0o700)
		writeFile(t, filepath.Join(d, "precious"), "someone else's")
		return d
	}
	intact := func(t *testing.T, d string) {
		t.Helper()
		if got := entries(t, d); !slices.Equal(got, []string{"in", "out", "precious"}) {
			t.Errorf("decoy holds %v, want in, out and precious untouched", got)
		}
	}
	swap := func(t *testing.T, path, with string) {
		t.Helper()
		if err := os.Rename(path, path+".moved"); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(with, path); err != nil {
			t.Fatal(err)
		}
	}
	t.Run("at remove", func(t *testing.T) {
		base := t.TempDir()
		p := newPool(t, base)
		w := poolCreate(t, p, "s1", "a-1-1")
		fill(t, w, t.TempDir())
		d := decoy(t)
		swap(t, w.Root, d)
		if err := w.Remove(); err != nil {
			t.Fatalf("Remove: %v", err)
		}
		intact(t, d)
		if got := entries(t, base); len(got) != 1 || !strings.HasSuffix(got[0], ".moved") {
			t.Errorf("work dir holds %v, want only the agent's moved directory", got)
		}
		w2 := poolCreate(t, p, "s2", "b-1-1")
		assertFresh(t, w2, base, "s2", "b-1-1")
		intact(t, d)
	})
	t.Run("moved away and linked to", func(t *testing.T) {
		// The directory itself, elsewhere: its identity is the one the
		// pool recorded, but it is no longer in the work dir.
		base := t.TempDir()
		p := newPool(t, base)
		w := poolCreate(t, p, "s1", "a-1-1")
		fill(t, w, t.TempDir())
		place := filepath.Join(t.TempDir(), "place")
		if err := os.Rename(w.Root, place); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(place, w.Root); err != nil {
			t.Fatal(err)
		}
		if err := w.Remove(); err != nil {
			t.Fatalf("Remove: %v", err)
		}
		if got := entries(t, base); len(got) != 0 {
			t.Errorf("work dir holds %v, want nothing kept", got)
		}
		if got := entries(t, place); !slices.Contains(got, "prompt.md") {
			t.Errorf("the moved directory holds %v: it was emptied through the link", got)
		}
		w2 := poolCreate(t, p, "s2", "b-1-1")
		assertFresh(t, w2, base, "s2", "b-1-1")
		if fi, err := os.Lstat(w2.Root); err != nil || !fi.IsDir() {
			t.Errorf("handed out %s: %v (%v), want a directory of its own", w2.Root, fi, err)
		}
	})
	t.Run("while kept", func(t *testing.T) {
		base := t.TempDir()
		p := newPool(t, base)
		w := poolCreate(t, p, "s1", "a-1-1")
		if err := w.Remove(); err != nil {
			t.Fatal(err)
		}
		kept := keptOne(t, base)
		// A decoy that passes for a kept workspace in every other way.
		d := decoy(t)
		if err := os.Remove(filepath.Join(d, "precious")); err != nil {
			t.Fatal(err)
		}
		swap(t, kept, d)
		w2 := poolCreate(t, p, "s2", "b-1-1")
		assertFresh(t, w2, base, "s2", "b-1-1")
		if err := w2.WriteText("session s2's prompt", ""); err != nil {
			t.Fatal(err)
		}
		if got := entries(t, d); !slices.Equal(got, []string{"in", "out"}) {
			t.Errorf("decoy holds %v, want in and out untouched", got)
		}
		if fi, err := os.Lstat(w2.Root); err != nil || !fi.IsDir() {
			t.Errorf("handed out %s: %v (%v), want a directory of its own", w2.Root, fi, err)
		}
	})
}

// TestPoolRefusesWorkspaceInUse: a process created while the job ran
// that still works in the workspace (one that escaped the run's sweep)
// would write into the next job's files: such a workspace is removed,
// not kept.
func TestPoolRefusesWorkspaceInUse(t *testing.T) {
	// A work dir reached through a link: the kernel shows processes'
	// directories with it resolved.
	linked := filepath.Join(t.TempDir(), "work")
	if err := os.Symlink(t.TempDir(), linked); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct{ base, sub string }{{t.TempDir(), ""}, {t.TempDir(), "out"}, {linked, ""}} {
		base, sub := tt.base, tt.sub
		p := newPool(t, base)
		w := poolCreate(t, p, "s1", "a-1-1")
		cmd := exec.Command("sleep", "60")
		cmd.Dir = filepath.Join(w.Root, sub)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		if err := w.Remove(); err != nil {
			t.Fatalf("Remove: %v", err)
		}
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if got := entries(t, base); len(got) != 0 {
			t.Errorf("process working in %q: work dir holds %v, want the workspace removed", sub, got)
		}
		// With the process gone, the next one is kept.
		w2 := poolCreate(t, p, "s2", "b-1-1")
		if err := w2.Remove(); err != nil {
			t.Fatal(err)
		}
		if got := entries(t, base); len(got) != 1 || !strings.HasPrefix(got[0], workspace.IdlePrefix) {
			t.Errorf("no process in it: work dir holds %v, want one kept workspace", got)
		}
	}
}

// TestPoolWithoutReuse: a pool not asked to reuse makes a new workspace
// for every job and deletes it after.
func TestPoolWithoutReuse(t *testing.T) {
	base := t.TempDir()
	p, err := workspace.NewPool(base, false)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		w := poolCreate(t, p, "s1", fmt.Sprintf("a-%d", i))
		assertFresh(t, w, base, "s1", fmt.Sprintf("a-%d", i))
		fill(t, w, t.TempDir())
		if err := w.Remove(); err != nil {
			t.Fatal(err)
		}
		if got := entries(t, base); len(got) != 0 {
			t.Fatalf("work dir holds %v after Remove, want nothing", got)
		}
	}
}
