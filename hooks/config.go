package hooks

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/loopbus/loopbus/definition/yamlread"
	"github.com/loopbus/loopbus/schemas"
	"github.com/loopbus/loopbus/workspace"
)

// Defaults of a hooks file.
const (
	DefaultRunner  = "hooks"
	DefaultTimeout = time.Minute
)

// Where a new runner starts.
const (
	// StartNew: only events stored after the runner's consumer is created.
	StartNew = "new"
	// StartAll: every event in the stream.
	StartAll = "all"
)

// Config is a hook runner: the content of a hooks file plus how the
// runner runs.
type Config struct {
	// File names the hooks file in messages.
	File string
	// Runner names the runner: its durable consumer is hooks-<Runner>, and
	// its outcomes carry it. Empty means DefaultRunner.
	Runner string
	// Start is StartNew (empty means the same) or StartAll. It applies
	// when the runner's consumer is first created; JetStream refuses to
	// change it later (use another runner name).
	Start string
	// Hooks in file order: for one event, matching hooks run in this order.
	Hooks []Hook
	// Env is the base environment of hook commands; nil means this
	// process's, without its LOOPBUS_* settings (see workspace.BaseEnv).
	Env []string
	// AckWait is how long an event whose runner went silent (crashed) stays
	// unacknowledged before it is delivered again; 0 means 30s.
	AckWait time.Duration
	// OnRun, if set, is called once per hook and event, after the outcome
	// is published (or found already published: Run.Skipped), from the
	// runner's one goroutine.
	OnRun func(Run)
	// OnReady, if set, is called once the runner's durable consumer exists:
	// with start new, events stored from then on run hooks.
	OnReady func()
}

// Hook is one command run for matching events.
type Hook struct {
	// Name is unique in the file and subject-safe (as a session id).
	Name string
	// Types are event type patterns (loopbus.<entity>.<verb>, * matching
	// any one part). An event matches when its type matches one of Types
	// or its subject matches one of Subjects.
	Types []string
	// Subjects are NATS subject filters on the event stream (wildcards *
	// and >).
	Subjects []string
	// Sessions, when set, restricts the hook to these sessions.
	Sessions []string
	// Command is the argv run, never through a shell. A relative program
	// with a slash is resolved against the hooks file's directory; one
	// without is looked up in PATH.
	Command []string
	// Dir is the command's working directory; empty means the hooks
	// file's directory (the current directory without a file).
	Dir string
	// Timeout bounds a run; 0 means DefaultTimeout.
	Timeout time.Duration
	// Env is added to the command's environment.
	Env map[string]string
	// SecretEnv names variables whose values are masked in the output tail
	// the outcome carries, besides those whose names look secret (see
	// workspace.LooksSecret).
	SecretEnv []string
	// Line is the hook's line in the hooks file; 0 when unknown.
	Line int
}

// Run reports one hook run (or skip) to Config.OnRun.
type Run struct {
	// Event triggered the hook.
	Event schemas.Event
	// Type is schemas.TypeHookCompleted or TypeHookFailed.
	Type string
	// Result is the outcome's data.
	Result schemas.HookRun
	// Skipped: the outcome was already in the stream (published before a
	// restart), so the command did not run again.
	Skipped bool
}

// Durable returns the name of the runner's durable consumer.
func (c Config) Durable() string { return "hooks-" + c.runner() }

func (c Config) runner() string {
	if c.Runner == "" {
		return DefaultRunner
	}
	return c.Runner
}

// ErrInvalid is wrapped by every problem of a hooks file or Config.
var ErrInvalid = errors.New("invalid hooks")

// invalid gives hooks problems their own Error type wrapping ErrInvalid.
type invalid struct{}

// Sentinel implements yamlread.Sentinel.
func (invalid) Sentinel() error { return ErrInvalid }

// Error is one problem of a hooks file: File, Line and Column (1-based, 0
// when unknown), Field (the dotted path of the offending field, such as
// "hooks[1].timeout"; empty for problems of no field), Msg, and Err (the
// cause when there is one, else nil). Its Error method formats it as
// "FILE:LINE: FIELD: MSG", leaving out what is unknown; it unwraps to
// ErrInvalid and Err.
type Error = yamlread.Error[invalid]

// Errors is every problem of one hooks file, in file order; its Error
// method returns them one per line.
type Errors = yamlread.Errors[invalid]

// loader holds the state of one Parse call: the reader of the file (which
// refuses merge keys, reports duplicate keys and collects the problems)
// and the directory relative paths resolve against.
type loader struct {
	yamlread.Reader[invalid]
	dir string
}

// Load reads the hooks file at path; see Parse. An error reading the file
// is returned as is (it does not wrap ErrInvalid).
func Load(path string) (Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("read hooks file: %w", err)
	}
	return Parse(path, data, filepath.Dir(path))
}

// topKeys and hookKeys are the keys of a hooks file and of one hook.
func topKeys() []string { return []string{"runner", "start", "hooks"} }

func hookKeys() []string {
	return []string{"name", "types", "subjects", "sessions", "command", "dir", "timeout", "env", "secret_env"}
}

// Parse validates the hooks document data and returns its Config with
// defaults applied (runner "hooks", start new, timeout 1m), each command's
// relative program (with a slash) and other arguments naming existing files
// made absolute against dir, and each hook's Dir made absolute (default
// dir). name is used in messages. Every problem is reported, each with the
// file, line and field, as a non-empty Errors wrapping ErrInvalid; the
// Config is then zero.
func Parse(name string, data []byte, dir string) (Config, error) {
	absDir, err := filepath.Abs(dir)
	if err != nil {
		return Config{}, err
	}
	l := &loader{dir: absDir}
	l.File = name
	l.Empty = "file is empty: want a mapping with a hooks list"
	l.NoMerge = "merge keys are not supported in hooks files"
	l.Duplicates = true
	l.RawKeys = true
	cfg := l.parse(data)
	if err := l.Err(); err != nil {
		return Config{}, err
	}
	cfg.File = name
	return cfg, nil
}

func (l *loader) parse(data []byte) Config {
	var cfg Config
	body, ok := l.Document(data)
	if !ok {
		return cfg
	}
	top, ok := l.Mapping(l.Resolve(body), yamlread.Pos{}, "", topKeys())
	if !ok {
		return cfg
	}
	cfg.Runner, cfg.Start = DefaultRunner, StartNew
	if e, ok := top.Get("runner"); ok {
		if s, ok := l.Str(e); ok {
			if err := checkToken(s); err != nil {
				l.Errorf(e.ValPos, e.Field, "runner %q %v", s, err)
			}
			cfg.Runner = s
		}
	}
	if e, ok := top.Get("start"); ok {
		if s, ok := l.Str(e); ok {
			if s != StartNew && s != StartAll {
				l.Errorf(e.ValPos, e.Field, "%q: want new (events stored after the runner is first started) or all (the whole stream)", s)
			}
			cfg.Start = s
		}
	}
	e, ok := top.Get("hooks")
	if !ok {
		l.Errorf(top.Pos, "hooks", "required: a list of hooks, each with a name, types or subjects, and a command")
		return cfg
	}
	items, ok := l.Items(e, "[{name: notify, types: [loopbus.session.completed], command: [./notify.sh]}]")
	if !ok {
		return cfg
	}
	if len(items) == 0 {
		l.Errorf(e.ValPos, e.Field, "must not be empty")
	}
	seen := map[string]bool{}
	for _, it := range items {
		h, ok := l.hook(it)
		if !ok {
			continue
		}
		if seen[h.Name] {
			l.Errorf(yamlread.Pos{Line: h.Line}, it.Field+".name", "duplicate hook name %q", h.Name)
		}
		seen[h.Name] = true
		cfg.Hooks = append(cfg.Hooks, h)
	}
	return cfg
}

// hook decodes one element of hooks.
func (l *loader) hook(it yamlread.Entry) (Hook, bool) {
	m, ok := l.Mapping(it.Val, it.ValPos, it.Field, hookKeys())
	if !ok {
		return Hook{}, false
	}
	h := Hook{Line: m.Pos.Line, Timeout: DefaultTimeout, Dir: l.dir}
	n := len(l.Errs)
	if e, ok := m.Get("name"); !ok {
		l.Errorf(m.Pos, yamlread.Join(it.Field, "name"), "required")
	} else if s, ok := l.Str(e); ok {
		if err := checkToken(s); err != nil {
			l.Errorf(e.ValPos, e.Field, "hook name %q %v", s, err)
		}
		h.Name = s
	}
	check := func(key, example string, fn func(string) error) []string {
		e, ok := m.Get(key)
		if !ok {
			return nil
		}
		list, items, ok := l.Strings(e, example)
		if !ok {
			return nil
		}
		if len(list) == 0 {
			l.Errorf(e.ValPos, e.Field, "must not be empty (leave the key out instead)")
		}
		for i, s := range list {
			if err := fn(s); err != nil {
				l.Errorf(items[i].ValPos, items[i].Field, "%w", err)
			}
		}
		return list
	}
	h.Types = check("types", "[loopbus.session.completed, \"loopbus.task.*\"]", checkType)
	h.Subjects = check("subjects", "[\"loopbus.evt.*.task.>\"]", checkSubject)
	h.Sessions = check("sessions", "[demo-1]", schemas.ValidateSessionID)
	h.SecretEnv = check("secret_env", "[WEBHOOK_URL]", workspace.ValidateSecretName)
	if len(h.Types) == 0 && len(h.Subjects) == 0 && !m.Has("types") && !m.Has("subjects") {
		l.Errorf(m.Pos, it.Field, "want types or subjects (or both): which events run the hook")
	}
	if e, ok := m.Get("command"); !ok {
		l.Errorf(m.Pos, yamlread.Join(it.Field, "command"), "required: the argv to run, such as [./notify.sh]")
	} else {
		h.Command = l.argv(e)
	}
	if e, ok := m.Get("dir"); ok {
		if s, ok := l.Str(e); ok {
			d := s
			if !filepath.IsAbs(d) {
				d = filepath.Join(l.dir, d)
			}
			if fi, err := os.Stat(d); err != nil || !fi.IsDir() {
				l.Errorf(e.ValPos, e.Field, "%q is not a directory", s)
			}
			h.Dir = d
		}
	}
	if e, ok := m.Get("timeout"); ok {
		if s, ok := l.Str(e); ok {
			d, err := time.ParseDuration(s)
			if err != nil || d <= 0 {
				l.Errorf(e.ValPos, e.Field, "%q: want a positive duration such as 30s or 5m", s)
			}
			h.Timeout = d
		}
	}
	if e, ok := m.Get("env"); ok {
		h.Env = l.env(e)
	}
	return h, len(l.Errs) == n
}

// argv decodes a command: a non-empty list of strings, the first not
// empty. A relative first element with a slash, and any other element
// naming an existing regular file in the hooks file's directory, are made
// absolute against it; a first element with a slash must be an executable
// file.
func (l *loader) argv(e yamlread.Entry) []string {
	if _, isStr := yamlread.Scalar(e.Val); isStr {
		l.Errorf(e.ValPos, e.Field, "want an argv list, not a string: write [sh, -c, \"...\"] to run a shell command")
		return nil
	}
	argv, items, ok := l.Strings(e, "[./notify.sh]")
	if !ok {
		return nil
	}
	if len(argv) == 0 {
		l.Errorf(e.ValPos, e.Field, "must not be empty")
		return nil
	}
	if argv[0] == "" {
		l.Errorf(items[0].ValPos, items[0].Field, "program must not be empty")
		return nil
	}
	prog := argv[0]
	for i, arg := range argv {
		if arg == "" || filepath.IsAbs(arg) {
			continue
		}
		path := filepath.Join(l.dir, arg)
		if i == 0 {
			if strings.Contains(arg, "/") {
				argv[0] = path
			}
			continue
		}
		if fi, err := os.Stat(path); err == nil && fi.Mode().IsRegular() {
			argv[i] = path
		}
	}
	if strings.Contains(argv[0], "/") {
		fi, err := os.Stat(argv[0])
		switch {
		case err != nil:
			l.Errorf(items[0].ValPos, items[0].Field, "program %s: %v", argv[0], errors.Unwrap(err))
		case !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0:
			l.Errorf(items[0].ValPos, items[0].Field, "program %s is not an executable file (chmod +x it, or write [sh, %s, ...])", argv[0], prog)
		}
	}
	return argv
}

// env decodes a mapping of environment variables.
func (l *loader) env(e yamlread.Entry) map[string]string {
	m, ok := l.Mapping(e.Val, e.ValPos, e.Field, nil)
	if !ok {
		return nil
	}
	out := map[string]string{}
	for _, kv := range m.Entries {
		if err := checkEnvName(kv.Key); err != nil {
			l.Errorf(kv.KeyPos, kv.Field, "%v", err)
			continue
		}
		if kv.Val == nil {
			out[kv.Key] = ""
			continue
		}
		if s, ok := l.Str(kv); ok {
			out[kv.Key] = s
		}
	}
	return out
}

// checkToken applies the session-id rules (1 to 64 characters from A-Z,
// a-z, 0-9, _ and -) to runner and hook names: they become parts of
// consumer names and event ids.
func checkToken(s string) error {
	if err := schemas.ValidateSessionID(s); err != nil {
		_, why, _ := strings.Cut(err.Error(), ": ")
		return errors.New(why)
	}
	return nil
}

// checkEnvName accepts environment variable names other than loopbus's own
// LOOPBUS_* (which the runner sets).
func checkEnvName(name string) error {
	if name == "" {
		return errors.New("variable name must not be empty")
	}
	for i, c := range name {
		if !(c == '_' || c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || i > 0 && c >= '0' && c <= '9') {
			return fmt.Errorf("%q is not a variable name: want letters, digits and _, not starting with a digit", name)
		}
	}
	if strings.HasPrefix(name, "LOOPBUS_") {
		return fmt.Errorf("%q: LOOPBUS_* variables are set by the hook runner", name)
	}
	return nil
}

// Validate reports the first invalid value of c, wrapping ErrInvalid: what
// Parse checks, for a Config built in code.
func (c Config) Validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, a...))
	}
	if c.Runner != "" {
		if err := checkToken(c.Runner); err != nil {
			return bad("runner %q %v", c.Runner, err)
		}
	}
	if c.Start != "" && c.Start != StartNew && c.Start != StartAll {
		return bad("start %q: want new or all", c.Start)
	}
	if c.AckWait < 0 {
		return bad("negative ack wait")
	}
	if len(c.Hooks) == 0 {
		return bad("no hooks")
	}
	seen := map[string]bool{}
	for i, h := range c.Hooks {
		if err := h.validate(); err != nil {
			return bad("hooks[%d]: %v", i, err)
		}
		if seen[h.Name] {
			return bad("hooks[%d]: duplicate hook name %q", i, h.Name)
		}
		seen[h.Name] = true
	}
	return nil
}

func (h Hook) validate() error {
	if err := checkToken(h.Name); err != nil {
		return fmt.Errorf("name %q %v", h.Name, err)
	}
	if len(h.Types) == 0 && len(h.Subjects) == 0 {
		return fmt.Errorf("%s: want types or subjects", h.Name)
	}
	for _, chk := range []struct {
		list []string
		fn   func(string) error
	}{{h.Types, checkType}, {h.Subjects, checkSubject}, {h.Sessions, schemas.ValidateSessionID}, {h.SecretEnv, workspace.ValidateSecretName}} {
		for _, s := range chk.list {
			if err := chk.fn(s); err != nil {
				return fmt.Errorf("%s: %w", h.Name, err)
			}
		}
	}
	if len(h.Command) == 0 || h.Command[0] == "" {
		return fmt.Errorf("%s: empty command", h.Name)
	}
	if h.Timeout < 0 {
		return fmt.Errorf("%s: negative timeout", h.Name)
	}
	for k := range h.Env {
		if err := checkEnvName(k); err != nil {
			return fmt.Errorf("%s: env: %w", h.Name, err)
		}
	}
	return nil
}
