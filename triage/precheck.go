package triage

import "fmt"

// DeliveryInput is what Precheck reads from a delivery.
type DeliveryInput struct {
	// WorkQueue is the queue the message was consumed from.
	WorkQueue string
	// Headers are the delivery's headers (map[string]any(amqp.Table)).
	Headers map[string]any
	// Redelivered is the AMQP redelivered flag. False proves that this
	// queue has not delivered the message before, so an x-delivery-count on
	// such a delivery is the publisher's.
	Redelivered bool
	// Failed is Attempts.Failed: attempts that failed in earlier hops
	// (retries). It only feeds Verdict.Attempt.
	Failed int
}

// Precheck is the crash-loop guard, run before the handler. It quarantines
// (ClassCrashLoop) a redelivery whose x-delivery-count (this queue's
// requeues so far) is at or over CrashLoopDeliveries (when > 0):
// deliveries 1..CrashLoopDeliveries ran the handler, the next one does not.
// A negative or non-integer count is read as 0 with a note.
//
// Headers a producer set never skip the handler:
//
//   - on a first delivery (Redelivered false) an x-delivery-count is the
//     publisher's: ignored with a note;
//   - an x-death entry {WorkQueue, delivery_limit} never quarantines: the
//     work queue dead-letters to its quarantine, never back into itself, so
//     on a message in the work queue that entry was forged or came with a
//     replay that kept its history. It is noted. The broker's delivery
//     limit stays the backstop.
//
// On quarantine, Verdict.Attempt is the attempts made: Failed plus this
// hop's deliveries that never settled (each crashed or hung a worker).
func Precheck(p Policy, in DeliveryInput) (v Verdict) {
	var n notes
	defer func() { v.Notes = n.result() }()

	h := HistoryOf(in.Headers)
	for _, note := range h.Notes {
		n.add("%s", note)
	}
	if d, ok := h.Find(in.WorkQueue, ReasonDeliveryLimit); ok {
		n.add("x-death {%s, delivery_limit} (count %d) ignored: %s dead-letters to its quarantine, never back into itself, so the entry is forged or was replayed with the message",
			short(in.WorkQueue), d.Count, short(in.WorkQueue))
	}
	var count int64
	raw, present := in.Headers[HeaderDeliveryCount]
	if present {
		c, res := asInt(raw)
		switch {
		case res == intWrongType:
			n.add("%s of type %s ignored: not an integer", HeaderDeliveryCount, typeName(raw))
			present = false
		case c < 0:
			n.add("%s=%d ignored: negative", HeaderDeliveryCount, c)
			present = false
		default:
			count = c
		}
	}
	if !in.Redelivered {
		if present {
			n.add("%s=%d ignored: the first delivery in %s (redelivered=false) carries the publisher's value, not the broker's",
				HeaderDeliveryCount, count, short(in.WorkQueue))
		}
		return Verdict{Action: ActionDeliver}
	}
	if p.CrashLoopDeliveries > 0 && count >= int64(p.CrashLoopDeliveries) {
		attempt := max(in.Failed, 0) + int(min(count, MaxAttemptsCeiling))
		return Verdict{Action: ActionQuarantine, Class: ClassCrashLoop, Attempt: attempt,
			Reason: fmt.Sprintf("crash-looping: delivered %d times by %s (%s)", addSat(count, 1), short(in.WorkQueue), HeaderDeliveryCount)}
	}
	return Verdict{Action: ActionDeliver}
}
