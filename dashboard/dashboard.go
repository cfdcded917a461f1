// Package dashboard serves loopbus's web dashboard and its JSON API: the
// sessions, one session's steps or loop tree with a live event timeline,
// the dead letters and backlogs' task lists, and buttons that send the same
// signals as the command line. Everything it shows is read from the event
// stream (through the client package); it keeps no state of its own.
//
// The pages are plain html/template with one small script, embedded in the
// binary: nothing is built at run time and there is no framework to keep
// up with. Live updates are server-sent events; the browser never polls.
package dashboard

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/client"
	"github.com/rs/zerolog"
)

// DefaultAddr is where `loopbus serve` serves the dashboard unless told
// otherwise: loopback only.
const DefaultAddr = "127.0.0.1:7070"

// ErrUnsafeListener: the dashboard would listen beyond loopback without a
// token, or with one short enough to guess.
var ErrUnsafeListener = errors.New("unsafe dashboard listener")

// MinTokenLen is the shortest token accepted.
const MinTokenLen = 16

// maxStreams bounds the event streams open at once: each holds a reader of
// the stream and a goroutine.
const maxStreams = 64

// Config configures the dashboard. The zero value serves DefaultAddr with
// no token (loopback needs none).
type Config struct {
	// Addr is the listen address; empty means DefaultAddr.
	Addr string
	// Token, when set, is required of every request: as a bearer token
	// (Authorization: Bearer TOKEN) or through the login form, which keeps
	// it in a cookie. Any address but loopback needs one.
	Token string
	// Extra are more handlers served on the same listener, by pattern
	// (e.g. "GET /metrics"); they are behind the token too.
	Extra map[string]http.Handler
	// MaxRows bounds the events one timeline keeps and sends on connect;
	// zero means 2000.
	MaxRows int
	// Lanes decides the tool lanes a job's agent needs (client.PlannedLanes
	// with the workers' lane table), so that a session's page can say "no
	// worker for lane heavy". Nil: only a job waiting while no worker runs,
	// or for long, is named.
	Lanes client.LanesFunc
	// OnListen, if set, is called once with the dashboard's URL
	// (http://host:port/) when Serve starts serving.
	OnListen func(url string)
}

// Validate refuses a listener beyond loopback without a token, and a
// malformed address.
func (c Config) Validate() error {
	addr := c.Addr
	if addr == "" {
		addr = DefaultAddr
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("dashboard address %q: %w", addr, err)
	}
	if c.Token == "" && !loopbackHost(host) {
		return fmt.Errorf("%w: %s is not a loopback address: give --http-token (or LOOPBUS_HTTP_TOKEN) so that only you can see and steer your sessions, or listen on 127.0.0.1", ErrUnsafeListener, addr)
	}
	if c.Token != "" && len(c.Token) < MinTokenLen {
		return fmt.Errorf("%w: the token has %d characters; give at least %d (e.g. openssl rand -hex 16)", ErrUnsafeListener, len(c.Token), MinTokenLen)
	}
	if c.MaxRows < 0 {
		return errors.New("dashboard MaxRows must not be negative")
	}
	return nil
}

func (c Config) withDefaults() Config {
	if c.Addr == "" {
		c.Addr = DefaultAddr
	}
	if c.MaxRows == 0 {
		c.MaxRows = 2000
	}
	return c
}

// loopbackHost reports whether host (an IP or name, without port) stays
// on this machine.
func loopbackHost(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

//go:embed web
var webFiles embed.FS

// Service serves the dashboard.
type Service struct {
	cfg   Config
	c     *client.Client
	log   zerolog.Logger
	now   func() time.Time
	pages *template.Template
	mux   *http.ServeMux
	// streams holds a token per open event stream (maxStreams).
	streams chan struct{}
}

// New builds the dashboard over c (whose bus stays the caller's).
func New(cfg Config, c *client.Client, log zerolog.Logger, now func() time.Time) (*Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if c == nil || now == nil {
		return nil, errors.New("dashboard.New needs a client and a clock")
	}
	pages, err := template.ParseFS(webFiles, "web/*.html")
	if err != nil {
		return nil, fmt.Errorf("dashboard pages: %w", err)
	}
	s := &Service{cfg: cfg.withDefaults(), c: c, log: log, now: now, pages: pages, mux: http.NewServeMux(), streams: make(chan struct{}, maxStreams)}
	s.routes()
	return s, nil
}

// Handler is the dashboard with its checks (token, same origin, host), for
// serving on a listener of the caller's.
func (s *Service) Handler() http.Handler { return s.guard(s.mux) }

// Run serves the dashboard until ctx ends.
func (s *Service) Run(ctx context.Context) error {
	ln, err := net.Listen("tcp", s.cfg.Addr)
	if err != nil {
		return fmt.Errorf("dashboard: %w", err)
	}
	return s.Serve(ctx, ln)
}

// Serve serves the dashboard on ln until ctx ends; it closes ln.
func (s *Service) Serve(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{
		Handler:           s.Handler(),
		ReadHeaderTimeout: 10 * time.Second,
		BaseContext:       func(net.Listener) context.Context { return ctx },
	}
	url := "http://" + ln.Addr().String() + "/"
	s.log.Info().Str("url", url).Bool("token", s.cfg.Token != "").Msg("dashboard listening")
	if s.cfg.OnListen != nil {
		s.cfg.OnListen(url)
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("dashboard: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	// Event streams end with ctx (BaseContext); Shutdown waits for the rest.
	if err := srv.Shutdown(sctx); err != nil {
		_ = srv.Close()
	}
	return nil
}

func (s *Service) routes() {
	static, _ := fs.Sub(webFiles, "web")
	s.mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	s.mux.HandleFunc("GET /{$}", s.page("sessions.html"))
	s.mux.HandleFunc("GET /sessions/{id}", s.sessionPage)
	s.mux.HandleFunc("GET /deadletters", s.page("deadletters.html"))
	s.mux.HandleFunc("GET /login", s.page("login.html"))
	s.mux.HandleFunc("POST /login", s.login)

	s.mux.HandleFunc("GET /api/sessions", s.apiSessions)
	s.mux.HandleFunc("GET /api/sessions/{id}", sessionAPI(s, s.c.Status))
	s.mux.HandleFunc("GET /api/sessions/{id}/events", s.apiSessionEvents)
	s.mux.HandleFunc("GET /api/sessions/{id}/rows", s.apiRows)
	s.mux.HandleFunc("GET /api/sessions/{id}/tasks", sessionAPI(s, s.c.Tasks))
	s.mux.HandleFunc("GET /api/sessions/{id}/forks", sessionAPI(s, s.forks))
	s.mux.HandleFunc("GET /api/sessions/{id}/outcomes", sessionAPI(s, s.c.JobOutcomes))
	s.mux.HandleFunc("GET /api/sessions/{id}/artifact", s.apiArtifact)
	s.mux.HandleFunc("POST /api/sessions/{id}/signal", s.apiSignal)
	s.mux.HandleFunc("POST /api/sessions/{id}/budget", s.apiBudget)
	s.mux.HandleFunc("POST /api/sessions/{id}/close", s.apiClose)
	s.mux.HandleFunc("GET /api/sessions/{id}/waiting", s.apiWaiting)
	s.mux.HandleFunc("GET /api/updates", s.apiUpdates)
	s.mux.HandleFunc("GET /api/deadletters", s.apiDeadLetters)
	s.mux.HandleFunc("GET /api/workers", s.apiWorkers)
	for pattern, h := range s.cfg.Extra {
		s.mux.Handle(pattern, h)
	}
}

// page renders one of the page templates; the pages fetch their data from
// the API.
func (s *Service) page(name string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		s.render(w, http.StatusOK, name, pageData{Session: r.PathValue("id"), Error: loginError(q.Get("error")), Next: localPath(q.Get("next"))})
	}
}

// pageData is what the page templates are given.
type pageData struct{ Session, Error, Next string }

// render writes the page template name with data, and status.
func (s *Service) render(w http.ResponseWriter, status int, name string, data pageData) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; frame-ancestors 'none'")
	w.WriteHeader(status)
	if err := s.pages.ExecuteTemplate(w, name, data); err != nil {
		s.log.Warn().Err(err).Str("page", name).Msg("dashboard page")
	}
}

// sessionPage serves a session's page. An id that is no session's is
// answered with 404 (400 for an unsafe id) and a page that says so, not
// the page of a session that never loads. A session whose existence the
// bus cannot tell now (it is down) gets its page, which waits for it.
func (s *Service) sessionPage(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), pageLookupWait)
	err := s.c.Exists(ctx, r.PathValue("id"))
	cancel()
	status := statusOf(err)
	if err == nil || (status != http.StatusNotFound && status != http.StatusBadRequest) {
		s.page("session.html")(w, r)
		return
	}
	s.render(w, status, "missing.html", pageData{Error: err.Error()})
}

// pageLookupWait bounds how long a session's page waits to learn whether
// the session exists.
const pageLookupWait = 5 * time.Second

// statusOf maps an error of the client or bus to an HTTP status.
func statusOf(err error) int {
	switch {
	case errors.Is(err, client.ErrNoSession), errors.Is(err, bus.ErrNotFound):
		return http.StatusNotFound
	case errors.Is(err, client.ErrBadInput):
		return http.StatusBadRequest
	case errors.Is(err, client.ErrSessionEnded):
		return http.StatusConflict
	case errors.Is(err, bus.ErrDigestMismatch):
		return http.StatusBadGateway
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError
}

// trimPort returns host without its port.
func trimPort(hostport string) string {
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		return h
	}
	return strings.Trim(hostport, "[]")
}
