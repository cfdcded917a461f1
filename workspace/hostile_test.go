package workspace_test

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/loopbus/loopbus/schemas"
	"github.com/loopbus/loopbus/workspace"
)

// hostileNames could each reach outside out/ or in/, or confuse a reader,
// if used as a path element.
var hostileNames = []struct{ name, value string }{
	{"empty", ""},
	{"dot", "."},
	{"dot-dot", ".."},
	{"parent", "../x"},
	{"deep parent", "../../../../etc/passwd"},
	{"absolute", "/etc/passwd"},
	{"subdirectory", "a/b"},
	{"backslash", `a\b`},
	{"NUL", "a\x00b"},
	{"non-UTF-8", "\xff\xfe.json"},
	{"newline", "a\nb"},
	{"leading dash", "-rf"},
}

func TestOpenOutputRefusesHostileNames(t *testing.T) {
	for _, tt := range hostileNames {
		t.Run(tt.name, func(t *testing.T) {
			w := create(t)
			// Files a hostile name could resolve to, inside and outside out/.
			writeFile(t, filepath.Join(w.Root, "x"), "outside out/")
			writeFile(t, filepath.Join(w.Out, "x"), "inside out/")
			f, _, err := w.OpenOutput(tt.value, 1<<20)
			if err == nil {
				got, _ := io.ReadAll(f)
				f.Close()
				t.Fatalf("OpenOutput(%q) opened a file holding %q", tt.value, got)
			}
			if !errors.Is(err, schemas.ErrBadName) {
				t.Errorf("OpenOutput(%q) error = %v, want ErrBadName", tt.value, err)
			}
		})
	}
}

func TestFetchRefusesHostileNames(t *testing.T) {
	for _, tt := range hostileNames {
		t.Run(tt.name, func(t *testing.T) {
			w := create(t)
			f := &fakeFetcher{}
			refs := []schemas.ArtifactRef{{Name: "ok.md", Object: "o1"}, {Name: tt.value, Object: "o2"}}
			err := w.Fetch(context.Background(), f, refs, w.In)
			if !errors.Is(err, schemas.ErrBadName) {
				t.Fatalf("Fetch with input %q: error = %v, want ErrBadName", tt.value, err)
			}
			if len(f.paths) != 0 {
				t.Errorf("Fetch with input %q wrote %v", tt.value, f.paths)
			}
		})
	}
}

// outsideFile is a file outside any workspace with its content and mtime,
// to prove later that nothing touched it.
type outsideFile struct {
	path, content string
	mtime         time.Time
}

func newOutsideFile(t *testing.T) outsideFile {
	t.Helper()
	o := outsideFile{path: filepath.Join(t.TempDir(), "report.json"), content: `{"outside":true}`}
	writeFile(t, o.path, o.content)
	old := time.Now().Add(-time.Hour).Truncate(time.Second)
	if err := os.Chtimes(o.path, old, old); err != nil {
		t.Fatal(err)
	}
	o.mtime = old
	return o
}

func (o outsideFile) checkUntouched(t *testing.T) {
	t.Helper()
	fi, err := os.Lstat(o.path)
	if err != nil {
		t.Fatalf("outside file: %v", err)
	}
	got, err := os.ReadFile(o.path)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != o.content || !fi.ModTime().Equal(o.mtime) || !fi.Mode().IsRegular() {
		t.Errorf("outside file changed: %q, mtime %v, mode %v; want %q, %v, regular", got, fi.ModTime(), fi.Mode(), o.content, o.mtime)
	}
}

func TestOpenOutputLeavesOutsideAlone(t *testing.T) {
	tests := []struct {
		name  string
		setup func(t *testing.T, w *workspace.Workspace, o outsideFile)
		want  string
	}{
		{
			name: "output links to an outside file",
			setup: func(t *testing.T, w *workspace.Workspace, o outsideFile) {
				if err := os.Symlink(o.path, filepath.Join(w.Out, "report.json")); err != nil {
					t.Fatal(err)
				}
			},
			want: "symbolic link",
		},
		{
			name: "out/ links to the outside directory",
			setup: func(t *testing.T, w *workspace.Workspace, o outsideFile) {
				if err := os.Remove(w.Out); err != nil {
					t.Fatal(err)
				}
				if err := os.Symlink(filepath.Dir(o.path), w.Out); err != nil {
					t.Fatal(err)
				}
			},
			want: "out/ was removed or replaced",
		},
		{
			name: "out/ links to the outside file",
			setup: func(t *testing.T, w *workspace.Workspace, o outsideFile) {
				if err := os.Remove(w.Out); err != nil {
					t.Fatal(err)
				}
				if err := os.Symlink(o.path, w.Out); err != nil {
					t.Fatal(err)
				}
			},
			want: "out/ was removed or replaced",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := create(t)
			o := newOutsideFile(t)
			tt.setup(t, w, o)
			f, _, err := w.OpenOutput("report.json", 1<<20)
			if err == nil {
				got, _ := io.ReadAll(f)
				f.Close()
				t.Fatalf("OpenOutput read %q through a link", got)
			}
			if !errors.Is(err, workspace.ErrUnsafeOutput) {
				t.Errorf("error = %v, want ErrUnsafeOutput", err)
			}
			if msg := err.Error(); !strings.Contains(msg, tt.want) {
				t.Errorf("error %q does not say %q", msg, tt.want)
			}
			if err := w.Remove(); err != nil {
				t.Fatalf("Remove: %v", err)
			}
			o.checkUntouched(t)
		})
	}
}

// A link to an outside FIFO would block the first reader to open it: that
// OpenOutput returns at all proves it never opened the target.
func TestOpenOutputNeverOpensLinkTarget(t *testing.T) {
	w := create(t)
	fifo := filepath.Join(t.TempDir(), "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatalf("mkfifo: %v", err)
	}
	if err := os.Symlink(fifo, filepath.Join(w.Out, "report.json")); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		f, _, err := w.OpenOutput("report.json", 1<<20)
		if f != nil {
			f.Close()
		}
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, workspace.ErrUnsafeOutput) {
			t.Errorf("error = %v, want ErrUnsafeOutput", err)
		}
	case <-time.After(10 * time.Second):
		// Unblock the opener so the goroutine ends.
		if f, err := os.OpenFile(fifo, os.O_WRONLY, 0); err == nil {
			f.Close()
		}
		t.Fatal("OpenOutput blocked opening the FIFO the output links to")
	}
}

// Files with names that are not UTF-8 (an agent may create any) do no harm:
// declared outputs still open, and Remove removes them with the rest.
func TestNonUTF8FilesInOut(t *testing.T) {
	w := create(t)
	for _, n := range []string{"\xff\xfe.json", "a\x80b", "\xc3(", "new\nline"} {
		writeFile(t, filepath.Join(w.Out, n), "junk")
	}
	writeFile(t, filepath.Join(w.Out, "report.json"), "{}")
	f, size, err := w.OpenOutput("report.json", 1<<20)
	if err != nil {
		t.Fatalf("OpenOutput: %v", err)
	}
	f.Close()
	if size != 2 {
		t.Errorf("size = %d, want 2", size)
	}
	if err := w.Remove(); err != nil {
		t.Fatalf("Remove: %v", err)
	}
	if _, err := os.Lstat(w.Root); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("workspace still there after Remove: %v", err)
	}
}
