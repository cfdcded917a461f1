package bus

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/loopbus/loopbus/schemas"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
)

// Bus is a connection to NATS with loopbus's stream, dead-letter stream,
// view bucket and artifact store provisioned. It is safe for concurrent use.
type Bus struct {
	cfg    Config
	nc     *nats.Conn
	js     jetstream.JetStream
	cat    *schemas.Catalogue
	log    zerolog.Logger
	source string

	stream    jetstream.Stream
	views     jetstream.KeyValue
	artifacts jetstream.ObjectStore

	deadLettered atomic.Int64
}

// Connect dials NATS, provisions the streams and buckets (idempotently: an
// existing stream keeps its data, its config is updated to match cfg) and
// returns a Bus. source is the CloudEvent source of events this process
// publishes, e.g. "agentworker/host-1234". Connect keeps retrying the
// initial connection until ctx ends, so services may start before NATS.
func Connect(ctx context.Context, cfg Config, source string, cat *schemas.Catalogue, log zerolog.Logger) (*Bus, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	opts, err := natsOptions(cfg, log)
	if err != nil {
		return nil, err
	}
	var nc *nats.Conn
	for {
		nc, err = nats.Connect(cfg.URL, opts...)
		if err == nil {
			break
		}
		if errors.Is(err, nats.ErrAuthorization) || errors.Is(err, nats.ErrAuthExpired) || strings.Contains(err.Error(), "tls:") {
			return nil, fmt.Errorf("connect %s: %w", redactURL(cfg.URL), err)
		}
		log.Warn().Err(err).Str("url", redactURL(cfg.URL)).Msg("NATS not reachable yet; retrying")
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("connect %s: %w (last error: %v)", redactURL(cfg.URL), ctx.Err(), err)
		case <-time.After(time.Second):
		}
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	b := &Bus{cfg: cfg, nc: nc, js: js, cat: cat, log: log, source: source}
	if err := b.provision(ctx); err != nil {
		nc.Close()
		return nil, err
	}
	return b, nil
}

func natsOptions(cfg Config, log zerolog.Logger) ([]nats.Option, error) {
	opts := []nats.Option{
		nats.Name(cfg.Name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(500 * time.Millisecond),
		nats.Timeout(5 * time.Second),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				log.Warn().Err(err).Msg("disconnected from NATS; reconnecting")
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			log.Info().Str("url", redactURL(nc.ConnectedUrl())).Msg("reconnected to NATS")
		}),
	}
	if cfg.User != "" {
		opts = append(opts, nats.UserInfo(cfg.User, cfg.Password))
	}
	if cfg.Token != "" {
		opts = append(opts, nats.Token(cfg.Token))
	}
	if cfg.CredsFile != "" {
		opts = append(opts, nats.UserCredentials(cfg.CredsFile))
	}
	if cfg.NKeyFile != "" {
		o, err := nats.NkeyOptionFromSeed(cfg.NKeyFile)
		if err != nil {
			return nil, fmt.Errorf("%w: nkey seed %s: %v", ErrConfig, cfg.NKeyFile, err)
		}
		opts = append(opts, o)
	}
	if cfg.TLSCA != "" {
		opts = append(opts, nats.RootCAs(cfg.TLSCA))
	}
	if cfg.TLSCert != "" {
		opts = append(opts, nats.ClientCert(cfg.TLSCert, cfg.TLSKey))
	}
	return opts, nil
}

// redactURL hides credentials embedded in a URL (user:pass@ or token@).
func redactURL(u string) string {
	parts := strings.Split(u, ",")
	for i, p := range parts {
		if at := strings.LastIndex(p, "@"); at >= 0 {
			start := len(p) - len(strings.TrimLeft(p, " "))
			if s := strings.Index(p, "://"); s >= 0 && s < at {
				start = s + 3
			}
			parts[i] = p[:start] + "REDACTED@" + p[at+1:]
		}
	}
	return strings.Join(parts, ",")
}

func (b *Bus) provision(ctx context.Context) error {
	cfg := b.cfg
	sc := jetstream.StreamConfig{
		Name:               cfg.Stream,
		Description:        "loopbus events: the append-only source of truth",
		Subjects:           []string{schemas.SubjectPrefix + ".>"},
		Storage:            jetstream.FileStorage,
		Retention:          jetstream.LimitsPolicy,
		Replicas:           cfg.Replicas,
		MaxAge:             cfg.MaxAge,
		MaxBytes:           orUnlimited(cfg.MaxBytes),
		Duplicates:         cfg.DuplicateWindow,
		DenyDelete:         true,
		DenyPurge:          true,
		AllowAtomicPublish: true,
		Discard:            jetstream.DiscardOld,
	}
	s, err := b.js.CreateOrUpdateStream(ctx, sc)
	if err != nil {
		return fmt.Errorf("provision stream %s: %w", cfg.Stream, err)
	}
	b.stream = s
	if _, err := b.js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:        cfg.DLQStream,
		Description: "loopbus dead letters: events a consumer could not accept, with the reason",
		Subjects:    []string{DLQSubjectPrefix + ".>"},
		Storage:     jetstream.FileStorage,
		Replicas:    cfg.Replicas,
		Duplicates:  cfg.DuplicateWindow,
		MaxAge:      cfg.MaxAge,
	}); err != nil {
		return fmt.Errorf("provision stream %s: %w", cfg.DLQStream, err)
	}
	b.views, err = b.js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      cfg.ViewsBucket,
		Description: "loopbus views (projections); rebuildable from the event stream",
		History:     1,
		Storage:     jetstream.FileStorage,
		Replicas:    cfg.Replicas,
	})
	if err != nil {
		return fmt.Errorf("provision KV %s: %w", cfg.ViewsBucket, err)
	}
	b.artifacts, err = b.js.CreateOrUpdateObjectStore(ctx, jetstream.ObjectStoreConfig{
		Bucket:      cfg.ArtifactsBucket,
		Description: "loopbus artifacts: session inputs and step outputs",
		Storage:     jetstream.FileStorage,
		Replicas:    cfg.Replicas,
	})
	if err != nil {
		return fmt.Errorf("provision object store %s: %w", cfg.ArtifactsBucket, err)
	}
	return nil
}

func orUnlimited(n int64) int64 {
	if n == 0 {
		return -1
	}
	return n
}

// Close drains and closes the connection.
func (b *Bus) Close() {
	if err := b.nc.Drain(); err != nil {
		b.nc.Close()
	}
}

// Conn exposes the NATS connection (for raw access in tests and benchmarks).
func (b *Bus) Conn() *nats.Conn { return b.nc }

// JetStream exposes the JetStream context.
func (b *Bus) JetStream() jetstream.JetStream { return b.js }

// StreamName is the event stream's name.
func (b *Bus) StreamName() string { return b.cfg.Stream }

// Source is the CloudEvent source of this process's events.
func (b *Bus) Source() string { return b.source }

// Catalogue is the event catalogue used to validate events.
func (b *Bus) Catalogue() *schemas.Catalogue { return b.cat }

// DeadLettered counts events this Bus copied to the dead-letter stream.
func (b *Bus) DeadLettered() int64 { return b.deadLettered.Load() }

// LastSeq returns the sequence of the newest event in the stream.
func (b *Bus) LastSeq(ctx context.Context) (uint64, error) {
	info, err := b.stream.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("stream info: %w", err)
	}
	return info.State.LastSeq, nil
}

// SessionLastSeq returns the sequence of the newest event of a session, or
// 0 if it has none.
func (b *Bus) SessionLastSeq(ctx context.Context, session string) (uint64, error) {
	m, err := b.stream.GetLastMsgForSubject(ctx, schemas.SessionSubjects(session))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("last event of %s: %w", session, err)
	}
	return m.Sequence, nil
}

// GetEvent reads and decodes the event stored at seq.
func (b *Bus) GetEvent(ctx context.Context, seq uint64) (schemas.Event, error) {
	m, err := b.stream.GetMsg(ctx, seq)
	if err != nil {
		return schemas.Event{}, fmt.Errorf("event %d: %w", seq, err)
	}
	ev, err := b.decode(m.Subject, m.Data)
	if err != nil {
		return schemas.Event{}, err
	}
	ev.Seq = m.Sequence
	return ev, nil
}
