// Command loopbus runs AI-agent pipelines as an event-sourced system on NATS
// JetStream. This package only wires: flags → config → constructors → a run
// group of services.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/config"
	"github.com/loopbus/loopbus/serve"
	"github.com/mattn/go-isatty"
	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"
	"github.com/spf13/cobra"
)

// Exit codes.
const (
	exitOK          = 0
	exitFailed      = 1
	exitUsage       = 2
	exitStopped     = 3
	exitBlocked     = 4
	exitClosed      = 5
	exitInterrupted = 130
	defaultPort     = "127.0.0.1:4222"
)

// usageError marks errors that exit with code 2.
type usageError struct{ err error }

func (u usageError) Error() string { return u.err.Error() }
func (u usageError) Unwrap() error { return u.err }

func usageErr(err error) error { return usageError{err} }

// Errors that exit with their own code once the reason is printed:
// errFailed 1 (a failed session, failed doctor checks), errStopped 3 (a
// session stopped by its budget), errBlocked 4 (a backlog session that
// completed with blocked tasks), errClosed 5 (a closed session),
// errInterrupted 130 (a signal).
var (
	errFailed      = errors.New("failed")
	errStopped     = errors.New("stopped")
	errBlocked     = errors.New("completed with blocked tasks")
	errClosed      = errors.New("closed")
	errInterrupted = errors.New("interrupted")
)

func main() {
	os.Exit(executeAs(invokedAs(os.Args[0]), os.Args[1:], os.Stdout, os.Stderr))
}

// execute runs the command line args as "loopbus".
func execute(args []string, stdout, stderr io.Writer) int {
	return executeAs("loopbus", args, stdout, stderr)
}

// invokedAs is how the binary was invoked (its argv[0], e.g. bin/loopbus),
// for the commands its hints suggest, quoted for a shell when it needs to
// be; "loopbus" when unknown.
func invokedAs(arg0 string) string {
	if arg0 == "" {
		return "loopbus"
	}
	if strings.Trim(arg0, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789/._-+:@") == "" {
		return arg0
	}
	return "'" + strings.ReplaceAll(arg0, "'", `'\''`) + "'"
}

// executeAs runs the command line args; program is how hints name the
// binary.
func executeAs(program string, args []string, stdout, stderr io.Writer) int {
	g := &globals{stdout: stdout, stderr: stderr, program: program}
	root := newRoot(g)
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.Execute()
	var ue usageError
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, errFailed):
		return exitFailed
	case errors.Is(err, errStopped):
		return exitStopped
	case errors.Is(err, errBlocked):
		return exitBlocked
	case errors.Is(err, errClosed):
		return exitClosed
	case errors.Is(err, errInterrupted):
		return exitInterrupted
	case errors.As(err, &ue) || !g.started || errors.Is(err, config.ErrInvalid):
		// Errors before a command started (unknown command, wrong
		// arguments) are cobra's: usage errors too; so are bad settings.
		fmt.Fprintf(stderr, "loopbus: %v\n", err)
		return exitUsage
	default:
		fmt.Fprintf(stderr, "loopbus: %v\n", err)
		return exitFailed
	}
}

// globals are the settings every command shares.
type globals struct {
	stdout, stderr io.Writer
	// program is how the binary was invoked, for the commands hints
	// suggest (see invokedAs).
	program string
	// started is set once a command's own code runs; errors before that
	// are usage errors.
	started bool
	// retentionSet is true when --max-age, --max-bytes or --replicas was
	// given (by flag, environment or config file).
	retentionSet bool

	natsURL string
	// inProcess is the server this process runs (serve), which its own
	// connections reach through memory.
	inProcess nats.InProcessConnProvider
	dataDir   string
	logLevel  string

	user, password, token, creds, nkey string
	tlsCA, tlsCert, tlsKey             string
	signKey, trust                     string

	fsync        bool
	syncInterval time.Duration
	replicas     int
	maxAge       time.Duration
	maxBytes     int64
}

func newRoot(g *globals) *cobra.Command {
	root := &cobra.Command{
		Use:   "loopbus",
		Short: "Run AI-agent pipelines durably as events on NATS JetStream",
		Long: `loopbus runs pipelines of agent steps as an event-sourced system on NATS JetStream.
Without --nats, commands start NATS embedded on the data directory (or use the
server another loopbus command already runs there).`,
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			if err := config.Apply(cmd.Root().PersistentFlags(), cmd.Flags()); err != nil {
				return usageErr(err)
			}
			if g.logLevel != "" {
				if _, err := zerolog.ParseLevel(g.logLevel); err != nil || g.logLevel == "" {
					return usageErr(fmt.Errorf("--log-level %q: want debug, info, warn or error", g.logLevel))
				}
			}
			for _, name := range []string{"max-age", "max-bytes", "replicas"} {
				if f := cmd.Flags().Lookup(name); f != nil && f.Changed {
					g.retentionSet = true
				}
			}
			g.started = true
			return nil
		},
	}
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageErr(err) })
	pf := root.PersistentFlags()
	pf.StringVar(&g.natsURL, "nats", "", "NATS server URL(s); empty starts NATS embedded on --data (env LOOPBUS_NATS_URL)")
	pf.StringVar(&g.dataDir, "data", config.DefaultDataDir(), "data directory of the embedded NATS server (env LOOPBUS_DATA)")
	pf.StringVar(&g.logLevel, "log-level", "", "log level: debug, info, warn, error (default info for services, warn for run)")
	pf.StringVar(&g.user, "user", "", "NATS user")
	pf.StringVar(&g.password, "password", "", "NATS password")
	pf.StringVar(&g.token, "token", "", "NATS token")
	pf.StringVar(&g.creds, "creds", "", "NATS credentials file (JWT + nkey)")
	pf.StringVar(&g.nkey, "nkey", "", "NATS nkey seed file")
	pf.StringVar(&g.tlsCA, "tls-ca", "", "CA certificate to verify the NATS server")
	pf.StringVar(&g.tlsCert, "tls-cert", "", "client certificate for mutual TLS")
	pf.StringVar(&g.tlsKey, "tls-key", "", "client key for mutual TLS")
	pf.StringVar(&g.signKey, "sign-key", "", "nkey user seed file: sign every event this command publishes (loopbus keygen makes one)")
	pf.StringVar(&g.trust, "trust", "", "trust file (role: [public keys]): accept only events signed by a key whose role may state them")
	pf.BoolVar(&g.fsync, "fsync", true, "embedded server: fsync every write before acknowledging it (--fsync=false flushes every --sync-interval)")
	pf.DurationVar(&g.syncInterval, "sync-interval", 0, "embedded server with --fsync=false: flush interval (default 2m)")
	pf.IntVar(&g.replicas, "replicas", 1, "replicas of the stream and buckets (1 to 5; above 1 needs a NATS cluster)")
	pf.DurationVar(&g.maxAge, "max-age", 0, "retention: drop events older than this (0 keeps them forever)")
	pf.Int64Var(&g.maxBytes, "max-bytes", 0, "retention: maximum stream size in bytes (0 is unlimited)")

	root.AddCommand(
		newRunCmd(g), newWaitCmd(g), newStatusCmd(g), newEventsCmd(g), newReplayCmd(g), newExportCmd(g),
		newServeCmd(g), newNatsCmd(g), newServiceCmd(g, "orchestrator"), newAgentworkerCmd(g),
		newServiceCmd(g, "validator"), newProjectorCmd(g), newDoctorCmd(g), newDLQCmd(g), newSignalCmd(g), newApproveCmd(g), newRejectCmd(g), newWatchCmd(g),
		newHooksCmd(g), newTasksCmd(g), newSessionsCmd(g), newPullCmd(g), newKeygenCmd(g), newDashboardCmd(g),
		newBudgetCmd(g), newCloseCmd(g), newRerunCmd(g), newImportCmd(g), newResumeCmd(g), newForkCmd(g),
	)
	groupCommands(root)
	return root
}

// commandGroups sorts the commands in --help by what they are for, as gh
// and kubectl do; each command is in one group.
func commandGroups() []struct {
	group    cobra.Group
	commands []string
} {
	return []struct {
		group    cobra.Group
		commands []string
	}{
		{cobra.Group{ID: "work", Title: "Start work:"}, []string{"run", "wait", "resume", "rerun", "fork", "import", "pull"}},
		{cobra.Group{ID: "steer", Title: "Steer a session:"}, []string{"signal", "approve", "reject", "budget", "close"}},
		{cobra.Group{ID: "look", Title: "Follow and inspect:"}, []string{"watch", "status", "sessions", "events", "tasks", "replay", "export", "doctor", "dlq"}},
		{cobra.Group{ID: "services", Title: "Run the services:"}, []string{"serve", "nats", "orchestrator", "agentworker", "validator", "projector", "hooks", "dashboard"}},
		{cobra.Group{ID: "setup", Title: "Keys and help:"}, []string{"keygen"}},
	}
}

// groupCommands puts root's commands in their groups (commandGroups);
// help and completion go with the keys.
func groupCommands(root *cobra.Command) {
	byName := map[string]*cobra.Command{}
	for _, c := range root.Commands() {
		byName[c.Name()] = c
	}
	for _, g := range commandGroups() {
		root.AddGroup(&g.group)
		for _, name := range g.commands {
			if c := byName[name]; c != nil {
				c.GroupID = g.group.ID
			}
		}
	}
	root.SetHelpCommandGroupID("setup")
	root.SetCompletionCommandGroupID("setup")
}

func (g *globals) logger(defaultLevel zerolog.Level) zerolog.Logger {
	lvl := defaultLevel
	if g.logLevel != "" {
		if l, err := zerolog.ParseLevel(g.logLevel); err == nil {
			lvl = l
		}
	}
	var w io.Writer = g.stderr
	if f, ok := g.stderr.(*os.File); ok && isatty.IsTerminal(f.Fd()) {
		w = zerolog.ConsoleWriter{Out: g.stderr, TimeFormat: "15:04:05"}
	}
	return zerolog.New(w).Level(lvl).With().Timestamp().Logger()
}

// busConfig: long-running services retry the connection forever and may
// change retention; commands a person waits on give up after a while.
func (g *globals) busConfig(name string, service bool) bus.Config {
	cfg := bus.Config{
		URL: g.natsURL, InProcess: g.inProcess, Name: name,
		User: g.user, Password: g.password, Token: g.token, CredsFile: g.creds, NKeyFile: g.nkey,
		TLSCA: g.tlsCA, TLSCert: g.tlsCert, TLSKey: g.tlsKey,
		SignKeyFile: g.signKey, TrustFile: g.trust,
		Replicas: g.replicas, MaxAge: g.maxAge, MaxBytes: g.maxBytes,
	}
	if service {
		cfg.Reconfigure = g.retentionSet
	} else {
		cfg.ConnectTimeout, cfg.GiveUpAfter, cfg.AnswerTimeout = 10*time.Second, 30*time.Second, 20*time.Second
	}
	return cfg
}

func (g *globals) embeddedConfig(listen string) bus.EmbeddedConfig {
	return bus.EmbeddedConfig{
		DataDir: g.dataDir, Listen: listen, RelaxedSync: !g.fsync, SyncInterval: g.syncInterval,
		User: g.user, Password: g.password, Token: g.token,
	}
}

// disconnect closes c; an embedded server this command started keeps
// serving other commands on its data directory until they finish or a
// signal comes.
func (g *globals) disconnect(c *serve.Conn) {
	ctx, stop := notifyContext(context.Background())
	defer stop()
	c.Close(ctx, func() {
		fmt.Fprintf(g.stderr, "other loopbus commands still use this data directory's server; serving until they finish (Ctrl-C to stop now)\n")
	})
}

// connect opens the bus: to --nats if given, else to the server on the data
// directory, starting one embedded if none runs. service selects the
// connection behaviour of long-running services (see busConfig).
func (g *globals) connect(ctx context.Context, name string, log zerolog.Logger, service bool) (*serve.Conn, error) {
	return serve.Open(ctx, g.busConfig(name, service), g.embeddedConfig(""), serve.SourceName(name), log)
}

// notifyContext is ctx ended also by SIGINT or SIGTERM.
func notifyContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
}
