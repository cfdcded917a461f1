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
