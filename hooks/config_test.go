package hooks

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// hooksDir returns a directory holding an executable notify.sh and a
// plain (not executable) plain.sh.
func hooksDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "notify.sh"), []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "plain.sh"), []byte("exit 0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "work"), 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestParse(t *testing.T) {
	dir := hooksDir(t)
	doc := `runner: notify
start: all
hooks:
  - name: chat
    types: [loopbus.task.updated, "loopbus.session.*"]
    subjects: ["loopbus.evt.*.task.>"]
    sessions: [demo-1]
    command: [./notify.sh, --verbose, plain.sh]
    timeout: 30s
    env: {CHANNEL: builds, EMPTY: }
    secret_env: [WEBHOOK_URL]
  - name: log
    subjects: ["loopbus.evt.>"]
    command: [sh, -c, 'echo "$LOOPBUS_EVENT_TYPE"']
    dir: work
`
	got, err := Parse("hooks.yaml", []byte(doc), dir)
	if err != nil {
		t.Fatal(err)
	}
	want := Config{
		File: "hooks.yaml", Runner: "notify", Start: StartAll,
		Hooks: []Hook{{
			Name:      "chat",
			Types:     []string{"loopbus.task.updated", "loopbus.session.*"},
			Subjects:  []string{"loopbus.evt.*.task.>"},
			Sessions:  []string{"demo-1"},
			Command:   []string{filepath.Join(dir, "notify.sh"), "--verbose", filepath.Join(dir, "plain.sh")},
			Dir:       dir,
			Timeout:   30 * time.Second,
			Env:       map[string]string{"CHANNEL": "builds", "EMPTY": ""},
			SecretEnv: []string{"WEBHOOK_URL"},
			Line:      4,
		}, {
			Name:     "log",
			Subjects: []string{"loopbus.evt.>"},
			Command:  []string{"sh", "-c", `echo "$LOOPBUS_EVENT_TYPE"`},
			Dir:      filepath.Join(dir, "work"),
			Timeout:  DefaultTimeout,
			Line:     12,
		}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Parse =\n%+v\nwant\n%+v", got, want)
	}
	if err := got.Validate(); err != nil {
		t.Errorf("a parsed config does not validate: %v", err)
	}
	if d := got.Durable(); d != "hooks-notify" {
		t.Errorf("Durable() = %q, want hooks-notify", d)
	}
}

func TestParseDefaults(t *testing.T) {
	dir := hooksDir(t)
	got, err := Parse("h.yaml", []byte("hooks:\n  - {name: a, types: [loopbus.session.completed], command: [true]}\n"), dir)
	if err != nil {
		t.Fatal(err)
	}
	if got.Runner != DefaultRunner || got.Start != StartNew || got.Hooks[0].Timeout != time.Minute || got.Hooks[0].Dir != dir {
		t.Errorf("defaults: runner %q start %q timeout %s dir %q", got.Runner, got.Start, got.Hooks[0].Timeout, got.Hooks[0].Dir)
	}
	if d := got.Durable(); d != "hooks-hooks" {
		t.Errorf("Durable() = %q, want hooks-hooks", d)
	}
}

func TestParseErrors(t *testing.T) {
	dir := hooksDir(t)
	tests := []struct {
		name string
		doc  string
		// want lists every problem, as printed, in order.
		want []string
	}{
		{"empty", "", []string{"h.yaml: file is empty"}},
		{"syntax", "hooks: [\n", []string{"h.yaml:1: YAML syntax error"}},
		{"not a mapping", "- a\n", []string{"h.yaml:1: want a mapping with keys runner, start, hooks, got a list"}},
		{"no hooks", "runner: x\n", []string{"h.yaml:1: hooks: required"}},
		{"hooks empty", "hooks: []\n", []string{"h.yaml:1: hooks: must not be empty"}},
		{"hooks not a list", "hooks: {a: b}\n", []string{"h.yaml:1: hooks: want a list such as"}},
		{"unknown top key", "hook: []\nhooks: [{name: a, types: [loopbus.task.added], command: [true]}]\n",
			[]string{`h.yaml:1: hook: unknown key "hook" (allowed: runner, start, hooks)`}},
		{"bad runner", "runner: a.b\nhooks: [{name: a, types: [loopbus.task.added], command: [true]}]\n",
			[]string{`h.yaml:1: runner: runner "a.b" character '.' not allowed`}},
		{"bad start", "start: first\nhooks: [{name: a, types: [loopbus.task.added], command: [true]}]\n",
			[]string{`h.yaml:1: start: "first": want new`}},
		{"hook fields", `hooks:
  - name: ok
    types: [loopbus.task.added]
    command: [true]
  - name: bad name
    types: [loopbus.task, loopbus.hook.completed]
    subjects: [other.>]
    sessions: [a/b]
    command: [./missing.sh]
    timeout: soon
    env: {LOOPBUS_X: y, 1A: b}
    secret_env: [LOOPBUS_TOKEN]
    dir: nowhere
    colour: red
`, []string{
			`h.yaml:5: hooks[1].name: hook name "bad name" character ' ' not allowed`,
			`h.yaml:6: hooks[1].types[0]: "loopbus.task" is not an event type`,
			`h.yaml:6: hooks[1].types[1]: "loopbus.hook.completed": hook.* events never trigger hooks`,
			`h.yaml:7: hooks[1].subjects[0]: subject filter "other.>" is not under loopbus.evt.>`,
			`h.yaml:8: hooks[1].sessions[0]: invalid session id "a/b"`,
			`h.yaml:9: hooks[1].command[0]: program ` + filepath.Join(dir, "missing.sh") + `: no such file or directory`,
			`h.yaml:10: hooks[1].timeout: "soon": want a positive duration`,
			`h.yaml:11: hooks[1].env.LOOPBUS_X: "LOOPBUS_X": LOOPBUS_* variables are set by the hook runner`,
			`h.yaml:11: hooks[1].env.1A: "1A" is not a variable name`,
			`h.yaml:12: hooks[1].secret_env[0]: invalid secret variable name "LOOPBUS_TOKEN"`,
			`h.yaml:13: hooks[1].dir: "nowhere" is not a directory`,
			`h.yaml:14: hooks[1].colour: unknown key "colour"`,
		}},
		{"missing name, filters and command", "hooks:\n  - timeout: 1s\n", []string{
			"h.yaml:2: hooks[0].name: required",
			"h.yaml:2: hooks[0]: want types or subjects",
			"h.yaml:2: hooks[0].command: required",
		}},
		{"command as a string", "hooks:\n  - {name: a, types: [loopbus.task.added], command: ./notify.sh}\n",
			[]string{"h.yaml:2: hooks[0].command: want an argv list, not a string"}},
		{"command empty", "hooks:\n  - name: a\n    types: [loopbus.task.added]\n    command: []\n",
			[]string{"h.yaml:4: hooks[0].command: must not be empty"}},
		{"command not executable", "hooks:\n  - name: a\n    types: [loopbus.task.added]\n    command: [./plain.sh]\n",
			[]string{"h.yaml:4: hooks[0].command[0]: program " + filepath.Join(dir, "plain.sh") + " is not an executable file (chmod +x it, or write [sh, ./plain.sh, ...])"}},
		{"types empty", "hooks:\n  - name: a\n    types: []\n    command: [true]\n",
			[]string{"h.yaml:3: hooks[0].types: must not be empty"}},
		{"duplicate names", "hooks:\n  - {name: a, types: [loopbus.task.added], command: [true]}\n  - {name: a, types: [loopbus.task.updated], command: [true]}\n",
			[]string{`h.yaml:3: hooks[1].name: duplicate hook name "a"`}},
		{"duplicate key", "hooks:\n  - name: a\n    name: b\n    types: [loopbus.task.added]\n    command: [true]\n",
			[]string{`h.yaml:3: YAML syntax error: mapping key "name" already defined`}},
		{"alias without anchor", "hooks:\n  - {name: a, types: *t, command: [true]}\n",
			[]string{"YAML"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := Parse("h.yaml", []byte(tt.doc), dir)
			if err == nil {
				t.Fatalf("no error; config %+v", cfg)
			}
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("error does not wrap ErrInvalid: %v", err)
			}
			var errs Errors
			if !errors.As(err, &errs) {
				t.Fatalf("error is not Errors: %T %v", err, err)
			}
			if len(errs) != len(tt.want) {
				t.Fatalf("%d problems, want %d:\n%v", len(errs), len(tt.want), err)
			}
			for i, e := range errs {
				if !strings.HasPrefix(e.Error(), tt.want[i]) && !strings.Contains(e.Error(), tt.want[i]) {
					t.Errorf("problem %d:\n got %s\nwant %s…", i, e.Error(), tt.want[i])
				}
			}
		})
	}
}

func TestParseAnchors(t *testing.T) {
	dir := hooksDir(t)
	doc := `hooks:
  - name: a
    types: &done [loopbus.session.completed, loopbus.session.failed]
    command: [true]
  - name: b
    types: *done
    command: [true]
`
	cfg, err := Parse("h.yaml", []byte(doc), dir)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(cfg.Hooks[1].Types, []string{"loopbus.session.completed", "loopbus.session.failed"}) {
		t.Errorf("alias: types %q", cfg.Hooks[1].Types)
	}
}

func TestLoad(t *testing.T) {
	dir := hooksDir(t)
	path := filepath.Join(dir, "hooks.yaml")
	if err := os.WriteFile(path, []byte("hooks:\n  - {name: a, types: [loopbus.task.added], command: [./notify.sh], timeout: -1s}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := Load(path)
	if err == nil || !strings.HasPrefix(err.Error(), path+":2: hooks[0].timeout: ") {
		t.Errorf("Load: %v, want an error naming %s, line 2 and hooks[0].timeout", err, path)
	}
	if _, err := Load(filepath.Join(dir, "none.yaml")); err == nil || errors.Is(err, ErrInvalid) {
		t.Errorf("Load of a missing file: %v, want a read error", err)
	}
}

func TestConfigValidate(t *testing.T) {
	ok := Hook{Name: "a", Types: []string{"loopbus.task.added"}, Command: []string{"true"}}
	with := func(f func(*Hook)) []Hook {
		h := ok
		f(&h)
		return []Hook{h}
	}
	tests := []struct {
		name    string
		cfg     Config
		wantErr string
	}{
		{"ok", Config{Hooks: []Hook{ok}}, ""},
		{"no hooks", Config{}, "no hooks"},
		{"bad runner", Config{Runner: "a b", Hooks: []Hook{ok}}, "runner"},
		{"bad start", Config{Start: "later", Hooks: []Hook{ok}}, "start"},
		{"duplicate", Config{Hooks: []Hook{ok, ok}}, "duplicate"},
		{"no filters", Config{Hooks: with(func(h *Hook) { h.Types = nil })}, "want types or subjects"},
		{"bad type", Config{Hooks: with(func(h *Hook) { h.Types = []string{"loopbus.hook.failed"} })}, "never trigger"},
		{"no command", Config{Hooks: with(func(h *Hook) { h.Command = nil })}, "empty command"},
		{"bad env", Config{Hooks: with(func(h *Hook) { h.Env = map[string]string{"LOOPBUS_SESSION": "x"} })}, "LOOPBUS_"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			switch {
			case tt.wantErr == "" && err != nil:
				t.Errorf("unexpected error %v", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr) || !errors.Is(err, ErrInvalid)):
				t.Errorf("error %v, want ErrInvalid containing %q", err, tt.wantErr)
			}
		})
	}
}
