package triage

import (
	"fmt"

	"github.com/dlxbridge/dlxbridge/internal/wireval"
	"github.com/dlxbridge/dlxbridge/wire"
)

// DeliveryInput is what Precheck reads from a delivery.
type DeliveryInput struct {
	// WorkQueue is the queue the message was consumed from.
	WorkQueue string
	// Headers are the delivery's headers (map[string]any(amqp.Table)).
	Headers map[string]any
	// Redelivered is the AMQP redelivered flag. False proves that this
	// queue has not delivered the message before (on every version), so an
	// x-delivery-count on such a delivery is the publisher's. True does not
	// prove the opposite where counts are carried (CarriedCounts).
	Redelivered bool
	// CarriedCounts says the broker may carry a delivery count, and the
	// redelivered flag, from one queue into the next when it dead-letters a
	// message: RabbitMQ 4.x does (seen on 4.0.5: a message rejected by an
	// upstream quorum queue arrives with redelivered=true and
	// x-delivery-count 1); 3.10 does not; 3.13 is treated like 4.x.
	CarriedCounts bool
	// Signed is Signer.Verify's verdict on the bridge's own headers; a
	// signed wire.HeaderReadmitted that matches the message's x-death says the
	// bridge already re-admitted this copy.
	Signed bool
	// IsRetryQueue reports whether queue is one of WorkQueue's retry lanes.
	IsRetryQueue func(queue string) bool
	// Failed is Attempts.Failed: attempts that failed in earlier hops
	// (retries). It only feeds Verdict.Attempt.
	Failed int
}

// Precheck is the crash-loop guard, run before the handler. It counts only
// this queue's deliveries of a message: the broker's x-delivery-count once
// this queue has requeued the message (nack or reject with requeue, or a
// lost channel or connection). The first delivery of a message in the queue
// never counts as a crash, whether it came from a producer, an upstream
// dead-letter exchange or the bridge's retry lane:
//
//   - Redelivered false: a first delivery. An x-delivery-count on it was set
//     by the publisher and is ignored with a note.
//   - Redelivered true, CarriedCounts, and an x-death history that is not
//     just one expiry from one of WorkQueue's retry lanes (the bridge
//     publishes those afresh, so they carry nothing), unless a signed
//     wire.HeaderReadmitted matches that history: the count may be the upstream
//     queue's, and nothing in the headers tells the two apart. If the guard
//     is on, the verdict is ActionReadmit: the runtime republishes the
//     message to WorkQueue (x-death kept, x-delivery-count dropped, a signed
//     wire.HeaderReadmitted added) and acks the original, so the copy's count is
//     the queue's own from its first delivery. Its handler has not run on
//     this delivery.
//   - Otherwise the count is this queue's requeues so far, and at or over
//     CrashLoopDeliveries (when > 0) the delivery is quarantined
//     (ClassCrashLoop): deliveries 1..CrashLoopDeliveries ran the handler,
//     the next one does not. A negative or non-integer count is read as 0
//     with a note.
//
// An x-death entry {WorkQueue, delivery_limit} never quarantines: the work
// queue dead-letters to its quarantine, never back into itself, so on a
// message in the work queue that entry was forged or came with a replay
// that kept its history. It is noted. The broker's delivery limit stays the
// backstop: it counts this queue's requeues only (seen on 3.10.8 and 4.0.5,
// also for messages that arrived with a carried count).
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
	raw, present := in.Headers[wire.HeaderDeliveryCount]
	if present {
		c, res := wireval.Int(raw)
		switch {
		case res == wireval.IntWrongType:
			n.add("%s of type %s ignored: not an integer", wire.HeaderDeliveryCount, wireval.TypeName(raw))
			present = false
		case c < 0:
			n.add("%s=%d ignored: negative", wire.HeaderDeliveryCount, c)
			present = false
		default:
			count = c
		}
	}
	if !in.Redelivered {
		if present {
			n.add("%s=%d ignored: the first delivery in %s (redelivered=false) carries the publisher's value, not the broker's",
				wire.HeaderDeliveryCount, count, short(in.WorkQueue))
		}
		return Verdict{Action: ActionDeliver}
	}
	if count == 0 || p.CrashLoopDeliveries <= 0 {
		return Verdict{Action: ActionDeliver}
	}
	if in.CarriedCounts && len(h.Deaths) > 0 && !fromOwnLane(h, in.IsRetryQueue) && !readmitted(in, h) {
		newest := h.Deaths[0]
		return Verdict{Action: ActionReadmit,
			Reason: fmt.Sprintf("%s=%d may have been carried from %s (x-death {%s, %s}): the broker carries counts across dead-lettering; re-admitting the message so only %s's deliveries count",
				wire.HeaderDeliveryCount, count, short(newest.Queue), short(newest.Queue), short(newest.Reason), short(in.WorkQueue))}
	}
	if count >= int64(p.CrashLoopDeliveries) {
		attempt := max(in.Failed, 0) + int(min(count, maxAttemptsCeiling))
		return Verdict{Action: ActionQuarantine, Class: ClassCrashLoop, Attempt: attempt,
			Reason: fmt.Sprintf("crash-looping: delivered %d times by %s (%s)", addSat(count, 1), short(in.WorkQueue), wire.HeaderDeliveryCount)}
	}
	return Verdict{Action: ActionDeliver}
}

// fromOwnLane reports whether the history is exactly one expiry from one of
// the work queue's retry lanes: the bridge published the message into the
// lane afresh (without x-death), so it carries no count from elsewhere.
func fromOwnLane(h History, isRetry func(string) bool) bool {
	return len(h.Deaths) == 1 && h.Deaths[0].Reason == ReasonExpired && isRetry != nil && isRetry(h.Deaths[0].Queue)
}

// readmitted reports whether the bridge re-admitted this very copy: a signed
// wire.HeaderReadmitted equal to the digest of the x-death it still carries. If
// the broker dead-lettered the copy again since, its x-death changed.
func readmitted(in DeliveryInput, h History) bool {
	if !in.Signed || len(h.Deaths) == 0 {
		return false
	}
	s, ok := wireval.String(in.Headers[wire.HeaderReadmitted])
	return ok && s != "" && s == XDeathDigest(in.Headers)
}
