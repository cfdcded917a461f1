package bus_test

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/internal/testnats"
	"github.com/loopbus/loopbus/schemas"
	"github.com/nats-io/nats.go"
)

// signKey makes a seed file in dir and returns its path and public key.
func signKey(t *testing.T, dir, name string) (string, string) {
	t.Helper()
	path := filepath.Join(dir, name+".seed")
	pub, err := bus.NewSignKey(path)
	if err != nil {
		t.Fatal(err)
	}
	return path, pub
}

// signedBus connects to url signing with seed and trusting trust (either
// may be empty).
func signedBus(t *testing.T, url, source, seed, trust string) *bus.Bus {
	t.Helper()
	b, err := bus.Connect(ctxT(t), bus.Config{URL: url, SignKeyFile: seed, TrustFile: trust}, source, catalogue(t), testnats.Logger(t))
	if err != nil {
		t.Fatalf("connect %s: %v", source, err)
	}
	t.Cleanup(b.Close)
	return b
}

// TestSignedEvents: with a trust file, an event is accepted only when it
// is signed by a key trusted for a role that may state its type, and its
// bytes are the signed ones; Event.Signer names the key.
func TestSignedEvents(t *testing.T) {
	t.Parallel()
	srv := testnats.Server(t)
	dir := t.TempDir()
	workerSeed, workerPub := signKey(t, dir, "worker")
	orchSeed, orchPub := signKey(t, dir, "orch")
	strangerSeed, _ := signKey(t, dir, "stranger")
	trust := writeFile(t, dir, "trust.yaml", []byte("# who may state what\norchestrator: ["+orchPub+"]\nagentworker:\n  - "+workerPub+"  # host-1\n"))

	worker := signedBus(t, srv.URL(), "test/worker", workerSeed, "")
	orch := signedBus(t, srv.URL(), "test/orch", orchSeed, "")
	stranger := signedBus(t, srv.URL(), "test/stranger", strangerSeed, "")
	unsigned := signedBus(t, srv.URL(), "test/unsigned", "", "")
	reader := signedBus(t, srv.URL(), "test/reader", "", trust)

	encode := func(b *bus.Bus, ev schemas.Event) *nats.Msg {
		t.Helper()
		m, err := b.Encode(ev)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	altered := encode(worker, jobStarted("s1", "e5"))
	altered.Data = []byte(strings.Replace(string(altered.Data), `"w1"`, `"w2"`, 1))
	moved := encode(worker, jobStarted("s1", "e6"))
	swapped := encode(worker, jobStarted("s1", "e7"))
	swapped.Header.Set(bus.HeaderSigner, orchPub) // claims the orchestrator signed it

	tests := []struct {
		name       string
		msg        *nats.Msg
		subject    string // default msg.Subject
		wantSigner string
		wantErr    string
	}{
		{name: "worker states job.started", msg: encode(worker, jobStarted("s1", "e1")), wantSigner: workerPub},
		{name: "orchestrator states job.requested", msg: encode(orch, jobRequested("s1", "e2")), wantSigner: orchPub},
		{name: "worker may not request a job", msg: encode(worker, jobRequested("s1", "e3")), wantErr: "only orchestrator may state it"},
		{name: "unsigned", msg: encode(unsigned, jobStarted("s1", "e4")), wantErr: "not signed"},
		{name: "a key the file does not list", msg: encode(stranger, jobStarted("s1", "e8")), wantErr: "does not list"},
		{name: "altered after signing", msg: altered, wantErr: "does not match"},
		{name: "another key's name on the signature", msg: swapped, wantErr: "only agentworker may state it"},
		{name: "moved to another session's subject", msg: moved, subject: "loopbus.evt.s2.job.started", wantErr: "belongs on"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			subject := tt.msg.Subject
			if tt.subject != "" {
				subject = tt.subject
			}
			ev, err := reader.Decode(subject, tt.msg.Header, tt.msg.Data)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				if ev.Signer != tt.wantSigner {
					t.Errorf("Signer %q, want %q", ev.Signer, tt.wantSigner)
				}
				return
			}
			if err == nil || !errors.Is(err, bus.ErrMalformed) || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("got %v, want a malformed-event error saying %q", err, tt.wantErr)
			}
		})
	}
	// A role swap within the trusted keys is caught by the signature.
	swappedOK := encode(orch, jobRequested("s1", "e9"))
	swappedOK.Header.Set(bus.HeaderSigner, workerPub)
	if _, err := reader.Decode(swappedOK.Subject, swappedOK.Header, swappedOK.Data); err == nil {
		t.Error("an event signed by one key but naming another was accepted")
	}

	// Without a trust file, signed events read as before, with no Signer.
	ev, err := unsigned.Decode("loopbus.evt.s1.job.started", encode(worker, jobStarted("s1", "e1")).Header, encode(worker, jobStarted("s1", "e1")).Data)
	if err != nil || ev.Signer != "" {
		t.Errorf("without trust: %v, signer %q", err, ev.Signer)
	}

	// Through the stream: Read delivers the trusted event and skips the rest.
	publish(t, worker, jobStarted("s3", "r1"))
	publish(t, unsigned, jobStarted("s3", "r2"))
	publish(t, worker, jobRequested("s3", "r3"))
	var got []string
	var skipped int
	err = reader.Read(ctxT(t), bus.ReadOptions{Subjects: []string{"loopbus.evt.s3.>"}, OnSkip: func(string, uint64) { skipped++ }}, func(ev schemas.Event) error {
		got = append(got, ev.ID+"/"+bus.ShortKey(ev.Signer))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := "r1/" + bus.ShortKey(workerPub); len(got) != 1 || got[0] != want || skipped != 2 {
		t.Errorf("read %v (skipped %d), want [%s] and 2 skipped", got, skipped, want)
	}
}

// TestTrustFileErrors: a bad trust file is refused at connect time with
// the file, line and what is wrong.
func TestTrustFileErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	_, pub := signKey(t, dir, "k")
	tests := []struct{ name, text, want string }{
		{name: "unknown role", text: "orchestrator: [" + pub + "]\nworkers: [" + pub + "]\n", want: ":2: unknown role \"workers\""},
		{name: "not a key", text: "agentworker:\n  - " + pub + "\n  - SUAEXAMPLE\n", want: ":3: agentworker: \"SUAEXAMPLE\" is not an nkey user public key"},
		{name: "a seed by mistake", text: "client: [" + strings.Replace(pub, "U", "S", 1) + "]\n", want: "is not an nkey user public key"},
		{name: "not a list", text: "client: " + pub + "\n", want: ":1: client: want a list"},
		{name: "empty", text: "# nothing\n", want: "want one YAML mapping"},
		{name: "no keys", text: "client: []\n", want: "lists no key"},
		{name: "not YAML", text: "client: [\n", want: "trust file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := writeFile(t, t.TempDir(), "trust.yaml", []byte(tt.text))
			_, err := bus.LoadTrust(path)
			if err == nil || !errors.Is(err, bus.ErrConfig) || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), "trust.yaml") {
				t.Errorf("got %v, want an error naming trust.yaml and saying %q", err, tt.want)
			}
		})
	}
	if _, err := bus.LoadSignKey(writeFile(t, dir, "bad.seed", []byte("not a seed\n"))); err == nil || !errors.Is(err, bus.ErrConfig) {
		t.Errorf("a bad seed file: %v", err)
	}
	if _, err := bus.Connect(ctxT(t), bus.Config{URL: "nats://127.0.0.1:1", TrustFile: filepath.Join(dir, "missing.yaml")}, "test", catalogue(t), testnats.Logger(t)); err == nil || !errors.Is(err, bus.ErrConfig) {
		t.Errorf("connect with a missing trust file: %v, want ErrConfig before dialling", err)
	}
}

// TestEveryTypeHasPublishers: each event type of the catalogue names the
// roles that state it, so a trust file can admit it.
func TestEveryTypeHasPublishers(t *testing.T) {
	for _, typ := range catalogue(t).Types() {
		if len(schemas.Publishers(typ)) == 0 {
			t.Errorf("%s: no role may publish it", typ)
		}
	}
}
