package projections

import "testing"

// BenchmarkFoldManifest folds a whole three-step session per iteration.
func BenchmarkFoldManifest(b *testing.B) {
	evs := happyPath()
	b.ReportAllocs()
	for range b.N {
		var m *Manifest
		for _, ev := range evs {
			m = FoldManifest(m, ev)
		}
	}
	b.ReportMetric(float64(len(evs)*b.N)/b.Elapsed().Seconds(), "events/s")
}
