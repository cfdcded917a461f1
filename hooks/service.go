// Package hooks runs commands for events: a hooks file names commands
// (chat notifiers, CI triggers, post-iteration scripts) and the events that
// run them, and a runner consumes the event stream through its own durable
// consumer, runs each matching hook with the event as a structured
// CloudEvent on stdin, and records every run as loopbus.hook.completed or
// loopbus.hook.failed in the event's session.
//
// A hooks file looks like this:
//
//	runner: notify            # consumer hooks-notify; default hooks
//	start: new                # new (default) or all
//	hooks:
//	  - name: chat
//	    types: [loopbus.task.updated, "loopbus.session.*"]
//	    subjects: ["loopbus.evt.*.task.>"]
//	    sessions: [demo-1]
//	    command: [./notify.sh]
//	    dir: .                # working directory; default the file's
//	    timeout: 30s          # default 1m
//	    env: {CHANNEL: builds}
//	    secret_env: [WEBHOOK_URL]
//
// Events are handled in stream order, one at a time; an event is
// acknowledged once every matching hook's outcome is published. hook.*
// events never trigger hooks. A restarted runner neither misses events
// (its consumer is durable) nor runs a hook twice for one event: an event
// delivered again (the runner stopped after publishing an outcome but
// before the acknowledgement) is checked against the outcomes already in
// its session, and hooks that have one are skipped. A hook whose run was
// cut short by a crash (no outcome) runs again when the event comes back,
// after the ack wait; later events may be handled before it then.
//
// The check reads only events delivered more than once: a first delivery
// to the runner's consumer cannot have outcomes from it. Deleting the
// consumer (hooks-<runner>) forgets that; with start all, a new one runs
// every event's hooks again.
package hooks

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/schemas"
	"github.com/loopbus/loopbus/workspace"
	"github.com/loopbus/loopbus/workspace/procrun"
	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"
)

// Bus is what the hook runner needs from the event bus.
type Bus interface {
	Consume(ctx context.Context, cfg bus.ConsumerConfig, h bus.Handler) error
	Publish(ctx context.Context, ev schemas.Event) (bus.Published, error)
	Read(ctx context.Context, opts bus.ReadOptions, fn func(schemas.Event) error) error
	SubjectLastSeq(ctx context.Context, subject string) (uint64, error)
	Encode(ev schemas.Event) (*nats.Msg, error)
}

// publishTimeout bounds publishing one outcome after the runner was told
// to stop (the publish otherwise retries while NATS is unreachable).
const publishTimeout = time.Minute

// Service is a hook runner.
type Service struct {
	cfg      Config
	bus      Bus
	log      zerolog.Logger
	now      func() time.Time
	subjects []string

	// beforeAck, if set (by tests), runs after an event's outcomes are
	// published and before it is acknowledged; an error it returns leaves
	// the event unacknowledged.
	beforeAck func(ev schemas.Event) error
}

// New returns a hook runner for cfg (see Config.Validate).
func New(cfg Config, b Bus, log zerolog.Logger, now func() time.Time) (*Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if b == nil || now == nil {
		return nil, errors.New("hooks: bus and clock are required")
	}
	cfg.Runner = cfg.runner()
	if cfg.Start == "" {
		cfg.Start = StartNew
	}
	if cfg.Env == nil {
		cfg.Env = workspace.BaseEnv()
	}
	hooks := make([]Hook, len(cfg.Hooks))
	var filters []string
	for i, h := range cfg.Hooks {
		if h.Timeout == 0 {
			h.Timeout = DefaultTimeout
		}
		hooks[i] = h
		filters = append(filters, h.filters()...)
	}
	cfg.Hooks = hooks
	return &Service{cfg: cfg, bus: b, log: log, now: now, subjects: consumerSubjects(filters)}, nil
}

// Subjects returns the subject filters of the runner's consumer: the
// union of the hooks' filters, without overlaps.
func (s *Service) Subjects() []string { return slices.Clone(s.subjects) }

// Run handles events until ctx ends. On the end of ctx the hook running
// then finishes (within its timeout), its outcome is published, and the
// event is acknowledged, or handed back if further hooks were to run for
// it (they run, and the finished one is skipped, when the runner starts
// again).
func (s *Service) Run(ctx context.Context) error {
	s.log.Info().Str("consumer", s.cfg.Durable()).Strs("subjects", s.subjects).Int("hooks", len(s.cfg.Hooks)).Msg("hook runner ready")
	return s.bus.Consume(ctx, bus.ConsumerConfig{
		Durable:     s.cfg.Durable(),
		Subjects:    s.subjects,
		Concurrency: 1, // hooks see events in stream order,
		// even when a crashed runner's event comes back
		MaxAckPending: 1,
		AckWait:       s.cfg.AckWait,
		DeliverNew:    s.cfg.Start == StartNew,
		OnReady:       s.cfg.OnReady,
	}, s.handle)
}

func (s *Service) handle(ctx context.Context, d bus.Delivery) error {
	ev := d.Event
	var hooks []Hook
	for _, h := range s.cfg.Hooks {
		if h.Matches(ev) {
			hooks = append(hooks, h)
		}
	}
	if len(hooks) == 0 {
		return nil
	}
	// A first delivery to this consumer cannot have outcomes yet; a later
	// one may, if the runner stopped between publishing and acknowledging.
	var done map[string]bool
	if d.NumDelivered > 1 {
		var err error
		if done, err = s.published(ctx, ev); err != nil {
			return err
		}
	}
	msg, err := s.bus.Encode(ev)
	if err != nil {
		return fmt.Errorf("%w: cannot encode event %s for hooks: %v", bus.ErrPermanent, ev.ID, err)
	}
	// Once the runner is told to stop, the hook running finishes and its
	// outcome is published: both must outlive ctx.
	wctx := context.WithoutCancel(ctx)
	for i, h := range hooks {
		if i > 0 && ctx.Err() != nil {
			// Hand the event back; the hooks already run are skipped when
			// it is delivered again.
			return ctx.Err()
		}
		if done[h.Name] {
			s.log.Info().Str("hook", h.Name).Str("event_type", ev.Type).Str("event_id", ev.ID).Uint64("seq", ev.Seq).Msg("hook already ran for this event; skipped")
			if s.cfg.OnRun != nil {
				s.cfg.OnRun(Run{Event: ev, Result: schemas.HookRun{Hook: h.Name, EventID: ev.ID, EventType: ev.Type, EventSeq: ev.Seq, Runner: s.cfg.Runner}, Skipped: true})
			}
			continue
		}
		typ, res := s.run(wctx, h, ev, msg.Data)
		pctx, cancel := context.WithTimeout(wctx, publishTimeout)
		_, err := s.bus.Publish(pctx, schemas.Event{
			ID:          OutcomeID(ev.Session, s.cfg.Runner, h.Name, ev.ID),
			Type:        typ,
			Session:     ev.Session,
			Causation:   ev.ID,
			Correlation: ev.Correlation,
			Time:        s.now(),
			Data:        &res,
		})
		cancel()
		if err != nil {
			return fmt.Errorf("publish outcome of hook %s for event %s: %w", h.Name, ev.ID, err)
		}
		s.logRun(typ, res)
		if s.cfg.OnRun != nil {
			s.cfg.OnRun(Run{Event: ev, Type: typ, Result: res})
		}
	}
	if s.beforeAck != nil {
		return s.beforeAck(ev)
	}
	return nil
}

// OutcomeID is the id of the outcome of hook for the event eventID of
// session, run by runner: deterministic, so a re-published outcome is
// de-duplicated by the stream.
func OutcomeID(session, runner, hook, eventID string) string {
	return schemas.DeterministicID(session, "hook", runner, hook, eventID)
}

// published returns the hooks whose outcome for ev by this runner is in
// the stream. Outcomes follow their event in its session, so only the
// session's hook.* events stored after ev are read, and none when the
// newest of them is older.
func (s *Service) published(ctx context.Context, ev schemas.Event) (map[string]bool, error) {
	subject := schemas.SubjectPrefix + "." + ev.Session + "." + hookEntity + ".*"
	last, err := s.bus.SubjectLastSeq(ctx, subject)
	if err != nil || last <= ev.Seq {
		return nil, err
	}
	done := map[string]bool{}
	err = s.bus.Read(ctx, bus.ReadOptions{Subjects: []string{subject}, StartSeq: ev.Seq + 1}, func(o schemas.Event) error {
		if r, ok := o.Data.(*schemas.HookRun); ok && r.Runner == s.cfg.Runner && r.EventID == ev.ID {
			done[r.Hook] = true
		}
		if o.Seq >= last {
			return bus.ErrStop
		}
		return nil
	})
	if err == nil && ctx.Err() != nil {
		err = ctx.Err() // Read returns nil when ctx ends: the list is incomplete
	}
	return done, err
}

// run runs one hook for ev and returns its outcome's type and data.
func (s *Service) run(ctx context.Context, h Hook, ev schemas.Event, stdin []byte) (string, schemas.HookRun) {
	res := schemas.HookRun{Hook: h.Name, EventID: ev.ID, EventType: ev.Type, EventSeq: ev.Seq, Runner: s.cfg.Runner, ExitCode: -1}
	env := s.env(h, ev)
	// The output tail goes into an event: secret values must not.
	sec, err := workspace.NewSecrets(env, h.SecretEnv)
	if err != nil {
		res.Error = "not run: " + err.Error()
		return schemas.TypeHookFailed, res
	}
	start := s.now()
	pr, err := procrun.Run(ctx, procrun.Spec{
		Argv:      h.Command,
		Dir:       h.Dir,
		Env:       env,
		Stdin:     stdin,
		Timeout:   h.Timeout,
		TailBytes: procrun.DefaultTailBytes + sec.MaxLen(),
	})
	res.DurationMs = pr.Duration.Milliseconds()
	if err != nil {
		res.DurationMs = max(s.now().Sub(start).Milliseconds(), 0)
		res.Error = "could not start: " + sec.Mask(err.Error())
		return schemas.TypeHookFailed, res
	}
	res.OutputTail = sec.MaskTail(pr.Tail, procrun.DefaultTailBytes)
	res.ExitCode = pr.ExitCode
	switch {
	case pr.TimedOut:
		res.TimedOut = true
		res.Error = fmt.Sprintf("timed out after %s", h.Timeout)
	case pr.ExitCode != 0:
		res.Error = fmt.Sprintf("exited with code %d", pr.ExitCode)
	default:
		return schemas.TypeHookCompleted, res
	}
	return schemas.TypeHookFailed, res
}

// env is the hook command's environment: the base, the event's LOOPBUS_*
// variables, then the hook's own.
func (s *Service) env(h Hook, ev schemas.Event) []string {
	env := slices.Clone(s.cfg.Env)
	env = append(env,
		"LOOPBUS_EVENT_ID="+ev.ID,
		"LOOPBUS_EVENT_TYPE="+ev.Type,
		"LOOPBUS_EVENT_SUBJECT="+ev.Subject(),
		"LOOPBUS_EVENT_SOURCE="+ev.Source,
		"LOOPBUS_EVENT_TIME="+ev.Time.UTC().Format(time.RFC3339Nano),
		"LOOPBUS_EVENT_SEQ="+strconv.FormatUint(ev.Seq, 10),
		"LOOPBUS_SESSION="+ev.Session,
		"LOOPBUS_STEP="+ev.Step,
		"LOOPBUS_JOB="+ev.Job,
		"LOOPBUS_HOOK="+h.Name,
		"LOOPBUS_RUNNER="+s.cfg.Runner,
	)
	for _, k := range slices.Sorted(maps.Keys(h.Env)) {
		env = append(env, k+"="+h.Env[k])
	}
	return env
}

// logRun logs a run at info level, failed ones too: a failed hook is the
// hook's news, not the runner's trouble.
func (s *Service) logRun(typ string, r schemas.HookRun) {
	e := s.log.Info().Str("outcome", typ)
	if typ == schemas.TypeHookFailed {
		e = e.Str("error", r.Error).Str("output_tail", lastLine(r.OutputTail))
	}
	e.Str("hook", r.Hook).Str("event_type", r.EventType).Str("event_id", r.EventID).Uint64("seq", r.EventSeq).
		Int("exit", r.ExitCode).Dur("duration", time.Duration(r.DurationMs)*time.Millisecond).Msg("hook ran")
}

// lastLine returns the last non-empty line of text.
func lastLine(text string) string {
	text = strings.TrimRight(text, "\n")
	if i := strings.LastIndexByte(text, '\n'); i >= 0 {
		return text[i+1:]
	}
	return text
}
