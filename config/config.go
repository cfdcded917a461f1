// Package config layers loopbus's settings: flag defaults, then the user's
// and the project's config files, then LOOPBUS_* environment variables,
// then the command line, with every bad setting named by file and key.
package config

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/goccy/go-yaml"
	"github.com/loopbus/loopbus/agent"
	"github.com/spf13/pflag"
)

// ErrInvalid wraps every error about a setting: an unreadable or
// malformed file, an unknown key, a bad value.
var ErrInvalid = errors.New("invalid setting")

func invalid(err error) error { return fmt.Errorf("%w: %w", ErrInvalid, err) }

// EnvName maps a flag to its environment variable: LOOPBUS_<FLAG>, with
// the documented exceptions (nats: LOOPBUS_NATS_URL).
func EnvName(flag string) string {
	switch flag {
	case "nats":
		return "LOOPBUS_NATS_URL"
	}
	return "LOOPBUS_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// DefaultDataDir is where the embedded NATS server keeps its data when no
// --data is given: $XDG_DATA_HOME/loopbus, else ~/.local/share/loopbus,
// else .loopbus.
func DefaultDataDir() string {
	if d := os.Getenv("XDG_DATA_HOME"); d != "" {
		return filepath.Join(d, "loopbus")
	}
	if home, err := os.UserHomeDir(); err == nil {
		return filepath.Join(home, ".local", "share", "loopbus")
	}
	return ".loopbus"
}

// Files are the config files, lowest precedence first: the user's
// (<user config dir>/loopbus/config.yaml) and the project's (.loopbus.yaml
// in the working directory).
func Files() []string {
	var files []string
	if dir, err := os.UserConfigDir(); err == nil {
		files = append(files, filepath.Join(dir, "loopbus", "config.yaml"))
	}
	return append(files, ".loopbus.yaml")
}

// Settings of config files that are not global flags.
const (
	// lanesKey maps tool names to lanes (agent.LaneTable); the files'
	// entries are merged, the project file's winning.
	lanesKey = "lanes"
	// workerLanesKey is the agentworker's --lanes.
	workerLanesKey = "worker-lanes"
	// WorkerLanesEnv is the agentworker's --lanes in the environment.
	WorkerLanesEnv = "LOOPBUS_WORKER_LANES"
)

// fileSettings are the settings of the config files that are not global
// flags, merged in rising precedence.
type fileSettings struct {
	// lanes is the lane table (tool → lane) over agent.DefaultLanes.
	lanes map[string]string
	// workerLanes is worker-lanes as a comma-separated list and the file
	// that set it; empty when none did.
	workerLanes, workerLanesFile string
}

// readConfigFiles reads every config file that exists, lowest precedence
// first, and returns each one's settings, checking those that are not
// global flags (lanes, worker-lanes): an error names the file and the key.
func readConfigFiles() (files []string, settings []map[string]any, fs fileSettings, err error) {
	fs.lanes = map[string]string{}
	for _, f := range Files() {
		raw, err := os.ReadFile(f)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, nil, fs, invalid(fmt.Errorf("config %s: %w", f, err))
		}
		var m map[string]any
		if err := yaml.Unmarshal(raw, &m); err != nil {
			return nil, nil, fs, invalid(fmt.Errorf("config %s: %v", f, err))
		}
		if v, ok := m[lanesKey]; ok {
			if err := mergeLanes(fs.lanes, v); err != nil {
				return nil, nil, fs, invalid(fmt.Errorf("config %s: %w", f, err))
			}
		}
		if v, ok := m[workerLanesKey]; ok {
			list, err := laneList(v)
			if err != nil {
				return nil, nil, fs, invalid(fmt.Errorf("config %s: %s: %w", f, workerLanesKey, err))
			}
			fs.workerLanes, fs.workerLanesFile = list, f
		}
		files, settings = append(files, f), append(settings, m)
	}
	return files, settings, fs, nil
}

// mergeLanes adds a lanes mapping (tool name → lane) to table, checking
// every entry.
func mergeLanes(table map[string]string, v any) error {
	if v == nil {
		return nil // "lanes:" with nothing under it
	}
	m, ok := v.(map[string]any)
	if !ok {
		return fmt.Errorf("%s: want a mapping of tool name to lane, e.g. \"Bash: heavy\"", lanesKey)
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys) // the first error is the same every time
	for _, k := range keys {
		lane, ok := m[k].(string)
		if !ok {
			return fmt.Errorf("%s.%s: want a lane name (%s), got %v", lanesKey, k, strings.Join(agent.AllLanes(), ", "), m[k])
		}
		if _, err := agent.NewLaneTable(map[string]string{k: lane}); err != nil {
			return err // a *agent.LaneKeyError: "lanes.KEY: …"
		}
		table[k] = lane
	}
	return nil
}

// laneList checks a list of lanes given as a YAML list or a
// comma-separated string and returns it comma-separated.
func laneList(v any) (string, error) {
	var parts []string
	switch v := v.(type) {
	case string:
		parts = []string{v}
	case []any:
		for _, e := range v {
			s, ok := e.(string)
			if !ok {
				return "", fmt.Errorf("want lane names, got %v", e)
			}
			parts = append(parts, s)
		}
	case nil:
	default:
		return "", fmt.Errorf("want a list of lanes (%s), got %v", strings.Join(agent.AllLanes(), ", "), v)
	}
	list := strings.Join(parts, ",")
	if _, err := agent.ParseLaneList(list); err != nil {
		return "", err
	}
	return list, nil
}

// WorkerLanes returns the lanes an agent worker runs (nil: all) and
// its lane table: the lanes from, in rising precedence, worker-lanes in the
// config files, LOOPBUS_WORKER_LANES and the --lanes flag (lanesFlag, when
// set on the command line); the table from the files' lanes.
func WorkerLanes(lanesFlag *pflag.Flag) ([]string, map[string]string, error) {
	_, _, fs, err := readConfigFiles()
	if err != nil {
		return nil, nil, err
	}
	val, src := fs.workerLanes, "config "+fs.workerLanesFile+": "+workerLanesKey
	if v, ok := os.LookupEnv(WorkerLanesEnv); ok {
		val, src = v, WorkerLanesEnv
	}
	if lanesFlag != nil && lanesFlag.Changed {
		val, src = lanesFlag.Value.String(), "--"+lanesFlag.Name
	}
	lanes, err := agent.ParseLaneList(val)
	if err != nil {
		return nil, nil, invalid(fmt.Errorf("%s: %w", src, err))
	}
	return lanes, fs.lanes, nil
}

// Apply fills every global flag (one of globals) that the user did not set
// on the command line (flags, the command's whole flag set) from, in rising
// precedence, the user config file, the project config file and LOOPBUS_*
// environment variables. Unknown keys in a file are errors; so are bad
// lanes and worker-lanes settings (see WorkerLanes).
func Apply(globals, flags *pflag.FlagSet) error {
	fromFiles := map[string]string{}
	where := map[string]string{}
	files, settings, _, err := readConfigFiles()
	if err != nil {
		return err
	}
	for i, f := range files {
		for k, v := range settings[i] {
			if k == lanesKey || k == workerLanesKey {
				continue
			}
			if globals.Lookup(k) == nil {
				return invalid(fmt.Errorf("config %s: unknown setting %q (settings are global flag names, e.g. nats, data, log-level, and lanes, worker-lanes)", f, k))
			}
			fromFiles[k] = fmt.Sprint(v)
			where[k] = f
		}
	}
	// Only global flags are layered: a command's own flags (--session,
	// --json, …) must not pick up, say, the LOOPBUS_SESSION every agent
	// has in its environment.
	var firstErr error
	globals.VisitAll(func(global *pflag.Flag) {
		fl := flags.Lookup(global.Name)
		if fl == nil || fl.Changed || firstErr != nil {
			return
		}
		val, src, ok := "", "", false
		if v, has := fromFiles[fl.Name]; has {
			val, src, ok = v, where[fl.Name], true
		}
		if v, has := os.LookupEnv(EnvName(fl.Name)); has {
			val, src, ok = v, EnvName(fl.Name), true
		}
		if ok {
			if err := flags.Set(fl.Name, val); err != nil { // marks it Changed
				firstErr = invalid(fmt.Errorf("%s: %s=%q: %v", src, fl.Name, val, err))
			}
		}
	})
	return firstErr
}
