package metrics

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Orchestrator holds the metrics of an orchestrator that are not in the
// stream; register it with Config.Collectors in the process that runs the
// orchestrator:
//   - loopbus_orchestrator_stalled_decisions_total counts the decisions the
//     orchestrator's watchdog made for sessions left owed one (see
//     orchestrator.Config.OnStall; pass Observe): each was lost (a commit
//     refused for a reason that was not, or dropped), and its session
//     would have waited for ever.
//   - loopbus_orchestrator_lag_events is, at each scrape, the stream's last
//     sequence minus the last the orchestrator read (see Track): the events
//     it has yet to fold and decide on. It is absent until Track is called
//     and when the stream's head cannot be had within the scrape timeout.
type Orchestrator struct {
	stalls  prometheus.Counter
	lag     *prometheus.Desc
	src     atomic.Pointer[lagSource]
	timeout time.Duration
}

// lagSource is what the lag is computed from.
type lagSource struct {
	read func() uint64
	head func(ctx context.Context) (uint64, error)
}

// NewOrchestrator returns the orchestrator's metrics, at zero.
func NewOrchestrator() *Orchestrator {
	return &Orchestrator{
		stalls: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "loopbus_orchestrator_stalled_decisions_total",
			Help: "Decisions the orchestrator's watchdog made for sessions left owed one past its stall bound (lost decisions; its error log names the sessions).",
		}),
		lag: prometheus.NewDesc("loopbus_orchestrator_lag_events",
			"Events of the stream the orchestrator has not read yet: the stream's last sequence minus the last it read (0 when it is caught up).", nil, nil),
		timeout: DefaultScrapeTimeout,
	}
}

// Observe counts one decision the watchdog made for session.
func (o *Orchestrator) Observe(session string) { o.stalls.Inc() }

// Track makes the lag served: read returns the stream sequence of the
// last message the orchestrator read (orchestrator.Service.ReadSeq), head
// the stream's last sequence (bus.Bus.LastSeq).
func (o *Orchestrator) Track(read func() uint64, head func(ctx context.Context) (uint64, error)) {
	o.src.Store(&lagSource{read: read, head: head})
}

// Describe implements prometheus.Collector.
func (o *Orchestrator) Describe(ch chan<- *prometheus.Desc) {
	o.stalls.Describe(ch)
	ch <- o.lag
}

// Collect implements prometheus.Collector.
func (o *Orchestrator) Collect(ch chan<- prometheus.Metric) {
	o.stalls.Collect(ch)
	src := o.src.Load()
	if src == nil {
		return
	}
	// What was read is taken first: read after the head, an event stored
	// in between would make the lag look negative.
	read := src.read()
	ctx, cancel := context.WithTimeout(context.Background(), o.timeout)
	defer cancel()
	head, err := src.head(ctx)
	if err != nil {
		return // loopbus_jetstream_up says JetStream did not answer
	}
	ch <- prometheus.MustNewConstMetric(o.lag, prometheus.GaugeValue, float64(head-min(read, head)))
}
