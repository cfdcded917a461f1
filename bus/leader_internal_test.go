package bus

import (
	"testing"

	"github.com/nats-io/nats.go"
)

// validViewKey accepts what a KV bucket's Get accepts, and nothing else,
// so that a view read from the leader names the key a direct get would.
func TestValidViewKey(t *testing.T) {
	for key, want := range map[string]bool{
		"manifest.s1": true, "_projector.manifests": true, "tasks.kit-20261122-a1b2": true, "a/b=c": true,
		"": false, ".a": false, "a.": false, "a..b": false, "a b": false, "a*": false, "a>": false, "ä": false,
	} {
		if got := validViewKey(key); got != want {
			t.Errorf("validViewKey(%q) = %v, want %v", key, got, want)
		}
	}
}

// A KV message that deletes or purges its key, or a marker the server
// wrote, is no view.
func TestViewRemoved(t *testing.T) {
	for _, tt := range []struct {
		h    nats.Header
		want bool
	}{
		{nil, false},
		{nats.Header{"Nats-Msg-Id": {"x"}}, false},
		{nats.Header{"KV-Operation": {"DEL"}}, true},
		{nats.Header{"KV-Operation": {"PURGE"}}, true},
		{nats.Header{"Nats-Marker-Reason": {"MaxAge"}}, true},
	} {
		if got := viewRemoved(tt.h); got != tt.want {
			t.Errorf("viewRemoved(%v) = %v, want %v", tt.h, got, tt.want)
		}
	}
}
