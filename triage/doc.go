// Package triage is dlxbridge's pure decision logic: it reads a delivery's
// headers and a handler's outcome and says deliver, retry (after which
// delay, on which lane) or quarantine. It imports only the standard
// library, so everything here is table-tested and fuzzed without a broker.
//
// # Headers are untrusted
//
// x-death, x-delivery-count and the bridge's own headers come from the wire
// and may be malformed or forged: a producer can set any of them, and the
// broker passes them on. ParseXDeath and CountAttempts accept any integer or
// table type (amqp.Table is a named map type; it is read by reflection,
// never by importing the client), never panic, clamp what is out of range
// and record every correction in Notes. Entries are looked up by
// {queue, reason}, never by position. A value decides only where the broker
// or the bridge vouches for it:
//
//   - the bridge's retry headers (wire.HeaderAttempts, wire.HeaderFirstFailureAt, and
//     whatever else the runtime signs) count only with a valid
//     wire.HeaderSignature: HMAC-SHA256 under the consumers' shared key, bound to
//     the work queue, the message id and a hash of the body (Signer);
//   - x-delivery-count counts only on a redelivery (redelivered=true), and
//     where the broker may carry counts across dead-lettering (4.x), only
//     once the bridge has re-admitted the message (Precheck);
//   - x-death never counts attempts, and an entry {work queue,
//     delivery_limit} on a message in that work queue is forged or stale.
//
// Everything ignored is noted, and the runtime carries the notes (signed)
// through retries into the quarantine envelope.
//
// # Counting attempts on every broker version
//
// The bridge retries by ack + republish to a TTL lane queue
// (Q.retry.<delay>.l<n>) that dead-letters with reason expired back to Q,
// and stamps every retry publish with wire.HeaderAttempts = n (failed attempts so
// far) and wire.HeaderFirstFailureAt, signed. CountAttempts reads them:
//
//	Failed = signed wire.HeaderAttempts, else 0
//
// The broker's x-death can't be the counter: 3.10–3.12 and 3.13.3+ keep and
// increment a client's x-death (so a forged count grows), 4.x replaces it
// with fresh history on every hop. The signed header is the same on every
// version.
//
// # Classes and decisions
//
// Classify maps a handler error to a Class (Permanent, Schema, RetryAfter,
// *PanicError and context.DeadlineExceeded are found through wrapping);
// ClassifyDeadLetter labels what the broker dead-lettered itself. Precheck
// is the crash-loop guard before the handler (it counts only the work
// queue's own deliveries); Decide applies a Policy after a failure:
//
//	attempt = Failed + 1; quarantine if attempt >= MaxAttempts
//	tier    = min(attempt-1, len(Tiers)-1)        (or the smallest tier >= a RetryAfter hint)
//	Delay   = Tiers[tier] × (1 + Jitter×u),  u uniform in [0, 1)
//	Lane    = min(⌊u×Lanes⌋, Lanes-1)             (Delay lies inside LaneBounds of that lane)
//	quarantine if MaxElapsed > 0 and Now + Delay − FirstFailure > MaxElapsed
//
// Fingerprint groups failures by class, normalized message, type and
// version.
//
// # Breaker
//
// A Breaker is a queue's circuit breaker (closed, open, half-open), with
// the clock passed in and the jitter injected: Admit(now) says deliver,
// probe, pause until t, or hold; Record(now, ticket, outcome) returns the
// Transition an outcome caused. It trips on a run of transient or timeout
// failures, a failure ratio over a window, or a DependencyDown signal.
// docs/breaker.md describes it and what the runtime does with its verdicts.
package triage
