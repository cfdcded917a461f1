// Package bus is loopbus's only door to NATS: connection options, the
// embedded server, provisioning of the event stream, dead-letter stream, view
// KV bucket and write-once artifact stream, CloudEvent encoding, publishing
// (de-duplication ids, atomic batches with an expected-sequence check), and
// durable consumers. It is also the only package that maps handler errors to
// ack, nak-with-delay or terminate.
package bus

import (
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
)

// Defaults for Config's zero values.
const (
	DefaultStream          = "LOOPBUS"
	DefaultDLQStream       = "LOOPBUS_DLQ"
	DefaultViewsBucket     = "LOOPBUS_VIEWS"
	DefaultArtifactsBucket = "LOOPBUS_ARTIFACTS"
	DefaultWorkersBucket   = "LOOPBUS_WORKERS"
	DefaultDuplicateWindow = 10 * time.Minute
	DefaultReadStall       = 10 * time.Second
	DefaultArtifactAckWait = 30 * time.Second
	// DLQSubjectPrefix prefixes dead-letter subjects:
	// loopbus.dlq.<consumer>.<event stream sequence>.
	DLQSubjectPrefix = "loopbus.dlq"
)

// Config says how to reach NATS and how the streams and buckets are shaped.
// The zero value connects to nothing (URL is required) and provisions the
// default names with one replica and unlimited retention.
type Config struct {
	// URL is a comma-separated list of server URLs.
	URL string
	// InProcess, when set, is a server running in this process (an
	// Embedded's InProcess): the connection goes to it through memory
	// instead of a socket, with the same protocol, authentication and
	// refusals (docs/PERFORMANCE.md has what it saves). URL still says
	// whether to use TLS (tls://) and is the URL ServerURL reports. The
	// connection is to that one server: once it is shut down the bus
	// reconnects to nothing, even to a server started again on the same
	// data directory.
	InProcess nats.InProcessConnProvider
	// Name is the connection name shown by the server (e.g. "agentworker").
	Name string

	// Authentication: any one of these.
	User      string
	Password  string
	Token     string
	CredsFile string // JWT + nkey creds file
	NKeyFile  string // nkey seed file

	// TLS: CA to verify the server; cert+key for mutual TLS.
	TLSCA   string
	TLSCert string
	TLSKey  string

	// Stream names and shape.
	Stream          string
	DLQStream       string
	ViewsBucket     string
	ArtifactsBucket string
	// WorkersBucket is the KV bucket where agent workers announce
	// themselves (see PutWorker).
	WorkersBucket string
	// Replicas for the stream and buckets (1, 3 or 5); 0 means 1.
	Replicas int
	// MaxAge of events; 0 keeps them forever.
	MaxAge time.Duration
	// MaxBytes of the event stream; 0 means unlimited.
	MaxBytes int64
	// DuplicateWindow for Nats-Msg-Id de-duplication; 0 means 10 minutes.
	DuplicateWindow time.Duration
	// Reconfigure applies Replicas, MaxAge, MaxBytes and DuplicateWindow to
	// streams and buckets that already exist. Without it provisioning only
	// creates what is missing (from these values) and leaves the retention
	// and replicas of existing ones alone, so that a command run with
	// default flags never shortens or resets the history.
	Reconfigure bool

	// ConnectTimeout bounds the initial connection: 0 retries until the
	// context ends (services may start before NATS); >0 gives up after that
	// long with an error saying the server is unreachable (commands).
	ConnectTimeout time.Duration
	// GiveUpAfter closes the connection once it has been disconnected for
	// that long; from then on every operation fails with an error wrapping
	// ErrConnectionLost. 0 reconnects forever (services).
	GiveUpAfter time.Duration
	// AnswerTimeout bounds how long opening a read (and, at Connect,
	// looking up the streams; and SubjectLastSeq) retries a stream that
	// does not answer (no leader: cluster nodes down or cut off); the
	// error then wraps ErrNoAnswer and names the stream and the server.
	// 0 retries until the context ends (services; SubjectLastSeq fails
	// with ErrNoLeader after 10 s); commands a person waits on set it. A read already under way that replaces a stalled
	// consumer retries for as long as the read lasts.
	AnswerTimeout time.Duration
	// ReadStall is how long a Read may wait while the stream holds an
	// event it has not delivered before it replaces its consumer (one
	// stuck on a dead cluster node, say); 0 means DefaultReadStall.
	ReadStall time.Duration
	// ArtifactAckWait is how long PutArtifact waits for the server to
	// acknowledge a chunk before the put fails (a stream without quorum,
	// say); 0 means DefaultArtifactAckWait.
	ArtifactAckWait time.Duration

	// SignKeyFile is an nkey user seed file (see LoadSignKey): every event
	// this Bus publishes is signed with it. Empty publishes unsigned events.
	SignKeyFile string
	// TrustFile lists the public keys of each role (see LoadTrust): every
	// event read must be signed by a key whose role may state its type,
	// else it is malformed (dead-lettered with the reason), and
	// Event.Signer names the key. Empty trusts every event unsigned.
	TrustFile string
}

// ErrConfig: a configuration value is invalid.
var ErrConfig = errors.New("invalid bus configuration")

// withDefaults fills zero values.
func (c Config) withDefaults() Config {
	if c.Stream == "" {
		c.Stream = DefaultStream
	}
	if c.DLQStream == "" {
		c.DLQStream = DefaultDLQStream
	}
	if c.ViewsBucket == "" {
		c.ViewsBucket = DefaultViewsBucket
	}
	if c.ArtifactsBucket == "" {
		c.ArtifactsBucket = DefaultArtifactsBucket
	}
	if c.WorkersBucket == "" {
		c.WorkersBucket = DefaultWorkersBucket
	}
	if c.Replicas == 0 {
		c.Replicas = 1
	}
	if c.ArtifactAckWait == 0 {
		c.ArtifactAckWait = DefaultArtifactAckWait
	}
	if c.ReadStall == 0 {
		c.ReadStall = DefaultReadStall
	}
	if c.DuplicateWindow == 0 {
		c.DuplicateWindow = DefaultDuplicateWindow
		if c.MaxAge > 0 {
			// The server refuses a window longer than the retention.
			c.DuplicateWindow = min(DefaultDuplicateWindow, c.MaxAge)
		}
	}
	return c
}

// Validate reports the first invalid value.
func (c Config) Validate() error {
	switch {
	case c.URL == "":
		return fmt.Errorf("%w: no NATS URL", ErrConfig)
	case c.Replicas < 0 || c.Replicas > 5:
		return fmt.Errorf("%w: replicas %d not in 1..5", ErrConfig, c.Replicas)
	case c.MaxAge < 0 || c.MaxBytes < 0 || c.DuplicateWindow < 0:
		return fmt.Errorf("%w: negative retention", ErrConfig)
	case c.ConnectTimeout < 0 || c.GiveUpAfter < 0 || c.AnswerTimeout < 0 || c.ReadStall < 0 || c.ArtifactAckWait < 0:
		return fmt.Errorf("%w: negative timeout", ErrConfig)
	case (c.TLSCert == "") != (c.TLSKey == ""):
		return fmt.Errorf("%w: TLS client cert and key must be given together", ErrConfig)
	case c.MaxAge > 0 && c.DuplicateWindow > c.MaxAge:
		return fmt.Errorf("%w: duplicate window %s is longer than max age %s", ErrConfig, c.DuplicateWindow, c.MaxAge)
	case c.Token != "" && c.User != "":
		return fmt.Errorf("%w: give a token or a user, not both", ErrConfig)
	}
	return nil
}
