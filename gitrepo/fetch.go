package gitrepo

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"github.com/loopbus/loopbus/schemas"
)

// Getter writes an artifact's bytes to a local file, checking its digest.
type Getter interface {
	GetArtifactFile(ctx context.Context, ref schemas.ArtifactRef, path string) error
}

// FetchArtifacts brings bundle artifacts into the cache, in order (each may
// need commits of the ones before it), downloading them into scratch (a
// directory it creates and empties). A bundle this cache already fetched
// (same digest) is skipped. Errors from g are wrapped as they are; a
// bundle git cannot read wraps ErrBadBundle.
func (c *Cache) FetchArtifacts(ctx context.Context, g Getter, refs []schemas.ArtifactRef, scratch string) error {
	if err := os.MkdirAll(scratch, 0o700); err != nil {
		return fmt.Errorf("gitrepo: %w", err)
	}
	defer os.RemoveAll(scratch)
	for i, ref := range refs {
		c.mu.Lock()
		done := c.fetched[ref.Digest]
		c.mu.Unlock()
		if done {
			continue
		}
		path := filepath.Join(scratch, strconv.Itoa(i)+".bundle")
		if err := g.GetArtifactFile(ctx, ref, path); err != nil {
			return fmt.Errorf("bundle %s: %w", ref.Object, err)
		}
		if err := c.FetchBundle(ctx, path); err != nil {
			return fmt.Errorf("bundle %s: %w", ref.Object, err)
		}
		c.mu.Lock()
		c.fetched[ref.Digest] = true
		c.mu.Unlock()
		_ = os.Remove(path)
	}
	return nil
}
