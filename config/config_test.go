package config

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

// configDirs points the user config file at a fresh directory and makes a
// fresh working directory (for the project file); it writes the files whose
// content is not empty and returns their paths.
func configDirs(t *testing.T, user, project string) (userFile, projectFile string) {
	t.Helper()
	home := t.TempDir()
	t.Setenv("XDG_CONFIG_HOME", home)
	t.Chdir(t.TempDir())
	userFile = filepath.Join(home, "loopbus", "config.yaml")
	projectFile = ".loopbus.yaml"
	if user != "" {
		if err := os.MkdirAll(filepath.Dir(userFile), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(userFile, []byte(user), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if project != "" {
		if err := os.WriteFile(projectFile, []byte(project), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return userFile, projectFile
}

// workerFlags are the flag sets of an agentworker-like command: the global
// flags (log-level, nats) and the whole set with its own --lanes, parsed
// from args.
func workerFlags(t *testing.T, args ...string) (globals, flags *pflag.FlagSet) {
	t.Helper()
	globals = pflag.NewFlagSet("global", pflag.ContinueOnError)
	globals.String("log-level", "", "")
	globals.String("nats", "", "")
	flags = pflag.NewFlagSet("agentworker", pflag.ContinueOnError)
	flags.SetOutput(io.Discard)
	flags.AddFlagSet(globals)
	flags.String("lanes", "", "")
	if err := flags.Parse(args); err != nil {
		t.Fatal(err)
	}
	return globals, flags
}

func TestWorkerLaneSettings(t *testing.T) {
	tests := []struct {
		name          string
		user, project string
		env           string // LOOPBUS_WORKER_LANES; "-" leaves it unset
		args          []string
		wantLanes     []string
		wantTable     map[string]string
		wantErr       string // substring; "PROJECT"/"USER" stand for the files' paths
	}{
		{name: "nothing set", env: "-", wantTable: map[string]string{}},
		{name: "project table", env: "-", project: "lanes:\n  Bash: net\n  \"mcp__db__*\": heavy\n", wantTable: map[string]string{"Bash": "net", "mcp__db__*": "heavy"}},
		{
			name: "tables merge, the project's winning", env: "-",
			user: "lanes:\n  Bash: net\n  WebFetch: no-net\n", project: "lanes:\n  Bash: heavy\n",
			wantTable: map[string]string{"Bash": "heavy", "WebFetch": "no-net"},
		},
		{name: "worker lanes as a list", env: "-", user: "worker-lanes: [no-net, net]\n", wantLanes: []string{"no-net", "net"}, wantTable: map[string]string{}},
		{name: "project worker lanes win", env: "-", user: "worker-lanes: [no-net, net]\n", project: "worker-lanes: heavy\n", wantLanes: []string{"heavy"}, wantTable: map[string]string{}},
		{name: "environment beats files", env: "net", project: "worker-lanes: heavy\n", wantLanes: []string{"net"}, wantTable: map[string]string{}},
		{name: "flag beats environment", env: "net", args: []string{"--lanes", "no-net,heavy"}, wantLanes: []string{"no-net", "heavy"}, wantTable: map[string]string{}},
		{name: "unknown lane in the table", env: "-", project: "lanes:\n  Read: no-net\n  Bash: hevy\n", wantErr: `config PROJECT: lanes.Bash: unknown lane "hevy" (lanes: no-net, net, heavy)`},
		{name: "permission rule as a key", env: "-", user: "lanes:\n  Bash(git:*): net\n", wantErr: `config USER: lanes.Bash(git:*): "Bash(git:*)" is not a tool name`},
		{name: "lane not a string", env: "-", project: "lanes:\n  Bash: [net]\n", wantErr: "config PROJECT: lanes.Bash: want a lane name"},
		{name: "table not a mapping", env: "-", project: "lanes: [Bash]\n", wantErr: "config PROJECT: lanes: want a mapping of tool name to lane"},
		{name: "unknown worker lane in a file", env: "-", user: "worker-lanes: [no-net, gpu]\n", wantErr: `config USER: worker-lanes: unknown lane "gpu"`},
		{name: "unknown lane in the environment", env: "nett", wantErr: `LOOPBUS_WORKER_LANES: unknown lane "nett"`},
		{name: "unknown lane in the flag", env: "-", args: []string{"--lanes", "heavy,cpu"}, wantErr: `--lanes: unknown lane "cpu"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			userFile, projectFile := configDirs(t, tt.user, tt.project)
			if tt.env == "-" {
				t.Setenv(WorkerLanesEnv, "")
				os.Unsetenv(WorkerLanesEnv)
			} else {
				t.Setenv(WorkerLanesEnv, tt.env)
			}
			_, flags := workerFlags(t, tt.args...)
			lanes, table, err := WorkerLanes(flags.Lookup("lanes"))
			if tt.wantErr != "" {
				want := strings.NewReplacer("PROJECT", projectFile, "USER", userFile).Replace(tt.wantErr)
				if err == nil || !strings.Contains(err.Error(), want) {
					t.Fatalf("error %v, want it to contain %q", err, want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(lanes, tt.wantLanes) || !reflect.DeepEqual(table, tt.wantTable) {
				t.Errorf("lanes %q, table %v; want %q, %v", lanes, table, tt.wantLanes, tt.wantTable)
			}
		})
	}
}

// The lanes settings are not global flags, yet every command accepts them
// in a config file, and refuses bad ones naming the file and the key.
func TestApplyLayersLaneSettings(t *testing.T) {
	tests := []struct {
		name    string
		project string
		wantErr string
	}{
		{name: "valid", project: "log-level: debug\nlanes:\n  Bash: net\nworker-lanes: no-net,net\n"},
		{name: "bad lane", project: "lanes:\n  WebFetch: web\n", wantErr: `config .loopbus.yaml: lanes.WebFetch: unknown lane "web"`},
		{name: "unknown setting still refused", project: "lane: x\n", wantErr: `config .loopbus.yaml: unknown setting "lane"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			configDirs(t, "", tt.project)
			globals, flags := workerFlags(t)
			err := Apply(globals, flags)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				if got := flags.Lookup("log-level").Value.String(); got != "debug" {
					t.Errorf("log-level %q from the file, want debug", got)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !errors.Is(err, ErrInvalid) {
				t.Errorf("error %v, want an ErrInvalid containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestApplyLayersPrecedence(t *testing.T) {
	configDirs(t, "log-level: warn\nnats: nats://user:4222\n", "log-level: debug\n")
	t.Setenv("LOOPBUS_NATS_URL", "nats://env:4222")
	globals, flags := workerFlags(t, "--log-level", "error")
	if err := Apply(globals, flags); err != nil {
		t.Fatal(err)
	}
	if got := flags.Lookup("log-level").Value.String(); got != "error" {
		t.Errorf("log-level %q: the command line must win", got)
	}
	if got := flags.Lookup("nats").Value.String(); got != "nats://env:4222" {
		t.Errorf("nats %q: the environment must beat the files", got)
	}
	if EnvName("nats") != "LOOPBUS_NATS_URL" || EnvName("log-level") != "LOOPBUS_LOG_LEVEL" {
		t.Errorf("EnvName: %s, %s", EnvName("nats"), EnvName("log-level"))
	}
}

func TestDefaultDataDir(t *testing.T) {
	t.Setenv("XDG_DATA_HOME", "/srv/data")
	if got := DefaultDataDir(); got != filepath.Join("/srv/data", "loopbus") {
		t.Errorf("with XDG_DATA_HOME: %s", got)
	}
	t.Setenv("XDG_DATA_HOME", "")
	home := t.TempDir()
	t.Setenv("HOME", home)
	if got := DefaultDataDir(); got != filepath.Join(home, ".local", "share", "loopbus") {
		t.Errorf("without XDG_DATA_HOME: %s", got)
	}
}
