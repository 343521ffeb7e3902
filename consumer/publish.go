package consumer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"

	"github.com/dlxbridge/dlxbridge/internal/amqpx"
)

// A retry, re-admission or quarantine copy is published here: sendCopy
// hands it to the worker's confirmer (sessionPublisher: a confirm pipeline,
// mandatory set), and the worker's settler takes the confirms as they come:
// the original is acked once its copy is confirmed, or rejected with
// requeue when the publish failed.

// pipelineDepth bounds a worker's retry and quarantine publishes awaiting
// their confirms: past it the worker waits for one before it takes the next
// delivery.
const pipelineDepth = 64

// sendCopy publishes o's copy without waiting for its confirm: the worker
// goes on with its next deliveries, and the settler finishes o when the
// confirm arrives. With pipelineDepth copies awaiting confirms it first
// waits for one; past the drain deadline o is left unsettled, for the
// channel close to requeue.
func (w *worker) sendCopy(o outcome) {
	select {
	case w.awaiting <- struct{}{}:
	case <-w.s.handlerCtx.Done():
		o.failed.out.span.End()
		o.span.End()
		w.done(&o, OutcomeAbandoned, nil)
		return
	}
	w.settling.Add(1)
	w.publishCopy(o)
}

// publishCopy publishes o's copy for the settler. The caller holds a slot
// of w.awaiting for it and counts it in w.settling.
func (w *worker) publishCopy(o outcome) {
	fo := o.failed
	wait := w.q.metrics.confirmWait(fo.f.verdict.Action)
	sent := time.Now()
	confirmed := func(err error) {
		c := confirmation{o: o, err: err}
		if err == nil {
			wait.Observe(time.Since(sent).Seconds())
		} else {
			c.at = time.Now()
			c.ended = w.s.handlerCtx.Err() != nil
		}
		w.confirmed <- c
	}
	if fo.err != nil { // not built: settled as a failed publish
		confirmed(fo.err)
		return
	}
	w.out.Publish(fo.out.ctx, fo.out.b.exchange, fo.out.b.key, fo.out.b.p, confirmed)
}

// settleInOrder returns once every settlement the worker has in flight is
// finished and its ack read by the broker. A re-admission waits for it: its
// copy goes to this same queue and can be delivered before its confirm
// reaches the publishing connection, and handled while the original is
// unacked, a crash would requeue the original and re-admit it once more.
// Written is not enough: a process killed with deliveries unread resets
// its connection, and the broker drops what it had not read yet.
func (w *worker) settleInOrder() {
	w.settling.Wait()
	w.s.acks.flush(true)
	// A closed channel fails it; the session is ending then, and the
	// broker requeues what it had not read anyway.
	_ = w.s.sub.sync()
}

// sessionPublisher is a worker's confirmer: a confirm pipeline on the
// session's publishing connection, opened on first use. Each worker has its
// own; mu lets a re-send (see Publish) share it.
type sessionPublisher struct {
	s    *queueSession
	mu   sync.Mutex
	pipe *amqpx.Pipeline
}

// Publish sends with confirm + mandatory on the pipeline.
//
// While the broker blocks the publishing connection (a resource alarm) it
// reads nothing from it: a publish, or opening a channel for one, would only
// wait, and a timeout would requeue the message and run its handler again
// for nothing. So publish first waits for the unblock, holding the delivery,
// until the drain deadline.
//
// A publish in flight when the broker closed the channel for another one's
// size (amqpx.ErrBesideRefusal) is sent again, on a new channel, before
// confirmed hears of it (see resending): one oversized copy costs the
// others on the channel nothing but, at worst, a duplicate.
func (sp *sessionPublisher) Publish(ctx context.Context, exchange, key string, p amqp.Publishing, confirmed func(error)) {
	sp.publish(ctx, exchange, key, p, sp.resending(ctx, exchange, key, p, confirmed, maxResends))
}

// maxResends bounds how often one publish is sent again after refusals of
// others (each refusal takes one oversized publish out of the pipeline,
// and the limit it teaches holds the later ones back, so a second round is
// already rare).
const maxResends = 4

// resending wraps confirmed: a publish failed beside another's refusal is
// sent again (up to left times), and a refusal teaches the connection the
// broker's limit at once, before the publishes failed beside it are sent
// again.
func (sp *sessionPublisher) resending(ctx context.Context, exchange, key string, p amqp.Publishing, confirmed func(error), left int) func(error) {
	return func(err error) {
		if max, ok := amqpx.IsTooLarge(err); ok {
			sp.s.maxSize.learn(max)
		}
		if left > 0 && errors.Is(err, amqpx.ErrBesideRefusal) && sp.s.handlerCtx.Err() == nil {
			// Called on the pipeline's goroutine, which must not block
			// (nor open a channel).
			go sp.publish(ctx, exchange, key, p, sp.resending(ctx, exchange, key, p, sentBefore(confirmed, err), left-1))
			return
		}
		confirmed(err)
	}
}

// sentBefore wraps the confirmed of a copy sent again after it failed
// beside another's refusal (beside): held back on the re-send, it still
// went out once and lost its channel, so the error says so (heldBack
// tells it from a copy never sent).
func sentBefore(confirmed func(error), beside error) func(error) {
	return func(err error) {
		if heldBack(err) {
			err = fmt.Errorf("%w (sent before, it failed beside another's refusal: %w)", err, beside)
		}
		confirmed(err)
	}
}

// publish sends p on the pipeline, unless its body is over the broker's
// limit as learned on this connection (*overLimitError: sent, it would
// close the channel under the others).
func (sp *sessionPublisher) publish(ctx context.Context, exchange, key string, p amqp.Publishing, confirmed func(error)) {
	if limit := sp.s.maxSize.get(); overLimit(len(p.Body), limit) {
		confirmed(&overLimitError{size: int64(len(p.Body)), limit: limit})
		return
	}
	if err := sp.s.blocking.Wait(sp.s.handlerCtx); err != nil {
		_, reason := sp.s.blocking.Blocked()
		confirmed(fmt.Errorf("the broker blocks publishing (%s) and the runtime is stopping: %w", reason, err))
		return
	}
	pipe, err := sp.pipeline()
	if err == nil {
		err = pipe.Publish(context.WithoutCancel(ctx), exchange, key, p, confirmed)
	}
	if err != nil {
		// An error of this publish's own leaves the others in flight on
		// the pipeline: failing them would requeue originals whose copies
		// the broker may well confirm.
		if pipe != nil && errors.Is(err, amqpx.ErrPublisherClosed) {
			sp.retire(pipe)
		}
		confirmed(err)
	}
}

// pipeline returns the confirm pipeline, opening one if needed: one whose
// channel died is replaced.
func (sp *sessionPublisher) pipeline() (*amqpx.Pipeline, error) {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if sp.pipe != nil {
		if !sp.pipe.Broken() {
			return sp.pipe, nil
		}
		sp.pipe = nil // it ends by itself once it has failed what it held
	}
	p, err := amqpx.NewPipeline(sp.s.handlerCtx, sp.s.pubConn, pipelineDepth)
	if err != nil {
		return nil, err
	}
	sp.pipe = p
	go sp.s.watchConfirms(p)
	return p, nil
}

// retire closes pipe, broken by a publish, unless a re-send has replaced it
// already (then the one in use stays).
func (sp *sessionPublisher) retire(pipe *amqpx.Pipeline) {
	sp.mu.Lock()
	if sp.pipe == pipe {
		sp.pipe = nil
	}
	sp.mu.Unlock()
	pipe.Close()
}

// close fails what still awaits a confirm and closes the pipeline's
// channel (without waiting for the close-ok: during a resource alarm none
// comes, and the channel closes with the publishing connection, which the
// session closes next).
func (sp *sessionPublisher) close() {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if sp.pipe != nil {
		sp.pipe.Close()
		sp.pipe = nil
	}
}

// publishTimeout bounds the wait for a publisher confirm while the
// publishing connection is not blocked.
const publishTimeout = 30 * time.Second

// errConfirmTimeout ends a confirm wait that took publishTimeout.
var errConfirmTimeout = fmt.Errorf("no publisher confirm within %s", publishTimeout)

// watchConfirms bounds p's confirm waits: at the drain deadline, and when
// the oldest unconfirmed publish has waited publishTimeout while the
// publishing connection is not blocked, p fails what it holds (whether the
// broker has those copies is unknown). While the broker blocks the
// connection a confirm comes only after the unblock, so the wait goes on
// until it, and publishTimeout more.
func (qs *queueSession) watchConfirms(p *amqpx.Pipeline) {
	tick := time.NewTicker(min(publishTimeout/4, time.Second))
	defer tick.Stop()
	var blockedUntil time.Time
	for {
		select {
		case <-p.Done():
			return
		case <-qs.handlerCtx.Done():
			p.Fail(context.Cause(qs.handlerCtx))
			return
		case <-tick.C:
		}
		if blocked, _ := qs.blocking.Blocked(); blocked {
			blockedUntil = time.Now()
			continue
		}
		if sent, ok := p.Oldest(); ok && time.Since(later(sent, blockedUntil)) >= publishTimeout {
			p.Fail(errConfirmTimeout)
			return
		}
	}
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// confirmation is a copy's confirm (err nil) or failure (at at, ended
// when the drain deadline had passed by then), for the settler.
type confirmation struct {
	o     outcome
	err   error
	at    time.Time
	ended bool
}

// settler finishes, one at a time and in the order their confirms came,
// the settlements whose publishes were confirmed or failed.
func (w *worker) settler() {
	defer close(w.settlerDone)
	for c := range w.confirmed {
		if q, ok := w.retryQueueMissing(c); ok {
			// Its quarantine copy keeps the slot and the count.
			go w.publishCopy(w.quarantineInstead(c.o, q, c.err))
		} else {
			w.afterConfirm(c)
			<-w.awaiting
			w.settling.Done()
		}
		if len(w.confirmed) == 0 {
			// About to wait: its acks must not wait for a worker that may
			// itself be waiting for a delivery.
			w.s.acks.flush(false)
		}
	}
}

// afterConfirm settles c.o once its copy was confirmed (c.err nil) or
// failed: the ack, or the requeue. It runs on the settler.
func (w *worker) afterConfirm(c confirmation) {
	o, err := c.o, c.err
	defer o.span.End()
	fo := o.failed
	if err != nil {
		fo.out.span.RecordError(err)
		fo.out.span.SetStatus(codes.Error, err.Error())
	}
	fo.out.span.End()
	result, _ := o.kind.labels()
	if err != nil && w.s.handlerCtx.Err() != nil {
		// The drain deadline passed while the publish waited (typically on
		// a connection blocked by a resource alarm). Whether the broker has
		// the copy is unknown: the original is left unsettled, and the
		// channel close requeues it. Not a failure of the message's; but
		// a failure that came while the session still ran (the settler
		// was busy: a requeue's pause) is the broker's word on the copy.
		if !c.ended {
			w.countPublishFailure(o, err)
		}
		w.done(&o, OutcomeAbandoned, nil)
		o.span.SetStatus(codes.Error, "shutdown before settle")
		w.failLog(&o).Warn("shutdown before the retry/quarantine publish was confirmed; the original is left to be requeued", "action", fo.f.verdict.Action, "error", err)
		return
	}
	if err != nil {
		w.requeue(o, err, c.at)
		return
	}
	w.pubFailures = 0
	if o.span.IsRecording() {
		o.span.SetAttributes(attribute.String("dlxbridge.outcome", string(result)))
		if o.kind == kindQuarantine {
			o.span.SetStatus(codes.Error, "quarantined: "+fo.f.verdict.Reason)
		}
	}
	w.ack(o, result)
}

// labels names a copy's kind: its outcome once acked, and its label in
// dlxbridge_publish_failures_total.
func (k outcomeKind) labels() (result Outcome, copyKind string) {
	switch k {
	case kindRetry:
		return OutcomeRetried, "retry"
	case kindReadmit:
		return OutcomeReadmitted, "readmit"
	}
	return OutcomeQuarantined, "quarantine"
}

// requeue settles o after its copy's publish failed with err: the
// original is rejected with requeue (the broker keeps it, and the
// crash-loop guard bounds the loop), after a pause of this worker's; a
// copy no retry could send is dead-lettered instead.
func (w *worker) requeue(o outcome, err error, failedAt time.Time) {
	fo := o.failed
	v := fo.f.verdict
	_, kind := o.kind.labels()
	w.countPublishFailure(o, err)
	if max, ok := amqpx.IsTooLarge(err); ok {
		// The broker refused this copy for its body's size (before routing
		// it: no queue has it) and named its limit, which the connection's
		// later copies are checked against before they are sent.
		w.s.maxSize.learn(max)
	}
	if why, no := unsendable(err); no && o.kind != kindReadmit {
		// No copy of this body can be sent: refused by the broker, or held
		// back by the publisher (*overLimitError) once it knew the limit.
		fo.why, fo.err = why, err
		w.deadLetter(o)
		return
	}
	// A re-admission's handler never ran: requeued below, it comes back
	// and, the limit known now, is handled in place.
	w.q.publishFailures.add(o.d.MessageId, err.Error())
	// Requeued messages come straight back: the pause (this worker takes
	// no delivery until then) keeps a broker that can't take publishes
	// from burning their deliveries in a hot loop. Failures that come
	// together, as a lost channel's do, join one pause rather than add up.
	until := time.Unix(0, w.pauseUntil.Load())
	if !failedAt.Before(until) {
		until = time.Now().Add(w.publishBackoff())
		w.pauseUntil.Store(until.UnixNano())
	}
	w.failLog(&o).Error("publish failed; requeueing the original (not acked)", "action", v.Action, "error", err, "after", time.Until(until).Round(time.Millisecond).String())
	o.span.SetStatus(codes.Error, kind+" publish failed")
	t := time.NewTimer(time.Until(until))
	select {
	case <-t.C:
	case <-w.s.handlerCtx.Done():
	}
	t.Stop()
	// reject, not nack: from RabbitMQ 4.3 only reject with requeue raises
	// the delivery count the crash-loop guard relies on.
	if rerr := o.a.Requeue(); rerr != nil {
		// Not requeued by us: the broker requeues it when the channel
		// closes. Said as a failed reject is (see deadLetter).
		w.failLog(&o).Warn("requeue failed (channel gone); the broker will redeliver", "error", rerr)
		w.done(&o, OutcomeAckFailed, fmt.Errorf("requeue after the failed %s publish: %w (the publish: %w)", kind, rerr, err))
		return
	}
	w.done(&o, OutcomeRequeued, err)
}

// countPublishFailure counts o's copy, failed with err, in
// publish_failures. Only a copy that went out is a failed publish: one
// never built or held back (dead-lettered, or a re-admission requeued)
// says nothing of the broker, and would trip its alert.
func (w *worker) countPublishFailure(o outcome, err error) {
	if o.failed.err != nil || heldBack(err) {
		return
	}
	_, kind := o.kind.labels()
	w.deps.metrics.publishFailures.WithLabelValues(w.q.cfg.Name, kind).Inc()
}

// publishBackoff is the pause after the n-th consecutive failed publish:
// 100ms doubling up to 10s, with full jitter on the upper half.
func (w *worker) publishBackoff() time.Duration {
	w.pubFailures++
	d := min(100*time.Millisecond<<min(w.pubFailures-1, 10), 10*time.Second)
	return d/2 + time.Duration(w.deps.cfg.Rand()*float64(d/2))
}
