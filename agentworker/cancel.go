package agentworker

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/loopbus/loopbus/agent"
	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/schemas"
)

// cancelledError ends a job's context when its job.cancelled arrives.
type cancelledError struct{ reason string }

func (e *cancelledError) Error() string {
	if e.reason == "" {
		return "cancelled: no reason given"
	}
	return "cancelled: " + e.reason
}

// laneError ends a job's context when its agent uses a tool of a lane this
// worker does not run.
type laneError struct {
	tool, lane string
	has        []string
}

func (e *laneError) Error() string {
	return fmt.Sprintf("the agent used tool %s, which is in lane %s; this worker runs only lanes %s, so it stopped the agent",
		e.tool, e.lane, strings.Join(e.has, ", "))
}

// runningJob is a job being handled by this process.
type runningJob struct {
	stop context.CancelCauseFunc
	// killed is set by the first cancellation, so that it is logged once.
	killed bool
}

func jobKey(session, job string) string { return session + "/" + job }

// track registers a job being handled until the returned func is called.
func (s *Service) track(session, job string, stop context.CancelCauseFunc) (untrack func()) {
	key, rj := jobKey(session, job), &runningJob{stop: stop}
	s.mu.Lock()
	s.running[key] = rj
	s.mu.Unlock()
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.running[key] == rj { // not a later delivery of the same job
			delete(s.running, key)
		}
	}
}

// onCancelled kills the agent of the job a job.cancelled names, if this
// process runs it.
func (s *Service) onCancelled(ev schemas.Event) {
	jc, ok := ev.Data.(*schemas.JobCancelled)
	if !ok {
		return
	}
	s.mu.Lock()
	s.cancels.remember(jobKey(ev.Session, jc.JobID), jc.Reason, ev.Seq)
	rj := s.running[jobKey(ev.Session, jc.JobID)]
	first := rj != nil && !rj.killed
	if rj != nil {
		rj.killed = true
	}
	s.mu.Unlock()
	if rj == nil {
		s.log.Debug().Str("session", ev.Session).Str("job", jc.JobID).Msg("job.cancelled for a job this worker does not run")
		return
	}
	if first {
		s.log.Warn().Str("session", ev.Session).Str("job", jc.JobID).Str("reason", jc.Reason).Uint64("seq", ev.Seq).
			Msg("job cancelled: killing its agent")
	}
	rj.stop(&cancelledError{reason: jc.Reason})
}

// cancelledSubjects are the subjects of every session's job.cancelled.
func cancelledSubjects() []string {
	return []string{schemas.SubjectPrefix + ".*.job.cancelled"}
}

// followStart returns the stream sequence from which job.cancelled must be
// followed: the one after the newest event, taken before any job is, so
// that each cancellation is either followed or stored before the request
// check of cancellation looks. It retries until the server answers or ctx
// ends (then it returns 0, nil); a connection given up is an error.
func (s *Service) followStart(ctx context.Context) (uint64, error) {
	for attempt := 0; ; attempt++ {
		last, err := s.bus.LastSeq(ctx)
		switch {
		case err == nil:
			return last + 1, nil
		case ctx.Err() != nil:
			return 0, nil
		case errors.Is(err, bus.ErrConnectionLost):
			return 0, err
		}
		s.log.Warn().Err(err).Msg("cannot read the stream's position to follow job.cancelled; retrying")
		if !sleep(ctx, followBackoff(attempt)) {
			return 0, nil
		}
	}
}

// followCancellations reads every job.cancelled from stream sequence from
// on until ctx ends (an ordered consumer: every replica sees every one)
// and kills the agents of those this process runs. Should the read stop
// for any reason but ctx, it resumes after the last one it saw.
func (s *Service) followCancellations(ctx context.Context, from uint64) {
	for attempt := 0; ctx.Err() == nil; attempt++ {
		seen := false
		err := s.bus.Read(ctx, bus.ReadOptions{Subjects: cancelledSubjects(), StartSeq: from, Follow: true,
			OnCaughtUp: func() { s.caughtUp(true) }}, func(ev schemas.Event) error {
			from, seen = ev.Seq+1, true
			s.onCancelled(ev)
			return nil
		})
		s.caughtUp(false)
		if ctx.Err() != nil {
			return
		}
		if seen {
			attempt = 0
		}
		s.log.Warn().Err(err).Uint64("from_seq", from).Msg("following job.cancelled stopped; resuming")
		sleep(ctx, followBackoff(attempt))
	}
}

// caughtUp records whether the follower of job.cancelled is live.
func (s *Service) caughtUp(live bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cancels.caughtUp(live)
}

// followBackoff is the pause before retry attempt (from 0): 100ms doubling
// up to 3.2s, so that a cancellation is not missed for long.
func followBackoff(attempt int) time.Duration {
	return 100 * time.Millisecond << min(attempt, 5)
}

// sleep waits d or until ctx ends; it reports whether ctx is still alive.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// followedCancelLimit bounds the cancellations a worker remembers
// (cancelMemory); beyond it, a job asks the stream.
const followedCancelLimit = 4096

// cancellation reports whether a job.cancelled for jr was stored after its
// request, and its reason. The job is registered (track) before it asks.
// A request made since this worker follows cancellations is answered from
// what it followed, with no request to the server; an older one costs
// one request, unless the session has a cancellation newer than the
// request: only then are they read.
func (s *Service) cancellation(ctx context.Context, req schemas.Event, jr *schemas.JobRequested) (reason string, cancelled bool, err error) {
	s.mu.Lock()
	reason, cancelled, known := s.cancels.lookup(jobKey(req.Session, jr.JobID), req.Seq)
	s.mu.Unlock()
	if known {
		return reason, cancelled, nil
	}
	subject, err := schemas.SubjectFor(req.Session, schemas.TypeJobCancelled)
	if err != nil {
		return "", false, fmt.Errorf("%w: %w", bus.ErrPermanent, err)
	}
	last, err := s.bus.SubjectLastSeq(ctx, subject)
	if err != nil || last <= req.Seq {
		return "", false, err
	}
	err = s.bus.Read(ctx, bus.ReadOptions{Subjects: []string{subject}, StartSeq: req.Seq + 1}, func(ev schemas.Event) error {
		if jc, ok := ev.Data.(*schemas.JobCancelled); ok && jc.JobID == jr.JobID {
			reason, cancelled = jc.Reason, true
			return bus.ErrStop
		}
		if ev.Seq >= last {
			return bus.ErrStop // the rest came after the check
		}
		return nil
	})
	return reason, cancelled, err
}

// starts counts how often workers started jr since its request: its
// job.started events (one per delivery that began it).
func (s *Service) starts(ctx context.Context, req schemas.Event, jr *schemas.JobRequested, delivery uint64) (int, error) {
	subject, err := schemas.SubjectFor(req.Session, schemas.TypeJobStarted)
	if err != nil {
		return 0, fmt.Errorf("%w: %w", bus.ErrPermanent, err)
	}
	deliveries := map[int]bool{}
	err = s.bus.Read(ctx, bus.ReadOptions{Subjects: []string{subject}, StartSeq: req.Seq + 1}, func(ev schemas.Event) error {
		// Only earlier deliveries count: a start claiming this delivery
		// or a later one did not happen (yet), whoever announced it.
		if js, ok := ev.Data.(*schemas.JobStarted); ok && js.JobID == jr.JobID && js.Delivery < int(delivery) {
			deliveries[js.Delivery] = true
		}
		return nil
	})
	return len(deliveries), err
}

// finished reports whether a result of req's job (job.completed or
// job.failed) that this very request caused was stored: one whose
// causation is the request's id, as resultEvent writes it. A result of
// another request of the same job (a decision repeated) does not count:
// that request runs.
func (s *Service) finished(ctx context.Context, req schemas.Event) (bool, error) {
	var subjects []string
	for _, typ := range []string{schemas.TypeJobCompleted, schemas.TypeJobFailed} {
		subject, err := schemas.SubjectFor(req.Session, typ)
		if err != nil {
			return false, fmt.Errorf("%w: %w", bus.ErrPermanent, err)
		}
		subjects = append(subjects, subject)
	}
	found := false
	err := s.bus.Read(ctx, bus.ReadOptions{Subjects: subjects, StartSeq: req.Seq + 1}, func(ev schemas.Event) error {
		if ev.Causation == req.ID && ev.Job == req.Job {
			found = true
			return bus.ErrStop
		}
		return nil
	})
	return found, err
}

// missingLane returns a tool the job's agent will use whose lane this
// worker does not run, among those its backend plans (agent.ToolPlanner:
// claude's allowed tools, exec's program). Other backends (codex) do not
// say in advance; their tools are checked as they are used.
func (s *Service) missingLane(b agent.Backend, jr *schemas.JobRequested) (tool, lane string, missing bool) {
	p, ok := b.(agent.ToolPlanner)
	if len(s.lacks) == 0 || !ok {
		return "", "", false
	}
	for _, t := range p.PlannedTools(jr.Agent) {
		if l := s.lanes.Lane(t.Name, t.Category); !s.has[l] {
			return t.Name, l, true
		}
	}
	return "", "", false
}

// maxRefusals bounds the memory of refused jobs; past it, it starts over
// (a reason may then be logged again).
const maxRefusals = 4096

// firstRefusal reports whether this is the first time this worker leaves
// the job to others.
func (s *Service) firstRefusal(session, job string) bool {
	key := jobKey(session, job)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.refused[key] {
		return false
	}
	if len(s.refused) >= maxRefusals {
		clear(s.refused)
	}
	s.refused[key] = true
	return true
}

// laneRetryDelay is how long a job left to other workers stays away from
// every worker: short, so that a worker with the lane takes it soon, and
// growing with its deliveries so that a job no worker can run costs little.
func laneRetryDelay(delivery uint64) time.Duration {
	return min(time.Duration(delivery)*500*time.Millisecond, 5*time.Second)
}
