package triage

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"time"
)

// Policy is a work queue's retry policy.
type Policy struct {
	// Tiers are the retry delays, strictly increasing and > 0: the n-th
	// failed attempt waits Tiers[min(n-1, len(Tiers)-1)]. Required.
	Tiers []time.Duration
	// Lanes is the number of TTL queues per tier carrying the jitter; >= 1.
	Lanes int
	// Jitter spreads a tier delay d over [d, d*(1+Jitter)]; in [0, 1].
	Jitter float64
	// MaxAttempts is the total number of handler attempts, the first
	// included; in [1, maxAttemptsCeiling].
	MaxAttempts int
	// MaxElapsed bounds the time from the first failure to the return of
	// the last retry. 0 disables the time budget.
	MaxElapsed time.Duration
	// CrashLoopDeliveries quarantines a message before the handler runs
	// once this queue has requeued it that many times (its x-delivery-count,
	// read as Precheck says): the handler runs on at most
	// CrashLoopDeliveries deliveries per hop, each with its immediate
	// retries (up to ImmediateRetries+1 calls, whose failures a crash
	// forgets: the redelivery carries the hop's attempt count). 0 disables
	// the check.
	CrashLoopDeliveries int
	// ImmediateRetries is how many times, at most, a failed attempt is
	// retried in process, on the same delivery, before the failure goes to
	// a delayed retry (ActionRetryNow; see Decide). Immediate attempts count
	// toward MaxAttempts like any other. 0 disables immediate retries.
	ImmediateRetries int
}

// Validate reports the first rule the policy breaks (see Problems), naming
// the field.
func (p Policy) Validate() error {
	if probs := p.Problems(); len(probs) > 0 {
		return fmt.Errorf("triage: %w", probs[0])
	}
	return nil
}

// PolicyProblem is one rule a Policy breaks. The config layer reports these
// under its own field paths, so each rule is written here only.
type PolicyProblem struct {
	// Field is the Policy field: "Tiers", "Lanes", "Jitter", "MaxAttempts",
	// "MaxElapsed", "CrashLoopDeliveries" or "ImmediateRetries".
	Field string
	// Index is the tier's index when Field is "Tiers" and one tier is at
	// fault; -1 otherwise.
	Index int
	// Value is the offending value as text; "" when none is (no tiers).
	Value string
	// Rule is what the field must be, e.g. "must be in [0, 1]".
	Rule string
}

func (pp PolicyProblem) Error() string {
	field := "Policy." + pp.Field
	if pp.Index >= 0 {
		field += fmt.Sprintf("[%d]", pp.Index)
	}
	if pp.Value == "" {
		return field + ": " + pp.Rule
	}
	return field + ": " + pp.Value + " " + pp.Rule
}

// Problems lists every rule the policy breaks, in field order; nil when it
// is valid.
func (p Policy) Problems() []PolicyProblem {
	var out []PolicyProblem
	add := func(field string, index int, value any, rule string, args ...any) {
		v := ""
		if value != nil {
			v = fmt.Sprint(value)
		}
		out = append(out, PolicyProblem{Field: field, Index: index, Value: v, Rule: fmt.Sprintf(rule, args...)})
	}
	if len(p.Tiers) == 0 {
		add("Tiers", -1, nil, "at least one delay is required")
	}
	for i, d := range p.Tiers {
		switch {
		case d <= 0:
			add("Tiers", i, d, "must be > 0")
		case i > 0 && d <= p.Tiers[i-1]:
			add("Tiers", i, d, "must be greater than the tier before it (%s)", p.Tiers[i-1])
		}
	}
	if p.Lanes < 1 {
		add("Lanes", -1, p.Lanes, "must be >= 1")
	}
	if !(p.Jitter >= 0 && p.Jitter <= 1) { // also rejects NaN
		add("Jitter", -1, p.Jitter, "must be in [0, 1]")
	}
	if p.MaxAttempts < 1 || p.MaxAttempts > maxAttemptsCeiling {
		add("MaxAttempts", -1, p.MaxAttempts, "must be in [1, %d]", maxAttemptsCeiling)
	}
	if p.MaxElapsed < 0 {
		add("MaxElapsed", -1, p.MaxElapsed, "must be >= 0 (0 disables it)")
	}
	if p.CrashLoopDeliveries < 0 {
		add("CrashLoopDeliveries", -1, p.CrashLoopDeliveries, "must be >= 0 (0 disables it)")
	}
	if p.ImmediateRetries < 0 {
		add("ImmediateRetries", -1, p.ImmediateRetries, "must be >= 0 (0 disables it)")
	}
	return out
}

// Action is what the runtime does with a delivery.
type Action string

const (
	ActionDeliver Action = "deliver" // hand it to the handler
	ActionRetry   Action = "retry"   // republish to a retry lane, then ack
	// ActionRetryNow (Decide only): call the handler again in process, on
	// the same unsettled delivery, as attempt Verdict.Attempt+1.
	ActionRetryNow   Action = "retry-now"
	ActionQuarantine Action = "quarantine" // publish to the quarantine, then ack
	// ActionReadmit (Precheck only): republish to the work queue itself,
	// then ack, so that the copy's delivery count is the queue's own.
	ActionReadmit Action = "readmit"
)

// Verdict is a decision about one delivery.
type Verdict struct {
	Action Action
	Class  Class
	// Attempt is this attempt's number, 1-based (Attempts.Failed+1). From
	// Precheck it is the attempts made when it quarantines (Failed plus this
	// queue's deliveries), else 0.
	Attempt int
	// Tier and Lane index Policy.Tiers and the tier's lanes (ActionRetry).
	Tier, Lane int
	// Delay is the jittered delay (ActionRetry), inside LaneBounds(Tier, Lane).
	Delay time.Duration
	// Reason is for humans: logs and the quarantine envelope.
	Reason string
	// Notes are forged or malformed inputs met on the way.
	Notes []string
}

// Rand is a source of uniform floats in [0, 1); *math/rand/v2.Rand
// satisfies it.
type Rand interface{ Float64() float64 }

// Failure is a failed attempt to decide about.
type Failure struct {
	Class Class
	Hint  time.Duration // from RetryAfter, 0 if none
	// Attempts are the attempts that failed before this one: Failed counts
	// every failed handler attempt of the message, immediate ones of this
	// delivery included, and FirstFailure is when the first of them failed.
	Attempts Attempts
	// ImmediateRetries is how many immediate retries this delivery already
	// had (ActionRetryNow verdicts carried out on it); 0 for the delivery's
	// first attempt. A value >= Policy.ImmediateRetries leaves the delayed
	// retry as the only one: the runtime sets it so when it cannot retry in
	// process.
	ImmediateRetries int
	Now              time.Time
}

// Decide decides what follows a failed attempt:
//
//  1. an invalid policy quarantines ("invalid policy: …"), never retries;
//  2. a class that is not Retryable quarantines after this delivery;
//  3. attempt := Failed+1; attempt >= MaxAttempts quarantines
//     ("attempt budget exhausted (attempt/max)");
//  4. ActionRetryNow (retry in process, no delay) when all of these hold:
//     ImmediateRetries < Policy.ImmediateRetries; the class is transient or
//     timeout (a panic is a bug more often than a blip, and may have left
//     the handler's state half-updated: it waits for a delayed retry); no
//     Hint (a Retry-After asks for a delay); and, with MaxElapsed > 0,
//     Now-first <= MaxElapsed (first as in rule 7). The retry is attempt
//     attempt+1, within MaxAttempts by rule 3;
//  5. tier := min(attempt-1, len(Tiers)-1), or with Hint > 0 the smallest
//     tier with Tiers[tier] >= Hint (a Retry-After rounded up to an
//     available delay, which may be shorter than the backoff schedule), or
//     the largest tier if none is long enough (said in Reason);
//  6. with u := rnd.Float64() in [0, 1), d := Tiers[tier]:
//     Delay = d × (1 + Jitter×u) and Lane = min(⌊u×Lanes⌋, Lanes-1), so
//     Delay lies in the lane's range LaneBounds(d, Jitter, Lanes, Lane) =
//     [d(1+J·lane/L), d(1+J·(lane+1)/L)];
//  7. with first := Attempts.FirstFailure (Now if zero), MaxElapsed > 0 and
//     Now+Delay-first > MaxElapsed quarantines ("time budget exhausted");
//  8. otherwise retry after Delay.
//
// A nil rnd uses math/rand/v2's global source. Decide never panics.
func Decide(p Policy, f Failure, rnd Rand) (v Verdict) {
	failed := f.Attempts.Failed
	var n notes
	switch {
	case failed < 0:
		n.add("Attempts.Failed=%d treated as 0", failed)
		failed = 0
	case failed > maxAttemptsCeiling:
		n.add("Attempts.Failed=%d clamped to %d", failed, maxAttemptsCeiling)
		failed = maxAttemptsCeiling
	}
	v = Verdict{Action: ActionQuarantine, Class: f.Class, Attempt: failed + 1}
	defer func() { v.Notes = n.result() }()
	immediate := f.ImmediateRetries
	if immediate < 0 {
		n.add("Failure.ImmediateRetries=%d treated as 0", immediate)
		immediate = 0
	}

	if err := p.Validate(); err != nil {
		v.Reason = "invalid policy: " + err.Error()
		return v
	}
	if !f.Class.Retryable() {
		v.Reason = finalReason(f.Class)
		return v
	}
	if v.Attempt >= p.MaxAttempts {
		v.Reason = fmt.Sprintf("attempt budget exhausted (%d/%d)", v.Attempt, p.MaxAttempts)
		return v
	}

	first := f.Attempts.FirstFailure
	if first.IsZero() {
		first = f.Now
	}
	elapsed := f.Now.Sub(first)
	if immediate < p.ImmediateRetries && (f.Class == ClassTransient || f.Class == ClassTimeout) &&
		f.Hint <= 0 && (p.MaxElapsed == 0 || elapsed <= p.MaxElapsed) {
		v.Action = ActionRetryNow
		v.Reason = fmt.Sprintf("%s failure: immediate retry %d/%d (attempt %d/%d)",
			f.Class, immediate+1, p.ImmediateRetries, v.Attempt+1, p.MaxAttempts)
		return v
	}

	tier := min(v.Attempt-1, len(p.Tiers)-1)
	var hintNote string
	if f.Hint > 0 {
		tier = len(p.Tiers) - 1
		for i, d := range p.Tiers {
			if d >= f.Hint {
				tier = i
				break
			}
		}
		if p.Tiers[tier] < f.Hint {
			hintNote = fmt.Sprintf("; retry-after %s exceeds the largest tier %s", f.Hint, p.Tiers[tier])
		}
	}
	u := unitFloat(rnd)
	lane := min(int(u*float64(p.Lanes)), p.Lanes-1)
	d := p.Tiers[tier]
	lo, hi := laneBounds(d, p.Jitter, p.Lanes, lane)
	delay := min(max(addDur(d, scale(d, p.Jitter*u)), lo), hi)

	if p.MaxElapsed > 0 {
		if addDur(elapsed, delay) > p.MaxElapsed {
			v.Reason = fmt.Sprintf("time budget exhausted: %s since first failure + %s delay > %s",
				elapsed.Round(time.Millisecond), delay.Round(time.Millisecond), p.MaxElapsed)
			return v
		}
	}
	v.Action, v.Tier, v.Lane, v.Delay = ActionRetry, tier, lane, delay
	v.Reason = retryReason(f.Class, v.Attempt+1, p.MaxAttempts, delay.Round(time.Millisecond), tier, lane, hintNote)
	return v
}

// retryReason is "<class> failure: retry <attempt>/<max> in <delay> (tier
// <tier>, lane <lane>)<note>", written without fmt: every delayed retry
// has one.
func retryReason(c Class, attempt, maxAttempts int, delay time.Duration, tier, lane int, note string) string {
	b := make([]byte, 0, 64+len(c)+len(note))
	b = append(b, c...)
	b = append(b, " failure: retry "...)
	b = strconv.AppendInt(b, int64(attempt), 10)
	b = append(b, '/')
	b = strconv.AppendInt(b, int64(maxAttempts), 10)
	b = append(b, " in "...)
	b = append(b, delay.String()...)
	b = append(b, " (tier "...)
	b = strconv.AppendInt(b, int64(tier), 10)
	b = append(b, ", lane "...)
	b = strconv.AppendInt(b, int64(lane), 10)
	b = append(b, ')')
	b = append(b, note...)
	return string(b)
}

// LaneBounds is lane's share of a tier's jitter window: with L lanes the
// window [d, d(1+J)] is cut into L equal ranges and lane i gets
// [d(1+J·i/L), d(1+J·(i+1)/L)]. Decide's delays lie inside these bounds
// (unrounded; the topology rounds them to whole milliseconds outward).
func LaneBounds(d time.Duration, jitter float64, lanes, lane int) (lo, hi time.Duration) {
	return laneBounds(d, jitter, lanes, lane)
}

func laneBounds(d time.Duration, jitter float64, lanes, lane int) (lo, hi time.Duration) {
	if lanes < 1 || !(jitter >= 0) {
		return d, d
	}
	span := float64(d) * jitter
	lo = addDur(d, scale(1, span*float64(lane)/float64(lanes)))
	hi = addDur(d, scale(1, span*float64(lane+1)/float64(lanes)))
	return lo, hi
}

// scale returns d×f as a Duration, saturating instead of overflowing.
func scale(d time.Duration, f float64) time.Duration {
	x := float64(d) * f
	switch {
	case !(x == x): // NaN
		return 0
	case x >= math.MaxInt64:
		return math.MaxInt64
	case x <= math.MinInt64:
		return math.MinInt64
	}
	return time.Duration(x)
}

// addDur adds durations, saturating.
func addDur(a, b time.Duration) time.Duration {
	switch {
	case b > 0 && a > math.MaxInt64-b:
		return math.MaxInt64
	case b < 0 && a < math.MinInt64-b:
		return math.MinInt64
	}
	return a + b
}

// unitFloat draws u in [0, 1), repairing a misbehaving source.
func unitFloat(rnd Rand) float64 {
	var u float64
	if rnd == nil {
		u = rand.Float64()
	} else {
		u = rnd.Float64()
	}
	switch {
	case !(u >= 0): // negative or NaN
		return 0
	case u >= 1:
		return math.Nextafter(1, 0)
	}
	return u
}

// finalReason is the Reason of a non-retryable class.
func finalReason(c Class) string {
	switch c {
	case ClassPermanent:
		return "permanent failure"
	case ClassSchema:
		return "schema failure"
	case ClassCrashLoop:
		return "crash-looping"
	case ClassExpired, ClassMaxLen, ClassRejected:
		return "dead-lettered by the broker: " + string(c)
	case "":
		return "no failure class"
	}
	return fmt.Sprintf("unknown failure class %q", short(string(c)))
}
