package definition

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/loopbus/loopbus/schemas"
)

func TestParseApproval(t *testing.T) {
	dir := testDir(t)
	tests := []struct {
		name string
		step string
		want *schemas.Approval
	}{
		{name: "absent"},
		{name: "null is absent", step: "    approval:\n"},
		{name: "required", step: "    approval: required\n", want: &schemas.Approval{}},
		{name: "empty mapping is required", step: "    approval: {}\n", want: &schemas.Approval{}},
		{name: "timeout alone fails on timeout", step: "    approval: {timeout: 24h}\n", want: &schemas.Approval{TimeoutMs: 24 * 3600 * 1000}},
		{
			name: "timeout and on_timeout",
			step: "    approval:\n      timeout: 90s\n      on_timeout: reject\n",
			want: &schemas.Approval{TimeoutMs: 90_000, OnTimeout: schemas.OnTimeoutReject},
		},
		{name: "approve on timeout", step: "    approval: {timeout: 1m, on_timeout: approve}\n", want: &schemas.Approval{TimeoutMs: 60_000, OnTimeout: schemas.OnTimeoutApprove}},
		{name: "fail on timeout", step: "    approval: {timeout: 1m, on_timeout: fail}\n", want: &schemas.Approval{TimeoutMs: 60_000, OnTimeout: schemas.OnTimeoutFail}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := Parse("p.yaml", []byte(limitsPipeline("", tt.step)), dir)
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if got := p.Steps[0].Approval; !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Approval = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestParseApprovalErrors(t *testing.T) {
	dir := testDir(t)
	tests := []struct {
		name    string
		step    string
		wantErr []string
	}{
		{
			name:    "other word",
			step:    "    approval: yes please\n",
			wantErr: []string{`p.yaml:7: steps.a.approval: want required or {timeout: 24h, on_timeout: fail|reject|approve}, got the string "yes please"`},
		},
		{
			name:    "boolean",
			step:    "    approval: true\n",
			wantErr: []string{`p.yaml:7: steps.a.approval: want required or {timeout: 24h, on_timeout: fail|reject|approve}, got true`},
		},
		{
			name:    "list",
			step:    "    approval: [required]\n",
			wantErr: []string{`p.yaml:7: steps.a.approval: want a mapping with keys timeout, on_timeout, got a list`},
		},
		{
			name:    "unknown key",
			step:    "    approval:\n      timeout: 1h\n      on_timout: reject\n",
			wantErr: []string{`p.yaml:9: steps.a.approval.on_timout: unknown key "on_timout" (allowed: timeout, on_timeout)`},
		},
		{
			name:    "bad duration",
			step:    "    approval:\n      timeout: tomorrow\n",
			wantErr: []string{`p.yaml:8: steps.a.approval.timeout: invalid duration "tomorrow"`},
		},
		{
			name:    "zero duration",
			step:    "    approval: {timeout: 0s}\n",
			wantErr: []string{`p.yaml:7: steps.a.approval.timeout: must be > 0, got "0s"`},
		},
		{
			name:    "bad on_timeout",
			step:    "    approval:\n      timeout: 1h\n      on_timeout: retry\n",
			wantErr: []string{`p.yaml:9: steps.a.approval.on_timeout: want fail, reject or approve, got "retry"`},
		},
		{
			name:    "on_timeout without timeout",
			step:    "    approval:\n      on_timeout: approve\n",
			wantErr: []string{`p.yaml:8: steps.a.approval.on_timeout: applies only with a timeout`},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse("p.yaml", []byte(limitsPipeline("", tt.step)), dir)
			if err == nil {
				t.Fatalf("Parse succeeded, want %q", tt.wantErr)
			}
			checkInvalid(t, err)
			var errs Errors
			if !errors.As(err, &errs) {
				t.Fatalf("error %T is not Errors", err)
			}
			if len(errs) != len(tt.wantErr) {
				t.Fatalf("got %d problems, want %d:\n%v", len(errs), len(tt.wantErr), err)
			}
			for i, w := range tt.wantErr {
				if !strings.HasPrefix(errs[i].Error(), w) {
					t.Errorf("problem %d = %q, want prefix %q", i, errs[i].Error(), w)
				}
			}
		})
	}
}

// Loop levels take approval as steps do; a loops file takes
// job_dispatch_timeout as a pipeline does.
func TestParseLoopsApproval(t *testing.T) {
	dir := loopsDir(t)
	src := "kind: loops\nname: demo\nagent: {backend: claude}\njob_dispatch_timeout: 5m\nlevels:\n" +
		"  plan:\n    outputs: [{name: plan.md}]\n    approval: required\n    children: {level: code, from: plan.md, split: headings}\n" +
		"  code:\n    worktree: true\n    approval: {timeout: 24h, on_timeout: reject}\n"
	p, err := Parse("p.yaml", []byte(src), dir)
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	if p.JobDispatchTimeoutMs != 300_000 {
		t.Errorf("JobDispatchTimeoutMs = %d, want 300000", p.JobDispatchTimeoutMs)
	}
	want := []*schemas.Approval{{}, {TimeoutMs: 24 * 3600 * 1000, OnTimeout: schemas.OnTimeoutReject}}
	for i, lv := range p.Loops.Levels {
		if !reflect.DeepEqual(lv.Approval, want[i]) {
			t.Errorf("level %s: Approval = %+v, want %+v", lv.Name, lv.Approval, want[i])
		}
	}
	checkStarted(t, p)
}

// checkStarted fails t unless session.started carrying p fits its schema.
func checkStarted(t *testing.T, p schemas.Pipeline) {
	t.Helper()
	cat, err := schemas.NewCatalogue()
	if err != nil {
		t.Fatal(err)
	}
	in := schemas.ArtifactRef{Name: "in", Object: "o", Digest: "sha256:" + strings.Repeat("0", 64), Size: 1}
	if _, err := cat.Encode(schemas.TypeSessionStarted, &schemas.SessionStarted{Pipeline: p, Input: in, SourceHash: strings.Repeat("0", 16)}); err != nil {
		t.Errorf("session.started: %v", err)
	}
}

// Backlog files take approval gates by role, and job_dispatch_timeout.
func TestParseBacklogApproval(t *testing.T) {
	dir := backlogDir(t)
	src := minimalBacklog + "job_dispatch_timeout: 90s\napproval:\n  iterate: required\n  review: {timeout: 1h, on_timeout: approve}\n  bootstrap:\n"
	p, err := Parse("p.yaml", []byte(src), dir)
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	if p.JobDispatchTimeoutMs != 90_000 {
		t.Errorf("JobDispatchTimeoutMs = %d, want 90000", p.JobDispatchTimeoutMs)
	}
	want := map[string]schemas.Approval{
		schemas.RoleIterate: {},
		schemas.RoleReview:  {TimeoutMs: 3600 * 1000, OnTimeout: schemas.OnTimeoutApprove},
	}
	if !reflect.DeepEqual(p.Backlog.Approval, want) {
		t.Errorf("Approval = %+v, want %+v", p.Backlog.Approval, want)
	}
	checkStarted(t, p)
}

func TestParseGateErrors(t *testing.T) {
	loops, backlogs := loopsDir(t), backlogDir(t)
	const head = "kind: loops\nname: demo\nagent: {backend: claude}\nlevels:\n  plan:\n    outputs: [{name: plan.md}]\n" // the level's keys from line 7
	tests := []struct {
		name, dir, yaml string
		wantErr         []string
	}{
		{
			name: "a loop level's approval is not a gate", dir: loops,
			yaml:    head + "    approval: maybe\n",
			wantErr: []string{`p.yaml:7: levels.plan.approval: want required or {timeout: 24h, on_timeout: fail|reject|approve}, got the string "maybe"`},
		},
		{
			name: "a loop level's on_timeout is unknown", dir: loops,
			yaml:    head + "    approval:\n      timeout: 2h\n      on_timeout: retry\n",
			wantErr: []string{`p.yaml:9: levels.plan.approval.on_timeout: want fail, reject or approve, got "retry"`},
		},
		{
			name: "a loop level's approval timeout is not a duration", dir: loops,
			yaml:    head + "    approval: {timeout: soon}\n",
			wantErr: []string{`p.yaml:7: levels.plan.approval.timeout: invalid duration "soon"`},
		},
		{
			name: "a loops file's job_dispatch_timeout is not a duration", dir: loops,
			yaml:    "kind: loops\nname: demo\nagent: {backend: claude}\njob_dispatch_timeout: later\nlevels:\n  plan:\n    outputs: [{name: plan.md}]\n",
			wantErr: []string{`p.yaml:4: job_dispatch_timeout: invalid duration "later"`},
		},
		{
			name: "a backlog gate for an unknown role", dir: backlogs,
			yaml:    minimalBacklog + "approval:\n  merge: required\n",
			wantErr: []string{`p.yaml:9: approval.merge: unknown role "merge" (allowed: iterate, review, repair, bootstrap)`},
		},
		{
			name: "a backlog's approval is not a mapping of roles", dir: backlogs,
			yaml:    minimalBacklog + "approval: required\n",
			wantErr: []string{`p.yaml:8: approval: want a mapping from roles to gates, such as {iterate: required} (roles: iterate, review, repair, bootstrap), got the string "required"`},
		},
		{
			name: "a backlog role's gate is bad", dir: backlogs,
			yaml:    minimalBacklog + "approval:\n  iterate: {on_timeout: approve}\n",
			wantErr: []string{`p.yaml:9: approval.iterate.on_timeout: applies only with a timeout`},
		},
		{
			name: "a backlog's job_dispatch_timeout is zero", dir: backlogs,
			yaml:    minimalBacklog + "job_dispatch_timeout: 0s\n",
			wantErr: []string{`p.yaml:8: job_dispatch_timeout: must be > 0, got "0s"`},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse("p.yaml", []byte(tt.yaml), tt.dir)
			if err == nil {
				t.Fatalf("Parse succeeded, want %q", tt.wantErr)
			}
			checkInvalid(t, err)
			var errs Errors
			if !errors.As(err, &errs) {
				t.Fatalf("error %T is not Errors", err)
			}
			if len(errs) != len(tt.wantErr) {
				t.Fatalf("got %d problems, want %d:\n%v", len(errs), len(tt.wantErr), err)
			}
			for i, w := range tt.wantErr {
				if !strings.HasPrefix(errs[i].Error(), w) {
					t.Errorf("problem %d = %q, want prefix %q", i, errs[i].Error(), w)
				}
			}
		})
	}
}

// A null approval in a backlog is absent, as null is everywhere in the
// file.
func TestParseBacklogApprovalNull(t *testing.T) {
	p, err := Parse("p.yaml", []byte(minimalBacklog+"approval:\n"), backlogDir(t))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	if p.Backlog.Approval != nil {
		t.Errorf("Approval = %+v, want none", p.Backlog.Approval)
	}
}
