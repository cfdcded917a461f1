package orchestrator

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/loopbus/loopbus/schemas"
)

// The decider's specification: given events (folded with Evolve) → the
// events Decide returns. No NATS here.

const (
	sess    = "s1"
	startID = "start-s1" // id of the given session.started: every decision's correlation
)

var fixedNow = time.Date(2025, 3, 4, 5, 6, 7, 0, time.UTC)

// ---- pipelines ----------------------------------------------------------

func agent(script string) schemas.AgentSpec {
	return schemas.AgentSpec{Backend: "exec", Command: []string{"sh", "agents/" + script}}
}

// chainPipeline is summary → ideas → writing-kit (final); writing-kit also
// requires summary. summary's prompt uses .Feedback, ideas' does not.
func chainPipeline() schemas.Pipeline {
	return schemas.Pipeline{
		Name:   "writing-kit",
		Source: "pipeline.yaml",
		Dir:    "/srv/pipelines/writing-kit",
		Steps: []schemas.Step{
			{
				Name:          "summary",
				Agent:         agent("summarize.sh"),
				Prompt:        "Summarize in/{{.Input.Name}}.{{if .Feedback}}\nFix:\n{{.Feedback}}{{end}}",
				Outputs:       []schemas.Output{{Name: "summary.json", SchemaVersion: "summary/v1"}},
				MaxIterations: 3,
				TimeoutMs:     120000,
			},
			{
				Name:              "ideas",
				Requires:          []string{"summary"},
				Agent:             agent("ideas.sh"),
				Prompt:            `Ideas for {{.Input.Name}} from {{(index .Artifacts "summary.json").Object}} (iteration {{.Iteration}}).`,
				Outputs:           []schemas.Output{{Name: "ideas.json", SchemaVersion: "ideas/v1"}},
				Validate:          []string{"sh", "-c", "grep -q hook out/ideas.json"},
				ValidateTimeoutMs: 5000,
				MaxIterations:     2,
				TimeoutMs:         60000,
			},
			{
				Name:          "writing-kit",
				Requires:      []string{"summary", "ideas"},
				Agent:         agent("kit.sh"),
				Prompt:        "Kit for {{.Session}}/{{.Step}}.",
				Outputs:       []schemas.Output{{Name: "writing-kit.json"}},
				MaxIterations: 1,
				TimeoutMs:     60000,
				Final:         true,
			},
		},
	}
}

// diamondPipeline is a; b and c require a; d requires b and c.
func diamondPipeline() schemas.Pipeline {
	step := func(name string, requires ...string) schemas.Step {
		return schemas.Step{
			Name: name, Requires: requires, Agent: agent(name + ".sh"),
			Prompt:        "step " + name + " of {{.Input.Name}}",
			Outputs:       []schemas.Output{{Name: name + ".json"}},
			MaxIterations: 2, TimeoutMs: 1000,
		}
	}
	return schemas.Pipeline{Name: "diamond", Dir: "/srv/diamond", Steps: []schemas.Step{
		step("a"), step("b", "a"), step("c", "a"), step("d", "b", "c"),
	}}
}

// singlePipeline has one step with two versioned outputs and no final flag.
func singlePipeline() schemas.Pipeline {
	return schemas.Pipeline{Name: "single", Steps: []schemas.Step{{
		Name: "only", Agent: agent("only.sh"), Prompt: "Do {{.Input.Name}} ({{.Iteration}})",
		Outputs:       []schemas.Output{{Name: "one.json", SchemaVersion: "one/v1"}, {Name: "two.json", SchemaVersion: "two/v2"}},
		MaxIterations: 2, TimeoutMs: 1000,
	}}}
}

// rootsPipeline has two independent roots, y listed before x.
func rootsPipeline() schemas.Pipeline {
	return schemas.Pipeline{Name: "roots", Steps: []schemas.Step{
		{Name: "y", Agent: agent("y.sh"), Prompt: "y {{.Input.Name}}", MaxIterations: 1, TimeoutMs: 1000},
		{Name: "x", Agent: agent("x.sh"), Prompt: "x {{.Input.Name}}", MaxIterations: 1, TimeoutMs: 1000},
	}}
}

// promptPipeline is a single step "p" with the given prompt.
func promptPipeline(prompt string, maxIter int) schemas.Pipeline {
	return schemas.Pipeline{Name: "prompt", Steps: []schemas.Step{{
		Name: "p", Agent: agent("p.sh"), Prompt: prompt, MaxIterations: maxIter, TimeoutMs: 1000,
	}}}
}

func stepDef(t *testing.T, p schemas.Pipeline, name string) schemas.Step {
	t.Helper()
	for _, s := range p.Steps {
		if s.Name == name {
			return s
		}
	}
	t.Fatalf("pipeline %s has no step %s", p.Name, name)
	return schemas.Step{}
}

// ---- artifacts ----------------------------------------------------------

func input() schemas.ArtifactRef {
	return schemas.ArtifactRef{
		Name: "article.md", Object: sess + "/input/article.md", Digest: schemas.Digest([]byte("# Article")),
		Size: 9, ContentType: "text/markdown",
	}
}

func art(step, name string) schemas.ArtifactRef {
	return schemas.ArtifactRef{
		Name: name, Object: sess + "/" + step + "/" + name, Digest: schemas.Digest([]byte(step + "/" + name)),
		Size: 42, ContentType: "application/json", Step: step,
	}
}

// ---- given events -------------------------------------------------------

func jid(step string, iteration int) string { return fmt.Sprintf("%s.%s.%d", sess, step, iteration) }

func started(p schemas.Pipeline) schemas.Event {
	in := input()
	return schemas.Event{
		ID: startID, Type: schemas.TypeSessionStarted, Session: sess, Correlation: startID,
		Data: &schemas.SessionStarted{Pipeline: p, Input: in, SourceHash: schemas.ShortHash(in.Digest)},
	}
}

// requested is a job.requested as the orchestrator emitted it earlier (only
// what Evolve reads matters).
func requested(step string, iteration int, fb ...schemas.Feedback) schemas.Event {
	if len(fb) == 0 {
		fb = nil
	}
	return schemas.Event{
		ID:   schemas.DeterministicID(sess, schemas.TypeJobRequested, step, strconv.Itoa(iteration)),
		Type: schemas.TypeJobRequested, Session: sess, Step: step, Job: jid(step, iteration), Correlation: startID,
		Data: &schemas.JobRequested{JobID: jid(step, iteration), Step: step, Iteration: iteration, Attempt: 1, Prompt: "…", Feedback: fb},
	}
}

func passed(step string, iteration int, arts ...schemas.ArtifactRef) schemas.Event {
	return schemas.Event{
		ID:   fmt.Sprintf("passed-%s-%d", step, iteration),
		Type: schemas.TypeValidationPassed, Session: sess, Step: step, Job: jid(step, iteration), Correlation: startID,
		Data: &schemas.Verdict{JobID: jid(step, iteration), Step: step, Iteration: iteration, Artifacts: arts},
	}
}

func rejected(step string, iteration int, hint string, errs ...schemas.ValidationError) schemas.Event {
	return schemas.Event{
		ID:   fmt.Sprintf("rejected-%s-%d", step, iteration),
		Type: schemas.TypeValidationFailed, Session: sess, Step: step, Job: jid(step, iteration), Correlation: startID,
		Data: &schemas.Verdict{JobID: jid(step, iteration), Step: step, Iteration: iteration, Errors: errs, RetryHint: hint},
	}
}

func jobFailed(step string, iteration int, msg, tail string) schemas.Event {
	return schemas.Event{
		ID:   fmt.Sprintf("jobfailed-%s-%d", step, iteration),
		Type: schemas.TypeJobFailed, Session: sess, Step: step, Job: jid(step, iteration), Correlation: startID,
		Data: &schemas.JobFailed{JobID: jid(step, iteration), Step: step, Iteration: iteration, Worker: "w1", ExitCode: 1, Error: msg, OutputTail: tail},
	}
}

func toolCompleted(step string, iteration int) schemas.Event {
	return schemas.Event{
		ID:   fmt.Sprintf("tool-%s-%d", step, iteration),
		Type: schemas.TypeToolCompleted, Session: sess, Step: step, Job: jid(step, iteration), Correlation: startID,
		Data: &schemas.ToolCompleted{JobID: jid(step, iteration), ToolID: "t1", Name: "sh", Status: "ok"},
	}
}

func stepCompleted(step string, iteration int, arts ...schemas.ArtifactRef) schemas.Event {
	return schemas.Event{
		ID:   schemas.DeterministicID(sess, schemas.TypeStepCompleted, step),
		Type: schemas.TypeStepCompleted, Session: sess, Step: step, Correlation: startID,
		Data: &schemas.StepCompleted{Step: step, JobID: jid(step, iteration), Iterations: iteration, Artifacts: arts, ContentHash: schemas.ContentHash(arts)},
	}
}

func sessionCompletedEv(final ...schemas.ArtifactRef) schemas.Event {
	return schemas.Event{
		ID:   schemas.DeterministicID(sess, schemas.TypeSessionCompleted),
		Type: schemas.TypeSessionCompleted, Session: sess, Correlation: startID,
		Data: &schemas.SessionCompleted{Final: final},
	}
}

func sessionFailedEv(reason string) schemas.Event {
	return schemas.Event{
		ID:   schemas.DeterministicID(sess, schemas.TypeSessionFailed),
		Type: schemas.TypeSessionFailed, Session: sess, Correlation: startID,
		Data: &schemas.SessionFailed{Reason: reason},
	}
}

func inSession(ev schemas.Event, session string) schemas.Event {
	ev.Session = session
	ev.ID += "-" + session
	return ev
}

// ---- expected events ----------------------------------------------------
//
// Ids pin the scheme: DeterministicID(session, type, step[, iteration]).
// Causation is left empty here and filled with the trigger's id by
// runDecide unless a case sets it.

func wantJob(t *testing.T, p schemas.Pipeline, step string, iteration int, prompt string, inputs []schemas.ArtifactRef, fb ...schemas.Feedback) schemas.Event {
	t.Helper()
	def := stepDef(t, p, step)
	if len(fb) == 0 {
		fb = nil
	}
	return schemas.Event{
		ID:   schemas.DeterministicID(sess, "loopbus.job.requested", step, strconv.Itoa(iteration)),
		Type: schemas.TypeJobRequested, Session: sess, Step: step, Job: sess + "." + step + "." + strconv.Itoa(iteration),
		Correlation: startID, Time: fixedNow,
		Data: &schemas.JobRequested{
			JobID: sess + "." + step + "." + strconv.Itoa(iteration), Step: step, Iteration: iteration, Attempt: 1,
			Agent: def.Agent, Prompt: prompt, Inputs: inputs, Outputs: def.Outputs, Validate: def.Validate,
			TimeoutMs: def.TimeoutMs, ValidateTimeoutMs: def.ValidateTimeoutMs, Dir: p.Dir, Feedback: fb,
		},
	}
}

func wantStepCompleted(step string, iterations int, schemaVersion string, arts ...schemas.ArtifactRef) schemas.Event {
	return schemas.Event{
		ID:   schemas.DeterministicID(sess, "loopbus.step.completed", step),
		Type: schemas.TypeStepCompleted, Session: sess, Step: step, Correlation: startID, Time: fixedNow,
		Data: &schemas.StepCompleted{
			Step: step, JobID: sess + "." + step + "." + strconv.Itoa(iterations), Iterations: iterations,
			Artifacts: arts, ContentHash: schemas.ContentHash(arts), SchemaVersion: schemaVersion,
		},
	}
}

func wantSessionCompleted(final ...schemas.ArtifactRef) schemas.Event {
	return schemas.Event{
		ID:   schemas.DeterministicID(sess, "loopbus.session.completed"),
		Type: schemas.TypeSessionCompleted, Session: sess, Correlation: startID, Time: fixedNow,
		Data: &schemas.SessionCompleted{Final: final},
	}
}

func wantStepFailed(step string, iterations int, reason string) schemas.Event {
	return schemas.Event{
		ID:   schemas.DeterministicID(sess, "loopbus.step.failed", step),
		Type: schemas.TypeStepFailed, Session: sess, Step: step, Correlation: startID, Time: fixedNow,
		Data: &schemas.StepFailed{Step: step, Iterations: iterations, Error: reason},
	}
}

func wantSessionFailed(step, reason string) schemas.Event {
	return schemas.Event{
		ID:   schemas.DeterministicID(sess, "loopbus.session.failed"),
		Type: schemas.TypeSessionFailed, Session: sess, Correlation: startID, Time: fixedNow,
		Data: &schemas.SessionFailed{Step: step, Reason: reason},
	}
}

// ---- harness ------------------------------------------------------------

// fold numbers the given events 1..n and folds them into a new State.
func fold(t *testing.T, given []schemas.Event) *State {
	t.Helper()
	st := NewState()
	st.Retain = true // finished sessions keep their steps, for a rerun
	for i := range given {
		given[i].Seq = uint64(i + 1)
		Evolve(st, given[i])
	}
	return st
}

// runDecide folds given, decides on the last given event and checks that
// Decide neither mutates the state nor varies between two calls.
func runDecide(t *testing.T, given []schemas.Event) []schemas.Event {
	t.Helper()
	if len(given) == 0 {
		t.Fatal("no given events")
	}
	st := fold(t, given)
	trigger := given[len(given)-1]
	return decideChecked(t, st, fold(t, given), trigger)
}

// decideChecked runs Decide(st, trigger) twice; twin is a separately folded
// copy of st used to prove st unchanged.
func decideChecked(t *testing.T, st, twin *State, trigger schemas.Event) []schemas.Event {
	t.Helper()
	if !reflect.DeepEqual(st, twin) {
		t.Fatal("folding the same events twice gave different states")
	}
	got := Decide(st, trigger, fixedNow)
	if !reflect.DeepEqual(st, twin) {
		t.Errorf("Decide mutated the state:\nbefore %s\nafter  %s", dump(twin), dump(st))
	}
	again := Decide(st, trigger, fixedNow)
	if !reflect.DeepEqual(got, again) {
		t.Errorf("Decide is not deterministic:\nfirst  %s\nsecond %s", dump(got), dump(again))
	}
	// The service's prompt memo changes nothing, filled or not, and
	// Decide changes nothing else of the state with it.
	twin.Prompts = NewPromptCache()
	for range 2 {
		if memo := Decide(twin, trigger, fixedNow); !reflect.DeepEqual(got, memo) {
			t.Errorf("Decide with parsed prompts kept differs:\nwithout %s\nwith    %s", dump(got), dump(memo))
		}
	}
	twin.Prompts = nil
	if !reflect.DeepEqual(st, twin) {
		t.Errorf("Decide with parsed prompts kept mutated the state:\nbefore %s\nafter  %s", dump(st), dump(twin))
	}
	return got
}

func dump(v any) string {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Sprintf("%+v", v)
	}
	return string(b)
}

// compareEvents compares on type, step, session, id, causation,
// correlation, job, time and data.
func compareEvents(t *testing.T, got, want []schemas.Event, trigger string) {
	t.Helper()
	type cmpEv struct {
		Type, Step, Session, ID, Causation, Correlation, Job string
		Time                                                 time.Time
		Data                                                 any
	}
	norm := func(evs []schemas.Event, fillCause bool) []cmpEv {
		out := make([]cmpEv, 0, len(evs))
		for _, e := range evs {
			c := e.Causation
			if fillCause && c == "" {
				c = trigger
			}
			out = append(out, cmpEv{e.Type, e.Step, e.Session, e.ID, c, e.Correlation, e.Job, e.Time, e.Data})
		}
		return out
	}
	g, w := norm(got, false), norm(want, true)
	if len(g) != len(w) {
		t.Fatalf("got %d events %v, want %d %v\ngot: %s", len(g), types(got), len(w), types(want), dump(g))
	}
	for i := range g {
		if !reflect.DeepEqual(g[i], w[i]) {
			t.Errorf("event %d (%s %s):\ngot  %s\nwant %s", i, w[i].Type, w[i].Step, dump(g[i]), dump(w[i]))
		}
	}
}

func types(evs []schemas.Event) []string {
	out := make([]string, len(evs))
	for i, e := range evs {
		out[i] = strings.TrimPrefix(e.Type, "loopbus.") + "/" + e.Step
	}
	return out
}

type decideCase struct {
	name  string
	given []schemas.Event
	want  []schemas.Event
}

func runCases(t *testing.T, cases []decideCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := runDecide(t, tc.given)
			compareEvents(t, got, tc.want, tc.given[len(tc.given)-1].ID)
		})
	}
}

// ---- the tables ---------------------------------------------------------

func TestDecideStart(t *testing.T) {
	chain, diamond, single, roots := chainPipeline(), diamondPipeline(), singlePipeline(), rootsPipeline()
	in := []schemas.ArtifactRef{input()}
	runCases(t, []decideCase{
		{
			name:  "chain dispatches its root",
			given: []schemas.Event{started(chain)},
			want:  []schemas.Event{wantJob(t, chain, "summary", 1, "Summarize in/article.md.", in)},
		},
		{
			name:  "diamond dispatches only a",
			given: []schemas.Event{started(diamond)},
			want:  []schemas.Event{wantJob(t, diamond, "a", 1, "step a of article.md", in)},
		},
		{
			name:  "single step",
			given: []schemas.Event{started(single)},
			want:  []schemas.Event{wantJob(t, single, "only", 1, "Do article.md (1)", in)},
		},
		{
			name:  "independent roots both, in pipeline order",
			given: []schemas.Event{started(roots)},
			want: []schemas.Event{
				wantJob(t, roots, "y", 1, "y article.md", in),
				wantJob(t, roots, "x", 1, "x article.md", in),
			},
		},
		{
			name:  "job in flight: nothing to do",
			given: []schemas.Event{started(chain), requested("summary", 1)},
		},
		{
			name:  "worker progress: nothing to do",
			given: []schemas.Event{started(chain), requested("summary", 1), toolCompleted("summary", 1)},
		},
		{
			name:  "repeated session.started changes nothing",
			given: []schemas.Event{started(chain), requested("summary", 1), started(diamond)},
		},
	})
}

func TestDecideProgress(t *testing.T) {
	chain, diamond, single := chainPipeline(), diamondPipeline(), singlePipeline()
	in := input()
	sum, ideas, kit := art("summary", "summary.json"), art("ideas", "ideas.json"), art("writing-kit", "writing-kit.json")
	a, b, c, d := art("a", "a.json"), art("b", "b.json"), art("c", "c.json"), art("d", "d.json")
	one, two := art("only", "one.json"), art("only", "two.json")

	chainAfterSummary := []schemas.Event{started(chain), requested("summary", 1), passed("summary", 1, sum), stepCompleted("summary", 1, sum)}
	diamondAfterA := []schemas.Event{started(diamond), requested("a", 1), passed("a", 1, a), stepCompleted("a", 1, a), requested("b", 1), requested("c", 1)}

	runCases(t, []decideCase{
		{
			name:  "chain: summary passes, ideas dispatched in the same decision",
			given: []schemas.Event{started(chain), requested("summary", 1), passed("summary", 1, sum)},
			want: []schemas.Event{
				wantStepCompleted("summary", 1, "summary/v1", sum),
				wantJob(t, chain, "ideas", 1, "Ideas for article.md from s1/summary/summary.json (iteration 1).", []schemas.ArtifactRef{in, sum}),
			},
		},
		{
			name:  "chain: ideas passes, writing-kit gets the input and both artifacts",
			given: append(clone(chainAfterSummary), requested("ideas", 1), passed("ideas", 1, ideas)),
			want: []schemas.Event{
				wantStepCompleted("ideas", 1, "ideas/v1", ideas),
				wantJob(t, chain, "writing-kit", 1, "Kit for s1/writing-kit.", []schemas.ArtifactRef{in, sum, ideas}),
			},
		},
		{
			name: "chain: last step passes, session completes with the final step's artifacts",
			given: append(clone(chainAfterSummary), requested("ideas", 1), passed("ideas", 1, ideas), stepCompleted("ideas", 1, ideas),
				requested("writing-kit", 1), passed("writing-kit", 1, kit)),
			want: []schemas.Event{
				wantStepCompleted("writing-kit", 1, "", kit),
				wantSessionCompleted(kit),
			},
		},
		{
			name:  "diamond: a passes, b and c dispatched together",
			given: []schemas.Event{started(diamond), requested("a", 1), passed("a", 1, a)},
			want: []schemas.Event{
				wantStepCompleted("a", 1, "", a),
				wantJob(t, diamond, "b", 1, "step b of article.md", []schemas.ArtifactRef{in, a}),
				wantJob(t, diamond, "c", 1, "step c of article.md", []schemas.ArtifactRef{in, a}),
			},
		},
		{
			name:  "diamond: b alone does not release d",
			given: append(clone(diamondAfterA), passed("b", 1, b)),
			want:  []schemas.Event{wantStepCompleted("b", 1, "", b)},
		},
		{
			name:  "diamond: c after b releases d with both artifacts",
			given: append(clone(diamondAfterA), passed("b", 1, b), stepCompleted("b", 1, b), passed("c", 1, c)),
			want: []schemas.Event{
				wantStepCompleted("c", 1, "", c),
				wantJob(t, diamond, "d", 1, "step d of article.md", []schemas.ArtifactRef{in, b, c}),
			},
		},
		{
			name:  "diamond: b and c both passed before a decision: one decision completes both and releases d",
			given: append(clone(diamondAfterA), passed("c", 1, c), passed("b", 1, b)),
			want: []schemas.Event{
				wantStepCompleted("b", 1, "", b),
				wantStepCompleted("c", 1, "", c),
				wantJob(t, diamond, "d", 1, "step d of article.md", []schemas.ArtifactRef{in, b, c}),
			},
		},
		{
			name: "diamond: d passes, session completes (last step is final by default)",
			given: append(clone(diamondAfterA), passed("c", 1, c), passed("b", 1, b), stepCompleted("b", 1, b), stepCompleted("c", 1, c),
				requested("d", 1), passed("d", 1, d)),
			want: []schemas.Event{wantStepCompleted("d", 1, "", d), wantSessionCompleted(d)},
		},
		{
			name:  "single: two versioned outputs, session completes",
			given: []schemas.Event{started(single), requested("only", 1), passed("only", 1, one, two)},
			want: []schemas.Event{
				wantStepCompleted("only", 1, "one/v1,two/v2", one, two),
				wantSessionCompleted(one, two),
			},
		},
		{
			name:  "single: passes at iteration 2",
			given: []schemas.Event{started(single), requested("only", 1), rejected("only", 1, "again"), requested("only", 2), passed("only", 2, one, two)},
			want: []schemas.Event{
				wantStepCompleted("only", 2, "one/v1,two/v2", one, two),
				wantSessionCompleted(one, two),
			},
		},
	})
}

func TestDecideRetry(t *testing.T) {
	chain, single := chainPipeline(), singlePipeline()
	in := input()
	sum := art("summary", "summary.json")
	titleErr := schemas.ValidationError{Artifact: "summary.json", Pointer: "/title", Message: "missing property 'title'", Source: "schema"}
	rootErr := schemas.ValidationError{Artifact: "ideas.json", Pointer: "", Message: "not an object", Source: "schema"}
	cmdErr := schemas.ValidationError{Message: "grep found no hook", Source: "command"}
	fbTitle := schemas.Feedback{Iteration: 1, Kind: "validation", Errors: []schemas.ValidationError{titleErr}, RetryHint: "add a title"}
	chainAfterSummary := []schemas.Event{started(chain), requested("summary", 1), passed("summary", 1, sum), stepCompleted("summary", 1, sum)}

	runCases(t, []decideCase{
		{
			name:  "validation failed, template uses .Feedback",
			given: []schemas.Event{started(chain), requested("summary", 1), rejected("summary", 1, "add a title", titleErr)},
			want: []schemas.Event{wantJob(t, chain, "summary", 2,
				"Summarize in/article.md.\nFix:\n"+
					"Iteration 1: the outputs failed validation.\n- summary.json /title: missing property 'title'\nHint: add a title\n",
				[]schemas.ArtifactRef{in}, fbTitle)},
		},
		{
			name:  "validation failed, template without .Feedback gets a feedback section",
			given: append(clone(chainAfterSummary), requested("ideas", 1), rejected("ideas", 1, "write JSON", rootErr, cmdErr)),
			want: []schemas.Event{wantJob(t, chain, "ideas", 2,
				"Ideas for article.md from s1/summary/summary.json (iteration 2)."+
					"\n\n## Feedback from earlier iterations\n\n"+
					"Iteration 1: the outputs failed validation.\n- ideas.json (root): not an object\n- grep found no hook\nHint: write JSON\n",
				[]schemas.ArtifactRef{in, sum},
				schemas.Feedback{Iteration: 1, Kind: "validation", Errors: []schemas.ValidationError{rootErr, cmdErr}, RetryHint: "write JSON"})},
		},
		{
			name: "feedback accumulates oldest first (validation, then job)",
			given: []schemas.Event{started(chain), requested("summary", 1), rejected("summary", 1, "add a title", titleErr),
				requested("summary", 2, fbTitle), jobFailed("summary", 2, "exit status 3", "panic: boom")},
			want: []schemas.Event{wantJob(t, chain, "summary", 3,
				"Summarize in/article.md.\nFix:\n"+
					"Iteration 1: the outputs failed validation.\n- summary.json /title: missing property 'title'\nHint: add a title\n"+
					"\n"+
					"Iteration 2: the agent run failed.\nexit status 3\nLast output:\npanic: boom\n",
				[]schemas.ArtifactRef{in},
				fbTitle,
				schemas.Feedback{Iteration: 2, Kind: "job", Message: "exit status 3\nLast output:\npanic: boom"})},
		},
		{
			name:  "job failed is a failed iteration: retry with job feedback",
			given: append(clone(chainAfterSummary), requested("ideas", 1), jobFailed("ideas", 1, "agent timed out after 1m0s", "")),
			want: []schemas.Event{wantJob(t, chain, "ideas", 2,
				"Ideas for article.md from s1/summary/summary.json (iteration 2)."+
					"\n\n## Feedback from earlier iterations\n\n"+
					"Iteration 1: the agent run failed.\nagent timed out after 1m0s\n",
				[]schemas.ArtifactRef{in, sum},
				schemas.Feedback{Iteration: 1, Kind: "job", Message: "agent timed out after 1m0s"})},
		},
		{
			name: "validation failed at max iterations fails step and session",
			given: []schemas.Event{started(chain),
				requested("summary", 1), rejected("summary", 1, "add a title", titleErr),
				requested("summary", 2, fbTitle), rejected("summary", 2, "", cmdErr),
				requested("summary", 3), rejected("summary", 3, "still no title", titleErr, cmdErr)},
			want: []schemas.Event{
				wantStepFailed("summary", 3, "no valid output after 3 of 3 iterations; last error: summary.json /title: missing property 'title'; grep found no hook"),
				wantSessionFailed("summary", "step summary failed: no valid output after 3 of 3 iterations; last error: summary.json /title: missing property 'title'; grep found no hook"),
			},
		},
		{
			name: "job failed at max iterations fails step and session with the error's first line",
			given: append(clone(chainAfterSummary), requested("ideas", 1), passed("ideas", 1, art("ideas", "ideas.json")),
				stepCompleted("ideas", 1, art("ideas", "ideas.json")), requested("writing-kit", 1),
				jobFailed("writing-kit", 1, "exit status 2\ngoroutine 1 [running]", "boom")),
			want: []schemas.Event{
				wantStepFailed("writing-kit", 1, "no valid output after 1 of 1 iterations; last error: exit status 2"),
				wantSessionFailed("writing-kit", "step writing-kit failed: no valid output after 1 of 1 iterations; last error: exit status 2"),
			},
		},
		{
			name:  "single: rejected at 1 of 2 retries",
			given: []schemas.Event{started(single), requested("only", 1), rejected("only", 1, "")},
			want: []schemas.Event{wantJob(t, single, "only", 2, "Do article.md (2)\n\n## Feedback from earlier iterations\n\nIteration 1: the outputs failed validation.\n",
				[]schemas.ArtifactRef{in}, schemas.Feedback{Iteration: 1, Kind: "validation"})},
		},
	})
}

func TestDecideIgnoresStaleAndIrrelevant(t *testing.T) {
	chain := chainPipeline()
	sum, ideas, kit := art("summary", "summary.json"), art("ideas", "ideas.json"), art("writing-kit", "writing-kit.json")
	chainAfterSummary := []schemas.Event{started(chain), requested("summary", 1), passed("summary", 1, sum), stepCompleted("summary", 1, sum), requested("ideas", 1)}
	done := append(clone(chainAfterSummary), passed("ideas", 1, ideas), stepCompleted("ideas", 1, ideas),
		requested("writing-kit", 1), passed("writing-kit", 1, kit), stepCompleted("writing-kit", 1, kit), sessionCompletedEv(kit))
	otherPassed := passed("summary", 1, sum)
	otherPassed.Session, otherPassed.ID = "s2", "passed-in-s2"

	runCases(t, []decideCase{
		{
			name:  "passed verdict for an old job id",
			given: []schemas.Event{started(chain), requested("summary", 1), rejected("summary", 1, "x"), requested("summary", 2), passed("summary", 1, sum)},
		},
		{
			name:  "failed verdict for an old job id",
			given: []schemas.Event{started(chain), requested("summary", 1), rejected("summary", 1, "x"), requested("summary", 2), rejected("summary", 1, "x")},
		},
		{
			name:  "job failed for an old job id",
			given: []schemas.Event{started(chain), requested("summary", 1), rejected("summary", 1, "x"), requested("summary", 2), jobFailed("summary", 1, "late", "")},
		},
		{
			name:  "second verdict for the same job does not override the first",
			given: []schemas.Event{started(chain), requested("summary", 1), rejected("summary", 1, "x"), requested("summary", 2), passed("summary", 2, sum), stepCompleted("summary", 2, sum), requested("ideas", 1), rejected("summary", 2, "late")},
		},
		{
			name:  "verdict for a job never requested",
			given: []schemas.Event{started(chain), requested("summary", 1), passed("summary", 7, sum)},
		},
		{
			name:  "verdict for an unknown step",
			given: []schemas.Event{started(chain), requested("summary", 1), passed("nope", 1, sum)},
		},
		{
			name:  "duplicate validation.passed after step.completed",
			given: append(clone(chainAfterSummary), passed("summary", 1, sum)),
		},
		{
			name:  "duplicate step.completed",
			given: append(clone(chainAfterSummary), stepCompleted("summary", 1, sum)),
		},
		{
			name:  "event of an unknown session",
			given: []schemas.Event{started(chain), requested("summary", 1), otherPassed},
		},
		{
			name:  "event of a session before its start",
			given: []schemas.Event{otherPassed},
		},
		{
			name:  "anything after session.completed",
			given: append(clone(done), passed("writing-kit", 1, kit)),
		},
		{
			name:  "session.completed itself",
			given: clone(done),
		},
		{
			name:  "after session.failed, even with a ready step",
			given: []schemas.Event{started(chain), sessionFailedEv("cancelled")},
		},
		{
			name:  "after session.failed, a passed verdict",
			given: []schemas.Event{started(chain), requested("summary", 1), sessionFailedEv("cancelled"), passed("summary", 1, sum)},
		},
	})
}

// TestDecideLevelTriggered: a passed verdict whose decision was lost (a crash
// between reading it and publishing) is decided on any later event of the
// session, including the synthetic trigger the service uses after catch-up.
func TestDecideLevelTriggered(t *testing.T) {
	chain := chainPipeline()
	in, sum := input(), art("summary", "summary.json")
	tool := toolCompleted("summary", 1)
	tool.ID = "late-tool"
	for _, tc := range []struct {
		name    string
		trigger schemas.Event
	}{
		{"unrelated later event", tool},
		{"catch-up trigger (id and session only)", schemas.Event{ID: "passed-summary-1", Session: sess}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			given := []schemas.Event{started(chain), requested("summary", 1), passed("summary", 1, sum)}
			if tc.trigger.Type != "" {
				given = append(given, tc.trigger)
			}
			st := fold(t, given)
			got := decideChecked(t, st, fold(t, given), tc.trigger)
			compareEvents(t, got, []schemas.Event{
				wantStepCompleted("summary", 1, "summary/v1", sum),
				wantJob(t, chain, "ideas", 1, "Ideas for article.md from s1/summary/summary.json (iteration 1).", []schemas.ArtifactRef{in, sum}),
			}, tc.trigger.ID)
		})
	}
}

// TestDecideOtherSessionsUntouched: sessions interleaved in one state are
// decided independently.
func TestDecideOtherSessionsUntouched(t *testing.T) {
	chain := chainPipeline()
	sum := art("summary", "summary.json")
	given := []schemas.Event{
		started(chain), inSession(started(chain), "s2"),
		requested("summary", 1), inSession(requested("summary", 1), "s2"),
		inSession(passed("summary", 1, sum), "s2"),
		rejected("summary", 1, "x"),
	}
	st := fold(t, given)
	got := decideChecked(t, st, fold(t, given), given[len(given)-1])
	if len(got) != 1 || got[0].Session != sess || got[0].Type != schemas.TypeJobRequested || got[0].Step != "summary" {
		t.Fatalf("decision for s1: got %v", types(got))
	}
	if jr := got[0].Data.(*schemas.JobRequested); jr.Iteration != 2 {
		t.Errorf("iteration %d, want 2", jr.Iteration)
	}
	s2 := st.Sessions["s2"]
	if s2 == nil || s2.Steps["summary"].Outcome != outcomePassed {
		t.Fatalf("s2's passed verdict not in state: %+v", s2)
	}
}

// TestDecidePromptTemplateErrors: a template that cannot be rendered fails
// the step and the session; the reason says it is the prompt template.
func TestDecidePromptTemplateErrors(t *testing.T) {
	badIdeas := chainPipeline()
	badIdeas.Steps[1].Prompt = "Ideas from {{.Artifacts.missing.Name}}"
	sum := art("summary", "summary.json")

	type wantEv struct {
		typ, step  string
		iterations int // step.failed only
	}
	cases := []struct {
		name  string
		given []schemas.Event
		// want: the failing decision, in order. Any step.completed / job
		// requested before it is compared exactly by prefix.
		prefix []schemas.Event
		want   []wantEv
	}{
		{
			name:  "missing map key (missingkey=error)",
			given: []schemas.Event{started(promptPipeline("Read {{.Artifacts.missing.Name}}", 2))},
			want:  []wantEv{{schemas.TypeStepFailed, "p", 0}, {schemas.TypeSessionFailed, "", 0}},
		},
		{
			name:  "nonexistent field",
			given: []schemas.Event{started(promptPipeline("Read {{.Nope}}", 2))},
			want:  []wantEv{{schemas.TypeStepFailed, "p", 0}, {schemas.TypeSessionFailed, "", 0}},
		},
		{
			name:  "calling a method on a string",
			given: []schemas.Event{started(promptPipeline("Read {{.Input.Name.Upper}}", 2))},
			want:  []wantEv{{schemas.TypeStepFailed, "p", 0}, {schemas.TypeSessionFailed, "", 0}},
		},
		{
			name:  "parse error",
			given: []schemas.Event{started(promptPipeline("Read {{.Input.Name", 2))},
			want:  []wantEv{{schemas.TypeStepFailed, "p", 0}, {schemas.TypeSessionFailed, "", 0}},
		},
		{
			name: "fails only on retry",
			given: []schemas.Event{started(promptPipeline("Read {{.Input.Name}}{{if .Feedback}}{{.Artifacts.x.Name}}{{end}}", 3)),
				requested("p", 1), rejected("p", 1, "again")},
			want: []wantEv{{schemas.TypeStepFailed, "p", 1}, {schemas.TypeSessionFailed, "", 0}},
		},
		{
			name:   "downstream step: upstream completes, then the downstream step fails in the same decision",
			given:  []schemas.Event{started(badIdeas), requested("summary", 1), passed("summary", 1, sum)},
			prefix: []schemas.Event{wantStepCompleted("summary", 1, "summary/v1", sum)},
			want:   []wantEv{{schemas.TypeStepFailed, "ideas", 0}, {schemas.TypeSessionFailed, "", 0}},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := runDecide(t, tc.given)
			trigger := tc.given[len(tc.given)-1].ID
			if len(got) != len(tc.prefix)+len(tc.want) {
				t.Fatalf("got %v, want %d events", types(got), len(tc.prefix)+len(tc.want))
			}
			compareEvents(t, got[:len(tc.prefix)], tc.prefix, trigger)
			var stepReason string
			for i, w := range tc.want {
				ev := got[len(tc.prefix)+i]
				if ev.Type != w.typ || ev.Step != w.step || ev.Session != sess || ev.Causation != trigger || ev.Correlation != startID || !ev.Time.Equal(fixedNow) {
					t.Errorf("event %d: got %s step %q session %q causation %q correlation %q, want %s step %q",
						i, ev.Type, ev.Step, ev.Session, ev.Causation, ev.Correlation, w.typ, w.step)
					continue
				}
				switch d := ev.Data.(type) {
				case *schemas.StepFailed:
					if wantID := schemas.DeterministicID(sess, "loopbus.step.failed", w.step); ev.ID != wantID {
						t.Errorf("step.failed id %s, want %s", ev.ID, wantID)
					}
					if d.Step != w.step || d.Iterations != w.iterations || !strings.HasPrefix(d.Error, "prompt template: ") {
						t.Errorf("step.failed data %+v, want step %s, iterations %d, error starting with \"prompt template: \"", d, w.step, w.iterations)
					}
					stepReason = d.Error
				case *schemas.SessionFailed:
					if wantID := schemas.DeterministicID(sess, "loopbus.session.failed"); ev.ID != wantID {
						t.Errorf("session.failed id %s, want %s", ev.ID, wantID)
					}
					failed := tc.want[0].step
					if d.Step != failed || d.Reason != "step "+failed+" failed: "+stepReason {
						t.Errorf("session.failed data %+v, want step %s and reason %q", d, failed, "step "+failed+" failed: "+stepReason)
					}
					if !strings.Contains(d.Reason, "prompt template") {
						t.Errorf("reason %q does not mention the prompt template", d.Reason)
					}
				default:
					t.Errorf("event %d: unexpected data %T", i, ev.Data)
				}
			}
		})
	}
}

// TestDecideDeterministic: the same state decided twice, or two states folded
// from the same events, give identical events with identical ids.
func TestDecideDeterministic(t *testing.T) {
	diamond := diamondPipeline()
	given := []schemas.Event{started(diamond), requested("a", 1), passed("a", 1, art("a", "a.json"))}
	st1, st2 := fold(t, given), fold(t, given)
	trigger := given[len(given)-1]
	first := Decide(st1, trigger, fixedNow)
	second := Decide(st1, trigger, fixedNow)
	other := Decide(st2, trigger, fixedNow)
	if len(first) != 3 {
		t.Fatalf("got %v, want step.completed and two job.requested", types(first))
	}
	if !reflect.DeepEqual(first, second) || !reflect.DeepEqual(first, other) {
		t.Fatalf("decisions differ:\n%s\n%s\n%s", dump(first), dump(second), dump(other))
	}
	// A later clock changes only the time, never an id.
	later := Decide(st1, trigger, fixedNow.Add(time.Hour))
	for i := range first {
		if later[i].ID != first[i].ID {
			t.Errorf("event %d: id %s at a later time, %s before", i, later[i].ID, first[i].ID)
		}
	}
	seen := map[string]bool{}
	for _, ev := range first {
		if seen[ev.ID] {
			t.Errorf("id %s used twice in one decision", ev.ID)
		}
		seen[ev.ID] = true
	}
}

// TestDecideDoesNotMutate covers a deep comparison after decisions of every
// kind (runDecide checks it too for every table case).
func TestDecideDoesNotMutate(t *testing.T) {
	chain, diamond := chainPipeline(), diamondPipeline()
	sum := art("summary", "summary.json")
	titleErr := schemas.ValidationError{Artifact: "summary.json", Pointer: "/title", Message: "missing"}
	for _, tc := range []struct {
		name  string
		given []schemas.Event
	}{
		{"start", []schemas.Event{started(diamond)}},
		{"complete and dispatch", []schemas.Event{started(diamond), requested("a", 1), passed("a", 1, art("a", "a.json"))}},
		{"retry", []schemas.Event{started(chain), requested("summary", 1), rejected("summary", 1, "h", titleErr),
			requested("summary", 2, schemas.Feedback{Iteration: 1, Kind: "validation", Errors: []schemas.ValidationError{titleErr}}),
			rejected("summary", 2, "h", titleErr)}},
		{"exhausted", []schemas.Event{started(chain), requested("summary", 1), jobFailed("summary", 1, "x", ""),
			requested("summary", 2), jobFailed("summary", 2, "x", ""), requested("summary", 3), jobFailed("summary", 3, "x", "")}},
		{"session completes", []schemas.Event{started(singlePipeline()), requested("only", 1), passed("only", 1, sum)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, twin := fold(t, tc.given), fold(t, tc.given)
			trigger := tc.given[len(tc.given)-1]
			if got := Decide(st, trigger, fixedNow); len(got) == 0 {
				t.Fatal("no decision; the case does not exercise anything")
			}
			if !reflect.DeepEqual(st, twin) {
				t.Errorf("Decide mutated the state:\nbefore %s\nafter  %s", dump(twin), dump(st))
			}
			// Deciding again from the untouched state gives the same again.
			if a, b := Decide(st, trigger, fixedNow), Decide(twin, trigger, fixedNow); !reflect.DeepEqual(a, b) {
				t.Errorf("second decision differs")
			}
		})
	}
}

// TestEvolveFeedbackNotAliased: the state keeps its own copy of a
// job.requested's feedback.
func TestEvolveFeedbackNotAliased(t *testing.T) {
	fb := []schemas.Feedback{{Iteration: 1, Kind: "job", Message: "x"}}
	ev := requested("summary", 2, fb...)
	st := fold(t, []schemas.Event{started(chainPipeline()), ev})
	ev.Data.(*schemas.JobRequested).Feedback[0].Message = "changed"
	if got := st.Sessions[sess].Steps["summary"].Feedback[0].Message; got != "x" {
		t.Errorf("state feedback changed with the event: %q", got)
	}
}

func TestRenderPrompt(t *testing.T) {
	data := PromptData{
		Input:     input(),
		Artifacts: map[string]schemas.ArtifactRef{"summary.json": art("summary", "summary.json")},
		Iteration: 2, Session: sess, Step: "ideas",
	}
	withFB := data
	withFB.Feedback = "Iteration 1: bad\n"
	tests := []struct {
		name    string
		text    string
		data    PromptData
		want    string
		wantErr bool
	}{
		{name: "fields", text: "{{.Session}}/{{.Step}}#{{.Iteration}} {{.Input.Name}} {{(index .Artifacts \"summary.json\").Digest}}",
			data: data, want: "s1/ideas#2 article.md " + art("summary", "summary.json").Digest},
		{name: "no feedback, nothing appended", text: "plain", data: data, want: "plain"},
		{name: "feedback appended when unused", text: "plain", data: withFB,
			want: "plain\n\n## Feedback from earlier iterations\n\nIteration 1: bad\n"},
		{name: "feedback not appended when used", text: "plain {{.Feedback}}", data: withFB, want: "plain Iteration 1: bad\n"},
		{name: "feedback used only in a condition counts as used", text: "plain{{if .Feedback}}!{{end}}", data: withFB, want: "plain!"},
		{name: "missing key", text: "{{.Artifacts.nope.Name}}", data: data, wantErr: true},
		{name: "missing field", text: "{{.Nope}}", data: data, wantErr: true},
		{name: "parse error", text: "{{if}}", data: data, wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := RenderPrompt(tc.text, tc.data)
			if tc.wantErr {
				if err == nil || !strings.HasPrefix(err.Error(), "prompt template: ") {
					t.Fatalf("got %q, %v; want a \"prompt template: \" error", got, err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

func clone(evs []schemas.Event) []schemas.Event { return append([]schemas.Event(nil), evs...) }
