package consumer

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"runtime/debug"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/quarantine"
	"github.com/dlxbridge/dlxbridge/triage"
)

// abandonGrace is how long a handler that ignores its deadline gets before
// the worker stops waiting for it.
const abandonGrace = time.Second

// runHandler routes, upcasts and calls the handler with a deadline. The
// upcasters and the handler run on the worker's handler goroutine (see
// handlerRunner) under recover, so a panic in either is a classified
// failure, never a crashed process. A handler that ignores its deadline is
// abandoned after abandonGrace: the delivery is settled as a timeout while
// the goroutine keeps its slot (see queueRuntime.slots) until it returns, so
// handlers never run more than Concurrency at once; the worker goes on with
// a new handler goroutine. abandoned reports that: such a delivery is never
// retried in process. attempt is Message.Attempt, now the delivery's
// receipt.
func (w *worker) runHandler(ctx context.Context, d *amqp.Delivery, gm *admitted, attempt int, now time.Time) (herr error, abandoned bool) {
	qr := w.q
	h, version, chain, err := qr.router.route(gm.Type, gm.Version)
	if err != nil {
		return err, false
	}
	m := &Message{
		Queue:           qr.cfg.Name,
		Type:            gm.Type,
		Version:         version,
		OriginalVersion: gm.Version,
		text:            gm.Raw,
		gated:           gm.Message,
		Body:            d.Body,
		// A copy: an abandoned handler must not share a map the runtime
		// reads when it republishes.
		Headers:        maps.Clone(d.Headers),
		MessageID:      d.MessageId,
		CorrelationID:  d.CorrelationId,
		IdempotencyKey: idempotencyKey(d),
		Attempt:        attempt,
		ReceivedAt:     now,
		GateError:      gm.reported,
		raw:            gm.raw,
	}
	select {
	case qr.slots <- struct{}{}:
	case <-w.s.handlerCtx.Done():
		return w.s.handlerCtx.Err(), false
	}
	start := time.Now()
	hctx := newCallCtx(ctx, start.Add(qr.cfg.Consumer.HandlerTimeout))
	if w.watch == nil {
		w.watch = newWatchdog()
	}
	w.watch.start(hctx)
	if w.run == nil {
		w.run = newHandlerRunner(qr)
	}
	run := w.run
	run.jobs <- handlerJob{ctx: hctx, h: h, m: m, chain: chain}
	expired := false
	for waiting := true; waiting; {
		select {
		case herr = <-run.done:
			waiting = false
		case c := <-w.watch.expired:
			// One the watchdog ended as this call's predecessor returned
			// is skipped.
			expired = c == hctx
			waiting = !expired
		case <-ctx.Done():
			hctx.end(ctx.Err())
			expired, waiting = true, false
		}
	}
	w.watch.finish()
	if expired {
		select {
		case herr = <-run.done:
		case <-time.After(abandonGrace):
			w.deps.metrics.abandonedHandler.WithLabelValues(qr.cfg.Name).Inc()
			w.deps.log.Error("handler ignored its deadline; abandoning it (it keeps its concurrency slot until it returns)",
				"queue", qr.cfg.Name, "type", gm.Type, "message_id", d.MessageId)
			herr = fmt.Errorf("handler did not return within %s: %w", qr.cfg.Consumer.HandlerTimeout, context.DeadlineExceeded)
			run.retire()
			w.run = nil
			abandoned = true
		}
	}
	if herr != nil && !time.Now().Before(hctx.deadline) {
		// Its deadline passed as it returned: the worker saw the result
		// first, the handler may have seen its context end.
		hctx.end(context.DeadlineExceeded)
	}
	// A handler that returns some error after its deadline passed timed out.
	if herr != nil && hctx.Err() == context.DeadlineExceeded && !errors.Is(herr, context.DeadlineExceeded) {
		herr = fmt.Errorf("%w (after the %s deadline: %w)", herr, qr.cfg.Consumer.HandlerTimeout, context.DeadlineExceeded)
	}
	hctx.end(context.Canceled) // it returned (or was abandoned): its context ends, as a cancel would end it
	took := time.Since(start).Seconds()
	if herr != nil {
		qr.metrics.handlerError.Observe(took)
	} else {
		qr.metrics.handlerOK.Observe(took)
	}
	return herr, abandoned
}

// handlerRunner is a worker's long-lived handler goroutine: a goroutine per
// message would grow a fresh stack for every handler. It runs one job at a
// time and is replaced only when a handler is abandoned past its deadline.
type handlerRunner struct {
	jobs chan handlerJob
	done chan error // buffered: an abandoned handler's result is dropped
}

type handlerJob struct {
	ctx   context.Context
	h     Handler
	m     *Message
	chain []upcaster
}

func newHandlerRunner(qr *queueRuntime) *handlerRunner {
	r := &handlerRunner{jobs: make(chan handlerJob), done: make(chan error, 1)}
	go func() {
		for j := range r.jobs {
			r.done <- r.call(qr, j)
		}
	}()
	return r
}

// call runs one job under recover and frees its concurrency slot when the
// handler returns.
func (r *handlerRunner) call(qr *queueRuntime, j handlerJob) (err error) {
	defer func() { <-qr.slots }()
	defer func() {
		if v := recover(); v != nil {
			err = &triage.PanicError{Value: v, Stack: debug.Stack()}
		}
	}()
	if err := qr.upcast(j.m, j.chain); err != nil {
		return err
	}
	return j.h.Handle(j.ctx, j.m)
}

// retire ends the goroutine once its job (if any) returns.
func (r *handlerRunner) retire() { close(r.jobs) }

// upcast runs the upcaster chain on m.Data() and validates the result against
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

// panicStack is the truncated stack of a handler or upcaster panic, or "".
func panicStack(err error) string {
	var pe *triage.PanicError
	if !errors.As(err, &pe) {
		return ""
	}
	return quarantine.PanicStack(pe.Stack)
}
