package bus_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/internal/testnats"
	"github.com/loopbus/loopbus/schemas"
	"github.com/nats-io/nats.go"
)

// TestForkCopies: a copy in a fork's history (ForkOf set) lies on the
// session's history subject and round-trips with its forkof extension; it
// is trusted as the roles that may fork are (a client's copy of a job
// request is accepted there, a worker's is not), and it cannot be moved to
// the live subject, nor a live event to the history one. Consumers of live
// subjects never see copies.
func TestForkCopies(t *testing.T) {
	t.Parallel()
	srv := testnats.Server(t)
	dir := t.TempDir()
	clientSeed, clientPub := signKey(t, dir, "client")
	workerSeed, workerPub := signKey(t, dir, "worker")
	trust := writeFile(t, dir, "trust.yaml", []byte("client: ["+clientPub+"]\nagentworker: ["+workerPub+"]\n"))
	forker := signedBus(t, srv.URL(), "test/client", clientSeed, "")
	worker := signedBus(t, srv.URL(), "test/worker", workerSeed, "")
	reader := signedBus(t, srv.URL(), "test/reader", "", trust)

	copyOf := func(ev schemas.Event) schemas.Event {
		ev.ForkOf, ev.ID, ev.Session = ev.ID, "copy-"+ev.ID, "f1"
		return ev
	}
	encode := func(b *bus.Bus, ev schemas.Event) *nats.Msg {
		t.Helper()
		m, err := b.Encode(ev)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	req := copyOf(jobRequested("s1", "e1"))
	m := encode(forker, req)
	if m.Subject != "loopbus.evt.f1.history.job.requested" {
		t.Fatalf("a copy is published on %s", m.Subject)
	}
	ev, err := reader.Decode(m.Subject, m.Header, m.Data)
	if err != nil || ev.ForkOf != "e1" || ev.Type != schemas.TypeJobRequested || ev.Signer != clientPub {
		t.Fatalf("decoded %+v, %v", ev, err)
	}
	for _, tc := range []struct {
		name, subject string
		msg           *nats.Msg
		want          string
	}{
		{"a worker's copy", "", encode(worker, copyOf(jobStarted("s1", "e2"))), "only client may state it"},
		{"a copy on the live subject", "loopbus.evt.f1.job.requested", m, "belongs on"},
		{"a live event on the history subject", "loopbus.evt.f1.history.job.started", encode(worker, schemas.Event{ID: "e3", Type: schemas.TypeJobStarted, Session: "f1", Step: "plan", Job: "j",
			Data: &schemas.JobStarted{JobID: "j", Worker: "w1", Delivery: 1}}), "belongs on"},
		{"a client's live job request", "", encode(forker, jobRequested("f1", "e4")), "only orchestrator may state it"},
	} {
		subject := tc.subject
		if subject == "" {
			subject = tc.msg.Subject
		}
		if _, err := reader.Decode(subject, tc.msg.Header, tc.msg.Data); err == nil || !errors.Is(err, bus.ErrMalformed) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want refused: %s", tc.name, err, tc.want)
		}
	}

	// Through the stream: a session's whole history has the copy; the
	// job requests workers consume do not.
	publish(t, forker, req)
	publish(t, forker, jobRequested("f1", "live"))
	var all, live []string
	for subject, got := range map[string]*[]string{"loopbus.evt.f1.>": &all, "loopbus.evt.*.job.requested": &live} {
		err := forker.Read(ctxT(t), bus.ReadOptions{Subjects: []string{subject}}, func(ev schemas.Event) error {
			*got = append(*got, ev.ID)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if strings.Join(all, " ") != "copy-e1 live" || strings.Join(live, " ") != "live" {
		t.Errorf("the session's history: %v; the job requests: %v", all, live)
	}
}
