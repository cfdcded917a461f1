package serve

import (
	"context"
	"time"

	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/schemas"
	"github.com/rs/zerolog"
)

// Conn is an open bus plus the embedded server its opener started, if any.
type Conn struct {
	Bus *bus.Bus
	srv *bus.Embedded
}

// Open connects to cfg.URL when it is set; otherwise to the server that
// serves the data directory of embedded, starting one in this process if
// none runs (see bus.OpenDataDir), and then connecting to it through
// memory (bus.Config.InProcess). The bus publishes as source.
func Open(ctx context.Context, cfg bus.Config, embedded bus.EmbeddedConfig, source string, log zerolog.Logger) (*Conn, error) {
	c := &Conn{}
	if cfg.URL == "" {
		url, srv, err := bus.OpenDataDir(ctx, embedded, log)
		if err != nil {
			return nil, err
		}
		cfg.URL, c.srv = url, srv
		if srv != nil {
			cfg.InProcess = srv.InProcess()
		}
	}
	cat, err := schemas.NewCatalogue()
	if err == nil {
		c.Bus, err = bus.Connect(ctx, cfg, source, cat, log)
	}
	if err != nil {
		if c.srv != nil {
			c.srv.Shutdown()
		}
		return nil, err
	}
	return c, nil
}

// OwnsServer reports whether Open started the NATS server in this process.
func (c *Conn) OwnsServer() bool { return c.srv != nil }

// Close closes the bus. If Open started the embedded server, it keeps
// serving while other loopbus commands on the same data directory are
// still connected (they would lose their server otherwise), calling
// waiting once if it has to wait, until they leave or ctx ends; then it
// stops the server.
func (c *Conn) Close(ctx context.Context, waiting func()) {
	cid, cidErr := c.Bus.Conn().GetClientID()
	c.Bus.Close()
	if c.srv == nil {
		return
	}
	// The server sees this process's own connection go a moment after
	// Close returns (in process: once its reader meets the closed pipe);
	// the clients left after that are other commands'.
	srv := c.srv.Server()
	for cidErr == nil && srv.GetClient(cid) != nil && ctx.Err() == nil {
		select {
		case <-ctx.Done():
		case <-time.After(5 * time.Millisecond):
		}
	}
	told := false
	for srv.NumClients() > 0 && ctx.Err() == nil {
		if !told && waiting != nil {
			waiting()
		}
		told = true
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
	c.srv.Shutdown()
}
