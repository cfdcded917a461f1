package main

import (
	"strings"
	"testing"
)

// TestRedactURLs: serve's banner never prints a NATS password or token.
func TestRedactURLs(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"nats://127.0.0.1:4222", "nats://127.0.0.1:4222"},
		{"nats://loopbus:s3cret@host:4222", "nats://loopbus:xxxxx@host:4222"},
		{"nats://s3cret-token@host:4222,nats://a:s3cret@h2:4223", "nats://xxxxx@host:4222,nats://a:xxxxx@h2:4223"},
	} {
		got := redactURLs(c.in)
		if got != c.want || strings.Contains(got, "s3cret") {
			t.Errorf("redactURLs(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

// TestInvokedAs: hints name the binary as it was invoked, quoted for a
// shell when it has to be.
func TestInvokedAs(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"", "loopbus"},
		{"loopbus", "loopbus"},
		{"bin/loopbus", "bin/loopbus"},
		{"./lb", "./lb"},
		{"/opt/my tools/loopbus", `'/opt/my tools/loopbus'`},
		{"it's", `'it'\''s'`},
	} {
		if got := invokedAs(c.in); got != c.want {
			t.Errorf("invokedAs(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

// TestWhereHidesCredentials: the connection flags a hint prints (the
// result hint, serve's run line) never carry a NATS password.
func TestWhereHidesCredentials(t *testing.T) {
	g := &globals{natsURL: "nats://loopbus:s3cret@host:4222"}
	if got := g.where(); got != " --nats nats://loopbus:xxxxx@host:4222" {
		t.Errorf("where() = %q", got)
	}
}
