package modelapi

import (
	"fmt"
	"io"
	"net/http"
	"sync/atomic"
)

// MaxReplyBytes bounds the body of one answer of a model's API, streamed
// or not: a server that answers without end fails the job instead of
// filling the worker's memory.
const MaxReplyBytes = 16 << 20

// MaxConversationBytes bounds what one job's conversation holds: the API's
// answers together, and the tools' answers together. A conversation is
// sent whole with every request, so it must not grow without end.
const MaxConversationBytes = 64 << 20

// ErrReplyTooLarge is the error of reading past MaxReplyBytes of an
// answer, or past MaxConversationBytes of a job's answers. The run fails
// at once: asking again would get the same.
var ErrReplyTooLarge = fmt.Errorf("the API's answer exceeds %d MiB (or the job's answers %d MiB)", MaxReplyBytes>>20, MaxConversationBytes>>20)

// HTTPClient returns a copy of c (nil: a default client) for one job:
// each response body ends in ErrReplyTooLarge after MaxReplyBytes, and
// all of them together after MaxConversationBytes.
func HTTPClient(c *http.Client) *http.Client {
	out := &http.Client{}
	if c != nil {
		*out = *c
	}
	base := out.Transport
	if base == nil {
		base = http.DefaultTransport
	}
	t := &limitTransport{base: base}
	t.total.Store(MaxConversationBytes)
	out.Transport = t
	return out
}

type limitTransport struct {
	base  http.RoundTripper
	total atomic.Int64 // bytes the job's answers may still hold
}

func (t *limitTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := t.base.RoundTrip(r)
	if err == nil && resp.Body != nil {
		resp.Body = &limitedBody{ReadCloser: resp.Body, left: MaxReplyBytes, total: &t.total}
	}
	return resp, err
}

// limitedBody reads at most left more bytes (and total, shared by a job's
// answers), then fails with ErrReplyTooLarge if the body goes on.
type limitedBody struct {
	io.ReadCloser
	left  int64
	total *atomic.Int64
}

func (b *limitedBody) Read(p []byte) (int, error) {
	left := min(b.left, b.total.Load())
	if left <= 0 {
		var one [1]byte
		n, err := b.ReadCloser.Read(one[:])
		if n > 0 {
			return 0, ErrReplyTooLarge
		}
		if err == nil {
			return 0, nil
		}
		return 0, err
	}
	if int64(len(p)) > left {
		p = p[:left]
	}
	n, err := b.ReadCloser.Read(p)
	b.left -= int64(n)
	b.total.Add(-int64(n))
	return n, err
}
