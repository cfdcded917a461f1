package workspace_test

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/loopbus/loopbus/schemas"
	"github.com/loopbus/loopbus/workspace"
)

func create(t *testing.T) *workspace.Workspace {
	t.Helper()
	w, err := workspace.Create(t.TempDir(), "s1", "summary-1-1")
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	return w
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestCreateLayout(t *testing.T) {
	base := t.TempDir()
	w, err := workspace.Create(base, "s1", "summary-1-1")
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	root := w.Root
	if filepath.Dir(root) != base || !strings.HasPrefix(filepath.Base(root), "s1.summary-1-1-") {
		t.Fatalf("root %s: want a new directory s1.summary-1-1-* under %s", root, base)
	}
	want := workspace.Workspace{
		Root: root, In: filepath.Join(root, "in"), Out: filepath.Join(root, "out"),
		PromptFile: filepath.Join(root, "prompt.md"), FeedbackFile: filepath.Join(root, "feedback.md"),
	}
	if *w != want {
		t.Fatalf("workspace = %+v, want %+v", *w, want)
	}
	for _, d := range []string{w.In, w.Out} {
		fi, err := os.Stat(d)
		if err != nil || !fi.IsDir() {
			t.Fatalf("%s: not a directory (%v)", d, err)
		}
		if perm := fi.Mode().Perm(); perm&0o077 != 0 {
			t.Errorf("%s has mode %v, want no group/other access", d, perm)
		}
		entries, _ := os.ReadDir(d)
		if len(entries) != 0 {
			t.Errorf("%s is not empty: %v", d, entries)
		}
	}
}

// TestRemoveLeavesNothing: once its workspaces are removed, a session
// leaves nothing in base (a worker runs for many sessions), and a base
// that does not exist yet is made.
func TestRemoveLeavesNothing(t *testing.T) {
	base := filepath.Join(t.TempDir(), "work")
	for _, session := range []string{"s1", "s2", "repos"} {
		w, err := workspace.Create(base, session, "a-1-1")
		if err != nil {
			t.Fatalf("Create: %v", err)
		}
		writeFile(t, filepath.Join(w.Out, "a.txt"), "a")
		if err := w.Remove(); err != nil {
			t.Fatalf("Remove: %v", err)
		}
	}
	entries, err := os.ReadDir(base)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 0 {
		t.Fatalf("base holds %v after every workspace was removed", entries)
	}
}

func TestCreateRelativeBaseIsMadeAbsolute(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	w, err := workspace.Create("work", "s1", "x")
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	if !filepath.IsAbs(w.Root) || !filepath.IsAbs(w.Out) {
		t.Fatalf("paths are not absolute: %+v", *w)
	}
}

// TestCreateNeverReusesOrRemoves: a second workspace for the same job (a
// redelivery, or another worker on this machine using the same session id)
// is a new empty directory, and the first one is left as it was.
func TestCreateNeverReusesOrRemoves(t *testing.T) {
	base := t.TempDir()
	w, err := workspace.Create(base, "s1", "summary-1-1")
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(w.Out, "busy.json"), "{}")
	writeFile(t, filepath.Join(w.In, "old.md"), "old")

	w2, err := workspace.Create(base, "s1", "summary-1-1")
	if err != nil {
		t.Fatalf("second Create: %v", err)
	}
	if w2.Root == w.Root {
		t.Fatalf("both workspaces are %s", w.Root)
	}
	for _, d := range []string{w2.Root, w2.In, w2.Out} {
		entries, err := os.ReadDir(d)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		want := ""
		if d == w2.Root {
			want = "in out"
		}
		if got := strings.Join(names, " "); got != want {
			t.Errorf("%s holds %q, want %q", d, got, want)
		}
	}
	for _, f := range []string{filepath.Join(w.Out, "busy.json"), filepath.Join(w.In, "old.md")} {
		if _, err := os.Stat(f); err != nil {
			t.Errorf("the first workspace was touched: %v", err)
		}
	}
	if err := w2.Remove(); err != nil {
		t.Fatalf("Remove: %v", err)
	}
	if _, err := os.Stat(w2.Root); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Root still exists after Remove: %v", err)
	}
	if _, err := os.Stat(w.Root); err != nil {
		t.Errorf("Remove of the second removed the first: %v", err)
	}
}

func TestCreateRejectsUnsafeTokens(t *testing.T) {
	tests := []struct {
		name          string
		session, item string
		wantErr       error
	}{
		{name: "empty session", session: "", item: "x", wantErr: schemas.ErrBadSessionID},
		{name: "session with slash", session: "a/b", item: "x", wantErr: schemas.ErrBadSessionID},
		{name: "session dot-dot", session: "..", item: "x", wantErr: schemas.ErrBadSessionID},
		{name: "session with dot", session: "s.1", item: "x", wantErr: schemas.ErrBadSessionID},
		{name: "empty name", session: "s1", item: "", wantErr: schemas.ErrBadName},
		{name: "name dot-dot", session: "s1", item: "..", wantErr: schemas.ErrBadName},
		{name: "name dot", session: "s1", item: ".", wantErr: schemas.ErrBadName},
		{name: "name with slash", session: "s1", item: "../../etc", wantErr: schemas.ErrBadName},
		{name: "name starting with dash", session: "s1", item: "-rf", wantErr: schemas.ErrBadName},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			base := t.TempDir()
			_, err := workspace.Create(base, tt.session, tt.item)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("Create(%q, %q) error = %v, want %v", tt.session, tt.item, err, tt.wantErr)
			}
			entries, _ := os.ReadDir(base)
			if len(entries) != 0 {
				t.Errorf("rejected Create left %v in base", entries)
			}
		})
	}
}

// fakeFetcher writes "bytes of <object>" for each artifact it is asked for.
type fakeFetcher struct {
	paths []string
	err   error
}

func (f *fakeFetcher) GetArtifact(_ context.Context, ref schemas.ArtifactRef, w io.Writer) error {
	f.paths = append(f.paths, w.(*os.File).Name())
	if f.err != nil {
		_, _ = io.WriteString(w, "partial")
		return f.err
	}
	_, err := io.WriteString(w, "bytes of "+ref.Object)
	return err
}

func TestFetch(t *testing.T) {
	errBoom := errors.New("boom")
	tests := []struct {
		name      string
		refs      []schemas.ArtifactRef
		fetchErr  error
		want      []string // names fetched into In
		wantErr   error
		wantCalls int
	}{
		{name: "none", want: nil},
		{
			name: "two inputs",
			refs: []schemas.ArtifactRef{{Name: "talk.md", Object: "o1"}, {Name: "summary.json", Object: "o2"}},
			want: []string{"talk.md", "summary.json"}, wantCalls: 2,
		},
		{name: "parent escape", refs: []schemas.ArtifactRef{{Name: "../prompt.md", Object: "o"}}, wantErr: schemas.ErrBadName},
		{name: "absolute path", refs: []schemas.ArtifactRef{{Name: "/etc/passwd", Object: "o"}}, wantErr: schemas.ErrBadName},
		{name: "dot-dot", refs: []schemas.ArtifactRef{{Name: "..", Object: "o"}}, wantErr: schemas.ErrBadName},
		{name: "empty name", refs: []schemas.ArtifactRef{{Name: "", Object: "o"}}, wantErr: schemas.ErrBadName},
		{
			name:    "unsafe after safe fetches nothing",
			refs:    []schemas.ArtifactRef{{Name: "ok.md", Object: "o1"}, {Name: "a/b", Object: "o2"}},
			wantErr: schemas.ErrBadName, wantCalls: 0,
		},
		{name: "fetcher error", refs: []schemas.ArtifactRef{{Name: "x.md", Object: "o"}}, fetchErr: errBoom, wantErr: errBoom, wantCalls: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := create(t)
			f := &fakeFetcher{err: tt.fetchErr}
			err := w.Fetch(context.Background(), f, tt.refs, w.In)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("Fetch error = %v, want %v", err, tt.wantErr)
			}
			if len(f.paths) != tt.wantCalls {
				t.Errorf("fetcher called for %v, want %d calls", f.paths, tt.wantCalls)
			}
			for _, p := range f.paths {
				if filepath.Dir(p) != w.In {
					t.Errorf("fetcher asked to write %s, outside %s", p, w.In)
				}
			}
			if tt.wantErr != nil {
				// A failed fetch removes the file it was writing.
				if left, _ := os.ReadDir(w.In); len(left) != 0 {
					t.Errorf("a failed Fetch left %v in in/", left)
				}
			}
			for i, name := range tt.want {
				got, err := os.ReadFile(filepath.Join(w.In, name))
				if err != nil {
					t.Fatalf("input %s: %v", name, err)
				}
				if want := "bytes of " + tt.refs[i].Object; string(got) != want {
					t.Errorf("input %s = %q, want %q", name, got, want)
				}
			}
		})
	}
}

func TestWriteText(t *testing.T) {
	w := create(t)
	if err := w.WriteText("the prompt\n", "the feedback\n"); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]string{w.PromptFile: "the prompt\n", w.FeedbackFile: "the feedback\n"} {
		got, err := os.ReadFile(path)
		if err != nil || string(got) != want {
			t.Errorf("%s = %q (%v), want %q", path, got, err, want)
		}
	}
}

// effective returns the environment a process sees: the last value of each
// key wins, as with os/exec.
func effective(env []string) map[string]string {
	m := map[string]string{}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		m[k] = v
	}
	return m
}

func TestEnv(t *testing.T) {
	w := create(t)
	base := []string{"PATH=/usr/bin:/bin", "HOME=/home/x", "LOOPBUS_STEP=stale", "LOOPBUS_OUTPUT_DIR=/stale"}
	baseCopy := append([]string(nil), base...)
	v := workspace.Vars{Session: "s1", Step: "summary", Job: "s1.summary.2", Iteration: 2}

	tests := []struct {
		name  string
		extra map[string]string
		want  map[string]string
	}{
		{
			name: "contract",
			want: map[string]string{
				"PATH":                  "/usr/bin:/bin",
				"HOME":                  "/home/x",
				"LOOPBUS_SESSION":       "s1",
				"LOOPBUS_STEP":          "summary",
				"LOOPBUS_JOB":           "s1.summary.2",
				"LOOPBUS_ITERATION":     "2",
				"LOOPBUS_WORKSPACE":     w.Root,
				"LOOPBUS_INPUT_DIR":     w.In,
				"LOOPBUS_OUTPUT_DIR":    w.Out,
				"LOOPBUS_PROMPT_FILE":   w.PromptFile,
				"LOOPBUS_FEEDBACK_FILE": w.FeedbackFile,
			},
		},
		{
			name:  "extra wins",
			extra: map[string]string{"LOOPBUS_OUTPUT_DIR": "/override", "PATH": "/opt/bin", "MODEL": "small"},
			want: map[string]string{
				"PATH":               "/opt/bin",
				"LOOPBUS_OUTPUT_DIR": "/override",
				"MODEL":              "small",
				"LOOPBUS_STEP":       "summary",
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := effective(w.Env(base, v, tt.extra))
			for k, want := range tt.want {
				if got[k] != want {
					t.Errorf("%s = %q, want %q", k, got[k], want)
				}
			}
		})
	}
	if strings.Join(base, "\n") != strings.Join(baseCopy, "\n") {
		t.Errorf("Env modified its base: %v", base)
	}
}

func TestEnvDoesNotAliasBase(t *testing.T) {
	w := create(t)
	base := make([]string, 1, 64) // spare capacity: appending in place would alias
	base[0] = "A=1"
	e1 := w.Env(base, workspace.Vars{Session: "s1", Step: "one"}, nil)
	e2 := w.Env(base, workspace.Vars{Session: "s1", Step: "two"}, nil)
	if got := effective(e1)["LOOPBUS_STEP"]; got != "one" {
		t.Fatalf("first env's LOOPBUS_STEP = %q after a second call, want one", got)
	}
	if got := effective(e2)["LOOPBUS_STEP"]; got != "two" {
		t.Fatalf("second env's LOOPBUS_STEP = %q, want two", got)
	}
}

func TestOpenOutput(t *testing.T) {
	const maxBytes = 10
	outside := filepath.Join(t.TempDir(), "secret.txt")
	writeFile(t, outside, "secret")

	tests := []struct {
		name     string
		output   string
		setup    func(t *testing.T, w *workspace.Workspace)
		want     string // content, when the open succeeds
		wantErr  error
		wantText []string
	}{
		{
			name: "regular", output: "summary.json", want: `{"a":1}`,
			setup: func(t *testing.T, w *workspace.Workspace) {
				writeFile(t, filepath.Join(w.Out, "summary.json"), `{"a":1}`)
			},
		},
		{
			name: "exactly the limit", output: "ten.txt", want: "0123456789",
			setup: func(t *testing.T, w *workspace.Workspace) {
				writeFile(t, filepath.Join(w.Out, "ten.txt"), "0123456789")
			},
		},
		{
			name: "empty file", output: "empty.txt", want: "",
			setup: func(t *testing.T, w *workspace.Workspace) { writeFile(t, filepath.Join(w.Out, "empty.txt"), "") },
		},
		{
			name: "missing", output: "summary.json", setup: func(*testing.T, *workspace.Workspace) {},
			wantErr:  workspace.ErrUnsafeOutput,
			wantText: []string{"missing output summary.json", "$LOOPBUS_OUTPUT_DIR/summary.json", "out/summary.json"},
		},
		{
			name: "symlink outside", output: "summary.json",
			setup: func(t *testing.T, w *workspace.Workspace) {
				if err := os.Symlink(outside, filepath.Join(w.Out, "summary.json")); err != nil {
					t.Fatal(err)
				}
			},
			wantErr: workspace.ErrUnsafeOutput, wantText: []string{"summary.json", "symbolic link"},
		},
		{
			name: "symlink inside out", output: "summary.json",
			setup: func(t *testing.T, w *workspace.Workspace) {
				writeFile(t, filepath.Join(w.Out, "real.json"), "{}")
				if err := os.Symlink("real.json", filepath.Join(w.Out, "summary.json")); err != nil {
					t.Fatal(err)
				}
			},
			wantErr: workspace.ErrUnsafeOutput, wantText: []string{"symbolic link"},
		},
		{
			name: "dangling symlink", output: "summary.json",
			setup: func(t *testing.T, w *workspace.Workspace) {
				if err := os.Symlink("/nonexistent/x", filepath.Join(w.Out, "summary.json")); err != nil {
					t.Fatal(err)
				}
			},
			wantErr: workspace.ErrUnsafeOutput, wantText: []string{"symbolic link"},
		},
		{
			name: "directory", output: "summary.json",
			setup: func(t *testing.T, w *workspace.Workspace) {
				if err := os.Mkdir(filepath.Join(w.Out, "summary.json"), 0o700); err != nil {
					t.Fatal(err)
				}
			},
			wantErr: workspace.ErrUnsafeOutput, wantText: []string{"not a regular file"},
		},
		{
			name: "fifo", output: "summary.json",
			setup: func(t *testing.T, w *workspace.Workspace) {
				if err := syscall.Mkfifo(filepath.Join(w.Out, "summary.json"), 0o600); err != nil {
					t.Skipf("mkfifo: %v", err)
				}
			},
			wantErr: workspace.ErrUnsafeOutput, wantText: []string{"not a regular file"},
		},
		{
			name: "too large", output: "big.txt",
			setup: func(t *testing.T, w *workspace.Workspace) {
				writeFile(t, filepath.Join(w.Out, "big.txt"), "01234567890")
			},
			wantErr: workspace.ErrUnsafeOutput, wantText: []string{"big.txt", "11 bytes", "10-byte limit"},
		},
		{name: "unsafe name", output: "../prompt.md", setup: func(*testing.T, *workspace.Workspace) {}, wantErr: schemas.ErrBadName},
		{name: "dot-dot", output: "..", setup: func(*testing.T, *workspace.Workspace) {}, wantErr: schemas.ErrBadName},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := create(t)
			tt.setup(t, w)
			f, size, err := w.OpenOutput(tt.output, maxBytes)
			if tt.wantErr != nil {
				if f != nil {
					f.Close()
				}
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("OpenOutput error = %v, want %v", err, tt.wantErr)
				}
				for _, s := range tt.wantText {
					if !strings.Contains(err.Error(), s) {
						t.Errorf("error %q does not mention %q", err, s)
					}
				}
				return
			}
			if err != nil {
				t.Fatalf("OpenOutput: %v", err)
			}
			defer f.Close()
			got, err := io.ReadAll(f)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tt.want || size != int64(len(tt.want)) {
				t.Errorf("read %q (size %d), want %q (size %d)", got, size, tt.want, len(tt.want))
			}
		})
	}
}

// An agent that replaces out/ itself with a symbolic link must not make
// loopbus read outside the workspace either: OpenOutput promises it never
// follows links out of the workspace.
func TestOpenOutputRefusesSymlinkedOutDir(t *testing.T) {
	w := create(t)
	elsewhere := t.TempDir()
	writeFile(t, filepath.Join(elsewhere, "summary.json"), "secret")
	if err := os.Remove(w.Out); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(elsewhere, w.Out); err != nil {
		t.Fatal(err)
	}
	f, _, err := w.OpenOutput("summary.json", 1<<20)
	if err == nil {
		got, _ := io.ReadAll(f)
		f.Close()
		t.Fatalf("OpenOutput followed the out/ symlink and read %q from %s", got, elsewhere)
	}
	if !errors.Is(err, workspace.ErrUnsafeOutput) {
		t.Fatalf("OpenOutput error = %v, want ErrUnsafeOutput", err)
	}
}

func TestFetchDefinition(t *testing.T) {
	ws, err := workspace.Create(t.TempDir(), "s1", "job")
	if err != nil {
		t.Fatal(err)
	}
	files := []schemas.DefinitionFile{
		{Path: "agents/run.sh", Artifact: schemas.ArtifactRef{Name: "run.sh", Object: "s1/definition/agents/run.sh"}, Executable: true},
		{Path: "check.sh", Artifact: schemas.ArtifactRef{Name: "check.sh", Object: "s1/definition/check.sh"}},
	}
	f := &fakeFetcher{}
	runnable, err := ws.FetchDefinition(context.Background(), f, "/srv/kit", files)
	if err != nil {
		t.Fatal(err)
	}
	got := runnable([]string{"/srv/kit/agents/run.sh", "sh", "/srv/kit/check.sh", "/srv/kit/other.sh", "agents/run.sh"})
	want := []string{filepath.Join(ws.Root, "definition", "agents", "run.sh"), "sh", filepath.Join(ws.Root, "definition", "check.sh"), "/srv/kit/other.sh", "agents/run.sh"}
	if !slices.Equal(got, want) {
		t.Errorf("runnable = %q, want %q", got, want)
	}
	for path, mode := range map[string]os.FileMode{want[0]: 0o700, want[2]: 0o600} {
		fi, err := os.Stat(path)
		if err != nil || fi.Mode().Perm() != mode {
			t.Errorf("%s: %v, mode %v, want %v", path, err, fi.Mode().Perm(), mode)
		}
	}
	for _, bad := range []string{"../escape.sh", "/etc/passwd", "a/../../b", ".hidden/x", ""} {
		f := &fakeFetcher{}
		_, err := ws.FetchDefinition(context.Background(), f, "/srv/kit", []schemas.DefinitionFile{{Path: bad}})
		if !errors.Is(err, schemas.ErrBadName) || len(f.paths) != 0 {
			t.Errorf("path %q: err %v, %d fetches; want ErrBadName and none", bad, err, len(f.paths))
		}
	}
}

// BenchmarkLifecycle is a job's workspace from start to end, as a worker
// uses it for a step with one input and one output: made, the input and
// the prompt and feedback written, the output opened, removed. One
// session's jobs follow each other in one work dir: "new" makes and
// removes every workspace (Create), "pool-new" too, through a Pool that
// does not reuse (as workers do by default; on ext4 its workspaces spread
// over the block groups), and "pool" empties and reuses them.
func BenchmarkLifecycle(b *testing.B) {
	b.Run("new", func(b *testing.B) {
		base := b.TempDir()
		lifecycles(b, func(session string) (*workspace.Workspace, error) { return workspace.Create(base, session, "step-1-1") })
	})
	for _, v := range []struct {
		name  string
		reuse bool
	}{{"pool-new", false}, {"pool", true}} {
		b.Run(v.name, func(b *testing.B) {
			p, err := workspace.NewPool(b.TempDir(), v.reuse)
			if err != nil {
				b.Fatal(err)
			}
			defer p.Close()
			lifecycles(b, func(session string) (*workspace.Workspace, error) { return p.Create(session, "step-1-1") })
		})
	}
}

// lifecycles runs b.N job lifecycles on workspaces made by create.
func lifecycles(b *testing.B, create func(session string) (*workspace.Workspace, error)) {
	f := &fakeFetcher{}
	refs := []schemas.ArtifactRef{{Name: "a.txt", Object: "o1"}}
	b.ReportAllocs()
	for i := range b.N {
		w, err := create("s" + strconv.Itoa(i/3))
		if err != nil {
			b.Fatal(err)
		}
		if err := w.Fetch(context.Background(), f, refs, w.In); err != nil {
			b.Fatal(err)
		}
		if err := w.WriteText("the prompt", ""); err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(w.Out, "b.txt"), nil, 0o600); err != nil {
			b.Fatal(err)
		}
		out, _, err := w.OpenOutput("b.txt", 1<<20)
		if err != nil {
			b.Fatal(err)
		}
		out.Close()
		if err := w.Remove(); err != nil {
			b.Fatal(err)
		}
		f.paths = f.paths[:0]
	}
}
