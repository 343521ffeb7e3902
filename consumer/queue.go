package consumer

import (
	"fmt"
	"sync"

	"github.com/dlxbridge/dlxbridge/config"
	"github.com/dlxbridge/dlxbridge/internal/frame"
	"github.com/dlxbridge/dlxbridge/quarantine"
	"github.com/dlxbridge/dlxbridge/schemas"
	"github.com/dlxbridge/dlxbridge/triage"
)

// queueRuntime is what stays fixed for one work queue across reconnects.
type queueRuntime struct {
	deps    *deps
	cfg     *config.Queue
	gate    *schemas.Gate // nil when the queue's gate is off
	policy  triage.Policy
	redact  quarantine.Redaction
	router  *router
	accepts map[string]map[string]bool
	// slots bounds running handlers to Concurrency across sessions: a
	// handler holds a slot until it returns, even after it was abandoned.
	slots chan struct{}
	// publishFailures remembers, by message id, why this process last
	// failed to publish a message's retry or quarantine copy, so that when
	// the crash-loop guard later quarantines it the envelope says the broker
	// refused publishes rather than leaving a bare "crash-loop".
	publishFailures failureMemo

	// metrics are the queue's children of the runtime's collectors.
	metrics *queueMetrics
	// processSpan names the span of a delivery's processing.
	processSpan string

	// reportLog samples the gate's report-mode logs, and missingTierLog
	// the error lines of retries returned for want of their queue
	// (quarantineInstead).
	reportLog, missingTierLog logSampler
	// breaker pauses the queue while its dependency is down; nil when
	// queues[].breaker is off (breaker.go).
	breaker *queueBreaker
}

func newQueueRuntime(d *deps, q *config.Queue) (*queueRuntime, error) {
	acceptSet := map[string]map[string]bool{}
	for _, a := range q.Accepts {
		acceptSet[a.Type] = map[string]bool{}
		for _, v := range a.Versions {
			acceptSet[a.Type][v] = true
		}
	}
	gate, err := newGate(d.cfg.Registry, q, d.cfg.File.Schemas.MaxBodyBytes)
	if err != nil {
		return nil, err
	}
	policy := q.Policy()
	if err := policy.Validate(); err != nil {
		return nil, fmt.Errorf("queue %q: retry policy: %w", q.Name, err)
	}
	var breaker *queueBreaker
	if q.Breaker.EnabledValue() {
		if breaker, err = newQueueBreaker(d, q.Name, q.Breaker.Policy()); err != nil {
			return nil, err
		}
	}
	return &queueRuntime{
		breaker:     breaker,
		deps:        d,
		cfg:         q,
		gate:        gate,
		policy:      policy,
		redact:      quarantine.Redaction{Headers: q.Quarantine.Redact.Headers, Fields: q.Quarantine.Redact.Fields, MaxBodyBytes: d.cfg.File.Schemas.MaxBodyBytes},
		accepts:     acceptSet,
		slots:       make(chan struct{}, q.Consumer.Concurrency),
		metrics:     d.metrics.forQueue(q.Name, len(policy.Tiers)),
		processSpan: q.Name + " process",
	}, nil
}

// failureMemo is a small bounded map from message id to the last publish
// failure and how many there were. Safe for concurrent use.
type failureMemo struct {
	mu sync.Mutex
	m  map[string]memoEntry
}

type memoEntry struct {
	last  string
	count int
}

const failureMemoSize = 1024

func (f *failureMemo) add(id, why string) {
	if id == "" {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.m == nil {
		f.m = map[string]memoEntry{}
	}
	if _, ok := f.m[id]; !ok && len(f.m) >= failureMemoSize {
		for k := range f.m { // evict an arbitrary entry: it only enriches a note
			delete(f.m, k)
			break
		}
	}
	e := f.m[id]
	f.m[id] = memoEntry{last: frame.Truncate(why, 256), count: e.count + 1}
}

// take returns and forgets what is known about id.
func (f *failureMemo) take(id string) (string, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	e, ok := f.m[id]
	if !ok {
		return "", 0
	}
	delete(f.m, id)
	return e.last, e.count
}
