package metrics

import (
	"crypto/sha256"
	"encoding/hex"
	"time"

	"github.com/loopbus/loopbus/schemas"
	"github.com/prometheus/client_golang/prometheus"
)

// Job outcomes (label outcome of the job metrics).
const (
	OutcomeCompleted = "completed"
	OutcomeFailed    = "failed"
	OutcomeCancelled = "cancelled"
)

// Histogram buckets, in seconds.
var (
	// jobBuckets: agent runs take from seconds to hours.
	jobBuckets = []float64{1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 14400}
	// stepBuckets: a step spans its iterations, waits and retries.
	stepBuckets = []float64{1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 14400, 43200, 86400}
	// validationBuckets: schema checks take milliseconds, commands longer.
	validationBuckets = []float64{0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300}
)

// streamCounts are the metrics fed from the event stream, with the state
// needed to measure step and validation durations. Only the goroutine
// reading the stream calls count and skipped; the Prometheus metrics
// themselves are safe to gather concurrently.
type streamCounts struct {
	cat      *schemas.Catalogue
	backends *labelSet
	// jobs: session/job → what is known of a job until its verdict or
	// failure; steps: session/step → when its first job was requested.
	jobs  *bounded[*jobState]
	steps *bounded[time.Time]
	// live: sessions started and not ended; started: session/job of
	// jobs started and not ended (both bounded by Config.MaxTracked).
	live    *bounded[struct{}]
	started *bounded[struct{}]

	events          *prometheus.CounterVec
	malformed       prometheus.Counter
	sequence        prometheus.Gauge
	jobsTotal       *prometheus.CounterVec
	jobDuration     *prometheus.HistogramVec
	stepDuration    *prometheus.HistogramVec
	validation      *prometheus.HistogramVec
	tokens          *prometheus.CounterVec
	cost            *prometheus.CounterVec
	rateLimitedJobs *prometheus.CounterVec
	rateLimitWaits  prometheus.Counter
	breakerOpens    prometheus.Counter
	sessionsRunning prometheus.Gauge
	jobsRunning     prometheus.Gauge
	all             []prometheus.Collector
}

// jobState is what a job's later events need from its earlier ones.
type jobState struct {
	backend string
	// completed is when its job.completed was stored; zero before.
	completed time.Time
}

func newStreamCounts(cat *schemas.Catalogue, cfg Config) *streamCounts {
	c := &streamCounts{
		cat:      cat,
		backends: newLabelSet(cfg.MaxLabelValues, append([]string{Unknown}, knownBackends()...)...),
		jobs:     newBounded[*jobState](cfg.MaxTracked),
		steps:    newBounded[time.Time](cfg.MaxTracked),
		live:     newBounded[struct{}](cfg.MaxTracked),
		started:  newBounded[struct{}](cfg.MaxTracked),
		sessionsRunning: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "loopbus_sessions_running",
			Help: "Sessions started (or forked, or rerun) and not ended (completed, failed, closed): running, paused, stopped or waiting.",
		}),
		jobsRunning: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "loopbus_jobs_running",
			Help: "Jobs started (job.started) and not ended (job.completed, job.failed, job.cancelled): agents at work.",
		}),
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "loopbus_events_total",
			Help: "Events read from the stream, by CloudEvent type.",
		}, []string{"type"}),
		malformed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "loopbus_malformed_events_total",
			Help: "Messages of the event stream skipped as malformed (the services dead-letter them).",
		}),
		sequence: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "loopbus_metrics_sequence",
			Help: "Stream sequence of the last message these metrics have read.",
		}),
		jobsTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "loopbus_jobs_total",
			Help: "Finished agent runs (job.completed, job.failed), by backend and outcome (completed, failed, cancelled).",
		}, []string{"backend", "outcome"}),
		jobDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "loopbus_job_duration_seconds",
			Help:    "Duration of agent runs as their worker reported it (durationMs), by backend and outcome.",
			Buckets: jobBuckets,
		}, []string{"backend", "outcome"}),
		stepDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "loopbus_step_duration_seconds",
			Help:    "Time from a step's first job.requested to its step.completed or step.failed (stream timestamps), by outcome.",
			Buckets: stepBuckets,
		}, []string{"outcome"}),
		validation: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "loopbus_validation_duration_seconds",
			Help:    "Time from a job.completed to its verdict (stream timestamps), by result (passed, failed).",
			Buckets: validationBuckets,
		}, []string{"result"}),
		tokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "loopbus_tokens_total",
			Help: "Tokens agents reported, by backend and kind (input, including cached; cached; output).",
		}, []string{"backend", "kind"}),
		cost: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "loopbus_cost_usd_total",
			Help: "Cost agents reported, in US dollars, by backend.",
		}, []string{"backend"}),
		rateLimitedJobs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "loopbus_rate_limited_jobs_total",
			Help: "Agent runs that failed on a usage or rate limit (job.failed with rateLimited), by backend.",
		}, []string{"backend"}),
		rateLimitWaits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "loopbus_rate_limit_waits_total",
			Help: "Waits for a rate or usage limit to lift before a step's next attempt (step.waiting).",
		}),
		breakerOpens: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "loopbus_breaker_opens_total",
			Help: "Circuit breaker openings (step.paused of kind breaker).",
		}),
	}
	c.all = []prometheus.Collector{c.events, c.malformed, c.sequence, c.jobsTotal, c.jobDuration, c.stepDuration,
		c.validation, c.tokens, c.cost, c.rateLimitedJobs, c.rateLimitWaits, c.breakerOpens,
		c.sessionsRunning, c.jobsRunning}
	// Every series of a known label value shows from the start, at 0, so
	// that rates and alerts have a series before the first event.
	for _, t := range cat.Types() {
		c.events.WithLabelValues(t)
	}
	for _, b := range knownBackends() {
		for _, o := range []string{OutcomeCompleted, OutcomeFailed, OutcomeCancelled} {
			c.jobsTotal.WithLabelValues(b, o)
			c.jobDuration.WithLabelValues(b, o)
		}
		for _, kind := range []string{"input", "cached", "output"} {
			c.tokens.WithLabelValues(b, kind)
		}
		c.cost.WithLabelValues(b)
		c.rateLimitedJobs.WithLabelValues(b)
	}
	for _, o := range []string{OutcomeCompleted, OutcomeFailed} {
		c.stepDuration.WithLabelValues(o)
	}
	for _, r := range []string{"passed", "failed"} {
		c.validation.WithLabelValues(r)
	}
	return c
}

// knownBackends are the agent backends loopbus has: their series exist
// from the start.
func knownBackends() []string {
	return []string{schemas.BackendExec, schemas.BackendClaude, schemas.BackendCodex, schemas.BackendOpenAI, schemas.BackendAnthropic}
}

// Describe implements prometheus.Collector.
func (c *streamCounts) Describe(ch chan<- *prometheus.Desc) {
	for _, m := range c.all {
		m.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (c *streamCounts) Collect(ch chan<- prometheus.Metric) {
	for _, m := range c.all {
		m.Collect(ch)
	}
}

// skipped counts a malformed message at stream sequence seq.
func (c *streamCounts) skipped(seq uint64) {
	c.malformed.Inc()
	c.sequence.Set(float64(seq))
}

// count counts one event.
func (c *streamCounts) count(ev schemas.Event) {
	typ := ev.Type
	if !c.cat.Known(typ) {
		typ = Other
	}
	c.events.WithLabelValues(typ).Inc()
	c.sequence.Set(float64(ev.Seq))
	if ev.ForkOf != "" {
		// A copy in a fork's history: its job, step and session were
		// counted as the original's.
		return
	}
	switch ev.Type {
	case schemas.TypeSessionStarted, schemas.TypeSessionForked, schemas.TypeSessionRerun:
		c.live.put(ev.Session, struct{}{})
	case schemas.TypeSessionCompleted, schemas.TypeSessionFailed, schemas.TypeSessionClosed:
		c.live.remove(ev.Session)
	}
	defer func() {
		c.sessionsRunning.Set(float64(c.live.len()))
		c.jobsRunning.Set(float64(c.started.len()))
	}()
	switch d := ev.Data.(type) {
	case *schemas.JobStarted:
		c.started.put(key(ev.Session, d.JobID), struct{}{})
	case *schemas.JobCancelled:
		c.started.remove(key(ev.Session, d.JobID))
	case *schemas.JobRequested:
		c.jobs.put(key(ev.Session, d.JobID), &jobState{backend: c.backends.label(d.Agent.Backend)})
		if _, ok := c.steps.get(key(ev.Session, d.Step)); !ok {
			c.steps.put(key(ev.Session, d.Step), ev.Stored)
		}
	case *schemas.JobCompleted:
		c.started.remove(key(ev.Session, d.JobID))
		j := c.job(ev.Session, d.JobID)
		j.completed = ev.Stored
		c.jobEnded(j.backend, OutcomeCompleted, d.DurationMs, d.Usage)
	case *schemas.JobFailed:
		c.started.remove(key(ev.Session, d.JobID))
		j := c.job(ev.Session, d.JobID)
		c.jobs.remove(key(ev.Session, d.JobID))
		outcome := OutcomeFailed
		if d.Cancelled {
			outcome = OutcomeCancelled
		}
		c.jobEnded(j.backend, outcome, d.DurationMs, d.Usage)
		if d.RateLimited {
			c.rateLimitedJobs.WithLabelValues(j.backend).Inc()
		}
	case *schemas.Verdict:
		result := "passed"
		if ev.Type == schemas.TypeValidationFailed {
			result = "failed"
		}
		if j, ok := c.jobs.get(key(ev.Session, d.JobID)); ok && !j.completed.IsZero() {
			c.validation.WithLabelValues(result).Observe(seconds(ev.Stored.Sub(j.completed)))
		}
		c.jobs.remove(key(ev.Session, d.JobID))
	case *schemas.StepCompleted:
		c.stepEnded(ev, d.Step, OutcomeCompleted)
	case *schemas.StepFailed:
		c.stepEnded(ev, d.Step, OutcomeFailed)
	case *schemas.StepInvalidated:
		// The step runs again from its first iteration: a new start.
		c.steps.remove(key(ev.Session, d.Step))
	case *schemas.StepWaiting:
		c.rateLimitWaits.Inc()
	case *schemas.StepPaused:
		if d.Kind == schemas.PauseBreaker {
			c.breakerOpens.Inc()
		}
	}
}

// job returns the state of a job, tracking it (backend unknown) if its
// request was not seen.
func (c *streamCounts) job(session, id string) *jobState {
	if j, ok := c.jobs.get(key(session, id)); ok {
		return j
	}
	j := &jobState{backend: Unknown}
	c.jobs.put(key(session, id), j)
	return j
}

// jobEnded counts a finished agent run.
func (c *streamCounts) jobEnded(backend, outcome string, durationMs int64, u *schemas.Usage) {
	c.jobsTotal.WithLabelValues(backend, outcome).Inc()
	c.jobDuration.WithLabelValues(backend, outcome).Observe(float64(max(durationMs, 0)) / 1000)
	if u == nil {
		return
	}
	for kind, n := range map[string]int64{"input": u.InputTokens, "cached": u.CachedTokens, "output": u.OutputTokens} {
		if n > 0 {
			c.tokens.WithLabelValues(backend, kind).Add(float64(n))
		}
	}
	if u.CostUSD > 0 {
		c.cost.WithLabelValues(backend).Add(u.CostUSD)
	}
}

// stepEnded observes the duration of a step that completed or failed.
func (c *streamCounts) stepEnded(ev schemas.Event, step, outcome string) {
	k := key(ev.Session, step)
	if start, ok := c.steps.get(k); ok {
		c.stepDuration.WithLabelValues(outcome).Observe(seconds(ev.Stored.Sub(start)))
		c.steps.remove(k)
	}
}

// key joins a session and a job or step; a session id has no "/".
func key(session, name string) string {
	k := session + "/" + name
	if len(k) > maxKeyLen {
		// Ids come from events: a long one is remembered by its hash, so
		// MaxTracked keys stay small whatever the stream holds.
		sum := sha256.Sum256([]byte(k))
		return hex.EncodeToString(sum[:])
	}
	return k
}

// maxKeyLen bounds a remembered job or step key (a session id is at most
// 64 characters, a step name 64, a job id about as long).
const maxKeyLen = 256

// seconds of d, never negative (clocks of a cluster's servers may differ).
func seconds(d time.Duration) float64 { return max(d, 0).Seconds() }
