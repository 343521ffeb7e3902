package triage

import "fmt"

// DeliveryInput is what Precheck reads from a delivery.
type DeliveryInput struct {
	// WorkQueue is the queue the message was consumed from.
	WorkQueue string
	// Headers are the delivery's headers (map[string]any(amqp.Table)).
	Headers map[string]any
	// Redelivered is the AMQP redelivered flag. It is informational: it
	// says "at least twice", not how often, so it never trips the guard.
	Redelivered bool
	// Failed is Attempts.Failed: attempts that failed in earlier hops
	// (retries). It only feeds Verdict.Attempt.
	Failed int
}

// Precheck is the crash-loop guard, run before the handler. It quarantines
// (ClassCrashLoop) a delivery that
//
//   - carries an x-death entry {WorkQueue, delivery_limit}: the broker has
//     flagged it as having crash-looped consumers of this queue (an entry
//     for another queue does not count), or
//   - has x-delivery-count >= CrashLoopDeliveries (when > 0). The count is
//     the number of requeues so far (absent on the first delivery), so the
//     delivery is number count+1. A negative or non-integer count is read
//     as 0 with a note.
//
// Otherwise it returns ActionDeliver. On quarantine, Verdict.Attempt is the
// attempts made: Failed plus this hop's deliveries that never settled (each
// crashed or hung a worker), at least Failed+1. A message replayed from a quarantine must have its
// x-death removed, or the first rule quarantines it again.
func Precheck(p Policy, in DeliveryInput) (v Verdict) {
	var n notes
	defer func() { v.Notes = n.result() }()

	h := HistoryOf(in.Headers)
	for _, note := range h.Notes {
		n.add("%s", note)
	}
	var count int64
	if raw, present := in.Headers[HeaderDeliveryCount]; present {
		c, res := asInt(raw)
		switch {
		case res == intWrongType:
			n.add("%s of type %s ignored: not an integer", HeaderDeliveryCount, typeName(raw))
		case c < 0:
			n.add("%s=%d ignored: negative", HeaderDeliveryCount, c)
		default:
			count = c
		}
	}
	attempt := max(in.Failed, 0) + int(min(max(count, 1), MaxAttemptsCeiling))
	if d, ok := h.Find(in.WorkQueue, ReasonDeliveryLimit); ok {
		return Verdict{Action: ActionQuarantine, Class: ClassCrashLoop, Attempt: attempt,
			Reason: fmt.Sprintf("crash-looping: the broker dead-lettered it from %s with delivery_limit (count %d)", short(in.WorkQueue), d.Count)}
	}
	if p.CrashLoopDeliveries > 0 && count >= int64(p.CrashLoopDeliveries) {
		delivered := addSat(count, 1)
		return Verdict{Action: ActionQuarantine, Class: ClassCrashLoop, Attempt: attempt,
			Reason: fmt.Sprintf("crash-looping: delivered %d times (%s)", delivered, HeaderDeliveryCount)}
	}
	return Verdict{Action: ActionDeliver}
}
