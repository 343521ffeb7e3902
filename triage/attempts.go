package triage

import (
	"time"
)

// Header names the bridge owns. They have no "x-" prefix: x- headers belong
// to the broker.
const (
	// HeaderAttempts is the number of failed attempts so far, an int64 set
	// on every retry publish.
	HeaderAttempts = "dlxbridge-attempts"
	// HeaderFirstFailure is when the first attempt failed: an RFC 3339
	// (nano) UTC string; int64 unix milliseconds are also accepted.
	HeaderFirstFailure = "dlxbridge-first-failure-at"
)

// MaxAttemptsCeiling caps any attempt count read from a message. A larger
// value is forged; it is clamped to the ceiling (with a note), and since
// Policy.MaxAttempts may not exceed the ceiling, a clamped message is
// quarantined rather than retried.
const MaxAttemptsCeiling = 10_000

// MaxClockSkew is how far in the future a first-failure time may lie (hosts'
// clocks differ) before it is treated as forged.
const MaxClockSkew = time.Minute

// AttemptInput is what CountAttempts reads.
type AttemptInput struct {
	// Headers are the delivery's headers (map[string]any(amqp.Table)).
	Headers map[string]any
	// IsRetryQueue reports whether queue is one of the work queue's retry
	// lane queues. nil means none is: only the bridge's header counts.
	IsRetryQueue func(queue string) bool
	// Now is the current time, for the first-failure sanity check. Zero
	// skips the "in the future" check.
	Now time.Time
}

// Attempts is the attempt count of a delivery.
type Attempts struct {
	// Failed is how many attempts already failed before this delivery: 0 on
	// a first delivery, at most MaxAttemptsCeiling.
	Failed int
	// FirstFailure is when the first attempt failed; zero if unknown.
	FirstFailure time.Time
	// FromHeader and FromXDeath are what each source said, after
	// validation and clamping (0 when absent or rejected).
	FromHeader, FromXDeath int
	// Notes list forged or malformed values and what was done with them.
	Notes []string
}

// CountAttempts counts the failed attempts of a delivery, correctly on every
// broker version. The bridge retries by ack + republish to a TTL lane queue
// that dead-letters (reason expired) back to the work queue, and sets
// HeaderAttempts = n on the n-th retry publish. Then:
//
//	Failed = max(header, Σ count of x-death entries {q, expired} with IsRetryQueue(q))
//
// On 3.10–3.12 and 3.13.3+ the broker keeps the republished x-death and
// increments the lane's count, so after n retries the sum is n; on 4.x it
// ignores the client's x-death and each hop shows a fresh entry with count
// 1, so the sum is 1 and the header carries n. Both give n, and taking the
// max means neither source can lower the count below the other.
//
// The dlxbridge runtime itself strips x-death from its retries (a 3.x broker
// silently drops a retry whose client-sent x-death names its work queue), so
// with it the x-death sum is at most 1 and the header is the counter; the
// x-death term is the floor for messages other publishers move through the
// lanes with their history intact.
//
// The header must be a non-negative integer (any integer type, or an
// integral float); a negative or non-integer value is ignored with a note,
// and a value over MaxAttemptsCeiling is clamped to it with a note. The
// x-death sum is clamped the same way.
//
// FirstFailure is the earlier of the header time and the earliest x-death
// time of a retry-lane entry, each used only if it lies in [2000-01-01,
// Now+MaxClockSkew] (otherwise ignored with a note). The x-death time is
// when the first retry expired, so alone it is later than the true first
// failure by about the first tier's delay; on 4.x it is the latest hop's.
func CountAttempts(in AttemptInput) Attempts {
	var n notes
	var a Attempts

	if v, present := in.Headers[HeaderAttempts]; present {
		a.FromHeader = headerAttempts(v, &n)
	}

	h := HistoryOf(in.Headers)
	for _, note := range h.Notes {
		n.add("%s", note)
	}
	isRetry := func(d Death) bool {
		return d.Reason == ReasonExpired && in.IsRetryQueue != nil && in.IsRetryQueue(d.Queue)
	}
	sum := h.CountWhere(isRetry)
	if sum > MaxAttemptsCeiling {
		n.add("x-death retry count %d clamped to %d", sum, MaxAttemptsCeiling)
		sum = MaxAttemptsCeiling
	}
	a.FromXDeath = int(sum)
	a.Failed = max(a.FromHeader, a.FromXDeath)

	var headerTime, deathTime time.Time
	if v, present := in.Headers[HeaderFirstFailure]; present {
		headerTime = saneTime(v, time.Millisecond, HeaderFirstFailure, in.Now, &n)
	}
	for _, d := range h.Deaths {
		if !isRetry(d) || d.Time.IsZero() {
			continue
		}
		t := saneTime(d.Time, time.Second, "x-death time of "+short(d.Queue), in.Now, &n)
		if !t.IsZero() && (deathTime.IsZero() || t.Before(deathTime)) {
			deathTime = t
		}
	}
	switch {
	case headerTime.IsZero():
		a.FirstFailure = deathTime
	case !deathTime.IsZero() && deathTime.Before(headerTime):
		if headerTime.Sub(deathTime) > MaxClockSkew {
			n.add("%s %s is later than x-death %s; using x-death", HeaderFirstFailure,
				headerTime.Format(time.RFC3339), deathTime.Format(time.RFC3339))
		}
		a.FirstFailure = deathTime
	default:
		a.FirstFailure = headerTime
	}
	a.Notes = n.result()
	return a
}

// headerAttempts validates the bridge's attempt header.
func headerAttempts(v any, n *notes) int {
	c, res := asInt(v)
	switch {
	case res == intAbsent:
		return 0
	case res == intWrongType:
		n.add("%s of type %s ignored: not an integer", HeaderAttempts, typeName(v))
		return 0
	case c < 0:
		n.add("%s=%d ignored: negative", HeaderAttempts, c)
		return 0
	case c > MaxAttemptsCeiling:
		n.add("%s=%d clamped to %d (MaxAttemptsCeiling): the message will not be retried", HeaderAttempts, c, MaxAttemptsCeiling)
		return MaxAttemptsCeiling
	}
	return int(c)
}

// saneTime reads a first-failure time and rejects absurd ones with a note.
func saneTime(v any, unit time.Duration, what string, now time.Time, n *notes) time.Time {
	t, ok := asTime(v, unit)
	switch {
	case !ok:
		n.add("%s of type %s ignored: not a time", what, typeName(v))
		return time.Time{}
	case t.Before(minSaneTime):
		n.add("%s %s ignored: before 2000", what, t.Format(time.RFC3339))
		return time.Time{}
	case !now.IsZero() && t.After(now.Add(MaxClockSkew)):
		n.add("%s %s ignored: in the future", what, t.Format(time.RFC3339))
		return time.Time{}
	}
	return t
}
