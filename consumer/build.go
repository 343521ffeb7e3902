package consumer

import (
	"context"
	"strconv"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/dlxbridge/dlxbridge/quarantine"
	"github.com/dlxbridge/dlxbridge/triage"
	"github.com/dlxbridge/dlxbridge/wire"
)

// retryHeaders copies h without the headers the broker owns. A retry must
// not carry them back into the work queue:
//   - x-death: on 3.x the broker reads a client's x-death in its cycle check,
//     and a message with an x-death entry for its own work queue without a
//     rejection (say it expired there once and was replayed) is dropped
//     silently when its retry lane expires. The bridge's attempt and
//     first-failure headers carry what the retry loop needs.
//   - x-delivery-count: a stale count from the last hop would trip the
//     crash-loop guard on the retry's first delivery.
func retryHeaders(h amqp.Table) amqp.Table {
	out := make(amqp.Table, len(h))
	for k, v := range h {
		if wire.IsBrokerHeader(k) {
			continue
		}
		out[k] = v
	}
	return out
}

func idempotencyKey(d *amqp.Delivery) string {
	if k := wire.Str(d.Headers, wire.HeaderIdempotencyKey); k != "" {
		return k
	}
	return d.MessageId
}

// republish copies d's properties into a new publishing with base's headers
// (d.Headers or a redacted copy) plus extra, and body. Expiration and user-id
// are moved into headers (see the header constants); delivery mode is
// persistent.
func republish(d *amqp.Delivery, base amqp.Table, body []byte, extra amqp.Table) amqp.Publishing {
	h := make(amqp.Table, len(base)+len(extra)+16)
	for k, v := range base {
		h[k] = v
	}
	for k, v := range extra {
		h[k] = v
	}
	if d.Expiration != "" {
		if _, kept := h[wire.HeaderOriginalExpiration]; !kept {
			h[wire.HeaderOriginalExpiration] = d.Expiration
		}
	}
	if d.UserId != "" {
		h[wire.HeaderOriginalUserID] = d.UserId
	}
	return amqp.Publishing{
		Headers:         h,
		ContentType:     d.ContentType,
		ContentEncoding: d.ContentEncoding,
		DeliveryMode:    amqp.Persistent,
		Priority:        d.Priority,
		CorrelationId:   d.CorrelationId,
		ReplyTo:         d.ReplyTo,
		MessageId:       d.MessageId,
		Timestamp:       d.Timestamp,
		Type:            d.Type,
		AppId:           d.AppId,
		Body:            body,
	}
}

// origin returns where the message first came from: the bridge's headers if
// an earlier hop set them (and signed them: a producer can't redirect a
// replay), else this delivery.
func (qr *queueRuntime) origin(d *amqp.Delivery, signed bool) (exchange, key, queue string) {
	exchange, key, queue = d.Exchange, d.RoutingKey, qr.cfg.Name
	if !signed {
		return exchange, key, queue
	}
	if v, ok := wire.String(d.Headers[wire.HeaderOriginalExchange]); ok {
		exchange = v
	}
	if v, ok := wire.String(d.Headers[wire.HeaderOriginalRoutingKey]); ok {
		key = v
	}
	if v := wire.Str(d.Headers, wire.HeaderOriginalQueue); v != "" {
		queue = v
	}
	return exchange, key, queue
}

func (w *worker) publishRetry(ctx context.Context, d *amqp.Delivery, f failure) error {
	qr := w.q
	v := f.verdict
	lane := w.s.wq.Tiers[v.Tier].Lanes[v.Lane]
	delay := min(max(v.Delay, lane.MinDelay), lane.MaxDelay)
	first := f.attempts.FirstFailure
	if first.IsZero() {
		first = w.deps.cfg.Now()
	}
	p := republish(d, retryHeaders(d.Headers), d.Body, w.retryState(d, f, int64(v.Attempt), first))
	p.Headers[wire.HeaderLastError] = quarantine.Truncate(errString(f.err), quarantine.MaxErrorBytes)
	p.Expiration = strconv.FormatInt(delay.Milliseconds(), 10)
	w.seal(p.Headers, d, mergeNotes(priorNotes(d, f.attempts.Signed), f.attempts.Notes))
	return w.tracedPublish(ctx, w.s.wq.RetryExchange, lane.RoutingKey, p, qr.fitRank(true), w.resign(d),
		attribute.Int64("dlxbridge.retry.delay_ms", delay.Milliseconds()))
}

// publishReadmit republishes d to its own work queue (through the default
// exchange, which reaches only the queue of that name), so that the copy's
// x-delivery-count is the work queue's own from its first delivery: see
// triage.Precheck. x-death and x-*-death-* stay (handlers may read them; 4.x
// treats a client's x-death as an opaque header, and it names no queue the
// work queue dead-letters into); x-delivery-count goes. The signed
// HeaderReadmitted records the x-death the copy carries, so a copy the
// broker dead-letters into the queue again is re-admitted again.
func (w *worker) publishReadmit(ctx context.Context, d *amqp.Delivery, f failure) error {
	qr := w.q
	base := make(amqp.Table, len(d.Headers))
	for k, v := range d.Headers {
		if k != wire.HeaderDeliveryCount {
			base[k] = v
		}
	}
	state := w.retryState(d, f, int64(f.attempts.Failed), f.attempts.FirstFailure)
	state[wire.HeaderReadmitted] = triage.XDeathDigest(d.Headers)
	p := republish(d, base, d.Body, state)
	f.attempts.Notes = append(f.attempts.Notes, f.verdict.Reason)
	w.seal(p.Headers, d, mergeNotes(priorNotes(d, f.attempts.Signed), f.attempts.Notes))
	return w.tracedPublish(ctx, "", qr.cfg.Name, p, qr.fitRank(true), w.resign(d), attribute.Bool("dlxbridge.readmit", true))
}

// retryState is the bridge's state a message carries back into its work
// queue: failed attempts so far, when the first failed, where it first came
// from. seal adds the notes and signs it.
func (w *worker) retryState(d *amqp.Delivery, f failure, attempts int64, first time.Time) amqp.Table {
	ex, key, queue := w.q.origin(d, f.attempts.Signed)
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

const rfc3339Nano = "2006-01-02T15:04:05.999999999Z07:00"

func (w *worker) publishQuarantine(ctx context.Context, consumeSpan trace.Span, d *amqp.Delivery, f failure) error {
	qr := w.q
	c := w.deps
	v := f.verdict
	now := c.cfg.Now()
	ex, key, queue := qr.origin(d, f.attempts.Signed)
	red := qr.redact.Apply(d.Headers, d.Body)

	env := quarantine.Envelope{
		Source:           quarantine.SourceBridge,
		Class:            v.Class,
		Reason:           v.Reason,
		Error:            errString(f.err),
		Attempts:         v.Attempt,
		FirstFailureAt:   f.attempts.FirstFailure,
		LastFailureAt:    now,
		QuarantinedAt:    now,
		OriginalExchange: ex,
		OriginalRouting:  key,
		OriginalQueue:    queue,
		MessageID:        d.MessageId,
		IdempotencyKey:   idempotencyKey(d),
		MessageType:      f.msgType,
		SchemaVersion:    f.version,
		WorkerHost:       c.host,
		WorkerVersion:    c.cfg.WorkerVersion,
		Redacted:         red.Changed,
		RedactionFailed:  red.Failed,
		Notes:            f.attempts.Notes,
		Stack:            panicStack(f.err),
	}
	if env.FirstFailureAt.IsZero() {
		env.FirstFailureAt = now
	}
	if red.Headers[wire.HeaderIdempotencyKey] == quarantine.Redacted {
		env.IdempotencyKey = quarantine.Redacted // redaction covers the envelope's copy too
	}
	if f.validation != nil {
		for _, vi := range f.validation.Violations {
			env.Validation = append(env.Validation, quarantine.Violation{Pointer: vi.Pointer, Keyword: vi.Keyword, Message: vi.Message})
		}
		if len(env.Validation) == 0 {
			env.Validation = []quarantine.Violation{{Keyword: string(f.validation.Reason), Message: f.validation.Detail}}
		}
	}
	env.Fingerprint = triage.Fingerprint(v.Class, fingerprintText(f, v), f.msgType, f.version)
	if sc := consumeSpan.SpanContext(); sc.HasTraceID() {
		env.TraceID = sc.TraceID().String()
	}

	p := republish(d, red.Headers, red.Body, nil)
	// The quarantine is no way back into the work queue: nothing there is
	// signed (a replay starts the message's retry state over).
	delete(p.Headers, wire.HeaderSignature)
	env.Notes = mergeNotes(priorNotes(d, f.attempts.Signed), env.Notes)
	env.Apply(p.Headers)
	return w.tracedPublish(ctx, w.s.wq.DeadExchange, qr.cfg.Name, p, qr.fitRank(false), nil, attribute.String("dlxbridge.class", string(v.Class)))
}

// fitRank says which of a republish's headers quarantine.Fit may drop or
// cut first (see quarantine.Rank for the order). A retry must reach the
// handler as the producer sent it, so on a retry every header the producer
// set travels unchanged (FixedHeader), except trace context, which only
// tracing reads and which the bridge re-injects anyway; only the bridge's
// own headers give way. A retry that still cannot fit is quarantined
// instead (see settleFailure), where the producer's headers may go too.
func (qr *queueRuntime) fitRank(retry bool) func(string) quarantine.Rank {
	return func(k string) quarantine.Rank {
		switch k {
		case wire.HeaderTraceparent, wire.HeaderTracestate, wire.HeaderBaggage:
			return quarantine.TraceHeader
		case wire.HeaderLastError:
			return quarantine.DetailHeader
		case wire.HeaderEnvelope, wire.HeaderSource, wire.HeaderClass, wire.HeaderReason,
			wire.HeaderFingerprint, wire.HeaderAttempts, wire.HeaderFirstFailureAt,
			wire.HeaderOriginalExchange, wire.HeaderOriginalRoutingKey, wire.HeaderOriginalQueue,
			wire.HeaderIdempotencyKeyCopy, wire.HeaderOriginalExpiration, wire.HeaderOriginalUserID:
			return quarantine.EssentialHeader
		}
		switch {
		case retry:
			return quarantine.FixedHeader
		case k == qr.cfg.Message.VersionHeader || k == wire.HeaderIdempotencyKey:
			return quarantine.IdentityHeader
		case strings.HasPrefix(k, wire.OwnPrefix) || wire.IsDeathHeader(k):
			return quarantine.DetailHeader
		}
		return quarantine.ProducerHeader
	}
}

// priorNotes are the notes an earlier hop recorded, if its signature vouches
// for them (signed): unsigned ones were written by someone else.
func priorNotes(d *amqp.Delivery, signed bool) []string {
	if !signed {
		return nil
	}
	notes, _ := wire.StringList(d.Headers[wire.HeaderNotes])
	return notes
}

// fingerprintText is what a failure is grouped by: the error, else the
// verdict's reason (crash-loops have no error of their own).
func fingerprintText(f failure, v triage.Verdict) string {
	if vr := f.validation; vr != nil {
		if len(vr.Violations) > 0 {
			return string(vr.Reason) + " " + vr.Violations[0].Pointer + " " + vr.Violations[0].Keyword
		}
		return string(vr.Reason)
	}
	if f.err != nil {
		return f.err.Error()
	}
	return v.Reason
}
