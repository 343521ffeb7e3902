// Package wire is dlxbridge's wire contract: the name of every header the
// bridge reads or writes (its own dlxbridge-* headers, the producer's
// idempotency key and schema version, the broker's x-death family, W3C trace
// context). The values of those headers come from producers and brokers the
// bridge does not control; the module reads them with hardened readers of
// its own.
//
// It imports only the standard library, so every other package, including
// the pure triage, can use it. No header name is spelled anywhere else in
// the module: a test holds every other file to that.
package wire

import "strings"

// The bridge's own headers. They have no "x-" prefix: x- headers belong to
// the broker. Values are strings unless noted.
const (
	// OwnPrefix starts the name of every header the bridge writes.
	OwnPrefix = "dlxbridge-"

	// HeaderAttempts is the number of failed attempts so far (int64), set on
	// every retry publish and in the quarantine envelope.
	HeaderAttempts = "dlxbridge-attempts"
	// HeaderFirstFailureAt is when the first attempt failed: an RFC 3339
	// (nano) UTC string; int64 unix milliseconds are also read.
	HeaderFirstFailureAt = "dlxbridge-first-failure-at"
	// HeaderSignature is the bridge's signature over its retry state (the
	// headers triage.SignedHeaders names), bound to one work queue and one
	// message: "v1:" and the base64url HMAC-SHA256 (see triage.Signer).
	// Without a valid one those headers are the publisher's, and nothing
	// trusts them.
	HeaderSignature = "dlxbridge-signature"
	// HeaderReadmitted marks a message the bridge re-admitted into its work
	// queue; its value is triage.XDeathDigest of the message's x-death.
	// Signed, it tells triage.Precheck that the broker's delivery count on
	// this copy is the work queue's own.
	HeaderReadmitted = "dlxbridge-readmitted"
	// HeaderLastError is a retried message's last error text (truncated).
	HeaderLastError = "dlxbridge-last-error"
	// HeaderOriginalExpiration keeps a message's own expiration property,
	// which a retry replaces with its delay and the quarantine drops.
	HeaderOriginalExpiration = "dlxbridge-original-expiration"
	// HeaderOriginalUserID keeps the user-id property, which the broker
	// refuses on a publish by a different user.
	HeaderOriginalUserID = "dlxbridge-original-user-id"
	// HeaderOriginalExchange, HeaderOriginalRoutingKey and
	// HeaderOriginalQueue say where the message first came from. They are
	// set on the first retry publish and kept through every hop.
	HeaderOriginalExchange   = "dlxbridge-original-exchange"
	HeaderOriginalRoutingKey = "dlxbridge-original-routing-key"
	HeaderOriginalQueue      = "dlxbridge-original-queue"
	// HeaderNotes carries triage notes (forged or malformed headers seen,
	// headers dropped to fit a frame), as a JSON array of strings.
	HeaderNotes = "dlxbridge-notes"
	// HeaderDropped lists what was dropped or cut so that a retry or
	// quarantine publish fits one frame, as a JSON array of "header:<name>"
	// and "property:<name>".
	HeaderDropped = "dlxbridge-dropped"

	// The quarantine envelope (see quarantine.Envelope).

	// HeaderEnvelope is the envelope format version (int32).
	HeaderEnvelope = "dlxbridge-envelope"
	// HeaderSource is "bridge" for envelopes written by dlxbridge.
	HeaderSource = "dlxbridge-source"
	// HeaderClass is the failure class (triage.Class).
	HeaderClass = "dlxbridge-class"
	// HeaderReason is the human reason for quarantine.
	HeaderReason = "dlxbridge-reason"
	// HeaderError is the last error message, truncated.
	HeaderError = "dlxbridge-error"
	// HeaderFingerprint groups like failures (triage.Fingerprint).
	HeaderFingerprint = "dlxbridge-fingerprint"
	// HeaderLastFailureAt and HeaderQuarantinedAt are RFC 3339 UTC times
	// with nanoseconds.
	HeaderLastFailureAt = "dlxbridge-last-failure-at"
	HeaderQuarantinedAt = "dlxbridge-quarantined-at"
	// HeaderMessageType and HeaderSchemaVersion are what the schema gate
	// read, when it got that far.
	HeaderMessageType   = "dlxbridge-message-type"
	HeaderSchemaVersion = "dlxbridge-schema-version"
	// HeaderValidationErrors is a JSON array of {pointer, keyword, message}.
	HeaderValidationErrors = "dlxbridge-validation-errors"
	// HeaderIdempotencyKeyCopy is the envelope's copy of the message's
	// idempotency key (its HeaderIdempotencyKey, else its message id).
	HeaderIdempotencyKeyCopy = "dlxbridge-idempotency-key"
	// HeaderTraceID is the W3C trace id of the span that quarantined it.
	HeaderTraceID = "dlxbridge-trace-id"
	// HeaderWorkerHost and HeaderWorkerVersion name the process that
	// quarantined the message.
	HeaderWorkerHost    = "dlxbridge-worker-host"
	HeaderWorkerVersion = "dlxbridge-worker-version"
	// HeaderRedacted lists what redaction changed (JSON array of header
	// names and body pointers).
	HeaderRedacted = "dlxbridge-redacted"
	// HeaderRedactionFailed says why configured body redaction could not be
	// applied.
	HeaderRedactionFailed = "dlxbridge-redaction-failed"
	// HeaderStack is the stack of a handler panic (class panic).
	HeaderStack = "dlxbridge-stack"
	// HeaderEnvelopeSignature is the runtime's signature over the envelope
	// it wrote (see triage.Signer.SignEnvelope and quarantine.Publishing):
	// a reader with the key trusts an envelope only under a valid one.
	HeaderEnvelopeSignature = "dlxbridge-envelope-signature"
)

// Headers on a record in a quarantine's records stream.
const (
	// HeaderRecordID is the record's id (a content hash, stable across
	// copies of one message).
	HeaderRecordID = "dlxbridge-record-id"
	// HeaderRecordIntake is the quarantine queue the record came through.
	HeaderRecordIntake = "dlxbridge-record-intake"
)

// Headers on an event in a quarantine's events stream.
const (
	// HeaderEventSignature is the signature of the replay, purge or
	// runtime that wrote the event (see triage.Signer.SignEvent), over its
	// body and the events stream it was written to: a reader with the key
	// lets an event change a record's state only under a valid one.
	HeaderEventSignature = "dlxbridge-event-signature"
)

// Headers a replay out of the quarantine sets.
const (
	// HeaderRedriveCount is how many times the message was replayed out of
	// a quarantine (int64).
	HeaderRedriveCount = "dlxbridge-redrive-count"
	// HeaderRedriveSignature is a replay's signature over the redrive count
	// it set (see triage.Signer.SignRedrive): without a valid one, or a
	// valid envelope signature that covers the count, the count is the
	// publisher's claim.
	HeaderRedriveSignature = "dlxbridge-redrive-signature"
	// HeaderRedriveAt is the last replay's time (RFC 3339).
	HeaderRedriveAt = "dlxbridge-redrive-at"
	// HeaderRedriveReason is the last replay's reason.
	HeaderRedriveReason = "dlxbridge-redrive-reason"
	// HeaderReplayJob is the replay (job) that sent the message, and
	// HeaderReplayRecord the record it was sent from: the runtime records
	// what became of it in that job, only under a valid
	// HeaderReplayJobSignature (see triage.Signer.SignReplayJob).
	HeaderReplayJob          = "dlxbridge-replay-job"
	HeaderReplayRecord       = "dlxbridge-replay-record"
	HeaderReplayJobSignature = "dlxbridge-replay-job-signature"
)

// Headers a producer sets.
const (
	// HeaderIdempotencyKey names a message's idempotency key, which handlers
	// use to drop duplicates (delivery is at least once); the message id
	// stands in when it is absent.
	HeaderIdempotencyKey = "idempotency-key"
	// DefaultVersionHeader is the header that holds a message's schema
	// version when its type is the AMQP type property (the header's name is
	// configurable per queue).
	DefaultVersionHeader = "schema-version"
)

// Headers the broker writes; the bridge only reads them, and never carries
// them back into a work queue (see IsBrokerHeader).
const (
	// HeaderXDeath is the dead-letter history: an array of tables, newest
	// first, one per {queue, reason}; see the XDeath* field names.
	HeaderXDeath = "x-death"
	// HeaderDeliveryCount is a quorum queue's delivery count; absent on the
	// first delivery.
	HeaderDeliveryCount = "x-delivery-count"
	// HeaderAcquiredCount is RabbitMQ 4.3's count of a quorum queue's
	// acquisitions of the message (every delivery that was returned, nack
	// included, which x-delivery-count no longer counts there); absent on
	// the first delivery and on older brokers.
	HeaderAcquiredCount = "x-acquired-count"
	// FirstDeathPrefix and LastDeathPrefix start the x-first-death-* (all
	// versions) and x-last-death-* (3.13+) headers.
	FirstDeathPrefix         = "x-first-death-"
	LastDeathPrefix          = "x-last-death-"
	HeaderFirstDeathQueue    = FirstDeathPrefix + "queue"
	HeaderFirstDeathReason   = FirstDeathPrefix + "reason"
	HeaderFirstDeathExchange = FirstDeathPrefix + "exchange"
	HeaderLastDeathQueue     = LastDeathPrefix + "queue"
	HeaderLastDeathReason    = LastDeathPrefix + "reason"
	HeaderLastDeathExchange  = LastDeathPrefix + "exchange"
)

// The broker's sender-selected distribution headers: arrays of routing
// keys that the broker routes a publish by, beside its routing key (CC, and
// BCC, which it removes before delivery). A copy the bridge publishes must
// never carry a producer's: the bridge's own publish would then reach
// whatever queue the producer named (through the default exchange, any
// queue of the vhost). The runtime writes its own CC on a retry into the
// shared tiers, naming the work queue it returns to.
const (
	HeaderCC  = "CC"
	HeaderBCC = "BCC"
)

// IsRoutingHeader reports whether k is CC or BCC.
func IsRoutingHeader(k string) bool { return k == HeaderCC || k == HeaderBCC }

// Field names of one x-death entry.
const (
	XDeathCount              = "count"
	XDeathReason             = "reason"
	XDeathQueue              = "queue"
	XDeathExchange           = "exchange"
	XDeathRoutingKeys        = "routing-keys"
	XDeathTime               = "time"
	XDeathOriginalExpiration = "original-expiration"
)

// W3C trace context and baggage.
const (
	HeaderTraceparent = "traceparent"
	HeaderTracestate  = "tracestate"
	HeaderBaggage     = "baggage"
)

// IsBrokerHeader reports whether k is a dead-letter or count header the
// broker owns: x-death, x-delivery-count, x-acquired-count, x-first-death-*
// or x-last-death-*.
func IsBrokerHeader(k string) bool {
	return IsCountHeader(k) || IsDeathHeader(k)
}

// IsCountHeader reports whether k is one of a quorum queue's delivery
// counts (x-delivery-count, x-acquired-count): the headers a redelivery of
// the same message changes.
func IsCountHeader(k string) bool {
	return k == HeaderDeliveryCount || k == HeaderAcquiredCount
}

// IsDeathHeader reports whether k is x-death or one of the
// x-first-death-*/x-last-death-* headers (the dead-letter record, without
// the delivery count).
func IsDeathHeader(k string) bool {
	return k == HeaderXDeath || strings.HasPrefix(k, FirstDeathPrefix) || strings.HasPrefix(k, LastDeathPrefix)
}

// isTraceHeader reports whether k carries trace context or baggage.
func isTraceHeader(k string) bool {
	return k == HeaderTraceparent || k == HeaderTracestate || k == HeaderBaggage
}
