// Package client is loopbus's public Go API: submit sessions, follow them to
// their end, read their state, events and artifacts, send signals and work
// task lists, all by publishing and reading events on the bus.
//
// Programs start with Dial (or New over a bus they opened) and use the
// Client's methods; see Example for a whole session run in-process. The
// package-level functions are the same operations over any value that
// implements Bus; the loopbus command line is built on them.
package client

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/projections"
	"github.com/loopbus/loopbus/schemas"
	"github.com/nats-io/nats.go"
)

// Bus is what the client needs from the event bus.
type Bus interface {
	Read(ctx context.Context, opts bus.ReadOptions, fn func(schemas.Event) error) error
	Publish(ctx context.Context, ev schemas.Event) (bus.Published, error)
	PublishExpect(ctx context.Context, ev schemas.Event, expectLast uint64) (bus.Published, error)
	PutArtifact(ctx context.Context, object, name string, r io.Reader) (schemas.ArtifactRef, error)
	GetArtifactFile(ctx context.Context, ref schemas.ArtifactRef, path string) error
	GetView(ctx context.Context, key string, v any) error
	SessionLastSeq(ctx context.Context, session string) (uint64, error)
	Encode(ev schemas.Event) (*nats.Msg, error)
	Source() string
}

// Errors the command line maps to messages and exit codes.
var (
	ErrSessionExists = errors.New("session already exists")
	ErrNoSession     = errors.New("no such session")
	ErrBadInput      = errors.New("invalid input")
	// ErrDeadLettered: an event was refused (see Watch).
	ErrDeadLettered = errors.New("dead-lettered")
)

// NewSessionID returns "<pipeline>-<yyyymmdd>-<4 hex>", shortened to fit
// the 64-character limit.
func NewSessionID(pipelineName string, now time.Time) string {
	var b [2]byte
	_, _ = rand.Read(b[:])
	suffix := "-" + now.UTC().Format("20060102") + "-" + hex.EncodeToString(b[:])
	name := pipelineName
	if max := schemas.MaxIDLen - len(suffix); len(name) > max {
		name = name[:max]
	}
	return name + suffix
}

// Submit stores the input file and publishes session.started. It fails with
// ErrSessionExists if the session already has events, and with ErrBadInput
// if the input's file name is unsafe or collides with a declared output.
func Submit(ctx context.Context, b Bus, p schemas.Pipeline, inputPath, session string, now time.Time) (schemas.Event, error) {
	return SubmitWithBudget(ctx, b, p, inputPath, session, now, nil)
}

// SubmitWithBudget is Submit with the session's own budget recorded in
// session.started (nil for none); it fails with ErrBadInput if the budget
// is invalid (see CheckBudget).
func SubmitWithBudget(ctx context.Context, b Bus, p schemas.Pipeline, inputPath, session string, now time.Time, budget *schemas.Budget) (schemas.Event, error) {
	if budget != nil {
		if err := CheckBudget(*budget); err != nil {
			return schemas.Event{}, err
		}
	}
	if err := schemas.ValidateSessionID(session); err != nil {
		return schemas.Event{}, fmt.Errorf("%w: %v", ErrBadInput, err)
	}
	f, name, err := openInput(p, inputPath)
	if err != nil {
		return schemas.Event{}, err
	}
	defer f.Close()
	if last, err := b.SessionLastSeq(ctx, session); err != nil {
		return schemas.Event{}, err
	} else if last != 0 {
		return schemas.Event{}, fmt.Errorf("%w: %s (use 'loopbus wait %s' or 'loopbus status %s')", ErrSessionExists, session, session, session)
	}
	ref, err := b.PutArtifact(ctx, session+"/input/"+name, name, f)
	if err != nil {
		return schemas.Event{}, err
	}
	return publishStart(ctx, b, session, now, &schemas.SessionStarted{Pipeline: p, Input: ref, SourceHash: schemas.ShortHash(ref.Digest), Budget: budget})
}

// openInput opens the input file of a session of p: a regular file whose
// name is safe and is no step's output name (else ErrBadInput).
func openInput(p schemas.Pipeline, inputPath string) (*os.File, string, error) {
	name := filepath.Base(inputPath)
	if err := schemas.ValidateName(name); err != nil {
		return nil, "", fmt.Errorf("%w: input file name: %v (rename the file)", ErrBadInput, err)
	}
	for _, st := range p.Steps {
		for _, o := range st.Outputs {
			if o.Name == name {
				return nil, "", fmt.Errorf("%w: input %s has the name of step %s's output; rename the input file", ErrBadInput, name, st.Name)
			}
		}
	}
	f, err := os.Open(inputPath)
	if err != nil {
		return nil, "", fmt.Errorf("%w: %v", ErrBadInput, err)
	}
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		_ = f.Close()
		return nil, "", fmt.Errorf("%w: %s is not a regular file", ErrBadInput, inputPath)
	}
	return f, name, nil
}

// publishStart publishes session.started unless the session has events,
// with the files the pipeline's commands name stored to travel with it.
func publishStart(ctx context.Context, b Bus, session string, now time.Time, data *schemas.SessionStarted) (schemas.Event, error) {
	if data.DefinitionFiles == nil {
		files, err := storeDefinition(ctx, b, session, data.Pipeline)
		if err != nil {
			return schemas.Event{}, err
		}
		data.DefinitionFiles = files
	}
	ev := schemas.Event{
		ID:      schemas.DeterministicID(session, schemas.TypeSessionStarted),
		Type:    schemas.TypeSessionStarted,
		Session: session,
		Time:    now,
		Data:    data,
	}
	ev.Correlation = ev.ID
	if _, err := b.PublishExpect(ctx, ev, 0); err != nil {
		if !errors.Is(err, bus.ErrStale) && !errors.Is(err, bus.ErrDuplicate) {
			return schemas.Event{}, err
		}
		// A retry after a lost ack is refused by the guard although the
		// first attempt landed: then the stored session.started is ours.
		first, rerr := Events(ctx, b, session, Until{Seq: 0})
		if rerr != nil || len(first) == 0 || first[0].ID != ev.ID || first[0].Source != b.Source() {
			return schemas.Event{}, fmt.Errorf("%w: %s", ErrSessionExists, session)
		}
	}
	return ev, nil
}

// CheckBudget accepts a session budget whose every field is zero (no
// bound) or positive, with a finite cost, and at least one bound. Errors
// wrap ErrBadInput and name the run flag of the field.
func CheckBudget(b schemas.Budget) error {
	switch {
	case b == schemas.Budget{}:
		return fmt.Errorf("%w: the budget sets no bound", ErrBadInput)
	case b.MaxCostUSD < 0 || math.IsNaN(b.MaxCostUSD) || math.IsInf(b.MaxCostUSD, 0):
		return fmt.Errorf("%w: --max-cost-usd must be a number > 0, got %v", ErrBadInput, b.MaxCostUSD)
	case b.MaxTokens < 0:
		return fmt.Errorf("%w: --max-tokens must be > 0, got %d", ErrBadInput, b.MaxTokens)
	case b.MaxIterations < 0:
		return fmt.Errorf("%w: --max-iterations must be > 0, got %d", ErrBadInput, b.MaxIterations)
	}
	return nil
}

// DeadLetterAwaiter is what Watch needs to notice that the orchestrator
// refused the event that starts a session (see bus.Bus.AwaitDeadLetter).
type DeadLetterAwaiter interface {
	AwaitDeadLetter(ctx context.Context, seq uint64) (bus.DeadLetter, error)
}

// Watch folds a session's events into its manifest from the start, calling
// onEvent after each (with the manifest so far), until the session ends or
// ctx does. It returns the last manifest; ErrNoSession if, once caught up,
// the session has no session.started. When b is a DeadLetterAwaiter, an
// error wrapping ErrDeadLettered, with the reason, if the event that last
// started the session while it was not running (its session.started or
// session.forked, or a session.rerun of it ended) was dead-lettered
// before the orchestrator decided anything on it: it was refused, so
// nothing will run, and the watch would wait forever.
func Watch(ctx context.Context, b Bus, session string, onEvent func(schemas.Event, *projections.Manifest)) (*projections.Manifest, error) {
	var m *projections.Manifest
	// A stop by the budget ends the watch only at the head: a later
	// session.budget may have raised it, and the session goes on (and a
	// later session.rerun may have reopened an ended session).
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	letters, _ := b.(DeadLetterAwaiter)
	var start schemas.Event // the event that last started the session
	var refused error
	var awaiting sync.WaitGroup
	stopAwait := func() {}
	// await watches for a dead letter of start from the head on (one
	// reader at a time: the catch-up only notes the latest start).
	await := func() {
		stopAwait()
		if letters == nil || start.Seq == 0 {
			return
		}
		actx, cancel := context.WithCancel(rctx)
		stopAwait = cancel
		awaiting.Add(1)
		go func(ev schemas.Event) {
			defer awaiting.Done()
			dl, err := letters.AwaitDeadLetter(actx, ev.Seq)
			if subject, _ := ev.StreamSubject(); err != nil || dl.Subject != subject {
				// A letter of another event at that sequence (of a stream
				// made anew) is none of this session's.
				return
			}
			refused = fmt.Errorf("session %s will not run: its %s at stream sequence %d was %w by %s: %s",
				session, strings.TrimPrefix(ev.Type, "loopbus."), ev.Seq, ErrDeadLettered, dl.Consumer, dl.Reason)
			stop()
		}(start)
	}
	caughtUp := false
	err := b.Read(rctx, bus.ReadOptions{
		Subjects:   []string{schemas.SessionSubjects(session)},
		Follow:     true,
		SkipSchema: true,
		OnCaughtUp: func() {
			caughtUp = true
			if m.Terminal() || m.StoppedByBudget() {
				stop()
				return
			}
			await()
		},
	}, func(ev schemas.Event) error {
		// A start while the session runs (a refused rerun, say) leaves it
		// running: only a start of a session not running yet, or ended,
		// decides whether it runs.
		live := m != nil && !m.CopiesOnly && !m.Terminal() && !m.StoppedByBudget()
		m = projections.FoldManifest(m, ev)
		if onEvent != nil && m != nil {
			onEvent(ev, m)
		}
		// An end ends the watch only at the head too: a later
		// session.rerun may have reopened the session.
		if caughtUp && (m.Terminal() || m.StoppedByBudget()) {
			return bus.ErrStop
		}
		switch {
		case ev.ForkOf != "":
		case ev.Type == schemas.TypeSessionStarted || ev.Type == schemas.TypeSessionForked || ev.Type == schemas.TypeSessionRerun:
			if !live {
				if start = ev; caughtUp {
					await()
				}
			}
		case start.ID != "" && ev.Causation == start.ID:
			// The orchestrator decided on the start: it took it.
			stopAwait()
		}
		return nil
	})
	stopAwait()
	awaiting.Wait()
	switch {
	case refused != nil:
		return m, refused
	case err != nil:
		return m, err
	case m == nil:
		return nil, fmt.Errorf("%w: %s", ErrNoSession, session)
	}
	return m, ctx.Err()
}

// Until bounds a replay: events up to stream sequence Seq, or stored by the
// stream at or before Time (the stream's clock, not the producers', so
// clock skew between hosts cannot reorder history). The zero value means no
// bound.
type Until struct {
	Seq  uint64
	Time time.Time
}

// ParseUntil reads a stream sequence or an RFC 3339 time.
func ParseUntil(s string) (Until, error) {
	var n uint64
	if _, err := fmt.Sscanf(s, "%d", &n); err == nil && fmt.Sprint(n) == s {
		if n == 0 {
			return Until{}, fmt.Errorf("--until 0: stream sequences start at 1")
		}
		return Until{Seq: n}, nil
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return Until{}, fmt.Errorf("--until %q: want a stream sequence (e.g. 42) or an RFC 3339 time (e.g. 2026-11-22T10:00:00Z)", s)
	}
	return Until{Time: t}, nil
}

func (u Until) includes(ev schemas.Event) bool {
	if u.Seq != 0 && ev.Seq > u.Seq {
		return false
	}
	if !u.Time.IsZero() && ev.Stored.After(u.Time) {
		return false
	}
	return true
}

// Events returns a session's events in stream order, optionally bounded.
func Events(ctx context.Context, b Bus, session string, until Until) ([]schemas.Event, error) {
	var evs []schemas.Event
	err := b.Read(ctx, bus.ReadOptions{Subjects: []string{schemas.SessionSubjects(session)}, SkipSchema: true}, func(ev schemas.Event) error {
		if !until.includes(ev) {
			return bus.ErrStop
		}
		evs = append(evs, ev)
		return nil
	})
	return evs, err
}

// Replay folds a session's events up to until into its manifest.
func Replay(ctx context.Context, b Bus, session string, until Until) (*projections.Manifest, error) {
	evs, err := Events(ctx, b, session, until)
	if err != nil {
		return nil, err
	}
	m := projections.BuildManifest(session, evs)
	if m == nil {
		return nil, fmt.Errorf("%w: %s (no session.started at or before that point)", ErrNoSession, session)
	}
	return m, nil
}

// Status returns the current manifest: the materialized view when it is up
// to date with the stream, otherwise a fold of the stream (so status is
// exact even while the projector lags or is not running).
func Status(ctx context.Context, b Bus, session string) (*projections.Manifest, error) {
	last, err := lastOf(ctx, b, session)
	if err != nil {
		return nil, err
	}
	var m projections.Manifest
	if err := b.GetView(ctx, projections.ManifestKey(session), &m); err == nil && m.LastSeq >= last && m.Version == projections.ManifestVersion {
		return &m, nil
	}
	return Replay(ctx, b, session, Until{})
}

// EncodeLine returns ev as one line of structured CloudEvents JSON.
func EncodeLine(b Bus, ev schemas.Event) ([]byte, error) {
	m, err := b.Encode(ev)
	if err != nil {
		return nil, err
	}
	return append(m.Data, '\n'), nil
}

// Export writes into dir: session.json (the manifest), events.jsonl (every
// event), artifacts/ (the input and the artifacts of completed steps) and
// iterations/<job>/ (every stored artifact of every iteration). Artifact
// names live in their own folders, so none can overwrite the export's files.
func Export(ctx context.Context, b Bus, session, dir string) (*projections.Manifest, error) {
	evs, err := Events(ctx, b, session, Until{})
	if err != nil {
		return nil, err
	}
	m := projections.BuildManifest(session, evs)
	if m == nil {
		return nil, fmt.Errorf("%w: %s", ErrNoSession, session)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var lines []byte
	for _, ev := range evs {
		line, err := EncodeLine(b, ev)
		if err != nil {
			return nil, err
		}
		lines = append(lines, line...)
	}
	if err := os.WriteFile(filepath.Join(dir, "events.jsonl"), lines, 0o644); err != nil {
		return nil, err
	}
	if err := writeJSON(filepath.Join(dir, "session.json"), m); err != nil {
		return nil, err
	}
	fetch := func(ref schemas.ArtifactRef, sub ...string) error {
		if err := schemas.ValidateName(ref.Name); err != nil {
			return err
		}
		d := filepath.Join(append([]string{dir}, sub...)...)
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
		return b.GetArtifactFile(ctx, ref, filepath.Join(d, ref.Name))
	}
	if m.Input != nil {
		if err := fetch(*m.Input, "artifacts"); err != nil {
			return nil, err
		}
	}
	for _, name := range m.StepOrder {
		if st := m.Steps[name]; st != nil && st.Status == projections.StepStatusCompleted {
			for _, a := range st.Artifacts {
				if err := fetch(a, "artifacts"); err != nil {
					return nil, err
				}
			}
		}
	}
	for _, ev := range evs {
		if as, ok := ev.Data.(*schemas.ArtifactStored); ok {
			if err := schemas.ValidateName(as.JobID); err != nil {
				return nil, err
			}
			// Repeated deliveries of a job store the same name again;
			// the folder keeps the last.
			if err := fetch(as.Artifact, "iterations", as.JobID); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}

func writeJSON(path string, v any) error {
	raw, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(raw, '\n'), 0o644)
}
