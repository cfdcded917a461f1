package definition

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/loopbus/loopbus/schemas"
)

// limitsPipeline is a one-step pipeline with top (pipeline-level keys) and
// step (keys of the step, indented by four spaces) spliced in.
func limitsPipeline(top, step string) string {
	return "name: p\n" + top + `steps:
  a:
    agent: {backend: exec, command: [echo]}
    prompt: go
    outputs: [{name: a.txt}]
` + step
}

func TestParseBudgetAndBreaker(t *testing.T) {
	dir := testDir(t)
	tests := []struct {
		name        string
		top, step   string
		wantBudget  *schemas.Budget
		wantBreaker *schemas.Breaker
		wantStep    *schemas.Breaker
	}{
		{name: "absent"},
		{name: "null values are absent", top: "budget:\nbreaker:\n", step: "    breaker:\n"},
		{name: "empty mappings set nothing", top: "budget: {}\nbreaker: {}\n", step: "    breaker: {}\n"},
		{
			name:       "full budget",
			top:        "budget:\n  max_cost_usd: 2.5\n  max_tokens: 2000000\n  max_iterations: 40\n",
			wantBudget: &schemas.Budget{MaxCostUSD: 2.5, MaxTokens: 2_000_000, MaxIterations: 40},
		},
		{
			name:       "integer cost, one field",
			top:        "budget: {max_cost_usd: 3}\n",
			wantBudget: &schemas.Budget{MaxCostUSD: 3},
		},
		{
			name:       "largest token count",
			top:        "budget: {max_tokens: 9223372036854775807}\n",
			wantBudget: &schemas.Budget{MaxTokens: 1<<63 - 1},
		},
		{
			name:        "pipeline breaker",
			top:         "breaker: {no_progress: 4, identical_failures: 1}\n",
			wantBreaker: &schemas.Breaker{NoProgress: 4, IdenticalFailures: 1},
		},
		{
			name:        "step breaker keeps only its own thresholds",
			top:         "breaker: {no_progress: 4, identical_failures: 2}\n",
			step:        "    breaker: {identical_failures: 5}\n",
			wantBreaker: &schemas.Breaker{NoProgress: 4, IdenticalFailures: 2},
			wantStep:    &schemas.Breaker{IdenticalFailures: 5},
		},
		{
			name:     "step breaker without a pipeline one",
			step:     "    breaker:\n      no_progress: 2\n",
			wantStep: &schemas.Breaker{NoProgress: 2},
		},
		{
			name:        "anchors and merge keys",
			top:         "breaker: &br {no_progress: 6}\n",
			step:        "    breaker: {<<: *br, identical_failures: 7}\n",
			wantBreaker: &schemas.Breaker{NoProgress: 6},
			wantStep:    &schemas.Breaker{NoProgress: 6, IdenticalFailures: 7},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := Parse("p.yaml", []byte(limitsPipeline(tt.top, tt.step)), dir)
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if !reflect.DeepEqual(p.Budget, tt.wantBudget) {
				t.Errorf("Budget = %+v, want %+v", p.Budget, tt.wantBudget)
			}
			if !reflect.DeepEqual(p.Breaker, tt.wantBreaker) {
				t.Errorf("Breaker = %+v, want %+v", p.Breaker, tt.wantBreaker)
			}
			if !reflect.DeepEqual(p.Steps[0].Breaker, tt.wantStep) {
				t.Errorf("step Breaker = %+v, want %+v", p.Steps[0].Breaker, tt.wantStep)
			}
		})
	}
}

func TestParseBudgetAndBreakerErrors(t *testing.T) {
	dir := testDir(t)
	tests := []struct {
		name      string
		top, step string
		wantErr   []string // in order, each one problem of the file
	}{
		{
			name:    "budget not a mapping",
			top:     "budget: 5\n",
			wantErr: []string{`p.yaml:2: budget: want a mapping with keys max_cost_usd, max_tokens, max_iterations, got a number`},
		},
		{
			name:    "unknown budget key",
			top:     "budget:\n  max_cost: 5\n",
			wantErr: []string{`p.yaml:3: budget.max_cost: unknown key "max_cost" (allowed: max_cost_usd, max_tokens, max_iterations)`},
		},
		{
			name: "non-positive budget values",
			top:  "budget:\n  max_cost_usd: 0\n  max_tokens: -5\n  max_iterations: 0\n",
			wantErr: []string{
				`p.yaml:3: budget.max_cost_usd: want a number > 0, got 0`,
				`p.yaml:4: budget.max_tokens: want an integer > 0, got -5`,
				`p.yaml:5: budget.max_iterations: want an integer > 0, got 0`,
			},
		},
		{
			name: "wrong budget types",
			top:  "budget:\n  max_cost_usd: \"5\"\n  max_tokens: 1.5\n  max_iterations: [3]\n",
			wantErr: []string{
				`p.yaml:3: budget.max_cost_usd: want a number > 0, got the string "5"`,
				`p.yaml:4: budget.max_tokens: want an integer > 0, got 1.5`,
				`p.yaml:5: budget.max_iterations: want an integer > 0, got a list`,
			},
		},
		{
			name: "infinite and negative cost",
			top:  "budget: {max_cost_usd: .inf}\nbreaker: {no_progress: true}\n",
			wantErr: []string{
				`p.yaml:2: budget.max_cost_usd: want a number > 0, got .inf`,
				`p.yaml:3: breaker.no_progress: want an integer > 0, got true`,
			},
		},
		{
			name:    "negative cost",
			top:     "budget: {max_cost_usd: -0.01}\n",
			wantErr: []string{`p.yaml:2: budget.max_cost_usd: want a number > 0, got -0.01`},
		},
		{
			name: "too large",
			top:  "budget: {max_tokens: 9223372036854775808, max_iterations: 2147483648}\n",
			wantErr: []string{
				`p.yaml:2: budget.max_tokens: must be at most 9223372036854775807, got 9223372036854775808`,
				`p.yaml:2: budget.max_iterations: must be at most 2147483647, got 2147483648`,
			},
		},
		{
			name: "other integer forms",
			top:  "budget: {max_tokens: 0x0, max_iterations: 0o12}\nbreaker: {no_progress: 0x7fffffff1}\n",
			wantErr: []string{
				`p.yaml:2: budget.max_tokens: want an integer > 0, got 0x0`,
				`p.yaml:3: breaker.no_progress: must be at most 2147483647, got 0x7fffffff1`,
			},
		},
		{
			name:    "unknown breaker key",
			top:     "breaker: {no_progres: 2}\n",
			wantErr: []string{`p.yaml:2: breaker.no_progres: unknown key "no_progres" (allowed: no_progress, identical_failures)`},
		},
		{
			name: "step breaker below 1",
			step: "    breaker:\n      no_progress: 0\n      identical_failures: -2\n",
			wantErr: []string{
				`p.yaml:8: steps.a.breaker.no_progress: want an integer > 0, got 0`,
				`p.yaml:9: steps.a.breaker.identical_failures: want an integer > 0, got -2`,
			},
		},
		{
			name:    "step breaker not a mapping",
			step:    "    breaker: [3]\n",
			wantErr: []string{`p.yaml:7: steps.a.breaker: want a mapping with keys no_progress, identical_failures, got a list`},
		},
		{
			name:    "budget is pipeline-wide only",
			step:    "    budget: {max_tokens: 5}\n",
			wantErr: []string{`p.yaml:7: steps.a.budget: unknown key "budget"`},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse("p.yaml", []byte(limitsPipeline(tt.top, tt.step)), dir)
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
