package consumer

import (
	"errors"
	"fmt"

	"go.opentelemetry.io/otel/codes"

	"github.com/dlxbridge/dlxbridge/internal/amqpx"
	"github.com/dlxbridge/dlxbridge/triage"
)

// retryQueueMissing reports the retry queue c's copy was for, when c is a
// retry the broker returned: its exchange routed it to no queue, because
// that tier's (or lane's) queue was deleted or unbound, by hand or by a
// `topology delete` of another config. Requeued, as other failed publishes
// are, the message would run its handler again at every delivery, each
// retry returned the same way, until the crash-loop guard quarantined it
// as a crash loop, naming neither the cause nor the fix. No other queue
// can take the retry without changing its delay behind the handler's
// back, so the caller quarantines it instead (quarantineInstead): nothing
// is lost, and the record says what to restore. Not while the runtime is
// draining: afterConfirm leaves those to the channel close.
func (w *worker) retryQueueMissing(c confirmation) (queue string, ok bool) {
	if c.o.kind != kindRetry || !errors.Is(c.err, amqpx.ErrUnroutable) || w.s.handlerCtx.Err() != nil {
		return "", false
	}
	v := c.o.failed.f.verdict
	tiers := w.s.wq.Tiers // the route the retry was built for (see retryRoute)
	if v.Tier < 0 || v.Tier >= len(tiers) || v.Lane < 0 || v.Lane >= len(tiers[v.Tier].Lanes) {
		return "", false
	}
	return tiers[v.Tier].Lanes[v.Lane].Queue, true
}

// quarantineInstead turns o, a retry returned for want of retry queue
// queue (err), into the quarantine copy of the same failure, whose reason
// names the missing queue; counted by that name, and logged (sampled). A
// quarantine copy that cannot be built is settled as its failed publish
// (see publishCopy), as buildCopy's would be.
func (w *worker) quarantineInstead(o outcome, queue string, err error) outcome {
	fo := o.failed
	fo.out.span.RecordError(err)
	fo.out.span.SetStatus(codes.Error, err.Error())
	fo.out.span.End()
	w.deps.metrics.publishFailures.WithLabelValues(w.q.cfg.Name, "retry").Inc()
	w.deps.metrics.retryQueueMissing.WithLabelValues(w.q.cfg.Name, queue).Inc()
	// Every retry for that queue comes back so while it is gone: each
	// message's "quarantined" line has the reason and the metric counts
	// them all, so this line is sampled, as the gate's report-mode lines
	// are, rather than double the log in a storm of failures.
	fix := w.missingQueueFix()
	if ok, suppressed := w.q.missingTierLog.allow(w.deps.cfg.Now()); ok {
		w.failLog(&o).Error("retry tier queue is missing or unbound: the broker returned the retry; quarantining the message instead",
			"retry_queue", queue, "exchange", fo.out.b.exchange, "routing_key", fo.out.b.key, "fix", fix, "error", err, "suppressed_since_last", suppressed)
	}
	f := fo.f
	f.verdict.Action = triage.ActionQuarantine
	// The record outlives the log line: it names the binding as well,
	// since the broker returns the retry just the same when the queue is
	// there but unbound, and "missing" alone would send whoever finds the
	// queue in its place looking for something else.
	f.verdict.Reason = fmt.Sprintf("%s; not retried: the retry tier queue %s is missing, or not bound to exchange %s with key %s (the broker routed the retry to no queue; %s)",
		f.verdict.Reason, queue, fo.out.b.exchange, fo.out.b.key, fix)
	o.settled.noteFailure(f)
	out, perr := w.prepare(o.ctx, o.span, o.d, f, panicStack(f.err))
	o.kind = kindQuarantine
	fo.f, fo.out, fo.err = f, out, perr
	return o
}

// missingQueueFix says what restores the retry queues of this session's
// route. A session on its queue's own lanes while the config says shared
// (retryRoute's fallback: the shared tiers were not declared when it
// connected) keeps them until it reconnects, the apply notwithstanding,
// and an apply declares no retired lane: `topology delete --retired`
// removes an empty one once the apply has run. Only a restart (a new
// session) takes it to the shared tiers.
func (w *worker) missingQueueFix() string {
	if wq := w.s.wq; wq.PerQueue != nil && !wq.Shared() {
		return "this runtime retries into the queue's own lanes, the shared tiers having been missing when it connected: restart it once `dlxbridge topology apply` has declared them"
	}
	return "run `dlxbridge topology apply` to restore it"
}
