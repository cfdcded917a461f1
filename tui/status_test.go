package tui

import (
	"bytes"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/loopbus/loopbus/schemas"
)

var spaces = regexp.MustCompile(` +`)

func TestWriteStatus(t *testing.T) {
	now := base.Add(time.Minute)
	tests := []struct {
		name    string
		events  func() *events
		now     time.Time
		want    []string
		notWant []string
	}{
		{
			name:   "held steps, budget stop, cost against the budget, signals",
			events: controlled,
			now:    now,
			want: []string{
				"status    stopped by the budget: cost $0.105 reached the budget of $0.10\n",
				"cost      $0.105 of $0.10\n",
				"tokens    45,000 in, 7,000 out (52,000 of 100,000)\n",
				"STEP  STATUS ",
				"a     waiting until 15:00:00 (usage limit)  1/3   45.0k/7.0k     $0.105 ",
				"b     breaker open: no progress in 3 iterations ",
				"c     stopped: wrong tone ",
				"0/2 ",
				"1 job cancelled",
				"d     paused ",
				"stop  enough  ignored: session already stopped",
			},
		},
		{
			name:   "a wait on another day shows the date",
			events: controlled,
			now:    base.Add(-24 * time.Hour),
			want:   []string{"waiting until " + base.Add(5*time.Hour).Format("2006-01-02") + " 15:00:00 (usage limit)"},
		},
		{
			name: "paused, then resumed",
			events: func() *events {
				e := started()
				e.add(schemas.TypeSessionPaused, "", &schemas.SessionPaused{Reason: "lunch"})
				return e
			},
			now:     now,
			want:    []string{"status    paused: lunch\n", "cost      $0.00 of $0.10\n", "a     pending  0/3   -              -     "},
			notWant: []string{"restarts"},
		},
		{
			name: "a job handed out again: the restart is counted",
			events: func() *events {
				e := started()
				e.add(schemas.TypeJobRequested, "a", &schemas.JobRequested{JobID: "ja1", Step: "a", Iteration: 1})
				e.add(schemas.TypeJobStarted, "a", &schemas.JobStarted{JobID: "ja1", Worker: "w1", Delivery: 1})
				e.add(schemas.TypeJobStarted, "a", &schemas.JobStarted{JobID: "ja1", Worker: "w2", Delivery: 2})
				return e
			},
			now:  now,
			want: []string{"restarts  1 (agents run again: their jobs were handed out again after a worker was lost)\n"},
		},
		{
			name: "a reason that names the state is not repeated",
			events: func() *events {
				e := started()
				e.add(schemas.TypeSessionStopped, "", &schemas.SessionStopped{Kind: schemas.StopSignal, Reason: "stopped by signal: wrong brief"})
				return e
			},
			now:     now,
			want:    []string{"status    stopped by signal: wrong brief\n"},
			notWant: []string{"stopped: stopped"},
		},
		{
			name: "no usage and no budget: no cost columns",
			events: func() *events {
				e := &events{}
				e.add(schemas.TypeSessionStarted, "", &schemas.SessionStarted{Pipeline: schemas.Pipeline{Name: "p", Steps: []schemas.Step{{Name: "a", MaxIterations: 1}}}})
				e.add(schemas.TypeSessionFailed, "", &schemas.SessionFailed{Reason: "step a failed"})
				return e
			},
			now:     now,
			want:    []string{"status    failed\n", "error     step a failed\n", "STEP  STATUS   ITER  HASH  DETAIL\n"},
			notWant: []string{"cost", "TOKENS", "signals"},
		},
		{
			name: "an imported session: paused until resumed, its imported steps say so",
			events: func() *events {
				e := &events{}
				e.add(schemas.TypeSessionStarted, "", &schemas.SessionStarted{Pipeline: schemas.Pipeline{Name: "p", Steps: []schemas.Step{
					{Name: "a", MaxIterations: 1, Outputs: []schemas.Output{{Name: "a.json"}}}, {Name: "b", Requires: []string{"a"}, MaxIterations: 1}}},
					Import: &schemas.ImportStart{Source: schemas.ImportSourceLooplia}})
				arts := []schemas.ArtifactRef{{Name: "a.json", Object: "s/import/a/a.json", Digest: schemas.Digest([]byte("{}")), Size: 2, Step: "a"}}
				e.add(schemas.TypeStepImported, "a", &schemas.StepImported{Step: "a", Artifacts: arts, ContentHash: schemas.ContentHash(arts), Source: schemas.ImportSourceLooplia})
				return e
			},
			now:  now,
			want: []string{"status    paused: imported: the steps not imported run on loopbus resume", "a completed 0/1 44136fa355b3678a imported (its agent did not run)\n", "b pending 0/1"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			if err := WriteStatus(&b, tc.events().manifest(t), false, tc.now); err != nil {
				t.Fatal(err)
			}
			// Column widths aside: runs of spaces compare as one.
			out := spaces.ReplaceAllString(b.String(), " ")
			for _, w := range tc.want {
				if !strings.Contains(out, spaces.ReplaceAllString(w, " ")) {
					t.Errorf("output lacks %q:\n%s", w, b.String())
				}
			}
			for _, w := range tc.notWant {
				if strings.Contains(out, w) {
					t.Errorf("output has %q:\n%s", w, b.String())
				}
			}
		})
	}
}
