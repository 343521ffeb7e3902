package consumer

import (
	"slices"
	"strconv"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/attribute"

	"github.com/dlxbridge/dlxbridge/internal/wireval"
	"github.com/dlxbridge/dlxbridge/quarantine"
	"github.com/dlxbridge/dlxbridge/topology"
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
	if k := wireval.Str(d.Headers, wire.HeaderIdempotencyKey); k != "" {
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
	// changed lists what fitting dropped or cut (see quarantine.Fit).
	changed []string
}

// build returns the finished publishing for in's verdict: a retry, a
// re-admission or (any other action) the quarantine. An error wrapping
// quarantine.ErrNoFit means it cannot fit one frame: nothing may be sent.
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

// buildRetry is a delayed retry: the message as received, without the
// broker's headers, with the signed retry state and the delay as its
// expiration, for the verdict's retry lane.
func buildRetry(in *buildInput) (built, error) {
	d, f := in.d, in.f
	lane, delay := retryLane(in)
	first := f.attempts.FirstFailure
	if first.IsZero() {
		first = in.now
	}
	state := retryState(in, int64(f.verdict.Attempt), first)
	p := republish(d, retryHeaders(d.Headers), d.Body, state)
	ownState(p.Headers, state)
	p.Headers[wire.HeaderLastError] = quarantine.Truncate(errString(f.err), quarantine.MaxErrorBytes)
	p.Expiration = strconv.FormatInt(delay.Milliseconds(), 10)
	seal(in, p.Headers, mergeNotes(priorNotes(d, f.attempts.Signed), f.attempts.Notes))
	return finish(in, in.wq.RetryExchange, lane.RoutingKey, p, true)
}

// buildReadmit republishes d to its own work queue (through the default
// exchange, which reaches only the queue of that name), so that the copy's
// x-delivery-count is the work queue's own from its first delivery: see
// triage.Precheck. x-death and x-*-death-* stay (handlers may read them; 4.x
// treats a client's x-death as an opaque header, and it names no queue the
// work queue dead-letters into); x-delivery-count goes. The signed
// HeaderReadmitted records the x-death the copy carries, so a copy the
// broker dead-letters into the queue again is re-admitted again.
func buildReadmit(in *buildInput) (built, error) {
	d, f := in.d, in.f
	base := make(amqp.Table, len(d.Headers))
	for k, v := range d.Headers {
		if k != wire.HeaderDeliveryCount {
			base[k] = v
		}
	}
	state := retryState(in, int64(f.attempts.Failed), f.attempts.FirstFailure)
	state[wire.HeaderReadmitted] = triage.XDeathDigest(d.Headers)
	p := republish(d, base, d.Body, state)
	ownState(p.Headers, state)
	notes := append(slices.Clip(f.attempts.Notes), f.verdict.Reason)
	seal(in, p.Headers, mergeNotes(priorNotes(d, f.attempts.Signed), notes))
	return finish(in, "", in.queue, p, true)
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

// ownState removes from h every retry-signed header that state (the
// runtime's own retry state) does not set, the notes aside (seal writes
// them): a producer's dlxbridge-readmitted on a retry, or its
// dlxbridge-first-failure-at on a re-admission without a known first
// failure, would otherwise travel under the runtime's signature, as if
// the bridge had written it (a header is evidence, never a command); and
// one of a type the signature cannot vouch for (a table, a time, a void)
// would void the signature when the copy comes back, so that its attempts
// count as 0 and a failing message is retried for ever.
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

// buildQuarantine is the quarantine record: the message as received
// (redacted as configured) with the failure envelope, for the queue's dead
// exchange. No retry state in it is signed: the quarantine is no way back
// into the work queue (a replay starts the message's retry state over).
// The envelope is (finish signs it, wire.HeaderEnvelopeSignature): a
// message the broker dead-letters on its own keeps the producer's headers,
// and the signature tells this envelope from one a producer wrote.
func buildQuarantine(in *buildInput) (built, error) {
	d, f := in.d, in.f
	v := f.verdict
	ex, key, queue := origin(d, in.queue, f.attempts.Signed)
	red := in.redact.Apply(d.Headers, d.Body)

	env := quarantine.Envelope{
		Source:           quarantine.SourceBridge,
		Class:            v.Class,
		Reason:           v.Reason,
		Error:            errString(f.err),
		Attempts:         v.Attempt,
		FirstFailureAt:   f.attempts.FirstFailure,
		LastFailureAt:    in.now,
		QuarantinedAt:    in.now,
		OriginalExchange: ex,
		OriginalRouting:  key,
		OriginalQueue:    queue,
		MessageID:        d.MessageId,
		IdempotencyKey:   idempotencyKey(d),
		MessageType:      f.msgType,
		SchemaVersion:    f.version,
		WorkerHost:       in.host,
		WorkerVersion:    in.workerVersion,
		TraceID:          in.traceID,
		Redacted:         red.Changed,
		RedactionFailed:  red.Failed,
		Stack:            panicStack(f.err),
	}
	if env.FirstFailureAt.IsZero() {
		env.FirstFailureAt = in.now
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
	env.Notes = mergeNotes(priorNotes(d, f.attempts.Signed), f.attempts.Notes)

	p := republish(d, red.Headers, red.Body, nil)
	delete(p.Headers, wire.HeaderSignature)
	ownDropped(in, p.Headers)
	env.Notes = ownRedrives(in, p.Headers, env.Notes)
	env.Apply(p.Headers)
	// Room for the envelope signature, which finish writes over it once
	// fitting has made the envelope final.
	p.Headers[wire.HeaderEnvelopeSignature] = in.signer.Placeholder()
	return finish(in, in.wq.DeadExchange, in.queue, p, false)
}

// finish injects the trace context and fits p to one frame: a header frame
// over frame_max makes the broker close the whole connection, which would
// requeue everything in flight on it. A publishing that cannot fit is an
// error wrapping quarantine.ErrNoFit. Fitting may cut headers and add
// notes, so signed retry state (back: the publishing goes back to the work
// queue) is signed after it, in place of seal's placeholder of the same
// size, so p still fits; a quarantine publish's envelope likewise, in
// place of buildQuarantine's placeholder (one HMAC per quarantine publish).
func finish(in *buildInput, exchange, key string, p amqp.Publishing, back bool) (built, error) {
	for k, v := range in.trace {
		p.Headers[k] = v
	}
	changed, err := quarantine.Fit(&p, in.frameMax, fitRank(back, in.versionHeader))
	switch {
	case err != nil:
	case back:
		sign(in, p.Headers)
	default:
		quarantine.SignEnvelope(in.signer, p.Headers, exchange, p.MessageId, p.Body)
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
	(&quarantine.Envelope{Notes: notes}).ApplyNotes(h)
	h[wire.HeaderSignature] = in.signer.Placeholder()
}

// sign signs the retry state in h for d's work queue.
func sign(in *buildInput, h amqp.Table) {
	h[wire.HeaderSignature] = in.signer.Sign(subject(in.queue, in.d), h, signedHeaders)
}

// fitRank says which of a republish's headers quarantine.Fit may drop or
// cut first (see quarantine.Rank for the order). A retry (back into the
// work queue) must reach the handler as the producer sent it, so every
// header the producer set travels unchanged (FixedHeader), except trace
// context, which only tracing reads and which the bridge re-injects anyway;
// only the bridge's own headers give way. A retry that still cannot fit is
// quarantined instead (see settleFailure), where the producer's headers may
// go too; versionHeader and the idempotency key go last of them.
func fitRank(back bool, versionHeader string) func(string) quarantine.Rank {
	return func(k string) quarantine.Rank {
		if k == wire.HeaderEnvelopeSignature && !back {
			return quarantine.FixedHeader // a placeholder of the signature's size
		}
		switch k {
		case wire.HeaderTraceparent, wire.HeaderTracestate, wire.HeaderBaggage:
			return quarantine.TraceHeader
		case wire.HeaderLastError:
			return quarantine.DetailHeader
		case wire.HeaderEnvelope, wire.HeaderSource, wire.HeaderClass, wire.HeaderReason,
			wire.HeaderFingerprint, wire.HeaderAttempts, wire.HeaderFirstFailureAt,
			wire.HeaderOriginalExchange, wire.HeaderOriginalRoutingKey, wire.HeaderOriginalQueue,
			wire.HeaderIdempotencyKeyCopy, wire.HeaderOriginalExpiration, wire.HeaderOriginalUserID,
			wire.HeaderRedriveCount:
			return quarantine.EssentialHeader
		}
		switch {
		case back:
			return quarantine.FixedHeader
		case k == versionHeader || k == wire.HeaderIdempotencyKey:
			return quarantine.IdentityHeader
		case strings.HasPrefix(k, wire.OwnPrefix) || wire.IsDeathHeader(k):
			return quarantine.DetailHeader
		}
		return quarantine.ProducerHeader
	}
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

// ownRedrives keeps a redrive count in the quarantine envelope only if a
// replay's redrive signature vouches for it (on d as received: the body
// and message id it signed); the envelope signature, which covers it, then
// vouches for it in the record, even if redaction changed the body. Any
// other count is the publisher's claim (a header is evidence, never a
// command): it and its signature are removed, so that nothing the runtime
// signs carries it as prior replays, and a note added to notes keeps what
// was claimed. A runtime with a random key of its own (in.verifier nil)
// can verify nothing and keeps the count as claimed, as its keeper does.
func ownRedrives(in *buildInput, h amqp.Table, notes []string) []string {
	d := in.d
	if _, claimed := d.Headers[wire.HeaderRedriveCount]; !claimed {
		delete(h, wire.HeaderRedriveSignature)
		return notes
	}
	var v triage.Verification
	if in.verifier == nil {
		// A random key of this process's own: it cannot check a replay's
		// signature, and its keeper keeps the count as claimed (see
		// quarantine.TrustedRedrives); so does this envelope, or no record
		// would ever have a prior replay and max_redrives would never stop
		// a message that fails again after every replay. Only an integer:
		// the count is an essential header, which fitting never drops.
		if _, res := wireval.Int(d.Headers[wire.HeaderRedriveCount]); res == wireval.IntOK || res == wireval.IntOverflow {
			return notes
		}
		v.Problem = "not an integer"
	} else if v = in.verifier.VerifyRedrive(d.MessageId, d.Body, d.Headers); v.Valid {
		return notes
	}
	delete(h, wire.HeaderRedriveCount)
	delete(h, wire.HeaderRedriveSignature)
	return append(notes, quarantine.UnverifiedRedrives(d.Headers, v.Problem))
}

// priorNotes are the notes an earlier hop recorded, if its signature vouches
// for them (signed): unsigned ones were written by someone else.
func priorNotes(d *amqp.Delivery, signed bool) []string {
	if !signed {
		return nil
	}
	notes, _ := wireval.StringList(d.Headers[wire.HeaderNotes])
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

// mergeNotes appends the lists, dropping exact repeats (a note carried
// through several hops is recorded once).
func mergeNotes(lists ...[]string) []string {
	var out []string
	for _, l := range lists {
		for _, n := range l {
			if !slices.Contains(out, n) {
				out = append(out, n)
			}
		}
	}
	return out
}
