package consumer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	amqp "github.com/rabbitmq/amqp091-go"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/dlxbridge/dlxbridge/config"
	"github.com/dlxbridge/dlxbridge/internal/wireval"
	"github.com/dlxbridge/dlxbridge/quarantine"
	"github.com/dlxbridge/dlxbridge/schemas"
	"github.com/dlxbridge/dlxbridge/triage"
	"github.com/dlxbridge/dlxbridge/wire"
)

// Immediate retries (queues[].retry.immediate_retries): a failed attempt
// is retried in process on the same delivery before it goes to a retry
// lane; each counts as an attempt.

// retriesPublished sums dlxbridge_retries_total over the queue's tiers:
// the delayed retries whose lane publish the broker confirmed.
func (b *testBundle) retriesPublished() float64 {
	var n float64
	for tier := range b.queue.Retry.Tiers {
		n += testutil.ToFloat64(b.consumer.metrics.retries.WithLabelValues(b.queue.Name, tierLabel(tier)))
	}
	return n
}

func (b *testBundle) immediateRetries() float64 {
	return testutil.ToFloat64(b.consumer.metrics.immediate.WithLabelValues(b.queue.Name))
}

// setupImmediate is a broker bundle whose queue retries immediate times in
// process, within maxAttempts attempts.
func setupImmediate(t *testing.T, immediate, maxAttempts int) *testBundle {
	t.Helper()
	return setup(t, func(q *config.Queue) {
		q.Retry.ImmediateRetries = immediate
		q.Retry.MaxAttempts = maxAttempts
	})
}

// headerAttempts is the bridge's attempt header a handler call saw, 0 if
// none.
func headerAttempts(m *Message) int64 {
	n, _ := wireval.Int(m.Headers[wire.HeaderAttempts])
	return n
}

// (a) A blip that passes on the next call never reaches the broker's retry
// path: attempt 2 runs in process and succeeds.
func TestImmediateRetrySucceedsWithoutARetryLane(t *testing.T) {
	t.Parallel()
	b := setup(t, func(q *config.Queue) { q.Retry.ImmediateRetries = 1 })
	rec := newRecorder()
	b.start(func(c *Consumer) {
		must(t, c.Handle(b.queue.Name, testType, HandlerFunc(func(ctx context.Context, m *Message) error {
			rec.record(m)
			// A handler that changes its data must not see the change on
			// its next call.
			v, err := m.Data()
			if err != nil {
				return triage.Permanent(err)
			}
			data := v.(map[string]any)
			if data["touched"] != nil {
				return triage.Permanent(errors.New("the retry saw the first call's change to Data"))
			}
			data["touched"] = true
			if m.Attempt == 1 {
				return errors.New("connection reset by peer")
			}
			return nil
		})))
	})
	b.publishJSON(map[string]any{"id": "i-1"}, amqp.Publishing{MessageId: "im-1"})
	b.waitOutcome(OutcomeAcked, 10*time.Second)

	if n := rec.count(); n != 2 {
		t.Fatalf("handler ran %d times, want 2", n)
	}
	for i, c := range rec.calls {
		if c.attempt != i+1 || headerAttempts(c.msg) != 0 || c.msg.MessageID != "im-1" {
			t.Errorf("call %d: attempt %d, attempt header %d, id %q; want attempt %d on the first delivery",
				i, c.attempt, headerAttempts(c.msg), c.msg.MessageID, i+1)
		}
	}
	if n := b.retriesPublished(); n != 0 {
		t.Errorf("%v delayed retries published, want none", n)
	}
	if n := b.immediateRetries(); n != 1 {
		t.Errorf("dlxbridge_immediate_retries_total = %v, want 1", n)
	}
	if got := testutil.ToFloat64(b.consumer.metrics.deliveries.WithLabelValues(b.queue.Name, string(OutcomeRetried))); got != 0 {
		t.Errorf("%v deliveries settled as retried, want 0", got)
	}
	for _, q := range []string{b.queue.Name, b.wq.Quarantine} {
		if d := b.queueDepth(q); d != 0 {
			t.Errorf("%s holds %d messages, want 0", q, d)
		}
	}
	for _, tier := range b.wq.Tiers {
		for _, l := range tier.Lanes {
			if d := b.queueDepth(l.Queue); d != 0 {
				t.Errorf("retry lane %s holds %d messages, want 0", l.Queue, d)
			}
		}
	}
}

// (b) Immediate and delayed retries share one attempt budget: with 2
// immediate retries and 5 attempts, the first delivery runs the handler 3
// times, its delayed retry carries attempt 3 and the first failure's time,
// the next delivery runs it twice, and the quarantine says 5.
func TestImmediateRetriesCountTowardTheAttemptBudget(t *testing.T) {
	t.Parallel()
	b := setupImmediate(t, 2, 5)
	rec := newRecorder()
	b.start(func(c *Consumer) {
		must(t, c.Handle(b.queue.Name, testType, HandlerFunc(func(ctx context.Context, m *Message) error {
			rec.record(m)
			return errors.New("still down")
		})))
	})
	b.publishJSON(map[string]any{"id": "i-2"}, amqp.Publishing{MessageId: "im-2"})
	b.waitOutcome(OutcomeRetried, 10*time.Second)
	b.waitOutcome(OutcomeQuarantined, 10*time.Second)

	if n := rec.count(); n != 5 {
		t.Fatalf("handler ran %d times, want 5", n)
	}
	// Calls 1-3 are the first delivery (no attempt header); 4 and 5 the
	// delayed retry's, which carries the 3 failed attempts.
	wantHeader := []int64{0, 0, 0, 3, 3}
	for i, c := range rec.calls {
		if c.attempt != i+1 || headerAttempts(c.msg) != wantHeader[i] {
			t.Errorf("call %d: attempt %d, attempt header %d; want %d, %d", i, c.attempt, headerAttempts(c.msg), i+1, wantHeader[i])
		}
	}
	env, ok := quarantine.Read(ptr(b.quarantined()))
	if !ok {
		t.Fatal("no envelope")
	}
	if env.Attempts != 5 || env.Class != triage.ClassTransient || !strings.Contains(env.Reason, "attempt budget exhausted (5/5)") {
		t.Errorf("envelope: attempts %d, class %q, reason %q; want 5, transient, budget exhausted", env.Attempts, env.Class, env.Reason)
	}
	// The first failure is the first call's, not the delayed retry's
	// publish after the third: the time budget runs from it.
	if !env.FirstFailureAt.Before(rec.calls[1].at) {
		t.Errorf("first failure at %s, after the second call began (%s)", env.FirstFailureAt, rec.calls[1].at)
	}
	if n := b.immediateRetries(); n != 3 {
		t.Errorf("dlxbridge_immediate_retries_total = %v, want 3 (2 on the first delivery, 1 on the second)", n)
	}
	if n := b.retriesPublished(); n != 1 {
		t.Errorf("%v delayed retries published, want 1", n)
	}
}

// (c) A handler abandoned past its deadline still runs and holds its
// concurrency slot: its delivery goes to a delayed retry, never an
// immediate one.
func TestAbandonedHandlerIsNotRetriedImmediately(t *testing.T) {
	t.Parallel()
	b := setup(t, func(q *config.Queue) {
		q.Retry.ImmediateRetries = 2
		q.Consumer.HandlerTimeout = 50 * time.Millisecond
	})
	release := make(chan struct{})
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})
	rec := newRecorder()
	reasons := make(chan string, 16)
	b.cfg.OnSettled = func(s Settled) {
		reasons <- s.Reason
		b.settled <- s.Outcome
	}
	b.start(func(c *Consumer) {
		must(t, c.Handle(b.queue.Name, testType, HandlerFunc(func(ctx context.Context, m *Message) error {
			rec.record(m)
			if m.Attempt == 1 {
				<-release // ignores its deadline
			}
			return nil
		})))
	})
	b.publishJSON(map[string]any{"id": "i-3"}, amqp.Publishing{MessageId: "im-3"})
	b.waitOutcome(OutcomeRetried, 10*time.Second)
	if r := <-reasons; !strings.Contains(r, "not retried in process: the handler was abandoned past its deadline") {
		t.Errorf("reason %q does not say why the retry waits", r)
	}
	close(release)
	b.waitOutcome(OutcomeAcked, 10*time.Second)

	if n := rec.count(); n != 2 {
		t.Fatalf("handler ran %d times, want 2", n)
	}
	if c := rec.calls[1]; c.attempt != 2 || headerAttempts(c.msg) != 1 {
		t.Errorf("second call: attempt %d, attempt header %d; want 2 from a delayed retry carrying 1", c.attempt, headerAttempts(c.msg))
	}
	if n := b.immediateRetries(); n != 0 {
		t.Errorf("dlxbridge_immediate_retries_total = %v, want 0", n)
	}
	if got := testutil.ToFloat64(b.consumer.metrics.abandonedHandler.WithLabelValues(b.queue.Name)); got != 1 {
		t.Errorf("abandoned handlers = %v, want 1", got)
	}
}

// (d) A permanent failure is quarantined after its one call; a panic waits
// for a delayed retry.
func TestPermanentAndPanicAreNotRetriedImmediately(t *testing.T) {
	t.Parallel()
	b := setup(t, func(q *config.Queue) { q.Retry.ImmediateRetries = 3 })
	rec := newRecorder()
	b.start(func(c *Consumer) {
		must(t, c.Handle(b.queue.Name, testType, HandlerFunc(func(ctx context.Context, m *Message) error {
			rec.record(m)
			switch {
			case m.MessageID == "im-perm":
				return triage.Permanent(errors.New("unknown customer"))
			case m.Attempt == 1:
				panic("nil map in the handler")
			}
			return nil
		})))
	})
	b.publishJSON(map[string]any{"id": "i-4"}, amqp.Publishing{MessageId: "im-perm"})
	b.waitOutcome(OutcomeQuarantined, 10*time.Second)
	if n := rec.count(); n != 1 {
		t.Fatalf("permanent: handler ran %d times, want 1", n)
	}
	env, _ := quarantine.Read(ptr(b.quarantined()))
	if env.Attempts != 1 || env.Class != triage.ClassPermanent {
		t.Errorf("permanent: envelope attempts %d class %q, want 1, permanent", env.Attempts, env.Class)
	}

	b.publishJSON(map[string]any{"id": "i-5"}, amqp.Publishing{MessageId: "im-panic"})
	b.waitOutcome(OutcomeRetried, 10*time.Second)
	b.waitOutcome(OutcomeAcked, 10*time.Second)
	if n := rec.count(); n != 3 {
		t.Fatalf("panic: handler ran %d times in all, want 3", n)
	}
	if c := rec.calls[2]; c.attempt != 2 || headerAttempts(c.msg) != 1 {
		t.Errorf("after the panic: attempt %d, attempt header %d; want 2 from a delayed retry carrying 1", c.attempt, headerAttempts(c.msg))
	}
	if n := b.immediateRetries(); n != 0 {
		t.Errorf("dlxbridge_immediate_retries_total = %v, want 0", n)
	}
}

// The breaker's count sees every call, immediate retries included, and once
// it opens the delivery goes to a delayed retry: calling the dependency
// again at once is what the pause is for avoiding.
func TestOpenBreakerEndsImmediateRetries(t *testing.T) {
	t.Parallel()
	b := setup(t, func(q *config.Queue) {
		q.Retry.ImmediateRetries = 3
		q.Breaker.ConsecutiveFailures = 2
		q.Breaker.MinOpen = time.Minute // stays open for the rest of the test
	})
	rec := newRecorder()
	b.start(func(c *Consumer) {
		must(t, c.Handle(b.queue.Name, testType, HandlerFunc(func(ctx context.Context, m *Message) error {
			rec.record(m)
			return errors.New("dependency unreachable")
		})))
	})
	b.publishJSON(map[string]any{"id": "i-6"}, amqp.Publishing{MessageId: "im-6"})
	b.waitOutcome(OutcomeRetried, 10*time.Second)
	if n := rec.count(); n != 2 {
		t.Fatalf("handler ran %d times before the delayed retry, want 2 (the second call opened the breaker)", n)
	}
	if n := b.immediateRetries(); n != 1 {
		t.Errorf("dlxbridge_immediate_retries_total = %v, want 1", n)
	}
	if st := b.consumer.Breakers(); len(st) != 1 || st[0].State != triage.BreakerOpen {
		t.Errorf("breakers %+v, want the queue's open", st)
	}
}

// The delivery's one consumer span records each immediate retry as an
// event, and ends with the attempt that settled it.
func TestImmediateRetryIsASpanEvent(t *testing.T) {
	t.Parallel()
	b := setup(t, func(q *config.Queue) { q.Retry.ImmediateRetries = 2 })
	exp := tracetest.NewInMemoryExporter()
	ended := &endSignal{consumerSpans: make(chan struct{}, 64)}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp), sdktrace.WithSpanProcessor(ended))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	b.cfg.TracerProvider = tp
	b.start(func(c *Consumer) {
		must(t, c.Handle(b.queue.Name, testType, HandlerFunc(func(ctx context.Context, m *Message) error {
			if m.Attempt < 3 {
				return errors.New("blip")
			}
			return nil
		})))
	})
	b.publishJSON(map[string]any{"id": "i-7"}, amqp.Publishing{MessageId: "im-7"})
	b.waitOutcome(OutcomeAcked, 10*time.Second)
	select {
	case <-ended.consumerSpans:
	case <-time.After(10 * time.Second):
		t.Fatal("the consumer span did not end")
	}
	var spans []sdktrace.ReadOnlySpan
	for _, s := range exp.GetSpans().Snapshots() {
		if s.SpanKind() == trace.SpanKindConsumer {
			spans = append(spans, s)
		}
	}
	if len(spans) != 1 {
		t.Fatalf("%d consumer spans, want 1", len(spans))
	}
	var attempts []int64
	for _, e := range spans[0].Events() {
		if e.Name != "dlxbridge.immediate_retry" {
			continue
		}
		for _, kv := range e.Attributes {
			if kv.Key == "dlxbridge.attempt" {
				attempts = append(attempts, kv.Value.AsInt64())
			}
		}
	}
	if len(attempts) != 2 || attempts[0] != 1 || attempts[1] != 2 {
		t.Errorf("immediate retry events for failed attempts %v, want [1 2]", attempts)
	}
	for _, kv := range spans[0].Attributes() {
		if kv.Key == "dlxbridge.attempt" && kv.Value.AsInt64() != 3 {
			t.Errorf("span attempt %d, want 3", kv.Value.AsInt64())
		}
	}
}

// Without a broker (the process bundle): the rules the runtime adds to
// triage's.

func immediateRetries(n int) func(*Config) {
	return func(c *Config) { c.File.Queues[0].Retry.ImmediateRetries = n }
}

// A timeout whose handler returned (it honoured its deadline) is retried in
// process, with a fresh deadline: only an abandoned one is not.
func TestReturnedTimeoutIsRetriedImmediately(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	b := newProcessBundle(t, func(c *Config) {
		immediateRetries(1)(c)
		handlerTimeout(20 * time.Millisecond)(c)
	}, func(ctx context.Context, m *Message) error {
		calls.Add(1)
		if m.Attempt == 1 {
			<-ctx.Done()
			return ctx.Err()
		}
		return ctx.Err() // nil: a fresh deadline
	})
	b.w.handle(b.delivery())
	if st := b.waitSettled(t); st.Outcome != OutcomeAcked || st.Attempt != 2 || calls.Load() != 2 {
		t.Fatalf("settled %s at attempt %d after %d calls; want acked at attempt 2 after 2", st.Outcome, st.Attempt, calls.Load())
	}
}

// A stopping runtime, or a handler that signals its dependency is down,
// takes the retry lane at once; the reason says why.
func TestImmediateRetryBlockedByStopAndDependencySignal(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name, why string
		stop      bool
		err       error
	}{
		{"stopping", "the runtime is stopping", true, errors.New("blip")},
		{"dependency down", "the handler signalled its dependency is down", false, triage.DependencyDown(0, errors.New("503"))},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var calls atomic.Int32
			b := newProcessBundle(t, immediateRetries(2), func(ctx context.Context, m *Message) error {
				calls.Add(1)
				return tt.err
			})
			if tt.stop {
				// As beginStop and the cancel-ok leave it.
				close(b.w.s.stopping)
				close(b.w.s.cancelled)
			}
			b.w.handle(b.delivery())
			st := b.waitSettled(t)
			if st.Outcome != OutcomeRetried || calls.Load() != 1 || !strings.Contains(st.Reason, "not retried in process: "+tt.why) {
				t.Fatalf("settled %s after %d calls, reason %q; want retried after 1, saying %q", st.Outcome, calls.Load(), st.Reason, tt.why)
			}
		})
	}
}

// Immediate retries hold the delivery unacked: once another call could
// hold it past maxHold (the broker's consumer_timeout closes the channel
// and requeues every delivery on it), the failure takes a retry lane. The
// clock moves 6 minutes per call: the second call's failure, 12 minutes in,
// is not retried in process.
func TestImmediateRetriesStopBeforeTheConsumerTimeout(t *testing.T) {
	t.Parallel()
	// Nothing prefetched behind it: only the delivery's own hold.
	b, calls := clockedRetries(t, 3, 0, 1, 1, 6*time.Minute)
	b.w.handle(b.delivery())
	st := b.waitSettled(t)
	if st.Outcome != OutcomeRetried || calls.Load() != 2 || !strings.Contains(st.Reason, "consumer_timeout") {
		t.Fatalf("settled %s after %d calls, reason %q; want retried after 2, naming the consumer_timeout", st.Outcome, calls.Load(), st.Reason)
	}
}

// clockedRetries is a process bundle whose handler fails and moves the
// runtime's clock step forward on each call, with immediate retries, and
// max attempts (0: the default), prefetch and concurrency set.
func clockedRetries(t *testing.T, immediate, maxAttempts, prefetch, concurrency int, step time.Duration) (*processBundle, *atomic.Int32) {
	var calls atomic.Int32
	var clock atomic.Int64
	t0 := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)
	b := newProcessBundle(t, func(c *Config) {
		immediateRetries(immediate)(c)
		q := &c.File.Queues[0]
		if maxAttempts > 0 {
			q.Retry.MaxAttempts = maxAttempts
		}
		q.Consumer.Prefetch, q.Consumer.Concurrency = prefetch, concurrency
		c.Now = func() time.Time { return t0.Add(time.Duration(clock.Load())) }
	}, func(ctx context.Context, m *Message) error {
		calls.Add(1)
		clock.Add(int64(step))
		return errors.New("blip")
	})
	return b, &calls
}

// A handler that writes into Body and then fails must not change what the
// next immediate call binds (the text the gate validated) nor what the
// quarantine keeps (the payload as received): each call gets its own copy.
// With the body shared, the second call bound the first call's bytes, which
// no gate had checked.
func TestImmediateRetryDoesNotSeeBytesTheHandlerWrote(t *testing.T) {
	t.Parallel()
	b := setupImmediate(t, 1, 2)
	var calls atomic.Int32
	bound := make(chan string, 2)
	b.start(func(c *Consumer) {
		must(t, c.Handle(b.queue.Name, testType, HandlerFunc(func(ctx context.Context, m *Message) error {
			var v struct {
				ID string `json:"id"`
			}
			if err := m.Bind(&v); err != nil {
				bound <- "bind: " + err.Error()
			} else {
				bound <- v.ID
			}
			if calls.Add(1) == 1 {
				// Same length, so the text the gate validated would be
				// overwritten in place: a different id.
				copy(m.Body, bytes.ReplaceAll(m.Body, []byte("body-1"), []byte("evil-1")))
			}
			return errors.New("connection reset by peer")
		})))
	})
	sent := b.publishJSON(map[string]any{"id": "body-1"}, amqp.Publishing{MessageId: "im-body"})
	b.waitOutcome(OutcomeQuarantined, 10*time.Second)

	for call := 1; call <= 2; call++ {
		if got := <-bound; got != "body-1" {
			t.Errorf("call %d bound id %q, want body-1", call, got)
		}
	}
	if q := b.quarantined(); !bytes.Equal(q.Body, sent) {
		t.Errorf("quarantined body %q, want the body as published %q", q.Body, sent)
	}
}

// A handler that writes into a table or an array nested in Headers (Headers
// is a copy, but a shallow one) and then fails must not change what the next
// immediate call reads nor what the quarantine keeps as received. With the
// nested values shared, the second call read the first call's writes and the
// quarantine published them as the producer's headers.
func TestImmediateRetryDoesNotSeeHeadersTheHandlerWrote(t *testing.T) {
	t.Parallel()
	b := setupImmediate(t, 1, 2)
	var calls atomic.Int32
	seen := make(chan string, 2)
	b.start(func(c *Consumer) {
		must(t, c.Handle(b.queue.Name, testType, HandlerFunc(func(ctx context.Context, m *Message) error {
			meta, _ := m.Headers["meta"].(amqp.Table)
			list, _ := m.Headers["list"].([]any)
			raw, _ := m.Headers["raw"].([]byte)
			if meta == nil || len(list) != 1 || len(raw) != 3 {
				seen <- fmt.Sprintf("headers %v", m.Headers)
				return errors.New("connection reset by peer")
			}
			seen <- fmt.Sprintf("%v %v %s", meta["tenant"], list[0], raw)
			if calls.Add(1) == 1 {
				meta["tenant"] = "evil"
				list[0] = "evil"
				copy(raw, "bad")
			}
			return errors.New("connection reset by peer")
		})))
	})
	b.publishJSON(map[string]any{"id": "h-1"}, amqp.Publishing{MessageId: "im-headers", Headers: amqp.Table{
		"meta": amqp.Table{"tenant": "acme"},
		"list": []any{"first"},
		"raw":  []byte("abc"),
	}})
	b.waitOutcome(OutcomeQuarantined, 10*time.Second)

	for call := 1; call <= 2; call++ {
		if got := <-seen; got != "acme first abc" {
			t.Errorf("call %d saw %q, want %q", call, got, "acme first abc")
		}
	}
	q := b.quarantined()
	meta, _ := q.Headers["meta"].(amqp.Table)
	list, _ := q.Headers["list"].([]any)
	if meta["tenant"] != "acme" || len(list) != 1 || list[0] != "first" {
		t.Errorf("quarantined headers meta=%v list=%v, want the ones published", meta, list)
	}
	// 4.0.5 may hand a byte array back as a string.
	if raw := fmt.Sprint(q.Headers["raw"]); raw != "abc" && raw != fmt.Sprint([]byte("abc")) {
		t.Errorf("quarantined raw header %v, want abc", q.Headers["raw"])
	}
}

// In report mode a handler that writes into GateError (say, to drop a
// violation it tolerates) and then fails must not change the objection the
// next immediate call gets: the gate's objection is the gate's, not a
// previous call's.
func TestImmediateRetryDoesNotSeeAGateErrorTheHandlerWrote(t *testing.T) {
	t.Parallel()
	b := setup(t, func(q *config.Queue) {
		q.Gate = config.GateReport
		q.Retry.ImmediateRetries = 1
		q.Retry.MaxAttempts = 2
	})
	var calls atomic.Int32
	seen := make(chan string, 2)
	b.start(func(c *Consumer) {
		must(t, c.Handle(b.queue.Name, testType, HandlerFunc(func(ctx context.Context, m *Message) error {
			ge := m.GateError
			if ge == nil || len(ge.Violations) == 0 {
				seen <- fmt.Sprintf("gate error %v", ge)
				return errors.New("connection reset by peer")
			}
			seen <- fmt.Sprintf("%s %d %s", ge.Reason, len(ge.Violations), ge.Violations[0].Pointer)
			if calls.Add(1) == 1 {
				ge.Reason = "evil"
				ge.Violations[0].Pointer = "/evil"
				ge.Violations = ge.Violations[:0]
			}
			return errors.New("connection reset by peer")
		})))
	})
	b.publish([]byte(`{"id": 42}`), amqp.Publishing{MessageId: "im-gate-error"})
	b.waitOutcome(OutcomeQuarantined, 10*time.Second)

	first := <-seen
	if !strings.HasPrefix(first, string(schemas.ReasonInvalid)+" ") {
		t.Fatalf("call 1 saw %q, want an invalid-message objection", first)
	}
	if second := <-seen; second != first {
		t.Errorf("call 2 saw %q, want the gate's objection %q", second, first)
	}
}

// The deliveries prefetched behind one that is retried in process wait,
// unacked, meanwhile: with prefetch 20 and concurrency 4, five can wait for
// a worker, and a delivery is retried in process for at most a fifth of
// maxHold (2 minutes); the last of the five then waits at most maxHold
// more, not (immediate retries + 1) handler timeouts each. Without the
// share, a handler failing every minute was called 20 times on one
// delivery.
func TestImmediateRetriesLeaveTimeForTheDeliveriesBehind(t *testing.T) {
	t.Parallel()
	wantRetriedAfter(t, 20, 4, time.Minute, 2, 5)
}

// wantRetriedAfter runs a delivery whose handler fails every time and
// moves the clock by step, and fails the test unless it goes to a retry
// lane after calls calls, naming perWorker deliveries waiting per worker.
func wantRetriedAfter(t *testing.T, prefetch, concurrency int, step time.Duration, calls int32, perWorker int) {
	t.Helper()
	b, n := clockedRetries(t, 19, 20, prefetch, concurrency, step)
	b.w.handle(b.delivery())
	st := b.waitSettled(t)
	if st.Outcome != OutcomeRetried || n.Load() != calls || !strings.Contains(st.Reason, fmt.Sprintf("%d per worker", perWorker)) {
		t.Fatalf("settled %s after %d calls, reason %q; want retried after %d, naming the %d deliveries per worker", st.Outcome, n.Load(), st.Reason, calls, perWorker)
	}
}

// The share of maxHold bounds what a call could add, not only what was
// spent: with prefetch 2000 and one worker each delivery gets 300 ms, and
// a handler that fails at once would otherwise be called again, and each
// such call can last its handler_timeout (30 s): 2000 of them, hours past
// the broker's consumer_timeout, for the last delivery waiting.
func TestImmediateRetriesCountTheCallTheyMake(t *testing.T) {
	t.Parallel()
	wantRetriedAfter(t, 2000, 1, time.Millisecond, 1, 2000)
}

// Under a large prefetch a delivery's share of maxHold is short (prefetch
// 200, one worker: 3 s), and a handler that fails at once still gets its
// immediate retry, with a deadline cut to what is left of the share less
// the abandonment grace (about 2 s), not its 30 s handler timeout.
func TestImmediateRetryDeadlineIsTheShareLeft(t *testing.T) {
	t.Parallel()
	deadlines := make(chan time.Duration, 4)
	b := newProcessBundle(t, func(c *Config) {
		immediateRetries(1)(c)
		q := &c.File.Queues[0]
		q.Consumer.Prefetch, q.Consumer.Concurrency, q.Consumer.HandlerTimeout = 200, 1, 30*time.Second
	}, func(ctx context.Context, m *Message) error {
		dl, _ := ctx.Deadline()
		deadlines <- time.Until(dl)
		if m.Attempt == 1 {
			return errors.New("blip")
		}
		return nil
	})
	b.w.handle(b.delivery())
	if st := b.waitSettled(t); st.Outcome != OutcomeAcked {
		t.Fatalf("settled %s (%s), want acked on the immediate retry", st.Outcome, st.Reason)
	}
	first, second := <-deadlines, <-deadlines
	if first < 29*time.Second || second > 2*time.Second || second < time.Second {
		t.Errorf("deadlines %s then %s; want the 30s handler timeout, then at most the 2s left of the 3s share", first, second)
	}
}

// A cut deadline never falls on the last attempt: a handler that needs
// more than what is left of the share (here about 2 s of a 3 s share)
// would time out there and quarantine a message a retry lane, with the
// full handler timeout, would handle. With max_attempts 2 the second
// attempt is the last: it goes to a retry lane. (Found by a reviewer: the
// cut call timed out and the message was quarantined, budget exhausted.)
func TestImmediateRetryNeverCutsTheLastAttempt(t *testing.T) {
	t.Parallel()
	b := newProcessBundle(t, func(c *Config) {
		immediateRetries(1)(c)
		q := &c.File.Queues[0]
		q.Retry.MaxAttempts = 2
		q.Consumer.Prefetch, q.Consumer.Concurrency, q.Consumer.HandlerTimeout = 200, 1, 30*time.Second
	}, func(ctx context.Context, m *Message) error {
		return errors.New("blip")
	})
	b.w.handle(b.delivery())
	st := b.waitSettled(t)
	if st.Outcome != OutcomeRetried || !strings.Contains(st.Reason, "the next attempt is the last") {
		t.Fatalf("settled %s (%s), want a delayed retry: the last attempt keeps its full deadline", st.Outcome, st.Reason)
	}
}
