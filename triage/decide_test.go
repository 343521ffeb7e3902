package triage

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/dlxbridge/dlxbridge/wire"
)

var defaultPolicy = Policy{
	Tiers:       []time.Duration{time.Second, 5 * time.Second, 30 * time.Second, 2 * time.Minute},
	Lanes:       4,
	Jitter:      0.2,
	MaxAttempts: 5,
	MaxElapsed:  15 * time.Minute,

	CrashLoopDeliveries: 3,
}

func failure(class Class, failed int) Failure {
	return Failure{Class: class, Attempts: Attempts{Failed: failed, FirstFailure: t0}, Now: t0.Add(time.Minute)}
}

func TestDecide(t *testing.T) {
	t.Parallel()

	p := defaultPolicy
	tests := []struct {
		name   string
		p      Policy
		f      Failure
		u      float64
		action Action
		tier   int
		lane   int
		delay  time.Duration
		reason string
	}{
		{name: "first failure, transient", p: p, f: failure(ClassTransient, 0), u: 0, action: ActionRetry, tier: 0, lane: 0, delay: time.Second, reason: "transient failure: retry 2/5 in 1s (tier 0, lane 0)"},
		{name: "second failure uses tier 1", p: p, f: failure(ClassTransient, 1), u: 0.5, action: ActionRetry, tier: 1, lane: 2, delay: 5500 * time.Millisecond},
		{name: "timeout retried", p: p, f: failure(ClassTimeout, 2), u: 0.99, action: ActionRetry, tier: 2, lane: 3, delay: time.Duration(30e9 * (1 + 0.2*0.99))},
		{name: "panic retried", p: p, f: failure(ClassPanic, 3), u: 0.25, action: ActionRetry, tier: 3, lane: 1, delay: 126 * time.Second},
		{name: "budget exhausted: attempt == max", p: p, f: failure(ClassTransient, 4), action: ActionQuarantine, reason: "attempt budget exhausted (5/5)"},
		{name: "budget over-exhausted", p: p, f: failure(ClassTransient, 40), action: ActionQuarantine, reason: "attempt budget exhausted (41/5)"},
		{name: "MaxAttempts 1: never retried", p: withMax(p, 1), f: failure(ClassTransient, 0), action: ActionQuarantine, reason: "attempt budget exhausted (1/1)"},
		{name: "permanent on first delivery", p: p, f: failure(ClassPermanent, 0), action: ActionQuarantine, reason: "permanent failure"},
		{name: "schema on first delivery", p: p, f: failure(ClassSchema, 0), action: ActionQuarantine, reason: "schema failure"},
		{name: "crash-loop", p: p, f: failure(ClassCrashLoop, 0), action: ActionQuarantine, reason: "crash-looping"},
		{name: "broker expired", p: p, f: failure(ClassExpired, 0), action: ActionQuarantine, reason: "dead-lettered by the broker: expired"},
		{name: "unknown class", p: p, f: failure("weird", 0), action: ActionQuarantine, reason: `unknown failure class "weird"`},
		{name: "empty class", p: p, f: failure("", 0), action: ActionQuarantine, reason: "no failure class"},
		{
			name: "time budget: elapsed + delay over MaxElapsed", p: p,
			f:      Failure{Class: ClassTransient, Attempts: Attempts{Failed: 3, FirstFailure: t0}, Now: t0.Add(13*time.Minute + 30*time.Second)},
			action: ActionQuarantine, reason: "time budget exhausted: 13m30s since first failure + 2m0s delay > 15m0s",
		},
		{
			name: "time budget: fits exactly", p: p,
			f:      Failure{Class: ClassTransient, Attempts: Attempts{Failed: 3, FirstFailure: t0}, Now: t0.Add(13 * time.Minute)},
			action: ActionRetry, tier: 3, delay: 2 * time.Minute,
		},
		{
			name: "time budget measured from Now on a first failure", p: withElapsed(p, 500*time.Millisecond),
			f:      Failure{Class: ClassTransient, Now: t0},
			action: ActionQuarantine, reason: "time budget exhausted: 0s since first failure + 1s delay > 500ms",
		},
		{
			name: "no time budget", p: withElapsed(p, 0),
			f:      Failure{Class: ClassTransient, Attempts: Attempts{Failed: 3, FirstFailure: t0}, Now: t0.Add(1000 * time.Hour)},
			action: ActionRetry, tier: 3, delay: 2 * time.Minute,
		},
		{name: "Retry-After rounds up to a tier", p: p, f: withHint(failure(ClassTransient, 0), 3*time.Second), action: ActionRetry, tier: 1, delay: 5 * time.Second},
		{name: "Retry-After equal to a tier", p: p, f: withHint(failure(ClassTransient, 0), 30*time.Second), action: ActionRetry, tier: 2, delay: 30 * time.Second},
		{name: "Retry-After shorter than the backoff", p: p, f: withHint(failure(ClassTransient, 3), 200*time.Millisecond), action: ActionRetry, tier: 0, delay: time.Second},
		{name: "Retry-After beyond the largest tier", p: p, f: withHint(failure(ClassTransient, 0), time.Hour), action: ActionRetry, tier: 3, delay: 2 * time.Minute, reason: "retry-after 1h0m0s exceeds the largest tier 2m0s"},
		{name: "Retry-After on a timeout", p: p, f: withHint(failure(ClassTimeout, 0), 4*time.Second), action: ActionRetry, tier: 1, delay: 5 * time.Second},
		{name: "negative Failed treated as 0", p: p, f: failure(ClassTransient, -7), action: ActionRetry, tier: 0, delay: time.Second},
		{name: "zero policy", p: Policy{}, f: failure(ClassTransient, 0), action: ActionQuarantine, reason: "invalid policy: triage: Policy.Tiers"},
		{name: "negative lanes", p: withLanes(p, -1), f: failure(ClassTransient, 0), action: ActionQuarantine, reason: "invalid policy: triage: Policy.Lanes"},
		{name: "MaxAttempts over ceiling", p: withMax(p, maxAttemptsCeiling+1), f: failure(ClassTransient, 0), action: ActionQuarantine, reason: "invalid policy: triage: Policy.MaxAttempts"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			v := Decide(tt.p, tt.f, fixedRand(tt.u))
			if v.Action != tt.action {
				t.Fatalf("Action = %s (%s), want %s", v.Action, v.Reason, tt.action)
			}
			if v.Class != tt.f.Class {
				t.Errorf("Class = %q, want %q", v.Class, tt.f.Class)
			}
			if want := max(tt.f.Attempts.Failed, 0) + 1; v.Attempt != want {
				t.Errorf("Attempt = %d, want %d", v.Attempt, want)
			}
			if tt.reason != "" && !strings.Contains(v.Reason, tt.reason) {
				t.Errorf("Reason = %q, want it to contain %q", v.Reason, tt.reason)
			}
			if tt.action != ActionRetry {
				return
			}
			if v.Tier != tt.tier || v.Lane != tt.lane || v.Delay != tt.delay {
				t.Errorf("Tier/Lane/Delay = %d/%d/%s, want %d/%d/%s", v.Tier, v.Lane, v.Delay, tt.tier, tt.lane, tt.delay)
			}
		})
	}
}

// Immediate retries: in process, before the delayed ones, inside both
// budgets, only for transient and timeout failures without a Retry-After.
func TestDecideImmediate(t *testing.T) {
	t.Parallel()

	p := withImmediate(defaultPolicy, 2)
	now := func(f Failure, n int) Failure { f.ImmediateRetries = n; return f }
	tests := []struct {
		name   string
		p      Policy
		f      Failure
		action Action
		reason string
	}{
		{name: "off by default", p: defaultPolicy, f: failure(ClassTransient, 0), action: ActionRetry},
		{name: "first failure retried now", p: p, f: failure(ClassTransient, 0), action: ActionRetryNow, reason: "transient failure: immediate retry 1/2 (attempt 2/5)"},
		{name: "second immediate retry", p: p, f: now(failure(ClassTransient, 1), 1), action: ActionRetryNow, reason: "transient failure: immediate retry 2/2 (attempt 3/5)"},
		{name: "immediate retries spent: delayed", p: p, f: now(failure(ClassTransient, 2), 2), action: ActionRetry, reason: "retry 4/5"},
		{name: "more than spent: delayed", p: p, f: now(failure(ClassTransient, 2), 7), action: ActionRetry},
		{name: "a later delivery gets its own", p: p, f: failure(ClassTransient, 2), action: ActionRetryNow, reason: "attempt 4/5"},
		{name: "negative count treated as 0", p: p, f: now(failure(ClassTransient, 0), -3), action: ActionRetryNow},
		{name: "timeout retried now", p: p, f: failure(ClassTimeout, 0), action: ActionRetryNow, reason: "timeout failure: immediate retry"},
		{name: "panic waits for a delay", p: p, f: failure(ClassPanic, 0), action: ActionRetry},
		{name: "Retry-After waits for a delay", p: p, f: withHint(failure(ClassTransient, 0), 3*time.Second), action: ActionRetry},
		{name: "permanent never", p: p, f: failure(ClassPermanent, 0), action: ActionQuarantine, reason: "permanent failure"},
		{name: "schema never", p: p, f: failure(ClassSchema, 0), action: ActionQuarantine},
		{name: "crash-loop never", p: p, f: failure(ClassCrashLoop, 0), action: ActionQuarantine},
		{name: "attempt budget: last attempt failed", p: p, f: failure(ClassTransient, 4), action: ActionQuarantine, reason: "attempt budget exhausted (5/5)"},
		{name: "attempt budget: MaxAttempts 1", p: withMax(p, 1), f: failure(ClassTransient, 0), action: ActionQuarantine, reason: "attempt budget exhausted (1/1)"},
		{name: "attempt budget: the immediate retry is the last attempt", p: withMax(p, 2), f: failure(ClassTransient, 0), action: ActionRetryNow, reason: "attempt 2/2"},
		{
			name: "time budget spent", p: withElapsed(p, time.Minute),
			f:      Failure{Class: ClassTransient, Attempts: Attempts{Failed: 1, FirstFailure: t0}, Now: t0.Add(time.Minute + time.Millisecond)},
			action: ActionQuarantine, reason: "time budget exhausted",
		},
		{
			name: "time budget reached exactly", p: withElapsed(p, time.Minute),
			f:      Failure{Class: ClassTransient, Attempts: Attempts{Failed: 1, FirstFailure: t0}, Now: t0.Add(time.Minute)},
			action: ActionRetryNow,
		},
		{
			name: "a time budget shorter than every tier still retries now", p: withElapsed(p, 500*time.Millisecond),
			f:      Failure{Class: ClassTransient, Now: t0},
			action: ActionRetryNow,
		},
		{name: "invalid policy", p: withImmediate(p, -1), f: failure(ClassTransient, 0), action: ActionQuarantine, reason: "invalid policy: triage: Policy.ImmediateRetries"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			v := Decide(tt.p, tt.f, fixedRand(0.5))
			if v.Action != tt.action {
				t.Fatalf("Action = %s (%s), want %s", v.Action, v.Reason, tt.action)
			}
			if want := max(tt.f.Attempts.Failed, 0) + 1; v.Attempt != want || v.Class != tt.f.Class {
				t.Errorf("Attempt, Class = %d, %q, want %d, %q", v.Attempt, v.Class, want, tt.f.Class)
			}
			if tt.reason != "" && !strings.Contains(v.Reason, tt.reason) {
				t.Errorf("Reason = %q, want it to contain %q", v.Reason, tt.reason)
			}
			if v.Action == ActionRetryNow && (v.Tier != 0 || v.Lane != 0 || v.Delay != 0) {
				t.Errorf("an immediate retry with a tier, lane or delay: %+v", v)
			}
		})
	}
}

// Across a message's life, immediate and delayed retries together run the
// handler exactly MaxAttempts times: with 2 immediate retries and 5
// attempts, 3 attempts on the first delivery, then 2 on the next (one
// delayed retry, one immediate), then quarantine.
func TestDecideImmediateThenDelayedKeepsTheBudget(t *testing.T) {
	t.Parallel()

	p := withImmediate(withElapsed(defaultPolicy, 0), 2)
	failed, deliveries, calls := 0, 0, 0
	var last Verdict
	for deliveries < 10 {
		deliveries++
		for immediate := 0; ; immediate++ {
			calls++ // the handler runs and fails
			last = Decide(p, Failure{Class: ClassTransient, Attempts: Attempts{Failed: failed, FirstFailure: t0}, ImmediateRetries: immediate, Now: t0}, nil)
			failed++
			if last.Action != ActionRetryNow {
				break
			}
		}
		if last.Action != ActionRetry {
			break
		}
		if last.Attempt != failed {
			t.Fatalf("a delayed retry carries attempt %d after %d failed", last.Attempt, failed)
		}
	}
	if calls != p.MaxAttempts || deliveries != 2 || last.Action != ActionQuarantine || last.Attempt != p.MaxAttempts {
		t.Errorf("%d handler calls over %d deliveries, last %s at attempt %d; want %d calls over 2, quarantine at %d",
			calls, deliveries, last.Action, last.Attempt, p.MaxAttempts, p.MaxAttempts)
	}
}

func withImmediate(p Policy, n int) Policy { p.ImmediateRetries = n; return p }

func withMax(p Policy, n int) Policy               { p.MaxAttempts = n; return p }
func withLanes(p Policy, n int) Policy             { p.Lanes = n; return p }
func withElapsed(p Policy, d time.Duration) Policy { p.MaxElapsed = d; return p }
func withHint(f Failure, d time.Duration) Failure  { f.Hint = d; return f }

// A transient failure that later succeeds: the runtime delivers, the
// handler fails twice and succeeds on attempt 3 after growing delays.
func TestDecideTransientThenSuccess(t *testing.T) {
	t.Parallel()

	rnd := rand.New(rand.NewPCG(3, 4))
	h := table{}
	now := t0
	var delays []time.Duration
	for attempt := 1; attempt <= 3; attempt++ {
		if v := Precheck(defaultPolicy, DeliveryInput{WorkQueue: workQueue, Headers: h}); v.Action != ActionDeliver {
			t.Fatalf("attempt %d: Precheck = %+v", attempt, v)
		}
		a := CountAttempts(AttemptInput{Headers: h, Signature: verify(h), IsRetryQueue: isLane, Now: now})
		if a.Failed != attempt-1 {
			t.Fatalf("attempt %d: Failed = %d", attempt, a.Failed)
		}
		if attempt == 3 {
			break // the handler succeeds
		}
		v := Decide(defaultPolicy, Failure{Class: ClassTransient, Attempts: a, Now: now}, rnd)
		if v.Action != ActionRetry || v.Attempt != attempt {
			t.Fatalf("attempt %d: %+v", attempt, v)
		}
		delays = append(delays, v.Delay)
		h = retryPublish(h, v.Attempt, now, true)
		now = now.Add(v.Delay)
		h = shape4x.deadLetter(h, laneQueue(defaultPolicy.Tiers[v.Tier], v.Lane), ReasonExpired, now)
	}
	if len(delays) != 2 || delays[1] <= delays[0] {
		t.Errorf("delays %v do not grow", delays)
	}
}

func TestPolicyValidate(t *testing.T) {
	t.Parallel()

	if err := defaultPolicy.Validate(); err != nil {
		t.Fatalf("default policy: %v", err)
	}
	tests := []struct {
		name string
		mod  func(*Policy)
		want string
	}{
		{"no tiers", func(p *Policy) { p.Tiers = nil }, "Policy.Tiers: at least one delay"},
		{"zero tier", func(p *Policy) { p.Tiers = []time.Duration{0} }, "Policy.Tiers[0]: 0s must be > 0"},
		{"decreasing tiers", func(p *Policy) { p.Tiers = []time.Duration{time.Second, time.Second} }, "Policy.Tiers[1]: 1s must be greater than the tier before it (1s)"},
		{"zero lanes", func(p *Policy) { p.Lanes = 0 }, "Policy.Lanes: 0 must be >= 1"},
		{"negative jitter", func(p *Policy) { p.Jitter = -0.1 }, "Policy.Jitter"},
		{"NaN jitter", func(p *Policy) { p.Jitter = math.NaN() }, "Policy.Jitter"},
		{"jitter over 1", func(p *Policy) { p.Jitter = 1.5 }, "Policy.Jitter"},
		{"zero attempts", func(p *Policy) { p.MaxAttempts = 0 }, "Policy.MaxAttempts: 0 must be in [1, 10000]"},
		{"negative elapsed", func(p *Policy) { p.MaxElapsed = -1 }, "Policy.MaxElapsed"},
		{"negative crash loop", func(p *Policy) { p.CrashLoopDeliveries = -1 }, "Policy.CrashLoopDeliveries"},
		{"negative immediate retries", func(p *Policy) { p.ImmediateRetries = -1 }, "Policy.ImmediateRetries: -1 must be >= 0 (0 disables it)"},
	}
	for _, tt := range tests {
		p := defaultPolicy
		p.Tiers = append([]time.Duration(nil), p.Tiers...)
		tt.mod(&p)
		err := p.Validate()
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: Validate() = %v, want %q", tt.name, err, tt.want)
		}
	}
}

func TestPrecheckCountsAttemptsMade(t *testing.T) {
	t.Parallel()
	p := defaultPolicy // CrashLoopDeliveries: 3
	cases := []struct {
		name    string
		headers table
		failed  int
		want    int
	}{
		{"three deliveries of a first hop crashed", table{wire.HeaderDeliveryCount: int64(3)}, 0, 3},
		{"after two failed retries", table{wire.HeaderDeliveryCount: int64(3)}, 2, 5},
		{"forged huge count is bounded", table{wire.HeaderDeliveryCount: int64(math.MaxInt64)}, 0, maxAttemptsCeiling},
	}
	for _, c := range cases {
		v := Precheck(p, DeliveryInput{WorkQueue: workQueue, Headers: c.headers, Redelivered: true, Failed: c.failed})
		if v.Action != ActionQuarantine || v.Attempt != c.want {
			t.Errorf("%s: %s attempt %d, want quarantine attempt %d", c.name, v.Action, v.Attempt, c.want)
		}
	}
}

func TestPrecheck(t *testing.T) {
	t.Parallel()

	p := defaultPolicy // CrashLoopDeliveries: 3
	dl := func(q string) any {
		return []any{table{"queue": q, "reason": "delivery_limit", "count": int64(1), "time": t0}}
	}
	tests := []struct {
		name    string
		p       Policy
		headers table
		action  Action
		reason  string
		note    string
	}{
		{name: "first delivery", p: p, headers: nil, action: ActionDeliver},
		{name: "delivery_limit for another queue", p: p, headers: table{"x-death": dl("billing")}, action: ActionDeliver},
		{name: "other reasons for the work queue", p: p, headers: table{"x-death": []any{table{"queue": workQueue, "reason": "rejected", "count": int64(9)}}}, action: ActionDeliver},
		{name: "x-delivery-count under budget", p: p, headers: table{wire.HeaderDeliveryCount: int64(2)}, action: ActionDeliver},
		{name: "x-delivery-count at budget", p: p, headers: table{wire.HeaderDeliveryCount: int64(3)}, action: ActionQuarantine, reason: "crash-looping: delivered 4 times by orders (x-delivery-count)"},
		{name: "x-delivery-count over budget, int32", p: p, headers: table{wire.HeaderDeliveryCount: int32(10)}, action: ActionQuarantine, reason: "delivered 11 times"},
		{name: "x-delivery-count huge", p: p, headers: table{wire.HeaderDeliveryCount: uint64(math.MaxUint64)}, action: ActionQuarantine, reason: "delivered 9223372036854775807 times"},
		{name: "x-delivery-count negative", p: p, headers: table{wire.HeaderDeliveryCount: int64(-50)}, action: ActionDeliver, note: "x-delivery-count=-50 ignored: negative"},
		{name: "x-delivery-count string", p: p, headers: table{wire.HeaderDeliveryCount: "9"}, action: ActionDeliver, note: "x-delivery-count of type string ignored"},
		{name: "guard disabled", p: Policy{}, headers: table{wire.HeaderDeliveryCount: int64(1000)}, action: ActionDeliver},
		{name: "x-death garbage", p: p, headers: table{"x-death": 12}, action: ActionDeliver, note: "want an array of tables"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			v := Precheck(tt.p, DeliveryInput{WorkQueue: workQueue, Headers: tt.headers, Redelivered: true})
			if v.Action != tt.action {
				t.Fatalf("Action = %s (%s), want %s", v.Action, v.Reason, tt.action)
			}
			if v.Action == ActionQuarantine && v.Class != ClassCrashLoop {
				t.Errorf("Class = %q", v.Class)
			}
			if !strings.Contains(v.Reason, tt.reason) {
				t.Errorf("Reason = %q, want %q", v.Reason, tt.reason)
			}
			if tt.note != "" && !containsNote(v.Notes, tt.note) {
				t.Errorf("notes %q lack %q", v.Notes, tt.note)
			}
		})
	}
}

// Issue 7, item 7: headers a producer set must not make a valid message skip
// its handler. Each forgery reaches the handler (ActionDeliver) with a note.
func TestPrecheckForgeriesDoNotSkipTheHandler(t *testing.T) {
	t.Parallel()

	p := withCrashLoop(defaultPolicy, 1) // the strictest guard
	dl := []any{table{"queue": workQueue, "reason": "delivery_limit", "count": int64(3), "time": t0}}
	tests := []struct {
		name        string
		headers     table
		redelivered bool
		note        string
	}{
		{name: "x-delivery-count 50 on a first delivery", headers: table{wire.HeaderDeliveryCount: int64(50)}, note: "x-delivery-count=50 ignored: the first delivery in orders (redelivered=false) carries the publisher's value"},
		{name: "x-delivery-count 50 as a string", headers: table{wire.HeaderDeliveryCount: "50"}, note: "x-delivery-count of type string ignored"},
		{name: "x-death {Q, delivery_limit}", headers: table{"x-death": dl}, note: "x-death {orders, delivery_limit} (count 3) ignored"},
		{name: "x-death {Q, delivery_limit} with x-first-death", headers: table{"x-death": dl, wire.HeaderFirstDeathQueue: workQueue, wire.HeaderFirstDeathReason: ReasonDeliveryLimit}, note: "forged or was replayed"},
		{name: "x-death {Q, delivery_limit} and x-delivery-count 50", headers: table{"x-death": dl, wire.HeaderDeliveryCount: int64(50)}, note: "x-delivery-count=50 ignored"},
		{name: "x-death {Q, delivery_limit} on a redelivery under budget", headers: table{"x-death": dl}, redelivered: true, note: "ignored"},
	}
	for _, tt := range tests {
		for _, carried := range []bool{false, true} {
			v := Precheck(p, DeliveryInput{WorkQueue: workQueue, Headers: tt.headers, Redelivered: tt.redelivered, CarriedCounts: carried, IsRetryQueue: isLane})
			if v.Action != ActionDeliver {
				t.Errorf("%s (carried %v): %s (%s), want deliver", tt.name, carried, v.Action, v.Reason)
			}
			if !containsNote(v.Notes, tt.note) {
				t.Errorf("%s (carried %v): notes %q lack %q", tt.name, carried, v.Notes, tt.note)
			}
		}
	}
}

// Issue 13: a message's first delivery in the work queue never counts as a
// crash. What each broker shows is in docs/topology.md (version
// differences); the fixtures below are those observations.
func TestPrecheckCountsOnlyThisQueuesDeliveries(t *testing.T) {
	t.Parallel()

	upstream := []any{table{"queue": "upstream", "reason": "rejected", "count": int64(1), "time": t0, "exchange": "", "routing-keys": []any{"upstream"}}}
	viaTTL := []any{table{"queue": "upstream.delay", "reason": "expired", "count": int64(1), "time": t0}, upstream[0]}
	ownLane := []any{laneEntry(laneQueue(time.Second, 0), int64(1), t0)}
	readmittedCopy := func(hist []any, count int64) table {
		h := signed(testSigner, table{"x-death": hist, wire.HeaderReadmitted: XDeathDigest(table{"x-death": hist})})
		if count > 0 {
			h[wire.HeaderDeliveryCount] = count
		}
		return h
	}
	staleMark := func() table {
		h := readmittedCopy(upstream, 1)
		h["x-death"] = viaTTL // dead-lettered again since it was re-admitted
		return h
	}

	tests := []struct {
		name        string
		t           int // CrashLoopDeliveries
		headers     table
		redelivered bool
		carried     bool
		want        Action
	}{
		// 3.10.8: a dead-lettered message arrives with redelivered=false
		// and no count; afterwards the count is this queue's.
		{name: "3.10 upstream dead letter, first delivery", t: 1, headers: table{"x-death": upstream}, want: ActionDeliver},
		{name: "3.10 upstream dead letter, requeued once", t: 1, headers: table{"x-death": upstream, wire.HeaderDeliveryCount: int64(1)}, redelivered: true, want: ActionQuarantine},
		{name: "3.10 upstream dead letter, requeued once, budget 2", t: 2, headers: table{"x-death": upstream, wire.HeaderDeliveryCount: int64(1)}, redelivered: true, want: ActionDeliver},
		// 4.0.5: redelivered=true and a carried count on the first delivery.
		{name: "4.x upstream reject, first delivery, budget 1", t: 1, headers: table{"x-death": upstream, wire.HeaderDeliveryCount: int64(1)}, redelivered: true, carried: true, want: ActionReadmit},
		{name: "4.x upstream reject, first delivery, default budget", t: 4, headers: table{"x-death": upstream, wire.HeaderDeliveryCount: int64(1)}, redelivered: true, carried: true, want: ActionReadmit},
		{name: "4.x upstream crash then reject: count 2", t: 1, headers: table{"x-death": upstream, wire.HeaderDeliveryCount: int64(2)}, redelivered: true, carried: true, want: ActionReadmit},
		{name: "4.x carried through a TTL hop", t: 1, headers: table{"x-death": viaTTL, wire.HeaderDeliveryCount: int64(1)}, redelivered: true, carried: true, want: ActionReadmit},
		{name: "4.x upstream TTL expiry only: nothing carried", t: 1, headers: table{"x-death": []any{table{"queue": "upstream", "reason": "expired", "count": int64(1)}}}, carried: true, want: ActionDeliver},
		{name: "4.x guard off: no re-admission", t: 0, headers: table{"x-death": upstream, wire.HeaderDeliveryCount: int64(1)}, redelivered: true, carried: true, want: ActionDeliver},
		// The re-admitted copy counts this queue's deliveries only.
		{name: "4.x re-admitted copy, first delivery", t: 1, headers: readmittedCopy(upstream, 0), carried: true, want: ActionDeliver},
		{name: "4.x re-admitted copy, requeued once", t: 1, headers: readmittedCopy(upstream, 1), redelivered: true, carried: true, want: ActionQuarantine},
		{name: "4.x re-admitted copy, requeued once, budget 2", t: 2, headers: readmittedCopy(upstream, 1), redelivered: true, carried: true, want: ActionDeliver},
		{name: "4.x re-admitted copy dead-lettered again", t: 1, headers: staleMark(), redelivered: true, carried: true, want: ActionReadmit},
		{name: "4.x unsigned re-admission mark", t: 1, headers: table{"x-death": upstream, wire.HeaderReadmitted: XDeathDigest(table{"x-death": upstream}), wire.HeaderDeliveryCount: int64(1)}, redelivered: true, carried: true, want: ActionReadmit},
		// The bridge's own retry lane carries nothing on either version.
		{name: "4.x back from the retry lane, first delivery", t: 1, headers: table{"x-death": ownLane}, carried: true, want: ActionDeliver},
		{name: "4.x back from the retry lane, requeued once", t: 1, headers: table{"x-death": ownLane, wire.HeaderDeliveryCount: int64(1)}, redelivered: true, carried: true, want: ActionQuarantine},
		// A producer's message: redelivered is exact on both versions.
		{name: "4.x producer message requeued once", t: 1, headers: table{wire.HeaderDeliveryCount: int64(1)}, redelivered: true, carried: true, want: ActionQuarantine},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			in := DeliveryInput{WorkQueue: workQueue, Headers: tt.headers, Redelivered: tt.redelivered, CarriedCounts: tt.carried,
				Signed: verify(tt.headers).Valid, IsRetryQueue: isLane}
			v := Precheck(withCrashLoop(defaultPolicy, tt.t), in)
			if v.Action != tt.want {
				t.Fatalf("Action = %s (%s), want %s", v.Action, v.Reason, tt.want)
			}
			if v.Action == ActionReadmit && !strings.Contains(v.Reason, "re-admitting") {
				t.Errorf("Reason = %q", v.Reason)
			}
		})
	}
}

func withCrashLoop(p Policy, n int) Policy { p.CrashLoopDeliveries = n; return p }

// Jitter must spread 1,000 messages failing at the same moment over the
// tier's window and every lane, so they do not come back as one herd.
func TestJitterSpread(t *testing.T) {
	t.Parallel()

	p := defaultPolicy
	const n = 1000
	tier := p.Tiers[1]
	rnd := rand.New(rand.NewPCG(42, 1))
	perLane := make([]int, p.Lanes)
	lo, hi := time.Duration(math.MaxInt64), time.Duration(0)
	var sum, sumSq float64
	for range n {
		v := Decide(p, failure(ClassTransient, 1), rnd)
		if v.Action != ActionRetry || v.Tier != 1 {
			t.Fatalf("verdict %+v", v)
		}
		llo, lhi := LaneBounds(tier, p.Jitter, p.Lanes, v.Lane)
		if v.Delay < llo || v.Delay > lhi {
			t.Fatalf("delay %s outside lane %d [%s, %s]", v.Delay, v.Lane, llo, lhi)
		}
		perLane[v.Lane]++
		lo, hi = min(lo, v.Delay), max(hi, v.Delay)
		sum += float64(v.Delay)
		sumSq += float64(v.Delay) * float64(v.Delay)
	}
	mean := sum / n
	stddev := time.Duration(math.Sqrt(sumSq/n - mean*mean))
	window := time.Duration(float64(tier) * p.Jitter)
	t.Logf("tier %s, jitter %.2f, %d lanes, %d decisions: min %s max %s span %s (%.1f%% of the %s window) mean %s stddev %s, per lane %v",
		tier, p.Jitter, p.Lanes, n, lo, hi, hi-lo, 100*float64(hi-lo)/float64(window), window,
		time.Duration(mean).Round(time.Millisecond), stddev.Round(time.Millisecond), perLane)

	for lane, c := range perLane {
		if c < n/p.Lanes/2 {
			t.Errorf("lane %d got %d of %d decisions", lane, c, n)
		}
	}
	if hi-lo < window*8/10 {
		t.Errorf("span %s is under 80%% of the jitter window %s", hi-lo, window)
	}
	// Uniform over the window: stddev ≈ window/√12.
	if want := float64(window) / math.Sqrt(12); math.Abs(float64(stddev)-want) > want*0.15 {
		t.Errorf("stddev %s, want ≈ %s", stddev, time.Duration(want))
	}
}

// Delay and lane agree at the lane edges, where float rounding could put a
// delay a nanosecond outside its lane.
func TestLaneEdges(t *testing.T) {
	t.Parallel()

	p := Policy{Tiers: []time.Duration{time.Second, 7 * time.Second, 333333333 * time.Nanosecond * 100}, Lanes: 7, Jitter: 0.37, MaxAttempts: 10}
	for tier := range p.Tiers {
		for lane := 0; lane <= p.Lanes; lane++ {
			for _, u := range []float64{
				float64(lane) / float64(p.Lanes),
				math.Nextafter(float64(lane)/float64(p.Lanes), 0),
				math.Nextafter(float64(lane)/float64(p.Lanes), 1),
			} {
				v := Decide(p, failure(ClassTransient, tier), fixedRand(u))
				lo, hi := LaneBounds(p.Tiers[v.Tier], p.Jitter, p.Lanes, v.Lane)
				if v.Action != ActionRetry || v.Lane < 0 || v.Lane >= p.Lanes || v.Delay < lo || v.Delay > hi {
					t.Errorf("u=%v: %+v outside [%s, %s]", u, v, lo, hi)
				}
			}
		}
	}
}

// A misbehaving random source cannot push delays out of range.
func TestDecideBadRand(t *testing.T) {
	t.Parallel()

	for _, u := range []float64{-1, 1, 2, math.NaN(), math.Inf(1), math.Inf(-1)} {
		v := Decide(defaultPolicy, failure(ClassTransient, 0), fixedRand(u))
		if v.Action != ActionRetry || v.Delay < time.Second || v.Delay > 1200*time.Millisecond || v.Lane < 0 || v.Lane > 3 {
			t.Errorf("u=%v: %+v", u, v)
		}
	}
	if v := Decide(defaultPolicy, failure(ClassTransient, 0), nil); v.Action != ActionRetry {
		t.Errorf("nil rand: %+v", v)
	}
}

func BenchmarkDecide(b *testing.B) {
	rnd := rand.New(rand.NewPCG(1, 1))
	f := failure(ClassTransient, 2)
	for b.Loop() {
		Decide(defaultPolicy, f, rnd)
	}
}

func BenchmarkCountAttempts(b *testing.B) {
	h := table{wire.HeaderAttempts: int64(3), wire.HeaderFirstFailureAt: t0.Format(time.RFC3339Nano), "x-death": []any{
		laneEntry(laneQueue(5*time.Second, 1), int64(2), t0), laneEntry(laneQueue(time.Second, 0), int64(1), t0),
	}}
	in := AttemptInput{Headers: h, IsRetryQueue: isLane, Now: t0.Add(time.Minute)}
	for b.Loop() {
		CountAttempts(in)
	}
}

// A delayed retry's reason reads as it did when fmt wrote it.
func TestRetryReasonAsFormatted(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		class        Class
		attempt, max int
		delay        time.Duration
		tier, lane   int
		note         string
	}{
		{ClassTransient, 2, 3, 100 * time.Millisecond, 0, 0, ""},
		{ClassTimeout, 10, 20, 90 * time.Minute, 3, 12, "; retry-after 2h0m0s exceeds the largest tier 1h30m0s"},
		{ClassTransient, 1, 1, 0, 0, 0, ""},
	} {
		want := fmt.Sprintf("%s failure: retry %d/%d in %s (tier %d, lane %d)%s", c.class, c.attempt, c.max, c.delay, c.tier, c.lane, c.note)
		if got := retryReason(c.class, c.attempt, c.max, c.delay, c.tier, c.lane, c.note); got != want {
			t.Errorf("got %q, want %q", got, want)
		}
	}
}
