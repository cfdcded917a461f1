package bus

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/loopbus/loopbus/schemas"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
)

// ErrConnectionLost: the connection to NATS was down for longer than
// Config.GiveUpAfter, so the Bus closed it; every later operation fails
// with an error wrapping this one.
var ErrConnectionLost = errors.New("lost the connection to NATS")

// ErrNoAnswer: JetStream did not answer for a stream within the bound a
// command set (Config.AnswerTimeout, else Config.ConnectTimeout for
// provisioning):
// the stream has no leader, its cluster lost a quorum, say. Errors
// wrapping it name the stream and the server connected to.
var ErrNoAnswer = errors.New("no answer from JetStream")

// ErrPermissionDenied: the NATS server refused an operation because the
// user lacks a publish or subscribe permission. Errors wrapping it name the
// refused subject.
var ErrPermissionDenied = errors.New("permission denied by the NATS server")

// Bus is a connection to NATS with loopbus's stream, dead-letter stream,
// view bucket and artifact store provisioned. It is safe for concurrent use.
type Bus struct {
	cfg Config
	nc  *nats.Conn
	js  jetstream.JetStream
	// eventsJS publishes Async's events (with an ack timeout of its own).
	eventsJS jetstream.JetStream
	cat      *schemas.Catalogue
	log      zerolog.Logger
	source   string
	// signer signs published events; nil publishes them unsigned.
	signer *signer
	// trust checks the signatures of events read; nil checks none.
	trust *Trust
	// newToken makes the random parts of artifact keys and chunk ids.
	newToken func() string

	stream    jetstream.Stream
	views     jetstream.KeyValue
	workers   jetstream.KeyValue // worker presence (workers.go)
	artifacts jetstream.Stream   // write-once artifact stream (store.go)
	legacy    *legacyArtifacts   // object store of earlier releases, read only
	// replicated: the event stream had more than one replica when
	// provisioned (see chainsTogether).
	replicated bool

	// Shared with every Bus derived by WithSource.
	deadLettered *atomic.Int64
	conn         *connState
}

// connState follows the connection's life: it closes the connection once
// it has been down for giveUpAfter, and closed is closed when the
// connection is closed for good (by Close or by giving up).
type connState struct {
	giveUpAfter time.Duration
	url         string // redacted
	log         zerolog.Logger

	lost      atomic.Bool
	closed    chan struct{}
	closeOnce sync.Once

	mu    sync.Mutex
	timer *time.Timer
	gen   uint64 // bumped on reconnect, so a timer that fired late does nothing
	// denied collects the permission violations the server reports while
	// onDenied is set (during provisioning), which onDenied is told of.
	denied   []string
	onDenied func()
	// refused: when the server last refused a publish to a subject, so a
	// publish waiting for an ack that will never come can fail instead.
	refused map[string]time.Time
	// leaderRefused holds the streams whose leader this user may not ask
	// for a message (see confirmMiss): misses there are not asked again.
	leaderRefused sync.Map
	// laggards: the servers on which a read's consumer was found to lag
	// the event stream's leader, and when (see Read).
	laggards map[string]time.Time
}

// laggardMemory is how long a server a read found lagging is taken to lag
// still: a read's consumer placed there is replaced at once.
const laggardMemory = time.Minute

// markLaggard records that server lags; it reports whether that was news.
func (c *connState) markLaggard(server string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.laggards == nil || len(c.laggards) > 100 {
		c.laggards = map[string]time.Time{}
	}
	at, ok := c.laggards[server]
	c.laggards[server] = time.Now()
	return !ok || time.Since(at) > laggardMemory
}

// knownLaggard reports whether a read found server lagging within
// laggardMemory.
func (c *connState) knownLaggard(server string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	at, ok := c.laggards[server]
	return ok && time.Since(at) <= laggardMemory
}

// watchDenied starts collecting permission violations; fn is called on
// each. It returns a function that stops collecting and returns them.
func (c *connState) watchDenied(fn func()) (stop func() []string) {
	c.mu.Lock()
	c.denied, c.onDenied = nil, fn
	c.mu.Unlock()
	return func() []string {
		c.mu.Lock()
		defer c.mu.Unlock()
		d := c.denied
		c.denied, c.onDenied = nil, nil
		return d
	}
}

// permissionDenied records a permission violation the server reported.
func (c *connState) permissionDenied(err error) {
	text := deniedText(err)
	c.mu.Lock()
	fn := c.onDenied
	if fn != nil && len(c.denied) < 8 {
		c.denied = append(c.denied, text)
	}
	if subj, ok := refusedPublish(text); ok {
		if c.refused == nil || len(c.refused) > 1000 {
			c.refused = map[string]time.Time{}
		}
		c.refused[subj] = time.Now()
	}
	c.mu.Unlock()
	if fn != nil {
		fn()
	}
}

// refusedSince reports whether the server refused a publish to subject at
// or after t.
func (c *connState) refusedSince(subject string, t time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	at, ok := c.refused[subject]
	return ok && !at.Before(t)
}

// refusedUnderSince reports whether the server refused a publish to a
// subject starting with prefix at or after t.
func (c *connState) refusedUnderSince(prefix string, t time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for subj, at := range c.refused {
		if strings.HasPrefix(subj, prefix) && !at.Before(t) {
			return true
		}
	}
	return false
}

// refusedPublish extracts the subject of `Permissions Violation for
// Publish to "subject"`.
func refusedPublish(text string) (string, bool) {
	rest, ok := strings.CutPrefix(strings.ToLower(text), "permissions violation for publish to ")
	if !ok {
		return "", false
	}
	subj := strings.Trim(text[len(text)-len(rest):], `"' `)
	return subj, subj != ""
}

// deniedText is the server's part of a permission violation, e.g.
// `Permissions Violation for Publish to "$JS.API.STREAM.CREATE.LOOPBUS"`.
func deniedText(err error) string {
	s := err.Error()
	if i := strings.Index(strings.ToLower(s), "permissions violation for"); i >= 0 {
		s = s[i:]
	}
	return strings.TrimRight(strings.TrimSpace(s), "'")
}

func newConnState(cfg Config, log zerolog.Logger) *connState {
	return &connState{giveUpAfter: cfg.GiveUpAfter, url: redactURL(cfg.URL), log: log, closed: make(chan struct{})}
}

// disconnected starts the give-up timer (if GiveUpAfter is set and it is
// not already running).
func (c *connState) disconnected(nc *nats.Conn) {
	if c.giveUpAfter <= 0 || nc.IsClosed() {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.timer != nil {
		return
	}
	gen := c.gen
	c.timer = time.AfterFunc(c.giveUpAfter, func() { c.giveUp(nc, gen) })
}

// reconnected stops the give-up timer.
func (c *connState) reconnected() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gen++
	if c.timer != nil {
		c.timer.Stop()
		c.timer = nil
	}
}

func (c *connState) giveUp(nc *nats.Conn, gen uint64) {
	c.mu.Lock()
	current := gen == c.gen
	if current {
		c.timer = nil
	}
	c.mu.Unlock()
	if !current || nc.IsConnected() || nc.IsClosed() {
		return
	}
	if c.lost.CompareAndSwap(false, true) {
		c.log.Error().Str("url", c.url).Dur("disconnected_for", c.giveUpAfter).Msg("lost the connection to NATS")
	}
	nc.Close()
	c.markClosed()
}

func (c *connState) markClosed() { c.closeOnce.Do(func() { close(c.closed) }) }

// Connect dials NATS, provisions the streams and buckets and returns a Bus.
// source is the CloudEvent source of events this process publishes, e.g.
// "agentworker/host-1234".
//
// Provisioning never destroys anything: a missing stream or bucket is
// created from cfg; an existing one keeps its retention and replicas unless
// cfg.Reconfigure is set, and the event stream's invariants (subjects,
// deny delete and purge, atomic publish, file storage) are restored if
// someone changed them.
//
// With cfg.ConnectTimeout 0, Connect keeps retrying the initial connection
// until ctx ends, so services may start before NATS; otherwise it gives up
// after ConnectTimeout; looking up the streams then gives up after
// AnswerTimeout (else ConnectTimeout) with ErrNoAnswer. Wrong credentials and TLS errors fail at once, and
// so does a user the server does not permit to look up (or create) the
// streams and buckets: that error wraps ErrPermissionDenied and names the
// refused subject. Later permission violations (a refused publish) are
// logged as errors.
func Connect(ctx context.Context, cfg Config, source string, cat *schemas.Catalogue, log zerolog.Logger) (*Bus, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	var sg *signer
	if cfg.SignKeyFile != "" {
		kp, err := LoadSignKey(cfg.SignKeyFile)
		if err != nil {
			return nil, err
		}
		pub, _ := kp.PublicKey()
		sg = &signer{kp: kp, pub: pub}
	}
	var trust *Trust
	if cfg.TrustFile != "" {
		var err error
		if trust, err = LoadTrust(cfg.TrustFile); err != nil {
			return nil, err
		}
	}
	cs := newConnState(cfg, log)
	opts, err := natsOptions(cfg, log, cs)
	if err != nil {
		return nil, err
	}
	nc, err := connect(ctx, cfg, opts, log)
	if err != nil {
		return nil, err
	}
	// The artifact store's chunks go out without a wait too: one never
	// acknowledged is given up with its put, not held until a reconnect.
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncTimeout(cfg.ArtifactAckWait))
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	// Events published without a wait (Async) give up on an ack after
	// asyncAckWait, so that one never acknowledged is not held for ever.
	eventsJS, err := jetstream.New(nc, jetstream.WithPublishAsyncTimeout(asyncAckWait))
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	b := &Bus{cfg: cfg, nc: nc, js: js, eventsJS: eventsJS, cat: cat, log: log, source: source, signer: sg, trust: trust, newToken: randomToken, deadLettered: new(atomic.Int64), conn: cs}
	// A refused API request gets no reply, only an asynchronous error: stop
	// provisioning at the first one rather than waiting for a timeout.
	pctx, cancel := context.WithCancel(ctx)
	stop := cs.watchDenied(cancel)
	// A command's provisioning waits as long as its reads would: through
	// a leader election (about 10 s), not just the connection's bound.
	limit := cfg.ConnectTimeout
	if cfg.AnswerTimeout > 0 {
		limit = cfg.AnswerTimeout
	}
	err = b.provisionRetrying(pctx, limit)
	denied := stop()
	cancel()
	if err != nil {
		err = b.connErr(err)
		if len(denied) > 0 && ctx.Err() == nil {
			err = deniedErr(cfg, err, denied)
		}
		nc.Close()
		return nil, err
	}
	// Worker presence is set up apart: a user that may not create its
	// bucket connects without it (see provisionWorkers).
	wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
	wstop := cs.watchDenied(wcancel)
	err = b.provisionWorkers(wctx)
	wstop()
	wcancel()
	if err == nil {
		err = ctx.Err()
	}
	if err != nil {
		nc.Close()
		return nil, err
	}
	return b, nil
}

// provisionRetrying provisions, retrying what a JetStream cluster that is
// still electing leaders (or a server under load) answers: timeouts, no
// responders and 503. It retries until ctx ends or, if limit > 0, for
// that long; any other error is returned at once.
func (b *Bus) provisionRetrying(ctx context.Context, limit time.Duration) error {
	start := time.Now()
	for attempt := 0; ; attempt++ {
		err := b.provision(ctx)
		if err == nil || ctx.Err() != nil || !transientAPI(err) {
			return err
		}
		if limit > 0 && time.Since(start) > limit {
			return b.noAnswer("the streams and buckets", time.Since(start), err)
		}
		if attempt%10 == 3 {
			b.log.Warn().Err(err).Msg("cannot look up or create the streams yet; retrying")
		}
		sleep(ctx, backoffDelay(attempt))
	}
}

// noAnswer is the error of an operation on what (a stream) that found
// no answer for waited: it wraps ErrNoAnswer and last, and names the
// server this connection is on, where the operator would look first.
func (b *Bus) noAnswer(what string, waited time.Duration, last error) error {
	server := "no server (disconnected)"
	if b.nc.IsConnected() {
		server = fmt.Sprintf("server %s at %s", b.nc.ConnectedServerName(), b.nc.ConnectedUrlRedacted())
		if cluster := b.nc.ConnectedClusterName(); cluster != "" {
			server += " (cluster " + cluster + ")"
		}
	}
	return fmt.Errorf("%w for %s in %s through %s: %w (is a cluster node down or cut off, leaving it without a leader?)",
		ErrNoAnswer, what, waited.Round(time.Second), server, last)
}

// transientAPI reports whether a JetStream API error may pass on a retry.
func transientAPI(err error) bool {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		return apiErr.Code == 503
	}
	return errors.Is(err, context.DeadlineExceeded) || retryable(err) ||
		errors.Is(err, jetstream.ErrJetStreamNotEnabled) || errors.Is(err, nats.ErrNoResponders)
}

// deniedErr explains a provisioning failure caused by missing permissions.
func deniedErr(cfg Config, err error, denied []string) error {
	cause := ""
	if !errors.Is(err, context.Canceled) { // not just our cancellation
		cause = fmt.Sprintf(" (%v)", err)
	}
	return fmt.Errorf("provision: %w: %s%s; every loopbus connection looks up the streams %s and %s, the KV buckets %s and %s and the artifact stream %s, and creates any that is missing: create them first as a user allowed to (see examples/secure), or grant the permission",
		ErrPermissionDenied, strings.Join(denied, "; "), cause, cfg.Stream, cfg.DLQStream, cfg.ViewsBucket, cfg.WorkersBucket, cfg.ArtifactsBucket)
}

// connect makes the initial connection, retrying until ctx ends or
// cfg.ConnectTimeout passes.
func connect(ctx context.Context, cfg Config, opts []nats.Option, log zerolog.Logger) (*nats.Conn, error) {
	url := redactURL(cfg.URL)
	cctx := ctx
	if cfg.ConnectTimeout > 0 {
		var cancel context.CancelFunc
		cctx, cancel = context.WithTimeout(ctx, cfg.ConnectTimeout)
		defer cancel()
	}
	var last error
	for attempt := 0; cctx.Err() == nil; attempt++ {
		nc, err := dial(cctx, cfg.URL, opts)
		if err == nil {
			return nc, nil
		}
		if cctx.Err() != nil {
			break
		}
		if errors.Is(err, nats.ErrAuthorization) || errors.Is(err, nats.ErrAuthExpired) {
			return nil, fmt.Errorf("connect %s: %w (the server refused the credentials: user and password, token, creds file or nkey seed)", url, err)
		}
		if strings.Contains(err.Error(), "tls:") {
			return nil, fmt.Errorf("connect %s: %w", url, err)
		}
		last = err
		if attempt%10 == 0 {
			log.Warn().Err(err).Str("url", url).Msg("NATS not reachable yet; retrying")
		}
		sleep(cctx, backoffDelay(attempt))
	}
	switch {
	case ctx.Err() != nil && last != nil:
		return nil, fmt.Errorf("connect %s: %w (last error: %v)", url, ctx.Err(), last)
	case ctx.Err() != nil:
		return nil, fmt.Errorf("connect %s: %w", url, ctx.Err())
	case last != nil:
		return nil, fmt.Errorf("connect %s: NATS server unreachable, gave up after %s: %w", url, cfg.ConnectTimeout, last)
	default: // the first attempt was still dialling
		return nil, fmt.Errorf("connect %s: NATS server unreachable: no answer within %s", url, cfg.ConnectTimeout)
	}
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// dial is nats.Connect that returns when ctx ends. A connection that
// completes after that is closed.
func dial(ctx context.Context, url string, opts []nats.Option) (*nats.Conn, error) {
	type result struct {
		nc  *nats.Conn
		err error
	}
	ch := make(chan result, 1)
	go func() {
		nc, err := nats.Connect(url, opts...)
		ch <- result{nc, err}
	}()
	select {
	case r := <-ch:
		return r.nc, r.err
	case <-ctx.Done():
		go func() {
			if r := <-ch; r.nc != nil {
				r.nc.Close()
			}
		}()
		return nil, ctx.Err()
	}
}

// backoffDelay is the pause before retry number attempt (from 0) in every
// retry loop of this package: 50ms, doubling up to 1.6s.
func backoffDelay(attempt int) time.Duration {
	return 50 * time.Millisecond << min(max(attempt, 0), 5)
}

func natsOptions(cfg Config, log zerolog.Logger, cs *connState) ([]nats.Option, error) {
	opts := []nats.Option{
		nats.Name(cfg.Name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(500 * time.Millisecond),
		nats.Timeout(5 * time.Second),
		// A server that stops answering without closing the connection
		// (frozen, or cut off by a partition) is left after about 10 s,
		// not nats.go's 4 minutes: a worker's in-progress signals and
		// presence reach another node of the cluster before its jobs are
		// handed out again (ack wait, default 30 s).
		nats.PingInterval(3 * time.Second),
		nats.MaxPingsOutstanding(3),
		nats.DisconnectErrHandler(func(nc *nats.Conn, err error) {
			if err != nil {
				ev := log.Warn().Err(err)
				if cfg.GiveUpAfter > 0 {
					ev = ev.Dur("give_up_after", cfg.GiveUpAfter)
				}
				ev.Msg("disconnected from NATS; reconnecting")
			}
			cs.disconnected(nc)
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			cs.reconnected()
			log.Info().Str("url", redactURL(nc.ConnectedUrl())).Msg("reconnected to NATS")
		}),
		nats.ClosedHandler(func(*nats.Conn) {
			cs.reconnected() // stops the give-up timer
			cs.markClosed()
		}),
		// Without a handler nats.go drops asynchronous errors silently; a
		// refused publish would then look like a slow server.
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			if errors.Is(err, nats.ErrPermissionViolation) {
				cs.permissionDenied(err)
				log.Error().Str("refused", deniedText(err)).Msg("NATS refused an operation: this user lacks the permission")
				return
			}
			ev := log.Warn().Err(err)
			if sub != nil {
				ev = ev.Str("subject", sub.Subject)
			}
			ev.Msg("NATS reported an error")
		}),
	}
	if cfg.InProcess != nil {
		opts = append(opts, nats.InProcessServer(inProcess{cfg.InProcess}))
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
	s, err := b.ensureStream(ctx, jetstream.StreamConfig{
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
	}, func(want, next *jetstream.StreamConfig) {
		// Invariants loopbus relies on, whatever the stream was created with.
		next.Subjects = want.Subjects
		next.Storage = want.Storage
		next.DenyDelete = true
		next.DenyPurge = true
		next.AllowAtomicPublish = true
		if cfg.Reconfigure {
			next.MaxAge, next.MaxBytes, next.Replicas, next.Duplicates = want.MaxAge, want.MaxBytes, want.Replicas, want.Duplicates
		}
	})
	if err != nil {
		return err
	}
	b.stream = s
	b.replicated = s.CachedInfo().Config.Replicas > 1
	if _, err := b.ensureStream(ctx, jetstream.StreamConfig{
		Name:        cfg.DLQStream,
		Description: "loopbus dead letters: events a consumer could not accept, with the reason",
		Subjects:    []string{DLQSubjectPrefix + ".>"},
		Storage:     jetstream.FileStorage,
		Replicas:    cfg.Replicas,
		Duplicates:  cfg.DuplicateWindow,
		MaxAge:      cfg.MaxAge,
	}, func(want, next *jetstream.StreamConfig) {
		if cfg.Reconfigure {
			next.MaxAge, next.Replicas, next.Duplicates = want.MaxAge, want.Replicas, want.Duplicates
		}
	}); err != nil {
		return err
	}

	b.views, err = b.js.KeyValue(ctx, cfg.ViewsBucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		b.views, err = b.js.CreateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket:      cfg.ViewsBucket,
			Description: "loopbus views (projections); rebuildable from the event stream",
			History:     1,
			Storage:     jetstream.FileStorage,
			Replicas:    cfg.Replicas,
		})
		if errors.Is(err, jetstream.ErrBucketExists) { // created concurrently
			b.views, err = b.js.KeyValue(ctx, cfg.ViewsBucket)
		}
	} else if err == nil && cfg.Reconfigure {
		var st jetstream.KeyValueStatus
		if st, err = b.views.Status(ctx); err == nil {
			err = b.reconfigureBucket(ctx, "KV", cfg.ViewsBucket, st)
		}
		if err == nil {
			b.views, err = b.js.KeyValue(ctx, cfg.ViewsBucket)
		}
	}
	if err != nil {
		return fmt.Errorf("provision KV %s: %w", cfg.ViewsBucket, err)
	}
	// Artifacts: a stream whose every subject takes one message (store.go).
	return b.provisionArtifacts(ctx)
}

// ensureStream creates the stream from want if it does not exist. If it
// does, adjust gets want and a copy of the stored config to change, and the
// stream is updated only if adjust changed something.
func (b *Bus) ensureStream(ctx context.Context, want jetstream.StreamConfig, adjust func(want, next *jetstream.StreamConfig)) (jetstream.Stream, error) {
	s, err := b.js.Stream(ctx, want.Name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		s, err = b.js.CreateStream(ctx, want)
		if err == nil {
			b.log.Info().Str("stream", want.Name).Dur("max_age", want.MaxAge).Int64("max_bytes", want.MaxBytes).
				Int("replicas", want.Replicas).Dur("duplicate_window", want.Duplicates).Msg("created stream")
			return s, nil
		}
		if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) { // created concurrently
			s, err = b.js.Stream(ctx, want.Name)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("provision stream %s: %w", want.Name, err)
	}
	cur := s.CachedInfo().Config
	next := cur
	next.Subjects = slices.Clone(cur.Subjects)
	adjust(&want, &next)
	invariants, retention := streamChanges(cur, next)
	if len(invariants)+len(retention) == 0 {
		if kept := retentionChanges(cur, want); len(kept) > 0 {
			b.log.Debug().Str("stream", want.Name).Strs("kept", kept).Msg("existing stream keeps its retention; set Reconfigure to change it")
		}
		return s, nil
	}
	s, err = b.js.UpdateStream(ctx, next)
	if err != nil {
		return nil, fmt.Errorf("update stream %s (%s): %w", want.Name, strings.Join(append(invariants, retention...), ", "), err)
	}
	if len(invariants) > 0 {
		b.log.Warn().Str("stream", want.Name).Strs("restored", invariants).Msg("restored the stream's invariants")
	}
	if len(retention) > 0 {
		b.log.Info().Str("stream", want.Name).Strs("changed", retention).Msg("reconfigured stream")
	}
	return s, nil
}

// streamChanges lists how next differs from cur: invariants (subjects,
// storage, deny delete/purge, atomic publish) and retention settings.
func streamChanges(cur, next jetstream.StreamConfig) (invariants, retention []string) {
	change := func(list *[]string, name string, from, to any) {
		*list = append(*list, fmt.Sprintf("%s %v -> %v", name, from, to))
	}
	if !slices.Equal(cur.Subjects, next.Subjects) {
		change(&invariants, "subjects", cur.Subjects, next.Subjects)
	}
	if cur.Storage != next.Storage {
		change(&invariants, "storage", cur.Storage, next.Storage)
	}
	if cur.DenyDelete != next.DenyDelete {
		change(&invariants, "deny_delete", cur.DenyDelete, next.DenyDelete)
	}
	if cur.DenyPurge != next.DenyPurge {
		change(&invariants, "deny_purge", cur.DenyPurge, next.DenyPurge)
	}
	if cur.AllowAtomicPublish != next.AllowAtomicPublish {
		change(&invariants, "allow_atomic_publish", cur.AllowAtomicPublish, next.AllowAtomicPublish)
	}
	return invariants, retentionChanges(cur, next)
}

// retentionChanges lists the retention and replica settings of next that
// differ from cur (a zero MaxBytes in next means "not set", not a change).
func retentionChanges(cur, next jetstream.StreamConfig) []string {
	var out []string
	if cur.MaxAge != next.MaxAge {
		out = append(out, fmt.Sprintf("max_age %v -> %v", cur.MaxAge, next.MaxAge))
	}
	if cur.MaxBytes != next.MaxBytes && next.MaxBytes != 0 {
		out = append(out, fmt.Sprintf("max_bytes %d -> %d", cur.MaxBytes, next.MaxBytes))
	}
	if cur.Replicas != next.Replicas {
		out = append(out, fmt.Sprintf("replicas %d -> %d", cur.Replicas, next.Replicas))
	}
	if cur.Duplicates != next.Duplicates {
		out = append(out, fmt.Sprintf("duplicate_window %v -> %v", cur.Duplicates, next.Duplicates))
	}
	return out
}

// reconfigureBucket applies cfg.Replicas to an existing bucket by updating
// only the replicas of its backing stream.
func (b *Bus) reconfigureBucket(ctx context.Context, kind, bucket string, st any) error {
	si, ok := st.(interface{ StreamInfo() *jetstream.StreamInfo })
	if !ok {
		return fmt.Errorf("%s %s: no stream info in its status", kind, bucket)
	}
	sc := si.StreamInfo().Config
	if sc.Replicas == b.cfg.Replicas {
		return nil
	}
	from := sc.Replicas
	sc.Replicas = b.cfg.Replicas
	if _, err := b.js.UpdateStream(ctx, sc); err != nil {
		return fmt.Errorf("replicas %d -> %d: %w", from, sc.Replicas, err)
	}
	b.log.Info().Str(strings.ReplaceAll(kind, " ", "_"), bucket).Strs("changed", []string{fmt.Sprintf("replicas %d -> %d", from, sc.Replicas)}).Msg("reconfigured bucket")
	return nil
}

func orUnlimited(n int64) int64 {
	if n == 0 {
		return -1
	}
	return n
}

// WithSource returns a Bus that shares b's connection, streams, stores and
// dead-letter count but publishes with another CloudEvent source, so that
// services running in one process each carry their own
// (loopbus/<service>/<host-pid>). Close only the Bus that Connect returned,
// and only once nothing uses its derived Buses: they have no connection of
// their own.
func (b *Bus) WithSource(source string) *Bus {
	d := *b
	d.source = source
	return &d
}

// Close drains and closes the connection. Call it only on the Bus that
// Connect returned, never on one derived by WithSource (that would close
// the connection every derived Bus shares).
func (b *Bus) Close() {
	if err := b.nc.Drain(); err != nil {
		b.nc.Close()
		return
	}
	// Drain is asynchronous; return once the connection is really gone
	// (an embedded server's owner counts the clients still connected).
	deadline := time.Now().Add(5 * time.Second)
	for !b.nc.IsClosed() && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if !b.nc.IsClosed() {
		b.nc.Close()
	}
}

// closedErr says why the connection can no longer be used, or nil if it
// can: an error wrapping ErrConnectionLost after GiveUpAfter, else
// nats.ErrConnectionClosed once Close ran.
func (b *Bus) closedErr() error {
	if b.conn.lost.Load() {
		return fmt.Errorf("%w (%s, disconnected for more than %s)", ErrConnectionLost, b.conn.url, b.conn.giveUpAfter)
	}
	if b.nc.IsClosed() {
		return nats.ErrConnectionClosed
	}
	return nil
}

// connErr makes err wrap ErrConnectionLost too when the connection was
// given up, so callers can tell a dead bus from a failed operation.
func (b *Bus) connErr(err error) error {
	if err == nil || errors.Is(err, ErrConnectionLost) {
		return err
	}
	cerr := b.closedErr()
	if cerr == nil || errors.Is(err, cerr) {
		return err
	}
	return fmt.Errorf("%w: %w", cerr, err)
}

// untilClosed returns a context that also ends when the connection is
// closed for good, so loops waiting on NATS return instead of hanging.
func (b *Bus) untilClosed(ctx context.Context) (context.Context, context.CancelFunc) {
	cctx, cancel := context.WithCancel(ctx)
	go func() {
		select {
		case <-b.conn.closed:
			cancel()
		case <-cctx.Done():
		}
	}()
	return cctx, cancel
}

// ServerURL is the URL of the server connected to, without credentials.
func (b *Bus) ServerURL() string { return redactURL(b.nc.ConnectedUrl()) }

// Conn exposes the NATS connection (for raw access in tests and benchmarks).
func (b *Bus) Conn() *nats.Conn { return b.nc }

// JetStream exposes the JetStream context.
func (b *Bus) JetStream() jetstream.JetStream { return b.js }

// StreamName is the event stream's name.
func (b *Bus) StreamName() string { return b.cfg.Stream }

// Source is the CloudEvent source of this Bus's events.
func (b *Bus) Source() string { return b.source }

// Catalogue is the event catalogue used to validate events.
func (b *Bus) Catalogue() *schemas.Catalogue { return b.cat }

// DeadLettered counts events copied to the dead-letter stream through this
// Bus or any Bus sharing its connection (see WithSource).
func (b *Bus) DeadLettered() int64 { return b.deadLettered.Load() }

// LastSeq returns the sequence of the newest event in the stream.
func (b *Bus) LastSeq(ctx context.Context) (uint64, error) {
	info, err := b.stream.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("stream info: %w", b.connErr(err))
	}
	return info.State.LastSeq, nil
}

// SessionLastSeq returns the sequence of the newest event of a session, or
// 0 if it has none.
func (b *Bus) SessionLastSeq(ctx context.Context, session string) (uint64, error) {
	return b.SubjectLastSeq(ctx, schemas.SessionSubjects(session))
}

// SubjectLastSeq returns the stream sequence of the newest event on
// subject (which may contain wildcards), or 0 if there is none. It is one
// request to the server: a cheap way to learn whether anything was
// published on a subject since a sequence before reading it. The stream's
// leader answers it, never a replica (whatever the stream's allow_direct):
// what it says exists, exists, and reads are checked against it. While the
// stream has no leader it retries, then fails with ErrNoLeader; with
// Config.AnswerTimeout set (a command), it retries for that long, as
// reads do, then fails with an error wrapping ErrNoAnswer: a command run
// just as a cluster elects a leader waits for it.
func (b *Bus) SubjectLastSeq(ctx context.Context, subject string) (uint64, error) {
	last, err := b.leaderLastSeqWaiting(ctx, []string{subject}, false)
	if err != nil {
		return 0, b.connErr(err)
	}
	return last, nil
}

// GetEvent reads and decodes the event stored at seq. An event a replica
// does not hold (a stream with allow_direct) is asked of the leader.
func (b *Bus) GetEvent(ctx context.Context, seq uint64) (schemas.Event, error) {
	m, err := b.msgAt(ctx, b.stream, seq)
	if err != nil {
		return schemas.Event{}, fmt.Errorf("event %d: %w", seq, b.connErr(err))
	}
	ev, err := b.decode(m.Subject, m.Header, m.Data, true)
	if err != nil {
		return schemas.Event{}, err
	}
	ev.Seq = m.Sequence
	ev.Stored = m.Time.UTC()
	return ev, nil
}
