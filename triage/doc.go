// Package triage is dlxbridge's pure decision logic: it reads a delivery's
// headers and a handler's outcome and says deliver, retry (after which
// delay, on which lane) or quarantine. It imports only the standard
// library, so everything here is table-tested and fuzzed without a broker.
//
// # Headers are untrusted
//
// x-death, x-delivery-count and the bridge's own headers come from the wire
// and may be malformed or forged. ParseXDeath and CountAttempts accept any
// integer or table type (amqp.Table is a named map type; it is read by
// reflection, never by importing the client), never panic, clamp what is
// out of range and record every correction in Notes. Entries are looked up
// by {queue, reason}, never by position.
//
// # Counting attempts on every broker version
//
// The bridge retries by ack + republish to a TTL lane queue
// (Q.retry.<delay>.l<n>) that dead-letters with reason expired back to Q,
// and stamps every retry publish with HeaderAttempts = n (failed attempts so
// far). CountAttempts combines the two sources:
//
//	Failed = max(HeaderAttempts, Σ x-death count of {lane queue, expired} entries)
//
// On 3.10–3.12 and 3.13.3+ the broker keeps the republished x-death and
// increments the lane entry's count: after n retries the sum is n. On 4.x
// it ignores the client's x-death, each hop shows fresh history (count 1),
// and the header carries n. Either way Failed = n. Each source is clamped to
// MaxAttemptsCeiling; an invalid header (negative, not an integer) is
// ignored; neither can lower the count below the other; a forged huge value
// exhausts the budget rather than buying retries.
//
// # Classes and decisions
//
// Classify maps a handler error to a Class (Permanent, Schema, RetryAfter,
// *PanicError and context.DeadlineExceeded are found through wrapping);
// ClassifyDeadLetter labels what the broker dead-lettered itself. Precheck
// is the crash-loop guard before the handler; Decide applies a Policy after
// a failure:
//
//	attempt = Failed + 1; quarantine if attempt >= MaxAttempts
//	tier    = min(attempt-1, len(Tiers)-1)        (or the smallest tier >= a RetryAfter hint)
//	Delay   = Tiers[tier] × (1 + Jitter×u),  u uniform in [0, 1)
//	Lane    = min(⌊u×Lanes⌋, Lanes-1)             (Delay lies inside LaneBounds of that lane)
//	quarantine if MaxElapsed > 0 and Now + Delay − FirstFailure > MaxElapsed
//
// Fingerprint groups failures by class, normalized message, type and
// version.
package triage
