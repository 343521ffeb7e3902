package consumer

import (
	"slices"
	"strconv"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/attribute"

	"github.com/dlxbridge/dlxbridge/internal/frame"
	"github.com/dlxbridge/dlxbridge/internal/wireval"
	"github.com/dlxbridge/dlxbridge/quarantine"
	"github.com/dlxbridge/dlxbridge/topology"
	"github.com/dlxbridge/dlxbridge/triage"
	"github.com/dlxbridge/dlxbridge/wire"
)

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
	// stack is the failure's panic stack as the record keeps it (see
	// panicStack), or "".
	stack string
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

// destination is where build's publishing goes.
func destination(in *buildInput) (exchange, key string) {
	switch in.f.verdict.Action {
	case triage.ActionRetry:
		lane, _ := retryLane(in)
		return in.wq.RetryExchange, lane.RoutingKey
	case triage.ActionReadmit:
		return "", in.queue
	default:
		return in.wq.DeadExchange, in.queue
	}
}

// destinationAttr is the span attribute that says what build's publishing
// is.
func destinationAttr(in *buildInput) attribute.KeyValue {
	switch v := in.f.verdict; v.Action {
	case triage.ActionRetry:
		_, delay := retryLane(in)
		return attribute.Int64("dlxbridge.retry.delay_ms", delay.Milliseconds())
	case triage.ActionReadmit:
		return attribute.Bool("dlxbridge.readmit", true)
	default:
		return attribute.String("dlxbridge.class", string(v.Class))
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
	h := frame.StripHeaders(d.Headers, nil, retryRoom(in))
	setRetryState(in, h, int64(f.verdict.Attempt), first)
	p := frame.Republish(d, h, d.Body)
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

// retryRoom is how many headers buildRetry may add to those it keeps of
// the delivery's: the retry state (five), the last error, the notes, the
// signature, what fitting records, the expiration and user id moved into
// headers, a shared tier's CC, the trace context. A table sized for
// frame.CopyRoom more was twice the size a first retry needs.
func retryRoom(in *buildInput) int {
	n := 9 + len(in.trace)
	if in.d.Expiration != "" {
		n++
	}
	if in.d.UserId != "" {
		n++
	}
	if in.wq.Shared() {
		n++
	}
	return n
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
	setRetryState(in, base, int64(f.attempts.Failed), f.attempts.FirstFailure)
	base[wire.HeaderReadmitted] = triage.XDeathDigest(d.Headers)
	p := frame.Republish(d, base, d.Body)
	notes := append(slices.Clip(f.attempts.Notes), f.verdict.Reason)
	seal(in, p.Headers, mergeNotes(priorNotes(d, f.attempts.Signed), notes))
	return finish(in, "", in.queue, p)
}

// setRetryState writes into h, a copy's headers, the bridge's state a
// message carries back into its work queue: failed attempts so far, when
// the first failed, where it first came from. seal adds the notes and
// signs it. Every other retry-signed header is removed first (the notes
// but for seal, and a re-admission sets its own after): a producer's
// header must not travel under the runtime's signature as if the bridge
// wrote it, and one of a type the signature cannot vouch for would void
// the signature, so that a failing message is retried for ever. Written
// into h directly: a table of its own was two allocations and a copy per
// copy.
func setRetryState(in *buildInput, h amqp.Table, attempts int64, first time.Time) {
	ex, key, queue := origin(in.d, in.queue, in.f.attempts.Signed)
	for _, k := range signedHeaders {
		if k != wire.HeaderNotes {
			delete(h, k)
		}
	}
	h[wire.HeaderAttempts] = attempts
	h[wire.HeaderOriginalExchange] = ex
	h[wire.HeaderOriginalRoutingKey] = key
	h[wire.HeaderOriginalQueue] = queue
	if !first.IsZero() {
		h[wire.HeaderFirstFailureAt] = first.UTC().Format(rfc3339Nano)
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
		Verdict: f.verdict, Err: f.err, Validation: f.validation, Stack: in.stack,
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
