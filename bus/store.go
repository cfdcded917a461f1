package bus

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"mime"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/loopbus/loopbus/schemas"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ErrNotFound: no such artifact or view.
var ErrNotFound = errors.New("not found")

// ErrDigestMismatch: stored bytes do not match the digest an event names.
var ErrDigestMismatch = errors.New("artifact digest mismatch")

// ErrBadArtifact: what the artifact store holds under a key is not an
// artifact loopbus wrote (unreadable metadata, chunks missing or of the
// wrong size). It matches ErrDigestMismatch too: either way the bytes an
// event names cannot be had.
var ErrBadArtifact error = badArtifact{}

type badArtifact struct{}

func (badArtifact) Error() string        { return "malformed artifact" }
func (badArtifact) Is(target error) bool { return target == ErrDigestMismatch }

// ErrNotWriteOnce: the artifact stream was changed to take more than one
// message per subject, and took some.
var ErrNotWriteOnce = errors.New("the artifact stream is not write-once")

// ErrArtifactExists: a write to the artifact store found its subject
// already written by someone else, so nothing was stored. Every artifact
// subject takes one message, ever.
var ErrArtifactExists = errors.New("artifact subject already written")

// Artifact store layout. Artifacts live in the stream Config.ArtifactsBucket
// (LOOPBUS_ARTIFACTS), which takes at most one message per subject and
// refuses the next (discard new per subject): whatever is written there is
// never replaced, by anyone; only an admin may delete it. An artifact is a
// metadata message on ArtifactMetaSubject(key): its header
// HeaderArtifactMeta holds the metadata (JSON: key, name, size, digest,
// chunks) and its body the artifact's bytes if they fit one chunk. Larger
// artifacts are in chunks on loopbus.art.c.<chunk id>.<index> (0, 1, …),
// each ArtifactChunkSize bytes but the last. Chunks are written first, the
// metadata last, so an artifact whose metadata can be read is complete.
const (
	// ArtifactSubjects are the subjects of the artifact stream.
	ArtifactSubjects = "loopbus.art.>"
	// HeaderArtifactMeta is the header of a metadata message.
	HeaderArtifactMeta = "Loopbus-Artifact"
	// ArtifactChunkSize is the size of a chunk, and the largest artifact
	// stored inside its metadata.
	ArtifactChunkSize = 128 << 10
	// MaxArtifactKey bounds the key a caller gives PutArtifact (the stored
	// key adds a random suffix to it).
	MaxArtifactKey = 1024

	artifactMetaPrefix  = "loopbus.art.m."
	artifactChunkPrefix = "loopbus.art.c."
	// maxRefObject bounds an object key read from an event: longer ones
	// cannot have been stored (and their subjects would exceed what a
	// connection may send).
	maxRefObject = 2 * MaxArtifactKey
	// putWindow bounds the chunks a put has in flight (unacknowledged),
	// getWindow those a get has requested.
	putWindow = 32
	getWindow = 16
	// Bounds on the chunk size metadata may declare.
	minChunkSize = 1 << 10
	maxChunkSize = 8 << 20
)

// ArtifactMetaSubject is the subject of the metadata of the artifact
// stored under key (ArtifactRef.Object).
func ArtifactMetaSubject(key string) string {
	return artifactMetaPrefix + base64.RawURLEncoding.EncodeToString([]byte(key))
}

func artifactChunkSubject(id string, i int) string {
	return artifactChunkPrefix + id + "." + strconv.Itoa(i)
}

// artifactMeta is the metadata of an artifact (HeaderArtifactMeta).
type artifactMeta struct {
	// Object is the artifact's key (what ArtifactRef.Object names).
	Object string `json:"object"`
	Name   string `json:"name"`
	Size   int64  `json:"size"`
	Digest string `json:"digest"`
	// Chunks is 0 when the metadata message's body holds the bytes.
	Chunks    int    `json:"chunks"`
	ChunkID   string `json:"chunkId,omitempty"`
	ChunkSize int    `json:"chunkSize,omitempty"`
}

// randomToken is 16 random bytes, base64url: a subject token no one can
// guess. A Bus calls it through its newToken field (tests make it
// predictable).
func randomToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// storedByThisRelease reports whether key has the shape PutArtifact gives
// keys ("<object>~<token>"). Only such keys are looked up in the
// write-once stream, and only others in the old object store: otherwise
// anyone allowed to store could write metadata under an old artifact's
// key first and hide it for good.
func storedByThisRelease(key string) bool {
	i := strings.LastIndexByte(key, '~')
	return i >= 0 && validToken(key[i+1:])
}

func validToken(s string) bool {
	if len(s) < 8 || len(s) > 64 {
		return false
	}
	for _, c := range []byte(s) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// PutArtifact streams r into the artifact store and returns a reference
// (name, key, digest, size, content type). The key is object followed by
// a random suffix ("<object>~<suffix>"), new on every call: a put never
// replaces anything, and no one can take the key of a future put. Store
// the returned ref.Object, never object itself. If a subject the put
// writes is already taken (someone wrote there first), it fails with an
// error wrapping ErrArtifactExists. A failed put leaves no artifact (its
// chunks may remain, unreferenced).
func (b *Bus) PutArtifact(ctx context.Context, object, name string, r io.Reader) (schemas.ArtifactRef, error) {
	if err := schemas.ValidateName(name); err != nil {
		return schemas.ArtifactRef{}, err
	}
	if object == "" || len(object) > MaxArtifactKey {
		return schemas.ArtifactRef{}, fmt.Errorf("store artifact %.64q: the key must be 1 to %d bytes", object, MaxArtifactKey)
	}
	key := object + "~" + b.newToken()
	meta := artifactMeta{Object: key, Name: name}
	h := sha256.New()
	fail := func(err error) (schemas.ArtifactRef, error) {
		return schemas.ArtifactRef{}, fmt.Errorf("store artifact %s: %w", key, b.connErr(err))
	}
	if err := ctx.Err(); err != nil {
		return fail(err)
	}

	cp := chunkPut{b: b, start: time.Now()}
	cur, err := readFirstChunk(r)
	if err != nil {
		return fail(err)
	}
	// A full chunk may be followed by more: then it goes out as chunk 0.
	for len(cur) == ArtifactChunkSize {
		next := cp.buffer()
		k, err := readChunk(r, next)
		if err != nil {
			return fail(err)
		}
		if k == 0 {
			cp.free = append(cp.free, next)
			break
		}
		if meta.ChunkID == "" {
			meta.ChunkID = b.newToken()
		}
		h.Write(cur)
		meta.Size += int64(len(cur))
		if err := cp.publish(ctx, chunkMsg(meta.ChunkID, meta.Chunks, cur)); err != nil {
			return fail(err)
		}
		meta.Chunks++
		cur = next[:k]
	}
	h.Write(cur)
	meta.Size += int64(len(cur))
	var body []byte
	if meta.Chunks == 0 {
		body = cur
	} else {
		if err := cp.publish(ctx, chunkMsg(meta.ChunkID, meta.Chunks, cur)); err != nil {
			return fail(err)
		}
		meta.Chunks++
		meta.ChunkSize = ArtifactChunkSize
	}
	meta.Digest = "sha256:" + hex.EncodeToString(h.Sum(nil))
	raw, err := json.Marshal(meta)
	if err != nil {
		return fail(err)
	}
	m := &nats.Msg{Subject: ArtifactMetaSubject(key), Data: body, Header: nats.Header{
		jetstream.ExpectedLastSubjSeqHeader: []string{"0"},
		HeaderArtifactMeta:                  []string{string(raw)},
	}}
	// Only once every chunk is stored: metadata that can be read names
	// an artifact that can be read.
	if err := cp.wait(ctx, 0); err != nil {
		return fail(err)
	}
	if err := b.putArtifactMsg(ctx, m); err != nil {
		return fail(err)
	}
	return schemas.ArtifactRef{
		Name:        name,
		Object:      key,
		Digest:      meta.Digest,
		Size:        meta.Size,
		ContentType: contentType(name),
	}, nil
}

// readFirstChunk reads up to a chunk from r into a buffer that grows with
// what is read, in three steps: most artifacts are far smaller than a
// chunk, and a full chunk's buffer is exactly a chunk (chunkPut reuses
// it).
func readFirstChunk(r io.Reader) ([]byte, error) {
	var buf []byte
	for _, size := range [...]int{512, 16 << 10, ArtifactChunkSize} {
		next := make([]byte, size)
		have := copy(next, buf)
		n, err := readChunk(r, next[have:])
		if err != nil {
			return nil, err
		}
		buf = next[:have+n]
		if have+n < size {
			break
		}
	}
	return buf, nil
}

// readChunk fills buf from r; it returns fewer bytes only at the end.
func readChunk(r io.Reader, buf []byte) (int, error) {
	n, err := io.ReadFull(r, buf)
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		err = nil
	}
	return n, err
}

// chunkPut publishes the chunks of one put, putWindow at a time.
type chunkPut struct {
	b        *Bus
	start    time.Time
	inflight []pendingChunk
	free     [][]byte
}

type pendingChunk struct {
	f   jetstream.PubAckFuture
	buf []byte
}

// buffer returns a chunk buffer, reusing those of acknowledged chunks.
func (cp *chunkPut) buffer() []byte {
	if n := len(cp.free); n > 0 {
		buf := cp.free[n-1]
		cp.free = cp.free[:n-1]
		return buf[:ArtifactChunkSize]
	}
	return make([]byte, ArtifactChunkSize)
}

// chunkMsg is chunk i of the chunks id. Like every write to the artifact
// store, it expects its subject to be empty.
func chunkMsg(id string, i int, data []byte) *nats.Msg {
	return &nats.Msg{Subject: artifactChunkSubject(id, i), Data: data, Header: nats.Header{jetstream.ExpectedLastSubjSeqHeader: []string{"0"}}}
}

// publish sends m without waiting for its ack (but waits for the oldest
// one when putWindow are in flight). m must not change until acknowledged.
func (cp *chunkPut) publish(ctx context.Context, m *nats.Msg) error {
	if err := cp.wait(ctx, putWindow-1); err != nil {
		return err
	}
	f, err := cp.b.js.PublishMsgAsync(m)
	if err != nil {
		return fmt.Errorf("publish %s: %w", m.Subject, err)
	}
	cp.inflight = append(cp.inflight, pendingChunk{f: f, buf: m.Data})
	return nil
}

// wait waits for acks until at most keep chunks are in flight.
func (cp *chunkPut) wait(ctx context.Context, keep int) error {
	for len(cp.inflight) > keep {
		pc := cp.inflight[0]
		if err := cp.b.awaitAck(ctx, pc.f, cp.start); err != nil {
			return err
		}
		cp.inflight = cp.inflight[1:]
		if cap(pc.buf) == ArtifactChunkSize {
			cp.free = append(cp.free, pc.buf)
		}
	}
	return nil
}

// awaitAck waits for the ack of an asynchronous artifact publish. The
// bus's JetStream context gives up on it after Config.ArtifactAckWait
// (and drops it from its pending publishes), which fails the wait with a
// time-out.
func (b *Bus) awaitAck(ctx context.Context, f jetstream.PubAckFuture, start time.Time) error {
	m := f.Msg()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-f.Ok():
			return nil
		case err := <-f.Err():
			if errors.Is(err, jetstream.ErrAsyncPublishTimeout) {
				return fmt.Errorf("publish %s: %w (no acknowledgement in %s)", m.Subject, nats.ErrTimeout, b.cfg.ArtifactAckWait)
			}
			var apiErr *jetstream.APIError
			if errors.As(err, &apiErr) && subjectTaken(int(apiErr.ErrorCode), apiErr.Description) {
				return b.sameArtifactMsg(ctx, m, apiErr.Description)
			}
			return fmt.Errorf("publish %s: %w", m.Subject, err)
		case <-ctx.Done():
			return ctx.Err()
		case <-b.conn.closed:
			return b.closedErr()
		case <-tick.C:
			if b.conn.refusedSince(m.Subject, start) {
				return fmt.Errorf("publish %s: %w (the user lacks the permission to publish there)", m.Subject, ErrPermissionDenied)
			}
		}
	}
}

// JetStream errors that say a subject of the artifact store is taken.
const (
	codeStoreFailed = 10077 // with "maximum messages per subject exceeded"
)

func subjectTaken(code int, description string) bool {
	return code == codeWrongLastSeq || code == codeWrongLastSeqConst ||
		code == codeStoreFailed && strings.Contains(description, "maximum messages per subject")
}

// putArtifactMsg writes m to an artifact subject and waits for the ack,
// retrying while the server does not answer. A write that finds the
// subject taken succeeds only if the message there is the same (a retry of
// a write that did land).
func (b *Bus) putArtifactMsg(ctx context.Context, m *nats.Msg) error {
	start := time.Now()
	for attempt := 0; ; attempt++ {
		err := b.putArtifactOnce(ctx, m)
		var taken takenErr
		if errors.As(err, &taken) {
			return b.sameArtifactMsg(ctx, m, string(taken))
		}
		if err == nil || !retryable(err) {
			return err
		}
		if b.conn.refusedSince(m.Subject, start) {
			return fmt.Errorf("publish %s: %w (the user lacks the permission to publish there)", m.Subject, ErrPermissionDenied)
		}
		if werr := b.backoff(ctx, attempt, err); werr != nil {
			return werr
		}
	}
}

type takenErr string

func (e takenErr) Error() string { return string(e) }

func (b *Bus) putArtifactOnce(ctx context.Context, m *nats.Msg) error {
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := b.nc.RequestMsgWithContext(rctx, m)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
			return nats.ErrTimeout
		}
		return err
	}
	var ack pubAck
	if err := json.Unmarshal(resp.Data, &ack); err != nil {
		return fmt.Errorf("%w: unreadable ack %q", ErrRejected, resp.Data)
	}
	switch {
	case ack.Error == nil:
		return nil
	case subjectTaken(ack.Error.ErrCode, ack.Error.Description):
		return takenErr(ack.Error.Description)
	case ack.Error.Code == 503:
		return nats.ErrNoResponders
	}
	return fmt.Errorf("%w: %s (code %d)", ErrRejected, ack.Error.Description, ack.Error.ErrCode)
}

// sameArtifactMsg is the outcome of a write of m refused because its
// subject is taken: nil if the stored message is m (an earlier attempt of
// this write landed), an error wrapping ErrArtifactExists if it is
// another, or the error that kept it from reading the subject.
func (b *Bus) sameArtifactMsg(ctx context.Context, m *nats.Msg, why string) error {
	subject := m.Subject
	// A replica that has not caught up yet may not have it: lastMsg asks
	// the leader then.
	got, err := b.lastMsg(ctx, b.artifacts, subject)
	if err == nil && bytes.Equal(got.Data, m.Data) && got.Header.Get(HeaderArtifactMeta) == m.Header.Get(HeaderArtifactMeta) {
		return nil
	}
	if err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
		// Perhaps this write's own earlier attempt: not known to be
		// someone else's.
		return fmt.Errorf("%s is taken (%s) and what it holds cannot be read: %w", subject, why, b.connErr(err))
	}
	return fmt.Errorf("%s: %w (%s)", subject, ErrArtifactExists, why)
}

func contentType(name string) string {
	if t := mime.TypeByExtension(filepath.Ext(name)); t != "" {
		return t
	}
	return "application/octet-stream"
}

// GetArtifact copies an artifact to w and checks its digest and size; a
// mismatch returns ErrDigestMismatch (w may then have received bad
// bytes). Metadata that disagrees with ref fails before anything is
// written; metadata or chunks that are not what PutArtifact writes fail
// with ErrBadArtifact. It reads at most ref.Size bytes, with direct gets
// (getWindow at a time), and no consumer. Artifacts stored by releases
// before the write-once store, in the object store of the same name, are
// read from there. What a direct get does not find (the replica that
// answered may lag the ones that acknowledged the put) is asked of the
// stream leader: ErrNotFound and a missing chunk are its answers, never a
// replica's; a leader that does not answer fails the read with
// ErrNoLeader.
func (b *Bus) GetArtifact(ctx context.Context, ref schemas.ArtifactRef, w io.Writer) error {
	if ref.Object == "" || len(ref.Object) > maxRefObject {
		return fmt.Errorf("artifact %s (%.64q): %w", ref.Name, ref.Object, ErrNotFound)
	}
	if !storedByThisRelease(ref.Object) {
		return b.getLegacyArtifact(ctx, ref, w)
	}
	m, err := b.lastMsg(ctx, b.artifacts, ArtifactMetaSubject(ref.Object))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return fmt.Errorf("artifact %s (%s): %w", ref.Name, ref.Object, ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("artifact %s: %w", ref.Object, b.connErr(err))
	}
	meta, err := parseArtifactMeta(ref.Object, m)
	if err != nil {
		return err
	}
	if meta.Size != ref.Size || meta.Digest != ref.Digest {
		return fmt.Errorf("%w: %s: want %s (%d bytes), the store holds %s (%d bytes)", ErrDigestMismatch, ref.Object, ref.Digest, ref.Size, meta.Digest, meta.Size)
	}
	h := sha256.New()
	var n int64
	if meta.Chunks == 0 {
		h.Write(m.Data)
		k, err := w.Write(m.Data)
		if n = int64(k); err != nil {
			return fmt.Errorf("artifact %s: %w", ref.Object, err)
		}
	} else if n, err = b.copyArtifactChunks(ctx, meta, io.MultiWriter(w, h)); err != nil {
		return fmt.Errorf("artifact %s: %w", ref.Object, b.connErr(err))
	}
	return checkDigest(ref, n, h)
}

// parseArtifactMeta reads the metadata message stored for key and checks
// that it describes an artifact PutArtifact could have written.
func parseArtifactMeta(key string, msg *jetstream.RawStreamMsg) (*artifactMeta, error) {
	bad := func(format string, a ...any) (*artifactMeta, error) {
		return nil, fmt.Errorf("artifact %s: %w: %s", key, ErrBadArtifact, fmt.Sprintf(format, a...))
	}
	raw := msg.Header.Get(HeaderArtifactMeta)
	if raw == "" {
		return bad("its metadata message has no %s header", HeaderArtifactMeta)
	}
	var m artifactMeta
	if err := json.Unmarshal([]byte(raw), &m); err != nil {
		return bad("its metadata is not JSON: %v", err)
	}
	switch {
	case m.Object != key:
		return bad("its metadata names the key %.64q", m.Object)
	case m.Size < 0:
		return bad("its metadata says %d bytes", m.Size)
	case m.Chunks == 0:
		if int64(len(msg.Data)) != m.Size {
			return bad("its metadata message holds %d bytes and says %d", len(msg.Data), m.Size)
		}
	case m.Chunks < 0 || len(msg.Data) > 0:
		return bad("its metadata says %d chunks and its message holds %d bytes", m.Chunks, len(msg.Data))
	case !validToken(m.ChunkID):
		return bad("its metadata names the chunk id %.64q", m.ChunkID)
	case m.ChunkSize < minChunkSize || m.ChunkSize > maxChunkSize:
		return bad("its metadata says chunks of %d bytes", m.ChunkSize)
	case int64(m.Chunks) != (m.Size+int64(m.ChunkSize)-1)/int64(m.ChunkSize):
		return bad("its metadata says %d chunks of %d bytes for %d bytes", m.Chunks, m.ChunkSize, m.Size)
	}
	return &m, nil
}

// copyArtifactChunks writes an artifact's chunks to w in order, fetching
// up to getWindow at once, and checks each one's size.
func (b *Bus) copyArtifactChunks(ctx context.Context, m *artifactMeta, w io.Writer) (int64, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type result struct {
		data []byte
		err  error
	}
	pending := make(chan chan result, getWindow-1)
	go func() {
		defer close(pending)
		for i := range m.Chunks {
			ch := make(chan result, 1)
			select {
			case pending <- ch:
			case <-ctx.Done():
				return
			}
			go func() {
				data, err := b.getArtifactChunk(ctx, artifactChunkSubject(m.ChunkID, i))
				ch <- result{data, err}
			}()
		}
	}()
	var n int64
	i := 0
	for ch := range pending {
		r := <-ch
		if r.err != nil {
			return n, r.err
		}
		want := int64(m.ChunkSize)
		if i == m.Chunks-1 {
			want = m.Size - n
		}
		if int64(len(r.data)) != want {
			return n, fmt.Errorf("%w: chunk %d of %d holds %d bytes, want %d", ErrBadArtifact, i, m.Chunks, len(r.data), want)
		}
		k, err := w.Write(r.data)
		n += int64(k)
		if err != nil {
			return n, err
		}
		i++
	}
	if i != m.Chunks {
		return n, ctx.Err()
	}
	return n, nil
}

// getArtifactChunk reads one chunk by direct get; a chunk not found is
// asked of the stream leader (the replica that answered may lag the one
// that served the metadata), and missing only if the leader lacks it too.
func (b *Bus) getArtifactChunk(ctx context.Context, subject string) ([]byte, error) {
	m, err := b.lastMsg(ctx, b.artifacts, subject)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, fmt.Errorf("%w: chunk %s is missing", ErrBadArtifact, subject)
	}
	if err != nil {
		return nil, err
	}
	return m.Data, nil
}

func checkDigest(ref schemas.ArtifactRef, n int64, h hash.Hash) error {
	if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); got != ref.Digest || n != ref.Size {
		return fmt.Errorf("%w: %s: want %s (%d bytes), got %s (%d bytes)", ErrDigestMismatch, ref.Object, ref.Digest, ref.Size, got, n)
	}
	return nil
}

// GetArtifactFile writes an artifact to path (mode 0600), atomically: a
// digest mismatch leaves no file behind.
func (b *Bus) GetArtifactFile(ctx context.Context, ref schemas.ArtifactRef, path string) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".partial-*")
	if err != nil {
		return err
	}
	err = b.GetArtifact(ctx, ref, tmp)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		_ = os.Remove(tmp.Name()) // after a rename there is nothing left to remove
	}
	return err
}

// legacyArtifacts is the object store in which releases before the
// write-once store kept artifacts (stream OBJ_<ArtifactsBucket>). It is
// looked up the first time an artifact is not found in the write-once
// store, never created, and only read.
type legacyArtifacts struct {
	mu    sync.Mutex
	store jetstream.ObjectStore
}

// legacyStore returns the old object store, or nil if there is none.
func (b *Bus) legacyStore(ctx context.Context) (jetstream.ObjectStore, error) {
	l := b.legacy
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.store != nil {
		return l.store, nil
	}
	s, err := b.js.ObjectStore(ctx, b.cfg.ArtifactsBucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) || errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	l.store = s
	return s, nil
}

// getLegacyArtifact is GetArtifact for an artifact of the old object store.
func (b *Bus) getLegacyArtifact(ctx context.Context, ref schemas.ArtifactRef, w io.Writer) error {
	store, err := b.legacyStore(ctx)
	if err != nil {
		return fmt.Errorf("artifact %s: old object store %s: %w", ref.Object, b.cfg.ArtifactsBucket, b.connErr(err))
	}
	if store == nil {
		return fmt.Errorf("artifact %s (%s): %w", ref.Name, ref.Object, ErrNotFound)
	}
	info, err := store.GetInfo(ctx, ref.Object)
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return fmt.Errorf("artifact %s (%s): %w", ref.Name, ref.Object, ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("artifact %s: %w", ref.Object, b.connErr(err))
	}
	if info.Opts != nil && info.Opts.Link != nil {
		// loopbus never stored links; read one the general way.
		return b.getLegacyObject(ctx, store, ref, w)
	}
	if int64(info.Size) != ref.Size {
		return fmt.Errorf("%w: %s: want %d bytes, the store holds %d", ErrDigestMismatch, ref.Object, ref.Size, info.Size)
	}
	h := sha256.New()
	n, err := b.copyLegacyChunks(ctx, info, io.MultiWriter(w, h))
	if err != nil {
		return fmt.Errorf("artifact %s: %w", ref.Object, b.connErr(err))
	}
	return checkDigest(ref, n, h)
}

// copyLegacyChunks writes an old object's chunks to w in order and checks
// them against the object's own size and digest, as the object store's
// reader does. It reads them as the object store does (an ordered push
// consumer, which needs no other permission), but deletes that consumer
// before it returns rather than in the background, and stops at the
// object's size.
func (b *Bus) copyLegacyChunks(ctx context.Context, info *jetstream.ObjectInfo, w io.Writer) (int64, error) {
	h := sha256.New()
	var n int64
	if info.Size > 0 {
		pjs, err := b.nc.JetStream()
		if err != nil {
			return 0, err
		}
		subject := "$O." + b.cfg.ArtifactsBucket + ".C." + info.NUID
		sub, err := pjs.SubscribeSync(subject, nats.OrderedConsumer(), nats.BindStream("OBJ_"+b.cfg.ArtifactsBucket))
		if err != nil {
			return 0, err
		}
		// Unsubscribe deletes the consumer (and waits for the server).
		defer func() { _ = sub.Unsubscribe() }()
		for uint64(n) < info.Size {
			m, err := sub.NextMsgWithContext(ctx)
			if err != nil {
				return n, err
			}
			meta, err := m.Metadata()
			if err != nil {
				return n, err
			}
			if uint64(n)+uint64(len(m.Data)) > info.Size {
				return n, fmt.Errorf("%w: the chunks hold more than the object's %d bytes", jetstream.ErrDigestMismatch, info.Size)
			}
			h.Write(m.Data)
			k, err := w.Write(m.Data)
			n += int64(k)
			if err != nil {
				return n, err
			}
			if meta.NumPending == 0 {
				break
			}
		}
	}
	if uint64(n) != info.Size {
		return n, fmt.Errorf("%w: %d bytes in its chunks, the object's size is %d", jetstream.ErrDigestMismatch, n, info.Size)
	}
	want, err := jetstream.DecodeObjectDigest(info.Digest)
	if err != nil {
		return n, err
	}
	if !bytes.Equal(h.Sum(nil), want) {
		return n, jetstream.ErrDigestMismatch
	}
	return n, nil
}

// getLegacyObject is GetArtifact through the object store's reader (an
// ordered consumer, deleted once the object is read).
func (b *Bus) getLegacyObject(ctx context.Context, store jetstream.ObjectStore, ref schemas.ArtifactRef, w io.Writer) error {
	obj, err := store.Get(ctx, ref.Object)
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return fmt.Errorf("artifact %s (%s): %w", ref.Name, ref.Object, ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("artifact %s: %w", ref.Object, b.connErr(err))
	}
	defer obj.Close()
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(w, h), io.LimitReader(obj, max(ref.Size, 0)+1))
	if err != nil {
		return fmt.Errorf("artifact %s: %w", ref.Object, b.connErr(err))
	}
	return checkDigest(ref, n, h)
}

// artifactStreamConfig is the write-once artifact stream loopbus creates.
func artifactStreamConfig(cfg Config) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:                 cfg.ArtifactsBucket,
		Description:          "loopbus artifacts: session inputs and step outputs, each subject written once",
		Subjects:             []string{ArtifactSubjects},
		Storage:              jetstream.FileStorage,
		Retention:            jetstream.LimitsPolicy,
		Replicas:             cfg.Replicas,
		MaxMsgsPerSubject:    1,
		Discard:              jetstream.DiscardNew,
		DiscardNewPerSubject: true,
		AllowDirect:          true,
		MaxBytes:             -1,
		MaxMsgs:              -1,
	}
}

// artifactInvariants restores in next what makes the artifact stream
// write-once and readable by direct get, and lists what it changed.
func artifactInvariants(next *jetstream.StreamConfig) []string {
	var changed []string
	set := func(name string, ok bool, fix func()) {
		if !ok {
			changed = append(changed, name)
			fix()
		}
	}
	set("subjects "+ArtifactSubjects, slices.Equal(next.Subjects, []string{ArtifactSubjects}), func() { next.Subjects = []string{ArtifactSubjects} })
	set("file storage", next.Storage == jetstream.FileStorage, func() { next.Storage = jetstream.FileStorage })
	set("max 1 message per subject", next.MaxMsgsPerSubject == 1, func() { next.MaxMsgsPerSubject = 1 })
	set("discard new", next.Discard == jetstream.DiscardNew, func() { next.Discard = jetstream.DiscardNew })
	set("discard new per subject", next.DiscardNewPerSubject, func() { next.DiscardNewPerSubject = true })
	set("no rollups", !next.AllowRollup, func() { next.AllowRollup = false })
	set("direct gets", next.AllowDirect, func() { next.AllowDirect = true })
	return changed
}

// provisionArtifacts looks up (or creates) the write-once artifact
// stream, restores its invariants if someone changed them and, with
// Reconfigure, applies Config.Replicas. It refuses (ErrNotWriteOnce) to
// restore one message per subject on a stream that holds more on some
// subject, which would drop the stored artifact and keep what was written
// over it. The old object store of earlier releases is neither created
// nor changed.
func (b *Bus) provisionArtifacts(ctx context.Context) error {
	cfg := b.cfg
	if b.legacy == nil {
		b.legacy = &legacyArtifacts{}
	}
	want := artifactStreamConfig(cfg)
	s, err := b.js.Stream(ctx, want.Name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		s, err = b.js.CreateStream(ctx, want)
		if err == nil {
			b.log.Info().Str("stream", want.Name).Int("replicas", want.Replicas).Msg("created the artifact stream")
			b.artifacts = s
			return nil
		}
		if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) { // created concurrently
			s, err = b.js.Stream(ctx, want.Name)
		}
	}
	if err != nil {
		return fmt.Errorf("provision artifact stream %s: %w", want.Name, err)
	}
	info := s.CachedInfo()
	if st := info.State; info.Config.MaxMsgsPerSubject != 1 && st.Msgs != st.NumSubjects {
		// Limiting it to one message per subject now would keep the newest
		// message of each subject: the overwrite, not the artifact.
		return fmt.Errorf("artifact stream %s: %w: it takes %d messages per subject and holds %d messages on %d subjects, so something was written over a stored artifact; inspect it (nats stream subjects %s) and repair it by hand before setting max_msgs_per_subject to 1",
			want.Name, ErrNotWriteOnce, info.Config.MaxMsgsPerSubject, st.Msgs, st.NumSubjects, want.Name)
	}
	next := info.Config
	next.Subjects = slices.Clone(next.Subjects)
	changed := artifactInvariants(&next)
	restored := len(changed) > 0
	if cfg.Reconfigure && next.Replicas != want.Replicas {
		changed = append(changed, fmt.Sprintf("replicas %d -> %d", next.Replicas, want.Replicas))
		next.Replicas = want.Replicas
	}
	if len(changed) > 0 {
		if s, err = b.js.UpdateStream(ctx, next); err != nil {
			return fmt.Errorf("update artifact stream %s (%s): %w", want.Name, strings.Join(changed, ", "), err)
		}
		ev := b.log.Info()
		if restored {
			ev = b.log.Warn()
		}
		ev.Str("stream", want.Name).Strs("changed", changed).Msg("reconfigured the artifact stream")
	}
	b.artifacts = s
	return nil
}

// ArtifactStore describes a stream that holds artifacts (for doctor).
type ArtifactStore struct {
	Stream   string
	Messages uint64
	Bytes    uint64
	Replicas int
	// Problems lists the write-once settings the stream lacks (none for
	// the old object store, which is only read).
	Problems []string
}

// ArtifactStores describes the write-once artifact stream and, if it
// exists, the object store of earlier releases (nil otherwise), whose
// artifacts are still read.
func (b *Bus) ArtifactStores(ctx context.Context) (ArtifactStore, *ArtifactStore, error) {
	info, err := b.artifacts.Info(ctx)
	if err != nil {
		return ArtifactStore{}, nil, fmt.Errorf("artifact stream %s: %w", b.cfg.ArtifactsBucket, b.connErr(err))
	}
	cfg := info.Config
	cur := ArtifactStore{Stream: cfg.Name, Messages: info.State.Msgs, Bytes: info.State.Bytes, Replicas: cfg.Replicas, Problems: artifactInvariants(&cfg)}
	old, err := b.js.Stream(ctx, "OBJ_"+b.cfg.ArtifactsBucket)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return cur, nil, nil
	}
	if err == nil {
		var oi *jetstream.StreamInfo
		if oi, err = old.Info(ctx); err == nil {
			return cur, &ArtifactStore{Stream: oi.Config.Name, Messages: oi.State.Msgs, Bytes: oi.State.Bytes, Replicas: oi.Config.Replicas}, nil
		}
	}
	return cur, nil, fmt.Errorf("old artifact store OBJ_%s: %w", b.cfg.ArtifactsBucket, b.connErr(err))
}

// ArtifactKeys lists the keys (ArtifactRef.Object) of the artifacts in the
// write-once store, sorted; not those of the old object store. It reads
// the stream's subjects: meant for tests and inspection, not for large
// stores on a hot path.
func (b *Bus) ArtifactKeys(ctx context.Context) ([]string, error) {
	info, err := b.artifacts.Info(ctx, jetstream.WithSubjectFilter(artifactMetaPrefix+"*"))
	if err != nil {
		return nil, fmt.Errorf("artifact stream %s: %w", b.cfg.ArtifactsBucket, b.connErr(err))
	}
	keys := make([]string, 0, len(info.State.Subjects))
	for subj := range info.State.Subjects {
		key, err := base64.RawURLEncoding.DecodeString(strings.TrimPrefix(subj, artifactMetaPrefix))
		if err != nil {
			return nil, fmt.Errorf("artifact stream %s: subject %s: %w", b.cfg.ArtifactsBucket, subj, err)
		}
		keys = append(keys, string(key))
	}
	slices.Sort(keys)
	return keys, nil
}

// PutView stores v as JSON under key in the views bucket.
func (b *Bus) PutView(ctx context.Context, key string, v any) error {
	raw, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("view %s: %w", key, err)
	}
	if _, err := b.views.Put(ctx, key, raw); err != nil {
		return fmt.Errorf("view %s: %w", key, b.connErr(err))
	}
	return nil
}

// GetView loads the JSON view under key into v; a missing key returns an
// error wrapping ErrNotFound. It reads by direct get, which any replica of
// the bucket answers: what it finds may be older than the newest write on
// a replica that lags (compare the sequence the view carries with
// SessionLastSeq, as client.Status does, or use GetViewFromLeader). A key
// a replica does not hold is asked of the bucket's leader: ErrNotFound is
// the leader's answer (ErrNoLeader if none answers).
func (b *Bus) GetView(ctx context.Context, key string, v any) error {
	e, err := b.views.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return b.viewFromLeader(ctx, key, v, err)
	}
	if err != nil {
		return fmt.Errorf("view %s: %w", key, b.connErr(err))
	}
	if err := json.Unmarshal(e.Value(), v); err != nil {
		return fmt.Errorf("view %s: %w", key, err)
	}
	return nil
}

// GetViewFromLeader is GetView answered by the views bucket's leader,
// which holds every acknowledged write: for a reader that folds onto the
// view it reads (the projector) and so must not be handed an older one.
func (b *Bus) GetViewFromLeader(ctx context.Context, key string, v any) error {
	return b.viewFromLeader(ctx, key, v, nil)
}

// viewFromLeader reads key from the views bucket's leader. miss, if set,
// is a replica's ErrKeyNotFound, which stands if the user may not ask the
// leader.
func (b *Bus) viewFromLeader(ctx context.Context, key string, v any, miss error) error {
	if !validViewKey(key) {
		return fmt.Errorf("view %s: %w", key, jetstream.ErrInvalidKey)
	}
	stream, req := "KV_"+b.cfg.ViewsBucket, msgGetRequest{LastFor: "$KV." + b.cfg.ViewsBucket + "." + key}
	var m *jetstream.RawStreamMsg
	var err error
	if miss != nil {
		m, err = b.confirmMiss(ctx, stream, req, jetstream.ErrMsgNotFound)
	} else {
		m, err = b.leaderMsg(ctx, stream, req)
	}
	if errors.Is(err, jetstream.ErrMsgNotFound) || err == nil && viewRemoved(m.Header) {
		return fmt.Errorf("view %s: %w", key, ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("view %s: %w", key, b.connErr(err))
	}
	if err := json.Unmarshal(m.Data, v); err != nil {
		return fmt.Errorf("view %s: %w", key, err)
	}
	return nil
}

// viewRemoved reports whether a KV message marks its key deleted or purged
// (a delete or purge operation, or a marker the server wrote).
func viewRemoved(h nats.Header) bool {
	return h.Get("KV-Operation") != "" || h.Get("Nats-Marker-Reason") != ""
}

// validViewKey is the KV key syntax (what KeyValue.Get accepts): tokens of
// [-/_=.a-zA-Z0-9], without an empty token.
func validViewKey(key string) bool {
	if key == "" || key[0] == '.' || key[len(key)-1] == '.' || strings.Contains(key, "..") {
		return false
	}
	for _, c := range []byte(key) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("-/_=.", c) >= 0) {
			return false
		}
	}
	return true
}
