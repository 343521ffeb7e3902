package triage_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/dlxbridge/dlxbridge/triage"
	"github.com/dlxbridge/dlxbridge/wire"
)

// A handler failed on the third delivery of a message: the bridge reads the
// attempts from its own signed header (x-death never counts), classifies
// the error and decides to retry on tier 2 (30s) with jitter, on a lane of
// that tier.
func ExampleDecide() {
	policy := triage.Policy{
		Tiers:       []time.Duration{time.Second, 5 * time.Second, 30 * time.Second, 2 * time.Minute},
		Lanes:       4,
		Jitter:      0.2,
		MaxAttempts: 5,
		MaxElapsed:  15 * time.Minute,
	}
	now := time.Date(2026, 3, 1, 12, 0, 40, 0, time.UTC)
	signer, _ := triage.NewSigner([]byte("a key shared by every consumer"))
	msg := triage.Subject{Queue: "orders", MessageID: "m-1", Body: []byte(`{"id":1}`)}
	signed := []string{wire.HeaderAttempts, wire.HeaderFirstFailureAt}

	// What the previous hop published (with its signature) and a 4.x
	// broker delivered back from the retry lane.
	headers := map[string]any{
		wire.HeaderAttempts:       int64(2),
		wire.HeaderFirstFailureAt: "2026-03-01T12:00:00Z",
	}
	headers[wire.HeaderSignature] = signer.Sign(msg, headers, signed)
	headers["x-death"] = []any{map[string]any{
		"queue": "orders.retry.5s.l1", "reason": "expired", "count": int64(1),
		"time": now.Add(-time.Second),
	}}

	attempts := triage.CountAttempts(triage.AttemptInput{
		Headers:      headers,
		Signature:    signer.Verify(msg, headers, signed),
		IsRetryQueue: func(q string) bool { return len(q) > 13 && q[:13] == "orders.retry." },
		Now:          now,
	})

	class, hint := triage.Classify(fmt.Errorf("charge card: %w", errors.New("connection reset")))
	v := triage.Decide(policy, triage.Failure{Class: class, Hint: hint, Attempts: attempts, Now: now},
		rand.New(rand.NewPCG(1, 2)))

	fmt.Println("failed before:", attempts.Failed)
	fmt.Println(v.Action, v.Class, "attempt", v.Attempt, "tier", v.Tier, "lane", v.Lane)
	fmt.Println(v.Reason)
	// Output:
	// failed before: 2
	// retry transient attempt 3 tier 2 lane 2
	// transient failure: retry 4/5 in 34.059s (tier 2, lane 2)
}

// Forged or malformed headers are noted, never trusted: without the
// bridge's signature, a producer's attempt count is ignored and the message
// keeps its whole retry budget.
func ExampleCountAttempts() {
	a := triage.CountAttempts(triage.AttemptInput{
		Headers:   map[string]any{wire.HeaderAttempts: int64(999999), "x-death": "forged"},
		Signature: triage.Verification{Problem: "no dlxbridge-signature"},
	})
	fmt.Println(a.Failed)
	for _, n := range a.Notes {
		fmt.Println(n)
	}
	// Output:
	// 0
	// x-death: want an array of tables, got string; ignored
	// dlxbridge-attempts=999999 ignored: no dlxbridge-signature
}

func ExampleFingerprint() {
	a := triage.Fingerprint(triage.ClassTransient, "order 8812: dial tcp 10.0.0.1:5672: refused", "orders.created", "2")
	b := triage.Fingerprint(triage.ClassTransient, "order 17: dial tcp 10.0.0.9:5672: refused", "orders.created", "2")
	fmt.Println(a == b, triage.NormalizeMessage("order 8812: dial tcp 10.0.0.1:5672: refused"))
	// Output:
	// true order <n>: dial tcp <ip>: refused
}
