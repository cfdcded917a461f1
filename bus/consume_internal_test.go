package bus

import (
	"testing"

	"github.com/nats-io/nats.go/jetstream"
)

// The answers of a server re-creating a durable while it still removes the
// deleted one's directory must be retried; a configuration it refuses must
// not.
func TestConsumerRaceOrUnavailable(t *testing.T) {
	t.Parallel()
	tests := []struct {
		err  jetstream.APIError
		want bool
	}{
		{jetstream.APIError{Code: 503, ErrorCode: jetstream.JSErrCodeJetStreamNotEnabled, Description: "jetstream not enabled"}, true},
		{jetstream.APIError{Code: 400, ErrorCode: jetstream.JSErrCodeConsumerDoesNotExist, Description: "consumer does not exist"}, true},
		// What the server answers when the store fails (it logs the file
		// error, e.g. renaming meta.sum.tmp, and hides it from the client).
		{jetstream.APIError{Code: 500, ErrorCode: jetstream.JSErrCodeConsumerCreate, Description: "error creating store for consumer"}, true},
		{jetstream.APIError{Code: 500, ErrorCode: jetstream.JSErrCodeConsumerCreate, Description: "consumer closed"}, true},
		{jetstream.APIError{Code: 500, ErrorCode: 10104, Description: "error creating store for consumer: rename meta.sum.tmp meta.sum: no such file or directory"}, true},
		{jetstream.APIError{Code: 500, ErrorCode: jetstream.JSErrCodeConsumerCreate, Description: "deliver policy can not be updated"}, false},
		{jetstream.APIError{Code: 400, ErrorCode: jetstream.JSErrCodeConsumerNameExists, Description: "consumer name already in use"}, false},
		{jetstream.APIError{Code: 400, ErrorCode: jetstream.JSErrCodeMaximumConsumersLimit, Description: "maximum consumers limit reached"}, false},
	}
	for _, tt := range tests {
		if got := consumerRaceOrUnavailable(&tt.err); got != tt.want {
			t.Errorf("consumerRaceOrUnavailable(%d/%d %q) = %v, want %v", tt.err.Code, tt.err.ErrorCode, tt.err.Description, got, tt.want)
		}
	}
}
