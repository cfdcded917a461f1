package client

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/schemas"
)

// TargetAll is the signal target selecting every running session.
const TargetAll = "all"

// maxReasonBytes bounds a signal's reason, like an info signal's message,
// so a signal stays far below the event size limit.
const maxReasonBytes = schemas.MaxHintBytes

// SignalTarget is a parsed signal target: every running session, one
// session, or one step of a session.
type SignalTarget struct {
	All     bool
	Session string
	Step    string
}

// String returns the target as written on the command line.
func (t SignalTarget) String() string {
	switch {
	case t.All:
		return TargetAll
	case t.Step != "":
		return t.Session + "/" + t.Step
	}
	return t.Session
}

// ParseSignalTarget reads "all", "SESSION" or "SESSION/STEP"; the session
// id and step name must pass schemas.ValidateSessionID and
// ValidateStepName. "all" selects every running session and takes no step.
// Errors wrap ErrBadInput.
func ParseSignalTarget(s string) (SignalTarget, error) {
	session, step, hasStep := strings.Cut(s, "/")
	if session == TargetAll {
		if hasStep {
			return SignalTarget{}, fmt.Errorf("%w: target %q: %s selects every running session and takes no step", ErrBadInput, s, TargetAll)
		}
		return SignalTarget{All: true}, nil
	}
	if err := schemas.ValidateSessionID(session); err != nil {
		return SignalTarget{}, fmt.Errorf("%w: target %q: %v (want SESSION, SESSION/STEP or %s)", ErrBadInput, s, err, TargetAll)
	}
	if hasStep {
		if err := schemas.ValidateStepName(step); err != nil {
			return SignalTarget{}, fmt.Errorf("%w: target %q: %v (want SESSION, SESSION/STEP or %s)", ErrBadInput, s, err, TargetAll)
		}
	}
	return SignalTarget{Session: session, Step: step}, nil
}

// VerbHint is the name people give the info signal (schemas.HintVerb);
// "info", its event's verb, is accepted for it too.
const VerbHint = schemas.HintVerb

// SignalRequest is one signal as a person asks for it.
type SignalRequest struct {
	// Verb is stop, pause, resume, hint (or info, its event's name),
	// invalidate, approve or reject.
	Verb   string
	Target SignalTarget
	// Reason says why (stop, pause, resume, invalidate).
	Reason string
	// Message is the text of a hint.
	Message string
	// By names who approves or rejects (approve, reject); empty for
	// other verbs.
	By string
}

// Check validates the combination of verb, target and options: a hint needs
// a message of at most schemas.MaxHintBytes and takes no reason; the other
// verbs take no message; invalidate needs SESSION/STEP. Errors wrap
// ErrBadInput.
func (r SignalRequest) Check() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrBadInput, fmt.Sprintf(format, args...))
	}
	if _, ok := schemas.SignalTypes()[schemas.SignalVerb(r.Verb)]; !ok {
		return bad("unknown signal %q (want stop, pause, resume, hint, invalidate, approve or reject)", r.Verb)
	}
	if r.Verb == "approve" || r.Verb == "reject" {
		// Approval gates: the step awaiting approval, a comment
		// (approve, optional) or the reason (reject, required) in Reason.
		switch {
		case r.Target.All || r.Target.Step == "":
			return bad("%s needs SESSION/STEP: the step awaiting approval", r.Verb)
		case r.Message != "":
			return bad("%s takes no --message", r.Verb)
		case r.Verb == "reject" && strings.TrimSpace(r.Reason) == "":
			return bad("reject needs --reason: it is the feedback of the step's next iteration")
		case len(r.By) > 256 || !utf8.ValidString(r.By):
			return bad("--by must be valid UTF-8 of at most 256 bytes")
		}
	} else if r.By != "" {
		return bad("%s takes no --by (only approve and reject do)", r.Verb)
	}
	if schemas.SignalVerb(r.Verb) == "info" {
		switch {
		case strings.TrimSpace(r.Message) == "":
			return bad("%s needs --message: the hint added to the next iteration's prompt", r.Verb)
		case len(r.Message) > schemas.MaxHintBytes:
			return bad("--message is %d bytes; at most %d are allowed", len(r.Message), schemas.MaxHintBytes)
		case !utf8.ValidString(r.Message):
			return bad("--message is not valid UTF-8")
		case r.Reason != "":
			return bad("%s takes --message, not --reason", r.Verb)
		}
	} else if r.Message != "" {
		return bad("%s takes no --message (only hint does); say why with --reason", r.Verb)
	}
	switch {
	case len(r.Reason) > maxReasonBytes:
		return bad("--reason is %d bytes; at most %d are allowed", len(r.Reason), maxReasonBytes)
	case !utf8.ValidString(r.Reason):
		return bad("--reason is not valid UTF-8")
	}
	if r.Verb == "invalidate" && (r.Target.All || r.Target.Step == "") {
		return bad("invalidate needs SESSION/STEP: the step whose result no longer stands (it and the steps after it run again)")
	}
	return nil
}

// SignalDest is one session a signal goes to.
type SignalDest struct {
	Session string
	// StartedID is the id of the session's session.started, the
	// correlation of everything in the session.
	StartedID string
}

// ResolveSignalTarget returns the sessions t selects. A session target
// must have a session.started in the stream (else ErrNoSession) and, with
// a step, that step in its pipeline (else ErrBadInput listing the
// steps; a loops or backlog session's steps are not checked here).
// "all" selects the sessions whose session.started is in the stream and
// that have not completed or failed since (read from the stream's
// session.started, session.completed and session.failed subjects, not
// from views, which may lag), in the order they started; possibly none.
func ResolveSignalTarget(ctx context.Context, b Bus, t SignalTarget) ([]SignalDest, error) {
	if t.All {
		return runningSessions(ctx, b)
	}
	var started *schemas.Event
	err := b.Read(ctx, bus.ReadOptions{Subjects: startSubjects(t.Session)}, func(ev schemas.Event) error {
		started = &ev
		return bus.ErrStop
	})
	if err != nil {
		return nil, err
	}
	if started == nil {
		return nil, fmt.Errorf("%w: %s (no session.started in the stream)", ErrNoSession, t.Session)
	}
	var pipeline schemas.Pipeline
	switch data := started.Data.(type) {
	case *schemas.SessionStarted:
		pipeline = data.Pipeline
	case *schemas.SessionForked:
		pipeline = data.Pipeline
	default:
		return nil, fmt.Errorf("session %s: %s carries %T", t.Session, started.Type, started.Data)
	}
	// A loops session's loops and a backlog's task and role runs (steps)
	// are made as it runs: the orchestrator answers a signal for one that
	// does not exist.
	if t.Step != "" && pipeline.Kind != schemas.KindLoops && pipeline.Kind != schemas.KindBacklog && !slices.ContainsFunc(pipeline.Steps, func(s schemas.Step) bool { return s.Name == t.Step }) {
		names := make([]string, len(pipeline.Steps))
		for i, s := range pipeline.Steps {
			names[i] = s.Name
		}
		return nil, fmt.Errorf("%w: session %s has no step %q (steps: %s)", ErrBadInput, t.Session, t.Step, strings.Join(names, ", "))
	}
	return []SignalDest{{Session: t.Session, StartedID: started.ID}}, nil
}

// startSubjects are the subjects of the events that start session (may
// be the wildcard *): session.started, and session.forked for a fork.
func startSubjects(session string) []string {
	return []string{lifecycleSubject(session, schemas.TypeSessionStarted), lifecycleSubject(session, schemas.TypeSessionForked)}
}

// lifecycleSubject is the subject of events of type typ in session
// (session may be the wildcard *).
func lifecycleSubject(session, typ string) string {
	return schemas.SubjectPrefix + "." + session + "." + strings.TrimPrefix(typ, "loopbus.")
}

// runningSessions lists the sessions started and neither completed,
// failed nor closed, in the order they started.
func runningSessions(ctx context.Context, b Bus) ([]SignalDest, error) {
	var order []string
	started := map[string]string{}
	ended := map[string]bool{}
	err := b.Read(ctx, bus.ReadOptions{Subjects: []string{
		lifecycleSubject("*", schemas.TypeSessionStarted),
		lifecycleSubject("*", schemas.TypeSessionForked),
		lifecycleSubject("*", schemas.TypeSessionCompleted),
		lifecycleSubject("*", schemas.TypeSessionFailed),
		lifecycleSubject("*", schemas.TypeSessionClosed),
	}}, func(ev schemas.Event) error {
		switch ev.Type {
		case schemas.TypeSessionStarted, schemas.TypeSessionForked:
			if _, seen := started[ev.Session]; !seen {
				order = append(order, ev.Session)
				started[ev.Session] = ev.ID
			}
		case schemas.TypeSessionCompleted, schemas.TypeSessionFailed, schemas.TypeSessionClosed:
			ended[ev.Session] = true
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	var out []SignalDest
	for _, s := range order {
		if !ended[s] {
			out = append(out, SignalDest{Session: s, StartedID: started[s]})
		}
	}
	return out, nil
}

// SentSignal is a signal event written to the stream.
type SentSignal struct {
	Event schemas.Event
	// Seq is the stream sequence it was stored at.
	Seq uint64
}

// NewSignalID returns a random event id (32 hex digits): every signal is
// a new request, so unlike the orchestrator's ids it derives from nothing.
func NewSignalID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// SendSignal publishes one signal event per destination: type
// loopbus.signal.<verb>, a random id, the session and step extensions,
// correlated with the session's session.started, data schemas.Signal with
// the target as the request named it. It returns the events sent, also
// when it fails part way (then with the error).
func SendSignal(ctx context.Context, b Bus, r SignalRequest, dests []SignalDest, now time.Time) ([]SentSignal, error) {
	if err := r.Check(); err != nil {
		return nil, err
	}
	typ := schemas.SignalTypes()[schemas.SignalVerb(r.Verb)]
	var sent []SentSignal
	for _, d := range dests {
		ev := schemas.Event{
			ID:          NewSignalID(),
			Type:        typ,
			Session:     d.Session,
			Step:        r.Target.Step,
			Correlation: d.StartedID,
			Time:        now,
			Data: &schemas.Signal{
				Target:  r.Target.String(),
				Step:    r.Target.Step,
				Reason:  r.Reason,
				Message: r.Message,
				By:      r.By,
			},
		}
		p, err := b.Publish(ctx, ev)
		if err != nil {
			return sent, fmt.Errorf("send %s to %s: %w", r.Verb, d.Session, err)
		}
		sent = append(sent, SentSignal{Event: ev, Seq: p.Seq})
	}
	return sent, nil
}

// AwaitSignalAcks reads signal.acknowledged events stored after the first
// sent signal and calls onAck for each that answers one of sent, until all
// are answered or ctx ends (neither is an error). It returns the
// acknowledgements by signal id.
func AwaitSignalAcks(ctx context.Context, b Bus, sent []SentSignal, onAck func(SentSignal, *schemas.SignalAcknowledged)) (map[string]*schemas.SignalAcknowledged, error) {
	acks := map[string]*schemas.SignalAcknowledged{}
	if len(sent) == 0 {
		return acks, nil
	}
	byID := map[string]SentSignal{}
	first := uint64(math.MaxUint64)
	sessions := map[string]bool{}
	for _, s := range sent {
		byID[s.Event.ID] = s
		first = min(first, s.Seq)
		sessions[s.Event.Session] = true
	}
	subject := lifecycleSubject("*", schemas.TypeSignalAcknowledged)
	if len(sessions) == 1 {
		subject = lifecycleSubject(sent[0].Event.Session, schemas.TypeSignalAcknowledged)
	}
	err := b.Read(ctx, bus.ReadOptions{Subjects: []string{subject}, StartSeq: first, Follow: true}, func(ev schemas.Event) error {
		a, ok := ev.Data.(*schemas.SignalAcknowledged)
		if !ok {
			return nil
		}
		s, mine := byID[a.SignalID]
		if !mine || acks[a.SignalID] != nil || s.Event.Session != ev.Session {
			return nil
		}
		acks[a.SignalID] = a
		if onAck != nil {
			onAck(s, a)
		}
		if len(acks) == len(byID) {
			return bus.ErrStop
		}
		return nil
	})
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		err = nil
	}
	return acks, err
}

// SignalResult is what became of a signal sent to one session, as
// `loopbus signal` reports it.
type SignalResult struct {
	Signal  string `json:"signal"`
	Target  string `json:"target"`
	Session string `json:"session"`
	Step    string `json:"step,omitempty"`
	ID      string `json:"id"`
	Seq     uint64 `json:"seq"`
	// Result is applied or ignored (the orchestrator's acknowledgement), or
	// ResultRecorded (no acknowledgement yet: the orchestrator acts on the
	// signal when it runs).
	Result string `json:"result"`
	Detail string `json:"detail,omitempty"`
}

// String is the result for people: "pause s1/b: applied — step b paused",
// "stop s1: ignored", or "pause s1: recorded at stream sequence 42 — takes
// effect when the orchestrator runs (…)".
func (r SignalResult) String() string {
	who := r.Session
	if r.Step != "" {
		who += "/" + r.Step
	}
	switch {
	case r.Result == ResultRecorded:
		return fmt.Sprintf("%s %s: recorded at stream sequence %d — %s", r.Signal, who, r.Seq, r.Detail)
	case r.Detail == "":
		return fmt.Sprintf("%s %s: %s", r.Signal, who, r.Result)
	}
	return fmt.Sprintf("%s %s: %s — %s", r.Signal, who, r.Result, r.Detail)
}

// ResultRecorded is the result of a signal not acknowledged (yet).
const ResultRecorded = "recorded"

// ResultOf is the result of the signal s (of verb): the acknowledgement a,
// or, when a is nil, ResultRecorded with why it has no answer.
func ResultOf(s SentSignal, verb string, a *schemas.SignalAcknowledged, why string) SignalResult {
	sig, _ := s.Event.Data.(*schemas.Signal)
	r := SignalResult{Signal: verb, Session: s.Event.Session, ID: s.Event.ID, Seq: s.Seq}
	if sig != nil {
		r.Target, r.Step = sig.Target, sig.Step
	}
	if a != nil {
		r.Result, r.Detail = a.Result, a.Detail
		return r
	}
	r.Result, r.Detail = ResultRecorded, "takes effect when the orchestrator runs ("+why+")"
	return r
}

// SignalReport shapes Report.
type SignalReport struct {
	// Wait bounds the wait for the orchestrator's acknowledgements; 0 does
	// not wait.
	Wait time.Duration
	// NoAnswer, when set, says why no orchestrator can answer the signals
	// sent to dests (none runs): Report does not wait and gives it as the
	// reason.
	NoAnswer func(dests []SignalDest) string
	// Interrupt, when it ends, stops the wait early (Ctrl-C).
	Interrupt context.Context
	Now       time.Time
}

// ErrNoneRunning: a signal to all found no running session.
var ErrNoneRunning = errors.New("no running session (none started and not yet completed or failed)")

// Report sends r to the sessions its target selects, then emits one
// SignalResult per session: each acknowledgement as it arrives within
// opts.Wait, then "recorded" (with the reason) for the rest. It returns
// ErrNoneRunning when "all" selects no session, ErrNoSession or
// ErrBadInput for a bad target, a send error after emitting what was sent,
// and opts.Interrupt's error when the wait was interrupted.
func Report(ctx context.Context, b Bus, r SignalRequest, opts SignalReport, emit func(SignalResult)) error {
	dests, err := ResolveSignalTarget(ctx, b, r.Target)
	if err != nil {
		return err
	}
	if len(dests) == 0 {
		return fmt.Errorf("%w: nothing to %s", ErrNoneRunning, r.Verb)
	}
	sent, sendErr := SendSignal(ctx, b, r, dests, opts.Now)
	var acks map[string]*schemas.SignalAcknowledged
	var interrupted error
	why := ""
	switch {
	case sendErr != nil:
		why = "the other signals were not sent"
	case opts.NoAnswer != nil:
		why = opts.NoAnswer(dests)
	case opts.Wait <= 0:
		why = "not waiting for an acknowledgement: --wait 0"
	default:
		why = fmt.Sprintf("the orchestrator did not answer within %s", opts.Wait)
		stop := opts.Interrupt
		if stop == nil {
			stop = ctx
		}
		wctx, cancel := context.WithTimeout(stop, opts.Wait)
		acks, err = AwaitSignalAcks(wctx, b, sent, func(s SentSignal, a *schemas.SignalAcknowledged) {
			emit(ResultOf(s, r.Verb, a, ""))
		})
		cancel()
		if err != nil {
			return err
		}
		if interrupted = stop.Err(); interrupted != nil {
			why = "interrupted while waiting for the orchestrator"
		}
	}
	for _, s := range sent {
		if acks[s.Event.ID] == nil {
			emit(ResultOf(s, r.Verb, nil, why))
		}
	}
	if sendErr != nil {
		return sendErr
	}
	return interrupted
}
