package client

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/projections"
	"github.com/loopbus/loopbus/schemas"
	"github.com/rs/zerolog"
)

// Client is a connection to loopbus for Go programs (CI bots, chat tools,
// dashboards): submit sessions, follow them to their end, read their state,
// send signals and work task lists. It only publishes and reads events; the
// services that move sessions on run elsewhere (loopbus serve, or
// serve.Start in the same process). A Client is safe for concurrent use.
type Client struct {
	b   *bus.Bus
	own bool
	now func() time.Time
}

// Dial connects to the NATS server at cfg.URL (with cfg's credentials and
// TLS settings) and makes sure the loopbus stream and buckets exist. A
// zero cfg.ConnectTimeout and cfg.GiveUpAfter become 10 s and 30 s, since a
// client, unlike a service, should not wait for a server forever. Close
// the Client when done.
func Dial(ctx context.Context, cfg bus.Config) (*Client, error) {
	if cfg.URL == "" {
		return nil, fmt.Errorf("%w: client.Dial needs a NATS URL", ErrBadInput)
	}
	if cfg.Name == "" {
		cfg.Name = "client"
	}
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = 10 * time.Second
	}
	if cfg.GiveUpAfter == 0 {
		cfg.GiveUpAfter = 30 * time.Second
	}
	cat, err := schemas.NewCatalogue()
	if err != nil {
		return nil, err
	}
	host, _ := os.Hostname()
	b, err := bus.Connect(ctx, cfg, fmt.Sprintf("loopbus/%s/%s-%d", cfg.Name, host, os.Getpid()), cat, zerolog.Nop())
	if err != nil {
		return nil, err
	}
	return &Client{b: b, own: true, now: time.Now}, nil
}

// New returns a Client over an open bus, which stays the caller's to close.
func New(b *bus.Bus) *Client { return &Client{b: b, now: time.Now} }

// Close closes the connection Dial opened; on a Client from New it does
// nothing.
func (c *Client) Close() {
	if c.own {
		c.b.Close()
	}
}

// Bus is the Client's bus, for reads this package does not wrap.
func (c *Client) Bus() *bus.Bus { return c.b }

// SubmitOptions are the optional parts of a submission.
type SubmitOptions struct {
	// Session is the session id; "" makes one (NewSessionID).
	Session string
	// Budget is the session's own budget, tightening the pipeline's.
	Budget *schemas.Budget
}

// Submit starts a session of p (as definition.Load returns it). For a
// pipeline, input is the input file; for a backlog (p.Kind ==
// schemas.KindBacklog) it is the task file, or "" to let the bootstrap
// agent propose tasks. It returns the session id. Errors wrap ErrBadInput
// or ErrSessionExists where those apply.
func (c *Client) Submit(ctx context.Context, p schemas.Pipeline, input string, opts SubmitOptions) (string, error) {
	session := opts.Session
	if session == "" {
		session = NewSessionID(p.Name, c.now())
	}
	if p.Kind == schemas.KindBacklog {
		_, err := SubmitBacklog(ctx, c.b, p, input, "", session, c.now(), opts.Budget)
		return session, err
	}
	if input == "" {
		return "", fmt.Errorf("%w: pipeline %s needs an input file", ErrBadInput, p.Name)
	}
	_, err := SubmitWithBudget(ctx, c.b, p, input, session, c.now(), opts.Budget)
	return session, err
}

// Follow reads a session's events from its start, calling onEvent (if not
// nil) after each with the manifest folded so far, and returns the last
// manifest once the session completes, fails or is stopped by its budget,
// or ctx ends (then with ctx's error). onEvent runs on the reading
// goroutine: a slow onEvent slows the read, never loses an event.
func (c *Client) Follow(ctx context.Context, session string, onEvent func(schemas.Event, *projections.Manifest)) (*projections.Manifest, error) {
	if err := c.exists(ctx, session); err != nil {
		return nil, err
	}
	return Watch(ctx, c.b, session, onEvent)
}

// Exists fails with ErrBadInput for an unsafe session id and ErrNoSession
// for a session with no events (see the Exists function).
func (c *Client) Exists(ctx context.Context, session string) error { return Exists(ctx, c.b, session) }

func (c *Client) exists(ctx context.Context, session string) error { return c.Exists(ctx, session) }

// Exists fails with ErrBadInput for an unsafe session id and ErrNoSession
// for a session with no events: every command answers an unknown session
// the same way.
func Exists(ctx context.Context, b Bus, session string) error {
	_, err := lastOf(ctx, b, session)
	return err
}

// lastOf returns the stream sequence of session's newest event, failing
// as Exists does.
func lastOf(ctx context.Context, b Bus, session string) (uint64, error) {
	if err := schemas.ValidateSessionID(session); err != nil {
		return 0, fmt.Errorf("%w: %v", ErrBadInput, err)
	}
	last, err := b.SessionLastSeq(ctx, session)
	if err != nil {
		return 0, err
	}
	if last == 0 {
		return 0, fmt.Errorf("%w: %s", ErrNoSession, session)
	}
	return last, nil
}

// EventSubject is the subject filter of the events of session ("" for
// every session) of type typ ("" for every type; "step.completed" or
// "loopbus.step.completed"). A session's whole history, without a type,
// includes the copies a fork's history begins with (see
// schemas.HistorySubjectFor); a type selects live events only. Errors
// wrap ErrBadInput.
func EventSubject(session, typ string) (string, error) {
	sess, ev := "*", "*.*"
	if session != "" {
		if err := schemas.ValidateSessionID(session); err != nil {
			return "", fmt.Errorf("%w: %v", ErrBadInput, err)
		}
		sess = session
		if typ == "" {
			return schemas.SessionSubjects(session), nil
		}
	}
	if typ != "" {
		if !strings.HasPrefix(typ, "loopbus.") {
			typ = "loopbus." + typ
		}
		var err error
		if ev, err = schemas.EntityVerb(typ); err != nil {
			return "", fmt.Errorf("%w: %v", ErrBadInput, err)
		}
	}
	return schemas.SubjectPrefix + "." + sess + "." + ev, nil
}

// Status returns a session's current manifest (see the Status function).
func (c *Client) Status(ctx context.Context, session string) (*projections.Manifest, error) {
	return Status(ctx, c.b, session)
}

// Fork starts a new session from another's history (see the Fork
// function).
func (c *Client) Fork(ctx context.Context, req ForkRequest) (Forked, error) {
	return Fork(ctx, c.b, req)
}

// Forks lists the forks of a session (see the Forks function).
func (c *Client) Forks(ctx context.Context, session string) ([]ForkRef, error) {
	return Forks(ctx, c.b, session)
}

// Sessions lists the sessions on the stream that f selects, newest first.
func (c *Client) Sessions(ctx context.Context, f SessionFilter) ([]SessionSummary, error) {
	return Sessions(ctx, c.b, f, c.now())
}

// Events returns a session's events in stream order up to until (the zero
// Until for all).
func (c *Client) Events(ctx context.Context, session string, until Until) ([]schemas.Event, error) {
	if err := c.exists(ctx, session); err != nil {
		return nil, err
	}
	return Events(ctx, c.b, session, until)
}

// Replay returns a session's manifest as it was at until.
func (c *Client) Replay(ctx context.Context, session string, until Until) (*projections.Manifest, error) {
	if err := c.exists(ctx, session); err != nil {
		return nil, err
	}
	return Replay(ctx, c.b, session, until)
}

// Export writes a session's manifest, events and artifacts into dir (see
// the Export function) and, for a backlog session, its task list as it was
// at the manifest's last event (to-do.json, see ExportTasks).
func (c *Client) Export(ctx context.Context, session, dir string) (*projections.Manifest, error) {
	if err := c.exists(ctx, session); err != nil {
		return nil, err
	}
	m, err := Export(ctx, c.b, session, dir)
	if err != nil {
		return nil, err
	}
	_, err = ExportTasks(ctx, c.b, session, dir, m.LastSeq)
	return m, err
}

// WriteFinal writes the final artifacts of a completed session into dir
// (see the WriteFinal function).
func (c *Client) WriteFinal(ctx context.Context, m *projections.Manifest, dir string) ([]string, error) {
	return WriteFinal(ctx, c.b, m, dir)
}

// Signal sends r (stop, pause, resume, info or invalidate to a session, a
// step or all running sessions) and, when wait > 0, waits that long for
// the orchestrator's acknowledgements. It returns what was sent with the
// acknowledgements that arrived (nil where none did in time).
func (c *Client) Signal(ctx context.Context, r SignalRequest, wait time.Duration) ([]SentSignal, map[string]*schemas.SignalAcknowledged, error) {
	if err := r.Check(); err != nil {
		return nil, nil, err
	}
	dests, err := ResolveSignalTarget(ctx, c.b, r.Target)
	if err != nil {
		return nil, nil, err
	}
	sent, err := SendSignal(ctx, c.b, r, dests, c.now())
	if err != nil || wait <= 0 || len(sent) == 0 {
		return sent, nil, err
	}
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	acks, err := AwaitSignalAcks(wctx, c.b, sent, nil)
	return sent, acks, err
}

// SetBudget sets a session's budget (see the SetBudget function).
func (c *Client) SetBudget(ctx context.Context, session string, budget schemas.Budget, reason string) (Published, error) {
	return SetBudget(ctx, c.b, session, budget, reason)
}

// CloseSession closes a session for good (see the CloseSession function).
func (c *Client) CloseSession(ctx context.Context, session, reason string) (Published, error) {
	return CloseSession(ctx, c.b, session, reason)
}

// Tasks returns a backlog session's task list (see the Tasks function).
func (c *Client) Tasks(ctx context.Context, session string) (*projections.TaskList, error) {
	return Tasks(ctx, c.b, session)
}

// AddTask adds a task to a backlog session's list (see the AddTask
// function).
func (c *Client) AddTask(ctx context.Context, session string, task schemas.Task, reason string) (TaskChange, error) {
	return AddTask(ctx, c.b, session, task, reason)
}

// SetTaskStatus changes a task's status (see the SetTaskStatus function).
func (c *Client) SetTaskStatus(ctx context.Context, session, id, status, reason string, blockers []string) (TaskChange, error) {
	return SetTaskStatus(ctx, c.b, session, id, status, reason, blockers)
}
