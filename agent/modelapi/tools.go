package modelapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/loopbus/loopbus/agent"
	"github.com/loopbus/loopbus/schemas"
	"github.com/loopbus/loopbus/workspace/procrun"
)

// The tools a model may call (schemas.AgentSpec.Tools).
const (
	ToolReadFile  = "read_file"
	ToolWriteFile = "write_file"
	ToolEditFile  = "edit_file"
	ToolListFiles = "list_files"
	ToolRun       = "run"
)

// ToolNames returns every tool, in the order they are offered to a model
// (schemas.ModelTools).
func ToolNames() []string { return schemas.ModelTools() }

// Limits of what one tool call reads, lists or returns, so that a model's
// request cannot make the worker hold more than this.
const (
	// MaxReadBytes is the most read_file returns of a file.
	MaxReadBytes = 256 << 10
	// MaxEditBytes is the largest file edit_file changes.
	MaxEditBytes = 8 << 20
	// MaxListEntries is the most entries list_files returns.
	MaxListEntries = 1000
	// MaxRunOutput is how much of the end of a command's output run
	// returns.
	MaxRunOutput = 16 << 10
	// DefaultRunTimeout bounds one run call unless the Toolbox says
	// otherwise.
	DefaultRunTimeout = 10 * time.Minute
)

// ToolDef is a tool as a model is told of it: its name, what it does, and
// its arguments as a JSON Schema object.
type ToolDef struct {
	Name        string
	Description string
	Parameters  map[string]any
}

// Category returns the agent.Event category of a tool, which gives its
// default lane.
func Category(name string) string {
	switch name {
	case ToolReadFile, ToolListFiles:
		return "read"
	case ToolWriteFile, ToolEditFile:
		return "edit"
	case ToolRun:
		return "shell"
	}
	return "other"
}

// DefaultLanes are the tools' lanes unless a lane table says otherwise.
func DefaultLanes() map[string]string {
	return map[string]string{
		ToolReadFile: agent.LaneNoNet, ToolListFiles: agent.LaneNoNet,
		ToolWriteFile: agent.LaneNoNet, ToolEditFile: agent.LaneNoNet,
		ToolRun: agent.LaneHeavy,
	}
}

// PlannedTools returns the tools a spec's model may call: names, or all of
// them when names is empty.
func PlannedTools(names []string) []agent.Tool {
	if len(names) == 0 {
		names = ToolNames()
	}
	out := make([]agent.Tool, 0, len(names))
	for _, n := range names {
		out = append(out, agent.Tool{Name: n, Category: Category(n)})
	}
	return out
}

func object(required []string, props map[string]any) map[string]any {
	return map[string]any{"type": "object", "properties": props, "required": required}
}

func str(desc string) map[string]any { return map[string]any{"type": "string", "description": desc} }

var toolDefs = map[string]ToolDef{
	ToolReadFile: {ToolReadFile, "Read a text file. Paths are relative to the working directory.",
		object([]string{"path"}, map[string]any{"path": str("The file's path.")})},
	ToolWriteFile: {ToolWriteFile, "Create or overwrite a file with the given content; missing parent directories are created.",
		object([]string{"path", "content"}, map[string]any{"path": str("The file's path."), "content": str("The file's whole new content.")})},
	ToolEditFile: {ToolEditFile, "Replace one exact occurrence of old_string in a file with new_string. old_string must occur exactly once: include enough surrounding lines to make it unique.",
		object([]string{"path", "old_string", "new_string"}, map[string]any{"path": str("The file's path."),
			"old_string": str("The exact text to replace."), "new_string": str("The text to put in its place.")})},
	ToolListFiles: {ToolListFiles, "List the files under a directory, recursively (directories end in /; .git is skipped).",
		object([]string{"path"}, map[string]any{"path": str("The directory's path; . for the working directory.")})},
	ToolRun: {ToolRun, "Run a shell command (sh -c) in the working directory and return its exit code and the end of its output.",
		object([]string{"command"}, map[string]any{"command": str("The command line.")})},
}

// Toolbox runs a model's tool calls for one job. Every path a call names
// is taken relative to the job's working directory and must stay within
// the toolbox's root: an absolute path, one that climbs out with "..", or
// one that leaves through a symbolic link is refused as an error result
// the model sees, and nothing is done. A Toolbox is safe for concurrent
// calls (a model may ask for several in one turn).
type Toolbox struct {
	root *os.Root
	// rootDir is root's path; dir is the working directory, relative to
	// root ("." when they are the same).
	rootDir, dir string
	env          []string
	names        []string
	// RunTimeout bounds one run call; 0 means DefaultRunTimeout.
	RunTimeout time.Duration
}

// ErrUnknownTool is wrapped by NewToolbox's error for a tool name that is
// not one of ToolNames.
var ErrUnknownTool = errors.New("unknown tool")

// NewToolbox returns a toolbox for the tools names working in dir,
// confined to root ("" means dir; else dir must be root or below it). run
// commands get env as their whole environment. Close releases it.
func NewToolbox(root, dir string, env []string, names []string) (*Toolbox, error) {
	for _, n := range names {
		if _, ok := toolDefs[n]; !ok {
			return nil, fmt.Errorf("%w %q (tools: %s)", ErrUnknownTool, n, strings.Join(ToolNames(), ", "))
		}
	}
	if root == "" {
		root = dir
	}
	rel, err := filepath.Rel(root, dir)
	if err != nil || !filepath.IsLocal(rel) && rel != "." {
		return nil, fmt.Errorf("modelapi: working directory %s is not within %s", dir, root)
	}
	r, err := os.OpenRoot(root)
	if err != nil {
		return nil, fmt.Errorf("modelapi: %w", err)
	}
	return &Toolbox{root: r, rootDir: root, dir: filepath.ToSlash(rel), env: env, names: slices.Clone(names)}, nil
}

// Close releases the toolbox's hold on its root.
func (t *Toolbox) Close() error { return t.root.Close() }

// Defs returns the definitions of the toolbox's tools.
func (t *Toolbox) Defs() []ToolDef {
	out := make([]ToolDef, 0, len(t.names))
	for _, n := range t.names {
		out = append(out, toolDefs[n])
	}
	return out
}

// Outcome is what one tool call gave.
type Outcome struct {
	// Output is what the model is answered (the error's text when
	// IsError).
	Output  string
	IsError bool
	// ExitCode and TimedOut, for run: the command's exit status (-1 when
	// killed) and whether its time ran out.
	ExitCode int
	TimedOut bool
}

func failed(format string, args ...any) Outcome {
	return Outcome{Output: fmt.Sprintf(format, args...), IsError: true}
}

// Call runs the tool name with its arguments (a JSON object, as the model
// wrote it). A call the toolbox does not offer, malformed arguments and
// refused paths give an error outcome, never a Go error: the model is told
// and may try again.
func (t *Toolbox) Call(ctx context.Context, name, args string) Outcome {
	if !slices.Contains(t.names, name) {
		return failed("there is no tool %q; the tools are: %s", name, strings.Join(t.names, ", "))
	}
	var a struct {
		Path      *string `json:"path"`
		Content   *string `json:"content"`
		OldString *string `json:"old_string"`
		NewString *string `json:"new_string"`
		Command   *string `json:"command"`
	}
	if strings.TrimSpace(args) == "" {
		args = "{}"
	}
	if err := json.Unmarshal([]byte(args), &a); err != nil {
		return failed("the arguments are not a JSON object: %v", err)
	}
	var missing []string
	get := func(v *string, arg string) string {
		if v == nil {
			missing = append(missing, arg)
			return ""
		}
		return *v
	}
	switch name {
	case ToolReadFile:
		p := get(a.Path, "path")
		if len(missing) > 0 {
			break
		}
		return t.read(p)
	case ToolWriteFile:
		p, c := get(a.Path, "path"), get(a.Content, "content")
		if len(missing) > 0 {
			break
		}
		return t.write(p, c)
	case ToolEditFile:
		p, o, n := get(a.Path, "path"), get(a.OldString, "old_string"), get(a.NewString, "new_string")
		if len(missing) > 0 {
			break
		}
		return t.edit(p, o, n)
	case ToolListFiles:
		p := "."
		if a.Path != nil && *a.Path != "" {
			p = *a.Path
		}
		return t.list(p)
	case ToolRun:
		c := get(a.Command, "command")
		if len(missing) > 0 {
			break
		}
		return t.run(ctx, c)
	}
	return failed("missing argument(s): %s", strings.Join(missing, ", "))
}

// contained is Call with a panic turned into an error outcome: a tool runs
// on its own goroutine, where a panic would end the worker.
func (t *Toolbox) contained(ctx context.Context, name, args string) (o Outcome) {
	defer func() {
		if p := recover(); p != nil {
			o = failed("internal error in %s: %v", name, p)
		}
	}()
	return t.Call(ctx, name, args)
}

// ErrOutside is why a path is refused: it leads out of the working tree.
var ErrOutside = errors.New("outside the working directory")

// resolve returns p as a path within the root, or an error the model is
// told.
func (t *Toolbox) resolve(p string) (string, error) {
	if p == "" {
		return "", errors.New("empty path")
	}
	if strings.ContainsRune(p, 0) {
		return "", errors.New("a path may not contain a NUL byte")
	}
	if filepath.IsAbs(p) || strings.HasPrefix(p, "~") {
		return "", fmt.Errorf("%s: absolute paths are refused (%w): use a path relative to the working directory", p, ErrOutside)
	}
	joined := path.Join(t.dir, filepath.ToSlash(p))
	if !filepath.IsLocal(joined) && joined != "." {
		return "", fmt.Errorf("%s: %w", p, ErrOutside)
	}
	return filepath.FromSlash(joined), nil
}

// refused turns a failure of an os.Root operation into the model's error:
// a symbolic link out of the root is a refusal, like "..".
func (t *Toolbox) refused(p string, err error) Outcome {
	var pe *fs.PathError
	if errors.As(err, &pe) && strings.Contains(pe.Err.Error(), "escapes") {
		return failed("%s: %v (through a symbolic link)", p, ErrOutside)
	}
	if errors.Is(err, fs.ErrNotExist) {
		return failed("%s: no such file or directory", p)
	}
	return failed("%s: %v", p, unwrapPath(err))
}

// unwrapPath drops the absolute path an *fs.PathError carries: the model
// knows the path it gave.
func unwrapPath(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return fmt.Errorf("%s: %w", pe.Op, pe.Err)
	}
	return err
}

// open opens the regular file rp for reading (flag 0) or writing without
// blocking on a FIFO or a device, and refuses anything else.
func (t *Toolbox) open(p, rp string, flag int) (*os.File, os.FileInfo, *Outcome) {
	f, err := t.root.OpenFile(rp, flag|syscall.O_NONBLOCK, 0o644)
	if err != nil {
		o := t.refused(p, err)
		return nil, nil, &o
	}
	info, err := f.Stat()
	switch {
	case err != nil:
		o := t.refused(p, err)
		f.Close()
		return nil, nil, &o
	case info.IsDir():
		f.Close()
		o := failed("%s is a directory: use list_files", p)
		return nil, nil, &o
	case !info.Mode().IsRegular():
		f.Close()
		o := failed("%s is not a regular file", p)
		return nil, nil, &o
	}
	return f, info, nil
}

// gitDir reports whether rp is in a .git directory or is a .git file: the
// worker's git reads them, so the model may not change them.
func gitDir(rp string) bool {
	for _, c := range strings.Split(filepath.ToSlash(rp), "/") {
		if strings.EqualFold(c, ".git") {
			return true
		}
	}
	return false
}

func (t *Toolbox) read(p string) Outcome {
	rp, err := t.resolve(p)
	if err != nil {
		return failed("%v", err)
	}
	f, info, bad := t.open(p, rp, os.O_RDONLY)
	if bad != nil {
		return *bad
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, MaxReadBytes+1))
	if err != nil {
		return t.refused(p, err)
	}
	if bytes.IndexByte(b, 0) >= 0 {
		return failed("%s is a binary file (%d bytes)", p, info.Size())
	}
	if len(b) > MaxReadBytes {
		return Outcome{Output: fmt.Sprintf("%s\n[… cut: the file has %d bytes; read_file returns the first %d]", b[:MaxReadBytes], info.Size(), MaxReadBytes)}
	}
	return Outcome{Output: string(b)}
}

func (t *Toolbox) write(p, content string) Outcome {
	rp, err := t.resolve(p)
	if err != nil {
		return failed("%v", err)
	}
	if gitDir(rp) {
		return failed("%s: git's own files are not written with tools", p)
	}
	if dir := filepath.Dir(rp); dir != "." {
		if err := t.root.MkdirAll(dir, 0o755); err != nil {
			return t.refused(p, err)
		}
	}
	if bad := t.writeFile(p, rp, []byte(content)); bad != nil {
		return *bad
	}
	return Outcome{Output: fmt.Sprintf("wrote %s (%d bytes)", p, len(content))}
}

// writeFile replaces the content of the regular file rp (created when
// missing, keeping its mode when not).
func (t *Toolbox) writeFile(p, rp string, b []byte) *Outcome {
	f, _, bad := t.open(p, rp, os.O_WRONLY|os.O_CREATE)
	if bad != nil {
		return bad
	}
	err := f.Truncate(0)
	if err == nil {
		_, err = f.Write(b)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		o := t.refused(p, err)
		return &o
	}
	return nil
}

func (t *Toolbox) edit(p, old, repl string) Outcome {
	if old == "" {
		return failed("old_string is empty: to create a file use write_file")
	}
	rp, err := t.resolve(p)
	if err != nil {
		return failed("%v", err)
	}
	if gitDir(rp) {
		return failed("%s: git's own files are not edited with tools", p)
	}
	f, info, bad := t.open(p, rp, os.O_RDONLY)
	if bad != nil {
		return *bad
	}
	// Read once, within the bound, whatever the file became since.
	b, err := io.ReadAll(io.LimitReader(f, MaxEditBytes+1))
	f.Close()
	if err != nil {
		return t.refused(p, err)
	}
	if len(b) > MaxEditBytes {
		return failed("%s has over %d bytes (%d when looked at): edit_file changes files of at most %d; use run", p, MaxEditBytes, info.Size(), MaxEditBytes)
	}
	switch n := strings.Count(string(b), old); n {
	case 1:
	case 0:
		return failed("old_string does not occur in %s: read it and copy the text exactly", p)
	default:
		return failed("old_string occurs %d times in %s: include more of the surrounding text so that it occurs once", n, p)
	}
	if bad := t.writeFile(p, rp, []byte(strings.Replace(string(b), old, repl, 1))); bad != nil {
		return *bad
	}
	return Outcome{Output: fmt.Sprintf("edited %s", p)}
}

func (t *Toolbox) list(p string) Outcome {
	rp, err := t.resolve(p)
	if err != nil {
		return failed("%v", err)
	}
	sub, err := t.root.OpenRoot(rp)
	if err != nil {
		return t.refused(p, err)
	}
	defer sub.Close()
	var b strings.Builder
	n := 0
	errStop := errors.New("stop")
	err = fs.WalkDir(sub.FS(), ".", func(name string, d fs.DirEntry, err error) error {
		if err != nil {
			if name == "." {
				return err
			}
			return nil // unreadable: skipped
		}
		if name == "." {
			return nil
		}
		if d.IsDir() && d.Name() == ".git" {
			return fs.SkipDir
		}
		if n == MaxListEntries {
			return errStop
		}
		n++
		b.WriteString(name)
		if d.IsDir() {
			b.WriteByte('/')
		}
		b.WriteByte('\n')
		return nil
	})
	switch {
	case errors.Is(err, errStop):
		fmt.Fprintf(&b, "[… cut at %d entries: list a subdirectory]\n", MaxListEntries)
	case err != nil:
		return t.refused(p, err)
	case n == 0:
		return Outcome{Output: "(empty)"}
	}
	return Outcome{Output: b.String()}
}

func (t *Toolbox) run(ctx context.Context, command string) Outcome {
	if strings.TrimSpace(command) == "" {
		return failed("empty command")
	}
	timeout := t.RunTimeout
	if timeout == 0 {
		timeout = DefaultRunTimeout
	}
	res, err := procrun.Run(ctx, procrun.Spec{
		Argv:      []string{"/bin/sh", "-c", command},
		Dir:       filepath.Join(t.rootDir, filepath.FromSlash(t.dir)),
		Env:       t.env,
		Timeout:   timeout,
		TailBytes: MaxRunOutput,
	})
	if err != nil {
		return Outcome{Output: "cannot run the command: " + err.Error(), IsError: true, ExitCode: -1}
	}
	var b strings.Builder
	switch {
	case res.TimedOut:
		fmt.Fprintf(&b, "timed out after %s and was killed\n", timeout)
	case res.Canceled:
		b.WriteString("cancelled\n")
	default:
		fmt.Fprintf(&b, "exit code %d\n", res.ExitCode)
	}
	b.WriteString(res.Tail)
	return Outcome{Output: b.String(), IsError: res.ExitCode != 0 || res.TimedOut, ExitCode: res.ExitCode, TimedOut: res.TimedOut}
}

// summary is the tool.started input summary of a call: the arguments,
// except write_file's content, which is only counted.
func summary(name, args string) string {
	if name != ToolWriteFile {
		return agent.Truncate(args)
	}
	var a struct {
		Path    string `json:"path"`
		Content string `json:"content"`
	}
	if json.Unmarshal([]byte(args), &a) != nil {
		return agent.Truncate(args)
	}
	return agent.Truncate(fmt.Sprintf(`{"path":%q,"content":"(%d bytes)"}`, a.Path, len(a.Content)))
}
