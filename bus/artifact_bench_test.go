package bus_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"testing"

	"github.com/loopbus/loopbus/internal/testnats"
)

// BenchmarkArtifact measures storing and reading one artifact (a step's
// output, an input, a large bundle) against an embedded server.
func BenchmarkArtifact(b *testing.B) {
	bs, _ := testnats.Bus(b)
	ctx := context.Background()
	for _, size := range []int{1 << 10, 100 << 10, 300 << 10, 4 << 20} {
		payload := make([]byte, size)
		if _, err := rand.Read(payload); err != nil {
			b.Fatal(err)
		}
		b.Run(fmt.Sprintf("put/%dKiB", size>>10), func(b *testing.B) {
			b.SetBytes(int64(size))
			for i := range b.N {
				if _, err := bs.PutArtifact(ctx, fmt.Sprintf("bench/put-%d/%d/a.bin", size, i), "a.bin", bytes.NewReader(payload)); err != nil {
					b.Fatal(err)
				}
			}
		})
		ref, err := bs.PutArtifact(ctx, fmt.Sprintf("bench/get-%d/a.bin", size), "a.bin", bytes.NewReader(payload))
		if err != nil {
			b.Fatal(err)
		}
		b.Run(fmt.Sprintf("get/%dKiB", size>>10), func(b *testing.B) {
			b.SetBytes(int64(size))
			for range b.N {
				if err := bs.GetArtifact(ctx, ref, io.Discard); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
