// Package workspace lays out the per-job directory an agent or validation
// command runs in, fetches its inputs, builds its environment and reads its
// outputs without following links out of it.
package workspace

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/loopbus/loopbus/schemas"
	"github.com/loopbus/loopbus/workspace/procrun"
)

// ErrUnsafeOutput: an output is missing, a link, not a regular file, or too
// large. The message says which and what to do.
var ErrUnsafeOutput = errors.New("unusable output")

// Fetcher writes an artifact's bytes to w, checking its digest.
type Fetcher interface {
	GetArtifact(ctx context.Context, ref schemas.ArtifactRef, w io.Writer) error
}

// Workspace is one job's directory: Root with In/ (inputs), Out/ (outputs),
// the prompt file and the feedback file.
type Workspace struct {
	Root, In, Out, PromptFile, FeedbackFile string

	pool *Pool        // nil: Remove deletes it
	id   fileID       // Root's identity, for pool
	mark procrun.Mark // processes before it was handed out, for pool
}

// Create makes a new, empty workspace directly under base (made if
// missing), named session.name-RANDOM: session ids hold no dot, so the
// name is unambiguous and never one of base's other entries (the repository
// cache, repos/). Nothing per session is left behind once the workspace is
// removed. Create never reuses or removes an existing directory: workers
// on one machine (or ones serving different streams that happen to use the
// same session id) cannot touch each other's workspaces (a Pool reuses
// only those it made itself). session and name must be safe tokens.
func Create(base, session, name string) (*Workspace, error) {
	if err := checkNames(session, name); err != nil {
		return nil, err
	}
	abs, err := filepath.Abs(base)
	if err != nil {
		return nil, fmt.Errorf("workspace: %w", err)
	}
	return create(abs, session+"."+name+"-")
}

// create makes a new workspace named prefix+RANDOM under the absolute
// directory base (made if missing).
func create(base, prefix string) (*Workspace, error) {
	// base exists but for the first job: it is made only when missing,
	// not looked up for every job.
	root, err := os.MkdirTemp(base, prefix)
	if errors.Is(err, os.ErrNotExist) {
		if err = os.MkdirAll(base, 0o700); err == nil {
			root, err = os.MkdirTemp(base, prefix)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("workspace: %w", err)
	}
	w := layout(root)
	for _, d := range []string{w.In, w.Out} {
		if err := os.Mkdir(d, 0o700); err != nil {
			_ = os.RemoveAll(root)
			return nil, fmt.Errorf("workspace: %w", err)
		}
	}
	return w, nil
}

// layout names the parts of the workspace at root.
func layout(root string) *Workspace {
	return &Workspace{
		Root: root, In: filepath.Join(root, "in"), Out: filepath.Join(root, "out"),
		PromptFile: filepath.Join(root, "prompt.md"), FeedbackFile: filepath.Join(root, "feedback.md"),
	}
}

// Remove deletes the workspace, or, for one of a Pool, empties it and
// gives it back to the pool.
func (w *Workspace) Remove() error {
	if w.pool != nil {
		if kept, err := w.pool.put(w); kept {
			return err
		}
	}
	return os.RemoveAll(w.Root)
}

// Fetch writes each artifact into dir under its own name. Every name is
// validated before anything is fetched, so nothing lands outside dir and a
// request with one bad name fetches nothing.
func (w *Workspace) Fetch(ctx context.Context, f Fetcher, refs []schemas.ArtifactRef, dir string) error {
	for _, r := range refs {
		if err := schemas.ValidateName(r.Name); err != nil {
			return err
		}
	}
	for _, r := range refs {
		if err := fetch(ctx, f, r, filepath.Join(dir, r.Name), 0o600); err != nil {
			return err
		}
	}
	return nil
}

// fetch writes ref's bytes to path, made with mode (or truncated: a later
// input of the same name wins), never through a link. The workspace is
// new or emptied (see Pool) and nothing of its job runs in it yet, so the
// file is written in place, not renamed into place; a failed fetch
// removes it, and the job fails before anything reads it.
func fetch(ctx context.Context, f Fetcher, ref schemas.ArtifactRef, path string, mode os.FileMode) error {
	file, err := createOwn(path, mode)
	if err != nil {
		return fmt.Errorf("workspace: %w", err)
	}
	err = f.GetArtifact(ctx, ref, file)
	if cerr := file.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("workspace: %w", cerr)
	}
	if err != nil {
		_ = os.Remove(path)
	}
	return err
}

// WriteFiles writes a request's inline files to in/, never through a
// link. Every name is validated before anything is written.
func (w *Workspace) WriteFiles(files []schemas.InlineFile) error {
	for _, f := range files {
		if err := schemas.ValidateName(f.Name); err != nil {
			return fmt.Errorf("inline file: %w", err)
		}
	}
	for _, f := range files {
		if err := writeFile(filepath.Join(w.In, f.Name), f.Content); err != nil {
			return fmt.Errorf("workspace: %w", err)
		}
	}
	return nil
}

// FetchDefinition writes the session's definition files (the scripts its
// commands name) under the workspace's definition/ directory and returns a
// function mapping a command's argv to one that runs those copies: every
// argument equal to dir joined with a file's Path is replaced by the local
// copy's path. Every path is validated before anything is fetched.
func (w *Workspace) FetchDefinition(ctx context.Context, f Fetcher, dir string, files []schemas.DefinitionFile) (func([]string) []string, error) {
	for _, df := range files {
		if err := schemas.ValidateDefinitionPath(df.Path); err != nil {
			return nil, err
		}
	}
	local := map[string]string{}
	for _, df := range files {
		path := filepath.Join(w.Root, "definition", filepath.FromSlash(df.Path))
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			return nil, fmt.Errorf("workspace: %w", err)
		}
		mode := os.FileMode(0o600)
		if df.Executable {
			mode = 0o700
		}
		if err := fetch(ctx, f, df.Artifact, path, mode); err != nil {
			return nil, err
		}
		// The mode whatever the umask took away.
		if err := os.Chmod(path, mode); err != nil {
			return nil, fmt.Errorf("workspace: %w", err)
		}
		local[filepath.Join(dir, filepath.FromSlash(df.Path))] = path
	}
	return func(argv []string) []string {
		out := make([]string, len(argv))
		for i, a := range argv {
			if l, ok := local[a]; ok && dir != "" {
				a = l
			}
			out[i] = a
		}
		return out
	}, nil
}

// WriteText writes the prompt and feedback files.
func (w *Workspace) WriteText(prompt, feedback string) error {
	err := writeFile(w.PromptFile, prompt)
	if err == nil {
		err = writeFile(w.FeedbackFile, feedback)
	}
	if err != nil {
		return fmt.Errorf("workspace: %w", err)
	}
	return nil
}

// writeFile writes content to path (see createOwn).
func writeFile(path, content string) error {
	f, err := createOwn(path, 0o600)
	if err != nil {
		return err
	}
	_, err = f.WriteString(content)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// createOwn opens path for writing, empty: a new file made with mode, or an
// existing one (a later input of the same name, or a file a Pool kept)
// truncated, but only if it is a regular file with no other name. A
// link, as path's last element or as a second name of someone else's
// file, is refused, never written through.
func createOwn(path string, mode os.FileMode) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, mode)
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err == nil && !ownFile(fi) {
		err = fmt.Errorf("%s is not a file of the workspace's own", path)
	}
	if err == nil && fi.Size() > 0 {
		err = f.Truncate(0)
	}
	if err != nil {
		_ = f.Close()
		return nil, err
	}
	return f, nil
}

// BaseEnv returns this process's environment without its own LOOPBUS_*
// settings (NATS URL, credentials, data directory): agents and validation
// commands get the job's LOOPBUS_* variables, never the service's.
func BaseEnv() []string {
	var out []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "LOOPBUS_") {
			out = append(out, kv)
		}
	}
	return out
}

// Vars identify the job in the environment.
type Vars struct {
	Session, Step, Job string
	Iteration          int
}

// Env returns base plus the LOOPBUS_* variables of the contract and extra
// (later entries win).
func (w *Workspace) Env(base []string, v Vars, extra map[string]string) []string {
	env := append([]string{}, base...)
	env = append(env,
		"LOOPBUS_SESSION="+v.Session,
		"LOOPBUS_STEP="+v.Step,
		"LOOPBUS_JOB="+v.Job,
		"LOOPBUS_ITERATION="+strconv.Itoa(v.Iteration),
		"LOOPBUS_WORKSPACE="+w.Root,
		"LOOPBUS_INPUT_DIR="+w.In,
		"LOOPBUS_OUTPUT_DIR="+w.Out,
		"LOOPBUS_PROMPT_FILE="+w.PromptFile,
		"LOOPBUS_FEEDBACK_FILE="+w.FeedbackFile,
	)
	for k, val := range extra {
		env = append(env, k+"="+val)
	}
	return env
}

// OpenOutput opens out/<name> for reading if it is a regular file of at
// most maxBytes, refusing symbolic links (also as the final path element,
// via O_NOFOLLOW) so an agent cannot make loopbus read outside its
// workspace. Errors wrap ErrUnsafeOutput or schemas.ErrBadName.
func (w *Workspace) OpenOutput(name string, maxBytes int64) (*os.File, int64, error) {
	if err := schemas.ValidateName(name); err != nil {
		return nil, 0, err
	}
	// Resolve inside an os.Root: even if the agent replaced out/ (or a
	// parent) with a link, nothing outside the workspace can be opened.
	root, err := os.OpenRoot(w.Root)
	if err != nil {
		return nil, 0, fmt.Errorf("%w: workspace: %v", ErrUnsafeOutput, err)
	}
	defer root.Close()
	if di, err := root.Lstat("out"); err != nil || !di.IsDir() {
		return nil, 0, fmt.Errorf("%w: the output directory out/ was removed or replaced (by a link?); write outputs into it", ErrUnsafeOutput)
	}
	p := filepath.Join("out", name)
	fi, err := root.Lstat(p)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil, 0, fmt.Errorf("%w: missing output %s: the agent must write it to $LOOPBUS_OUTPUT_DIR/%s (out/%s in its working directory)", ErrUnsafeOutput, name, name, name)
	case err != nil:
		return nil, 0, fmt.Errorf("%w: output %s: %v", ErrUnsafeOutput, name, err)
	case fi.Mode()&os.ModeSymlink != 0:
		return nil, 0, fmt.Errorf("%w: output %s is a symbolic link; write the file itself", ErrUnsafeOutput, name)
	case !fi.Mode().IsRegular():
		return nil, 0, fmt.Errorf("%w: output %s is not a regular file", ErrUnsafeOutput, name)
	case fi.Size() > maxBytes:
		return nil, 0, fmt.Errorf("%w: output %s is %d bytes, over the %d-byte limit", ErrUnsafeOutput, name, fi.Size(), maxBytes)
	}
	f, err := root.OpenFile(p, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return nil, 0, fmt.Errorf("%w: output %s: %v", ErrUnsafeOutput, name, err)
	}
	// Check what was opened, not the path, which may have changed since.
	if fi, err = f.Stat(); err != nil || !fi.Mode().IsRegular() || fi.Size() > maxBytes {
		_ = f.Close()
		return nil, 0, fmt.Errorf("%w: output %s changed while it was being read", ErrUnsafeOutput, name)
	}
	return f, fi.Size(), nil
}
