package consumer

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/config"
	"github.com/dlxbridge/dlxbridge/quarantine"
	"github.com/dlxbridge/dlxbridge/triage"
	"github.com/dlxbridge/dlxbridge/wire"
)

func TestTransientFailureSucceedsOnThirdAttemptWithGrowingDelays(t *testing.T) {
	t.Parallel()
	b := setup(t, func(q *config.Queue) { q.Retry.MaxAttempts = 4 })
	rec := newRecorder()
	var mu sync.Mutex
	var delays []time.Duration // the retries' delays as the runtime chose them
	b.cfg.OnSettled = func(s Settled) {
		if s.Outcome == OutcomeRetried {
			mu.Lock()
			delays = append(delays, s.Delay)
			mu.Unlock()
		}
		b.settled <- s.Outcome
	}
	b.start(func(c *Consumer) {
		must(t, c.Handle(b.queue.Name, testType, HandlerFunc(func(ctx context.Context, m *Message) error {
			rec.record(m)
			if m.Attempt < 3 {
				return errors.New("downstream unavailable")
			}
			return nil
		})))
	})
	b.publishJSON(map[string]any{"id": "j-1"}, amqp.Publishing{MessageId: "m-1"})
	b.waitOutcome(OutcomeRetried, 10*time.Second)
	b.waitOutcome(OutcomeRetried, 10*time.Second)
	b.waitOutcome(OutcomeAcked, 10*time.Second)

	if n := rec.count(); n != 3 {
		t.Fatalf("handler ran %d times, want 3", n)
	}
	d1 := rec.calls[1].at.Sub(rec.calls[0].at)
	d2 := rec.calls[2].at.Sub(rec.calls[1].at)
	mu.Lock()
	defer mu.Unlock()
	t.Logf("delays between attempts: %s, %s (retry delays %v, tiers %v)", d1, d2, delays, b.queue.Retry.Tiers[:2])
	// The runtime chose growing delays, one per tier (no jitter here)...
	if len(delays) != 2 || delays[0] != b.queue.Retry.Tiers[0] || delays[1] != b.queue.Retry.Tiers[1] {
		t.Fatalf("retry delays %v, want the tiers %v", delays, b.queue.Retry.Tiers[:2])
	}
	// ...and each wait lasted at least its delay (the lane's TTL). How much
	// longer is up to the machine's load: on a busy one the first wait can
	// outlast the second, so their order is not checked.
	if d1 < delays[0] || d2 < delays[1] {
		t.Fatalf("delays %s, %s shorter than the retry delays %v", d1, d2, delays)
	}
	for i, c := range rec.calls {
		if c.attempt != i+1 {
			t.Fatalf("call %d saw attempt %d", i, c.attempt)
		}
		if c.msg.IdempotencyKey != "m-1" {
			t.Fatalf("idempotency key %q lost on attempt %d", c.msg.IdempotencyKey, c.attempt)
		}
	}
	if got := testutil.ToFloat64(b.consumer.metrics.retries.WithLabelValues(b.queue.Name, "0")); got != 1 {
		t.Fatalf("retries at tier 0 = %v, want 1", got)
	}
	if got := testutil.ToFloat64(b.consumer.metrics.retries.WithLabelValues(b.queue.Name, "1")); got != 1 {
		t.Fatalf("retries at tier 1 = %v, want 1", got)
	}
	// Each retry's copy waited for the broker's confirm, observed before
	// its ack (which the retries counter follows).
	if n, sum := confirmWaits(t, b.consumer.metrics, b.queue.Name, "retry"); n != 2 || sum <= 0 {
		t.Fatalf("confirm waits of the retries: %d samples, sum %vs; want 2, above 0", n, sum)
	}
	if d := b.queueDepth(b.wq.Quarantine); d != 0 {
		t.Fatalf("quarantine holds %d messages, want 0", d)
	}
}

func TestPermanentFailureIsQuarantinedAfterOneDeliveryWithFullEnvelope(t *testing.T) {
	t.Parallel()
	b := setup(t, func(q *config.Queue) {
		q.Quarantine.Redact.Headers = []string{"authorization"}
	})
	var calls atomic.Int32
	b.start(func(c *Consumer) {
		must(t, c.Handle(b.queue.Name, testType, HandlerFunc(func(ctx context.Context, m *Message) error {
			calls.Add(1)
			return triage.Permanent(errors.New("order 4711 references unknown customer 99"))
		})))
	})
	// Odd spacing and key order: the quarantined body must be these bytes.
	body := []byte("{ \"id\":\"j-2\",   \"note\": \"caf\u00e9\" }")
	traceparent := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	b.publish(body, amqp.Publishing{
		MessageId:     "m-2",
		CorrelationId: "corr-2",
		Headers: amqp.Table{
			"traceparent":             traceparent,
			wire.HeaderIdempotencyKey: "idem-2",
			"authorization":           "Bearer secret",
		},
	})
	b.waitOutcome(OutcomeQuarantined, 10*time.Second)
	if n := calls.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want exactly 1", n)
	}
	d := b.quarantined()
	if !bytes.Equal(d.Body, body) {
		t.Fatalf("quarantined body %q, want the published bytes %q", d.Body, body)
	}
	env, ok := quarantine.Read(&d)
	if !ok {
		t.Fatal("no envelope on the quarantined message")
	}
	host, _ := os.Hostname()
	checks := []struct {
		name      string
		got, want any
	}{
		{"source", env.Source, quarantine.SourceBridge},
		{"class", env.Class, triage.ClassPermanent},
		{"attempts", env.Attempts, 1},
		{"original exchange", env.OriginalExchange, b.queue.Exchange.Name},
		{"original routing key", env.OriginalRouting, "job.test"},
		{"original queue", env.OriginalQueue, b.queue.Name},
		{"message id", env.MessageID, "m-2"},
		{"idempotency key", env.IdempotencyKey, "idem-2"},
		{"type", env.MessageType, testType},
		{"schema version", env.SchemaVersion, "1"},
		{"trace id", env.TraceID, "4bf92f3577b34da6a3ce929d0e0e4736"},
		{"worker host", env.WorkerHost, host},
		{"worker version", env.WorkerVersion, "test-1.2.3"},
		{"correlation id kept", d.CorrelationId, "corr-2"},
		{"type property kept", d.Type, testType},
		{"authorization redacted", d.Headers["authorization"], redactedValue},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
	if !strings.Contains(env.Error, "unknown customer 99") || env.Reason == "" || env.Fingerprint == "" {
		t.Errorf("error %q reason %q fingerprint %q", env.Error, env.Reason, env.Fingerprint)
	}
	if env.FirstFailureAt.IsZero() || env.LastFailureAt.IsZero() || env.QuarantinedAt.IsZero() || env.QuarantinedAt.Before(env.FirstFailureAt) {
		t.Errorf("times: first %v last %v quarantined %v", env.FirstFailureAt, env.LastFailureAt, env.QuarantinedAt)
	}
	if tp, _ := d.Headers["traceparent"].(string); !strings.HasPrefix(tp, "00-4bf92f3577b34da6a3ce929d0e0e4736-") {
		t.Errorf("traceparent %q does not continue the trace", tp)
	}
	if len(env.Redacted) != 1 || env.Redacted[0] != "header:authorization" {
		t.Errorf("redacted %v", env.Redacted)
	}
}

func TestExhaustedBudgetEndsInQuarantineWithAttemptsEqualMax(t *testing.T) {
	t.Parallel()
	b := setup(t, nil) // max_attempts 3
	var calls atomic.Int32
	b.start(func(c *Consumer) {
		must(t, c.Handle(b.queue.Name, testType, HandlerFunc(func(ctx context.Context, m *Message) error {
			calls.Add(1)
			return errors.New("still down")
		})))
	})
	b.publishJSON(map[string]any{"id": "j-3"}, amqp.Publishing{MessageId: "m-3"})
	b.waitOutcome(OutcomeRetried, 10*time.Second)
	b.waitOutcome(OutcomeRetried, 10*time.Second)
	b.waitOutcome(OutcomeQuarantined, 10*time.Second)
	env, _ := quarantine.Read(ptr(b.quarantined()))
	if env.Attempts != b.queue.Retry.MaxAttempts || int(calls.Load()) != b.queue.Retry.MaxAttempts {
		t.Fatalf("attempts %d, handler calls %d; want both %d", env.Attempts, calls.Load(), b.queue.Retry.MaxAttempts)
	}
	if env.Class != triage.ClassTransient || !strings.Contains(env.Error, "still down") {
		t.Fatalf("class %q error %q", env.Class, env.Error)
	}
}

func TestSchemaInvalidMessageNeverReachesHandler(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var calls atomic.Int32
	b.start(func(c *Consumer) {
		must(t, c.Handle(b.queue.Name, testType, HandlerFunc(func(ctx context.Context, m *Message) error {
			calls.Add(1)
			return nil
		})))
	})
	body := []byte(`{"id": 42, "unexpected": true}`)
	b.publish(body, amqp.Publishing{MessageId: "m-4"})
	b.waitOutcome(OutcomeQuarantined, 10*time.Second)
	if n := calls.Load(); n != 0 {
		t.Fatalf("handler ran %d times for an invalid message", n)
	}
	d := b.quarantined()
	env, _ := quarantine.Read(&d)
	if env.Class != triage.ClassSchema || env.Attempts != 1 || len(env.Validation) == 0 || !bytes.Equal(d.Body, body) {
		t.Fatalf("class %q attempts %d violations %v body %q", env.Class, env.Attempts, env.Validation, d.Body)
	}
	if got := testutil.ToFloat64(b.consumer.metrics.validation); got != 1 {
		t.Fatalf("validation failures metric = %v, want 1", got)
	}
}

// A handler panic is retried, then quarantined. Its stack reaches the log
// (every time) and the envelope (truncated); it used to be captured and
// thrown away. Durations in the log read "150ms", not 150000000, also
// through a JSON handler.
func TestPanickingHandlerEndsInQuarantine(t *testing.T) {
	t.Parallel()
	b := setup(t, nil) // tiers 150ms, 450ms; max_attempts 3
	var logs syncBuffer
	b.cfg.Logger = slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	var calls atomic.Int32
	stop := b.start(func(c *Consumer) {
		must(t, c.Handle(b.queue.Name, testType, HandlerFunc(func(ctx context.Context, m *Message) error {
			calls.Add(1)
			var m2 map[string]int
			m2["boom"]++ // nil map write: a real panic
			return nil
		})))
	})
	b.publishJSON(map[string]any{"id": "j-5"}, amqp.Publishing{MessageId: "m-5"})
	b.waitOutcome(OutcomeRetried, 10*time.Second)
	b.waitOutcome(OutcomeRetried, 10*time.Second)
	b.waitOutcome(OutcomeQuarantined, 10*time.Second)
	env, _ := quarantine.Read(ptr(b.quarantined()))
	stop()
	if env.Class != triage.ClassPanic || env.Attempts != 3 || calls.Load() != 3 || !strings.Contains(env.Error, "nil map") {
		t.Fatalf("class %q attempts %d calls %d error %q", env.Class, env.Attempts, calls.Load(), env.Error)
	}
	const handlerFrame = "consumer.TestPanickingHandlerEndsInQuarantine"
	if s := env.Stack; !strings.Contains(s, handlerFrame) || len(s) > quarantine.MaxStackBytes || strings.Contains(s, "runtime/debug.Stack") {
		t.Errorf("envelope stack (%d bytes) lacks the handler's frame or keeps the recovery frames:\n%s", len(s), s)
	}
	retries := logs.records(t, "retry scheduled")
	if len(retries) != 2 {
		t.Fatalf("%d retry log lines, want 2", len(retries))
	}
	for i, want := range []string{"150ms", "450ms"} {
		if got := retries[i]["delay"]; got != want {
			t.Errorf("retry %d logged delay %#v, want %q", i+1, got, want)
		}
		if s, _ := retries[i]["stack"].(string); !strings.Contains(s, handlerFrame) {
			t.Errorf("retry %d log has no stack: %v", i+1, retries[i])
		}
	}
	q := logs.records(t, "quarantined")
	if s, _ := q[0]["stack"].(string); len(q) != 1 || !strings.Contains(s, handlerFrame) {
		t.Errorf("quarantine log lines %v: want one with the stack", q)
	}
}

// A retry whose publish is unroutable (its lane queue was deleted) must not
// ack the original before a copy is confirmed: the broker returns it, and
// the message is quarantined at once, its reason naming the lane (see
// retryQueueMissing), rather than requeued until the crash-loop guard
// called it a crash loop. Nothing is lost; the handler ran once.
func TestUnroutableRetryIsNotAckedAndNotLost(t *testing.T) {
	t.Parallel()
	b := setup(t, nil) // crash_loop_deliveries 2, delivery_limit 4
	ch := b.env.Channel("sabotage")
	lane := b.wq.Tiers[0].Lanes[0].Queue
	if _, err := ch.QueueDelete(lane, false, false, false); err != nil {
		t.Fatal(err)
	}
	calls := b.startFailing()
	b.publishJSON(map[string]any{"id": "j-6"}, amqp.Publishing{MessageId: "m-6"})
	b.waitOutcome(OutcomeQuarantined, 10*time.Second)
	if n := calls.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
	if got := testutil.ToFloat64(b.consumer.metrics.publishFailures.WithLabelValues(b.queue.Name, "retry")); got != 1 {
		t.Fatalf("retry publish failures = %v, want 1", got)
	}
	env, _ := quarantine.Read(ptr(b.quarantined()))
	if env.Class != triage.ClassTransient || env.MessageID != "m-6" || env.Attempts != 1 {
		t.Fatalf("class %q message %q attempts %d (want transient, m-6, 1)", env.Class, env.MessageID, env.Attempts)
	}
	if !strings.Contains(env.Reason, "retry tier queue "+lane+" is missing") {
		t.Fatalf("reason %q does not name the missing lane", env.Reason)
	}
	if d := b.queueDepth(b.queue.Name); d != 0 {
		t.Fatalf("work queue holds %d, want 0", d)
	}
}

// A message the broker's delivery limit dead-letters (the worker crashed on
// it every time) goes to the quarantine, not the retry loop, not lost.
func TestBrokerDeadLetteredMessageLandsInQuarantine(t *testing.T) {
	t.Parallel()
	b := setup(t, func(q *config.Queue) { q.DeliveryLimit = 1; q.Consumer.CrashLoopDeliveries = 1 })
	ch := b.env.Channel("crashing-worker")
	b.publishJSON(map[string]any{"id": "j-7"}, amqp.Publishing{MessageId: "m-7"})
	// A raw consumer that "crashes": reject with requeue until the broker
	// gives up (3.x: limit N allows N+1 deliveries).
	for i := 0; i < 5; i++ {
		d, ok, err := ch.Get(b.queue.Name, false)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			break
		}
		_ = d.Reject(true)
	}
	d := b.quarantined()
	env, ok := quarantine.Read(&d)
	if !ok || env.Source != quarantine.SourceBroker || env.Class != triage.ClassCrashLoop {
		t.Fatalf("envelope %+v ok %v", env, ok)
	}
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func ptr[T any](v T) *T { return &v }

// A message whose own headers nearly fill a frame still gets quarantined
// with its envelope: the largest of its headers is dropped (and noted)
// instead of the broker closing the connection over an oversized frame.
func TestOversizedHeadersAreTrimmedNotFatal(t *testing.T) {
	t.Parallel()
	b := setup(t, func(q *config.Queue) { q.Quarantine.Redact.Headers = []string{wire.HeaderIdempotencyKey} })
	b.start(func(c *Consumer) {
		must(t, c.Handle(b.queue.Name, testType, HandlerFunc(func(ctx context.Context, m *Message) error {
			return triage.Permanent(errors.New("no"))
		})))
	})
	huge := strings.Repeat("h", 130_500) // fits the producer's frame (131072), not with the envelope added
	b.publishJSON(map[string]any{"id": "big"}, amqp.Publishing{MessageId: "big", Headers: amqp.Table{
		"x-app-blob": huge, wire.HeaderIdempotencyKey: "secret-key",
	}})
	b.waitOutcome(OutcomeQuarantined, 10*time.Second)
	d := b.quarantined()
	env, _ := quarantine.Read(&d)
	if _, kept := d.Headers["x-app-blob"]; kept {
		t.Fatal("the oversized header was kept")
	}
	if !strings.Contains(strings.Join(env.Notes, "; "), "header x-app-blob (130500 bytes) dropped") {
		t.Fatalf("notes %v do not mention the dropped header", env.Notes)
	}
	if env.IdempotencyKey != redactedValue || d.Headers[wire.HeaderIdempotencyKey] != redactedValue {
		t.Fatalf("idempotency key leaked: envelope %q header %v", env.IdempotencyKey, d.Headers[wire.HeaderIdempotencyKey])
	}
	if got := testutil.ToFloat64(b.consumer.metrics.reconnects); got != 0 {
		t.Fatalf("the runtime reconnected %v times: the connection was lost", got)
	}
}

// redactedValue is what the quarantine's redaction writes in place of a
// value.
const redactedValue = "[redacted]"
