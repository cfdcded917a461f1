package bus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Worker presence. Each agent worker puts a record under its id in the KV
// bucket Config.WorkersBucket every WorkerRefresh and deletes it when it
// stops; the bucket keeps a record WorkerTTL, so a worker that died without
// deleting its record is gone from the list after at most WorkerTTL.
const (
	WorkerRefresh = 5 * time.Second
	WorkerTTL     = 4*WorkerRefresh + 5*time.Second
)

// WorkerInfo is what a worker announces about itself.
type WorkerInfo struct {
	ID          string    `json:"id"`
	Host        string    `json:"host,omitempty"`
	PID         int       `json:"pid,omitempty"`
	Lanes       []string  `json:"lanes"`
	Concurrency int       `json:"concurrency,omitempty"`
	Started     time.Time `json:"started,omitzero"`
	// Jobs are the ids of the jobs the worker runs (at most MaxWorkerJobs),
	// as of the record: a redelivered job whose holder is present and
	// lists it is left to that holder (see agentworker).
	Jobs []string `json:"jobs,omitempty"`
	// Seen is when the server stored the record (set by Workers and
	// Worker).
	Seen time.Time `json:"seen,omitzero"`
}

// Bounds of the presence bucket: records are small, and a worker key
// (the agentworker role may write the bucket) cannot fill memory or make
// readers fetch without end.
const (
	maxWorkerRecord = 4 << 10
	maxWorkerBytes  = 4 << 20
	maxWorkersRead  = 1000
	maxWorkerLanes  = 16
)

// MaxWorkerJobs bounds WorkerInfo.Jobs, so that a record stays within
// the bucket's record size.
const MaxWorkerJobs = 24

// provisionWorkers finds or creates the presence bucket. Presence only
// informs (status, doctor, the dashboard), so a failure other than a lost
// connection turns it off for this process, with a warning, instead of
// failing the connection.
func (b *Bus) provisionWorkers(ctx context.Context) error {
	cfg := b.cfg
	var err error
	b.workers, err = b.js.KeyValue(ctx, cfg.WorkersBucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		b.workers, err = b.js.CreateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket:       cfg.WorkersBucket,
			Description:  "loopbus agent workers present and their lanes; each record expires unless refreshed",
			History:      1,
			TTL:          WorkerTTL,
			MaxValueSize: maxWorkerRecord,
			MaxBytes:     maxWorkerBytes,
			// On disk: a server restart must not lose the bucket itself.
			Storage:  jetstream.FileStorage,
			Replicas: cfg.Replicas,
		})
		if errors.Is(err, jetstream.ErrBucketExists) { // created concurrently
			b.workers, err = b.js.KeyValue(ctx, cfg.WorkersBucket)
		}
	} else if err == nil && cfg.Reconfigure {
		var st jetstream.KeyValueStatus
		if st, err = b.workers.Status(ctx); err == nil {
			err = b.reconfigureBucket(ctx, "KV", cfg.WorkersBucket, st)
		}
		if err == nil {
			b.workers, err = b.js.KeyValue(ctx, cfg.WorkersBucket)
		}
	}
	if err != nil {
		if cerr := b.closedErr(); cerr != nil {
			return fmt.Errorf("provision KV %s: %w", cfg.WorkersBucket, cerr)
		}
		// Presence only informs (status, doctor, the dashboard): a user
		// that may neither find nor create the bucket (a locked-down
		// deployment upgraded without provisioning it) works without it.
		b.workers = nil
		b.log.Warn().Err(err).Str("bucket", cfg.WorkersBucket).
			Msg("worker presence is off for this process: the bucket cannot be found or created (provision it once as a user allowed to, e.g. loopbus doctor as the admin)")
	}
	return nil
}

// ErrNoPresence: this process has no worker presence bucket (see
// provisionWorkers).
var ErrNoPresence = errors.New("worker presence is off")

// WorkersBucket is the name of the worker presence bucket.
func (b *Bus) WorkersBucket() string { return b.cfg.WorkersBucket }

// workerKey makes a valid KV key of a worker id.
func workerKey(id string) string {
	var sb strings.Builder
	for _, r := range id {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_', r == '=':
			sb.WriteRune(r)
		default:
			sb.WriteByte('_')
		}
	}
	if sb.Len() == 0 {
		return "_"
	}
	return sb.String()
}

// PutWorker announces (or refreshes) a worker in the presence bucket.
func (b *Bus) PutWorker(ctx context.Context, w WorkerInfo) error {
	if w.ID == "" {
		return errors.New("worker presence: empty worker id")
	}
	if b.workers == nil {
		return ErrNoPresence
	}
	w.Seen = time.Time{}
	data, err := json.Marshal(w)
	if err != nil {
		return err
	}
	if _, err := b.workers.Put(ctx, workerKey(w.ID), data); err != nil {
		return fmt.Errorf("worker presence %s: %w", w.ID, b.connErr(err))
	}
	return nil
}

// DeleteWorker removes a worker's record (on a clean shutdown).
func (b *Bus) DeleteWorker(ctx context.Context, id string) error {
	if b.workers == nil {
		return ErrNoPresence
	}
	if err := b.workers.Delete(ctx, workerKey(id)); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return fmt.Errorf("worker presence %s: %w", id, b.connErr(err))
	}
	return nil
}

// Workers lists the workers present (records refreshed within WorkerTTL),
// by id. It needs only a stream lookup and direct gets on the bucket.
func (b *Bus) Workers(ctx context.Context) ([]WorkerInfo, error) {
	if b.workers == nil {
		return nil, ErrNoPresence
	}
	stream := "KV_" + b.cfg.WorkersBucket
	prefix := "$KV." + b.cfg.WorkersBucket + "."
	s, err := b.js.Stream(ctx, stream)
	if err != nil {
		return nil, fmt.Errorf("workers: %w", b.connErr(err))
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(prefix+">"))
	if err != nil {
		return nil, fmt.Errorf("workers: %w", b.connErr(err))
	}
	keys := make([]string, 0, len(info.State.Subjects))
	for subj := range info.State.Subjects {
		keys = append(keys, strings.TrimPrefix(subj, prefix))
	}
	slices.Sort(keys)
	keys = keys[:min(len(keys), maxWorkersRead)]
	out := []WorkerInfo{}
	for _, k := range keys {
		e, err := b.workers.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
			continue // deleted or expired meanwhile
		}
		if err != nil {
			return nil, fmt.Errorf("workers: %s: %w", k, b.connErr(err))
		}
		w, ok := workerRecord(k, e)
		if !ok {
			continue // not a record PutWorker wrote
		}
		out = append(out, w)
	}
	return out, nil
}

// workerRecord decodes the presence record e stored under key k.
func workerRecord(k string, e jetstream.KeyValueEntry) (WorkerInfo, bool) {
	var w WorkerInfo
	if json.Unmarshal(e.Value(), &w) != nil || w.ID == "" || workerKey(w.ID) != k {
		return WorkerInfo{}, false
	}
	w.Lanes = w.Lanes[:min(len(w.Lanes), maxWorkerLanes)]
	w.Jobs = w.Jobs[:min(len(w.Jobs), MaxWorkerJobs)]
	w.Seen = e.Created()
	return w, true
}

// Worker returns the presence record of the worker id, and whether it is
// present: announced, not deleted, and refreshed within WorkerTTL.
func (b *Bus) Worker(ctx context.Context, id string) (WorkerInfo, bool, error) {
	if b.workers == nil {
		return WorkerInfo{}, false, ErrNoPresence
	}
	k := workerKey(id)
	e, err := b.workers.Get(ctx, k)
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		return WorkerInfo{}, false, nil
	}
	if err != nil {
		return WorkerInfo{}, false, fmt.Errorf("worker %s: %w", id, b.connErr(err))
	}
	w, ok := workerRecord(k, e)
	// The bucket drops a record WorkerTTL after its last refresh: no
	// clock of this machine's is compared with the server's.
	if !ok || w.ID != id {
		return WorkerInfo{}, false, nil
	}
	return w, true, nil
}
