package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/loopbus/loopbus/agentworker"
	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/client"
	"github.com/loopbus/loopbus/config"
	"github.com/loopbus/loopbus/dashboard"
	"github.com/loopbus/loopbus/definition"
	"github.com/loopbus/loopbus/metrics"
	"github.com/loopbus/loopbus/orchestrator"
	"github.com/loopbus/loopbus/projections"
	"github.com/loopbus/loopbus/schemas"
	"github.com/loopbus/loopbus/serve"
	"github.com/loopbus/loopbus/tracing"
	"github.com/loopbus/loopbus/tui"
	"github.com/rs/zerolog"
	"github.com/spf13/cobra"
)

func newRunCmd(g *globals) *cobra.Command {
	var input, tasks, session, out, task, taskFile, repo string
	var detach, asJSON bool
	var workers int
	var budget schemas.Budget
	cmd := &cobra.Command{
		Use:   "run PIPELINE --input FILE | run BACKLOG [--tasks FILE] | run LOOPS --repo DIR --task TEXT",
		Short: "Start a session of a pipeline or backlog and follow it to the end",
		Long: `Start a session of PIPELINE over the input file, or of a backlog (a file
of kind: backlog) over its task file, or of a loop hierarchy (kind: loops) on
a task and a git repository, and follow it live. A loops session's target
branch, loopbus/SESSION, is brought into --repo at the end (see pull).
Exits 0 when the session completes, 1 when it fails (reason on stderr), 2 on
usage errors. Without --nats, NATS and every service run in this process.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			sb, err := sessionBudget(cmd, budget)
			if err != nil {
				return usageErr(err)
			}
			p, err := definition.Load(args[0])
			if err != nil {
				return usageErr(err)
			}
			if session == "" {
				session = client.NewSessionID(p.Name, time.Now())
			} else if err := schemas.ValidateSessionID(session); err != nil {
				return usageErr(err)
			}
			file, err := client.RunInput(p, input, tasks)
			if err != nil {
				return usageErr(err)
			}
			if task, err = client.RunTask(p, task, taskFile, repo); err != nil {
				return usageErr(err)
			}
			if detach && out != "" {
				return usageErr(errors.New("run: --out needs the session followed to its end; it cannot go with --detach (use '" + g.program + " export SESSION --dir DIR' later)"))
			}
			return g.submitAndFollow(cmd.Context(), submitter(p, file, task, repo, session, sb), session, detach, asJSON, workers, out, repo)
		},
	}
	cmd.Flags().StringVar(&input, "input", "", "input file (required for pipelines)")
	cmd.Flags().StringVar(&tasks, "tasks", "", "backlogs: the task file (to-do.json) to import; without it the bootstrap agent proposes tasks")
	cmd.Flags().StringVar(&task, "task", "", "loops: the task to do")
	cmd.Flags().StringVar(&taskFile, "task-file", "", "loops: a file holding the task")
	cmd.Flags().StringVar(&repo, "repo", "", "loops: the git repository the code loops work on (its checked-out branch, index and working tree are never touched)")
	cmd.Flags().StringVar(&session, "session", "", "session id ([A-Za-z0-9_-], at most 64); default <pipeline>-<date>-<random>")
	cmd.Flags().BoolVar(&detach, "detach", false, "submit and exit without following (needs a running server: serve, or --nats)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the final manifest as JSON on stdout")
	cmd.Flags().IntVar(&workers, "concurrency", 4, "jobs run at once by the in-process worker (embedded mode)")
	cmd.Flags().StringVar(&out, "out", "", "when the session completes, write its final artifacts into this directory (created if missing)")
	cmd.Flags().Float64Var(&budget.MaxCostUSD, "max-cost-usd", 0, "budget: stop the session once its agents have cost this many US dollars (with the pipeline's budget, the tighter bound applies)")
	cmd.Flags().Int64Var(&budget.MaxTokens, "max-tokens", 0, "budget: stop the session once its agents have used this many tokens (input plus output)")
	cmd.Flags().IntVar(&budget.MaxIterations, "max-iterations", 0, "budget: stop the session after this many agent runs in all")
	return cmd
}

// sessionBudget returns the budget the run flags --max-cost-usd,
// --max-tokens and --max-iterations set: nil when none was given; each one
// given must be positive.
func sessionBudget(cmd *cobra.Command, b schemas.Budget) (*schemas.Budget, error) {
	for _, f := range []struct {
		name string
		ok   bool
	}{
		{"max-cost-usd", b.MaxCostUSD > 0},
		{"max-tokens", b.MaxTokens > 0},
		{"max-iterations", b.MaxIterations > 0},
	} {
		if fl := cmd.Flags().Lookup(f.name); fl.Changed && !f.ok {
			return nil, fmt.Errorf("run: --%s must be > 0, got %s", f.name, fl.Value)
		}
	}
	if b == (schemas.Budget{}) {
		return nil, nil
	}
	if err := client.CheckBudget(b); err != nil {
		return nil, fmt.Errorf("run: %w", err)
	}
	return &b, nil
}

// submitter starts a session on a connected bus and says what it started.
type submit func(ctx context.Context, b *bus.Bus) (string, error)

// submitter submits p over input (a backlog's task file), or a loops
// file's task and repo, as session.
func submitter(p schemas.Pipeline, input, task, repo, session string, budget *schemas.Budget) submit {
	return func(ctx context.Context, b *bus.Bus) (string, error) {
		if p.Kind == schemas.KindLoops {
			_, err := client.SubmitLoops(ctx, b, p, task, repo, session, time.Now(), budget)
			return tui.Started(p, session, repo, nil), err
		}
		if p.Kind == schemas.KindBacklog {
			sub, err := client.SubmitBacklog(ctx, b, p, input, repo, session, time.Now(), budget)
			return tui.Started(p, session, input, &sub), err
		}
		_, err := client.SubmitWithBudget(ctx, b, p, input, session, time.Now(), budget)
		return tui.Started(p, session, input, nil), err
	}
}

func (g *globals) submitAndFollow(ctx context.Context, submit submit, session string, detach, asJSON bool, workers int, out, repo string) error {
	if ctx == nil {
		ctx = context.Background()
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	log := g.logger(zerolog.WarnLevel)
	c, err := g.connect(ctx, "run", log, false)
	if err != nil {
		return err
	}
	defer g.disconnect(c)
	if detach && c.OwnsServer() {
		return usageErr(errors.New("run --detach: no loopbus server runs on the data directory, so nothing would work on the session after this command exits; start '" + g.program + " serve' first or pass --nats"))
	}
	what, err := submit(ctx, c.Bus)
	if err != nil {
		if errors.Is(err, client.ErrBadInput) || errors.Is(err, client.ErrSessionExists) {
			return usageErr(err)
		}
		return err
	}
	if detach {
		if asJSON {
			return json.NewEncoder(g.stdout).Encode(map[string]string{"session": session})
		}
		fmt.Fprintln(g.stdout, session)
		return nil
	}
	fmt.Fprintln(g.stderr, what)
	err = g.follow(ctx, c, session, asJSON, workers, out, log)
	if repo != "" && !errors.Is(err, errInterrupted) {
		// Whatever was merged, even of a failed session, reaches the user.
		if res, perr := client.Pull(ctx, c.Bus, session, repo); perr != nil {
			fmt.Fprintf(g.stderr, "could not bring the target branch into %s: %v (try '%s pull %s --repo %s')\n", repo, perr, g.program, session, repo)
		} else {
			fmt.Fprintln(g.stderr, res)
		}
	}
	return err
}

func newPullCmd(g *globals) *cobra.Command {
	var repo string
	cmd := &cobra.Command{
		Use:   "pull SESSION --repo DIR",
		Short: "Bring a loops session's target branch (loopbus/SESSION) into a git repository",
		Long: `Fetch the commits a loops session merged and point the branch loopbus/SESSION
of the repository at them: created, or moved forward, never forced. The
checked-out branch, index and working tree are not touched.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if repo == "" {
				return usageErr(errors.New("pull: --repo DIR is required"))
			}
			return g.withBus(cmd, "pull", func(ctx context.Context, b *bus.Bus) error {
				res, err := client.Pull(ctx, b, args[0], repo)
				if err == nil {
					fmt.Fprintln(g.stdout, res)
				}
				return err
			})
		},
	}
	cmd.Flags().StringVar(&repo, "repo", "", "the git repository to bring the branch into")
	return cmd
}

// follow watches a session to its end. In embedded mode (no --nats) it also
// runs every service in-process, so the session progresses whoever started
// the server; extra replicas are safe (shared consumers, guarded decisions).
func (g *globals) follow(ctx context.Context, c *serve.Conn, session string, asJSON bool, workers int, out string, log zerolog.Logger) error {
	var set serve.Services // none: with --nats, services run elsewhere
	if g.natsURL == "" {
		// The in-process worker runs every lane (nothing else would run the
		// rest) and labels tools with the configured lane table.
		_, table, err := config.WorkerLanes(nil)
		if err != nil {
			return err
		}
		set = serve.All(workers)
		set.Worker.LaneTable = table
	}
	sctx, stop := notifyContext(ctx)
	defer stop()
	var final *projections.Manifest
	view, stopView := followView(g.stderr, c)
	err := set.Run(sctx, c.Bus, log, func(ctx context.Context) (err error) {
		final, err = client.Watch(ctx, c.Bus, session, view)
		return err
	})
	stopView()
	switch {
	case sctx.Err() != nil && ctx.Err() == nil:
		fmt.Fprintf(g.stderr, "interrupted; session %s is not lost: '%s wait %s' resumes following it (and, in embedded mode, running it)\n", session, g.program, session)
		return errInterrupted
	case err != nil:
		return err
	case final == nil:
		return fmt.Errorf("session %s: no events", session)
	}
	if asJSON {
		if err := tui.WriteStatus(g.stdout, final, true, time.Now()); err != nil {
			return err
		}
	}
	var written []string
	if out != "" && final.Status == projections.StatusCompleted {
		if written, err = client.WriteFinal(ctx, c.Bus, final, out); err != nil {
			return fmt.Errorf("--out %s: %w", out, err)
		}
	}
	tui.WriteFinal(g.stderr, final, written, g.program, g.where())
	return sessionEnd(g.stderr, final, g.program)
}

func newWaitCmd(g *globals) *cobra.Command {
	var asJSON bool
	var out string
	var workers int
	cmd := &cobra.Command{
		Use:   "wait SESSION",
		Short: "Follow a session until it ends (resuming it in-process in embedded mode)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withConn(cmd, "wait", func(ctx context.Context, c *serve.Conn) error {
				if err := client.Exists(ctx, c.Bus, args[0]); err != nil {
					return err
				}
				return g.follow(ctx, c, args[0], asJSON, workers, out, g.logger(zerolog.WarnLevel))
			})
		},
	}
	cmd.Flags().StringVar(&out, "out", "", "when the session completes, write its final artifacts into this directory (created if missing)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the final manifest as JSON on stdout")
	cmd.Flags().IntVar(&workers, "concurrency", 4, "jobs run at once by the in-process worker (embedded mode)")
	return cmd
}

// readOnly runs fn with a bus for a command; refusals (unknown session,
// invalid request, not a backlog, ended session) are usage errors.
func (g *globals) readOnly(cmd *cobra.Command, fn func(ctx context.Context, b *bus.Bus) error) error {
	return g.withBus(cmd, cmd.Name(), fn)
}

// withBus is readOnly for a command whose events come from source
// loopbus/<name>/….
func (g *globals) withBus(cmd *cobra.Command, name string, fn func(ctx context.Context, b *bus.Bus) error) error {
	return g.withConn(cmd, name, func(ctx context.Context, c *serve.Conn) error { return fn(ctx, c.Bus) })
}

// withConn is withBus with the whole connection.
func (g *globals) withConn(cmd *cobra.Command, name string, fn func(ctx context.Context, c *serve.Conn) error) error {
	ctx := cmd.Context()
	c, err := g.connect(ctx, name, g.logger(zerolog.WarnLevel), false)
	if err != nil {
		return err
	}
	defer g.disconnect(c)
	err = fn(ctx, c)
	for _, refusal := range []error{client.ErrNoSession, client.ErrBadInput, client.ErrNotBacklog, client.ErrSessionEnded, client.ErrNoTarget} {
		if errors.Is(err, refusal) {
			return usageErr(err)
		}
	}
	return err
}

func newStatusCmd(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "status SESSION",
		Short: "Show a session's manifest",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.readOnly(cmd, func(ctx context.Context, b *bus.Bus) error {
				m, err := client.Status(ctx, b, args[0])
				if err != nil {
					return err
				}
				return writeStatus(ctx, g.stdout, b, m, asJSON)
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the manifest as JSON (with \"waiting\": jobs no worker started yet, and why)")
	return cmd
}

func newReplayCmd(g *globals) *cobra.Command {
	var asJSON, tasks bool
	var until string
	cmd := &cobra.Command{
		Use:   "replay SESSION --until SEQ|RFC3339",
		Short: "Show a session's manifest (and a backlog's task list) as it was at a stream sequence or time",
		Long: `Show a session's manifest as it was at a stream sequence or time; for a
backlog session the task list as it was follows it. --tasks shows only the
task list (as 'loopbus tasks' does); --json prints the manifest, or with
--tasks the task list view, as JSON.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var u client.Until
			if until != "" {
				var err error
				if u, err = client.ParseUntil(until); err != nil {
					return usageErr(err)
				}
			}
			return g.readOnly(cmd, func(ctx context.Context, b *bus.Bus) error {
				if err := client.Exists(ctx, b, args[0]); err != nil {
					return err
				}
				if !tasks {
					m, err := client.Replay(ctx, b, args[0], u)
					if err != nil {
						return err
					}
					if err := tui.WriteStatus(g.stdout, m, asJSON, time.Now()); err != nil || asJSON {
						return err
					}
					if err := writeForks(ctx, g.stdout, b, args[0]); err != nil {
						return err
					}
					// A backlog's task list as it was at the same point follows.
					u = client.Until{Seq: m.LastSeq}
				}
				v, err := client.ReplayTasks(ctx, b, args[0], u)
				switch {
				case !tasks && errors.Is(err, client.ErrNotBacklog):
					return nil
				case err != nil:
					return err
				case !tasks:
					fmt.Fprintln(g.stdout)
				}
				return tui.WriteTasks(g.stdout, v, tui.TaskListing{JSON: asJSON && tasks})
			})
		},
	}
	cmd.Flags().StringVar(&until, "until", "", "last stream sequence (e.g. 42) or time (RFC 3339) to include; default: everything")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the manifest (with --tasks, the task list view) as JSON")
	cmd.Flags().BoolVar(&tasks, "tasks", false, "show only the task list of a backlog session")
	return cmd
}

func newExportCmd(g *globals) *cobra.Command {
	var dir string
	cmd := &cobra.Command{
		Use:   "export SESSION --dir DIR",
		Short: "Write a session's manifest, artifacts and events (and a backlog's to-do.json) to a directory",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if dir == "" {
				return usageErr(errors.New("export: --dir DIR is required"))
			}
			return g.readOnly(cmd, func(ctx context.Context, b *bus.Bus) error {
				m, err := client.New(b).Export(ctx, args[0], dir)
				if err != nil {
					return err
				}
				fmt.Fprintf(g.stderr, "exported session %s (%s) to %s\n", args[0], m.Status, dir)
				return nil
			})
		},
	}
	cmd.Flags().StringVar(&dir, "dir", "", "target directory (created if missing)")
	return cmd
}

func newEventsCmd(g *globals) *cobra.Command {
	var session, typ string
	var follow, asJSON bool
	cmd := &cobra.Command{
		Use:   "events",
		Short: "Print events from the stream (all, or filtered by session and type)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			subject, err := client.EventSubject(session, typ)
			if err != nil {
				return usageErr(err)
			}
			return g.readOnly(cmd, func(ctx context.Context, b *bus.Bus) error {
				if session != "" {
					if err := client.Exists(ctx, b, session); err != nil {
						return err
					}
				}
				return b.Read(ctx, bus.ReadOptions{Subjects: []string{subject}, Follow: follow}, func(e schemas.Event) error {
					if asJSON {
						line, err := client.EncodeLine(b, e)
						if err != nil {
							return err
						}
						_, err = g.stdout.Write(line)
						return err
					}
					_, err := fmt.Fprintln(g.stdout, tui.EventRow(e))
					return err
				})
			})
		},
	}
	cmd.Flags().StringVar(&session, "session", "", "only this session's events")
	cmd.Flags().StringVar(&typ, "type", "", "only this type, e.g. step.completed or loopbus.step.completed")
	cmd.Flags().BoolVar(&follow, "follow", false, "keep printing new events until interrupted")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print one structured CloudEvent JSON object per line")
	return cmd
}

func newServeCmd(g *globals) *cobra.Command {
	var listen, metricsAddr string
	var web httpFlags
	var workers int
	var keep, reuse bool
	var ackWait, stallAfter time.Duration
	var maxOutput int64
	var secretEnv []string
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run NATS (embedded, unless --nats) and every service in one process",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			log := g.logger(zerolog.InfoLevel)
			mcfg, err := metricsConfig(metricsAddr)
			if err != nil {
				return err
			}
			dcfg, withDashboard, err := web.config()
			if err != nil {
				return err
			}
			var dashboardOff string // why no dashboard is served, for the banner
			if withDashboard && dcfg.Token == "" && g.secured() {
				if cmd.Flags().Changed("http") {
					return usageErr(errTokenNeeded)
				}
				log.Warn().Msg("the dashboard is not served: " + errTokenNeeded.Error() + ", or --http= to silence this")
				withDashboard = false
				dashboardOff = "this process holds NATS credentials or a signing key: give --http-token (or " + httpTokenEnv + ")"
			}
			wcfg := agentworker.Config{KeepWorkspaces: keep, ReuseWorkspaces: reuse, AckWait: ackWait, MaxOutputBytes: maxOutput}
			if wcfg.Lanes, wcfg.LaneTable, err = config.WorkerLanes(cmd.Flags().Lookup("lanes")); err != nil {
				return err
			}
			// The banner's run command reaches this process as other
			// commands would: by --nats, or by the data directory.
			info := tui.ServeBanner{Embedded: g.natsURL == "", Data: g.dataDir, Workers: workers, Lanes: wcfg.Lanes, NoDashboard: dashboardOff,
				Run: g.program + " run PIPELINE.yaml --input FILE" + g.where()}
			if g.natsURL == "" {
				srv, err := bus.StartEmbedded(g.embeddedConfig(listen), log)
				if err != nil {
					return err
				}
				defer srv.Shutdown()
				g.natsURL, g.inProcess = srv.URL(), srv.InProcess()
				log.Info().Str("url", srv.URL()).Str("data", g.dataDir).Bool("fsync", g.fsync).Msg("NATS ready")
			}
			info.NATS = redactURLs(g.natsURL)
			var ready *banner // set below, before any part reports
			parts := []string{"connected"}
			if mcfg.Listen != "" {
				parts = append(parts, "metrics")
				mcfg.OnListen = func(addr string) {
					ready.report("metrics", func(b *tui.ServeBanner) { b.Metrics = "http://" + addr + metrics.Path })
				}
			}
			if withDashboard {
				parts = append(parts, "dashboard")
				dcfg.OnListen = func(url string) {
					ready.report("dashboard", func(b *tui.ServeBanner) {
						b.Dashboard = url
						if b.Metrics == "" {
							b.Metrics = strings.TrimSuffix(url, "/") + metrics.Path
						}
					})
				}
			}
			ready = newBanner(g.stdout, info, parts...)
			set := serve.All(workers)
			set.Worker, set.SecretEnv, set.ValidatorAckWait, set.Metrics = wcfg, secretEnv, ackWait, mcfg
			set.ValidatorReuseWorkspaces, set.StallAfter = reuse, stallAfter
			set.Traces = tracesConfig()
			if !withDashboard {
				return g.runService(ctx, "serve", func(ctx context.Context, b *bus.Bus, log zerolog.Logger) error {
					ready.report("connected", nil)
					return set.Run(ctx, b, log, nil)
				})
			}
			given := cmd.Flags().Changed("http")
			set.Metrics = metrics.Config{} // the dashboard's metrics service serves --metrics too
			set.OrchestratorMetrics = metrics.NewOrchestrator()
			mcfg.Collectors = append(mcfg.Collectors, set.OrchestratorMetrics)
			noDashboard := func(why string) {
				ready.report("dashboard", func(b *tui.ServeBanner) { b.NoDashboard = why })
			}
			return g.runService(ctx, "serve", func(ctx context.Context, b *bus.Bus, log zerolog.Logger) error {
				ready.report("connected", nil)
				return set.Run(ctx, b, log, func(ctx context.Context) error { return serveDashboard(ctx, dcfg, given, mcfg, b, log, noDashboard) })
			})
		},
	}
	web.add(cmd, dashboard.DefaultAddr)
	cmd.Flags().StringVar(&listen, "listen", defaultPort, "address of the embedded NATS server")
	metricsFlag(cmd, &metricsAddr)
	cmd.Flags().IntVar(&workers, "concurrency", 4, "jobs run at once by the agent worker")
	cmd.Flags().BoolVar(&keep, "keep-workspaces", false, "keep job workspaces on disk for debugging")
	cmd.Flags().BoolVar(&reuse, "reuse-workspaces", false, reuseWorkspacesUsage)
	cmd.Flags().DurationVar(&ackWait, "ack-wait", 30*time.Second, "a job (or job completion) whose worker (or validator) sends no heartbeat this long goes to another one")
	cmd.Flags().Int64Var(&maxOutput, "max-output-bytes", 64<<20, "largest output artifact stored; a larger one fails its job")
	cmd.Flags().StringArrayVar(&secretEnv, "secret-env", nil, secretEnvUsage)
	stallAfterFlag(cmd, &stallAfter)
	cmd.Flags().String("lanes", "", "tool lanes the worker runs, comma-separated: no-net, net, heavy (default all; also worker-lanes in config files, "+config.WorkerLanesEnv+")")
	return cmd
}

func newNatsCmd(g *globals) *cobra.Command {
	var listen, config, name, clusterListen, clusterName string
	var routes []string
	cmd := &cobra.Command{
		Use:   "nats",
		Short: "Run only the NATS server (JetStream on the data directory), alone or as a cluster node",
		Long: `Run only the NATS server (JetStream on the data directory).

With --cluster-listen it is a node of a JetStream cluster: give every node the
same --cluster-name and --routes (the list may include the node itself), its
own --data and --listen, and use --replicas 3 with the services, e.g.

  loopbus nats --data n1 --listen 127.0.0.1:4222 --cluster-listen 127.0.0.1:6222 \
    --routes nats://127.0.0.1:6222,nats://127.0.0.1:6223,nats://127.0.0.1:6224`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log := g.logger(zerolog.InfoLevel)
			if config != "" && !cmd.Flags().Changed("listen") {
				listen = "" // the configuration file's host and port apply
			}
			cfg := g.embeddedConfig(listen)
			cfg.ConfigFile = config
			if config != "" && (cfg.User != "" || cfg.Token != "") {
				// They may come from LOOPBUS_* settings meant for clients;
				// layering one more user over the file's list would be a
				// hidden back door.
				log.Warn().Msg("--user/--password/--token are ignored with --config: the configuration file defines the server's users")
				cfg.User, cfg.Password, cfg.Token = "", "", ""
			}
			cfg.ServerName, cfg.ClusterListen, cfg.ClusterName, cfg.Routes = name, clusterListen, clusterName, routes
			if err := cfg.Validate(); err != nil {
				return usageErr(err)
			}
			srv, err := bus.StartEmbedded(cfg, log)
			if err != nil {
				return err
			}
			defer srv.Shutdown()
			ready := log.Info().Str("url", srv.URL()).Str("data", g.dataDir).Bool("fsync", g.fsync).Str("name", srv.Server().Name())
			if cl := srv.Server().ClusterAddr(); cl != nil {
				ready = ready.Str("cluster", srv.Server().ClusterName()).Str("cluster_listen", cl.String())
			}
			ready.Msg("NATS ready")
			ctx, stop := notifyContext(cmd.Context())
			defer stop()
			<-ctx.Done()
			return nil
		},
	}
	cmd.Flags().StringVar(&listen, "listen", defaultPort, "listen address")
	cmd.Flags().StringVar(&config, "config", "", "nats-server configuration file (TLS, accounts, permissions, cluster)")
	cmd.Flags().StringVar(&name, "name", "", "server name (default: the server id; in a cluster loopbus-<cluster listen address>, the host name replacing a wildcard address)")
	cmd.Flags().StringVar(&clusterListen, "cluster-listen", "", "host:port for routes from the other cluster nodes; makes this server a cluster node")
	cmd.Flags().StringVar(&clusterName, "cluster-name", "", "cluster name, the same on every node (default "+bus.DefaultClusterName+")")
	cmd.Flags().StringSliceVar(&routes, "routes", nil, "cluster URLs of the nodes, comma-separated (nats://host:port,...)")
	return cmd
}

// newServiceCmd builds the orchestrator, validator and projector commands.
func newServiceCmd(g *globals, name string) *cobra.Command {
	var secretEnv []string
	var ackWait, stallAfter time.Duration
	var reuse bool
	var metricsAddr string
	cmd := &cobra.Command{
		Use:   name,
		Short: "Run the " + name + " service",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			mcfg, err := metricsConfig(metricsAddr)
			if err != nil {
				return err
			}
			set := serve.Services{Orchestrator: name == "orchestrator", Validator: name == "validator", Projector: name == "projector",
				SecretEnv: secretEnv, ValidatorAckWait: ackWait, ValidatorReuseWorkspaces: reuse, Metrics: mcfg, StallAfter: stallAfter}
			if name == "orchestrator" {
				set.Traces = tracesConfig()
			}
			return g.runServices(cmd.Context(), name, set)
		},
	}
	metricsFlag(cmd, &metricsAddr)
	if name == "orchestrator" {
		stallAfterFlag(cmd, &stallAfter)
	}
	if name == "validator" {
		cmd.Flags().StringArrayVar(&secretEnv, "secret-env", nil, secretEnvUsage)
		cmd.Flags().DurationVar(&ackWait, "ack-wait", 30*time.Second, "a job completion whose validator sends no heartbeat this long goes to another validator")
		cmd.Flags().BoolVar(&reuse, "reuse-workspaces", false, reuseWorkspacesUsage)
	}
	return cmd
}

// tracesConfig is the tracing service when the OTEL_* environment asks for
// an OTLP exporter, else nil. serve and the orchestrator run it: each
// deployment has one of them.
func tracesConfig() *tracing.Config {
	if !tracing.Enabled(os.Getenv) {
		return nil
	}
	return &tracing.Config{}
}

// metricsFlag adds --metrics ADDR to a command that runs services.
func metricsFlag(cmd *cobra.Command, addr *string) {
	cmd.Flags().StringVar(addr, "metrics", "", "serve Prometheus metrics at /metrics on this host:port (e.g. 127.0.0.1:9464; a non-loopback address is logged); empty serves none")
}

// stallAfterFlag adds --stall-after to a command that runs the orchestrator.
func stallAfterFlag(cmd *cobra.Command, d *time.Duration) {
	cmd.Flags().DurationVar(d, "stall-after", orchestrator.DefaultStallAfter,
		"the orchestrator's watchdog makes a decision a session was owed and did not get once the session has been still this long (logged as an error, counted in loopbus_orchestrator_stalled_decisions_total)")
}

// metricsConfig is the metrics service of --metrics ADDR; a bad address
// is a usage error.
func metricsConfig(addr string) (metrics.Config, error) {
	cfg := metrics.Config{Listen: addr}
	if err := cfg.Validate(); err != nil {
		return metrics.Config{}, usageErr(fmt.Errorf("--metrics: %w", err))
	}
	return cfg, nil
}

// reuseWorkspacesUsage describes --reuse-workspaces wherever workspaces are made.
const reuseWorkspacesUsage = "empty each workspace when its job ends and rename it for a later job instead of removing it: cheaper for many short jobs; only for agents that run unconfined (see docs/PIPELINES.md, What an agent gets)"

// secretEnvUsage describes --secret-env wherever validate commands or agents run.
const secretEnvUsage = "name of an environment variable whose value is masked in events and logs and refused in outputs (repeatable; names like *TOKEN*, *SECRET*, *PASSWORD*, *_KEY are secret anyway)"

func newProjectorCmd(g *globals) *cobra.Command {
	var rebuild bool
	var metricsAddr string
	cmd := &cobra.Command{
		Use:   "projector",
		Short: "Run the projector: keep session manifests in the views bucket current",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			mcfg, err := metricsConfig(metricsAddr)
			if err != nil {
				return err
			}
			return g.runServices(cmd.Context(), "projector", serve.Services{Projector: true, RebuildViews: rebuild, Metrics: mcfg})
		},
	}
	cmd.Flags().BoolVar(&rebuild, "rebuild", false, "first recompute every view from the whole stream")
	metricsFlag(cmd, &metricsAddr)
	return cmd
}

func newAgentworkerCmd(g *globals) *cobra.Command {
	var cfg agentworker.Config
	var metricsAddr string
	cmd := &cobra.Command{
		Use:   "agentworker",
		Short: "Run an agent worker; start several to add capacity",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			mcfg, err := metricsConfig(metricsAddr)
			if err != nil {
				return err
			}
			if cfg.Lanes, cfg.LaneTable, err = config.WorkerLanes(cmd.Flags().Lookup("lanes")); err != nil {
				return err
			}
			return g.runServices(cmd.Context(), "agentworker", serve.Services{Workers: max(cfg.Concurrency, 1), Worker: cfg, Metrics: mcfg})
		},
	}
	metricsFlag(cmd, &metricsAddr)
	cmd.Flags().IntVar(&cfg.Concurrency, "concurrency", 1, "jobs this worker runs at once")
	cmd.Flags().StringVar(&cfg.ID, "id", "", "worker id shown in job.started (default host-pid)")
	cmd.Flags().StringVar(&cfg.WorkDir, "work-dir", "", "directory for job workspaces (default $TMPDIR/loopbus-work-UID; refused when another user could change it)")
	cmd.Flags().BoolVar(&cfg.KeepWorkspaces, "keep-workspaces", false, "keep job workspaces on disk for debugging")
	cmd.Flags().BoolVar(&cfg.ReuseWorkspaces, "reuse-workspaces", false, reuseWorkspacesUsage)
	cmd.Flags().DurationVar(&cfg.AckWait, "ack-wait", 30*time.Second, "a job whose worker sends no heartbeat this long goes to another worker")
	cmd.Flags().Int64Var(&cfg.MaxOutputBytes, "max-output-bytes", 64<<20, "largest output artifact stored; a larger one fails its job")
	cmd.Flags().StringArrayVar(&cfg.SecretEnv, "secret-env", nil, secretEnvUsage)
	cmd.Flags().StringArrayVar(&cfg.ModelKeyEnv, "model-key-env", nil, "a variable a job's model-API agent may name as api_key_env (repeatable; default OPENAI_API_KEY and ANTHROPIC_API_KEY)")
	cmd.Flags().StringArrayVar(&cfg.ModelBaseURLs, "model-base-url", nil, "a base URL (prefix) a job's model-API agent may call (repeatable; default any): on a shared worker, keeps pipelines from sending its key elsewhere")
	cmd.Flags().String("lanes", "", "tool lanes this worker runs, comma-separated: no-net, net, heavy (default all; also worker-lanes in config files, "+config.WorkerLanesEnv+"); jobs needing others are left to other workers")
	return cmd
}

func (g *globals) runServices(ctx context.Context, name string, set serve.Services) error {
	return g.runService(ctx, name, func(ctx context.Context, b *bus.Bus, log zerolog.Logger) error {
		return set.Run(ctx, b, log, nil)
	})
}

// runService connects as name and runs fn until a signal ends it; fn's
// error after the signal is no error.
func (g *globals) runService(ctx context.Context, name string, fn func(ctx context.Context, b *bus.Bus, log zerolog.Logger) error) error {
	log := g.logger(zerolog.InfoLevel).With().Str("process", name).Logger()
	ctx, stop := notifyContext(ctx)
	defer stop()
	c, err := g.connect(ctx, name, log, true)
	if err != nil {
		return err
	}
	defer g.disconnect(c)
	if err := fn(ctx, c.Bus, log); err != nil && ctx.Err() == nil {
		return err
	}
	return nil
}

func newKeygenCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "keygen FILE",
		Short: "Make a signing key: write a new nkey seed to FILE (mode 0600) and print its public key",
		Long: `Write a new nkey user seed to FILE (never replacing a file) and print its
public key. Give the seed to a service or command with --sign-key FILE
(env LOOPBUS_SIGN_KEY), and list the public key under the service's role in
the trust file that every process reads with --trust (env LOOPBUS_TRUST).
See examples/secure.`,
		Args: cobra.ExactArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			pub, err := bus.NewSignKey(args[0])
			if err != nil {
				return fmt.Errorf("keygen: %w", err)
			}
			fmt.Fprintln(g.stdout, pub)
			return nil
		},
	}
}
