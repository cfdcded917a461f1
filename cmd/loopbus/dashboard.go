package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/client"
	"github.com/loopbus/loopbus/dashboard"
	"github.com/loopbus/loopbus/metrics"
	"github.com/oklog/run"
	"github.com/rs/zerolog"
	"github.com/spf13/cobra"
)

// httpTokenEnv holds the dashboard's token when --http-token is not given
// (a flag's value shows in the process list).
const httpTokenEnv = "LOOPBUS_HTTP_TOKEN"

// httpFlags are the dashboard's listener flags.
type httpFlags struct {
	addr, token string
}

func (h *httpFlags) add(cmd *cobra.Command, def string) {
	cmd.Flags().StringVar(&h.addr, "http", def, "serve the web dashboard (and /metrics) on this host:port; --http= serves none. Beyond loopback it needs --http-token")
	cmd.Flags().StringVar(&h.token, "http-token", "", "token the dashboard asks for (bearer token or login form; env "+httpTokenEnv+")")
}

// config is the dashboard's configuration, checked; ok is false for
// --http= (no dashboard).
func (h *httpFlags) config() (cfg dashboard.Config, ok bool, err error) {
	if h.addr == "" {
		return dashboard.Config{}, false, nil
	}
	cfg = dashboard.Config{Addr: h.addr, Token: h.token}
	if cfg.Token == "" {
		cfg.Token = os.Getenv(httpTokenEnv)
	}
	if err := cfg.Validate(); err != nil {
		return dashboard.Config{}, false, usageErr(fmt.Errorf("--http: %w", err))
	}
	return cfg, true, nil
}

// secured reports whether this process holds credentials or a signing key:
// a dashboard without a token would let anyone on the machine read and act
// with them (loopback is every local user's, and the agents'). A user,
// password or token inside a --nats URL (or LOOPBUS_NATS_URL) counts.
func (g *globals) secured() bool {
	return g.signKey != "" || g.trust != "" || g.user != "" || g.password != "" || g.token != "" || g.creds != "" || g.nkey != "" || g.tlsCert != "" ||
		urlHoldsCredentials(g.natsURL)
}

// urlHoldsCredentials reports whether any URL of a comma-separated NATS
// server list carries user information (nats://user:pass@host,
// nats://token@host). A URL that does not parse counts as holding them:
// refusing a dashboard is the safe side of a guess.
func urlHoldsCredentials(urls string) bool {
	for _, raw := range strings.Split(urls, ",") {
		raw = strings.TrimSpace(raw)
		if raw == "" {
			continue
		}
		if !strings.Contains(raw, "://") {
			raw = "nats://" + raw // nats.go accepts host:port alone
		}
		u, err := url.Parse(raw)
		if err != nil || u.User != nil {
			return true
		}
	}
	return false
}

// errTokenNeeded says why a secured process's dashboard needs a token.
var errTokenNeeded = errors.New("this process holds NATS credentials (flags, a credentials file, or a user or token in the --nats URL) or a signing key, so its dashboard needs a token even on loopback (any local user, or agent, could act with them): give --http-token or " + httpTokenEnv)

// serveDashboard serves the dashboard, with /metrics on the same listener
// (and, with mcfg.Listen, on that address too: one metrics service reads
// the stream for both), over b until ctx ends. When the address is the default and taken
// (another loopbus serve on this machine), it says so and serves none;
// an address given by hand that cannot be had is an error. noDashboard, if
// set, is told why none is served.
func serveDashboard(ctx context.Context, cfg dashboard.Config, given bool, mcfg metrics.Config, b *bus.Bus, log zerolog.Logger, noDashboard func(why string)) error {
	m, err := metrics.New(mcfg, b, log.With().Str("service", "metrics").Logger())
	if err != nil {
		return err
	}
	cfg.Extra = map[string]http.Handler{"GET /metrics": m.Handler()}
	if cfg.Lanes == nil {
		// A session's page names the lanes its waiting jobs need, as
		// status does.
		if cfg.Lanes, err = jobLanes(); err != nil {
			return err
		}
	}
	d, err := dashboard.New(cfg, client.New(b), log.With().Str("service", "dashboard").Logger(), time.Now)
	if err != nil {
		return err
	}
	var g run.Group
	mctx, stopMetrics := context.WithCancel(ctx)
	g.Add(func() error { return m.Run(mctx) }, func(error) { stopMetrics() })
	dctx, stopDashboard := context.WithCancel(ctx)
	g.Add(func() error { return d.Run(dctx) }, func(error) { stopDashboard() })
	err = g.Run()
	switch {
	case err == nil || ctx.Err() != nil || errors.Is(err, context.Canceled):
		return nil
	case errors.Is(err, syscall.EADDRINUSE) && !given:
		log.Warn().Err(err).Msg("the dashboard is not served: its address is taken (another loopbus serve?); give --http ADDR, or --http= to serve none")
		if noDashboard != nil {
			noDashboard(cfg.Addr + " is taken (another loopbus serve?); give --http ADDR")
		}
		if mcfg.Listen == "" {
			<-ctx.Done()
			return nil
		}
		alone, err := metrics.New(mcfg, b, log.With().Str("service", "metrics").Logger()) // --metrics still
		if err != nil {
			return err
		}
		return alone.Run(ctx)
	case errors.Is(err, syscall.EADDRINUSE):
		return fmt.Errorf("%w (give another --http ADDR, or --http= to serve none)", err)
	}
	return err
}

func newDashboardCmd(g *globals) *cobra.Command {
	var h httpFlags
	cmd := &cobra.Command{
		Use:   "dashboard",
		Short: "Serve the web dashboard (and /metrics) alone, against a running bus (--nats URL)",
		Long: `Serve the web dashboard alone, against the bus of --nats (or the server
another loopbus command runs on --data). It lists sessions, follows one live
(steps or loop tree, events, tool calls, cost, artifacts), shows the dead
letters and backlogs' tasks, and sends pause, resume, stop, hint,
invalidate, approve and reject as 'loopbus signal' does, and budget and
close as 'loopbus budget' and 'loopbus close' do; a session's page says
when its jobs wait for a lane no worker serves. /metrics is served beside
it.

It listens on loopback unless told otherwise; any other address needs a
token (--http-token or ` + httpTokenEnv + `).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, ok, err := h.config()
			if err != nil {
				return err
			}
			if !ok {
				return usageErr(errors.New("--http is empty: the dashboard needs an address"))
			}
			if cfg.Token == "" && g.secured() {
				return usageErr(errTokenNeeded)
			}
			return g.runService(cmd.Context(), "dashboard", func(ctx context.Context, b *bus.Bus, log zerolog.Logger) error {
				return serveDashboard(ctx, cfg, true, metrics.Config{}, b, log, nil)
			})
		},
	}
	h.add(cmd, dashboard.DefaultAddr)
	return cmd
}
