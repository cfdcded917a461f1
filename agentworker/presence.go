package agentworker

import (
	"context"
	"os"
	"sync"
	"time"

	"github.com/loopbus/loopbus/bus"
)

// Presence is what a Bus offers to announce the worker (bus.Bus does);
// with a Bus without it, the worker announces nothing.
type Presence interface {
	PutWorker(ctx context.Context, w bus.WorkerInfo) error
	DeleteWorker(ctx context.Context, id string) error
}

// announcePresence puts the worker's record in the presence bucket now and every
// bus.WorkerRefresh until ctx ends, then deletes it. The returned function
// waits for the deletion.
func (s *Service) announcePresence(ctx context.Context) (wait func()) {
	p, ok := s.bus.(Presence)
	if !ok {
		return func() {}
	}
	host, _ := os.Hostname()
	w := bus.WorkerInfo{ID: s.cfg.ID, Host: host, PID: os.Getpid(), Lanes: s.cfg.Lanes,
		Concurrency: s.cfg.Concurrency, Started: s.now().UTC()}
	put := func(warned bool) bool {
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		w.Jobs = s.runningJobs()
		if err := p.PutWorker(pctx, w); err != nil && ctx.Err() == nil {
			if !warned {
				s.log.Warn().Err(err).Msg("cannot announce this worker (status and doctor will not list it); retrying")
			}
			return true
		}
		return false
	}
	warned := put(false)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(bus.WorkerRefresh)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				dctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				defer cancel()
				if err := p.DeleteWorker(dctx, s.cfg.ID); err != nil {
					s.log.Debug().Err(err).Msg("worker presence not deleted; it expires")
				}
				return
			case <-t.C:
				warned = put(warned)
			}
		}
	}()
	return wg.Wait
}
