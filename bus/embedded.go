package bus

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"
)

// ErrServerRunning: another process already serves this data directory.
var ErrServerRunning = errors.New("a loopbus NATS server already runs on this data directory")

// EmbeddedConfig shapes an in-process nats-server. The zero value (with a
// DataDir) listens on a random loopback port and fsyncs before every ack.
type EmbeddedConfig struct {
	// DataDir holds the JetStream store (DataDir/jetstream) and the lock and
	// URL files that let other commands on the same directory find it.
	DataDir string
	// Listen is host:port; "" means 127.0.0.1 on a random free port.
	Listen string
	// ServerName; "" lets the server use its generated id, except in a
	// cluster, where it is derived from the cluster listen address
	// ("loopbus-127.0.0.1-6222"): JetStream needs a name that is set and
	// stays the same across restarts.
	ServerName string
	// ClusterListen is the host:port this node accepts routes from other
	// nodes on; setting it (or a cluster block in ConfigFile) makes the
	// server a JetStream cluster node. The port must be fixed, since the
	// other nodes name it in their Routes.
	ClusterListen string
	// ClusterName is the cluster's name, the same on every node; ""
	// keeps the ConfigFile's, else DefaultClusterName.
	ClusterName string
	// Routes are the cluster URLs (nats://host:port) of the other nodes.
	// A node ignores a route to itself, so every node may be given the
	// same full list.
	Routes []string
	// RelaxedSync turns off fsync-before-ack and flushes every SyncInterval
	// instead. Off by default: acknowledged writes survive power loss.
	RelaxedSync bool
	// SyncInterval applies with RelaxedSync; 0 means the server default (2m).
	SyncInterval time.Duration
	// MaxPayload in bytes; 0 means 8 MiB.
	MaxPayload int32
	// Auth, optional: clients must present these.
	User, Password, Token string
	// ConfigFile, when set, is a nats-server configuration file whose
	// settings are loaded first (for TLS, accounts, permissions, clusters).
	ConfigFile string
}

// Validate reports the first invalid value.
func (c EmbeddedConfig) Validate() error {
	if c.DataDir == "" {
		return fmt.Errorf("%w: embedded server needs a data directory", ErrConfig)
	}
	if c.Listen != "" {
		if _, _, err := net.SplitHostPort(c.Listen); err != nil {
			return fmt.Errorf("%w: listen address %q: %v", ErrConfig, c.Listen, err)
		}
	}
	if c.ClusterListen != "" {
		if _, err := fixedPort(c.ClusterListen); err != nil {
			return fmt.Errorf("%w: cluster listen address %q: %v", ErrConfig, c.ClusterListen, err)
		}
	} else if (c.ClusterName != "" || len(c.Routes) > 0) && c.ConfigFile == "" {
		return fmt.Errorf("%w: a cluster name or routes need a cluster listen address", ErrConfig)
	}
	for _, r := range c.Routes {
		if _, err := parseRoute(r); err != nil {
			return fmt.Errorf("%w: route %q: %v", ErrConfig, r, err)
		}
	}
	return nil
}

// DefaultClusterName names the cluster when neither EmbeddedConfig nor the
// configuration file does.
const DefaultClusterName = "loopbus"

// fixedPort splits host:port and requires a port in 1..65535.
func fixedPort(addr string) (int, error) {
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(p)
	if err != nil || n < 1 || n > 65535 {
		return 0, fmt.Errorf("port %q is not in 1..65535", p)
	}
	return n, nil
}

// parseRoute parses a route URL; it must name a host and a port.
func parseRoute(r string) (*url.URL, error) {
	u, err := url.Parse(strings.TrimSpace(r))
	if err != nil {
		return nil, err
	}
	if u.Scheme != "nats" && u.Scheme != "nats-route" {
		return nil, fmt.Errorf("want nats://host:port")
	}
	if u.Hostname() == "" || u.Port() == "" {
		return nil, fmt.Errorf("want nats://host:port")
	}
	return u, nil
}

// Embedded is a running in-process nats-server that owns its data directory.
type Embedded struct {
	srv  *server.Server
	lock *os.File
	url  string
	dir  string
	once sync.Once
}

// URL is the client URL of the server.
func (e *Embedded) URL() string { return e.url }

// InProcess is the server as Config.InProcess, for connections of this
// process that go to it through memory, for as long as it runs.
func (e *Embedded) InProcess() nats.InProcessConnProvider { return e.srv }

// Server exposes the underlying server (for tests and the nats command).
func (e *Embedded) Server() *server.Server { return e.srv }

// Shutdown stops the server, waits for it and releases the data directory.
// Calling it again does nothing (in particular it never removes the URL
// file of a server started later on the same directory).
func (e *Embedded) Shutdown() {
	e.once.Do(func() {
		e.srv.Shutdown()
		e.srv.WaitForShutdown()
		_ = os.Remove(filepath.Join(e.dir, urlFile)) // still ours: we hold the lock
		_ = e.lock.Close()
	})
}

const (
	lockFile = "nats.lock"
	urlFile  = "nats.url"
)

// StartEmbedded starts a server on cfg.DataDir. It takes an exclusive lock
// on the directory; if another process holds it, it returns an error
// wrapping ErrServerRunning (use OpenDataDir to share that server instead).
func StartEmbedded(cfg EmbeddedConfig, log zerolog.Logger) (*Embedded, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("data directory: %w", err)
	}
	lock, err := lockDir(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	e, err := startLocked(cfg, lock, log)
	if err != nil {
		_ = lock.Close()
		return nil, err
	}
	return e, nil
}

func lockDir(dir string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, lockFile), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("data directory lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		_ = f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			url, _ := os.ReadFile(filepath.Join(dir, urlFile))
			return nil, fmt.Errorf("%w (%s at %s)", ErrServerRunning, dir, strings.TrimSpace(string(url)))
		}
		return nil, fmt.Errorf("data directory lock: %w", err)
	}
	return f, nil
}

func canListen(host string, port int) error {
	l, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(port)))
	if err != nil {
		return err
	}
	return l.Close()
}

// applyCluster lays cfg's cluster settings over those of the configuration
// file and fills in what a JetStream cluster node cannot do without: a
// cluster name and a stable server name.
func applyCluster(cfg EmbeddedConfig, opts *server.Options) error {
	if cfg.ClusterListen != "" {
		h, _, _ := net.SplitHostPort(cfg.ClusterListen)
		n, _ := fixedPort(cfg.ClusterListen) // checked by Validate
		opts.Cluster.Host, opts.Cluster.Port = h, n
	}
	if cfg.ClusterName != "" {
		opts.Cluster.Name = cfg.ClusterName
	}
	if len(cfg.Routes) > 0 {
		opts.Routes = nil
		for _, r := range cfg.Routes {
			u, _ := parseRoute(r) // checked by Validate
			opts.Routes = append(opts.Routes, u)
		}
	}
	if opts.Cluster.Port <= 0 { // not a cluster node (or a random port, which routes cannot reach)
		return nil
	}
	if opts.Cluster.Name == "" {
		opts.Cluster.Name = DefaultClusterName
	}
	if cfg.ServerName == "" && opts.ServerName == "" {
		// The name must differ between nodes and stay the same across
		// restarts: the cluster address does, unless it is a wildcard,
		// which every host may share; then the host name tells them apart.
		host := opts.Cluster.Host
		if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
			if hn, err := os.Hostname(); err == nil && hn != "" {
				host = hn
			}
		}
		opts.ServerName = "loopbus-" + strings.NewReplacer(":", "-", "[", "", "]", "").Replace(net.JoinHostPort(host, strconv.Itoa(opts.Cluster.Port)))
	}
	if err := canListen(opts.Cluster.Host, opts.Cluster.Port); err != nil {
		return fmt.Errorf("cannot listen for cluster routes on %s:%d (choose another cluster listen address): %w", opts.Cluster.Host, opts.Cluster.Port, err)
	}
	return nil
}

func startLocked(cfg EmbeddedConfig, lock *os.File, log zerolog.Logger) (*Embedded, error) {
	opts := &server.Options{}
	if cfg.ConfigFile != "" {
		o, err := server.ProcessConfigFile(cfg.ConfigFile)
		if err != nil {
			return nil, fmt.Errorf("server config %s: %w", cfg.ConfigFile, err)
		}
		opts = o
	}
	host, port := "127.0.0.1", -1
	if cfg.Listen != "" {
		h, p, _ := net.SplitHostPort(cfg.Listen)
		n, err := strconv.Atoi(p)
		if err != nil {
			return nil, fmt.Errorf("%w: listen port %q", ErrConfig, p)
		}
		host, port = h, n
		if n == 0 {
			port = -1
		}
	} else if cfg.ConfigFile != "" && opts.Port != 0 {
		host, port = opts.Host, opts.Port
	}
	opts.Host, opts.Port = host, port
	if port > 0 {
		// nats-server reports a busy port through its Fatalf logger and then
		// never becomes ready; say so at once instead.
		if err := canListen(host, port); err != nil {
			return nil, fmt.Errorf("cannot listen on %s:%d (is another NATS or loopbus server running? choose another --listen): %w", host, port, err)
		}
	}
	if err := applyCluster(cfg, opts); err != nil {
		return nil, err
	}
	opts.JetStream = true
	opts.StoreDir = cfg.DataDir // the server adds its own jetstream/ folder
	opts.NoSigs = true
	if cfg.ServerName != "" {
		opts.ServerName = cfg.ServerName
	}
	opts.SyncAlways = !cfg.RelaxedSync
	if cfg.RelaxedSync && cfg.SyncInterval > 0 {
		opts.SyncInterval = cfg.SyncInterval
	}
	opts.MaxPayload = cfg.MaxPayload
	if opts.MaxPayload == 0 {
		opts.MaxPayload = 8 << 20
	}
	if cfg.User != "" {
		opts.Username, opts.Password = cfg.User, cfg.Password
	}
	if cfg.Token != "" {
		opts.Authorization = cfg.Token
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("nats server: %w", err)
	}
	srv.SetLoggerV2(serverLogger{log.With().Str("component", "nats-server").Logger()}, false, false, false)
	go srv.Start()
	if !srv.ReadyForConnections(30 * time.Second) {
		srv.Shutdown()
		return nil, fmt.Errorf("nats server on %s:%d not ready after 30s", host, port)
	}
	url := srv.ClientURL()
	if err := os.WriteFile(filepath.Join(cfg.DataDir, urlFile), []byte(url+"\n"), 0o600); err != nil {
		srv.Shutdown()
		return nil, fmt.Errorf("data directory: %w", err)
	}
	return &Embedded{srv: srv, lock: lock, url: url, dir: cfg.DataDir}, nil
}

// OpenDataDir gives a client URL for cfg.DataDir: if another process serves
// the directory it returns that server's URL and a nil *Embedded; otherwise
// it starts an embedded server (which the caller must Shut down).
func OpenDataDir(ctx context.Context, cfg EmbeddedConfig, log zerolog.Logger) (string, *Embedded, error) {
	if err := cfg.Validate(); err != nil {
		return "", nil, err
	}
	deadline := time.Now().Add(15 * time.Second)
	for attempt := 0; ; attempt++ {
		e, err := StartEmbedded(cfg, log)
		if err == nil {
			return e.URL(), e, nil
		}
		if !errors.Is(err, ErrServerRunning) {
			return "", nil, err
		}
		// Someone else owns it: use their URL once it answers.
		raw, _ := os.ReadFile(filepath.Join(cfg.DataDir, urlFile))
		if url := strings.TrimSpace(string(raw)); url != "" && reachable(url, cfg) {
			return url, nil, nil
		}
		if time.Now().After(deadline) {
			return "", nil, fmt.Errorf("%w, but it does not answer: %v", ErrServerRunning, err)
		}
		select {
		case <-ctx.Done():
			return "", nil, ctx.Err()
		case <-time.After(backoffDelay(attempt)):
		}
	}
}

func reachable(url string, cfg EmbeddedConfig) bool {
	opts := []nats.Option{nats.Timeout(2 * time.Second)}
	if cfg.User != "" {
		opts = append(opts, nats.UserInfo(cfg.User, cfg.Password))
	}
	if cfg.Token != "" {
		opts = append(opts, nats.Token(cfg.Token))
	}
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		return false
	}
	nc.Close()
	return true
}

// serverLogger adapts zerolog to the nats-server logger interface.
type serverLogger struct{ l zerolog.Logger }

func (s serverLogger) Noticef(format string, v ...any) { s.l.Debug().Msgf(format, v...) }
func (s serverLogger) Warnf(format string, v ...any)   { s.l.Warn().Msgf(format, v...) }
func (s serverLogger) Fatalf(format string, v ...any)  { s.l.Error().Msgf(format, v...) }
func (s serverLogger) Errorf(format string, v ...any)  { s.l.Error().Msgf(format, v...) }
func (s serverLogger) Debugf(format string, v ...any)  { s.l.Trace().Msgf(format, v...) }
func (s serverLogger) Tracef(format string, v ...any)  { s.l.Trace().Msgf(format, v...) }
