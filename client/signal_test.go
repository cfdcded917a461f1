package client

import (
	"context"
	"errors"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/internal/testnats"
	"github.com/loopbus/loopbus/schemas"
)

func TestParseSignalTarget(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    SignalTarget
		wantErr string
	}{
		{name: "all", in: "all", want: SignalTarget{All: true}},
		{name: "session", in: "kit-1", want: SignalTarget{Session: "kit-1"}},
		{name: "session and step", in: "kit-1/draft_2", want: SignalTarget{Session: "kit-1", Step: "draft_2"}},
		{name: "all takes no step", in: "all/draft", wantErr: "takes no step"},
		{name: "empty", in: "", wantErr: "invalid session id"},
		{name: "subject wildcard", in: "kit.>", wantErr: `invalid session id "kit.>"`},
		{name: "star", in: "*", wantErr: "invalid session id"},
		{name: "too long", in: strings.Repeat("s", 65), wantErr: "longer than 64"},
		{name: "empty step", in: "kit-1/", wantErr: `invalid step name ""`},
		{name: "bad step", in: "kit-1/a b", wantErr: `invalid step name "a b"`},
		{name: "two slashes", in: "kit-1/a/b", wantErr: `invalid step name "a/b"`},
		{name: "empty session", in: "/draft", wantErr: `invalid session id ""`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseSignalTarget(tt.in)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !errors.Is(err, ErrBadInput) {
					t.Fatalf("ParseSignalTarget(%q) = %+v, %v; want an ErrBadInput containing %q", tt.in, got, err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("ParseSignalTarget(%q) = %+v, %v; want %+v", tt.in, got, err, tt.want)
			}
			if got.String() != tt.in {
				t.Errorf("String() = %q, want %q", got.String(), tt.in)
			}
		})
	}
}

func TestSignalRequestCheck(t *testing.T) {
	session := SignalTarget{Session: "s1"}
	step := SignalTarget{Session: "s1", Step: "draft"}
	all := SignalTarget{All: true}
	tests := []struct {
		name    string
		req     SignalRequest
		wantErr string
	}{
		{name: "stop a session", req: SignalRequest{Verb: "stop", Target: session, Reason: "enough"}},
		{name: "pause a step", req: SignalRequest{Verb: "pause", Target: step}},
		{name: "resume all", req: SignalRequest{Verb: "resume", Target: all, Reason: "fixed"}},
		{name: "info", req: SignalRequest{Verb: "info", Target: step, Message: "use shorter titles"}},
		{name: "info of the largest size", req: SignalRequest{Verb: "info", Target: all, Message: strings.Repeat("é", schemas.MaxHintBytes/2)}},
		{name: "invalidate a step", req: SignalRequest{Verb: "invalidate", Target: step, Reason: "input revised"}},
		{name: "unknown verb", req: SignalRequest{Verb: "kill", Target: session}, wantErr: `unknown signal "kill"`},
		{name: "info without message", req: SignalRequest{Verb: "info", Target: session}, wantErr: "info needs --message"},
		{name: "info with blank message", req: SignalRequest{Verb: "info", Target: session, Message: " \n"}, wantErr: "info needs --message"},
		{name: "info message too long", req: SignalRequest{Verb: "info", Target: session, Message: strings.Repeat("x", schemas.MaxHintBytes+1)}, wantErr: "--message is 4097 bytes; at most 4096"},
		{name: "info message not UTF-8", req: SignalRequest{Verb: "info", Target: session, Message: "a\xffb"}, wantErr: "not valid UTF-8"},
		{name: "info with reason", req: SignalRequest{Verb: "info", Target: session, Message: "m", Reason: "r"}, wantErr: "info takes --message, not --reason"},
		{name: "stop with message", req: SignalRequest{Verb: "stop", Target: session, Message: "m"}, wantErr: "stop takes no --message"},
		{name: "invalidate with message", req: SignalRequest{Verb: "invalidate", Target: step, Message: "m"}, wantErr: "invalidate takes no --message"},
		{name: "reason too long", req: SignalRequest{Verb: "pause", Target: session, Reason: strings.Repeat("r", 5000)}, wantErr: "--reason is 5000 bytes"},
		{name: "invalidate a session", req: SignalRequest{Verb: "invalidate", Target: session}, wantErr: "invalidate needs SESSION/STEP"},
		{name: "invalidate all", req: SignalRequest{Verb: "invalidate", Target: all}, wantErr: "invalidate needs SESSION/STEP"},
		{name: "approve a step", req: SignalRequest{Verb: "approve", Target: step, By: "alice"}},
		{name: "approve with a comment", req: SignalRequest{Verb: "approve", Target: step, Reason: "reads well"}},
		{name: "reject with a reason", req: SignalRequest{Verb: "reject", Target: step, Reason: "too long", By: "bob"}},
		{name: "approve a session", req: SignalRequest{Verb: "approve", Target: session}, wantErr: "approve needs SESSION/STEP"},
		{name: "reject all", req: SignalRequest{Verb: "reject", Target: all, Reason: "r"}, wantErr: "reject needs SESSION/STEP"},
		{name: "reject without reason", req: SignalRequest{Verb: "reject", Target: step, Reason: " "}, wantErr: "reject needs --reason"},
		{name: "approve with message", req: SignalRequest{Verb: "approve", Target: step, Message: "m"}, wantErr: "approve takes no --message"},
		{name: "approve comment too long", req: SignalRequest{Verb: "approve", Target: step, Reason: strings.Repeat("r", 5000)}, wantErr: "--reason is 5000 bytes"},
		{name: "by on stop", req: SignalRequest{Verb: "stop", Target: session, By: "alice"}, wantErr: "stop takes no --by"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.req.Check()
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Check() = %v, want nil", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !errors.Is(err, ErrBadInput) {
				t.Fatalf("Check() = %v, want an ErrBadInput containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestCheckBudget(t *testing.T) {
	tests := []struct {
		name    string
		budget  schemas.Budget
		wantErr string
	}{
		{name: "all bounds", budget: schemas.Budget{MaxCostUSD: 1.5, MaxTokens: 10, MaxIterations: 3}},
		{name: "one bound", budget: schemas.Budget{MaxTokens: 1}},
		{name: "no bound", wantErr: "sets no bound"},
		{name: "negative cost", budget: schemas.Budget{MaxCostUSD: -1}, wantErr: "--max-cost-usd"},
		{name: "infinite cost", budget: schemas.Budget{MaxCostUSD: math.Inf(1)}, wantErr: "--max-cost-usd"},
		{name: "NaN cost", budget: schemas.Budget{MaxCostUSD: math.NaN()}, wantErr: "--max-cost-usd"},
		{name: "negative tokens", budget: schemas.Budget{MaxTokens: -1}, wantErr: "--max-tokens"},
		{name: "negative iterations", budget: schemas.Budget{MaxIterations: -2}, wantErr: "--max-iterations"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := CheckBudget(tt.budget)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("CheckBudget = %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !errors.Is(err, ErrBadInput) {
				t.Fatalf("CheckBudget = %v, want an ErrBadInput containing %q", err, tt.wantErr)
			}
		})
	}
}

// signalPipeline is a two-step pipeline for sessions the signal tests
// address; nothing runs it.
func signalPipeline() schemas.Pipeline {
	step := func(name string) schemas.Step {
		return schemas.Step{Name: name, Agent: schemas.AgentSpec{Backend: schemas.BackendExec, Command: []string{"true"}},
			Prompt: "go", Outputs: []schemas.Output{{Name: name + ".txt"}}, MaxIterations: 1, TimeoutMs: 1000}
	}
	draft := step("draft")
	review := step("review")
	review.Requires, review.Final = []string{"draft"}, true
	return schemas.Pipeline{Name: "p", Steps: []schemas.Step{draft, review}}
}

// startSession submits a session of signalPipeline with budget.
func startSession(t *testing.T, b *bus.Bus, session string, budget *schemas.Budget) schemas.Event {
	t.Helper()
	input := filepath.Join(t.TempDir(), "in.txt")
	if err := os.WriteFile(input, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	ev, err := SubmitWithBudget(context.Background(), b, signalPipeline(), input, session, time.Now(), budget)
	if err != nil {
		t.Fatalf("submit %s: %v", session, err)
	}
	return ev
}

// endSession records the session's end as the orchestrator would.
func endSession(t *testing.T, b *bus.Bus, session, typ string) {
	t.Helper()
	var data any = &schemas.SessionCompleted{}
	if typ == schemas.TypeSessionFailed {
		data = &schemas.SessionFailed{Reason: "test"}
	}
	if _, err := b.Publish(context.Background(), schemas.Event{ID: NewSignalID(), Type: typ, Session: session, Data: data}); err != nil {
		t.Fatal(err)
	}
}

func TestSubmitWithBudget(t *testing.T) {
	b, _ := testnats.Bus(t)
	want := &schemas.Budget{MaxCostUSD: 0.25, MaxIterations: 7}
	startSession(t, b, "with-budget", want)
	startSession(t, b, "without", nil)
	for session, budget := range map[string]*schemas.Budget{"with-budget": want, "without": nil} {
		evs := testnats.Events(t, b, schemas.SessionSubjects(session))
		if len(evs) != 1 {
			t.Fatalf("%s: %d events", session, len(evs))
		}
		if got := evs[0].Data.(*schemas.SessionStarted).Budget; !reflect.DeepEqual(got, budget) {
			t.Errorf("%s: budget %+v, want %+v", session, got, budget)
		}
	}
	input := filepath.Join(t.TempDir(), "in.txt")
	if err := os.WriteFile(input, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := SubmitWithBudget(context.Background(), b, signalPipeline(), input, "bad-budget", time.Now(), &schemas.Budget{MaxTokens: -1})
	if !errors.Is(err, ErrBadInput) {
		t.Errorf("negative budget: %v, want ErrBadInput", err)
	}
	if last, _ := b.SessionLastSeq(context.Background(), "bad-budget"); last != 0 {
		t.Errorf("a session with a bad budget was started")
	}
}

func TestResolveSignalTarget(t *testing.T) {
	b, _ := testnats.Bus(t)
	ctx := context.Background()
	started := map[string]string{}
	for _, s := range []string{"run-1", "done-1", "run-2", "failed-1"} {
		started[s] = startSession(t, b, s, nil).ID
	}
	endSession(t, b, "done-1", schemas.TypeSessionCompleted)
	endSession(t, b, "failed-1", schemas.TypeSessionFailed)
	tests := []struct {
		name    string
		target  SignalTarget
		want    []string
		wantErr error
		errText string
	}{
		{name: "running session", target: SignalTarget{Session: "run-1"}, want: []string{"run-1"}},
		{name: "completed session is still addressable", target: SignalTarget{Session: "done-1"}, want: []string{"done-1"}},
		{name: "step", target: SignalTarget{Session: "run-2", Step: "review"}, want: []string{"run-2"}},
		{name: "all: started and not ended, in start order", target: SignalTarget{All: true}, want: []string{"run-1", "run-2"}},
		{name: "unknown session (a prefix of others)", target: SignalTarget{Session: "run"}, wantErr: ErrNoSession, errText: "no such session: run (no session.started in the stream)"},
		{name: "unknown step", target: SignalTarget{Session: "run-1", Step: "publish"}, wantErr: ErrBadInput, errText: `session run-1 has no step "publish" (steps: draft, review)`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ResolveSignalTarget(ctx, b, tt.target)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) || !strings.Contains(err.Error(), tt.errText) {
					t.Fatalf("err = %v, want %v containing %q", err, tt.wantErr, tt.errText)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var sessions []string
			for _, d := range got {
				sessions = append(sessions, d.Session)
				if d.StartedID != started[d.Session] {
					t.Errorf("%s: StartedID %q, want %q", d.Session, d.StartedID, started[d.Session])
				}
			}
			if !reflect.DeepEqual(sessions, tt.want) {
				t.Errorf("sessions %v, want %v", sessions, tt.want)
			}
		})
	}

	t.Run("all with none running", func(t *testing.T) {
		b2, _ := testnats.Bus(t)
		startSession(t, b2, "only", nil)
		endSession(t, b2, "only", schemas.TypeSessionCompleted)
		got, err := ResolveSignalTarget(ctx, b2, SignalTarget{All: true})
		if err != nil || len(got) != 0 {
			t.Fatalf("got %+v, %v; want none", got, err)
		}
	})
}

func TestSendSignalAndAwaitAcks(t *testing.T) {
	b, srv := testnats.Bus(t)
	ctx := context.Background()
	startSession(t, b, "s1", nil)
	startSession(t, b, "s2", nil)
	dests, err := ResolveSignalTarget(ctx, b, SignalTarget{All: true})
	if err != nil {
		t.Fatal(err)
	}
	req := SignalRequest{Verb: "stop", Target: SignalTarget{All: true}, Reason: "over budget"}
	sent, err := SendSignal(ctx, b, req, dests, time.Now())
	if err != nil || len(sent) != 2 {
		t.Fatalf("SendSignal: %d sent, %v", len(sent), err)
	}

	// The events as any reader of the stream sees them.
	evs := testnats.Events(t, b, "loopbus.evt.*.signal.stop")
	if len(evs) != 2 {
		t.Fatalf("%d signal.stop events, want 2", len(evs))
	}
	for i, ev := range evs {
		want := &schemas.Signal{Target: "all", Reason: "over budget"}
		if !reflect.DeepEqual(ev.Data, want) || ev.Session != dests[i].Session || ev.Step != "" ||
			ev.ID != sent[i].Event.ID || ev.Seq != sent[i].Seq || ev.Correlation != dests[i].StartedID || ev.Source != b.Source() {
			t.Errorf("event %d: %+v data %+v", i, ev, ev.Data)
		}
	}
	if sent[0].Event.ID == sent[1].Event.ID || len(sent[0].Event.ID) != 32 {
		t.Errorf("signal ids %q, %q: want distinct random ids", sent[0].Event.ID, sent[1].Event.ID)
	}

	// An orchestrator's answers: first a stray one (another signal id),
	// one in the wrong session, then the real ones.
	orch := testnats.Connect(t, srv.URL(), "test/orchestrator")
	ack := func(session, signalID, result, detail string) {
		t.Helper()
		_, err := orch.Publish(ctx, schemas.Event{ID: NewSignalID(), Type: schemas.TypeSignalAcknowledged, Session: session,
			Data: &schemas.SignalAcknowledged{SignalID: signalID, Signal: "stop", Result: result, Detail: detail}})
		if err != nil {
			t.Fatal(err)
		}
	}
	ack("s1", NewSignalID(), schemas.SignalApplied, "stray")
	ack("s1", sent[1].Event.ID, schemas.SignalApplied, "wrong session")
	ack("s1", sent[0].Event.ID, schemas.SignalApplied, "cancelled job s1.draft.1")

	wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	var seen []string
	acks, err := AwaitSignalAcks(wctx, b, sent, func(s SentSignal, a *schemas.SignalAcknowledged) {
		seen = append(seen, s.Event.Session+":"+a.Detail)
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(acks) != 1 || acks[sent[0].Event.ID] == nil || !reflect.DeepEqual(seen, []string{"s1:cancelled job s1.draft.1"}) {
		t.Fatalf("acks %v, seen %v; want only s1's", acks, seen)
	}

	// Waiting again while the second answer arrives ends as soon as both
	// are in.
	done := make(chan map[string]*schemas.SignalAcknowledged, 1)
	go func() {
		acks, err := AwaitSignalAcks(ctx, b, sent, nil)
		if err != nil {
			t.Error(err)
		}
		done <- acks
	}()
	ack("s2", sent[1].Event.ID, schemas.SignalIgnored, "session already stopped")
	select {
	case acks := <-done:
		if len(acks) != 2 || acks[sent[1].Event.ID].Result != schemas.SignalIgnored {
			t.Fatalf("acks %+v", acks)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("AwaitSignalAcks did not return once every signal was answered")
	}
}

func TestSendSignalToStep(t *testing.T) {
	b, _ := testnats.Bus(t)
	ctx := context.Background()
	startSession(t, b, "s1", nil)
	target := SignalTarget{Session: "s1", Step: "review"}
	dests, err := ResolveSignalTarget(ctx, b, target)
	if err != nil {
		t.Fatal(err)
	}
	msg := "Prefer case studies."
	if _, err := SendSignal(ctx, b, SignalRequest{Verb: "info", Target: target, Message: msg}, dests, time.Now()); err != nil {
		t.Fatal(err)
	}
	evs := testnats.Events(t, b, "loopbus.evt.s1.signal.info")
	if len(evs) != 1 || evs[0].Step != "review" || evs[0].Subject() != "s1/review" ||
		!reflect.DeepEqual(evs[0].Data, &schemas.Signal{Target: "s1/review", Step: "review", Message: msg}) {
		t.Fatalf("events %+v", evs)
	}
	if _, err := SendSignal(ctx, b, SignalRequest{Verb: "info", Target: target}, dests, time.Now()); !errors.Is(err, ErrBadInput) {
		t.Errorf("info without message: %v, want ErrBadInput", err)
	}
}
