package agentworker

import "testing"

// TestCancelMemory: the memory answers only for requests made since it
// follows and since what it forgot, and then says exactly whether a
// cancellation newer than the request was followed.
func TestCancelMemory(t *testing.T) {
	m := newCancelMemory(2)
	if _, _, known := m.lookup("s/a", 10); known {
		t.Fatal("known before following")
	}
	m.follow(10) // the stream's newest event was 9
	m.remember("s/a", "first", 12)
	m.remember("s/b", "second", 14)
	if _, _, known := m.lookup("s/a", 11); known {
		t.Fatal("known before the follower caught up")
	}
	m.caughtUp(true)
	tests := []struct {
		key              string
		req              uint64
		reason           string
		cancelled, known bool
	}{
		{key: "s/a", req: 8}, // requested before the follower's start
		{key: "s/a", req: 9, reason: "first", cancelled: true, known: true}, // every later one is followed
		{key: "s/a", req: 11, reason: "first", cancelled: true, known: true},
		{key: "s/a", req: 12, known: true}, // its cancellation is not newer than the request
		{key: "s/b", req: 13, reason: "second", cancelled: true, known: true},
		{key: "s/c", req: 13, known: true},
	}
	for _, tt := range tests {
		reason, cancelled, known := m.lookup(tt.key, tt.req)
		if reason != tt.reason || cancelled != tt.cancelled || known != tt.known {
			t.Errorf("lookup(%s, %d) = %q, %v, %v; want %q, %v, %v", tt.key, tt.req, reason, cancelled, known, tt.reason, tt.cancelled, tt.known)
		}
	}
	// Beyond the limit the oldest goes, and requests older than it are
	// left to the stream.
	m.remember("s/c", "third", 20)
	if _, _, known := m.lookup("s/a", 11); known {
		t.Error("a request older than a forgotten cancellation is answered")
	}
	if _, cancelled, known := m.lookup("s/c", 12); !known || !cancelled {
		t.Errorf("lookup(s/c, 12) = %v, %v; want cancelled, known", cancelled, known)
	}
	if len(m.byJob) != 2 || len(m.order) != 2 {
		t.Errorf("keeps %d cancellations (%d in order), want 2", len(m.byJob), len(m.order))
	}
	// A follower that stopped (until it reads again) knows nothing.
	m.caughtUp(false)
	if _, _, known := m.lookup("s/c", 12); known {
		t.Error("known while the follower is not live")
	}
}
