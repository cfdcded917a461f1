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
		// Credentials inside the server URL are credentials too.
		{[]string{"dashboard", "--http", "127.0.0.1:0", "--nats", "nats://u:p@127.0.0.1:1"}, "needs a token even on loopback"},
		{[]string{"dashboard", "--http", "127.0.0.1:0", "--nats", "nats://127.0.0.1:1,nats://natstoken@127.0.0.1:2"}, "needs a token even on loopback"},
		{[]string{"serve", "--http", "127.0.0.1:0", "--nats", "tls://u:p@127.0.0.1:1"}, "needs a token even on loopback"},
	} {
		var stderr bytes.Buffer
		if code := execute(tt.args, io.Discard, &stderr); code != exitUsage || !strings.Contains(stderr.String(), tt.want) {
			t.Errorf("%v: exit %d, %q; want a usage error saying %q", tt.args, code, stderr.String(), tt.want)
		}
	}
}

// TestDashboardCredentialsInEnvURL: LOOPBUS_NATS_URL with a user and
// password in it secures the process as --user and --password would.
func TestDashboardCredentialsInEnvURL(t *testing.T) {
	t.Setenv(httpTokenEnv, "")
	t.Setenv("LOOPBUS_NATS_URL", "nats://alice:s3cret@127.0.0.1:1")
	var stderr bytes.Buffer
	if code := execute([]string{"dashboard", "--http", "127.0.0.1:0"}, io.Discard, &stderr); code != exitUsage || !strings.Contains(stderr.String(), "needs a token even on loopback") {
		t.Errorf("exit %d, %q; want a usage error saying a token is needed", code, stderr.String())
	}
}

// TestURLHoldsCredentials: only user information makes a URL secured; a
// plain list of servers does not.
func TestURLHoldsCredentials(t *testing.T) {
	for in, want := range map[string]bool{
		"":                                  false,
		"nats://127.0.0.1:4222":             false,
		"127.0.0.1:4222, nats://h2:4222":    false,
		"nats://u:p@127.0.0.1:4222":         true,
		"nats://tok@h:4222":                 true,
		"nats://h1:4222,u:p@h2:4222":        true,
		"nats://h1:4222, tls://u:p@h2:4222": true,
		"nats://%zz@h:4222":                 true,
	} {
		if got := urlHoldsCredentials(in); got != want {
			t.Errorf("urlHoldsCredentials(%q) = %v, want %v", in, got, want)
		}
	}
}

// TestEveryCommandIsGrouped: --help lists each command under what it is
// for; a command left out of commandGroups would fall into "Additional
// Commands".
func TestEveryCommandIsGrouped(t *testing.T) {
	root := newRoot(&globals{stdout: io.Discard, stderr: io.Discard, program: "loopbus"})
	for _, c := range root.Commands() {
		if c.GroupID == "" {
			t.Errorf("command %s is in no group of commandGroups", c.Name())
		}
	}
	var out strings.Builder
	if code := execute([]string{"--help"}, &out, io.Discard); code != exitOK {
		t.Fatalf("--help: exit %d", code)
	}
	for _, g := range commandGroups() {
		if !strings.Contains(out.String(), "\n"+g.group.Title+"\n") {
			t.Errorf("--help lacks the group %q:\n%s", g.group.Title, out.String())
		}
	}
	if strings.Contains(out.String(), "Additional Commands") {
		t.Errorf("--help has ungrouped commands:\n%s", out.String())
	}
}
