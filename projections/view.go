package projections

import (
	"slices"

	"github.com/loopbus/loopbus/schemas"
)

// Clone returns a deep copy of m that shares no memory with it, so the copy
// stays unchanged while FoldManifest mutates m (and vice versa). Clone of a
// nil manifest is nil; nil slices, maps and step views stay nil.
func (m *Manifest) Clone() *Manifest {
	if m == nil {
		return nil
	}
	c := *m
	if m.Input != nil {
		in := *m.Input
		c.Input = &in
	}
	c.StepOrder = slices.Clone(m.StepOrder)
	c.Final = slices.Clone(m.Final)
	c.Hold = clonePtr(m.Hold)
	c.Budget = clonePtr(m.Budget)
	c.Import = clonePtr(m.Import)
	c.Usage = clonePtr(m.Usage)
	c.Signals = slices.Clone(m.Signals)
	c.Loops = slices.Clone(m.Loops)
	c.LoopLevels = slices.Clone(m.LoopLevels)
	if m.Target != nil {
		t := *m.Target
		t.Bundles = slices.Clone(m.Target.Bundles)
		t.Unmerged = slices.Clone(m.Target.Unmerged)
		c.Target = &t
	}
	if m.Jobs != nil {
		c.Jobs = make(map[string]*JobView, len(m.Jobs))
		for id, j := range m.Jobs {
			if j != nil {
				jc := *j
				jc.Usage = clonePtr(j.Usage)
				j = &jc
			}
			c.Jobs[id] = j
		}
	}
	if m.Steps != nil {
		c.Steps = make(map[string]*StepView, len(m.Steps))
		for name, sv := range m.Steps {
			c.Steps[name] = sv.Clone()
		}
	}
	return &c
}

// Clone returns a deep copy of s; nil for nil.
func (s *StepView) Clone() *StepView {
	if s == nil {
		return nil
	}
	c := *s
	if s.CompletedAt != nil {
		t := *s.CompletedAt
		c.CompletedAt = &t
	}
	c.Requires = slices.Clone(s.Requires)
	c.Outputs = slices.Clone(s.Outputs)
	c.Artifacts = slices.Clone(s.Artifacts)
	c.Hold = clonePtr(s.Hold)
	c.Wait = clonePtr(s.Wait)
	c.Usage = clonePtr(s.Usage)
	c.LastInvalidation = clonePtr(s.LastInvalidation)
	c.Hints = slices.Clone(s.Hints)
	return &c
}

// clonePtr returns a copy of *p, or nil for nil. T must hold no pointers,
// slices or maps.
func clonePtr[T any](p *T) *T {
	if p == nil {
		return nil
	}
	c := *p
	return &c
}

// Terminal reports whether the session has ended: completed, failed or
// closed. A
// nil manifest (session not started) is not terminal; nor is a paused or
// stopped session, which may be resumed.
func (m *Manifest) Terminal() bool {
	return m != nil && (m.Status == StatusCompleted || m.Status == StatusFailed || m.Status == StatusClosed)
}

// StoppedByBudget reports whether the session stopped because it reached its
// budget: it does not move on by itself (resume is refused while the budget
// is spent), so followers stop following. A stop whose budget was set
// again since (session.budget) waits for the orchestrator's answer.
func (m *Manifest) StoppedByBudget() bool {
	return m != nil && m.Status == StatusStopped && m.Hold != nil && m.Hold.Kind == schemas.StopBudget && !m.Hold.Raised
}

// ManifestKey is the views-bucket key of a session's manifest.
func ManifestKey(session string) string { return "session." + session }
