package consumer

import (
	"time"

	"github.com/dlxbridge/dlxbridge/schemas"
	"github.com/dlxbridge/dlxbridge/triage"
)

// Settled is one delivery's outcome, as Config.OnSettled receives it.
type Settled struct {
	// Queue is the work queue the delivery came from.
	Queue string
	// MessageID is the AMQP message id.
	MessageID string
	// Type and Version name the message's schema as far as the runtime read
	// them (the version on the wire, before any upcast): "" when the
	// crash-loop guard settled it before it was read, when the session
	// ended before it was read (OutcomeAbandoned), or when the message
	// names none.
	Type, Version string
	// Outcome is what the runtime did (the outcome label of
	// dlxbridge_deliveries_total).
	Outcome Outcome
	// Class is the failure's class: triage.Classify's for the gate's and
	// the handler's errors, triage.ClassCrashLoop from the crash-loop
	// guard; "" when the handler succeeded.
	Class triage.Class
	// Reason says why a failure was retried or quarantined, as the
	// quarantine envelope does; "" when the handler succeeded.
	Reason string
	// Attempt is the attempt's number, 1 on the first delivery (for a
	// crash-loop, the attempts made); 0 when the session ended before the
	// delivery was read (OutcomeAbandoned).
	Attempt int
	// Tier indexes the queue's retry tiers and Delay is the retry's delay
	// (its TTL), when Outcome is OutcomeRetried.
	Tier  int
	Delay time.Duration
	// Err is the failure: the gate's *schemas.ValidationError or the
	// handler's error. nil when the handler succeeded and for a crash-loop
	// (see Reason).
	Err error
	// SettleErr is why the runtime could not settle as decided: the failed
	// retry or quarantine publish (OutcomeRequeued); the failed ack, the
	// reject of what could not be parked, or the requeue after a failed
	// publish, which wraps that publish's error too (OutcomeAckFailed); or
	// why no copy could be published (OutcomeDeadLettered: over the
	// broker's max message size, or over one frame).
	SettleErr error
	// GateError is the schema gate's objection to a message that was
	// delivered anyway because the queue's gate is in report mode; nil
	// otherwise.
	GateError *schemas.ValidationError
}

// Outcome is how a delivery was settled: one of the constants below, each
// the outcome label of dlxbridge_deliveries_total.
type Outcome string

const (
	OutcomeAcked       Outcome = "acked"       // the handler succeeded and the ack was sent
	OutcomeRetried     Outcome = "retried"     // a delayed retry was confirmed, then the original acked
	OutcomeQuarantined Outcome = "quarantined" // the envelope was confirmed, then the original acked
	OutcomeRequeued    Outcome = "requeued"    // a publish failed: the original was rejected with requeue
	OutcomeAckFailed   Outcome = "ack_failed"  // the ack or reject (a requeue too) could not be written (channel gone): the broker will redeliver
	OutcomeAbandoned   Outcome = "abandoned"   // the session ended (drain deadline passed, channel or connection lost) with the message taken up but unsettled (in a handler, awaiting a confirm, or not handled yet): the broker requeues it
	OutcomeReadmitted  Outcome = "readmitted"  // republished to its own work queue (its count may have been carried from upstream), then acked
	// OutcomeDeadLettered: no retry or quarantine copy could be published
	// (the body is over the broker's max message size, or not even the
	// bare envelope fits one frame): the original was rejected without
	// requeue, and the broker dead-letters it, as received, into the
	// quarantine (dlxbridge_dead_lettered_total says why).
	OutcomeDeadLettered Outcome = "dead_lettered"
)

// failure is everything known about a failed delivery when it is settled.
type failure struct {
	verdict    triage.Verdict
	attempts   triage.Attempts
	err        error
	msgType    string
	version    string
	validation *schemas.ValidationError
	// at is when it was decided (the verdict's Now).
	at time.Time
}
