package main

import (
	"bytes"
	"io"
	"strings"
	"testing"
)

// TestDashboardFlagsAreChecked: an open listener without a token, a token
// too short to resist guessing, and a secured process (credentials or a
// signing key) without a token are refused before anything starts.
func TestDashboardFlagsAreChecked(t *testing.T) {
	t.Setenv(httpTokenEnv, "")
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"dashboard", "--http", "0.0.0.0:7070"}, "is not a loopback address"},
		{[]string{"dashboard", "--http", "0.0.0.0:7070", "--http-token", "short"}, "at least 16"},
		{[]string{"dashboard", "--http", "127.0.0.1:0", "--sign-key", "/nonexistent/key.seed"}, "needs a token even on loopback"},
		{[]string{"dashboard", "--http", "127.0.0.1:0", "--user", "u", "--password", "p"}, "needs a token even on loopback"},
		{[]string{"dashboard", "--http="}, "needs an address"},
		{[]string{"serve", "--http", "127.0.0.1:0", "--token", "natstoken"}, "needs a token even on loopback"},
		{[]string{"serve", "--http", "0.0.0.0:7070"}, "is not a loopback address"},
	} {
		var stderr bytes.Buffer
		if code := execute(tt.args, io.Discard, &stderr); code != exitUsage || !strings.Contains(stderr.String(), tt.want) {
			t.Errorf("%v: exit %d, %q; want a usage error saying %q", tt.args, code, stderr.String(), tt.want)
		}
	}
}
