package tui

import (
	"fmt"
	"io"
	"strings"
)

// ServeBanner is what serve tells a person once it is up: where NATS, the
// dashboard and the metrics are, and how to give it work.
type ServeBanner struct {
	// NATS is the server's URL; Embedded says serve runs it, on Data.
	NATS     string
	Embedded bool
	Data     string
	// Dashboard and Metrics are URLs; empty when not served (NoDashboard
	// says why, e.g. "address taken").
	Dashboard, Metrics string
	NoDashboard        string
	// Workers is the agent worker's job slots (0: none runs here) and
	// Lanes its lanes.
	Workers int
	Lanes   []string
	// Run is the command that submits work to this process, e.g.
	// "bin/loopbus run PIPELINE.yaml --input FILE".
	Run string
}

// Write writes the banner as a few aligned lines.
func (b ServeBanner) Write(w io.Writer) {
	var s strings.Builder
	s.WriteString("loopbus is serving (Ctrl-C stops it)\n")
	line := func(k, v string) { fmt.Fprintf(&s, "  %-10s %s\n", k+":", v) }
	nats := b.NATS
	if b.Embedded {
		nats += " (embedded; data in " + b.Data + ")"
	}
	line("NATS", nats)
	switch {
	case b.Dashboard != "":
		line("dashboard", b.Dashboard)
	case b.NoDashboard != "":
		line("dashboard", "not served: "+b.NoDashboard)
	}
	if b.Metrics != "" {
		line("metrics", b.Metrics)
	}
	if b.Workers > 0 {
		lanes := "every lane"
		if len(b.Lanes) > 0 {
			lanes = "lanes " + strings.Join(b.Lanes, ", ")
		}
		line("workers", fmt.Sprintf("%s at once, %s", Plural(b.Workers, "job"), lanes))
	} else {
		line("workers", "none here: jobs wait for an agentworker")
	}
	if b.Run != "" {
		line("run work", b.Run)
	}
	_, _ = io.WriteString(w, s.String())
}
