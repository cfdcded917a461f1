// Package agentworker runs agent jobs: it pulls job.requested events from a
// durable consumer shared by every replica, runs the job's agent.Backend
// (looked up by name) in a fresh workspace, stores the declared outputs in
// the artifact stream and publishes what the agent did (tool calls, messages)
// and the job's artifacts and result.
//
// Secret environment values (see workspace.NewSecrets: the variables named
// in Config.SecretEnv and the job's agent.secretEnv, and those whose names
// look secret) never leave the worker: they are masked as "[secret NAME]" in
// every event it publishes and every line it logs, and an output containing
// one fails the job without being stored.
//
// The worker does not trust job.requested: artifact and variable names are
// checked again before anything runs, and outputs are read only through
// workspace.OpenOutput (no links, regular files within the size limit).
//
// Every worker follows job.cancelled (all of them, not through the shared
// queue) and kills the agent of a cancelled job it runs; a job cancelled
// before a worker takes it is failed without running. A worker may run
// only some tool lanes (Config.Lanes): it leaves jobs that need others to
// other workers and stops an agent that uses a tool of a lane it lacks.
package agentworker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/loopbus/loopbus/agent"
	"github.com/loopbus/loopbus/agent/anthropic"
	"github.com/loopbus/loopbus/agent/claude"
	"github.com/loopbus/loopbus/agent/codex"
	agentexec "github.com/loopbus/loopbus/agent/exec"
	"github.com/loopbus/loopbus/agent/openai"
	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/gitrepo"
	"github.com/loopbus/loopbus/schemas"
	"github.com/loopbus/loopbus/workspace"
	"github.com/rs/zerolog"
)

// Bus is what the worker needs from the event bus.
type Bus interface {
	Consume(ctx context.Context, cfg bus.ConsumerConfig, h bus.Handler) error
	Read(ctx context.Context, opts bus.ReadOptions, fn func(schemas.Event) error) error
	LastSeq(ctx context.Context) (uint64, error)
	SubjectLastSeq(ctx context.Context, subject string) (uint64, error)
	Publish(ctx context.Context, ev schemas.Event) (bus.Published, error)
	// Async publishes a job's events without a wait for each (see
	// bus.Async).
	Async() *bus.Async
	PutArtifact(ctx context.Context, object, name string, r io.Reader) (schemas.ArtifactRef, error)
	// GetArtifact copies an artifact to w, checking its size and digest
	// (see bus.Bus.GetArtifact): a job's inputs and definition files.
	GetArtifact(ctx context.Context, ref schemas.ArtifactRef, w io.Writer) error
	// GetArtifactFile writes an artifact to a file: git bundles.
	GetArtifactFile(ctx context.Context, ref schemas.ArtifactRef, path string) error
	// OwnID makes a derived event id unguessable to other workers' keys
	// (see bus.Bus.OwnID).
	OwnID(id string) string
	// SignerKey is the key the worker signs with; empty when unsigned.
	SignerKey() string
}

// Config of a worker process. The zero value is usable.
type Config struct {
	// ID names this worker in job.started; default host-pid.
	ID string
	// Concurrency is the number of jobs run at once; default 1.
	Concurrency int
	// WorkDir holds job workspaces; default $TMPDIR/loopbus-work-UID (see
	// workspace.DefaultDir). Run refuses one another user could change
	// (workspace.PrivateDir), and each repository cache that is not the
	// worker's user's alone (gitrepo.OpenCache).
	WorkDir string
	// RepoCache holds the worker's git repository caches, one per session,
	// for worktree and merge jobs; default WorkDir/repos. It is never the
	// user's repository: code arrives as bundles over the bus.
	RepoCache string
	// KeepWorkspaces leaves workspaces on disk for debugging.
	KeepWorkspaces bool
	// ReuseWorkspaces empties a job's workspace when it ends and renames
	// it for a later job instead of removing it (see workspace.Pool):
	// cheaper for many short jobs, but only for agents that run
	// unconfined, where a process left behind could reach any workspace
	// by its name anyway.
	ReuseWorkspaces bool
	// MaxAttempts is how often a job may be started before it is failed as
	// abandoned (its workers kept dying); default 3.
	MaxAttempts int
	// MaxOutputBytes bounds one output artifact; default 64 MiB.
	MaxOutputBytes int64
	// AckWait is the heartbeat horizon: a job whose worker is silent this
	// long goes to another worker; default 30s.
	AckWait time.Duration
	// Env is the base environment of agents; nil means this process's,
	// without its LOOPBUS_* settings.
	Env []string
	// SecretEnv names variables of Env whose values are secret, on top of
	// those a job lists and those whose names look secret (see
	// workspace.LooksSecret). A listed variable must be unset, empty or at
	// least workspace.MinSecretLen bytes long.
	SecretEnv []string
	// Lanes are the tool lanes (agent.AllLanes) this worker runs; empty
	// means all. A job whose planned tools (agent.ToolPlanner: claude's
	// allowed tools, exec's program) need another lane is left to other
	// workers; an agent that uses a tool of another lane anyway is stopped
	// and its job failed.
	Lanes []string
	// LaneTable maps tool names to lanes, over the backends' default lanes
	// (see agent.LaneTable, agent.Registry.DefaultLanes).
	LaneTable map[string]string
	// Backends are the agent backends this worker runs, by name; nil means
	// the built-in ones (see Builtin).
	Backends agent.Registry
	// ModelKeyEnv names the variables of Env a job's model-API agent may
	// name as its api_key_env; nil means OPENAI_API_KEY and
	// ANTHROPIC_API_KEY. A pipeline cannot make the worker send another
	// of its secrets to a server.
	ModelKeyEnv []string
	// ModelBaseURLs, when not empty, are the only base URLs (prefixes) a
	// job's model-API agent may name: on a shared worker, a pipeline
	// cannot send the worker's key to a server of its choosing.
	ModelBaseURLs []string
}

// Builtin returns the built-in agent backends: exec, claude, codex,
// openai and anthropic.
func Builtin() agent.Registry {
	return agent.Registry{
		schemas.BackendExec:      agentexec.Backend{},
		schemas.BackendClaude:    claude.Backend{},
		schemas.BackendCodex:     codex.Backend{},
		schemas.BackendOpenAI:    openai.Backend{},
		schemas.BackendAnthropic: anthropic.Backend{},
	}
}

// ErrInvalidConfig: a Config value is out of range.
var ErrInvalidConfig = errors.New("agentworker: invalid configuration")

// Validate reports the first invalid value, wrapping ErrInvalidConfig.
func (c Config) Validate() error {
	if c.Concurrency < 0 || c.MaxAttempts < 0 || c.MaxOutputBytes < 0 || c.AckWait < 0 {
		return fmt.Errorf("%w: negative setting", ErrInvalidConfig)
	}
	for _, n := range c.SecretEnv {
		if err := workspace.ValidateSecretName(n); err != nil {
			return fmt.Errorf("%w: secret env: %w", ErrInvalidConfig, err)
		}
	}
	for _, l := range c.Lanes {
		if err := agent.CheckLane(l); err != nil {
			return fmt.Errorf("%w: lanes: %w", ErrInvalidConfig, err)
		}
	}
	for _, n := range c.ModelKeyEnv {
		if err := workspace.ValidateSecretName(n); err != nil {
			return fmt.Errorf("%w: model key env: %w", ErrInvalidConfig, err)
		}
	}
	for _, u := range c.ModelBaseURLs {
		if !strings.HasPrefix(u, "http://") && !strings.HasPrefix(u, "https://") {
			return fmt.Errorf("%w: model base URL %q: want an http or https URL", ErrInvalidConfig, u)
		}
	}
	if _, err := agent.NewLaneTable(c.LaneTable); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	return nil
}

func (c Config) withDefaults() Config {
	if c.ID == "" {
		host, _ := os.Hostname()
		c.ID = fmt.Sprintf("%s-%d", host, os.Getpid())
	}
	if c.Concurrency == 0 {
		c.Concurrency = 1
	}
	if c.WorkDir == "" {
		c.WorkDir = workspace.DefaultDir("loopbus-work")
	}
	if c.RepoCache == "" {
		c.RepoCache = filepath.Join(c.WorkDir, "repos")
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = 3
	}
	if c.MaxOutputBytes == 0 {
		c.MaxOutputBytes = 64 << 20
	}
	if c.AckWait == 0 {
		c.AckWait = 30 * time.Second
	}
	if c.Env == nil {
		c.Env = workspace.BaseEnv()
	}
	if len(c.Lanes) == 0 {
		c.Lanes = agent.AllLanes()
	}
	if c.Backends == nil {
		c.Backends = Builtin()
	}
	if c.ModelKeyEnv == nil {
		c.ModelKeyEnv = []string{"OPENAI_API_KEY", "ANTHROPIC_API_KEY"}
	}
	return c
}

// Service is one worker process.
type Service struct {
	cfg   Config
	bus   Bus
	log   zerolog.Logger
	now   func() time.Time
	lanes *agent.LaneTable
	// has are the lanes this worker runs, lacks the others.
	has   map[string]bool
	lacks []string

	mu sync.Mutex
	// running are the jobs being handled, by jobKey.
	running map[string]*runningJob
	// refused are the jobs (by jobKey) left to other workers for a lane,
	// so that the reason is logged once per job.
	refused map[string]bool
	// caches are the sessions' repository caches.
	caches *gitrepo.Caches
	// cancels are the job.cancelled followed so far.
	cancels *cancelMemory
	// workspaces are the jobs' workspaces, emptied and kept for the next
	// while Run runs.
	workspaces *workspace.Pool
	// removals takes the workspaces of finished jobs to Run's remover.
	removals chan *workspace.Workspace
}

// New returns a worker.
func New(cfg Config, b Bus, log zerolog.Logger, now func() time.Time) (*Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if b == nil || now == nil {
		return nil, errors.New("agentworker: bus and clock are required")
	}
	cfg = cfg.withDefaults()
	// A listed secret too short to mask is a configuration error, found now
	// rather than as every job failing.
	sec, err := workspace.NewSecrets(cfg.Env, cfg.SecretEnv)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	log = log.With().Str("worker", cfg.ID).Logger()
	log.Debug().Int("secret_values", sec.Len()).Strs("secret_env", cfg.SecretEnv).Msg("secret environment values are masked")
	table, err := agent.NewLaneTable(cfg.Backends.DefaultLanes(), cfg.LaneTable)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	pool, err := workspace.NewPool(cfg.WorkDir, cfg.ReuseWorkspaces)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	s := &Service{cfg: cfg, bus: b, log: log, now: now, lanes: table, has: map[string]bool{},
		running: map[string]*runningJob{}, refused: map[string]bool{}, caches: gitrepo.NewCaches(cfg.RepoCache),
		cancels: newCancelMemory(followedCancelLimit), workspaces: pool}
	for _, l := range cfg.Lanes {
		s.has[l] = true
	}
	for _, l := range agent.AllLanes() {
		if !s.has[l] {
			s.lacks = append(s.lacks, l)
		}
	}
	return s, nil
}

// ConsumerName is the durable consumer all worker replicas share.
const ConsumerName = "agentworker"

// maxDeliveries bounds the deliveries of one job request. Lane releases
// count as deliveries, so it leaves room for hours of them; the runs of a
// job are bounded by Config.MaxAttempts, counted in job.started events.
const maxDeliveries = 10000

// Run takes jobs until ctx ends. A job is acknowledged only after its
// result is published; a job interrupted by shutdown is handed back at once.
// Alongside, Run follows job.cancelled from its start on and kills the
// agents of cancelled jobs (see followCancellations).
func (s *Service) Run(ctx context.Context) error {
	// Refused now rather than at the first job (see workspace.Pool.Create).
	if err := workspace.PrivateDir(s.cfg.WorkDir); err != nil {
		return err
	}
	defer func() {
		if err := s.workspaces.Close(); err != nil {
			s.log.Warn().Err(err).Msg("removing idle workspaces")
		}
	}()
	from, err := s.followStart(ctx)
	if err != nil || ctx.Err() != nil {
		return err
	}
	s.mu.Lock()
	s.cancels.follow(from)
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.cancels.follow(0)
	}()
	fctx, stopFollowing := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		s.followCancellations(fctx, from)
	}()
	defer wg.Wait()
	defer s.announcePresence(fctx)() // before stopFollowing ends fctx
	defer stopFollowing()
	// Finished jobs' workspaces are removed here, after the jobs' slots
	// are free; every one is removed before Run returns.
	s.removals = make(chan *workspace.Workspace, s.cfg.Concurrency)
	removed := make(chan struct{})
	go func() {
		defer close(removed)
		for ws := range s.removals {
			s.remove(ws)
		}
	}()
	defer func() {
		close(s.removals)
		<-removed
	}()
	s.log.Info().Int("concurrency", s.cfg.Concurrency).Strs("lanes", s.cfg.Lanes).Msg("agent worker ready")
	return s.bus.Consume(ctx, bus.ConsumerConfig{
		Durable:     ConsumerName,
		Subjects:    []string{schemas.SubjectPrefix + ".*.job.requested"},
		AckWait:     s.cfg.AckWait,
		MaxDeliver:  max(s.cfg.MaxAttempts+2, maxDeliveries),
		Concurrency: s.cfg.Concurrency,
	}, s.handle)
}

// release removes a finished job's workspace: on Run's remover when it
// has room, so that the job's slot, and with it the worker's next fetch,
// does not wait for the files to be removed (a millisecond and more), else
// here. A workspace the pool keeps goes back to it here, before the slot
// is free, so that the next job finds it.
func (s *Service) release(ws *workspace.Workspace) {
	if s.cfg.ReuseWorkspaces {
		s.remove(ws)
		return
	}
	select {
	case s.removals <- ws:
	default:
		s.remove(ws)
	}
}

func (s *Service) remove(ws *workspace.Workspace) {
	if err := ws.Remove(); err != nil {
		s.log.Warn().Err(err).Str("workspace", ws.Root).Msg("could not remove a job's workspace")
	}
}

func (s *Service) event(req schemas.Event, typ string, data any, idParts ...string) schemas.Event {
	return schemas.Event{
		ID:          s.bus.OwnID(schemas.DeterministicID(append([]string{req.Session, typ}, idParts...)...)),
		Type:        typ,
		Session:     req.Session,
		Step:        req.Step,
		Job:         req.Job,
		Causation:   req.ID,
		Correlation: req.Correlation,
		Time:        s.now(),
		Data:        data,
	}
}

// announce publishes job.started for this delivery of the job. A worker
// that signs its events states its lease: its ack wait. again reports
// that this delivery was announced before (its job.started was stored
// already).
func (s *Service) announce(ctx context.Context, req schemas.Event, jr *schemas.JobRequested, delivery uint64) (again bool, err error) {
	js := &schemas.JobStarted{JobID: jr.JobID, Worker: s.cfg.ID, Delivery: int(delivery)}
	if s.bus.SignerKey() != "" {
		js.LeaseMs = s.cfg.AckWait.Milliseconds()
	}
	p, err := s.bus.Publish(ctx, s.event(req, schemas.TypeJobStarted, js, jr.JobID, strconv.FormatUint(delivery, 10)))
	return p.Duplicate, err
}

// holdLease keeps the lease of a job this worker announced, when it signs
// its events (with signed events the orchestrator lets another worker take
// a job over only when its holder released it or fell silent): it sends a
// job.heartbeat every third of the lease until the returned function is
// called with the handler's result. If that result hands the job back to
// JetStream, the function announces job.released so the next worker may
// take it over at once; if that cannot be published, it delays the
// redelivery by a whole lease instead, after which the silence suffices.
func (s *Service) holdLease(ctx context.Context, req schemas.Event, jr *schemas.JobRequested, delivery uint64, log zerolog.Logger) func(*error) {
	if s.bus.SignerKey() == "" {
		return func(*error) {}
	}
	hctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(s.cfg.AckWait / 3)
		defer t.Stop()
		for n := 1; ; n++ {
			select {
			case <-hctx.Done():
				return
			case <-t.C:
			}
			ev := s.event(req, schemas.TypeJobHeartbeat, &schemas.JobHeartbeat{JobID: jr.JobID, Worker: s.cfg.ID, Delivery: int(delivery)},
				jr.JobID, strconv.FormatUint(delivery, 10), strconv.Itoa(n))
			if _, err := s.bus.Publish(hctx, ev); err != nil && hctx.Err() == nil {
				log.Warn().Err(err).Msg("job heartbeat not published")
			}
		}
	}()
	return func(errp *error) {
		stop()
		<-done
		// After the announcement the handler's only errors hand the job
		// back, but for permanent ones (dead-lettered).
		if err := *errp; err == nil || errors.Is(err, bus.ErrPermanent) {
			return
		}
		pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownWait)
		defer cancel()
		// The error itself stays in this worker's log: it may quote the
		// agent's environment.
		reason := "the worker is shutting down"
		if ctx.Err() == nil {
			reason = "the worker hit an error; the job runs again"
		}
		ev := s.event(req, schemas.TypeJobReleased, &schemas.JobReleased{JobID: jr.JobID, Worker: s.cfg.ID, Delivery: int(delivery), Reason: reason},
			jr.JobID, strconv.FormatUint(delivery, 10))
		if _, err := s.bus.Publish(pctx, ev); err != nil {
			log.Warn().Err(err).Dur("redeliver_in", s.cfg.AckWait).Msg("could not announce handing the job back; it goes to the next worker after a whole lease")
			*errp = bus.Release(s.cfg.AckWait)
		}
	}
}

// resultEvent builds job.completed or job.failed. Both share one id per
// job, so however often a job runs, one result lands.
func (s *Service) resultEvent(req schemas.Event, jr *schemas.JobRequested, data any) schemas.Event {
	typ := schemas.TypeJobCompleted
	if _, ok := data.(*schemas.JobFailed); ok {
		typ = schemas.TypeJobFailed
	}
	ev := s.event(req, typ, data)
	ev.ID = s.bus.OwnID(schemas.DeterministicID(req.Session, "job.result", jr.JobID))
	return ev
}

func (s *Service) handle(ctx context.Context, d bus.Delivery) (err error) {
	req := d.Event
	jr, ok := req.Data.(*schemas.JobRequested)
	if !ok {
		return fmt.Errorf("%w: %s is not a job request", bus.ErrPermanent, req.Type)
	}
	log := s.log.With().Str("session", req.Session).Str("job", jr.JobID).Logger()
	if d.NumDelivered > 1 && s.runs(req.Session, jr.JobID) {
		// Handed out again while this worker runs it (see holder.go).
		log.Info().Uint64("delivery", d.NumDelivered).Msg("the job was handed out again while this worker still runs it; leaving it running")
		return bus.Release(s.cfg.AckWait)
	}
	// The job is registered before anything else, so that every
	// job.cancelled stored from now on reaches it (see onCancelled); one
	// stored earlier is found just below. jctx ends when the job is
	// cancelled, or uses a lane this worker lacks; the agent runs under it.
	jctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	defer s.track(req.Session, jr.JobID, stop)()
	// sec masks the agent's secrets in everything published or logged; it
	// is nil (masking nothing) until the agent's environment is known.
	var sec *workspace.Secrets
	// out is what the agent reported; nil until it ran.
	var out *outcome
	result := func(jf *schemas.JobFailed) error {
		jf.JobID, jf.Step, jf.Iteration, jf.Worker = jr.JobID, jr.Step, jr.Iteration, s.cfg.ID
		jf.Error = sec.Mask(jf.Error)
		if out != nil {
			jf.Usage, jf.IgnoredLines = out.usageRef(), out.ignored
			jf.APIRetries, jf.StopReason = out.retries, out.stopReason
			if out.rateLimit != "" {
				jf.RateLimited = true
				if !out.resetAt.IsZero() {
					t := out.resetAt.UTC()
					jf.ResetAt = &t
				}
			}
		}
		_, err := s.bus.Publish(ctx, s.resultEvent(req, jr, jf))
		if jf.Cancelled {
			log.Info().Str("error", jf.Error).Msg("job cancelled")
		} else {
			log.Warn().Str("error", jf.Error).Msg("job failed")
		}
		return err
	}
	failWith := func(msg string, exit int, dur time.Duration, tail string, retryable bool) error {
		return result(&schemas.JobFailed{ExitCode: exit, DurationMs: dur.Milliseconds(), Error: msg, OutputTail: tail, Retryable: retryable})
	}
	fail := func(msg string, exit int, dur time.Duration, tail string) error {
		return failWith(msg, exit, dur, tail, false)
	}
	// A bug that panics on one job fails that job, with the panic as its
	// reason; the worker and its other jobs go on.
	defer func() {
		if p := recover(); p != nil {
			log.Error().Str("stack", string(debug.Stack())).Msgf("the job crashed the worker's handler: %v", p)
			err = fail(fmt.Sprintf("the worker crashed while running the job: %v", p), -1, 0, "")
		}
	}()
	// stopped publishes the result of a job whose jctx was ended by a
	// cancellation or a lane violation; it reports false for any other.
	stopped := func(res agent.Result) (bool, error) {
		var ce *cancelledError
		var le *laneError
		switch cause := context.Cause(jctx); {
		case ctx.Err() != nil:
			return false, nil // shutting down: the caller hands the job back
		case errors.As(cause, &ce):
			return true, result(&schemas.JobFailed{ExitCode: res.ExitCode, DurationMs: res.Duration.Milliseconds(),
				Error: ce.Error(), OutputTail: res.Tail, Cancelled: true})
		case errors.As(cause, &le):
			return true, fail(le.Error(), res.ExitCode, res.Duration, res.Tail)
		}
		return false, nil
	}

	reason, cancelled, err := s.cancellation(ctx, req, jr)
	if err != nil {
		return err
	}
	if cancelled {
		log.Info().Str("reason", reason).Msg("the job was cancelled before it started; not running it")
		return result(&schemas.JobFailed{ExitCode: -1, Error: (&cancelledError{reason: reason}).Error(), Cancelled: true})
	}
	// A backend this worker lacks fails the job once it started, below.
	backend, lookupErr := s.cfg.Backends.Lookup(jr.Agent.Backend)
	if tool, lane, ok := s.missingLane(backend, jr); ok {
		if s.firstRefusal(req.Session, jr.JobID) {
			log.Info().Str("tool", tool).Str("lane", lane).Strs("lanes", s.cfg.Lanes).
				Msg("leaving the job to another worker: it needs a tool of a lane this worker does not run")
		}
		return bus.Release(laneRetryDelay(d.NumDelivered))
	}
	if d.NumDelivered > 1 {
		done, err := s.finished(ctx, req)
		if err != nil {
			return err
		}
		if done {
			log.Info().Uint64("delivery", d.NumDelivered).Msg("the job was handed out again after its result was stored; not running it again")
			return nil
		}
		holder, held, err := s.heldElsewhere(ctx, req, jr, d.NumDelivered)
		if err != nil {
			return err
		}
		if held {
			log.Info().Str("holder", holder).Uint64("delivery", d.NumDelivered).
				Msg("the job was handed out again, but the worker running it is still there; leaving it to that worker")
			return bus.Release(s.cfg.AckWait)
		}
	}
	if int(d.NumDelivered) > s.cfg.MaxAttempts {
		// Deliveries count lane releases too: what counts is how often a
		// worker started the job.
		starts, err := s.starts(ctx, req, jr, d.NumDelivered)
		if err != nil {
			return err
		}
		if starts >= s.cfg.MaxAttempts {
			// With signed events only the job's holder may state its
			// result: the worker that fails it takes it over first.
			if s.bus.SignerKey() != "" {
				if _, err := s.announce(ctx, req, jr, d.NumDelivered); err != nil {
					return err
				}
			}
			return failWith(fmt.Sprintf("job abandoned: workers started it %d time(s) and never finished it (they stopped or crashed)", starts), -1, 0, "", true)
		}
	}
	again, err := s.announce(ctx, req, jr, d.NumDelivered)
	if err != nil {
		return err
	}
	if again {
		// The server handed the job out again under the same delivery
		// count: it lost its record of the first hand-out (killed right
		// after it). A job that has its result already is not run again.
		done, err := s.finished(ctx, req)
		if err != nil {
			return err
		}
		if done {
			log.Info().Uint64("delivery", d.NumDelivered).Msg("the job was handed out again after its result was stored; not running it again")
			return nil
		}
	}
	defer s.holdLease(ctx, req, jr, d.NumDelivered, log)(&err)
	log.Info().Int("iteration", jr.Iteration).Uint64("delivery", d.NumDelivered).Msg("job started")
	if err := checkRequest(jr); err != nil {
		return fail("refusing the job request: "+err.Error(), -1, 0, "")
	}
	if err := s.checkModelAPI(jr.Agent); err != nil {
		return fail("refusing the job request: "+err.Error(), -1, 0, "")
	}

	ws, err := s.workspaces.Create(req.Session, fmt.Sprintf("%s-%s-%d", jr.Step, strconv.Itoa(jr.Iteration), d.NumDelivered))
	if err != nil {
		return err
	}
	if !s.cfg.KeepWorkspaces {
		defer s.release(ws)
	}
	env := ws.Env(s.cfg.Env, workspace.Vars{Session: req.Session, Step: jr.Step, Job: jr.JobID, Iteration: jr.Iteration}, jr.Agent.Env)
	if sec, err = workspace.NewSecrets(env, secretNames(env, s.cfg.SecretEnv, jr.Agent)); err != nil {
		return fail(err.Error(), -1, 0, "")
	}
	// The session's scripts travel with it: the agent runs this worker's
	// copies, not files at the submitting machine's paths.
	runnable := func(argv []string) []string { return argv }
	err = ws.Fetch(jctx, s.bus, jr.Inputs, ws.In)
	if err == nil {
		runnable, err = ws.FetchDefinition(jctx, s.bus, jr.Dir, jr.DefinitionFiles)
	}
	if err != nil {
		if ok, err := stopped(agent.Result{ExitCode: -1}); ok {
			return err
		}
		if errors.Is(err, bus.ErrNotFound) || errors.Is(err, bus.ErrDigestMismatch) {
			return failWith("cannot provide inputs: "+err.Error(), -1, 0, "", true)
		}
		if errors.Is(err, schemas.ErrBadName) {
			return fail("cannot provide inputs: "+err.Error(), -1, 0, "")
		}
		return err
	}
	if err := ws.WriteFiles(jr.Files); err != nil {
		return fail("cannot provide inputs: "+err.Error(), -1, 0, "")
	}
	if jr.Worktree != nil && jr.Worktree.Merge {
		data, err := s.merge(jctx, req, jr, ws, d.NumDelivered)
		switch {
		case ctx.Err() != nil:
			return ctx.Err() // shutting down: hand the job back
		case err != nil:
			if ok, err := stopped(agent.Result{ExitCode: -1}); ok {
				return err
			}
			return err
		}
		if jf, isFail := data.(*schemas.JobFailed); isFail {
			return result(jf)
		}
		_, err = s.bus.Publish(ctx, s.resultEvent(req, jr, data))
		if err == nil {
			log.Info().Str("head", data.(*schemas.JobCompleted).Git.Commit).Msg("merged")
		}
		return err
	}
	prompt := jr.Prompt
	dir := ws.Root
	var wt *worktree
	if jr.Worktree != nil {
		var note string
		wt, note, err = s.prepareWorktree(jctx, req, jr, ws)
		if err != nil {
			if ok, err := stopped(agent.Result{ExitCode: -1}); ok {
				return err
			}
			if errors.Is(err, bus.ErrNotFound) || errors.Is(err, bus.ErrDigestMismatch) || errors.Is(err, gitrepo.ErrBadBundle) {
				return failWith("cannot provide the worktree: "+err.Error(), -1, 0, "", true)
			}
			return err
		}
		defer wt.remove(ctx)
		dir = wt.dir
		env = append(env, "LOOPBUS_WORKSPACE="+wt.dir)
		if note != "" {
			prompt += "\n\n## Note from the worker\n\n" + note + "\n"
		}
	}
	if err := ws.WriteText(prompt, schemas.FormatFeedback(jr.Feedback)); err != nil {
		return err
	}

	if lookupErr != nil {
		return fail(lookupErr.Error(), -1, 0, "")
	}
	run := *jr
	run.Prompt = prompt
	run.Agent.Command = runnable(jr.Agent.Command)
	res, out, runErr := s.runAgent(ctx, jctx, stop, backend, req, &run, ws.Root, dir, env, sec, d.NumDelivered)
	if ctx.Err() != nil {
		return ctx.Err() // shutting down: hand the job back
	}
	if ok, err := stopped(res); ok {
		return err
	}
	switch {
	case out.publishErr != nil:
		return out.publishErr // its events are incomplete: run it again
	case runErr != nil:
		return fail(runErr.Error(), -1, res.Duration, "")
	case res.TimedOut:
		return fail(fmt.Sprintf("agent timed out after %s and was killed", time.Duration(jr.TimeoutMs)*time.Millisecond), res.ExitCode, res.Duration, res.Tail)
	case out.rateLimit != "":
		// Not a success, whatever the exit code: the work was cut short.
		msg := "the agent hit a usage or rate limit: " + out.rateLimit
		if !out.resetAt.IsZero() {
			msg += fmt.Sprintf(" (resets at %s)", out.resetAt.UTC().Format(time.RFC3339))
		}
		return fail(msg, res.ExitCode, res.Duration, res.Tail)
	case out.failure != "":
		return fail("the agent reported a failure: "+out.failure, res.ExitCode, res.Duration, res.Tail)
	case res.ExitCode != 0:
		return fail(fmt.Sprintf("agent exited with code %d", res.ExitCode), res.ExitCode, res.Duration, res.Tail)
	}

	// Check every output before storing any: a job with one bad output
	// leaves nothing in the artifact stream.
	for _, o := range jr.Outputs {
		if err := s.checkOutput(ws, o.Name, sec); err != nil {
			if outputFault(err) {
				return fail(err.Error(), res.ExitCode, res.Duration, res.Tail)
			}
			return err
		}
	}
	arts := make([]schemas.ArtifactRef, 0, len(jr.Outputs))
	for _, o := range jr.Outputs {
		ref, err := s.storeOutput(ctx, req, jr, ws, o.Name, sec, d.NumDelivered)
		if err != nil {
			if outputFault(err) {
				return fail(err.Error(), res.ExitCode, res.Duration, res.Tail)
			}
			return err
		}
		arts = append(arts, ref)
	}
	var g *schemas.GitResult
	if wt != nil {
		if g, err = s.commitWork(ctx, wt, req, jr, ws, d.NumDelivered); err != nil {
			if errors.Is(err, errCommit) {
				return fail(err.Error(), res.ExitCode, res.Duration, res.Tail)
			}
			return err
		}
	}
	_, err = s.bus.Publish(ctx, s.resultEvent(req, jr, &schemas.JobCompleted{
		JobID: jr.JobID, Step: jr.Step, Iteration: jr.Iteration, RequestSeq: req.Seq, Worker: s.cfg.ID,
		ExitCode: res.ExitCode, DurationMs: res.Duration.Milliseconds(), Artifacts: arts, OutputTail: res.Tail,
		Usage: out.usageRef(), IgnoredLines: out.ignoredLines(), APIRetries: out.retries, StopReason: out.stopReason, Git: g,
	}))
	if err == nil {
		log.Info().Dur("took", res.Duration).Int("artifacts", len(arts)).Msg("job completed")
	}
	return err
}

// checkRequest refuses a request whose names the pipeline loader would
// have refused: events are not trusted to come from it.
func checkRequest(jr *schemas.JobRequested) error {
	for _, out := range jr.Outputs {
		if err := schemas.ValidateName(out.Name); err != nil {
			return fmt.Errorf("declared output: %w", err)
		}
	}
	for _, in := range jr.Inputs {
		if err := schemas.ValidateName(in.Name); err != nil {
			return fmt.Errorf("input: %w", err)
		}
	}
	for _, n := range jr.Agent.SecretEnv {
		if err := workspace.ValidateSecretName(n); err != nil {
			return fmt.Errorf("agent secretEnv: %w", err)
		}
	}
	if n := jr.Agent.APIKeyEnv; n != "" {
		if err := workspace.ValidateSecretName(n); err != nil {
			return fmt.Errorf("agent apiKeyEnv: %w", err)
		}
	}
	if jr.Worktree != nil {
		return checkWorktree(jr.Worktree)
	}
	return nil
}

// checkModelAPI refuses a model-API agent that names a key variable or a
// server this worker does not lend its keys to.
func (s *Service) checkModelAPI(a schemas.AgentSpec) error {
	if a.Backend != schemas.BackendOpenAI && a.Backend != schemas.BackendAnthropic {
		return nil
	}
	if a.MaxTurns < 0 || a.MaxTurns > 1000 || a.MaxTokens < 0 || a.MaxTokens > 1_000_000 || a.RetryWaitMs < 0 || a.RetryWaitMs > time.Hour.Milliseconds() {
		return errors.New("agent maxTurns, maxTokens or retryWaitMs out of range")
	}
	if n := a.APIKeyEnv; n != "" && !slices.Contains(s.cfg.ModelKeyEnv, n) {
		return fmt.Errorf("api_key_env %s is not a variable this worker lends to model APIs (%s; agentworker --model-key-env)",
			n, strings.Join(s.cfg.ModelKeyEnv, ", "))
	}
	if len(s.cfg.ModelBaseURLs) == 0 {
		return nil
	}
	// The pipeline names its server in base_url, or in agent.env where the
	// backend reads its default: both are checked.
	for _, u := range []string{a.BaseURL, a.Env["OPENAI_BASE_URL"], a.Env["ANTHROPIC_BASE_URL"]} {
		if u != "" && !slices.ContainsFunc(s.cfg.ModelBaseURLs, func(allowed string) bool { return underURL(u, allowed) }) {
			return fmt.Errorf("base_url %s is not a server this worker calls (%s; agentworker --model-base-url)",
				u, strings.Join(s.cfg.ModelBaseURLs, ", "))
		}
	}
	return nil
}

// underURL reports whether u is allowed or below it: the same scheme and
// host (with port), no user information, and a path that is allowed's or
// continues it after a "/" (so https://api.example.com allows neither
// https://api.example.com.evil.net nor https://api.example.com@evil.net).
func underURL(u, allowed string) bool {
	pu, err := url.Parse(u)
	if err != nil || pu.User != nil || pu.Opaque != "" {
		return false
	}
	pa, err := url.Parse(allowed)
	if err != nil || !strings.EqualFold(pu.Scheme, pa.Scheme) || !strings.EqualFold(pu.Host, pa.Host) {
		return false
	}
	base := strings.TrimSuffix(pa.Path, "/")
	return pu.Path == base || strings.HasPrefix(pu.Path, base+"/")
}

// secretNames are the variables of env whose values a job's events and
// logs must never show: the worker's, the agent's, and the API key a
// model-API backend reads, whatever its name looks like (unless it is too
// short to be more than a local server's placeholder).
func secretNames(env, worker []string, a schemas.AgentSpec) []string {
	names := append(slices.Clone(worker), a.SecretEnv...)
	if n := a.APIKeyEnv; n != "" && !slices.Contains(names, n) && slices.ContainsFunc(env, func(kv string) bool {
		v, ok := strings.CutPrefix(kv, n+"=")
		return ok && len(v) >= workspace.MinSecretLen
	}) {
		names = append(names, n)
	}
	return names
}

// outputFault reports whether err is the agent's outputs' fault (the job
// fails) rather than the worker's (the job is handed back).
func outputFault(err error) bool {
	return errors.Is(err, workspace.ErrUnsafeOutput) || errors.Is(err, schemas.ErrBadName) || errors.Is(err, workspace.ErrSecretInOutput)
}

// checkOutput makes sure output name can be stored: a safe regular file
// within the size limit that contains no secret value.
func (s *Service) checkOutput(ws *workspace.Workspace, name string, sec *workspace.Secrets) error {
	f, size, err := ws.OpenOutput(name, s.cfg.MaxOutputBytes)
	if err != nil {
		return err
	}
	defer f.Close()
	// The size it had when opened: storeOutput guards what it stores,
	// should the file have grown since.
	found, err := sec.Find(io.LimitReader(f, size))
	if err != nil {
		return fmt.Errorf("%w: output %s: %v", workspace.ErrUnsafeOutput, name, err)
	}
	if found != "" {
		return workspace.SecretInOutput(name, found)
	}
	return nil
}

func (s *Service) storeOutput(ctx context.Context, req schemas.Event, jr *schemas.JobRequested, ws *workspace.Workspace, name string, sec *workspace.Secrets, delivery uint64) (schemas.ArtifactRef, error) {
	f, _, err := ws.OpenOutput(name, s.cfg.MaxOutputBytes)
	if err != nil {
		return schemas.ArtifactRef{}, err
	}
	defer f.Close()
	// One key per request message and delivery: a job run again (a lost
	// ack, a repeated request) must not overwrite the bytes that the result
	// which did land points to.
	object := fmt.Sprintf("%s/r%d-d%d/%s", jr.JobID, req.Seq, delivery, name)
	// Guarded as well: checkOutput read the file, but whatever outlived the
	// agent could have changed it since. A failed read stores nothing.
	ref, err := s.bus.PutArtifact(ctx, object, name, sec.Reader(io.LimitReader(f, s.cfg.MaxOutputBytes), name))
	if err != nil {
		return schemas.ArtifactRef{}, err
	}
	ref.Step = jr.Step
	if _, err := s.bus.Publish(ctx, s.event(req, schemas.TypeArtifactStored, &schemas.ArtifactStored{JobID: jr.JobID, Artifact: ref}, jr.JobID, name, ref.Digest)); err != nil {
		return schemas.ArtifactRef{}, err
	}
	return ref, nil
}
