package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/dlxbridge/dlxbridge/internal/frame"
	"github.com/dlxbridge/dlxbridge/internal/telemetry"
	"github.com/dlxbridge/dlxbridge/quarantine"
	"github.com/dlxbridge/dlxbridge/triage"
)

// The settlement seam: what settling needs of the broker. A worker's
// acker is the delivery in hand behind its session's settle gate and ack
// window, and its confirmer the confirm pipeline on the session's publishing
// connection; tests give fakes, so the decisions below are tested without a
// broker.
type acker interface {
	// Ack settles the delivery as done. Acks are coalesced (see
	// ackWindow): report is called once the ack was written (nil) or could
	// not be (the channel is gone), possibly later and on another worker's
	// goroutine.
	Ack(report func(error))
	// Requeue rejects it with requeue: the broker delivers it again (and
	// counts the delivery toward the queue's delivery limit).
	Requeue() error
	// Reject rejects it without requeue: the broker dead-letters it.
	Reject() error
}

type confirmer interface {
	// Publish sends p with mandatory set without waiting for its confirm:
	// confirmed is called exactly once, possibly before Publish returns and
	// possibly on another goroutine, with nil only once the broker
	// confirmed it; a return, a nack, a lost channel or ctx's end are
	// errors. confirmed must not block.
	Publish(ctx context.Context, exchange, key string, p amqp.Publishing, confirmed func(error))
}

// outcomeKind is how a delivery is to be settled.
type outcomeKind uint8

const (
	kindAck        outcomeKind = iota // the handler succeeded: ack
	kindFailed                        // a failure: settle builds the copy its verdict asks for (buildCopy)
	kindRetry                         // publish the delayed retry, then ack
	kindReadmit                       // publish the re-admission, then ack
	kindQuarantine                    // publish the quarantine record, then ack
	kindDeadLetter                    // no copy can be sent: reject without requeue
	kindLeave                         // the runtime is past its drain deadline: leave it for the channel close to requeue
)

// outcome is what the worker decided for one delivery, for settle to carry
// out: how to settle it, through which acker, and what OnSettled will get.
type outcome struct {
	kind outcomeKind
	a    acker
	d    *amqp.Delivery
	// ctx and span are the delivery's process context and span: a copy's
	// publish span is their child, and settle ends span.
	ctx     context.Context
	span    trace.Span
	settled Settled
	// failed is the failure behind a copy or a dead letter; nil for an ack
	// or a delivery left unsettled at the drain deadline.
	failed *failedOutcome
}

// failedOutcome is what settling a failure needs: its verdict and, once
// buildCopy has run, the copy to publish and its panic stack, if any.
type failedOutcome struct {
	f   failure
	out outgoing
	// err is why the copy was not built (settled as a failed publish) or,
	// dead-lettered, why no copy can be sent (why: unsendable's reason).
	err   error
	why   string
	stack string
}

// failLog is the logger for a line about o's failure, with the message's
// attributes. It is made for each line rather than once per failure: at
// the level a storm runs at, most failures write none, and Logger.With
// was several allocations each.
func (w *worker) failLog(o *outcome) *slog.Logger {
	fo := o.failed
	v := fo.f.verdict
	log := w.deps.log.With("queue", w.q.cfg.Name, "message_id", o.d.MessageId, "class", v.Class, "attempt", v.Attempt)
	if fo.stack != "" {
		log = log.With("stack", fo.stack)
	}
	return log
}

// logs reports whether a line at level l about a failure would be
// written: checked before its attributes are gathered.
func (w *worker) logs(l slog.Level) bool {
	return w.deps.log.Enabled(context.Background(), l)
}

// settle carries out o, the one place a delivery is settled: an ack goes
// to the ack window; a failure's copy (retry, re-admission or quarantine)
// is built here (buildCopy) and published with confirm + mandatory, and the
// original acked only once the broker has confirmed it (afterConfirm, on
// the settler), or requeued when the publish failed; what no copy can carry
// is rejected without requeue. Each delivery's outcome is recorded once
// (done), and o's span ends with it.
func (w *worker) settle(o outcome) {
	if o.kind == kindFailed {
		o = w.buildCopy(o)
	}
	switch o.kind {
	case kindAck:
		w.ack(o, OutcomeAcked)
		if o.span.IsRecording() {
			o.span.SetAttributes(attribute.String("dlxbridge.outcome", string(OutcomeAcked)))
		}
		o.span.End()
	case kindLeave:
		w.done(&o, OutcomeAbandoned, nil)
		o.span.SetStatus(codes.Error, "shutdown before settle")
		o.span.End()
	case kindDeadLetter:
		w.deadLetter(o)
		o.span.End()
	default:
		w.sendCopy(o)
		if o.kind == kindReadmit {
			w.settleInOrder()
		}
	}
}

// buildCopy builds the copy o's failure verdict asks for: a retry, a
// re-admission or the quarantine record, to be published with confirm +
// mandatory before the original is acked, and notes the verdict in what
// OnSettled gets. A copy that cannot be published at all (see unsendable:
// over one frame, or a body over the broker's max message size) is not
// sent: a retry is parked in the quarantine instead, and what even the
// quarantine cannot take is dead-lettered (kindDeadLetter). process builds
// a re-admission itself, before the gate: one that cannot be sent is
// handled instead, since rejecting it would quarantine a message whose
// handler never ran.
func (w *worker) buildCopy(o outcome) outcome {
	f := o.failed.f
	v := f.verdict
	if o.span.IsRecording() {
		o.span.SetAttributes(
			attribute.String("dlxbridge.class", string(v.Class)),
			attribute.String("dlxbridge.action", string(v.Action)),
		)
		if f.err != nil {
			o.span.RecordError(f.err)
		}
	}
	// Trimmed once here, for the log and the quarantine record: it copies
	// all of the captured stack, and a retry parked in the quarantine is
	// built twice.
	stack := panicStack(f.err)
	out, err := w.prepare(o.ctx, o.span, o.d, f, stack)
	o.settled.noteFailure(f)
	if _, no := unsendable(err); no && v.Action == triage.ActionRetry {
		// A retry may not drop the producer's headers (see frame.RetryRank):
		// park it instead, where they may give way (and redaction may
		// shrink the body).
		f.verdict.Action = triage.ActionQuarantine
		f.verdict.Reason = fmt.Sprintf("%s; not retried: %v", v.Reason, err)
		v = f.verdict
		o.settled.noteFailure(f)
		out, err = w.prepare(o.ctx, o.span, o.d, f, stack)
	}
	o.kind = kindQuarantine
	fo := o.failed
	fo.f, fo.out, fo.err, fo.stack = f, out, err, stack
	switch v.Action {
	case triage.ActionRetry:
		o.kind = kindRetry
	case triage.ActionReadmit:
		o.kind = kindReadmit
	}
	if why, no := unsendable(err); no {
		// Not even the bare envelope fits (a frame_max far below the
		// default), or the body is over the broker's max message size:
		// nothing can be sent. The broker dead-letters the message as
		// received into the quarantine, with x-death as its record.
		o.kind, fo.why = kindDeadLetter, why
	}
	return o
}

// noteFailure notes a failure's verdict in an outcome's Settled; called
// again after the verdict changes, it replaces what it noted.
func (s *Settled) noteFailure(f failure) {
	v := f.verdict
	s.Class, s.Reason, s.Err = v.Class, v.Reason, f.err
	s.Tier, s.Delay = 0, 0
	if v.Attempt > 0 {
		s.Attempt = v.Attempt
	}
	if s.Type == "" {
		s.Type, s.Version = f.msgType, f.version
	}
	if v.Action == triage.ActionRetry {
		s.Tier, s.Delay = v.Tier, v.Delay
	}
}

var noopSpan = trace.SpanFromContext(context.Background())

// outgoing is a built retry or quarantine publishing with its producer span.
type outgoing struct {
	b    built
	ctx  context.Context
	span trace.Span
}

// prepare builds the verdict's publishing (see build) inside a producer
// span, whose context the publishing carries so that the next consumer
// span continues the trace. A publishing that cannot fit one frame (the
// error wraps frame.ErrNoFit), or whose body is over the broker's max
// message size as learned on this connection (*overLimitError), is not
// sent, and the span is ended. stack is f's panic stack as trimmed by
// buildCopy (see panicStack), or "".
func (w *worker) prepare(ctx context.Context, consumeSpan trace.Span, d *amqp.Delivery, f failure, stack string) (outgoing, error) {
	// A value on the stack: the builders keep nothing of it.
	input := w.buildInput(d, f, consumeSpan)
	in := &input
	in.stack = stack
	exchange, key := destination(in)
	pctx, span := w.deps.tracer.Start(ctx, exchange+" publish", producerSpan...)
	// As on the process span, the attributes are set only on a span that
	// records: built as start options for the no-op tracer, they were
	// several allocations per copy for nothing.
	if span.IsRecording() {
		span.SetAttributes(
			telemetry.AttrSystemRabbitMQ,
			telemetry.AttrOperationPublish,
			attribute.String(telemetry.AttrDestination, exchange),
			attribute.String(telemetry.AttrRoutingKey, key),
			attribute.String(telemetry.AttrMessageID, d.MessageId),
			destinationAttr(in),
		)
	}
	in.trace = telemetry.InjectTable(pctx)
	b, err := build(in)
	if limit := w.s.maxSize.get(); err == nil && overLimit(len(b.p.Body), limit) {
		// Said by buildCopy, which parks or dead-letters it.
		err = &overLimitError{size: int64(len(b.p.Body)), limit: limit}
	} else if err != nil {
		w.deps.log.Warn("not sent: the message does not fit one frame", "queue", in.queue, "message_id", d.MessageId, "error", err)
	}
	switch {
	case err != nil:
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
		span.End()
		return outgoing{span: noopSpan}, err
	case len(b.changed) > 0:
		w.deps.log.Warn("dropped or cut headers so the message fits one frame", "queue", in.queue, "message_id", d.MessageId, "changed", b.changed)
	}
	return outgoing{b: b, ctx: pctx, span: span}, nil
}

// producerSpan starts a copy's publish span (one slice for every copy).
var producerSpan = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindProducer)}

// buildInput gathers what the builders read for d's failure f.
func (w *worker) buildInput(d *amqp.Delivery, f failure, consumeSpan trace.Span) buildInput {
	in := buildInput{
		d:             d,
		f:             f,
		queue:         w.q.cfg.Name,
		wq:            w.s.wq,
		now:           w.deps.cfg.Now(),
		signer:        w.deps.signer,
		verifier:      w.deps.verifier,
		redact:        w.q.redact,
		versionHeader: w.q.cfg.Message.VersionHeader,
		host:          w.deps.host,
		workerVersion: w.deps.cfg.WorkerVersion,
		frameMax:      w.s.frameMax,
	}
	if sc := consumeSpan.SpanContext(); sc.HasTraceID() {
		in.traceID = sc.TraceID().String()
	}
	return in
}

// panicStack is the truncated stack of a handler or upcaster panic, or "".
func panicStack(err error) string {
	pe, ok := errors.AsType[*triage.PanicError](err)
	if !ok {
		return ""
	}
	return trimStack(pe.Stack)
}

// trimStack turns a stack captured in a deferred recover
// (runtime/debug.Stack) into what the envelope and the log keep: the
// goroutine line and the frames from the one that panicked down, without
// the recovery frames above the panic call, cut at a line boundary to at
// most quarantine.MaxStackBytes.
func trimStack(stack []byte) string {
	s := string(stack)
	// debug.Stack lists the recovering frames first, then "panic(...)" and
	// its source line, then the frame that panicked.
	if i := strings.Index(s, "\npanic("); i >= 0 {
		head, _, _ := strings.Cut(s, "\n")
		rest := s[i+1:]
		if _, after, ok := strings.Cut(rest, "\n"); ok { // the panic( line
			if _, after, ok = strings.Cut(after, "\n"); ok { // its source line
				s = head + "\n" + after
			}
		}
	}
	s = strings.TrimRight(s, "\n")
	if len(s) <= quarantine.MaxStackBytes {
		return s
	}
	const mark = "\n…[truncated]"
	cut := strings.LastIndexByte(s[:quarantine.MaxStackBytes-len(mark)+1], '\n')
	if cut < 0 {
		return frame.Truncate(s, quarantine.MaxStackBytes)
	}
	return s[:cut] + mark
}
