package consumer

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/dlxbridge/dlxbridge/quarantine"
	"github.com/dlxbridge/dlxbridge/triage"
)

// retryNowBlocked says why a failure triage would retry in process can't
// be, "" if it can. Another call at once must not run beside an abandoned
// one, against a breaker or a dependency that asks for a pause, or past a
// stop or a closed channel; nor may it hold the deliveries prefetched
// behind it toward the broker's consumer_timeout, or cut the deadline of a
// message's last attempt.
func (w *worker) retryNowBlocked(herr error, abandoned, breakerAllows, lastNext bool) string {
	switch {
	case abandoned:
		return "the handler was abandoned past its deadline"
	case !breakerAllows:
		return "the queue's breaker is not closed"
	}
	if _, down := triage.IsDependencyDown(herr); down {
		return "the handler signalled its dependency is down"
	}
	switch {
	case w.s.isStopping() || w.s.handlerCtx.Err() != nil:
		return "the runtime is stopping"
	case w.s.ch != nil && w.s.ch.IsClosed():
		return "the consume channel is closed"
	}
	left, least := w.immediateTimeout(), w.q.leastImmediateCall()
	switch {
	case left < least:
		return fmt.Sprintf("the delivery has been held %s; another call would get %s of its %s share of %s beside the deliveries prefetched behind it, %d per worker, less than %s (toward the broker's consumer_timeout)",
			w.deps.cfg.Now().Sub(w.received).Round(time.Millisecond), max(left, 0).Round(time.Millisecond), w.q.immediateHold(), maxHold, w.q.queuedPerWorker(), least)
	case lastNext && left < w.q.cfg.Consumer.HandlerTimeout:
		// A cut deadline may time out a handler that its own timeout
		// would let succeed: never on the last attempt, which would
		// quarantine the message. A retry lane gives it the full timeout.
		return fmt.Sprintf("the next attempt is the last, and its deadline would be cut to %s of the handler timeout %s (the delivery's share of %s beside the deliveries prefetched behind it)",
			left.Round(time.Millisecond), w.q.cfg.Consumer.HandlerTimeout, maxHold)
	}
	return ""
}

// immediateTimeout is the deadline of an immediate retry's call: the
// handler timeout, or what is left of the delivery's share of maxHold
// (immediateHold) once the abandonment grace is set aside, if less. So a
// delivery's immediate retries add at most its share to the wait of the
// deliveries prefetched behind it, however many there are and however
// long each call could last, and a handler that fails at once still gets
// its immediate retries under a large prefetch.
func (w *worker) immediateTimeout() time.Duration {
	held := w.deps.cfg.Now().Sub(w.received)
	return min(w.q.cfg.Consumer.HandlerTimeout, w.q.immediateHold()-held-abandonGrace)
}

// leastImmediateCall is the shortest deadline worth an immediate retry's
// call: a second, or the handler timeout if shorter.
func (qr *queueRuntime) leastImmediateCall() time.Duration {
	return min(qr.cfg.Consumer.HandlerTimeout, time.Second)
}

// queuedPerWorker is how many prefetched deliveries may wait for each of
// the queue's workers.
func (qr *queueRuntime) queuedPerWorker() int {
	c := qr.cfg.Consumer
	return max(1, (c.Prefetch+c.Concurrency-1)/max(1, c.Concurrency))
}

// immediateHold is how long, at most, a worker retries one delivery in
// process: the deliveries prefetched behind it wait meanwhile, unacked
// (the broker's consumer_timeout counts from their delivery), and no
// client clock shows when they arrived. maxHold shared among the
// deliveries that can wait for one worker bounds what immediate retries
// add to the last one's wait to maxHold, whatever the retry count.
func (qr *queueRuntime) immediateHold() time.Duration {
	return maxHold / time.Duration(qr.queuedPerWorker())
}

// retryNow makes an immediate retry visible (metric, debug log, span
// event) and gives the next call fresh data: a handler may have changed
// the Data it was handed.
func (w *worker) retryNow(span trace.Span, recording bool, d *amqp.Delivery, msg *admitted, f failure) {
	qr := w.q
	v := f.verdict
	qr.metrics.immediateRetries.Inc()
	if w.deps.log.Enabled(context.Background(), slog.LevelDebug) {
		w.deps.log.Debug("retrying at once in process", "queue", qr.cfg.Name, "message_id", d.MessageId,
			"class", v.Class, "attempt", v.Attempt, "reason", v.Reason, "error", errString(f.err))
	}
	if recording {
		span.AddEvent("dlxbridge.immediate_retry", trace.WithAttributes(
			attribute.Int("dlxbridge.attempt", v.Attempt),
			attribute.String("dlxbridge.class", string(v.Class)),
			attribute.String("exception.message", quarantine.Truncate(errString(f.err), quarantine.MaxErrorBytes)),
		))
		span.SetAttributes(attribute.Int("dlxbridge.attempt", v.Attempt+1))
	}
	w.settled.Attempt = v.Attempt + 1
	msg.refresh()
}
