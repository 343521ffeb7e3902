package consumer

import (
	"strconv"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dlxbridge/dlxbridge/internal/telemetry"
	"github.com/dlxbridge/dlxbridge/triage"
)

// Reasons of dlxbridge_dead_lettered_total.
const (
	deadLetterMaxMessageSize = "max_message_size"
	deadLetterFrameMax       = "frame_max"
)

// metrics are the runtime's collectors. Labels are bounded: queue names come
// from the config, types/versions only from a queue's accepted list
// ("other" otherwise), classes and tiers from fixed sets.
type metrics struct {
	deliveries      *prometheus.CounterVec
	handlerDuration *prometheus.HistogramVec
	retries         *prometheus.CounterVec
	immediate       *prometheus.CounterVec
	quarantined     *prometheus.CounterVec
	validation      *prometheus.CounterVec
	attemptsSuccess *prometheus.HistogramVec
	publishFailures *prometheus.CounterVec
	publishConfirm  *prometheus.HistogramVec
	deadLettered    *prometheus.CounterVec
	// retryQueueMissing counts retries the broker returned because their
	// retry queue is gone, by work queue and that queue's name.
	retryQueueMissing *prometheus.CounterVec
	reconnects        prometheus.Counter
	// publishingBlocked is 1 while the broker blocks the publishing
	// connection (connection.blocked: a memory or disk alarm).
	publishingBlocked *prometheus.GaugeVec
	abandonedHandler  *prometheus.CounterVec
	// breakerState and breakerTransitions: docs/breaker.md.
	breakerState       *prometheus.GaugeVec
	breakerTransitions *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		deliveries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dlxbridge_deliveries_total",
			Help: "Deliveries settled by the runtime, by queue and outcome.",
		}, []string{"queue", "outcome"}),
		handlerDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "dlxbridge_handler_duration_seconds",
			Help:    "Time spent in handlers, by queue and result (ok or error).",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 10),
		}, []string{"queue", "result"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dlxbridge_retries_total",
			Help: "Delayed retries published (and confirmed), by queue and tier index.",
		}, []string{"queue", "tier"}),
		immediate: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dlxbridge_immediate_retries_total",
			Help: "Handler attempts retried at once in process, on the same delivery (queues[].retry.immediate_retries), by queue.",
		}, []string{"queue"}),
		quarantined: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dlxbridge_quarantined_total",
			Help: "Messages quarantined by the bridge, by queue and failure class.",
		}, []string{"queue", "class"}),
		validation: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dlxbridge_validation_failures_total",
			Help: "Messages that failed the schema gate, by queue, type, version, reason and gate mode (enforce: refused and quarantined; report: delivered anyway).",
		}, []string{"queue", "type", "version", "reason", "mode"}),
		attemptsSuccess: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "dlxbridge_attempts_at_success",
			Help:    "The attempt number on which a handler succeeded.",
			Buckets: []float64{1, 2, 3, 4, 5, 6, 8, 10, 15, 20},
		}, []string{"queue"}),
		publishFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dlxbridge_publish_failures_total",
			Help: "Retry, quarantine or re-admission copies published but not confirmed (returned, nacked, refused, channel lost, no confirm in time), by queue and kind. A copy never sent (it fits no frame, or its body is over the broker's limit learned on the connection) is not counted: its original is dead-lettered (dlxbridge_dead_lettered_total) or, a re-admission, handled in place.",
		}, []string{"queue", "kind"}),
		publishConfirm: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "dlxbridge_publish_confirm_seconds",
			Help: "Time from publishing a retry, quarantine or re-admission copy to the broker's confirm of it, by queue and kind, including any wait for a blocked connection to unblock and a re-send after another copy's size refusal; the failed delivery stays unacked, holding prefetch, meanwhile. Copies never confirmed are not observed (dlxbridge_publish_failures_total counts them).",
			// 0.5 ms to 10 s: a quorum queue's confirm waits for its log's
			// fsync; seconds mean a slow disk or a blocked broker. 1 s is a
			// bound: DlxbridgeConfirmsSlow's threshold, which
			// histogram_quantile would otherwise interpolate across.
			Buckets: []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10},
		}, []string{"queue", "kind"}),
		deadLettered: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dlxbridge_dead_lettered_total",
			Help: "Failed deliveries that no retry or quarantine copy could carry, rejected without requeue so that the broker dead-letters them as received into the quarantine, by queue and reason (max_message_size: the body is over the broker's limit; frame_max: not even the bare envelope fits one frame).",
		}, []string{"queue", "reason"}),
		retryQueueMissing: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dlxbridge_retry_queue_missing_total",
			Help: "Retries the broker returned because no retry queue took them (the tier or lane queue, by name, was deleted or unbound; `dlxbridge topology apply` restores it), quarantined instead, by queue and retry_queue.",
		}, []string{"queue", "retry_queue"}),
		reconnects: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dlxbridge_reconnects_total",
			Help: "Times the runtime lost its connection or a channel and reconnected.",
		}),
		publishingBlocked: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "dlxbridge_publishing_blocked",
			Help: "1 while the broker blocks the runtime's publishing connection (a memory or disk alarm), for each of its queues: no retry or quarantine copy can be sent, so failed deliveries wait unacked and no confirm wait is observed until it unblocks.",
		}, []string{"queue"}),
		abandonedHandler: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dlxbridge_handlers_abandoned_total",
			Help: "Handlers that ignored their deadline and were left running.",
		}, []string{"queue"}),
		breakerState: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "dlxbridge_breaker_state",
			Help: "Each queue's circuit breaker: 0 closed (consuming), 1 half-open (probing), 2 open (paused).",
		}, []string{"queue"}),
		breakerTransitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dlxbridge_breaker_transitions_total",
			Help: "Circuit breaker transitions, by queue, states and cause (consecutive, ratio, signal, timer, probe-failed, probes-succeeded).",
		}, []string{"queue", "from", "to", "cause"}),
	}
	if err := telemetry.Register(reg, m.deliveries, m.handlerDuration, m.retries, m.immediate, m.quarantined,
		m.validation, m.attemptsSuccess, m.publishFailures, m.publishConfirm, m.deadLettered, m.retryQueueMissing, m.reconnects, m.publishingBlocked, m.abandonedHandler,
		m.breakerState, m.breakerTransitions); err != nil {
		return nil, err
	}
	return m, nil
}

func tierLabel(i int) string { return strconv.Itoa(i) }

// queueMetrics are the children a queue's happy path updates, resolved once
// per queue (and outcome) rather than by label lookup per message.
type queueMetrics struct {
	handlerOK, handlerError prometheus.Observer
	attemptsSuccess         prometheus.Observer
	// confirmRetry, confirmQuarantine and confirmReadmit observe
	// dlxbridge_publish_confirm_seconds for each kind of copy.
	confirmRetry, confirmQuarantine, confirmReadmit prometheus.Observer
	immediateRetries                                prometheus.Counter
	queue                                           string
	deliveries                                      *prometheus.CounterVec
	outcomes                                        sync.Map // outcome → prometheus.Counter
}

// forQueue resolves queue's children. Every label set known at start (the
// outcomes, classes, the queue's tiers, the kinds of copy) is created at 0
// here, so that a dashboard or a rate() shows 0 rather than "No data" until
// a first event, and an alert on increase() sees the first one.
func (m *metrics) forQueue(queue string, tiers int) *queueMetrics {
	for _, o := range []Outcome{OutcomeAcked, OutcomeRetried, OutcomeQuarantined, OutcomeRequeued, OutcomeAckFailed,
		OutcomeAbandoned, OutcomeReadmitted, OutcomeDeadLettered} {
		m.deliveries.WithLabelValues(queue, string(o))
	}
	for _, c := range triage.Classes() {
		m.quarantined.WithLabelValues(queue, string(c))
	}
	for i := range tiers {
		m.retries.WithLabelValues(queue, tierLabel(i))
	}
	for _, k := range []string{"retry", "quarantine", "readmit"} {
		m.publishFailures.WithLabelValues(queue, k)
	}
	for _, r := range []string{deadLetterMaxMessageSize, deadLetterFrameMax} {
		m.deadLettered.WithLabelValues(queue, r)
	}
	m.abandonedHandler.WithLabelValues(queue)
	m.publishingBlocked.WithLabelValues(queue)
	qm := &queueMetrics{
		handlerOK:         m.handlerDuration.WithLabelValues(queue, "ok"),
		handlerError:      m.handlerDuration.WithLabelValues(queue, "error"),
		attemptsSuccess:   m.attemptsSuccess.WithLabelValues(queue),
		confirmRetry:      m.publishConfirm.WithLabelValues(queue, "retry"),
		confirmQuarantine: m.publishConfirm.WithLabelValues(queue, "quarantine"),
		confirmReadmit:    m.publishConfirm.WithLabelValues(queue, "readmit"),
		// Resolved up front: a queue's series exists (at 0) from the start.
		immediateRetries: m.immediate.WithLabelValues(queue),
		queue:            queue,
		deliveries:       m.deliveries,
	}
	return qm
}

// confirmWait is the observer of dlxbridge_publish_confirm_seconds for
// the copy a verdict's action publishes.
func (qm *queueMetrics) confirmWait(a triage.Action) prometheus.Observer {
	switch a {
	case triage.ActionRetry:
		return qm.confirmRetry
	case triage.ActionReadmit:
		return qm.confirmReadmit
	}
	return qm.confirmQuarantine
}

// succeeded observes a success on attempt.
func (qm *queueMetrics) succeeded(attempt int) { qm.attemptsSuccess.Observe(float64(attempt)) }

// settled counts one delivery settled with outcome.
func (qm *queueMetrics) settled(outcome Outcome) {
	if c, ok := qm.outcomes.Load(outcome); ok {
		c.(prometheus.Counter).Inc()
		return
	}
	c := qm.deliveries.WithLabelValues(qm.queue, string(outcome))
	qm.outcomes.Store(outcome, c)
	c.Inc()
}
