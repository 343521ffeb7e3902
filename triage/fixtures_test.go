package triage

import (
	"fmt"
	"maps"
	"strings"
	"time"

	"github.com/dlxbridge/dlxbridge/wire"
)

// table mimics amqp.Table: a named map type, as amqp091-go delivers
// headers and nested x-death entries.
type table map[string]any

// Work queue and lane names as the topology builds them.
const workQueue = "orders"

func laneQueue(d time.Duration, lane int) string {
	return fmt.Sprintf("%s.retry.%s.l%d", workQueue, d, lane)
}

func isLane(q string) bool { return strings.HasPrefix(q, workQueue+".retry.") }

// testSigner signs the fixtures' retry state as the runtime does.
var testSigner = mustSigner("0123456789abcdef0123456789abcdef")

func mustSigner(key string) *Signer {
	s, err := NewSigner([]byte(key))
	if err != nil {
		panic(err)
	}
	return s
}

// signedFields are the headers the fixtures sign (the runtime also signs
// its origin and notes headers).
var signedFields = []string{wire.HeaderAttempts, wire.HeaderFirstFailureAt, wire.HeaderReadmitted}

// testSubject is the message the fixtures sign for.
var testSubject = Subject{Queue: workQueue, MessageID: "m-1", Body: []byte(`{"id":1}`)}

// signed returns h with a valid signature by s for testSubject.
func signed(s *Signer, h table) table {
	out := maps.Clone(h)
	if out == nil {
		out = table{}
	}
	out[wire.HeaderSignature] = s.Sign(testSubject, out, signedFields)
	return out
}

// verify is what the runtime passes as AttemptInput.Signature.
func verify(h table) Verification { return testSigner.Verify(testSubject, h, signedFields) }

// shape is a broker generation's way of writing x-death when it
// dead-letters a message that already carries a client-provided x-death.
type shape string

const (
	// shape310 is 3.10–3.12 and 3.13.3+: the client's x-death is kept; the
	// {queue, reason} entry's count is incremented and moved to the front,
	// or a new entry is prepended. x-first-death-* is kept if present.
	shape310 shape = "3.10"
	// shape4x is 4.x: the client's x-death is ignored and replaced by the
	// message's own (fresh) history: one entry with count 1.
	shape4x shape = "4.x"
)

// deadLetter returns the headers the broker delivers after dead-lettering
// a message with headers h from queue for reason at now.
func (s shape) deadLetter(h table, queue, reason string, now time.Time) table {
	out := maps.Clone(h)
	if out == nil {
		out = table{}
	}
	now = now.Truncate(time.Second) // AMQP timestamps are seconds
	fresh := table{
		"queue":        queue,
		"reason":       reason,
		"count":        int64(1),
		"time":         now,
		"exchange":     workQueue + ".retry",
		"routing-keys": []any{queue},
	}
	switch s {
	case shape310:
		old, _ := h["x-death"].([]any)
		entries := []any{fresh}
		for _, e := range old {
			t := e.(table)
			if t["queue"] == queue && t["reason"] == reason {
				upd := maps.Clone(t)
				upd["count"] = t["count"].(int64) + 1
				entries[0] = upd
				continue
			}
			entries = append(entries, t)
		}
		out["x-death"] = entries
		if _, ok := out[wire.HeaderFirstDeathQueue]; !ok {
			out[wire.HeaderFirstDeathQueue] = queue
			out[wire.HeaderFirstDeathReason] = reason
		}
	case shape4x:
		out["x-death"] = []any{fresh}
		out[wire.HeaderFirstDeathQueue] = queue
		out[wire.HeaderFirstDeathReason] = reason
		out[wire.HeaderLastDeathReason] = reason
	}
	return out
}

// retryPublish returns the headers the bridge publishes a retry with:
// the delivered headers plus its own attempt and first-failure headers,
// signed.
// Kept x-death is the worst case for double counting on 3.10; the consumer
// strips broker-owned headers (strip), which makes 3.10 show fresh history
// like 4.x.
func retryPublish(h table, failedSoFar int, now time.Time, strip bool) table {
	out := maps.Clone(h)
	if out == nil {
		out = table{}
	}
	if strip {
		for k := range out {
			if k == wire.HeaderXDeath || k == wire.HeaderDeliveryCount || strings.HasPrefix(k, "x-first-death-") || strings.HasPrefix(k, "x-last-death-") {
				delete(out, k)
			}
		}
	}
	out[wire.HeaderAttempts] = int64(failedSoFar)
	if _, ok := out[wire.HeaderFirstFailureAt]; !ok {
		out[wire.HeaderFirstFailureAt] = now.UTC().Format(time.RFC3339Nano)
	}
	return signed(testSigner, out)
}

// step is what the bridge saw and decided on one delivery.
type step struct {
	Failed       int
	FirstFailure time.Time
	Verdict      Verdict
}

// hop lets a scenario switch broker shape mid-flight (an upgrade).
type hopShape func(hop int) shape

func always(s shape) hopShape { return func(int) shape { return s } }

// simulate runs one message that fails with class on every delivery
// through the retry loop until it is quarantined (or maxSteps), and
// returns the step log and the final headers.
func simulate(p Policy, class Class, shapeOf hopShape, strip bool, rnd Rand, start time.Time, maxSteps int) ([]step, table) {
	h := table{"content-type": "application/json"}
	now := start
	var log []step
	for hop := 0; hop < maxSteps; hop++ {
		a := CountAttempts(AttemptInput{Headers: h, Signature: verify(h), IsRetryQueue: isLane, Now: now})
		v := Decide(p, Failure{Class: class, Attempts: a, Now: now}, rnd)
		log = append(log, step{Failed: a.Failed, FirstFailure: a.FirstFailure, Verdict: v})
		if v.Action != ActionRetry {
			break
		}
		h = retryPublish(h, v.Attempt, now, strip)
		now = now.Add(v.Delay)
		h = shapeOf(hop).deadLetter(h, laneQueue(p.Tiers[v.Tier], v.Lane), ReasonExpired, now)
	}
	return log, h
}
