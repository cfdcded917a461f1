package modelapi

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// newBox makes a workspace (root) holding a worktree directory (repo), a
// secret file beside root, and a toolbox working in repo.
func newBox(t *testing.T, names ...string) (*Toolbox, string) {
	t.Helper()
	base := t.TempDir()
	root := filepath.Join(base, "ws")
	repo := filepath.Join(root, "repo")
	for _, d := range []string{filepath.Join(root, "in"), filepath.Join(root, "out"), filepath.Join(repo, "src")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write := func(p, s string) {
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(base, "secret.txt"), "top secret")
	write(filepath.Join(root, "in", "spec.md"), "the spec")
	write(filepath.Join(repo, "src", "a.go"), "package a\n\nfunc A() int { return 1 }\n")
	if err := os.Symlink(filepath.Join(base, "secret.txt"), filepath.Join(repo, "leak")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(base), filepath.Join(repo, "up")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("src/a.go", filepath.Join(repo, "alias.go")); err != nil {
		t.Fatal(err)
	}
	if len(names) == 0 {
		names = ToolNames()
	}
	tb, err := NewToolbox(root, repo, []string{"PATH=" + os.Getenv("PATH"), "MARK=here"}, names)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tb.Close() })
	return tb, base
}

func TestToolboxPaths(t *testing.T) {
	tb, base := newBox(t)
	ctx := context.Background()
	tests := []struct {
		name, tool, args string
		wantErr          bool
		want             string
	}{
		{name: "read", tool: ToolReadFile, args: `{"path":"src/a.go"}`, want: "func A()"},
		{name: "read through an inner link", tool: ToolReadFile, args: `{"path":"alias.go"}`, want: "func A()"},
		{name: "read the workspace's input", tool: ToolReadFile, args: `{"path":"../in/spec.md"}`, want: "the spec"},
		{name: "dot-dot out of the workspace", tool: ToolReadFile, args: `{"path":"../../secret.txt"}`, wantErr: true, want: "outside"},
		{name: "absolute", tool: ToolReadFile, args: `{"path":"` + filepath.Join(base, "secret.txt") + `"}`, wantErr: true, want: "absolute"},
		{name: "home", tool: ToolReadFile, args: `{"path":"~/.ssh/id_rsa"}`, wantErr: true, want: "absolute"},
		{name: "symlink out", tool: ToolReadFile, args: `{"path":"leak"}`, wantErr: true, want: "outside"},
		{name: "dir symlink out", tool: ToolReadFile, args: `{"path":"up/secret.txt"}`, wantErr: true, want: "outside"},
		{name: "write through a link out", tool: ToolWriteFile, args: `{"path":"up/new.txt","content":"x"}`, wantErr: true, want: "outside"},
		{name: "write out", tool: ToolWriteFile, args: `{"path":"../../evil.txt","content":"x"}`, wantErr: true, want: "outside"},
		{name: "list out", tool: ToolListFiles, args: `{"path":".."}`, want: "repo/"},
		{name: "list beyond", tool: ToolListFiles, args: `{"path":"../.."}`, wantErr: true, want: "outside"},
		{name: "list through a link", tool: ToolListFiles, args: `{"path":"up"}`, wantErr: true, want: "outside"},
		{name: "edit out", tool: ToolEditFile, args: `{"path":"leak","old_string":"top","new_string":"x"}`, wantErr: true, want: "outside"},
		{name: "missing", tool: ToolReadFile, args: `{"path":"nope.txt"}`, wantErr: true, want: "no such file"},
		{name: "a directory", tool: ToolReadFile, args: `{"path":"src"}`, wantErr: true, want: "directory"},
		{name: "NUL", tool: ToolReadFile, args: `{"path":"a\u0000b"}`, wantErr: true, want: "NUL"},
		{name: "no args", tool: ToolReadFile, args: `{}`, wantErr: true, want: "missing argument(s): path"},
		{name: "not JSON", tool: ToolReadFile, args: `{path`, wantErr: true, want: "not a JSON object"},
		{name: "unknown tool", tool: "rm_rf", args: `{}`, wantErr: true, want: "no tool"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := tb.Call(ctx, tt.tool, tt.args)
			if o.IsError != tt.wantErr || !strings.Contains(o.Output, tt.want) {
				t.Errorf("%s %s = %+v, want error %v containing %q", tt.tool, tt.args, o, tt.wantErr, tt.want)
			}
			if strings.Contains(o.Output, "top secret") || strings.Contains(o.Output, base) && !strings.Contains(tt.args, base) {
				t.Errorf("the outcome shows what lies outside: %q", o.Output)
			}
		})
	}
	if _, err := os.Stat(filepath.Join(base, "evil.txt")); err == nil {
		t.Error("a write outside the workspace happened")
	}
	if _, err := os.Stat(filepath.Join(base, "new.txt")); err == nil {
		t.Error("a write through a link out happened")
	}
}

func TestToolboxWriteEditList(t *testing.T) {
	tb, _ := newBox(t)
	ctx := context.Background()
	if o := tb.Call(ctx, ToolWriteFile, `{"path":"../out/report.md","content":"# Report\nline\nline\n"}`); o.IsError {
		t.Fatalf("write: %+v", o)
	}
	if o := tb.Call(ctx, ToolWriteFile, `{"path":"new/deep/f.txt","content":"x"}`); o.IsError {
		t.Fatalf("write into new directories: %+v", o)
	}
	if o := tb.Call(ctx, ToolEditFile, `{"path":"../out/report.md","old_string":"line","new_string":"x"}`); !o.IsError || !strings.Contains(o.Output, "occurs 2 times") {
		t.Errorf("ambiguous edit = %+v", o)
	}
	if o := tb.Call(ctx, ToolEditFile, `{"path":"../out/report.md","old_string":"absent","new_string":"x"}`); !o.IsError || !strings.Contains(o.Output, "does not occur") {
		t.Errorf("edit of absent text = %+v", o)
	}
	if o := tb.Call(ctx, ToolEditFile, `{"path":"../out/report.md","old_string":"# Report\nline","new_string":"# Done\nline"}`); o.IsError {
		t.Errorf("edit = %+v", o)
	}
	b, err := os.ReadFile(filepath.Join(filepath.Dir(tb.rootDir), "ws", "out", "report.md"))
	if err != nil || string(b) != "# Done\nline\nline\n" {
		t.Errorf("report.md = %q, %v", b, err)
	}
	o := tb.Call(ctx, ToolListFiles, `{"path":"."}`)
	for _, want := range []string{"src/\n", "src/a.go\n", "new/deep/f.txt\n"} {
		if !strings.Contains(o.Output, want) {
			t.Errorf("list_files lacks %q:\n%s", want, o.Output)
		}
	}
	if o := tb.Call(ctx, ToolListFiles, `{}`); o.IsError || !strings.Contains(o.Output, "src/a.go") {
		t.Errorf("list_files with no path = %+v", o)
	}
}

func TestToolboxReadLimits(t *testing.T) {
	tb, _ := newBox(t)
	big := strings.Repeat("y", MaxReadBytes+10)
	if err := os.WriteFile(filepath.Join(tb.rootDir, "repo", "big.txt"), []byte(big), 0o644); err != nil {
		t.Fatal(err)
	}
	o := tb.Call(context.Background(), ToolReadFile, `{"path":"big.txt"}`)
	if o.IsError || len(o.Output) > MaxReadBytes+200 || !strings.Contains(o.Output, "cut") {
		t.Errorf("read of a big file: error %v, %d bytes", o.IsError, len(o.Output))
	}
	if err := os.WriteFile(filepath.Join(tb.rootDir, "repo", "bin"), []byte{1, 0, 2}, 0o644); err != nil {
		t.Fatal(err)
	}
	if o := tb.Call(context.Background(), ToolReadFile, `{"path":"bin"}`); !o.IsError || !strings.Contains(o.Output, "binary") {
		t.Errorf("read of a binary file = %+v", o)
	}
}

func TestToolboxRun(t *testing.T) {
	tb, _ := newBox(t)
	ctx := context.Background()
	o := tb.Call(ctx, ToolRun, `{"command":"pwd; echo $MARK; ls src"}`)
	if o.IsError || o.ExitCode != 0 || !strings.Contains(o.Output, "exit code 0") || !strings.Contains(o.Output, "/ws/repo\nhere\na.go") {
		t.Errorf("run = %+v", o)
	}
	if o := tb.Call(ctx, ToolRun, `{"command":"echo oops >&2; exit 3"}`); !o.IsError || o.ExitCode != 3 || !strings.Contains(o.Output, "oops") {
		t.Errorf("failing run = %+v", o)
	}
	o = tb.Call(ctx, ToolRun, `{"command":"head -c 100000 /dev/zero | tr '\\0' x"}`)
	if len(o.Output) > MaxRunOutput+100 {
		t.Errorf("run output %d bytes, want it cut to about %d", len(o.Output), MaxRunOutput)
	}
	tb.RunTimeout = 200 * time.Millisecond
	if o := tb.Call(ctx, ToolRun, `{"command":"sleep 30"}`); !o.IsError || !o.TimedOut || !strings.Contains(o.Output, "timed out") {
		t.Errorf("run past its timeout = %+v", o)
	}
}

func TestToolboxOffersOnlyItsTools(t *testing.T) {
	tb, _ := newBox(t, ToolReadFile)
	if o := tb.Call(context.Background(), ToolRun, `{"command":"true"}`); !o.IsError {
		t.Errorf("a tool not offered ran: %+v", o)
	}
	if got := len(tb.Defs()); got != 1 {
		t.Errorf("%d definitions, want 1", got)
	}
	if _, err := NewToolbox("", t.TempDir(), nil, []string{"bogus"}); err == nil {
		t.Error("NewToolbox accepted an unknown tool")
	}
	if _, err := NewToolbox(t.TempDir(), t.TempDir(), nil, nil); err == nil {
		t.Error("NewToolbox accepted a working directory outside its root")
	}
}

func TestOffered(t *testing.T) {
	if got := strings.Join(Offered(nil, []string{"run"}), ","); got != "read_file,write_file,edit_file,list_files" {
		t.Errorf("Offered(all, -run) = %s", got)
	}
	if got := strings.Join(Offered([]string{"run", "read_file"}, []string{"r*"}), ","); got != "" {
		t.Errorf("Offered(run read_file, -r*) = %q", got)
	}
}

// TestToolboxRefusesWhatWouldHangOrRunCode: a FIFO (which open would
// block on, past any cancel) is refused at once, and git's own files are
// not written: the worker's git reads them.
func TestToolboxRefusesWhatWouldHangOrRunCode(t *testing.T) {
	tb, _ := newBox(t)
	repo := filepath.Join(tb.rootDir, "repo")
	if err := syscall.Mkfifo(filepath.Join(repo, "pipe"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(repo, ".git"), []byte("gitdir: /somewhere\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	tests := []struct{ tool, args, want string }{
		{ToolReadFile, `{"path":"pipe"}`, "not a regular file"},
		{ToolWriteFile, `{"path":"pipe","content":"x"}`, "pipe"},
		{ToolEditFile, `{"path":"pipe","old_string":"a","new_string":"b"}`, "not a regular file"},
		{ToolWriteFile, `{"path":".git","content":"gitdir: ../out/evil\n"}`, "git's own files"},
		{ToolWriteFile, `{"path":"sub/.GIT/config","content":"[core]\n"}`, "git's own files"},
		{ToolEditFile, `{"path":".git","old_string":"somewhere","new_string":"evil"}`, "git's own files"},
	}
	for _, tt := range tests {
		done := make(chan Outcome, 1)
		go func() { done <- tb.Call(ctx, tt.tool, tt.args) }()
		select {
		case o := <-done:
			if !o.IsError || !strings.Contains(o.Output, tt.want) {
				t.Errorf("%s %s = %+v, want an error containing %q", tt.tool, tt.args, o, tt.want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s %s blocks", tt.tool, tt.args)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(repo, ".git")); string(b) != "gitdir: /somewhere\n" {
		t.Errorf(".git = %q: changed", b)
	}
	big := filepath.Join(repo, "big.txt")
	if err := os.WriteFile(big, make([]byte, MaxEditBytes+1), 0o644); err != nil {
		t.Fatal(err)
	}
	if o := tb.Call(ctx, ToolEditFile, `{"path":"big.txt","old_string":"a","new_string":"b"}`); !o.IsError || !strings.Contains(o.Output, "at most") {
		t.Errorf("edit of a file over the bound = %+v", o)
	}
}

// TestEveryToolIsDefined: the tools the definition files accept
// (schemas.ModelTools) are the ones the toolbox has.
func TestEveryToolIsDefined(t *testing.T) {
	for _, n := range ToolNames() {
		if _, ok := toolDefs[n]; !ok {
			t.Errorf("tool %s has no definition", n)
		}
	}
	if len(toolDefs) != len(ToolNames()) {
		t.Errorf("%d definitions for %d tools", len(toolDefs), len(ToolNames()))
	}
}
