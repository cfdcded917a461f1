package main

import (
	"io"
	"net/url"
	"strings"
	"sync"

	"github.com/loopbus/loopbus/tui"
)

// banner prints serve's banner (tui.ServeBanner) once each part it waits
// for has reported: the connection, and each listener's address.
type banner struct {
	mu      sync.Mutex
	w       io.Writer
	b       tui.ServeBanner
	pending map[string]bool
}

// newBanner returns a banner that waits for the parts named.
func newBanner(w io.Writer, b tui.ServeBanner, parts ...string) *banner {
	p := map[string]bool{}
	for _, name := range parts {
		p[name] = true
	}
	return &banner{w: w, b: b, pending: p}
}

// report sets what part brings (set may be nil) and prints the banner
// when it was the last part awaited. A part reported again (a listener
// started again) changes nothing.
func (b *banner) report(part string, set func(*tui.ServeBanner)) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.pending[part] {
		return
	}
	delete(b.pending, part)
	if set != nil {
		set(&b.b)
	}
	if len(b.pending) == 0 {
		b.b.Write(b.w)
	}
}

// redactURLs hides the passwords of NATS URLs (a comma-separated list)
// for printing.
func redactURLs(urls string) string {
	parts := strings.Split(urls, ",")
	for i, p := range parts {
		if u, err := url.Parse(strings.TrimSpace(p)); err == nil && u.User != nil {
			if _, has := u.User.Password(); has {
				parts[i] = u.Redacted()
			} else {
				u.User = url.User("xxxxx") // a token alone
				parts[i] = u.String()
			}
		}
	}
	return strings.Join(parts, ",")
}
