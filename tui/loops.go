package tui

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/loopbus/loopbus/projections"
	"github.com/loopbus/loopbus/schemas"
)

// ShortCommit is a commit id's first 7 hex digits, as git shows them.
func ShortCommit(c string) string { return c[:min(len(c), 7)] }

// writeLoops writes a loops session's loop tree, one line per loop
// indented by its depth ("  plan-001-002  code  merged 3f2a1bc  2
// iterations  title"), then its target branch.
func writeLoops(w io.Writer, m *projections.Manifest, now time.Time) error {
	if len(m.Loops) > 0 {
		fmt.Fprintln(w, "\nloops")
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		for _, n := range loopTree(m) {
			l := n.loop
			st := m.Steps[l.ID]
			fmt.Fprintf(tw, "  %s%s\t%s\t%s\t%s\t%s\n", strings.Repeat("  ", n.depth), l.ID, l.Level,
				OneLine(loopState(l, st, now), 60), Plural(l.Iterations, "iteration"), OneLine(loopDetail(l, st), 80))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if s := targetLine(m); s != "" {
		fmt.Fprintln(w, s)
	}
	return nil
}

// targetLine is "target loopbus/s at 3f2a1bc (2 merged)"; empty for a
// session without a target branch.
func targetLine(m *projections.Manifest) string {
	t := m.Target
	if t == nil || t.Branch == "" {
		return ""
	}
	return fmt.Sprintf("target %s at %s (%d merged)", t.Branch, OrDash(ShortCommit(t.Head)), t.Merges)
}

// treeNode is a loop and its depth in the tree (0 for the root).
type treeNode struct {
	loop  *projections.LoopView
	depth int
}

// loopTree lists m's loops depth first, each followed by its children in
// index order. Loops whose parent is unknown show as roots.
func loopTree(m *projections.Manifest) []treeNode {
	known := map[string]bool{}
	for _, l := range m.Loops {
		known[l.ID] = true
	}
	children := map[string][]*projections.LoopView{}
	var roots []*projections.LoopView
	for i := range m.Loops {
		l := &m.Loops[i]
		if l.Parent == "" || !known[l.Parent] || l.Parent == l.ID {
			roots = append(roots, l)
			continue
		}
		children[l.Parent] = append(children[l.Parent], l)
	}
	out := make([]treeNode, 0, len(m.Loops))
	seen := map[string]bool{}
	var walk func(l *projections.LoopView, depth int)
	walk = func(l *projections.LoopView, depth int) {
		if seen[l.ID] {
			return
		}
		seen[l.ID] = true
		out = append(out, treeNode{l, depth})
		kids := children[l.ID]
		slices.SortStableFunc(kids, func(a, b *projections.LoopView) int { return a.Index - b.Index })
		for _, c := range kids {
			walk(c, depth+1)
		}
	}
	for _, r := range roots {
		walk(r, 0)
	}
	// Loops in a parent cycle (a malformed history) still show.
	for i := range m.Loops {
		walk(&m.Loops[i], 0)
	}
	return out
}

// loopState is a loop's status for people: "merged 3f2a1bc", "merging
// 9c1e2d4", a running loop's held or waiting step state ("paused:
// reason", "awaiting approval"), or the plain status.
func loopState(l *projections.LoopView, st *projections.StepView, now time.Time) string {
	switch l.Status {
	case projections.LoopStatusCompleted:
		if l.MergeCommit != "" {
			return "merged " + ShortCommit(l.MergeCommit)
		}
	case projections.LoopStatusMerging:
		if l.Commit != "" {
			return "merging " + ShortCommit(l.Commit)
		}
	case projections.LoopStatusRunning:
		if st != nil {
			switch st.Status {
			case projections.StepStatusPaused, projections.StepStatusStopped, projections.StepStatusBreaker, projections.StepStatusWaiting,
				projections.StepStatusAwaitingApproval:
				return StepState(st, now)
			}
		}
	}
	return l.Status
}

// loopDetail is a loop's title, its rebases after conflicts and its
// failure.
func loopDetail(l *projections.LoopView, st *projections.StepView) string {
	var parts []string
	if l.Title != "" {
		parts = append(parts, l.Title)
	}
	if l.Rebases > 0 {
		parts = append(parts, "redone after "+Plural(l.Rebases, "merge conflict"))
	}
	if l.Status == projections.LoopStatusFailed && st != nil && st.ErrorMessage != "" {
		parts = append(parts, st.ErrorMessage)
	}
	return strings.Join(parts, "; ")
}

// targetBranch is the session's target branch: loopbus/<session>.
func targetBranch(m *projections.Manifest, session string) string {
	if m != nil && m.Target != nil && m.Target.Branch != "" {
		return m.Target.Branch
	}
	return "loopbus/" + session
}

// isMerge reports whether job is a loop's merge job.
func isMerge(m *projections.Manifest, job string) bool {
	if m == nil {
		return false
	}
	j := m.Jobs[job]
	return j != nil && j.Merge
}

// describeLoop says what a loop event means: "spawned plan-001 (spec):
// title", "merged plan-001-001 into loopbus/s at 3f2a1bc (#2)", "rebase
// plan-001-002 onto 3f2a1bc: conflict on a.txt", "invalidated plan-001-002
// (by plan-001): reason". ok is false for other events.
func describeLoop(ev schemas.Event, m *projections.Manifest) (s string, ok bool) {
	switch d := ev.Data.(type) {
	case *schemas.LoopSpawned:
		s = "spawned " + d.Loop
		if d.Generation > 0 {
			s += " again"
		}
		s += " (" + d.Level + ")"
		if t := OneLine(d.Title, 120); t != "" {
			s += ": " + t
		}
		return s, true
	case *schemas.LoopMerged:
		return fmt.Sprintf("merged %s into %s at %s (#%d)", d.Loop, targetBranch(m, ev.Session), ShortCommit(d.Head), d.Position), true
	case *schemas.LoopRebase:
		s = "rebase " + d.Loop + " onto " + ShortCommit(d.Head)
		switch {
		case len(d.Conflict) > 0:
			s += ": conflict on " + OneLine(strings.Join(d.Conflict, ", "), 120)
		case d.Cause != "" && d.Cause != d.Loop:
			s += " after " + d.Cause + " merged"
		}
		return s, true
	case *schemas.LoopInvalidated:
		s = "invalidated " + d.Loop
		if d.Cause != "" && d.Cause != d.Loop {
			s += " (by " + d.Cause + ")"
		}
		return s + reasonText(d.Reason), true
	}
	return "", false
}
