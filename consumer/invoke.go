package consumer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"runtime/debug"
	"slices"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/trace"

	"github.com/dlxbridge/dlxbridge/internal/wireval"
	"github.com/dlxbridge/dlxbridge/schemas"
	"github.com/dlxbridge/dlxbridge/triage"
	"github.com/dlxbridge/dlxbridge/wire"
)

// abandonGrace is how long a handler that ignores its deadline gets before
// the worker stops waiting for it.
const abandonGrace = time.Second

// The states of a handler call. The goroutine that runs the handler and the
// watchdog race to move a call out of callRunning; only the winner settles
// the delivery.
const (
	callRunning int32 = iota
	callReturned
	callAbandoned
)

// handlerCall is one handler call: its context, and what the goroutine that
// takes over from the worker needs to settle the delivery if the call is
// abandoned (see takeOver).
type handlerCall struct {
	callCtx
	state  atomic.Int32
	graced atomic.Bool // the grace period before abandonment has begun
	start  time.Time
	// timeout is the call's: the handler timeout, or less for an
	// immediate retry (worker.immediateTimeout).
	timeout time.Duration

	ctx  context.Context
	span trace.Span
	d    *amqp.Delivery
	// msg is a copy: a pointer would move process's to the heap.
	msg      admitted
	attempts triage.Attempts
}

// invoke calls the handler on d, on this goroutine, and again at once
// while triage answers ActionRetryNow (queues[].retry.immediate_retries) and
// the runtime can (see retryNowBlocked), and returns the delivery's
// outcome. It reports false when a call was abandoned (or the handler
// called runtime.Goexit): the goroutine that took over settles the delivery
// and ends the span.
func (w *worker) invoke(ctx context.Context, span trace.Span, a acker, d *amqp.Delivery, msg admitted, attempts triage.Attempts, now time.Time) (outcome, bool) {
	timeout := w.q.cfg.Consumer.HandlerTimeout
	for immediate := 0; ; immediate++ {
		herr, ok := w.runHandler(ctx, span, d, &msg, attempts, now, timeout)
		if !ok {
			return outcome{}, false
		}
		o, again := w.handled(ctx, span, a, d, &msg, &attempts, immediate, herr, false)
		if !again {
			return o, true
		}
		// Checked by retryNowBlocked a moment ago: at least
		// leastImmediateCall, unless the clock jumped since.
		timeout = max(w.immediateTimeout(), w.q.leastImmediateCall())
	}
}

// runHandler routes, upcasts and calls the handler with a deadline, on the
// worker's own goroutine: no hand-off to another goroutine and back for
// each delivery. The upcasters and the handler run under recover, so a panic
// in either is a classified failure, never a crashed process.
//
// A handler that ignores its deadline (or the session's cancel) is
// abandoned after abandonGrace: the worker's watchdog marks the call
// abandoned, and its goroutine takes over as the worker (takeOver): it
// settles the delivery as a timeout and goes on with the next ones. The
// goroutine left in the handler keeps its concurrency slot (see
// queueRuntime.slots) until the handler returns, so handlers never run more
// than Concurrency at once; then it discards the result, frees the slot and
// ends, touching nothing of the worker's: ok false tells process so.
func (w *worker) runHandler(ctx context.Context, span trace.Span, d *amqp.Delivery, gm *admitted, attempts triage.Attempts, now time.Time, timeout time.Duration) (herr error, ok bool) {
	qr := w.q
	h, version, chain, err := qr.router.route(gm.Type, gm.Version)
	if err != nil {
		return err, true
	}
	body := d.Body
	if qr.policy.ImmediateRetries > 0 {
		// Another call may follow on this delivery: the handler gets a
		// copy, so bytes it writes into Body can't reach the next call's
		// Bind and Data (which read the text the gate validated, a part of
		// d.Body) or the retry and quarantine copies (d.Body, as received).
		body = bytes.Clone(d.Body)
	}
	m := &Message{
		Queue:           qr.cfg.Name,
		Type:            gm.Type,
		Version:         version,
		OriginalVersion: gm.Version,
		text:            gm.Raw,
		gated:           gm.Message,
		Body:            body,
		// A deep copy: the tables, arrays and byte arrays nested in it
		// too. The runtime republishes d.Headers (the retry, the
		// quarantine's record as received) and the next immediate call
		// reads them; an abandoned handler must not write into what the
		// takeover encodes.
		Headers:        cloneHeaders(d.Headers),
		MessageID:      d.MessageId,
		CorrelationID:  d.CorrelationId,
		IdempotencyKey: idempotencyKey(d),
		Attempt:        attempts.Failed + 1,
		ReceivedAt:     now,
		GateError:      cloneGateError(gm.reported),
		raw:            gm.raw,
	}
	select {
	case qr.slots <- struct{}{}:
	default: // every slot is taken: wait for one
		select {
		case qr.slots <- struct{}{}:
		case <-w.s.handlerCtx.Done():
			return w.s.handlerCtx.Err(), true
		}
	}
	c := &handlerCall{start: time.Now(), ctx: ctx, span: span, d: d, msg: *gm, attempts: attempts}
	c.timeout = timeout
	c.callCtx.init(ctx, c.start.Add(timeout))
	if w.watch == nil {
		w.watch = newWatchdog(w.s.handlerCtx, w.takeOver)
	}
	w.watch.start(c)
	// A handler (or upcaster) that calls runtime.Goexit (t.FailNow in a
	// test's handler does) ends this goroutine: recover can't stop it. The
	// call is then taken over at once, as an abandoned one would be after
	// its deadline and grace, and settled as a panic.
	goexit := true
	defer func() {
		if goexit && c.state.CompareAndSwap(callRunning, callAbandoned) {
			go w.takeOver(c, &triage.PanicError{Value: "the handler called runtime.Goexit"})
		}
	}()
	herr = qr.call(&c.callCtx, h, m, chain)
	goexit = false
	if !c.state.CompareAndSwap(callRunning, callReturned) {
		// Abandoned: another goroutine is the worker now, and it has
		// settled the delivery. Nothing here is this goroutine's any more.
		if h := qr.deps.cfg.hooks; h != nil && h.abandonedReturned != nil {
			h.abandonedReturned()
		}
		return nil, false
	}
	w.watch.finish()
	// A handler may keep its context (c) after it returns: it must not
	// keep the delivery and its decoded body alive with it.
	c.ctx, c.span, c.d, c.msg = nil, nil, nil, admitted{}
	return w.handlerReturned(c, herr), true
}

// call runs the upcasters and the handler under recover, and frees the
// concurrency slot when the handler returns.
func (qr *queueRuntime) call(ctx context.Context, h Handler, m *Message, chain []upcaster) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &triage.PanicError{Value: v, Stack: debug.Stack()}
		}
		<-qr.slots
	}()
	if err := qr.upcast(m, chain); err != nil {
		return err
	}
	return h.Handle(ctx, m)
}

// upcast runs the upcaster chain on m.Data and validates the result against
// the target version's schema. Its failures are permanent: the same input
// always upcasts the same way. A message that failed a report-mode gate is
// upcast as it is (a body that is not JSON can't be), and its result is not
// validated again: the gate reported it once.
func (qr *queueRuntime) upcast(m *Message, chain []upcaster) error {
	if len(chain) == 0 {
		return nil
	}
	data, err := m.Data() // the upcasters need the tree: decoded here
	if m.GateError != nil && (err != nil || data == nil) {
		return triage.Permanent(fmt.Errorf("upcast %s v%s: no data: %w", m.Type, m.OriginalVersion, m.GateError))
	}
	if err != nil {
		return triage.Permanent(fmt.Errorf("upcast %s v%s: %w", m.Type, m.OriginalVersion, err))
	}
	for _, u := range chain {
		var err error
		if data, err = u.fn(data); err != nil {
			return triage.Permanent(fmt.Errorf("upcast %s to v%s: %w", m.Type, u.to, err))
		}
	}
	// Validated as the gate validates: the violations never quote a value
	// (jsonschema's own error text does), since the error goes into the
	// quarantine envelope, its fingerprint and the log. A message the gate
	// only reported is not held to its schema here either.
	if m.GateError == nil {
		if err := qr.deps.cfg.Registry.Validate(m.Type, m.Version, data); err != nil {
			return triage.Permanent(fmt.Errorf("upcast %s v%s→v%s produced invalid data: %w", m.Type, m.OriginalVersion, m.Version, err))
		}
	}
	m.setData(data)
	return nil
}

// handlerReturned ends call c with the handler's result herr (or the
// abandonment's) and observes its duration; it returns herr as the
// delivery's outcome: a handler that returns some error after its deadline
// passed timed out.
func (w *worker) handlerReturned(c *handlerCall, herr error) error {
	qr := w.q
	if herr != nil && !time.Now().Before(c.deadline) {
		// Its deadline passed as it returned: the worker saw the result
		// first, the handler may have seen its context end.
		c.end(context.DeadlineExceeded)
	}
	if herr != nil && c.Err() == context.DeadlineExceeded && !errors.Is(herr, context.DeadlineExceeded) {
		herr = fmt.Errorf("%w (after the %s deadline: %w)", herr, c.timeout, context.DeadlineExceeded)
	}
	c.end(context.Canceled) // it returned (or was abandoned): its context ends, as a cancel would end it
	took := time.Since(c.start).Seconds()
	if herr != nil {
		qr.metrics.handlerError.Observe(took)
	} else {
		qr.metrics.handlerOK.Observe(took)
	}
	return herr
}

// handled decides a delivery's outcome after its handler returned herr, or
// was abandoned (a timeout, settled by the goroutine that took over).
// Unless it was abandoned, a failure triage would retry in process has no
// outcome yet: handled counts the attempt in attempts, prepares msg for the
// next call and reports again, and the caller calls the handler once more.
func (w *worker) handled(ctx context.Context, span trace.Span, a acker, d *amqp.Delivery, msg *admitted, attempts *triage.Attempts, immediate int, herr error, abandoned bool) (o outcome, again bool) {
	qr := w.q
	attempt := attempts.Failed + 1
	breakerAllows := w.breakerOutcome(herr)
	if herr != nil && w.s.handlerCtx.Err() != nil {
		// Shutdown passed its deadline (or the connection is gone): don't
		// start a retry or quarantine publish; leave the message unsettled
		// and the broker requeues it when the channel closes. A handler that
		// succeeded is still acked below if the channel is open.
		w.settled.Err = herr
		return outcome{kind: kindLeave, a: a, d: d, span: span, settled: w.settled}, false
	}
	if herr == nil {
		w.settled.Attempt = attempt
		return outcome{kind: kindAck, a: a, d: d, span: span, settled: w.settled}, false
	}
	f := qr.decide(herr, *attempts, immediate, msg.Type, msg.Version)
	if f.verdict.Action == triage.ActionRetryNow {
		lastNext := f.verdict.Attempt+1 >= qr.policy.MaxAttempts
		if why := w.retryNowBlocked(herr, abandoned, breakerAllows, lastNext); why != "" {
			// Decided again as if the immediate retries were spent: a
			// delayed retry or, past a budget, the quarantine.
			f = qr.decide(herr, *attempts, qr.policy.ImmediateRetries, msg.Type, msg.Version)
			f.verdict.Reason += "; not retried in process: " + why
		} else {
			// The next attempt counts this one as failed, and the budgets
			// run from the first failure, here if this was it.
			attempts.Failed = f.verdict.Attempt
			if attempts.FirstFailure.IsZero() {
				attempts.FirstFailure = f.at
			}
			w.retryNow(span, span.IsRecording(), d, msg, f)
			return outcome{}, true
		}
	}
	return outcome{kind: kindFailed, a: a, d: d, ctx: ctx, span: span, settled: w.settled, failed: &failedOutcome{f: f}}, false
}

// breakerOutcome records the handler's result: herr's outcome, or
// abandoned when the session is ending (a handler cancelled by shutdown
// looks transient). Each handler call of a delivery is recorded, immediate
// retries included: each one is a call to the dependency. It reports
// whether the breaker lets a failed delivery be retried in process: with no
// breaker, yes; else only a delivery it admitted as closed (not a probe:
// its one outcome is the probe's answer) while it is still closed after
// this outcome. An open breaker asks for the queue to wait; retrying in
// process would call the dependency it paused for.
func (w *worker) breakerOutcome(herr error) (again bool) {
	a := &w.admission
	if !a.open && !a.again {
		return a.qb == nil
	}
	a.open, a.again = false, false
	o := triage.OutcomeOf(herr)
	if herr != nil && w.s.handlerCtx.Err() != nil {
		o = triage.Outcome{Abandoned: true}
	}
	a.qb.record(a.ticket, o)
	a.again = herr != nil && !a.ticket.Probe() && a.qb.b.State() == triage.BreakerClosed
	return a.again
}

// decide classifies a failed attempt with triage.Classify, the one path for
// every class (the gate's *schemas.ValidationError is ClassSchema), and
// decides what follows; immediate is how many immediate retries the
// delivery had. typ and version default to the ones the gate's error names.
func (qr *queueRuntime) decide(err error, attempts triage.Attempts, immediate int, typ, version string) failure {
	f := failure{attempts: attempts, err: err, msgType: typ, version: version, at: qr.deps.cfg.Now()}
	// errors.AsType: errors.As(err, &f.validation) would move f to the heap.
	if verr, ok := errors.AsType[*schemas.ValidationError](err); ok {
		f.validation = verr
		if typ == "" {
			f.msgType, f.version = verr.Type, verr.Version
		}
	}
	class, hint := triage.Classify(err)
	f.verdict = triage.Decide(qr.policy, triage.Failure{Class: class, Hint: hint, Attempts: attempts, ImmediateRetries: immediate, Now: f.at}, randFunc(qr.deps.cfg.Rand))
	return f
}

// takeOver runs on the watchdog's goroutine once call c is abandoned (its
// handler ignored its deadline for abandonGrace more): the worker's own
// goroutine is still in the handler, so this one settles the delivery as a
// timeout, as the worker would have, and then goes on as the worker.
//
// With exited set (a *triage.PanicError), the worker's goroutine did not
// stay in the handler: it called runtime.Goexit, and is gone. The delivery
// settles with exited as its failure.
func (w *worker) takeOver(c *handlerCall, exited error) {
	qr := w.q
	herr := exited
	if exited == nil {
		w.deps.metrics.abandonedHandler.WithLabelValues(qr.cfg.Name).Inc()
		w.deps.log.Error("handler ignored its deadline; abandoning it (it keeps its concurrency slot until it returns)",
			"queue", qr.cfg.Name, "type", c.msg.Type, "message_id", c.d.MessageId)
		herr = fmt.Errorf("handler did not return within %s: %w", c.timeout, context.DeadlineExceeded)
	} else {
		w.deps.log.Error("handler called runtime.Goexit; another goroutine goes on as the worker",
			"queue", qr.cfg.Name, "type", c.msg.Type, "message_id", c.d.MessageId)
		w.watch.finish()
	}
	herr = w.handlerReturned(c, herr)
	// The delivery settles through its session, as process settles it.
	// Abandoned: never retried in process (its handler still holds a slot).
	o, _ := w.handled(c.ctx, c.span, sessionDelivery{s: w.s, d: c.d}, c.d, &c.msg, &c.attempts, 0, herr, true)
	w.settle(o)
	// The abandoned handler may keep its context (c) for as long as it
	// runs, or longer: as on a return in time (runHandler), c lets go of
	// the delivery, which is its held and, through it, its session.
	c.ctx, c.span, c.d, c.msg = nil, nil, nil, admitted{}
	w.admission.release()
	if w.looping {
		w.work()
	}
}

func idempotencyKey(d *amqp.Delivery) string {
	if k := wireval.Str(d.Headers, wire.HeaderIdempotencyKey); k != "" {
		return k
	}
	return d.MessageId
}

// cloneGateError copies a report-mode gate's objection for one handler
// call: a handler that writes into it must not change what the next call
// on the delivery gets, nor the objection Config.OnSettled reports.
func cloneGateError(e *schemas.ValidationError) *schemas.ValidationError {
	if e == nil {
		return nil
	}
	c := *e
	c.Violations = slices.Clone(e.Violations)
	return &c
}

// cloneHeaders copies h and every table, array and byte array in it (the
// values amqp091-go decodes a field table into), so nothing a handler
// writes reaches h. Scalars are shared: they are immutable.
func cloneHeaders(h amqp.Table) amqp.Table {
	out := maps.Clone(h)
	for k, v := range out {
		switch v.(type) {
		case amqp.Table, map[string]any, []any, []byte:
			out[k] = cloneHeaderValue(v)
		}
	}
	return out
}

func cloneHeaderValue(v any) any {
	switch v := v.(type) {
	case amqp.Table:
		if v == nil {
			return v
		}
		out := make(amqp.Table, len(v))
		for k, e := range v {
			out[k] = cloneHeaderValue(e)
		}
		return out
	case map[string]any:
		if v == nil {
			return v
		}
		out := make(map[string]any, len(v))
		for k, e := range v {
			out[k] = cloneHeaderValue(e)
		}
		return out
	case []any:
		if v == nil {
			return v
		}
		out := make([]any, len(v))
		for i, e := range v {
			out[i] = cloneHeaderValue(e)
		}
		return out
	case []byte:
		return bytes.Clone(v)
	}
	return v
}
