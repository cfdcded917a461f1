package agentworker

// cancelMemory remembers the job.cancelled this worker followed, so that
// a job it takes needs no request to the server to learn whether it was
// cancelled before it started: while the follower is live (it caught up
// with the stream and reads on), every job.cancelled stored from its
// start on is found here or reaches the job's handler as soon as it is
// read (a few milliseconds after it was stored: the agent is stopped
// then, as for a cancellation that comes while it runs). It keeps at most
// limit of them; an answer it cannot give for sure (the follower not
// live, a request older than its start or than what it forgot) is left
// to the stream (known false).
type cancelMemory struct {
	// from is the first stream sequence followed (0: not following).
	from uint64
	// live is set while the follower's read is caught up and going on.
	live bool
	// forgot is the newest sequence of a forgotten cancellation: every
	// one stored after it is kept.
	forgot uint64
	limit  int
	// byJob holds the newest cancellation of each job kept, by job key;
	// order the keys, oldest first.
	byJob map[string]followedCancel
	order []string
}

type followedCancel struct {
	reason string
	seq    uint64
}

func newCancelMemory(limit int) *cancelMemory {
	return &cancelMemory{limit: limit, byJob: map[string]followedCancel{}}
}

// follow records that cancellations are followed from stream sequence from
// (0: no more).
func (m *cancelMemory) follow(from uint64) { m.from, m.live = from, false }

// caughtUp records whether the follower's read is live: caught up with the
// stream and reading on.
func (m *cancelMemory) caughtUp(live bool) { m.live = live }

// remember keeps the cancellation of the job key stored at seq, forgetting
// the oldest one kept beyond the limit.
func (m *cancelMemory) remember(key, reason string, seq uint64) {
	if _, ok := m.byJob[key]; !ok {
		m.order = append(m.order, key)
	}
	m.byJob[key] = followedCancel{reason: reason, seq: seq}
	for len(m.order) > m.limit {
		old := m.order[0]
		m.order = m.order[1:]
		m.forgot = max(m.forgot, m.byJob[old].seq)
		delete(m.byJob, old)
	}
}

// lookup says whether the job key, requested at stream sequence req, was
// cancelled after its request (its newest cancellation kept is) and why,
// when it knows for sure (known). It does when req is at or past both the
// follower's start (less one) and what was forgotten: then each
// cancellation stored after req was followed already, and is kept here,
// or will reach the job's handler, which is registered before it asks.
func (m *cancelMemory) lookup(key string, req uint64) (reason string, cancelled, known bool) {
	if !m.live || m.from == 0 || req+1 < m.from || req < m.forgot {
		return "", false, false
	}
	c, ok := m.byJob[key]
	if !ok || c.seq <= req {
		return "", false, true
	}
	return c.reason, true, true
}
