package metrics

import "github.com/prometheus/client_golang/prometheus"

// StalledDecisions counts, as loopbus_orchestrator_stalled_decisions_total,
// the decisions the orchestrator's watchdog made for sessions left owed
// one (see orchestrator.Config.OnStall): each was lost (a commit refused
// for a reason that was not, or dropped), and its session would have
// waited for ever. It is not fed from the stream: register it with
// Config.Collectors in the process that runs the orchestrator, and pass
// Observe as the orchestrator's OnStall.
type StalledDecisions struct {
	c prometheus.Counter
}

// NewStalledDecisions returns a counter at zero.
func NewStalledDecisions() *StalledDecisions {
	return &StalledDecisions{c: prometheus.NewCounter(prometheus.CounterOpts{
		Name: "loopbus_orchestrator_stalled_decisions_total",
		Help: "Decisions the orchestrator's watchdog made for sessions left owed one past its stall bound (lost decisions; its error log names the sessions).",
	})}
}

// Observe counts one decision the watchdog made for session.
func (s *StalledDecisions) Observe(session string) { s.c.Inc() }

// Describe implements prometheus.Collector.
func (s *StalledDecisions) Describe(ch chan<- *prometheus.Desc) { s.c.Describe(ch) }

// Collect implements prometheus.Collector.
func (s *StalledDecisions) Collect(ch chan<- prometheus.Metric) { s.c.Collect(ch) }
