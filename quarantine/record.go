package quarantine

import (
	"fmt"
	"maps"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/internal/frame"
	"github.com/dlxbridge/dlxbridge/internal/wireval"
	"github.com/dlxbridge/dlxbridge/schemas"
	"github.com/dlxbridge/dlxbridge/triage"
	"github.com/dlxbridge/dlxbridge/wire"
)

// Failure is a delivery the runtime quarantines and what it knows of the
// failure: the input of Publishing, which writes the record.
type Failure struct {
	// Delivery is the message as received from the work queue.
	Delivery *amqp.Delivery
	// Exchange is the dead exchange the record is published to: the
	// envelope signature is bound to it.
	Exchange string
	// OriginalExchange, OriginalRoutingKey and OriginalQueue are where the
	// message was first published and the work queue it failed in.
	OriginalExchange, OriginalRoutingKey, OriginalQueue string
	// Verdict is the triage decision: its class, reason and attempt.
	Verdict triage.Verdict
	// Err is the handler's (or the gate's) error, nil for a crash-loop.
	Err error
	// Validation is the schema gate's refusal, if that was the failure.
	Validation *schemas.ValidationError
	// Stack is a panicking handler's stack.
	Stack string
	// MessageType and SchemaVersion are what the gate identified.
	MessageType, SchemaVersion string
	// FirstFailureAt is when the message first failed (zero: At).
	FirstFailureAt time.Time
	// At is when it is quarantined.
	At time.Time
	// Notes are what the hops so far noted, oldest first.
	Notes []string
	// Signed: an earlier hop's retry signature vouches for the delivery's
	// bridge headers, so its wire.HeaderDropped is the runtime's own.
	Signed bool
	// Redaction is applied to what the record keeps.
	Redaction Redaction
	// WorkerHost and WorkerVersion name the process; TraceID is the
	// consume span's trace id, Trace the trace context to inject.
	WorkerHost, WorkerVersion, TraceID string
	Trace                              amqp.Table
	// VersionHeader is the queue's schema version header (fitting keeps
	// it longest among the producer's headers).
	VersionHeader string
	// FrameMax is the publishing connection's frame size (0: the broker's
	// default): the record's header frame must fit one frame.
	FrameMax int
	// Signer signs the envelope. Verifier checks a replay's redrive
	// signature: nil when Signer's key is a random one of this process's,
	// which can verify nothing (see Publishing).
	Signer, Verifier *triage.Signer
}

// Publishing writes f's quarantine record, the one way the runtime writes
// one: the message as received (redacted as configured) with the failure
// envelope, fitted to one frame and signed (wire.HeaderEnvelopeSignature).
// A message the broker dead-letters on its own keeps the producer's
// headers, and the signature tells this envelope from one a producer
// wrote. No retry state in it is signed: the quarantine is no way back
// into the work queue (a replay starts the message's retry state over).
//
// changed lists what fitting dropped or cut. An error wrapping the frame
// package's no-fit error means the record cannot fit one frame: nothing
// may be sent.
func Publishing(f *Failure) (p amqp.Publishing, changed []string, err error) {
	d, v := f.Delivery, f.Verdict
	red := f.Redaction.Apply(d.Headers, d.Body)
	env := Envelope{
		Source:           SourceBridge,
		Class:            v.Class,
		Reason:           v.Reason,
		Attempts:         v.Attempt,
		FirstFailureAt:   f.FirstFailureAt,
		LastFailureAt:    f.At,
		QuarantinedAt:    f.At,
		OriginalExchange: f.OriginalExchange,
		OriginalRouting:  f.OriginalRoutingKey,
		OriginalQueue:    f.OriginalQueue,
		MessageID:        d.MessageId,
		IdempotencyKey:   d.MessageId,
		MessageType:      f.MessageType,
		SchemaVersion:    f.SchemaVersion,
		WorkerHost:       f.WorkerHost,
		WorkerVersion:    f.WorkerVersion,
		TraceID:          f.TraceID,
		Redacted:         red.Changed,
		RedactionFailed:  red.Failed,
		Stack:            f.Stack,
		Notes:            f.Notes,
	}
	if f.Err != nil {
		env.Error = f.Err.Error()
	}
	if k := wireval.Str(d.Headers, wire.HeaderIdempotencyKey); k != "" {
		env.IdempotencyKey = k
	}
	if env.FirstFailureAt.IsZero() {
		env.FirstFailureAt = f.At
	}
	if red.Headers[wire.HeaderIdempotencyKey] == redactedValue {
		env.IdempotencyKey = redactedValue // redaction covers the envelope's copy too
	}
	if vr := f.Validation; vr != nil {
		for _, vi := range vr.Violations {
			env.Validation = append(env.Validation, Violation{Pointer: vi.Pointer, Keyword: vi.Keyword, Message: vi.Message})
		}
		if len(env.Validation) == 0 {
			env.Validation = []Violation{{Keyword: string(vr.Reason), Message: vr.Detail}}
		}
	}
	env.Fingerprint = triage.Fingerprint(v.Class, f.fingerprintText(), f.MessageType, f.SchemaVersion)

	h := make(amqp.Table, len(red.Headers)+16)
	maps.Copy(h, red.Headers)
	p = frame.Republish(d, h, red.Body)
	delete(p.Headers, wire.HeaderSignature)
	if !f.Signed {
		// No earlier hop's signature vouches for this dlxbridge-dropped:
		// the producer wrote it, and the envelope signature would present
		// it as what the runtime dropped.
		delete(p.Headers, wire.HeaderDropped)
	}
	env.Notes = f.ownRedrives(p.Headers, env.Notes)
	env.Notes = refusedRoutingHeaders(p.Headers, env.Notes)
	env.Apply(p.Headers)
	// Room for the envelope signature, written over once fitting has made
	// the envelope final (one HMAC per record).
	p.Headers[wire.HeaderEnvelopeSignature] = f.Signer.Placeholder()
	for k, v := range f.Trace {
		p.Headers[k] = v
	}
	changed, err = frame.Fit(&p, f.FrameMax, frame.RecordRank(f.VersionHeader))
	if err == nil {
		signEnvelope(f.Signer, p.Headers, f.Exchange, p.MessageId, p.Body)
	}
	return p, changed, err
}

// ownRedrives keeps a redrive count in the envelope only if a replay's
// redrive signature vouches for it (on the delivery as received: the body
// and message id it signed); the envelope signature, which covers it,
// then vouches for it in the record, even if redaction changed the body.
// Any other count is the publisher's claim (a header is evidence, never a
// command): it and its signature are removed from h, so that nothing the
// runtime signs carries it as prior replays, and a note added to notes
// keeps what was claimed. A runtime with a random key of its own
// (Verifier nil) can verify nothing and keeps the count as claimed, as its
// keeper does.
func (f *Failure) ownRedrives(h amqp.Table, notes []string) []string {
	d := f.Delivery
	if _, claimed := d.Headers[wire.HeaderRedriveCount]; !claimed {
		delete(h, wire.HeaderRedriveSignature)
		return notes
	}
	var v triage.Verification
	if f.Verifier == nil {
		// A random key of this process's own: it cannot check a replay's
		// signature, and its keeper keeps the count as claimed (see
		// trustedRedrives); so does this envelope, or no record would ever
		// have a prior replay and max_redrives would never stop a message
		// that fails again after every replay. Only an integer: the count
		// is an essential header, which fitting never drops.
		if _, res := wireval.Int(d.Headers[wire.HeaderRedriveCount]); res == wireval.IntOK || res == wireval.IntOverflow {
			return notes
		}
		v.Problem = "not an integer"
	} else if v = f.Verifier.VerifyRedrive(d.MessageId, d.Body, d.Headers); v.Valid {
		return notes
	}
	delete(h, wire.HeaderRedriveCount)
	delete(h, wire.HeaderRedriveSignature)
	return append(notes, unverifiedRedrives(d.Headers, v.Problem))
}

// refusedRoutingHeaders removes from h a CC or BCC that is not an array,
// and adds a note to notes that keeps what it held. The broker refuses a
// publish whose CC or BCC is anything else and closes the channel (406
// unacceptable_type_in_header), failing every copy in flight on it; an
// AMQP 0-9-1 producer cannot send one, but on RabbitMQ 4.x an AMQP 1.0
// producer's application property CC arrives as such a header. An array
// stays: the broker takes it, and the record keeps what was received.
func refusedRoutingHeaders(h amqp.Table, notes []string) []string {
	for _, k := range [...]string{wire.HeaderCC, wire.HeaderBCC} {
		v, ok := h[k]
		if _, isArray := v.([]any); !ok || isArray {
			continue
		}
		delete(h, k)
		notes = append(notes, fmt.Sprintf("header %s dropped: it held %q (%s), and the broker refuses a publish whose %s is not an array",
			k, claimText(v), wireval.TypeName(v), k))
	}
	return notes
}

// fingerprintText is what a failure is grouped by: the error, else the
// verdict's reason (crash-loops have no error of their own).
func (f *Failure) fingerprintText() string {
	if vr := f.Validation; vr != nil {
		if len(vr.Violations) > 0 {
			return string(vr.Reason) + " " + vr.Violations[0].Pointer + " " + vr.Violations[0].Keyword
		}
		return string(vr.Reason)
	}
	if f.Err != nil {
		return f.Err.Error()
	}
	return f.Verdict.Reason
}
