package modelapi

import (
	"fmt"
	"io"
	"net/http"
)

// MaxReplyBytes bounds the body of one answer of a model's API, streamed
// or not: a server that answers without end fails the job instead of
// filling the worker's memory.
const MaxReplyBytes = 16 << 20

// ErrReplyTooLarge is the error of reading past MaxReplyBytes of an
// answer. The run fails at once: asking again would get the same.
var ErrReplyTooLarge = fmt.Errorf("the API's answer exceeds %d MiB", MaxReplyBytes>>20)

// HTTPClient returns a copy of c (nil: a default client) whose response
// bodies end in ErrReplyTooLarge after MaxReplyBytes.
func HTTPClient(c *http.Client) *http.Client {
	out := &http.Client{}
	if c != nil {
		*out = *c
	}
	base := out.Transport
	if base == nil {
		base = http.DefaultTransport
	}
	out.Transport = limitTransport{base}
	return out
}

type limitTransport struct{ base http.RoundTripper }

func (t limitTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := t.base.RoundTrip(r)
	if err == nil && resp.Body != nil {
		resp.Body = &limitedBody{ReadCloser: resp.Body, left: MaxReplyBytes}
	}
	return resp, err
}

// limitedBody reads at most left more bytes, then fails with
// ErrReplyTooLarge if the body goes on.
type limitedBody struct {
	io.ReadCloser
	left int64
}

func (b *limitedBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
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
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.ReadCloser.Read(p)
	b.left -= int64(n)
	return n, err
}
