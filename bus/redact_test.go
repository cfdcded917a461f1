package bus

import "testing"

func TestRedactURL(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		url  string
		want string
	}{
		{name: "no credentials", url: "nats://127.0.0.1:4222", want: "nats://127.0.0.1:4222"},
		{name: "user and password", url: "nats://alice:s3cret@nats.example.com:4222", want: "nats://REDACTED@nats.example.com:4222"},
		{name: "token", url: "nats://tok3n@nats.example.com:4222", want: "nats://REDACTED@nats.example.com:4222"},
		{name: "tls scheme", url: "tls://alice:s3cret@nats.example.com:4443", want: "tls://REDACTED@nats.example.com:4443"},
		{name: "websocket scheme", url: "wss://alice:s3cret@nats.example.com/ws", want: "wss://REDACTED@nats.example.com/ws"},
		{name: "password containing @", url: "nats://alice:p@ss@host:4222", want: "nats://REDACTED@host:4222"},
		{name: "server list", url: "nats://a:b@h1:4222,nats://h2:4222,nats://tok@h3:4222", want: "nats://REDACTED@h1:4222,nats://h2:4222,nats://REDACTED@h3:4222"},
		{name: "server list with spaces", url: "nats://a:b@h1:4222, nats://c:d@h2:4222", want: "nats://REDACTED@h1:4222, nats://REDACTED@h2:4222"},
		{name: "no scheme, no credentials", url: "127.0.0.1:4222", want: "127.0.0.1:4222"},
		// nats.go accepts scheme-less URLs and uses their credentials.
		{name: "no scheme, user and password", url: "alice:s3cret@host:4222", want: "REDACTED@host:4222"},
		{name: "no scheme, token", url: "tok3n@host:4222", want: "REDACTED@host:4222"},
		{name: "empty", url: "", want: ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := redactURL(tt.url); got != tt.want {
				t.Errorf("redactURL(%q) = %q, want %q", tt.url, got, tt.want)
			}
		})
	}
}
