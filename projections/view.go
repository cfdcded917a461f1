package projections

import "slices"

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
	c.Artifacts = slices.Clone(s.Artifacts)
	return &c
}

// Terminal reports whether the session has ended, completed or failed. A
// nil manifest (session not started) is not terminal.
func (m *Manifest) Terminal() bool {
	return m != nil && (m.Status == StatusCompleted || m.Status == StatusFailed)
}

// ManifestKey is the views-bucket key of a session's manifest.
func ManifestKey(session string) string { return "session." + session }
