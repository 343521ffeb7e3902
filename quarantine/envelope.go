package quarantine

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/internal/frame"
	"github.com/dlxbridge/dlxbridge/internal/wireval"
	"github.com/dlxbridge/dlxbridge/triage"
	"github.com/dlxbridge/dlxbridge/wire"
)

// Header names are in package wire (wire.HeaderClass, wire.HeaderReason, …):
// the envelope writes them, and wire is the one place any header is named.

// Limits that keep the envelope well inside one frame.
const (
	maxErrorBytes      = frame.MaxErrorBytes
	maxValidationBytes = 8192
	maxNotesBytes      = frame.MaxNotesBytes
	maxKeyBytes        = 256 // idempotency key copy; the original header is kept as is
	MaxStackBytes      = 4096
	// EnvelopeVersion 2 adds the redrive count to what the envelope
	// signature covers (see envelopeFieldsFor); version 1 is still read.
	EnvelopeVersion = 2
)

// Source of a record.
const (
	SourceBridge = "bridge" // the bridge quarantined it with an envelope
	SourceBroker = "broker" // the broker dead-lettered it (x-death only)
	// SourceUnverified: the message carries an envelope that no valid
	// signature vouches for and no x-death either (see ReadVerified).
	SourceUnverified = "unverified"
)

// Violation is one schema violation.
type Violation struct {
	Pointer string `json:"pointer"`
	Keyword string `json:"keyword"`
	Message string `json:"message"`
}

// Envelope is the failure record of a quarantined message.
type Envelope struct {
	Source           string       `json:"source"`
	Class            triage.Class `json:"class"`
	Reason           string       `json:"reason"`
	Error            string       `json:"error,omitempty"`
	Fingerprint      string       `json:"fingerprint,omitempty"`
	Attempts         int          `json:"attempts"`
	FirstFailureAt   time.Time    `json:"first_failure_at,omitzero"`
	LastFailureAt    time.Time    `json:"last_failure_at,omitzero"`
	QuarantinedAt    time.Time    `json:"quarantined_at,omitzero"`
	OriginalExchange string       `json:"original_exchange"`
	OriginalRouting  string       `json:"original_routing_key"`
	OriginalQueue    string       `json:"original_queue"`
	MessageID        string       `json:"message_id,omitempty"`
	IdempotencyKey   string       `json:"idempotency_key,omitempty"`
	MessageType      string       `json:"message_type,omitempty"`
	SchemaVersion    string       `json:"schema_version,omitempty"`
	Validation       []Violation  `json:"validation_errors,omitempty"`
	Traceparent      string       `json:"traceparent,omitempty"`
	TraceID          string       `json:"trace_id,omitempty"`
	WorkerHost       string       `json:"worker_host,omitempty"`
	WorkerVersion    string       `json:"worker_version,omitempty"`
	Redacted         []string     `json:"redacted,omitempty"`
	RedactionFailed  string       `json:"redaction_failed,omitempty"`
	Notes            []string     `json:"notes,omitempty"`
	Dropped          []string     `json:"dropped,omitempty"`
	Stack            string       `json:"stack,omitempty"`
	// PayloadOmitted is set only by the keeper, in a record's meta (never
	// read from headers): the record keeps the message without its payload.
	PayloadOmitted *PayloadOmitted `json:"payload_omitted,omitempty"`
	// Verified is true when the envelope was read under a valid envelope
	// signature (wire.HeaderEnvelopeSignature) with the runtime's key: the
	// runtime wrote every field the signature covers (see ReadVerified).
	// False for a broker dead letter (x-death is no signature), for an
	// envelope read without the key, and for a record written before
	// envelopes were signed.
	Verified bool `json:"verified"`
}

// PayloadOmitted says why a record holds no payload: the message with its
// record meta was over the broker's max message size, so the keeper stored
// the rest of it (listed, counted, purgeable; never replayable).
type PayloadOmitted struct {
	Reason string `json:"reason"`
	// Bytes is the size of the payload as received.
	Bytes int `json:"bytes"`
}

// Apply writes the envelope into headers (which must be non-nil), over any
// envelope headers already there. Texts are cut to their Max*Bytes, lists
// keep what fits, and a time outside the years 0000-9999, which RFC 3339
// cannot write (a forged x-death can carry one), is left out.
func (e *Envelope) Apply(h amqp.Table) {
	set := func(k, v string) {
		if v != "" {
			h[k] = v
		} else {
			delete(h, k)
		}
	}
	setTime := func(k string, t time.Time) {
		if y := t.UTC().Year(); t.IsZero() || y < 0 || y > 9999 {
			delete(h, k)
			return
		}
		h[k] = t.UTC().Format(time.RFC3339Nano)
	}
	h[wire.HeaderEnvelope] = int32(EnvelopeVersion)
	set(wire.HeaderSource, e.Source)
	set(wire.HeaderClass, string(e.Class))
	set(wire.HeaderReason, frame.Truncate(e.Reason, maxErrorBytes))
	set(wire.HeaderError, frame.Truncate(e.Error, maxErrorBytes))
	set(wire.HeaderFingerprint, e.Fingerprint)
	h[wire.HeaderAttempts] = int64(e.Attempts)
	setTime(wire.HeaderFirstFailureAt, e.FirstFailureAt)
	setTime(wire.HeaderLastFailureAt, e.LastFailureAt)
	setTime(wire.HeaderQuarantinedAt, e.QuarantinedAt)
	set(wire.HeaderOriginalExchange, e.OriginalExchange)
	set(wire.HeaderOriginalRoutingKey, e.OriginalRouting)
	set(wire.HeaderOriginalQueue, e.OriginalQueue)
	set(wire.HeaderIdempotencyKeyCopy, frame.Truncate(e.IdempotencyKey, maxKeyBytes))
	set(wire.HeaderMessageType, e.MessageType)
	set(wire.HeaderSchemaVersion, e.SchemaVersion)
	set(wire.HeaderValidationErrors, encodeViolations(e.Validation))
	set(wire.HeaderTraceID, e.TraceID)
	set(wire.HeaderWorkerHost, e.WorkerHost)
	set(wire.HeaderWorkerVersion, e.WorkerVersion)
	set(wire.HeaderRedacted, frame.EncodeStrings(e.Redacted, maxNotesBytes))
	set(wire.HeaderRedactionFailed, e.RedactionFailed)
	set(wire.HeaderNotes, frame.EncodeStrings(e.Notes, maxNotesBytes))
	set(wire.HeaderStack, frame.Truncate(e.Stack, MaxStackBytes))
}

// encodeViolations keeps as many whole violations as fit maxValidationBytes.
func encodeViolations(vs []Violation) string {
	if len(vs) == 0 {
		return ""
	}
	for n := len(vs); n > 0; n-- {
		b, err := json.Marshal(vs[:n])
		if err == nil && len(b) <= maxValidationBytes {
			return string(b)
		}
	}
	b, _ := json.Marshal([]Violation{{Message: fmt.Sprintf("%d violations; too large to record", len(vs))}})
	return string(b)
}

// Read returns the envelope recorded in a quarantined message's headers. A
// message the broker dead-lettered on its own has no envelope: Read then
// derives one from x-death (Source "broker", Class from the dead-letter
// reason). ok is false when neither is present. Read checks no signature:
// the envelope is whatever the headers claim (a message the broker
// dead-letters keeps the producer's headers), never Verified; readers with
// the runtime's key use ReadVerified.
func Read(d *amqp.Delivery) (env Envelope, ok bool) {
	h := map[string]any(d.Headers)
	env.MessageID = d.MessageId
	env.Traceparent = wireval.Str(h, wire.HeaderTraceparent)
	if _, has := h[wire.HeaderEnvelope]; has {
		env.Source = wireval.Str(h, wire.HeaderSource)
		if env.Source == SourceBroker || env.Source == SourceUnverified {
			// Sources a reader derives, never written into an envelope: a
			// claim of one is read as the bridge's envelope it pretends to
			// be, so that unverified it is marked as a claim.
			env.Source = SourceBridge
		}
		env.Class = triage.Class(wireval.Str(h, wire.HeaderClass))
		env.Reason = wireval.Str(h, wire.HeaderReason)
		env.Error = wireval.Str(h, wire.HeaderError)
		env.Fingerprint = wireval.Str(h, wire.HeaderFingerprint)
		env.Attempts = int(wireval.IntOrDecimal(h[wire.HeaderAttempts]))
		env.FirstFailureAt = headerTime(h, wire.HeaderFirstFailureAt)
		env.LastFailureAt = headerTime(h, wire.HeaderLastFailureAt)
		env.QuarantinedAt = headerTime(h, wire.HeaderQuarantinedAt)
		env.OriginalExchange = wireval.Str(h, wire.HeaderOriginalExchange)
		env.OriginalRouting = wireval.Str(h, wire.HeaderOriginalRoutingKey)
		env.OriginalQueue = wireval.Str(h, wire.HeaderOriginalQueue)
		env.IdempotencyKey = wireval.Str(h, wire.HeaderIdempotencyKeyCopy)
		env.MessageType = wireval.Str(h, wire.HeaderMessageType)
		env.SchemaVersion = wireval.Str(h, wire.HeaderSchemaVersion)
		_ = json.Unmarshal([]byte(wireval.Str(h, wire.HeaderValidationErrors)), &env.Validation)
		env.TraceID = wireval.Str(h, wire.HeaderTraceID)
		env.WorkerHost = wireval.Str(h, wire.HeaderWorkerHost)
		env.WorkerVersion = wireval.Str(h, wire.HeaderWorkerVersion)
		env.Redacted, _ = wireval.StringList(h[wire.HeaderRedacted])
		env.RedactionFailed = wireval.Str(h, wire.HeaderRedactionFailed)
		env.Notes, _ = wireval.StringList(h[wire.HeaderNotes])
		env.Dropped, _ = wireval.StringList(h[wire.HeaderDropped])
		env.Stack = wireval.Str(h, wire.HeaderStack)
		return env, true
	}
	return readDeadLetter(d, h)
}

// readDeadLetter derives an envelope from x-death: a message the broker
// dead-lettered on its own. ok is false without a dead-letter reason.
func readDeadLetter(d *amqp.Delivery, h map[string]any) (env Envelope, ok bool) {
	env.MessageID = d.MessageId
	env.Traceparent = wireval.Str(h, wire.HeaderTraceparent)
	hist := triage.ParseXDeath(h[wire.HeaderXDeath])
	class, found := triage.ClassifyDeadLetter(hist, h)
	if !found {
		return env, false
	}
	env.Source = SourceBroker
	env.Class = class
	env.Notes = hist.Notes
	if len(hist.Deaths) > 0 {
		newest := hist.Deaths[0]
		env.Reason = fmt.Sprintf("dead-lettered by the broker: %s from queue %q", newest.Reason, newest.Queue)
		env.OriginalQueue = newest.Queue
		env.OriginalExchange = newest.Exchange
		if len(newest.RoutingKeys) > 0 {
			env.OriginalRouting = newest.RoutingKeys[0]
		}
		env.LastFailureAt = newest.Time
		env.Attempts = int(newest.Count)
	}
	if first, ok := hist.Earliest(); ok {
		env.FirstFailureAt = first
	}
	return env, true
}

// envelopeFields are the headers an envelope signature covers: every one
// Read takes an envelope from, the format version first. With the
// signature's subject (the exchange the envelope was published to, the
// message id, the body as published) that is the whole record but the
// producer's own headers and the trace context.
var envelopeFields = []string{
	wire.HeaderEnvelope, wire.HeaderSource, wire.HeaderClass, wire.HeaderReason, wire.HeaderError,
	wire.HeaderFingerprint, wire.HeaderAttempts,
	wire.HeaderFirstFailureAt, wire.HeaderLastFailureAt, wire.HeaderQuarantinedAt,
	wire.HeaderOriginalExchange, wire.HeaderOriginalRoutingKey, wire.HeaderOriginalQueue,
	wire.HeaderIdempotencyKeyCopy, wire.HeaderMessageType, wire.HeaderSchemaVersion,
	wire.HeaderValidationErrors, wire.HeaderTraceID, wire.HeaderWorkerHost, wire.HeaderWorkerVersion,
	wire.HeaderRedacted, wire.HeaderRedactionFailed, wire.HeaderNotes, wire.HeaderDropped, wire.HeaderStack,
	// Version 2: the runtime keeps a redrive count in the envelope only if
	// it verified it (see Failure.ownRedrives), so the envelope
	// signature vouches for it even after redaction changed the body,
	// which voids the replay's redrive signature.
	wire.HeaderRedriveCount,
}

// envelopeFieldsV1 are what a version 1 envelope's signature covers: no
// redrive count. An envelope signed before version 2 (one waiting in an
// intake at an upgrade) still verifies; its count then needs a redrive
// signature of its own.
var envelopeFieldsV1 = envelopeFields[: len(envelopeFields)-1 : len(envelopeFields)-1]

// envelopeFieldsFor are the fields h's envelope signature covers, by its
// format version (itself the first signed field, so it cannot be changed
// to pick another list without voiding the signature).
func envelopeFieldsFor(h map[string]any) []string {
	if n, res := wireval.Int(h[wire.HeaderEnvelope]); res == wireval.IntOK && n == 1 {
		return envelopeFieldsV1
	}
	return envelopeFields
}

// envelopeCoversRedrives reports whether h's envelope signature, if valid,
// vouches for its redrive count (version 2 and later).
func envelopeCoversRedrives(h map[string]any) bool {
	return len(envelopeFieldsFor(h)) == len(envelopeFields)
}

// envelopeSubject is what an envelope signature is bound to: the exchange
// the envelope was published to (the work queue's dead exchange, which the
// broker sets on the intake delivery), the message id and the body as
// published.
func envelopeSubject(exchange, messageID string, body []byte) triage.Subject {
	return triage.Subject{Queue: exchange, MessageID: messageID, Body: body}
}

// signEnvelope signs the envelope in h (written by Apply, and final: fitted
// to its frame) for a publish to exchange of a message with messageID and
// body, in wire.HeaderEnvelopeSignature. A nil Signer removes that header:
// nothing else may stand there.
func signEnvelope(s *triage.Signer, h amqp.Table, exchange, messageID string, body []byte) {
	if s == nil {
		delete(h, wire.HeaderEnvelopeSignature)
		return
	}
	h[wire.HeaderEnvelopeSignature] = s.SignEnvelope(envelopeSubject(exchange, messageID, body), h, envelopeFieldsFor(h))
}

// verifyEnvelope checks the envelope signature of d as it reached the
// intake (d.Exchange is the exchange the envelope was published to). It
// never panics, whatever the headers hold.
func verifyEnvelope(s *triage.Signer, d *amqp.Delivery) triage.Verification {
	return s.VerifyEnvelope(envelopeSubject(d.Exchange, d.MessageId, d.Body), d.Headers, envelopeFieldsFor(d.Headers))
}

// ReadVerified is Read for a reader that holds the runtime's signing key
// (v): an envelope is taken from the headers only under a valid envelope
// signature, and is then Verified. Any other envelope is the word of
// whoever published the message (a message the broker dead-letters on its
// own keeps the producer's headers, a whole forged envelope included): the
// message is read as the broker's dead letter, from x-death as Read does
// when there is no envelope, and a note says what the envelope claimed and
// why it was not trusted. With no x-death either, the record's Source is
// SourceUnverified and it has no class. d must be the message as it reached
// the intake: its exchange, message id and body are signed.
//
// With v nil it is Read: the envelope as the headers claim it, not
// Verified.
func ReadVerified(d *amqp.Delivery, v *triage.Signer) (Envelope, bool) {
	if v == nil {
		return Read(d)
	}
	h := map[string]any(d.Headers)
	if _, has := h[wire.HeaderEnvelope]; !has {
		return Read(d)
	}
	res := verifyEnvelope(v, d)
	if res.Valid {
		env, ok := Read(d)
		env.Verified = ok
		return env, ok
	}
	env, ok := readDeadLetter(d, h)
	if !ok {
		env.Source = SourceUnverified
		env.Reason = "an envelope no valid signature vouches for, and no x-death (see the notes)"
	}
	env.Notes = append(env.Notes, unverifiedEnvelope(h, res.Problem))
	return env, true
}

// maxClaimBytes caps each claimed value quoted in a note.
const maxClaimBytes = 128

// unverifiedEnvelope is the note for an envelope that no valid signature
// vouches for: what it claimed (quoted, cut, never used) and why it was
// not trusted.
func unverifiedEnvelope(h map[string]any, problem string) string {
	var claim []string
	for _, f := range []struct{ name, key string }{
		{"source", wire.HeaderSource},
		{"class", wire.HeaderClass},
		{"fingerprint", wire.HeaderFingerprint},
		{"attempts", wire.HeaderAttempts},
		{"reason", wire.HeaderReason},
		{"exchange", wire.HeaderOriginalExchange},
		{"routing key", wire.HeaderOriginalRoutingKey},
		{"queue", wire.HeaderOriginalQueue},
	} {
		raw, present := h[f.key]
		if !present {
			continue
		}
		claim = append(claim, fmt.Sprintf("%s %q (%s)", f.name, claimText(raw), f.key))
	}
	what := "an envelope"
	if len(claim) > 0 {
		what += " with " + strings.Join(claim, ", ")
	}
	return fmt.Sprintf("envelope not verified: the message claimed %s (%s); read as the broker's dead letter", what, problem)
}

// claimText is a claimed header value as a note quotes it: a string or an
// integer as such, cut to maxClaimBytes; any other type as its name.
func claimText(raw any) string {
	s, ok := wireval.String(raw)
	if n, res := wireval.Int(raw); !ok && res == wireval.IntOK {
		s, ok = fmt.Sprint(n), true
	}
	if !ok {
		return "(" + wireval.TypeName(raw) + ")"
	}
	return frame.Truncate(s, maxClaimBytes)
}

// headerTime reads an envelope time: a time.Time or an RFC 3339 string.
func headerTime(h map[string]any, k string) time.Time {
	t, _ := wireval.Time(h[k], 0)
	return t
}
