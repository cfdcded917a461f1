package dashboard_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/loopbus/loopbus/client"
	"github.com/loopbus/loopbus/dashboard"
	"github.com/loopbus/loopbus/internal/testnats"
	"github.com/loopbus/loopbus/schemas"
)

// BenchmarkTimelineInBrowser publishes a session's events at about 1,000
// a second for 3 seconds while its page is open in headless Chromium, and
// reports how smoothly the page kept up: the rate the events were
// published at, the longest and the 99th-percentile gap between animation
// frames while they came, and how long after the last event was published
// the page showed it.
func BenchmarkTimelineInBrowser(b *testing.B) {
	bb, _ := testnats.Bus(b)
	c := client.New(bb)
	d, err := dashboard.New(dashboard.Config{Addr: "127.0.0.1:0"}, c, testnats.Logger(b), time.Now)
	if err != nil {
		b.Fatal(err)
	}
	srv := httptest.NewServer(d.Handler())
	b.Cleanup(func() { srv.CloseClientConnections(); srv.Close() })
	ctx := browser(b)
	// The session is submitted, but no service runs: the page shows what
	// is published, and nothing else competes for the machine.
	(&system{b: bb, c: c, srv: srv, dir: b.TempDir()}).submitGated(b, "load")
	ev := func(id, typ, step string, data any) schemas.Event {
		return schemas.Event{ID: id, Type: typ, Session: "load", Step: step, Time: time.Now(), Data: data}
	}
	pctx := context.Background()
	for i := 0; i < b.N; i++ {
		if err := chromedp.Do(ctx,
			chromedp.Navigate(srv.URL+"/sessions/load"),
			chromedp.WaitVisible(chromedp.CSS(`#timeline tr[data-type="session.started"]`)),
		); err != nil {
			b.Fatal(err)
		}
		if _, err := chromedp.Run(ctx, chromedp.Evaluate[any](`window.__gaps = []; (function f(t0) { requestAnimationFrame((t) => { window.__gaps.push(t - t0); f(t); }); })(performance.now()); 0`)); err != nil {
			b.Fatal(err)
		}
		// The same page's frames with no events coming: the baseline.
		time.Sleep(time.Second)
		idle, err := chromedp.Run(ctx, chromedp.Evaluate[[]float64](`const g = window.__gaps; window.__gaps = []; g`))
		if err != nil {
			b.Fatal(err)
		}
		slices.Sort(idle)
		// Paced at 10 events every 10 ms; four publishers, since one
		// waits for each acknowledgement (fsync) in turn.
		const total, perTick, publishers = 3000, 10, 4
		work := make(chan int, total)
		errs := make(chan error, publishers)
		var wg sync.WaitGroup
		for range publishers {
			wg.Go(func() {
				for n := range work {
					text := fmt.Sprintf("message %d of run %d", n, i)
					if _, err := bb.Publish(pctx, ev(fmt.Sprintf("m-%d-%d", i, n), schemas.TypeAgentMessage, "a", &schemas.AgentMessage{JobID: "load.a.1", Text: text})); err != nil {
						errs <- err
						return
					}
				}
			})
		}
		tick := time.NewTicker(10 * time.Millisecond)
		start := time.Now()
		for n := 1; n <= total; {
			<-tick.C
			for k := 0; k < perTick && n <= total; k++ {
				work <- n
				n++
			}
		}
		tick.Stop()
		close(work)
		wg.Wait()
		published := time.Since(start)
		select {
		case err := <-errs:
			b.Fatal(err)
		default:
		}
		want := fmt.Sprintf("message %d of run %d", total, i)
		shown := fmt.Sprintf(`[...document.querySelectorAll("#timeline td.text")].some((td) => td.textContent.includes(%q))`, want)
		if err := chromedp.Do(ctx, chromedp.Poll[chromedp.Void](shown)); err != nil {
			b.Fatal(err)
		}
		lag := time.Since(start) - published
		gaps, err := chromedp.Run(ctx, chromedp.Evaluate[[]float64](`window.__gaps`))
		if err != nil {
			b.Fatal(err)
		}
		slices.Sort(gaps)
		if len(gaps) == 0 {
			b.Fatal("no animation frames")
		}
		b.ReportMetric(float64(total)/published.Seconds(), "events/s")
		b.ReportMetric(gaps[len(gaps)-1], "max_frame_gap_ms")
		b.ReportMetric(gaps[len(gaps)*99/100], "p99_frame_gap_ms")
		b.ReportMetric(float64(lag.Milliseconds()), "shown_after_ms")
		b.ReportMetric(float64(len(gaps))/(published+lag).Seconds(), "frames/s")
		if len(idle) > 0 {
			b.ReportMetric(float64(len(idle)), "idle_frames/s")
			b.ReportMetric(idle[len(idle)-1], "idle_max_frame_gap_ms")
		}
	}
}
