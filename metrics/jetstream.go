package metrics

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// jetStreamCollector asks JetStream, at each scrape, for the counts of the
// event stream's durable consumers and of the dead-letter stream. It
// creates nothing on the server: one stream info request per stream and,
// per consumer, one info request (or one listing of them all).
type jetStreamCollector struct {
	js        jetstream.JetStream
	stream    string
	dlq       string
	consumers []string
	timeout   time.Duration
	log       zerolog.Logger
	// failing is set while the last scrape could not get every count, so
	// that a failure is logged once, not at every scrape.
	failing atomic.Bool

	pending, ackPending, redelivered, deadLetters, up *prometheus.Desc
}

func newJetStreamCollector(js jetstream.JetStream, stream string, cfg Config, log zerolog.Logger) *jetStreamCollector {
	consumer := []string{"consumer"}
	return &jetStreamCollector{
		js: js, stream: stream, dlq: cfg.DLQStream, consumers: cfg.Consumers, timeout: cfg.ScrapeTimeout, log: log,
		pending: prometheus.NewDesc("loopbus_consumer_pending_messages",
			"Events of the stream a durable consumer has not delivered yet, by consumer.", consumer, nil),
		ackPending: prometheus.NewDesc("loopbus_consumer_ack_pending_messages",
			"Events a durable consumer delivered that are not acknowledged yet, by consumer.", consumer, nil),
		redelivered: prometheus.NewDesc("loopbus_consumer_redelivered_messages",
			"Events a durable consumer delivered more than once and that are not acknowledged yet, by consumer.", consumer, nil),
		deadLetters: prometheus.NewDesc("loopbus_dead_letters_total",
			"Dead letters ever written to the dead-letter stream (its last sequence): one per malformed or refused event.", nil, nil),
		up: prometheus.NewDesc("loopbus_jetstream_up",
			"1 if this scrape got the consumer and dead-letter counts from JetStream in time, else 0 (those counts are then missing).", nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *jetStreamCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.pending, c.ackPending, c.redelivered, c.deadLetters, c.up} {
		ch <- d
	}
}

// Collect implements prometheus.Collector: it asks JetStream, within the
// scrape timeout.
func (c *jetStreamCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	var errs []error
	infos, err := c.consumerInfos(ctx)
	if err != nil {
		errs = append(errs, fmt.Errorf("consumers of %s: %w", c.stream, err))
	} else {
		for _, ci := range capConsumers(infos, MaxConsumers) {
			ch <- prometheus.MustNewConstMetric(c.pending, prometheus.GaugeValue, float64(ci.pending), ci.name)
			ch <- prometheus.MustNewConstMetric(c.ackPending, prometheus.GaugeValue, float64(ci.ackPending), ci.name)
			ch <- prometheus.MustNewConstMetric(c.redelivered, prometheus.GaugeValue, float64(ci.redelivered), ci.name)
		}
	}
	if s, err := c.js.Stream(ctx, c.dlq); err != nil {
		errs = append(errs, fmt.Errorf("stream %s: %w", c.dlq, err))
	} else {
		ch <- prometheus.MustNewConstMetric(c.deadLetters, prometheus.CounterValue, float64(s.CachedInfo().State.LastSeq))
	}
	up := 1.0
	if err := errors.Join(errs...); err != nil {
		up = 0
		if !c.failing.Swap(true) {
			c.log.Warn().Err(err).Msg("metrics: cannot get JetStream counts; they are missing from " + Path + " until they can")
		}
	} else if c.failing.Swap(false) {
		c.log.Info().Msg("metrics: JetStream counts are back")
	}
	ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, up)
}

// consumerCounts are one durable consumer's counts.
type consumerCounts struct {
	name                             string
	pending, ackPending, redelivered uint64
}

// consumerInfos returns the counts of the configured consumers (those not
// created yet are left out), or of every durable consumer of the stream.
func (c *jetStreamCollector) consumerInfos(ctx context.Context) ([]consumerCounts, error) {
	var out []consumerCounts
	add := func(ci *jetstream.ConsumerInfo) {
		out = append(out, consumerCounts{name: ci.Name, pending: ci.NumPending,
			ackPending: uint64(max(ci.NumAckPending, 0)), redelivered: uint64(max(ci.NumRedelivered, 0))})
	}
	if len(c.consumers) > 0 {
		for _, name := range c.consumers {
			cons, err := c.js.Consumer(ctx, c.stream, name)
			if errors.Is(err, jetstream.ErrConsumerNotFound) {
				continue
			}
			if err != nil {
				return nil, err
			}
			add(cons.CachedInfo())
		}
		return out, nil
	}
	s, err := c.js.Stream(ctx, c.stream)
	if err != nil {
		return nil, err
	}
	lister := s.ListConsumers(ctx)
	for ci := range lister.Info() {
		// Readers' ordered consumers are ephemeral: not a service's.
		if ci.Config.Durable != "" {
			add(ci)
		}
	}
	if err := lister.Err(); err != nil {
		return nil, err
	}
	return out, nil
}

// capConsumers returns the counts of the first max consumers by name, and
// the sum of the others' as consumer "other".
func capConsumers(cs []consumerCounts, max int) []consumerCounts {
	sort.Slice(cs, func(i, j int) bool { return cs[i].name < cs[j].name })
	if len(cs) <= max {
		return cs
	}
	other := consumerCounts{name: Other}
	for _, ci := range cs[max:] {
		other.pending += ci.pending
		other.ackPending += ci.ackPending
		other.redelivered += ci.redelivered
	}
	return append(cs[:max:max], other)
}
