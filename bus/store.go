package bus

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"mime"
	"os"
	"path/filepath"

	"github.com/loopbus/loopbus/schemas"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ErrNotFound: no such artifact or view.
var ErrNotFound = errors.New("not found")

// ErrDigestMismatch: stored bytes do not match the digest an event names.
var ErrDigestMismatch = errors.New("artifact digest mismatch")

// PutArtifact streams r into the object store under key object and returns
// a reference (name, digest, size, content type). Re-putting a key replaces
// it; callers use keys unique per job so that never loses history.
func (b *Bus) PutArtifact(ctx context.Context, object, name string, r io.Reader) (schemas.ArtifactRef, error) {
	if err := schemas.ValidateName(name); err != nil {
		return schemas.ArtifactRef{}, err
	}
	h := sha256.New()
	info, err := b.artifacts.Put(ctx, jetstream.ObjectMeta{Name: object}, io.TeeReader(r, h))
	if err != nil {
		return schemas.ArtifactRef{}, fmt.Errorf("store artifact %s: %w", object, b.connErr(err))
	}
	return schemas.ArtifactRef{
		Name:        name,
		Object:      object,
		Digest:      "sha256:" + hex.EncodeToString(h.Sum(nil)),
		Size:        int64(info.Size),
		ContentType: contentType(name),
	}, nil
}

func contentType(name string) string {
	if t := mime.TypeByExtension(filepath.Ext(name)); t != "" {
		return t
	}
	return "application/octet-stream"
}

// GetArtifact copies an artifact to w and checks its digest and size; a
// mismatch returns ErrDigestMismatch (w has then received bad bytes). It
// reads the chunks as the object store does (an ordered push consumer,
// which needs no other permission), but deletes that consumer before it
// returns rather than in the background.
func (b *Bus) GetArtifact(ctx context.Context, ref schemas.ArtifactRef, w io.Writer) error {
	info, err := b.artifacts.GetInfo(ctx, ref.Object)
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return fmt.Errorf("artifact %s (%s): %w", ref.Name, ref.Object, ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("artifact %s: %w", ref.Object, b.connErr(err))
	}
	if info.Opts != nil && info.Opts.Link != nil {
		// loopbus never stores links; read one the general way.
		return b.getArtifactObject(ctx, ref, w)
	}
	h := sha256.New()
	n, err := b.copyChunks(ctx, info, io.MultiWriter(w, h))
	if err != nil {
		return fmt.Errorf("artifact %s: %w", ref.Object, b.connErr(err))
	}
	return checkDigest(ref, n, h)
}

// copyChunks writes an object's chunks to w in order and checks them
// against the object's own size and digest, as the object store's reader
// does.
func (b *Bus) copyChunks(ctx context.Context, info *jetstream.ObjectInfo, w io.Writer) (int64, error) {
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
		for {
			m, err := sub.NextMsgWithContext(ctx)
			if err != nil {
				return n, err
			}
			meta, err := m.Metadata()
			if err != nil {
				return n, err
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

// getArtifactObject is GetArtifact through the object store's reader (an
// ordered consumer, deleted once the object is read).
func (b *Bus) getArtifactObject(ctx context.Context, ref schemas.ArtifactRef, w io.Writer) error {
	obj, err := b.artifacts.Get(ctx, ref.Object)
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return fmt.Errorf("artifact %s (%s): %w", ref.Name, ref.Object, ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("artifact %s: %w", ref.Object, b.connErr(err))
	}
	defer obj.Close()
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(w, h), obj)
	if err != nil {
		return fmt.Errorf("artifact %s: %w", ref.Object, b.connErr(err))
	}
	return checkDigest(ref, n, h)
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
	defer os.Remove(tmp.Name())
	if err := b.GetArtifact(ctx, ref, tmp); err != nil {
		_ = tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
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
// error wrapping ErrNotFound.
func (b *Bus) GetView(ctx context.Context, key string, v any) error {
	e, err := b.views.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return fmt.Errorf("view %s: %w", key, ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("view %s: %w", key, b.connErr(err))
	}
	if err := json.Unmarshal(e.Value(), v); err != nil {
		return fmt.Errorf("view %s: %w", key, err)
	}
	return nil
}
