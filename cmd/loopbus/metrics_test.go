package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/loopbus/loopbus/internal/testnats"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

func TestMetricsFlagOnServiceCommands(t *testing.T) {
	root := newRoot(&globals{stdout: io.Discard, stderr: io.Discard})
	for _, name := range []string{"serve", "orchestrator", "agentworker", "validator", "projector"} {
		cmd, _, err := root.Find([]string{name})
		if err != nil {
			t.Fatal(err)
		}
		if f := cmd.Flags().Lookup("metrics"); f == nil || f.DefValue != "" {
			t.Errorf("%s: --metrics %v, want a flag off by default", name, f)
		}
	}
	var stderr bytes.Buffer
	if code := execute([]string{"validator", "--metrics", "no-port"}, io.Discard, &stderr); code != exitUsage || !strings.Contains(stderr.String(), "--metrics") {
		t.Errorf("--metrics no-port: exit %d, %q; want a usage error naming the flag", code, stderr.String())
	}
}

// TestServiceCommandServesMetrics runs `validator --metrics 127.0.0.1:0`,
// finds the address in its log and scrapes it.
func TestServiceCommandServesMetrics(t *testing.T) {
	srv := testnats.Server(t)
	stderr := &testnats.SyncBuffer{}
	root := newRoot(&globals{stdout: io.Discard, stderr: stderr})
	root.SetArgs([]string{"validator", "--nats", srv.URL(), "--metrics", "127.0.0.1:0", "--log-level", "info"})
	root.SetOut(io.Discard)
	root.SetErr(stderr)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	run, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- root.ExecuteContext(run) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("validator: %v", err)
		}
	}()

	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	var url string
	var err error
	for {
		if url == "" {
			url, err = loggedMetricsURL(stderr.String())
		}
		if url != "" {
			err = validatorCounted(url)
			if err == nil {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%v; log:\n%s", err, stderr.String())
		}
		select {
		case <-tick.C:
		case err := <-done:
			t.Fatalf("validator ended: %v; log:\n%s", err, stderr.String())
		}
	}
}

// loggedMetricsURL finds the /metrics address in a service's JSON log.
func loggedMetricsURL(log string) (string, error) {
	sc := bufio.NewScanner(strings.NewReader(log))
	for sc.Scan() {
		var line struct {
			Service, Addr, Message string
		}
		if json.Unmarshal(sc.Bytes(), &line) == nil && line.Message == "serving /metrics" && line.Service == "metrics" {
			return "http://" + line.Addr + "/metrics", nil
		}
	}
	return "", errors.New("no address of /metrics logged")
}

// validatorCounted scrapes url and checks that JetStream answered and the
// validator's durable consumer is counted.
func validatorCounted(url string) error {
	resp, err := http.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return err
	}
	if up := fams["loopbus_jetstream_up"].GetMetric(); len(up) != 1 || up[0].GetGauge().GetValue() != 1 {
		return fmt.Errorf("loopbus_jetstream_up %v", up)
	}
	for _, m := range fams["loopbus_consumer_pending_messages"].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "consumer" && l.GetValue() == "validator" {
				return nil
			}
		}
	}
	return errors.New("the validator's consumer is not counted")
}
