package client

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"time"

	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/schemas"
)

// Check is one finding of Doctor.
type Check struct {
	Name string
	OK   bool
	// Warn marks a finding worth attention that does not fail the check.
	Warn   bool
	Detail string
}

// Doctor inspects what loopbus relies on: the server version (atomic
// batches need 2.12), the event stream's settings, the shared consumers,
// the artifact store (write-once; and the object store of earlier
// releases, if present), the dead letters, and sh for exec agents. where
// describes the connection for the report.
func Doctor(ctx context.Context, b *bus.Bus, where string) []Check {
	var out []Check
	add := func(name string, err error, detail string) {
		if err != nil {
			out = append(out, Check{Name: name, Detail: err.Error()})
			return
		}
		out = append(out, Check{Name: name, OK: true, Detail: detail})
	}
	nc := b.Conn()
	add("nats", nil, fmt.Sprintf("%s, version %s", where, nc.ConnectedServerVersion()))
	if !atLeast(nc.ConnectedServerVersion(), 2, 12) {
		add("server version", fmt.Errorf("%s is older than 2.12: atomic batches are unavailable", nc.ConnectedServerVersion()), "")
	}
	js := b.JetStream()
	s, err := js.Stream(ctx, b.StreamName())
	if err != nil {
		add("event stream", err, "")
		return out
	}
	info, err := s.Info(ctx)
	if err == nil {
		cfg := info.Config
		var bad []string
		if !cfg.DenyDelete || !cfg.DenyPurge {
			bad = append(bad, "delete/purge allowed")
		}
		if !cfg.AllowAtomicPublish {
			bad = append(bad, "atomic publish off")
		}
		if len(bad) > 0 {
			err = fmt.Errorf("%s: %s", cfg.Name, strings.Join(bad, ", "))
		}
	}
	if err != nil {
		add("event stream", err, "")
	} else {
		retention := "kept forever"
		if info.Config.MaxAge > 0 {
			retention = "kept " + info.Config.MaxAge.String()
		}
		add("event stream", nil, fmt.Sprintf("%s: %d events, %d bytes, %s, replicas %d", info.Config.Name, info.State.Msgs, info.State.Bytes, retention, info.Config.Replicas))
	}
	for _, name := range []string{"agentworker", "validator"} {
		cons, err := s.Consumer(ctx, name)
		if err != nil {
			add("consumer "+name, fmt.Errorf("not created yet (start the %s service)", name), "")
			continue
		}
		ci, err := cons.Info(ctx)
		if err != nil {
			add("consumer "+name, err, "")
			continue
		}
		add("consumer "+name, nil, fmt.Sprintf("%d pending, %d in progress, %d redelivered, %d waiting pulls", ci.NumPending, ci.NumAckPending, ci.NumRedelivered, ci.NumWaiting))
	}
	if cur, old, err := b.ArtifactStores(ctx); err != nil {
		add("artifacts", err, "")
	} else {
		if len(cur.Problems) > 0 {
			err = fmt.Errorf("%s is not write-once: it lacks %s (connect as a user allowed to update it, e.g. the admin, to restore them)", cur.Stream, strings.Join(cur.Problems, ", "))
		}
		add("artifacts", err, fmt.Sprintf("%s: %d messages, %d bytes, write-once, replicas %d", cur.Stream, cur.Messages, cur.Bytes, cur.Replicas))
		if old != nil {
			add("old artifacts", nil, fmt.Sprintf("%s (object store of earlier releases): %d messages, %d bytes, read only", old.Stream, old.Messages, old.Bytes))
		}
	}
	if dlq, err := js.Stream(ctx, bus.DefaultDLQStream); err == nil {
		if info, err := dlq.Info(ctx); err == nil {
			detail := "empty"
			if info.State.Msgs > 0 {
				detail = fmt.Sprintf("%d dead letters on %s.> (stream %s): list them with `loopbus dlq`", info.State.Msgs, bus.DLQSubjectPrefix, bus.DefaultDLQStream)
			}
			add("dead letters", nil, detail)
		}
	}
	out = append(out, WorkersCheck(ctx, b))
	if _, err := exec.LookPath("sh"); err != nil {
		add("sh", err, "")
	} else {
		add("sh", nil, "found (exec agents and validate commands)")
	}
	return out
}

// QuietSession is a session not finished whose newest event was stored a
// while ago (see QuietSessions).
type QuietSession struct {
	ID string
	// Last is the session's newest event; Last.Stored is when the server
	// stored it.
	Last schemas.Event
}

// QuietSessions looks at the newest limit sessions started and neither
// completed, failed nor closed (all of them when limit is 0), and returns
// those whose newest event was stored at least quiet before now, in the
// order they started; running is how many such sessions there are. A
// session whose newest event cannot be decoded is left out (the services
// dead-lettered it).
func QuietSessions(ctx context.Context, b *bus.Bus, quiet time.Duration, now time.Time, limit int) (out []QuietSession, running int, err error) {
	dests, err := runningSessions(ctx, b)
	if err != nil {
		return nil, 0, err
	}
	running = len(dests)
	if limit > 0 && len(dests) > limit {
		dests = dests[len(dests)-limit:]
	}
	for _, d := range dests {
		seq, err := b.SessionLastSeq(ctx, d.Session)
		if err != nil {
			return nil, running, err
		}
		ev, err := b.GetEvent(ctx, seq)
		switch {
		case errors.Is(err, bus.ErrMalformed):
			continue
		case err != nil:
			return nil, running, fmt.Errorf("session %s: %w", d.Session, err)
		}
		if now.Sub(ev.Stored) >= quiet {
			out = append(out, QuietSession{ID: d.Session, Last: ev})
		}
	}
	return out, running, nil
}

// atLeast reports whether a "major.minor.patch" version is at least
// major.minor.
func atLeast(version string, major, minor int) bool {
	var a, b int
	if _, err := fmt.Sscanf(version, "%d.%d", &a, &b); err != nil {
		return false
	}
	return a > major || a == major && b >= minor
}
