package consumer

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/internal/config"
	"github.com/dlxbridge/dlxbridge/quarantine"
	"github.com/dlxbridge/dlxbridge/triage"
)

// Issue 7, items 7 and 9: a producer-set header must not make a valid
// message skip its handler or lose its retry budget. Each forged message
// reaches its handler on every attempt, gets max_attempts attempts and a
// fresh time budget, as if the header were absent, and the note about the
// forgery, made on the first delivery, survives both retries into the
// quarantine envelope.
func TestForgedHeadersNeitherSkipTheHandlerNorSpendTheBudget(t *testing.T) {
	t.Parallel()
	b := setup(t, func(q *config.Queue) {
		elapsed := 10 * time.Minute // the time budget is on: a forged first failure must not spend it
		q.Retry.MaxElapsed = &elapsed
	}) // max_attempts 3, crash_loop_deliveries 2, delivery_limit 4
	lane := b.wq.Tiers[0].Lanes[0].Queue
	otherKey, err := triage.NewSigner([]byte("not the consumers' key, 32 bytes"))
	must(t, err)
	at := time.Now().Add(-time.Minute)

	type forgery struct {
		headers func(id string, body []byte) amqp.Table
		note    string
	}
	forgeries := map[string]forgery{
		"delivery-count-50": {
			headers: func(string, []byte) amqp.Table { return amqp.Table{"x-delivery-count": int64(50)} },
			note:    "x-delivery-count=50 ignored",
		},
		"x-death-work-queue-delivery-limit": {
			headers: func(string, []byte) amqp.Table {
				return amqp.Table{"x-death": []any{amqp.Table{"queue": b.queue.Name, "reason": "delivery_limit", "count": int64(3), "exchange": "", "routing-keys": []any{b.queue.Name}, "time": at}},
					"x-first-death-queue": b.queue.Name, "x-first-death-reason": "delivery_limit"}
			},
			note: "delivery_limit} (count 3) ignored",
		},
		"attempts-999999": {
			headers: func(string, []byte) amqp.Table { return amqp.Table{triage.HeaderAttempts: int64(999_999)} },
			note:    "dlxbridge-attempts=999999 ignored: no dlxbridge-signature",
		},
		"attempts-signed-with-another-key": {
			headers: func(id string, body []byte) amqp.Table {
				h := amqp.Table{triage.HeaderAttempts: int64(4)}
				h[triage.HeaderSignature] = otherKey.Sign(triage.Subject{Queue: b.queue.Name, MessageID: id, Body: body}, h, signedHeaders)
				return h
			},
			note: "dlxbridge-attempts=4 ignored: dlxbridge-signature does not match",
		},
		"x-death-lane-count-1e9": {
			headers: func(string, []byte) amqp.Table {
				return amqp.Table{"x-death": []any{amqp.Table{"queue": lane, "reason": "expired", "count": int64(1_000_000_000), "exchange": "", "routing-keys": []any{lane}, "time": at}}}
			},
			note: "expired} count 1000000000 not counted",
		},
		"first-failure-2001": {
			headers: func(string, []byte) amqp.Table {
				return amqp.Table{triage.HeaderFirstFailure: "2001-01-01T00:00:00Z"}
			},
			note: `dlxbridge-first-failure-at="2001-01-01T00:00:00Z" ignored`,
		},
	}

	var mu sync.Mutex
	calls := map[string][]int{} // message id → the attempts its handler saw
	b.start(func(c *Consumer) {
		must(t, c.Handle(b.queue.Name, testType, HandlerFunc(func(ctx context.Context, m *Message) error {
			mu.Lock()
			calls[m.MessageID] = append(calls[m.MessageID], m.Attempt)
			mu.Unlock()
			return fmt.Errorf("downstream unavailable")
		})))
	})
	start := time.Now()
	for id, f := range forgeries {
		body, _ := json.Marshal(map[string]any{"id": id})
		b.publish(body, amqp.Publishing{MessageId: id, Headers: f.headers(id, body)})
	}

	deadline := time.After(60 * time.Second)
	for quarantined := 0; quarantined < len(forgeries); {
		select {
		case o := <-b.settled:
			switch o {
			case OutcomeRetried:
			case OutcomeQuarantined:
				quarantined++
			default:
				t.Fatalf("unexpected outcome %q", o)
			}
		case <-deadline:
			t.Fatalf("only %d of %d forged messages reached the quarantine", quarantined, len(forgeries))
		}
	}
	records := b.drainQuarantine(len(forgeries))

	mu.Lock()
	defer mu.Unlock()
	for _, d := range records {
		f, ok := forgeries[d.MessageId]
		if !ok {
			t.Errorf("unexpected message %q in the quarantine", d.MessageId)
			continue
		}
		env, _ := quarantine.Read(&d)
		if got := calls[d.MessageId]; fmt.Sprint(got) != "[1 2 3]" {
			t.Errorf("%s: the handler saw attempts %v, want [1 2 3]", d.MessageId, got)
		}
		if env.Class != triage.ClassTransient || env.Attempts != 3 || !strings.Contains(env.Reason, "attempt budget exhausted (3/3)") {
			t.Errorf("%s: class %q attempts %d reason %q; want transient, 3, budget exhausted", d.MessageId, env.Class, env.Attempts, env.Reason)
		}
		if env.FirstFailureAt.Before(start.Add(-time.Second)) {
			t.Errorf("%s: first failure %v, before the test started", d.MessageId, env.FirstFailureAt)
		}
		if !strings.Contains(strings.Join(env.Notes, "\n"), f.note) {
			t.Errorf("%s: notes %q lack %q", d.MessageId, env.Notes, f.note)
		}
		if _, kept := d.Headers[triage.HeaderSignature]; kept {
			t.Errorf("%s: the quarantined copy carries a signature", d.MessageId)
		}
	}
}

// A retry's signed state can't be lifted onto another message: a producer
// that copies a real retry's headers (signature included) onto a new message
// gets the full budget for it.
func TestCopiedRetryHeadersDoNotCarryOver(t *testing.T) {
	t.Parallel()
	b := setup(t, nil) // max_attempts 3
	var mu sync.Mutex
	calls := map[string][]int{}
	var stolen amqp.Table
	b.start(func(c *Consumer) {
		must(t, c.Handle(b.queue.Name, testType, HandlerFunc(func(ctx context.Context, m *Message) error {
			mu.Lock()
			defer mu.Unlock()
			calls[m.MessageID] = append(calls[m.MessageID], m.Attempt)
			if m.MessageID == "victim" && m.Attempt == 2 {
				stolen = m.Headers // attempts 1, signed for "victim"
				return nil
			}
			return fmt.Errorf("down")
		})))
	})
	b.publishJSON(map[string]any{"id": "v"}, amqp.Publishing{MessageId: "victim"})
	b.waitOutcome(OutcomeRetried, 10*time.Second)
	b.waitOutcome(OutcomeAcked, 10*time.Second)

	mu.Lock()
	h := amqp.Table{}
	for k, v := range stolen {
		if !strings.HasPrefix(k, "x-") {
			h[k] = v
		}
	}
	mu.Unlock()
	if h[triage.HeaderSignature] == nil || h[triage.HeaderAttempts] != int64(1) {
		t.Fatalf("the retry carried no signed attempt count: %v", h)
	}
	h[triage.HeaderAttempts] = int64(2) // and raise it
	b.publishJSON(map[string]any{"id": "v"}, amqp.Publishing{MessageId: "thief", Headers: h})
	b.waitOutcome(OutcomeRetried, 10*time.Second)
	b.waitOutcome(OutcomeRetried, 10*time.Second)
	b.waitOutcome(OutcomeQuarantined, 10*time.Second)
	mu.Lock()
	defer mu.Unlock()
	if got := fmt.Sprint(calls["thief"]); got != "[1 2 3]" {
		t.Fatalf("the copied headers changed the budget: attempts %s, want [1 2 3]", got)
	}
}

// drainQuarantine takes (and acks) n messages from the quarantine.
func (b *testBundle) drainQuarantine(n int) []amqp.Delivery {
	b.t.Helper()
	ch := b.env.Channel("drain")
	var out []amqp.Delivery
	deadline := time.Now().Add(10 * time.Second)
	for len(out) < n {
		d, ok, err := ch.Get(b.wq.Quarantine, false)
		must(b.t, err)
		if ok {
			must(b.t, d.Ack(false))
			out = append(out, d)
			continue
		}
		if time.Now().After(deadline) {
			b.t.Fatalf("quarantine held %d messages, want %d", len(out), n)
		}
		time.Sleep(20 * time.Millisecond) // polling the broker; no event to wait on
	}
	return out
}
