package hooks

import (
	"slices"
	"strings"
	"testing"

	"github.com/loopbus/loopbus/schemas"
)

func TestHookMatches(t *testing.T) {
	ev := func(session, typ string) schemas.Event { return schemas.Event{Session: session, Type: typ} }
	tests := []struct {
		name string
		hook Hook
		ev   schemas.Event
		want bool
	}{
		{"exact type", Hook{Types: []string{"loopbus.task.updated"}}, ev("s1", "loopbus.task.updated"), true},
		{"other type", Hook{Types: []string{"loopbus.task.updated"}}, ev("s1", "loopbus.task.added"), false},
		{"verb wildcard", Hook{Types: []string{"loopbus.session.*"}}, ev("s1", "loopbus.session.completed"), true},
		{"verb wildcard other entity", Hook{Types: []string{"loopbus.session.*"}}, ev("s1", "loopbus.step.completed"), false},
		{"entity wildcard", Hook{Types: []string{"loopbus.*.completed"}}, ev("s1", "loopbus.step.completed"), true},
		{"entity wildcard other verb", Hook{Types: []string{"loopbus.*.completed"}}, ev("s1", "loopbus.step.failed"), false},
		{"any type", Hook{Types: []string{"loopbus.*.*"}}, ev("s1", "loopbus.job.started"), true},
		{"any type never a hook event", Hook{Types: []string{"loopbus.*.*"}}, ev("s1", "loopbus.hook.completed"), false},
		{"subject >", Hook{Subjects: []string{"loopbus.evt.*.task.>"}}, ev("s1", "loopbus.task.selected"), true},
		{"subject > other entity", Hook{Subjects: []string{"loopbus.evt.*.task.>"}}, ev("s1", "loopbus.session.completed"), false},
		{"subject session", Hook{Subjects: []string{"loopbus.evt.s1.>"}}, ev("s1", "loopbus.job.failed"), true},
		{"subject other session", Hook{Subjects: []string{"loopbus.evt.s1.>"}}, ev("s2", "loopbus.job.failed"), false},
		{"whole stream never a hook event", Hook{Subjects: []string{"loopbus.evt.>"}}, ev("s1", "loopbus.hook.failed"), false},
		{"types or subjects: by type", Hook{Types: []string{"loopbus.session.*"}, Subjects: []string{"loopbus.evt.*.task.>"}}, ev("s1", "loopbus.session.failed"), true},
		{"types or subjects: by subject", Hook{Types: []string{"loopbus.session.*"}, Subjects: []string{"loopbus.evt.*.task.>"}}, ev("s1", "loopbus.task.added"), true},
		{"types or subjects: neither", Hook{Types: []string{"loopbus.session.*"}, Subjects: []string{"loopbus.evt.*.task.>"}}, ev("s1", "loopbus.job.started"), false},
		{"session listed", Hook{Types: []string{"loopbus.task.updated"}, Sessions: []string{"a", "b"}}, ev("b", "loopbus.task.updated"), true},
		{"session not listed", Hook{Types: []string{"loopbus.task.updated"}, Sessions: []string{"a", "b"}}, ev("c", "loopbus.task.updated"), false},
		{"session listed, type not", Hook{Types: []string{"loopbus.task.updated"}, Sessions: []string{"a"}}, ev("a", "loopbus.task.added"), false},
		{"awaiting approval", Hook{Types: []string{schemas.TypeApprovalRequested}}, ev("s1", "loopbus.approval.requested"), true},
		{"approval wildcard", Hook{Types: []string{"loopbus.approval.*"}}, ev("s1", "loopbus.approval.expired"), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.hook.Matches(tt.ev); got != tt.want {
				t.Errorf("Matches(%s in %s) = %v, want %v", tt.ev.Type, tt.ev.Session, got, tt.want)
			}
		})
	}
}

func TestSubjectMatches(t *testing.T) {
	tests := []struct {
		filter, subject string
		want            bool
	}{
		{"loopbus.evt.*.task.updated", "loopbus.evt.s.task.updated", true},
		{"loopbus.evt.*.task.updated", "loopbus.evt.s.task.added", false},
		{"loopbus.evt.>", "loopbus.evt.s.task.added", true},
		{"loopbus.evt.s.>", "loopbus.evt.s", false},
		{"loopbus.evt.*.*.*", "loopbus.evt.s.task.added", true},
		{"loopbus.evt.*.*", "loopbus.evt.s.task.added", false},
		{"loopbus.evt.*.task.added.x", "loopbus.evt.s.task.added", false},
	}
	for _, tt := range tests {
		if got := subjectMatches(tt.filter, tt.subject); got != tt.want {
			t.Errorf("subjectMatches(%q, %q) = %v, want %v", tt.filter, tt.subject, got, tt.want)
		}
	}
}

func TestCheckPatterns(t *testing.T) {
	tests := []struct {
		name    string
		check   func(string) error
		in      string
		wantErr string
	}{
		{"type", checkType, "loopbus.task.updated", ""},
		{"type wildcards", checkType, "loopbus.*.*", ""},
		{"type two parts", checkType, "loopbus.task", "want loopbus.<entity>.<verb>"},
		{"type other prefix", checkType, "other.task.updated", "want loopbus.<entity>.<verb>"},
		{"type upper case", checkType, "loopbus.Task.updated", `"Task" is neither`},
		{"type partial wildcard", checkType, "loopbus.task.up*", `"up*" is neither`},
		{"type >", checkType, "loopbus.>", "want loopbus.<entity>.<verb>"},
		{"type hook", checkType, "loopbus.hook.completed", "never trigger hooks"},
		{"type hook wildcard", checkType, "loopbus.hook.*", "never trigger hooks"},
		{"subject", checkSubject, "loopbus.evt.*.task.>", ""},
		{"subject whole stream", checkSubject, "loopbus.evt.>", ""},
		{"subject other stream", checkSubject, "loopbus.dlq.>", "not under loopbus.evt.>"},
		{"subject empty token", checkSubject, "loopbus.evt..task.added", "empty token"},
		{"subject > not last", checkSubject, "loopbus.evt.>.added", "must be the last token"},
		{"subject partial wildcard", checkSubject, "loopbus.evt.s*.task.added", "whole tokens"},
		{"subject too short", checkSubject, "loopbus.evt.*.task", "matches no event"},
		{"subject too long", checkSubject, "loopbus.evt.*.task.added.x", "matches no event"},
		{"subject hook", checkSubject, "loopbus.evt.*.hook.>", "never trigger hooks"},
		{"subject space", checkSubject, "loopbus.evt.a b.task.added", "white space"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.check(tt.in)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Errorf("%q: unexpected error %v", tt.in, err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Errorf("%q: error %v, want one containing %q", tt.in, err, tt.wantErr)
			}
		})
	}
}

func TestConsumerSubjects(t *testing.T) {
	tests := []struct {
		name  string
		hooks []Hook
		want  []string
	}{
		{
			name:  "types map to subjects",
			hooks: []Hook{{Types: []string{"loopbus.task.updated", "loopbus.session.*"}}},
			want:  []string{"loopbus.evt.*.session.*", "loopbus.evt.*.task.updated"},
		},
		{
			name:  "a covered filter is dropped",
			hooks: []Hook{{Types: []string{"loopbus.task.updated", "loopbus.session.*"}, Subjects: []string{"loopbus.evt.*.task.>"}}},
			want:  []string{"loopbus.evt.*.session.*", "loopbus.evt.*.task.>"},
		},
		{
			name:  "duplicates across hooks",
			hooks: []Hook{{Types: []string{"loopbus.task.updated"}}, {Types: []string{"loopbus.task.updated"}}},
			want:  []string{"loopbus.evt.*.task.updated"},
		},
		{
			name:  "sessions narrow types and subjects",
			hooks: []Hook{{Types: []string{"loopbus.task.updated"}, Subjects: []string{"loopbus.evt.>", "loopbus.evt.b.step.*", "loopbus.evt.*.job.failed"}, Sessions: []string{"a"}}},
			want:  []string{"loopbus.evt.a.>"},
		},
		{
			name:  "sessions narrow without overlap",
			hooks: []Hook{{Types: []string{"loopbus.task.updated"}, Subjects: []string{"loopbus.evt.b.step.*", "loopbus.evt.*.job.failed"}, Sessions: []string{"a", "b"}}},
			want:  []string{"loopbus.evt.a.job.failed", "loopbus.evt.a.task.updated", "loopbus.evt.b.job.failed", "loopbus.evt.b.step.*", "loopbus.evt.b.task.updated"},
		},
		{
			name:  "partial overlap is joined",
			hooks: []Hook{{Types: []string{"loopbus.session.*"}}, {Subjects: []string{"loopbus.evt.demo.>"}}},
			want:  []string{"loopbus.evt.*.>"},
		},
		{
			name:  "overlapping wildcards are joined",
			hooks: []Hook{{Types: []string{"loopbus.*.completed", "loopbus.step.*"}}},
			want:  []string{"loopbus.evt.*.*.*"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var filters []string
			for _, h := range tt.hooks {
				filters = append(filters, h.filters()...)
			}
			got := consumerSubjects(filters)
			if !slices.Equal(got, tt.want) {
				t.Errorf("consumerSubjects(%q) = %q, want %q", filters, got, tt.want)
			}
			// Whatever the result, it must cover every filter without overlaps.
			for _, f := range filters {
				if !slices.ContainsFunc(got, func(g string) bool { return covers(g, f) }) {
					t.Errorf("%q is covered by none of %q", f, got)
				}
			}
			for i := range got {
				for j := i + 1; j < len(got); j++ {
					if overlaps(got[i], got[j]) {
						t.Errorf("%q and %q overlap", got[i], got[j])
					}
				}
			}
		})
	}
}

func TestCoversOverlaps(t *testing.T) {
	tests := []struct {
		a, b             string
		covers, overlaps bool
	}{
		{"loopbus.evt.>", "loopbus.evt.*.task.done", true, true},
		{"loopbus.evt.*.task.done", "loopbus.evt.>", false, true},
		{"loopbus.evt.*.task.*", "loopbus.evt.s.task.done", true, true},
		{"loopbus.evt.s.task.*", "loopbus.evt.*.task.done", false, true},
		{"loopbus.evt.s.task.*", "loopbus.evt.t.task.*", false, false},
		{"loopbus.evt.*.task.>", "loopbus.evt.*.step.>", false, false},
		{"loopbus.evt.*.task.done", "loopbus.evt.*.task.done", true, true},
		{"loopbus.evt.*.>", "loopbus.evt.*.*.*", true, true},
		{"loopbus.evt.*.*.*", "loopbus.evt.*.>", false, true},
	}
	for _, tt := range tests {
		if got := covers(tt.a, tt.b); got != tt.covers {
			t.Errorf("covers(%q, %q) = %v, want %v", tt.a, tt.b, got, tt.covers)
		}
		if got := overlaps(tt.a, tt.b); got != tt.overlaps {
			t.Errorf("overlaps(%q, %q) = %v, want %v", tt.a, tt.b, got, tt.overlaps)
		}
	}
}
