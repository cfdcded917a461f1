package bus_test

import (
	"bytes"
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/internal/testnats"
	"github.com/loopbus/loopbus/schemas"
)

func TestArtifactRoundTrip(t *testing.T) {
	t.Parallel()
	b, _ := testnats.Bus(t)
	ctx := ctxT(t)
	payload := make([]byte, 3<<20+12345) // crosses many 128 KiB chunks
	if _, err := rand.Read(payload); err != nil {
		t.Fatal(err)
	}

	ref, err := b.PutArtifact(ctx, "s1/draft/report.json", "report.json", bytes.NewReader(payload))
	if err != nil {
		t.Fatalf("PutArtifact: %v", err)
	}
	// The key is the caller's plus a random suffix.
	if !strings.HasPrefix(ref.Object, "s1/draft/report.json~") || len(ref.Object) < len("s1/draft/report.json~")+16 {
		t.Errorf("object key %q, want s1/draft/report.json~<random>", ref.Object)
	}
	want := schemas.ArtifactRef{
		Name: "report.json", Object: ref.Object,
		Digest: schemas.Digest(payload), Size: int64(len(payload)), ContentType: "application/json",
	}
	if ref != want {
		t.Errorf("ref %+v, want %+v", ref, want)
	}

	var buf bytes.Buffer
	if err := b.GetArtifact(ctx, ref, &buf); err != nil {
		t.Fatalf("GetArtifact: %v", err)
	}
	if !bytes.Equal(buf.Bytes(), payload) {
		t.Errorf("read %d bytes that differ from the %d stored", buf.Len(), len(payload))
	}

	path := filepath.Join(t.TempDir(), "report.json")
	if err := b.GetArtifactFile(ctx, ref, path); err != nil {
		t.Fatalf("GetArtifactFile: %v", err)
	}
	got, err := os.ReadFile(path)
	if err != nil || !bytes.Equal(got, payload) {
		t.Errorf("file content differs (%v)", err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("file mode %v, %v; want 0600", fi.Mode().Perm(), err)
	}

	// Re-putting a key (a job run again) stores another artifact under
	// another key; the first one is still there, unchanged.
	ref2, err := b.PutArtifact(ctx, "s1/draft/report.json", "report.json", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	if ref2.Size != 2 || ref2.Digest != schemas.Digest([]byte("{}")) || ref2.Object == ref.Object {
		t.Errorf("second ref %+v (first %s)", ref2, ref.Object)
	}
	buf.Reset()
	if err := b.GetArtifact(ctx, ref, &buf); err != nil || !bytes.Equal(buf.Bytes(), payload) {
		t.Errorf("first ref after a second put: %v (%d bytes)", err, buf.Len())
	}
	buf.Reset()
	if err := b.GetArtifact(ctx, ref2, &buf); err != nil || buf.String() != "{}" {
		t.Errorf("second ref: %q, %v", buf.String(), err)
	}
}

func TestArtifactContentType(t *testing.T) {
	t.Parallel()
	b, _ := testnats.Bus(t)
	tests := []struct {
		name string
		want string
	}{
		{name: "data.json", want: "application/json"},
		{name: "blob.unknownext", want: "application/octet-stream"},
		{name: "noext", want: "application/octet-stream"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ref, err := b.PutArtifact(ctxT(t), "s1/ct/"+tt.name, tt.name, strings.NewReader("x"))
			if err != nil {
				t.Fatal(err)
			}
			if ref.ContentType != tt.want {
				t.Errorf("content type %q, want %q", ref.ContentType, tt.want)
			}
		})
	}
}

func TestArtifactErrors(t *testing.T) {
	t.Parallel()
	b, _ := testnats.Bus(t)
	ctx := ctxT(t)
	content := []byte("hello, artifact")
	ref, err := b.PutArtifact(ctx, "s1/step/a.txt", "a.txt", bytes.NewReader(content))
	if err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name    string
		ref     func(schemas.ArtifactRef) schemas.ArtifactRef
		wantErr error
	}{
		{name: "intact", ref: func(r schemas.ArtifactRef) schemas.ArtifactRef { return r }},
		{name: "missing object", ref: func(r schemas.ArtifactRef) schemas.ArtifactRef { r.Object = "s1/step/nope.txt"; return r }, wantErr: bus.ErrNotFound},
		{name: "wrong digest", ref: func(r schemas.ArtifactRef) schemas.ArtifactRef { r.Digest = schemas.Digest([]byte("other")); return r }, wantErr: bus.ErrDigestMismatch},
		{name: "wrong size", ref: func(r schemas.ArtifactRef) schemas.ArtifactRef { r.Size++; return r }, wantErr: bus.ErrDigestMismatch},
		{name: "empty digest", ref: func(r schemas.ArtifactRef) schemas.ArtifactRef { r.Digest = ""; return r }, wantErr: bus.ErrDigestMismatch},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := tt.ref(ref)
			var buf bytes.Buffer
			err := b.GetArtifact(ctx, r, &buf)
			if !errors.Is(err, tt.wantErr) || (tt.wantErr == nil && err != nil) {
				t.Fatalf("GetArtifact = %v, want %v", err, tt.wantErr)
			}

			dir := t.TempDir()
			path := filepath.Join(dir, "a.txt")
			err = b.GetArtifactFile(ctx, r, path)
			if !errors.Is(err, tt.wantErr) || (tt.wantErr == nil && err != nil) {
				t.Fatalf("GetArtifactFile = %v, want %v", err, tt.wantErr)
			}
			entries, _ := os.ReadDir(dir)
			if tt.wantErr != nil && len(entries) != 0 {
				t.Errorf("a failed GetArtifactFile left %v behind", entries)
			}
			if tt.wantErr == nil {
				if got, err := os.ReadFile(path); err != nil || !bytes.Equal(got, content) || len(entries) != 1 {
					t.Errorf("file %q, %v; dir %v", got, err, entries)
				}
			}
		})
	}

	// A failed fetch does not clobber an existing file.
	dir := t.TempDir()
	path := filepath.Join(dir, "a.txt")
	if err := os.WriteFile(path, []byte("previous"), 0o600); err != nil {
		t.Fatal(err)
	}
	bad := ref
	bad.Digest = schemas.Digest([]byte("other"))
	if err := b.GetArtifactFile(ctx, bad, path); !errors.Is(err, bus.ErrDigestMismatch) {
		t.Fatalf("GetArtifactFile = %v", err)
	}
	if got, _ := os.ReadFile(path); string(got) != "previous" {
		t.Errorf("existing file became %q", got)
	}
}

func TestPutArtifactUnsafeName(t *testing.T) {
	t.Parallel()
	b, _ := testnats.Bus(t)
	ctx := ctxT(t)
	for _, name := range []string{"", ".", "..", "../etc/passwd", "a/b.txt", `a\b.txt`, "-rf", "semi;colon", "sp ace", strings.Repeat("n", 129)} {
		t.Run(name, func(t *testing.T) {
			obj := "s1/unsafe/" + strings.NewReplacer("/", "_", "\\", "_").Replace(name) + "x"
			_, err := b.PutArtifact(ctx, obj, name, strings.NewReader("data"))
			if !errors.Is(err, schemas.ErrBadName) {
				t.Fatalf("PutArtifact(%q) = %v, want ErrBadName", name, err)
			}
			if st := streamState(t, b, bus.DefaultArtifactsBucket); st.Msgs != 0 {
				t.Errorf("the artifact stream holds %d messages after refusals, want none", st.Msgs)
			}
		})
	}
}

type testView struct {
	Session string         `json:"session"`
	Steps   []string       `json:"steps"`
	Counts  map[string]int `json:"counts"`
	Done    bool           `json:"done"`
}

func TestViews(t *testing.T) {
	t.Parallel()
	b, _ := testnats.Bus(t)
	ctx := ctxT(t)
	want := testView{Session: "s1", Steps: []string{"plan", "write"}, Counts: map[string]int{"plan": 2}, Done: true}
	if err := b.PutView(ctx, "session.s1", want); err != nil {
		t.Fatalf("PutView: %v", err)
	}
	var got testView
	if err := b.GetView(ctx, "session.s1", &got); err != nil {
		t.Fatalf("GetView: %v", err)
	}
	if got.Session != want.Session || len(got.Steps) != 2 || got.Counts["plan"] != 2 || !got.Done {
		t.Errorf("view %+v, want %+v", got, want)
	}

	// A second put replaces the view.
	want.Done = false
	if err := b.PutView(ctx, "session.s1", want); err != nil {
		t.Fatal(err)
	}
	got = testView{}
	if err := b.GetView(ctx, "session.s1", &got); err != nil || got.Done {
		t.Errorf("view after update %+v, %v", got, err)
	}

	tests := []struct {
		name    string
		key     string
		put     any
		wantErr error
	}{
		{name: "missing key", key: "session.nobody", wantErr: bus.ErrNotFound},
		{name: "unmarshalable view", key: "session.bad", put: func() {}},
		{name: "invalid key", key: "bad key*", put: want},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.put != nil {
				if err := b.PutView(ctx, tt.key, tt.put); err == nil {
					t.Fatalf("PutView(%q) succeeded", tt.key)
				}
			}
			var v testView
			err := b.GetView(ctx, tt.key, &v)
			if err == nil {
				t.Fatalf("GetView(%q) succeeded", tt.key)
			}
			if tt.wantErr != nil && !errors.Is(err, tt.wantErr) {
				t.Errorf("GetView(%q) = %v, want %v", tt.key, err, tt.wantErr)
			}
		})
	}
}

func TestSeqsAndGetEvent(t *testing.T) {
	t.Parallel()
	b, _ := testnats.Bus(t)
	ctx := ctxT(t)

	if last, err := b.LastSeq(ctx); err != nil || last != 0 {
		t.Errorf("LastSeq of an empty stream = %d, %v; want 0", last, err)
	}
	if last, err := b.SessionLastSeq(ctx, "s1"); err != nil || last != 0 {
		t.Errorf("SessionLastSeq of an empty stream = %d, %v; want 0", last, err)
	}

	s1a := publish(t, b, jobStarted("s1", "a"))
	s2a := publish(t, b, jobRequested("s2", "b"))
	s1b := publish(t, b, jobRequested("s1", "c"))
	s1xa := publish(t, b, jobStarted("s1x", "d"))

	tests := []struct {
		name    string
		session string
		want    uint64
	}{
		{name: "s1", session: "s1", want: s1b},
		{name: "s2", session: "s2", want: s2a},
		{name: "prefix-sharing session", session: "s1x", want: s1xa},
		{name: "unknown", session: "nobody", want: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := b.SessionLastSeq(ctx, tt.session)
			if err != nil || got != tt.want {
				t.Errorf("SessionLastSeq(%s) = %d, %v; want %d", tt.session, got, err, tt.want)
			}
		})
	}
	if last, err := b.LastSeq(ctx); err != nil || last != s1xa {
		t.Errorf("LastSeq = %d, %v; want %d", last, err, s1xa)
	}

	ev, err := b.GetEvent(ctx, s1a)
	if err != nil {
		t.Fatalf("GetEvent: %v", err)
	}
	if ev.ID != "a" || ev.Seq != s1a || ev.Session != "s1" || ev.Type != schemas.TypeJobStarted || ev.Source != b.Source() {
		t.Errorf("GetEvent(%d) = %+v", s1a, ev)
	}
	if d, ok := ev.Data.(*schemas.JobStarted); !ok || d.JobID != "job-a" {
		t.Errorf("data %#v", ev.Data)
	}
	if _, err := b.GetEvent(ctx, 999); err == nil {
		t.Error("GetEvent of a missing seq succeeded")
	}
	bad := publishRaw(t, b, "loopbus.evt.s1.job.started", []byte("junk"))
	if _, err := b.GetEvent(ctx, bad); !errors.Is(err, bus.ErrMalformed) {
		t.Errorf("GetEvent of a malformed message = %v, want ErrMalformed", err)
	}
}

type failingReader struct{ n int }

func (r *failingReader) Read(p []byte) (int, error) {
	if r.n <= 0 {
		return 0, errors.New("disk on fire")
	}
	n := min(len(p), r.n)
	clear(p[:n])
	r.n -= n
	return n, nil
}

// A failed upload leaves no object (and no partial one) behind.
func TestPutArtifactReaderFails(t *testing.T) {
	t.Parallel()
	b, _ := testnats.Bus(t)
	ctx := ctxT(t)
	_, err := b.PutArtifact(ctx, "s1/step/partial.bin", "partial.bin", &failingReader{n: 300 << 10})
	if err == nil || !strings.Contains(err.Error(), "disk on fire") {
		t.Fatalf("PutArtifact with a failing reader = %v", err)
	}
	ref := schemas.ArtifactRef{Name: "partial.bin", Object: "s1/step/partial.bin"}
	if err := b.GetArtifact(ctx, ref, &bytes.Buffer{}); !errors.Is(err, bus.ErrNotFound) {
		t.Errorf("GetArtifact after a failed upload = %v, want ErrNotFound", err)
	}
}
