package client

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/projections"
	"github.com/loopbus/loopbus/schemas"
)

// SessionFilter selects sessions for Sessions. The zero value selects
// every session.
type SessionFilter struct {
	// Status keeps sessions in one of these states (running, paused,
	// stopped, completed, failed, closed); empty keeps all.
	Status []string
	// Pipeline keeps sessions of the pipeline or backlog of this name.
	Pipeline string
	// MaxAge keeps sessions started at most this long ago; 0 keeps all.
	MaxAge time.Duration
	// Limit keeps the newest Limit sessions; 0 keeps all.
	Limit int
}

// sessionStates are the states a SessionFilter may name.
var sessionStates = []string{projections.StatusRunning, projections.StatusPaused, projections.StatusStopped, projections.StatusCompleted, projections.StatusFailed, projections.StatusClosed}

// Validate reports an unknown state or a negative bound, wrapping
// ErrBadInput.
func (f SessionFilter) Validate() error {
	for _, s := range f.Status {
		if !slices.Contains(sessionStates, s) {
			return fmt.Errorf("%w: status %q: want one of %s", ErrBadInput, s, strings.Join(sessionStates, ", "))
		}
	}
	if f.MaxAge < 0 || f.Limit < 0 {
		return fmt.Errorf("%w: age and limit must not be negative", ErrBadInput)
	}
	return nil
}

// SessionSummary is one line of a session listing.
type SessionSummary struct {
	ID       string    `json:"id"`
	Pipeline string    `json:"pipeline"`
	Kind     string    `json:"kind,omitempty"`
	Status   string    `json:"status"`
	Started  time.Time `json:"started"`
	Updated  time.Time `json:"updated"`
	// Steps and StepsDone count the session's steps (a backlog's task
	// and role runs) and those completed.
	Steps     int     `json:"steps"`
	StepsDone int     `json:"stepsDone"`
	CostUSD   float64 `json:"costUsd"`
	Tokens    int64   `json:"tokens"`
	// Restarts counts the agents run again (projections.Manifest.Restarts).
	Restarts int `json:"restarts"`
	// Error is why a failed session failed, or why a stopped or paused
	// one is held.
	Error string `json:"error,omitempty"`
}

// Sessions lists the sessions f selects, newest first, each summarized
// from its current manifest (the view when it is up to date, else a fold
// of its events: see Status). now is the reference for f.MaxAge.
func Sessions(ctx context.Context, b Bus, f SessionFilter, now time.Time) ([]SessionSummary, error) {
	if err := f.Validate(); err != nil {
		return nil, err
	}
	type started struct {
		id string
		at time.Time
	}
	var ids []started
	seen := map[string]bool{}
	err := b.Read(ctx, bus.ReadOptions{Subjects: startSubjects("*"), SkipSchema: true}, func(ev schemas.Event) error {
		if !seen[ev.Session] {
			seen[ev.Session] = true
			ids = append(ids, started{ev.Session, ev.Time})
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	// Newest first; the stream order breaks ties (and orders equal clocks).
	slices.Reverse(ids)
	slices.SortStableFunc(ids, func(a, b started) int { return b.at.Compare(a.at) })
	var out []SessionSummary
	for _, s := range ids {
		if f.MaxAge > 0 && now.Sub(s.at) > f.MaxAge {
			continue
		}
		m, err := Status(ctx, b, s.id)
		if err != nil {
			return nil, fmt.Errorf("session %s: %w", s.id, err)
		}
		sum := Summary(m)
		if (len(f.Status) > 0 && !slices.Contains(f.Status, sum.Status)) || (f.Pipeline != "" && f.Pipeline != sum.Pipeline) {
			continue
		}
		out = append(out, sum)
		if f.Limit > 0 && len(out) == f.Limit {
			break
		}
	}
	return out, nil
}

// Summary summarizes a manifest as one line of a session listing.
func Summary(m *projections.Manifest) SessionSummary {
	s := SessionSummary{ID: m.ContentID, Pipeline: m.Pipeline, Kind: m.Kind, Status: m.Status, Started: m.CreatedAt, Updated: m.UpdatedAt,
		Steps: len(m.StepOrder), Restarts: m.Restarts}
	for _, name := range m.StepOrder {
		if st := m.Steps[name]; st != nil && st.Status == projections.StepStatusCompleted {
			s.StepsDone++
		}
	}
	if m.Usage != nil {
		s.CostUSD, s.Tokens = m.Usage.CostUSD, m.Usage.InputTokens+m.Usage.OutputTokens
	}
	switch {
	case m.Error != "":
		s.Error = m.Error
	case m.Hold != nil:
		s.Error = m.Hold.Reason
	}
	return s
}

// WriteFinal writes the final artifacts of a completed session (those of
// its final steps) into dir, creating it, and returns the paths written.
// An artifact's name is checked before it becomes a file name, so no name
// can write outside dir; an existing file of the same name is replaced.
func WriteFinal(ctx context.Context, b Bus, m *projections.Manifest, dir string) ([]string, error) {
	if m.Status != projections.StatusCompleted {
		return nil, fmt.Errorf("%w: session %s is %s, not completed: it has no final artifacts", ErrBadInput, m.ContentID, m.Status)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var paths []string
	for _, ref := range m.Final {
		if err := schemas.ValidateName(ref.Name); err != nil {
			return paths, err
		}
		p := filepath.Join(dir, ref.Name)
		if err := b.GetArtifactFile(ctx, ref, p); err != nil {
			return paths, fmt.Errorf("artifact %s: %w", ref.Name, err)
		}
		paths = append(paths, p)
	}
	return paths, nil
}
