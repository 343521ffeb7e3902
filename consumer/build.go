package consumer

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/dlxbridge/dlxbridge/internal/frame"
	"github.com/dlxbridge/dlxbridge/internal/telemetry"
	"github.com/dlxbridge/dlxbridge/internal/wireval"
	"github.com/dlxbridge/dlxbridge/quarantine"
	"github.com/dlxbridge/dlxbridge/topology"
	"github.com/dlxbridge/dlxbridge/triage"
	"github.com/dlxbridge/dlxbridge/wire"
)

// settlement is the outcome of a retry, re-admission or quarantine
// verdict: its copy, built below to be published with confirm +
// mandatory before the original is acked. A copy that cannot be published
// at all (see unsendable: over one frame, or a body over the broker's max
// message size) is not sent: a retry is parked in the quarantine instead,
// and what even the quarantine cannot take is dead-lettered. It reports
// false for a re-admission that cannot be sent, w.settled untouched: the
// caller delivers the message instead, since rejecting it would quarantine
// a message whose handler never ran.
func (w *worker) settlement(ctx context.Context, span trace.Span, a acker, d *amqp.Delivery, f failure) (outcome, bool) {
	qr := w.q
	v := f.verdict
	span.SetAttributes(
		attribute.String("dlxbridge.class", string(v.Class)),
		attribute.String("dlxbridge.action", string(v.Action)),
	)
	if f.err != nil {
		span.RecordError(f.err)
	}
	log := w.deps.log.With("queue", qr.cfg.Name, "message_id", d.MessageId, "class", v.Class, "attempt", v.Attempt)
	if st := panicStack(f.err); st != "" {
		log = log.With("stack", st)
	}
	out, err := w.prepare(ctx, span, d, f)
	if _, no := unsendable(err); no && v.Action == triage.ActionReadmit {
		return outcome{}, false
	}
	w.settled.noteFailure(f)
	if _, no := unsendable(err); no && v.Action == triage.ActionRetry {
		// A retry may not drop the producer's headers (see frame.RetryRank):
		// park it instead, where they may give way (and redaction may
		// shrink the body).
		f.verdict.Action = triage.ActionQuarantine
		f.verdict.Reason = fmt.Sprintf("%s; not retried: %v", v.Reason, err)
		v = f.verdict
		w.settled.noteFailure(f)
		out, err = w.prepare(ctx, span, d, f)
	}
	o := outcome{kind: kindQuarantine, a: a, d: d, span: span, settled: w.settled,
		failed: &failedOutcome{f: f, out: out, err: err, log: log}}
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
		o.kind, o.failed.why = kindDeadLetter, why
	}
	return o, true
}

// noteFailure notes a failure's verdict in w.settled; called again after the
// verdict changes, it replaces what it noted.
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
// sent, and the span is ended.
func (w *worker) prepare(ctx context.Context, consumeSpan trace.Span, d *amqp.Delivery, f failure) (outgoing, error) {
	in := w.buildInput(d, f, consumeSpan)
	exchange, key, attrs := destination(in)
	pctx, span := w.deps.tracer.Start(ctx, exchange+" publish",
		trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(
			telemetry.AttrSystemRabbitMQ,
			telemetry.AttrOperationPublish,
			attribute.String(telemetry.AttrDestination, exchange),
			attribute.String(telemetry.AttrRoutingKey, key),
			attribute.String(telemetry.AttrMessageID, d.MessageId),
		),
		trace.WithAttributes(attrs...))
	in.trace = amqp.Table{}
	telemetry.Inject(pctx, in.trace)
	b, err := build(in)
	if limit := w.s.maxSize.get(); err == nil && overLimit(len(b.p.Body), limit) {
		// Said by settlement, which parks or dead-letters it.
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

// buildInput gathers what the builders read for d's failure f.
func (w *worker) buildInput(d *amqp.Delivery, f failure, consumeSpan trace.Span) *buildInput {
	in := &buildInput{
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

// buildInput is everything the settlement builders read. The builders are
// pure: they send nothing, and the same input gives the same publishing.
type buildInput struct {
	d *amqp.Delivery
	f failure
	// queue is the work queue, wq its topology in this session.
	queue string
	wq    *topology.WorkQueue
	now   time.Time
	// signer signs the retry state a retry or re-admission carries.
	signer *triage.Signer
	// verifier checks a replay's redrive signature: signer, or nil when
	// signer's key is this process's random one (see keeperVerifier).
	verifier *triage.Signer
	// redact is applied to what the quarantine keeps.
	redact quarantine.Redaction
	// versionHeader is the queue's schema version header (Fit keeps it
	// longest among the producer's headers).
	versionHeader string
	// host and workerVersion name this process in the envelope; traceID
	// is the consume span's trace id.
	host, workerVersion, traceID string
	// trace is the trace context to inject: the publish span's.
	trace amqp.Table
	// frameMax is the publishing connection's frame size: the publishing's
	// header frame must fit one frame.
	frameMax int
}

// built is a finished publishing and where it goes.
type built struct {
	exchange, key string
	p             amqp.Publishing
	// changed lists what fitting dropped or cut (see frame.Fit).
	changed []string
}

// build returns the finished publishing for in's verdict: a retry, a
// re-admission or (any other action) the quarantine. An error wrapping
// frame.ErrNoFit means it cannot fit one frame: nothing may be sent.
func build(in *buildInput) (built, error) {
	switch in.f.verdict.Action {
	case triage.ActionRetry:
		return buildRetry(in)
	case triage.ActionReadmit:
		return buildReadmit(in)
	}
	return buildQuarantine(in)
}

// destination is where build's publishing goes, and the span attributes
// that say so.
func destination(in *buildInput) (exchange, key string, attrs []attribute.KeyValue) {
	switch v := in.f.verdict; v.Action {
	case triage.ActionRetry:
		lane, delay := retryLane(in)
		return in.wq.RetryExchange, lane.RoutingKey, []attribute.KeyValue{attribute.Int64("dlxbridge.retry.delay_ms", delay.Milliseconds())}
	case triage.ActionReadmit:
		return "", in.queue, []attribute.KeyValue{attribute.Bool("dlxbridge.readmit", true)}
	default:
		return in.wq.DeadExchange, in.queue, []attribute.KeyValue{attribute.String("dlxbridge.class", string(v.Class))}
	}
}

// retryLane is the verdict's retry lane and the delay, inside the lane's
// bounds.
func retryLane(in *buildInput) (topology.RetryLane, time.Duration) {
	v := in.f.verdict
	lane := in.wq.Tiers[v.Tier].Lanes[v.Lane]
	return lane, min(max(v.Delay, lane.MinDelay), lane.MaxDelay)
}

// republish copies d's properties into a new publishing with base's headers
// (d.Headers or a copy without some) plus extra, and body (see
// frame.Republish).
func republish(d *amqp.Delivery, base amqp.Table, body []byte, extra amqp.Table) amqp.Publishing {
	h := make(amqp.Table, len(base)+len(extra)+16)
	maps.Copy(h, base)
	return republishInto(d, h, body, extra)
}

// republishInto is republish onto h, a table of the caller's own (never
// d.Headers), which it fills in place: a copy's headers are assembled in
// the one table they go out in.
func republishInto(d *amqp.Delivery, h amqp.Table, body []byte, extra amqp.Table) amqp.Publishing {
	maps.Copy(h, extra)
	return frame.Republish(d, h, body)
}

// buildRetry is a delayed retry: the message as received, without the
// broker's headers or a producer's CC and BCC, with the signed retry state
// and the delay as its expiration, for the verdict's retry lane (with the
// shared tiers, a CC naming the work queue).
func buildRetry(in *buildInput) (built, error) {
	d, f := in.d, in.f
	lane, delay := retryLane(in)
	first := f.attempts.FirstFailure
	if first.IsZero() {
		first = in.now
	}
	state := retryState(in, int64(f.verdict.Attempt), first)
	p := republishInto(d, frame.StripHeaders(d.Headers, nil), d.Body, state)
	ownState(p.Headers, state)
	p.Headers[wire.HeaderLastError] = frame.Truncate(errString(f.err), frame.MaxErrorBytes)
	p.Expiration = strconv.FormatInt(delay.Milliseconds(), 10)
	if in.wq.Shared() {
		// The tier dead-letters with the message's own routing keys: the
		// lane's, which the return exchange binds to nothing, and this
		// CC, which its binding takes back to this queue only. It
		// replaces any a producer set (StripHeaders dropped theirs).
		p.Headers[wire.HeaderCC] = []any{in.queue}
	}
	seal(in, p.Headers, mergeNotes(priorNotes(d, f.attempts.Signed), f.attempts.Notes))
	return finish(in, in.wq.RetryExchange, lane.RoutingKey, p)
}

// buildReadmit republishes d to its own work queue (through the default
// exchange, which reaches only the queue of that name), so that the copy's
// x-delivery-count is the work queue's own from its first delivery: see
// triage.Precheck. x-death and x-*-death-* stay (handlers may read them; 4.x
// treats a client's x-death as an opaque header, and it names no queue the
// work queue dead-letters into); the delivery counts (x-delivery-count,
// x-acquired-count) go. The signed
// HeaderReadmitted records the x-death the copy carries, so a copy the
// broker dead-letters into the queue again is re-admitted again.
func buildReadmit(in *buildInput) (built, error) {
	d, f := in.d, in.f
	base := make(amqp.Table, len(d.Headers)+16) // room for the state, notes, signature and trace
	for k, v := range d.Headers {
		// A producer's CC or BCC would make the default exchange deliver
		// the copy to every queue they name.
		if !wire.IsCountHeader(k) && !wire.IsRoutingHeader(k) {
			base[k] = v
		}
	}
	state := retryState(in, int64(f.attempts.Failed), f.attempts.FirstFailure)
	state[wire.HeaderReadmitted] = triage.XDeathDigest(d.Headers)
	p := republishInto(d, base, d.Body, state)
	ownState(p.Headers, state)
	notes := append(slices.Clip(f.attempts.Notes), f.verdict.Reason)
	seal(in, p.Headers, mergeNotes(priorNotes(d, f.attempts.Signed), notes))
	return finish(in, "", in.queue, p)
}

// retryState is the bridge's state a message carries back into its work
// queue: failed attempts so far, when the first failed, where it first came
// from. seal adds the notes and signs it.
func retryState(in *buildInput, attempts int64, first time.Time) amqp.Table {
	ex, key, queue := origin(in.d, in.queue, in.f.attempts.Signed)
	h := amqp.Table{
		wire.HeaderAttempts:           attempts,
		wire.HeaderOriginalExchange:   ex,
		wire.HeaderOriginalRoutingKey: key,
		wire.HeaderOriginalQueue:      queue,
	}
	if !first.IsZero() {
		h[wire.HeaderFirstFailureAt] = first.UTC().Format(rfc3339Nano)
	}
	return h
}

// ownState removes from h every retry-signed header that state, the
// runtime's own retry state, does not set (seal writes the notes). A
// producer's header must not travel under the runtime's signature as if
// the bridge wrote it, and one of a type the signature cannot vouch for
// would void the signature, so that a failing message is retried for ever.
func ownState(h, state amqp.Table) {
	for _, k := range signedHeaders {
		if _, ours := state[k]; !ours && k != wire.HeaderNotes {
			delete(h, k)
		}
	}
}

const rfc3339Nano = "2006-01-02T15:04:05.999999999Z07:00"

// origin returns where the message first came from: the bridge's headers if
// an earlier hop set them (and signed them: a producer can't redirect a
// replay), else this delivery from work queue queue.
func origin(d *amqp.Delivery, queue string, signed bool) (exchange, key, from string) {
	exchange, key, from = d.Exchange, d.RoutingKey, queue
	if !signed {
		return exchange, key, from
	}
	if v, ok := wireval.String(d.Headers[wire.HeaderOriginalExchange]); ok {
		exchange = v
	}
	if v, ok := wireval.String(d.Headers[wire.HeaderOriginalRoutingKey]); ok {
		key = v
	}
	if v := wireval.Str(d.Headers, wire.HeaderOriginalQueue); v != "" {
		from = v
	}
	return exchange, key, from
}

// buildQuarantine is the quarantine record for the queue's dead exchange,
// written by quarantine.Publishing.
func buildQuarantine(in *buildInput) (built, error) {
	d, f := in.d, in.f
	ex, key, queue := origin(d, in.queue, f.attempts.Signed)
	p, changed, err := quarantine.Publishing(&quarantine.Failure{
		Delivery: d, Exchange: in.wq.DeadExchange,
		OriginalExchange: ex, OriginalRoutingKey: key, OriginalQueue: queue,
		Verdict: f.verdict, Err: f.err, Validation: f.validation, Stack: panicStack(f.err),
		MessageType: f.msgType, SchemaVersion: f.version,
		FirstFailureAt: f.attempts.FirstFailure, At: in.now,
		Notes:  mergeNotes(priorNotes(d, f.attempts.Signed), f.attempts.Notes),
		Signed: f.attempts.Signed, Redaction: in.redact,
		WorkerHost: in.host, WorkerVersion: in.workerVersion, TraceID: in.traceID, Trace: in.trace,
		VersionHeader: in.versionHeader, FrameMax: in.frameMax,
		Signer: in.signer, Verifier: in.verifier,
	})
	return built{exchange: in.wq.DeadExchange, key: in.queue, p: p, changed: changed}, err
}

// finish injects the trace context and fits p, a copy going back to the
// work queue, to one frame: a header frame over frame_max makes the broker
// close the whole connection, which would requeue everything in flight on
// it. A publishing that cannot fit is an error wrapping frame.ErrNoFit.
// Fitting may cut headers and add notes, so the signed retry state is
// signed after it, in place of seal's placeholder of the same size, so p
// still fits.
func finish(in *buildInput, exchange, key string, p amqp.Publishing) (built, error) {
	for k, v := range in.trace {
		p.Headers[k] = v
	}
	changed, err := frame.Fit(&p, in.frameMax, frame.RetryRank)
	if err == nil {
		sign(in, p.Headers)
	}
	return built{exchange: exchange, key: key, p: p, changed: changed}, err
}

// seal writes the notes and keeps room for the signature: finish signs the
// retry state once fitting has made every signed header final (signing
// here too would compute a second HMAC of the same headers and body for
// every retry).
func seal(in *buildInput, h amqp.Table, notes []string) {
	delete(h, wire.HeaderNotes)
	ownDropped(in, h)
	if n := frame.EncodeStrings(notes, frame.MaxNotesBytes); n != "" {
		h[wire.HeaderNotes] = n
	}
	h[wire.HeaderSignature] = in.signer.Placeholder()
}

// sign signs the retry state in h for d's work queue.
func sign(in *buildInput, h amqp.Table) {
	h[wire.HeaderSignature] = in.signer.Sign(subject(in.queue, in.d), h, signedHeaders)
}

// ownDropped removes a dlxbridge-dropped that no earlier hop's signature
// vouches for: the producer wrote it, and the envelope signature (which
// covers it) would otherwise present it as what the runtime dropped. The
// retry signature does not cover it (adding it would void every retry in
// flight across an upgrade), so it is kept only on a signed hop, whose
// first hop removed the producer's.
func ownDropped(in *buildInput, h amqp.Table) {
	if !in.f.attempts.Signed {
		delete(h, wire.HeaderDropped)
	}
}

// panicStack is the truncated stack of a handler or upcaster panic, or "".
func panicStack(err error) string {
	var pe *triage.PanicError
	if !errors.As(err, &pe) {
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
