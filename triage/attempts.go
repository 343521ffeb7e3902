package triage

import (
	"time"

	"github.com/dlxbridge/dlxbridge/internal/wireval"
	"github.com/dlxbridge/dlxbridge/wire"
)

// maxAttemptsCeiling caps any attempt count read from a message. A larger
// value is forged; it is clamped to the ceiling (with a note), and since
// Policy.MaxAttempts may not exceed the ceiling, a clamped message is
// quarantined rather than retried.
const maxAttemptsCeiling = 10_000

// maxClockSkew is how far in the future a first-failure time may lie (hosts'
// clocks differ) before it is treated as forged.
const maxClockSkew = time.Minute

// AttemptInput is what CountAttempts reads.
type AttemptInput struct {
	// Headers are the delivery's headers (map[string]any(amqp.Table)).
	Headers map[string]any
	// Signature is Signer.Verify's verdict on the bridge's own headers.
	// Only a valid signature makes wire.HeaderAttempts and wire.HeaderFirstFailureAt
	// count; otherwise they were set (or altered) by someone else and are
	// ignored with a note.
	Signature Verification
	// IsRetryQueue reports whether queue is one of the work queue's retry
	// lane queues; nil means none is. It only shapes notes: x-death never
	// counts attempts.
	IsRetryQueue func(queue string) bool
	// Now is the current time, for the first-failure sanity check. Zero
	// skips the "in the future" check.
	Now time.Time
}

// Attempts is the attempt count of a delivery.
type Attempts struct {
	// Failed is how many attempts already failed before this delivery: 0 on
	// a first delivery, at most maxAttemptsCeiling.
	Failed int
	// FirstFailure is when the first attempt failed; zero if unknown.
	FirstFailure time.Time
	// FromHeader is what the signed wire.HeaderAttempts said, after validation
	// and clamping (0 when absent, unsigned or rejected).
	FromHeader int
	// Signed reports that the bridge's own headers carried a valid
	// signature (AttemptInput.Signature), so its other headers (where the
	// message came from, earlier notes) may be trusted too.
	Signed bool
	// Notes list forged or malformed values and what was done with them.
	Notes []string
}

// CountAttempts counts the failed attempts of a delivery. The bridge
// retries by ack + republish to a TTL lane queue that dead-letters (reason
// expired) back to the work queue, and stamps the n-th retry with
// wire.HeaderAttempts = n and wire.HeaderFirstFailureAt, signed with wire.HeaderSignature
// (Signer). Only those signed values count:
//
//	Failed = wire.HeaderAttempts if the signature is valid, else 0
//
// A producer can set any header, x-death included, and the broker keeps a
// client's x-death (3.10–3.12, 3.13.3+: it even increments a forged count),
// so neither an unsigned bridge header nor an x-death count can prove that
// a message failed before: they are ignored with a note, and the message
// gets its full retry budget, as if they were absent. The cost of that rule
// is that a restart with a new key resets the budget of retries in flight
// (see the consumer's signing key).
//
// The signed header must still be a non-negative integer (any integer type,
// or an integral float); a negative or non-integer value is ignored with a
// note, and a value over maxAttemptsCeiling is clamped to it with a note.
// FirstFailure is the signed wire.HeaderFirstFailureAt, used only if it lies in
// [2000-01-01, Now+maxClockSkew].
func CountAttempts(in AttemptInput) Attempts {
	var n notes
	a := Attempts{Signed: in.Signature.Valid}

	h := HistoryOf(in.Headers)
	for _, note := range h.Notes {
		n.add("%s", note)
	}
	for _, d := range h.Deaths {
		if d.Reason != ReasonExpired || in.IsRetryQueue == nil || !in.IsRetryQueue(d.Queue) {
			continue
		}
		if !a.Signed || d.Count != 1 {
			n.add("x-death {%s, expired} count %d not counted: only the bridge's signed %s counts attempts", short(d.Queue), d.Count, wire.HeaderAttempts)
		}
	}

	rawAttempts, hasAttempts := in.Headers[wire.HeaderAttempts]
	rawFirst, hasFirst := in.Headers[wire.HeaderFirstFailureAt]
	if !a.Signed {
		why := in.Signature.Problem
		if why == "" {
			why = "no valid " + wire.HeaderSignature
		}
		if hasAttempts {
			n.add("%s=%s ignored: %s", wire.HeaderAttempts, shortValue(rawAttempts), why)
		}
		if hasFirst {
			n.add("%s=%s ignored: %s", wire.HeaderFirstFailureAt, shortValue(rawFirst), why)
		}
		a.Notes = n.result()
		return a
	}
	if hasAttempts {
		a.FromHeader = headerAttempts(rawAttempts, &n)
	}
	a.Failed = a.FromHeader
	if hasFirst {
		a.FirstFailure = saneTime(rawFirst, time.Millisecond, wire.HeaderFirstFailureAt, in.Now, &n)
	}
	a.Notes = n.result()
	return a
}

// headerAttempts validates the bridge's attempt header.
func headerAttempts(v any, n *notes) int {
	c, res := wireval.Int(v)
	switch {
	case res == wireval.IntAbsent:
		return 0
	case res == wireval.IntWrongType:
		n.add("%s of type %s ignored: not an integer", wire.HeaderAttempts, wireval.TypeName(v))
		return 0
	case c < 0:
		n.add("%s=%d ignored: negative", wire.HeaderAttempts, c)
		return 0
	case c > maxAttemptsCeiling:
		n.add("%s=%d clamped to %d (maxAttemptsCeiling): the message will not be retried", wire.HeaderAttempts, c, maxAttemptsCeiling)
		return maxAttemptsCeiling
	}
	return int(c)
}

// saneTime reads a first-failure time and rejects absurd ones with a note.
func saneTime(v any, unit time.Duration, what string, now time.Time, n *notes) time.Time {
	t, ok := wireval.Time(v, unit)
	switch {
	case !ok:
		n.add("%s of type %s ignored: not a time", what, wireval.TypeName(v))
		return time.Time{}
	case t.Before(minSaneTime):
		n.add("%s %s ignored: before 2000", what, t.Format(time.RFC3339))
		return time.Time{}
	case !now.IsZero() && t.After(now.Add(maxClockSkew)):
		n.add("%s %s ignored: in the future", what, t.Format(time.RFC3339))
		return time.Time{}
	}
	return t
}
