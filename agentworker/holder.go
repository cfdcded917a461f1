package agentworker

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/schemas"
)

// A job is handed out again when its worker's in-progress signals stop
// reaching the server for the ack wait: the worker died, or the cluster
// hiccuped (the node it is connected to frozen or cut off, a consumer
// leader lost). Only the first calls for another run. So a worker given
// a job again first asks whether the job's holder (the worker of its last
// job.started) is still there: this worker itself, still running it; or
// another whose presence record (bus.Worker) lists the job, or was last
// refreshed before the job started (it lists it at its next refresh).
// Such a job is handed back for later; by then its holder has finished
// it, and finished stops it from running again, or has gone, and its
// record with it (bus.WorkerTTL after its last refresh).

// PresenceReader is what a Bus offers to read one worker's presence
// record (bus.Bus does); without it a job handed out again is run.
type PresenceReader interface {
	Worker(ctx context.Context, id string) (bus.WorkerInfo, bool, error)
}

// runs reports whether this worker runs the job now (a handler of an
// earlier delivery of it is under way).
func (s *Service) runs(session, job string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.running[jobKey(session, job)] != nil
}

// runningJobs are the keys of the jobs this worker runs, for its
// presence record: at most bus.MaxWorkerJobs, sorted.
func (s *Service) runningJobs() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	keys := make([]string, 0, len(s.running))
	for k := range s.running {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys[:min(len(keys), bus.MaxWorkerJobs)]
}

// heldElsewhere reports the worker still holding req's job, delivered
// for the delivery'th time, if another worker announced it for an
// earlier delivery and is still there with it (see above).
func (s *Service) heldElsewhere(ctx context.Context, req schemas.Event, jr *schemas.JobRequested, delivery uint64) (holder string, held bool, err error) {
	p, ok := s.bus.(PresenceReader)
	if !ok || delivery < 2 {
		return "", false, nil
	}
	subject, err := schemas.SubjectFor(req.Session, schemas.TypeJobStarted)
	if err != nil {
		return "", false, fmt.Errorf("%w: %w", bus.ErrPermanent, err)
	}
	var started time.Time
	err = s.bus.Read(ctx, bus.ReadOptions{Subjects: []string{subject}, StartSeq: req.Seq + 1}, func(ev schemas.Event) error {
		if js, ok := ev.Data.(*schemas.JobStarted); ok && js.JobID == jr.JobID && js.Delivery < int(delivery) {
			holder, started = js.Worker, ev.Time
		}
		return nil
	})
	if err != nil || holder == "" || holder == s.cfg.ID {
		// This worker's own earlier run is not under way (runs said so):
		// it stopped, and the job is run again.
		return "", false, err
	}
	w, present, err := p.Worker(ctx, holder)
	if err != nil || !present {
		return "", false, err
	}
	key := jobKey(req.Session, jr.JobID)
	return holder, slices.Contains(w.Jobs, key) || w.Seen.Before(started), nil
}
