package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/goccy/go-yaml"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// envName maps a flag to its environment variable: LOOPBUS_<FLAG>, with
// the documented exceptions.
func envName(flag string) string {
	switch flag {
	case "nats":
		return "LOOPBUS_NATS_URL"
	}
	return "LOOPBUS_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// configFiles are read lowest precedence first.
func configFiles() []string {
	var files []string
	if dir, err := os.UserConfigDir(); err == nil {
		files = append(files, filepath.Join(dir, "loopbus", "config.yaml"))
	}
	return append(files, ".loopbus.yaml")
}

// applyLayers fills every flag the user did not set on the command line
// from, in rising precedence, the user config file, the project config file
// and LOOPBUS_* environment variables. Unknown keys in a file are errors.
func applyLayers(cmd *cobra.Command) error {
	fromFiles := map[string]string{}
	where := map[string]string{}
	for _, f := range configFiles() {
		raw, err := os.ReadFile(f)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return usageErr(fmt.Errorf("config %s: %w", f, err))
		}
		var m map[string]any
		if err := yaml.Unmarshal(raw, &m); err != nil {
			return usageErr(fmt.Errorf("config %s: %v", f, err))
		}
		for k, v := range m {
			if cmd.Root().PersistentFlags().Lookup(k) == nil {
				return usageErr(fmt.Errorf("config %s: unknown setting %q (settings are global flag names, e.g. nats, data, log-level)", f, k))
			}
			fromFiles[k] = fmt.Sprint(v)
			where[k] = f
		}
	}
	// Only global flags are layered: a command's own flags (--session,
	// --json, …) must not pick up, say, the LOOPBUS_SESSION every agent
	// has in its environment.
	var firstErr error
	cmd.Root().PersistentFlags().VisitAll(func(global *pflag.Flag) {
		fl := cmd.Flags().Lookup(global.Name)
		if fl == nil || fl.Changed || firstErr != nil {
			return
		}
		val, src, ok := "", "", false
		if v, has := fromFiles[fl.Name]; has {
			val, src, ok = v, where[fl.Name], true
		}
		if v, has := os.LookupEnv(envName(fl.Name)); has {
			val, src, ok = v, envName(fl.Name), true
		}
		if ok {
			if err := cmd.Flags().Set(fl.Name, val); err != nil { // marks it Changed
				firstErr = usageErr(fmt.Errorf("%s: %s=%q: %v", src, fl.Name, val, err))
			}
		}
	})
	return firstErr
}
