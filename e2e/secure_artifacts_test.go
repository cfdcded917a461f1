package e2e

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/loopbus/loopbus/bus"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// exportedFiles maps the path (under dir) of every exported artifact to
// its bytes.
func exportedFiles(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	files := map[string][]byte{}
	root := filepath.Join(dir, "artifacts")
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		raw, err := os.ReadFile(p)
		files[strings.TrimPrefix(p, root)] = raw
		return err
	})
	if err != nil || len(files) == 0 {
		t.Fatalf("export %s: %d artifacts, %v", dir, len(files), err)
	}
	return files
}

// TestSecureArtifactsWriteOnce runs a session under the example
// configuration's restricted users, then, as the client user, tries to
// replace and to delete the session's stored artifacts: its input (which
// the client itself stored, in chunks), a worker's output in chunks and a
// worker's output small enough to be one message. Publishing over an
// artifact's metadata or one of its chunks is refused by the artifact
// stream (it takes one message per subject); deleting a message, purging,
// deleting or reconfiguring the stream, and writing to the object store
// that earlier releases used, are refused by the server's permissions.
// Nothing in the stream changes, and the session's export still succeeds
// with the original bytes.
func TestSecureArtifactsWriteOnce(t *testing.T) {
	t.Parallel()
	out := newOutputs()
	srv := startSecureNATS(t, out, false)
	url, pw, as := srv.url, srv.pw, srv.as
	srv.provision(t)
	for _, svc := range []string{"orchestrator", "validator", "projector", "agentworker"} {
		out.start(t, svc, nil, as(svc, svc)...)
	}
	pipeline, input := securePipeline(t)
	r := out.result("run", loopbus(t, as("client", "run", pipeline, "--input", input, "--session", "art-1", "--json")...))
	if r.code != 0 {
		t.Fatalf("run as client: exit %d\n%s\nservices:\n%s", r.code, r.stderr, out.all["agentworker"]()+out.all["orchestrator"]()+out.all["validator"]())
	}
	if m := parseManifest(t, r.stdout); m.Status != "completed" {
		t.Fatalf("manifest: %+v", m)
	}
	before := t.TempDir()
	if ex := out.result("export", loopbus(t, as("client", "export", "art-1", "--dir", before)...)); ex.code != 0 {
		t.Fatalf("export as client: exit %d\n%s", ex.code, ex.stderr)
	}
	original := exportedFiles(t, before)

	// The session's artifacts, as its events name them.
	type ref struct {
		Name   string `json:"name"`
		Object string `json:"object"`
		Size   int64  `json:"size"`
	}
	arts := map[string]ref{}
	for _, e := range events(t, as("client"), "art-1") {
		if e.Type != "loopbus.session.started" && e.Type != "loopbus.artifact.stored" {
			continue
		}
		var d struct {
			Input    *ref `json:"input"`
			Artifact *ref `json:"artifact"`
		}
		if err := json.Unmarshal(e.Data, &d); err != nil {
			t.Fatal(err)
		}
		for _, a := range []*ref{d.Input, d.Artifact} {
			if a != nil {
				arts[a.Name] = *a
			}
		}
	}
	for _, name := range []string{"in.txt", "a.txt", "count.json"} {
		if _, ok := arts[name]; !ok {
			t.Fatalf("no artifact %s among %v", name, arts)
		}
	}
	if arts["in.txt"].Size <= bus.ArtifactChunkSize || arts["a.txt"].Size <= bus.ArtifactChunkSize || arts["count.json"].Size > bus.ArtifactChunkSize {
		t.Fatalf("want the input and a.txt in chunks, count.json in one message: %v", arts)
	}

	admin, _ := rawConn(t, url, "admin", pw["admin"])
	js, err := jetstream.New(admin)
	if err != nil {
		t.Fatal(err)
	}
	stream := func() *jetstream.StreamInfo {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		s, err := js.Stream(ctx, "LOOPBUS_ARTIFACTS")
		if err != nil {
			t.Errorf("stream LOOPBUS_ARTIFACTS: %v", err)
			return nil
		}
		return s.CachedInfo()
	}
	startInfo := stream()

	client, refusals := rawConn(t, url, "client", pw["client"])
	// expectRefused: a request the server's permissions refuse gets no
	// answer, only a permissions violation naming the subject.
	expectRefusedMsg := func(t *testing.T, m *nats.Msg) {
		t.Helper()
		if _, err := client.RequestMsg(m, time.Second); err == nil {
			t.Errorf("request on %s was answered", m.Subject)
			return
		}
		want := `Permissions Violation for Publish to "` + m.Subject + `"`
		for {
			select {
			case perr := <-refusals:
				if errors.Is(perr, nats.ErrPermissionViolation) && strings.Contains(perr.Error(), want) {
					return
				}
			case <-time.After(5 * time.Second):
				t.Errorf("no permissions violation reported for %s", m.Subject)
				return
			}
		}
	}
	expectRefused := func(t *testing.T, subject string, data []byte) {
		t.Helper()
		expectRefusedMsg(t, &nats.Msg{Subject: subject, Data: data})
	}
	// expectStoreRefused: a write the client may send but the artifact
	// stream does not store.
	expectStoreRefused := func(t *testing.T, m *nats.Msg) {
		t.Helper()
		resp, err := client.RequestMsg(m, 5*time.Second)
		if err != nil {
			t.Errorf("write to %s: %v (want the stream's refusal)", m.Subject, err)
			return
		}
		var ack struct {
			Seq   uint64 `json:"seq"`
			Error *struct {
				Description string `json:"description"`
			} `json:"error"`
		}
		if err := json.Unmarshal(resp.Data, &ack); err != nil || ack.Error == nil {
			t.Errorf("the stream stored a write to %s (headers %v): %s", m.Subject, m.Header, resp.Data)
		}
	}
	// directGet reads the newest message on a subject of the artifact
	// stream as the client.
	directGet := func(t *testing.T, subject string) *nats.Msg {
		t.Helper()
		m, err := client.Request("$JS.API.DIRECT.GET.LOOPBUS_ARTIFACTS."+subject, nil, 5*time.Second)
		if err != nil {
			t.Fatalf("direct get %s as client: %v", subject, err)
		}
		if m.Header.Get("Nats-Sequence") == "" {
			t.Fatalf("direct get %s as client: %v", subject, m.Header)
		}
		return m
	}

	for _, name := range []string{"in.txt", "a.txt", "count.json"} {
		a := arts[name]
		t.Run("client may not replace or delete "+name, func(t *testing.T) {
			// The object store in which earlier releases kept artifacts
			// (the only one before the write-once stream) is read only:
			// replacing or deleting an object there (metadata with a
			// rollup, marked deleted) is refused.
			oldMeta, _ := json.Marshal(map[string]any{"name": a.Object, "bucket": "LOOPBUS_ARTIFACTS", "nuid": "forged", "size": 12, "chunks": 1,
				"digest": "SHA-256=" + base64.URLEncoding.EncodeToString(make([]byte, 32)), "deleted": true})
			oldSubject := "$O.LOOPBUS_ARTIFACTS.M." + base64.URLEncoding.EncodeToString([]byte(a.Object))
			expectRefused(t, "$O.LOOPBUS_ARTIFACTS.C.forged", []byte("forged bytes"))
			expectRefusedMsg(t, &nats.Msg{Subject: oldSubject, Header: nats.Header{"Nats-Rollup": {"sub"}}, Data: oldMeta})

			// The write-once stream.
			metaSubject := bus.ArtifactMetaSubject(a.Object)
			meta := directGet(t, metaSubject)
			var m struct {
				Chunks  int    `json:"chunks"`
				ChunkID string `json:"chunkId"`
			}
			if err := json.Unmarshal([]byte(meta.Header.Get(bus.HeaderArtifactMeta)), &m); err != nil {
				t.Fatalf("metadata of %s: %v", name, err)
			}
			seq := meta.Header.Get("Nats-Sequence")
			forged := nats.Header{bus.HeaderArtifactMeta: {meta.Header.Get(bus.HeaderArtifactMeta)}}
			// Overwrite the metadata, plainly and by every header that
			// could make a stream drop the stored message.
			for _, h := range []nats.Header{forged, {"Nats-Rollup": {"sub"}}, {"Nats-Rollup": {"all"}}, {"Nats-Expected-Last-Subject-Sequence": {seq}}, {"Nats-TTL": {"1s"}}} {
				expectStoreRefused(t, &nats.Msg{Subject: metaSubject, Header: h, Data: []byte("forged bytes")})
			}
			// Overwrite a chunk.
			if m.Chunks > 0 {
				for _, i := range []string{"0", "1"} {
					chunk := "loopbus.art.c." + m.ChunkID + "." + i
					directGet(t, chunk)
					expectStoreRefused(t, &nats.Msg{Subject: chunk, Data: bytes.Repeat([]byte("x"), bus.ArtifactChunkSize)})
				}
			}
			// Delete it, purge it, or loosen the stream.
			msgDelete, _ := json.Marshal(map[string]any{"seq": json.Number(seq), "no_erase": true})
			purge, _ := json.Marshal(map[string]any{"filter": metaSubject})
			update, _ := json.Marshal(map[string]any{"name": "LOOPBUS_ARTIFACTS", "subjects": []string{"loopbus.art.>"}, "max_msgs_per_subject": 2, "discard": "old", "storage": "file", "num_replicas": 1})
			expectRefused(t, "$JS.API.STREAM.MSG.DELETE.LOOPBUS_ARTIFACTS", msgDelete)
			expectRefused(t, "$JS.API.STREAM.PURGE.LOOPBUS_ARTIFACTS", purge)
			expectRefused(t, "$JS.API.STREAM.PURGE.LOOPBUS_ARTIFACTS", []byte(`{}`))
			expectRefused(t, "$JS.API.STREAM.UPDATE.LOOPBUS_ARTIFACTS", update)
			expectRefused(t, "$JS.API.STREAM.DELETE.LOOPBUS_ARTIFACTS", nil)
		})
	}

	// The session exports as before, with the original bytes.
	after := t.TempDir()
	if ex := out.result("export again", loopbus(t, as("client", "export", "art-1", "--dir", after)...)); ex.code != 0 {
		t.Fatalf("export after the attempts: exit %d\n%s", ex.code, ex.stderr)
	}
	again := exportedFiles(t, after)
	if len(again) != len(original) {
		t.Errorf("export holds %d artifacts, first export %d", len(again), len(original))
	}
	for p, raw := range original {
		if !bytes.Equal(again[p], raw) {
			t.Errorf("exported %s changed: %d bytes, then %d", p, len(raw), len(again[p]))
		}
	}
	in, err := os.ReadFile(input)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for p, raw := range again {
		if filepath.Base(p) == "in.txt" {
			found = true
			if !bytes.Equal(raw, in) {
				t.Errorf("exported input %s differs from the input", p)
			}
		}
	}
	if !found {
		t.Errorf("no in.txt among the exported artifacts %v", again)
	}

	if endInfo := stream(); startInfo != nil && endInfo != nil {
		if endInfo.State.Msgs != startInfo.State.Msgs || endInfo.State.LastSeq != startInfo.State.LastSeq || endInfo.State.Bytes != startInfo.State.Bytes {
			t.Errorf("the artifact stream changed: %+v before the attempts, %+v after", startInfo.State, endInfo.State)
		}
		if c := endInfo.Config; c.MaxMsgsPerSubject != 1 || c.Discard != jetstream.DiscardNew || !c.DiscardNewPerSubject || c.AllowRollup {
			t.Errorf("artifact stream config: %+v", c)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.Stream(ctx, "OBJ_LOOPBUS_ARTIFACTS"); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Errorf("an object store exists: %v", err)
	}

	if d := out.result("client doctor", loopbus(t, as("client", "doctor")...)); d.code != 0 || !strings.Contains(d.stdout, "ok    artifacts") || !strings.Contains(d.stdout, "write-once") {
		t.Errorf("doctor as client: exit %d\n%s%s", d.code, d.stdout, d.stderr)
	}

	out.stopAll()
	for _, svc := range []string{"orchestrator", "validator", "projector", "agentworker"} {
		if log := out.all[svc](); strings.Contains(log, "Permissions Violation") {
			t.Errorf("%s was refused something:\n%s", svc, log)
		}
	}
}
