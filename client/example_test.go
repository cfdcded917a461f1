package client_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/client"
	"github.com/loopbus/loopbus/definition"
	"github.com/loopbus/loopbus/projections"
	"github.com/loopbus/loopbus/schemas"
	"github.com/loopbus/loopbus/serve"
	"github.com/rs/zerolog"
)

// Example runs the whole of loopbus in this process (an embedded NATS
// server with every service), submits the writing-kit example pipeline and
// follows the session to its end, printing each completed step. With a
// server already running (loopbus serve, or a NATS cluster with the
// services), skip serve.Start and Dial its URL.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	dir, err := os.MkdirTemp("", "loopbus-example-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	node, err := serve.Start(ctx, serve.Config{Embedded: bus.EmbeddedConfig{DataDir: filepath.Join(dir, "data")}}, zerolog.Nop())
	if err != nil {
		log.Fatal(err)
	}
	defer node.Close()

	c, err := client.Dial(ctx, bus.Config{URL: node.URL()})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	p, err := definition.Load("../examples/writing-kit/pipeline.yaml")
	if err != nil {
		log.Fatal(err)
	}
	session, err := c.Submit(ctx, p, "../examples/writing-kit/article.md", client.SubmitOptions{Session: "kit-example"})
	if err != nil {
		log.Fatal(err)
	}
	m, err := c.Follow(ctx, session, func(ev schemas.Event, _ *projections.Manifest) {
		if ev.Type == schemas.TypeStepCompleted {
			fmt.Println("step completed:", ev.Step)
		}
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("session", session, m.Status)
	paths, err := c.WriteFinal(ctx, m, filepath.Join(dir, "out"))
	if err != nil {
		log.Fatal(err)
	}
	for _, p := range paths {
		fmt.Println("final artifact:", filepath.Base(p))
	}
	// Output:
	// step completed: summary
	// step completed: ideas
	// step completed: writing-kit
	// session kit-example completed
	// final artifact: writing-kit.json
}
