package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/config"
	"github.com/dlxbridge/dlxbridge/internal/brokertest"
	"github.com/dlxbridge/dlxbridge/triage"
)

// Probes that panic, or whose handler ignores its deadline and is
// abandoned, free their probe slot: the breaker neither holds forever nor
// loses a message, and closes once a probe succeeds.
func TestBreakerProbePanicOrAbandonedDoesNotWedge(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		probe func(ctx context.Context) error
	}{
		{"panic", func(context.Context) error { panic("probe boom") }},
		{"abandoned", func(context.Context) error { time.Sleep(2 * time.Second); return nil }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, func(q *config.Queue) {
				q.Consumer.Concurrency = 3
				q.Consumer.HandlerTimeout = 200 * time.Millisecond
				q.Retry.MaxAttempts = 5
				q.Breaker.MinOpen = 100 * time.Millisecond
				q.Breaker.MaxOpen = 400 * time.Millisecond
			})
			var closed atomic.Bool
			closedCh := make(chan struct{})
			b.cfg.hooks.breaker = func(_ string, tr triage.Transition) {
				t.Logf("%s", tr)
				if tr.To == triage.BreakerClosed && !closed.Swap(true) {
					close(closedCh)
				}
			}
			const n = 20
			var mu sync.Mutex
			calls, ok := 0, map[string]int{}
			// An abandoned probe outlives its worker: the leak check
			// must not see it. Its Add is made under mu, which the
			// cleanup takes before Wait: an abandoned probe may still
			// be running when the test ends, and an Add from zero with
			// nothing ordering it before the Wait is a race.
			var probes sync.WaitGroup
			t.Cleanup(func() {
				mu.Lock()
				defer mu.Unlock() // a probe takes mu only before its Add
				probes.Wait()
			})
			b.start(func(c *Consumer) {
				must(t, c.Handle(b.queue.Name, testType, HandlerFunc(func(ctx context.Context, m *Message) error {
					mu.Lock()
					calls++
					k := calls
					if k == 2 || k == 3 {
						probes.Add(1)
					}
					mu.Unlock()
					switch k {
					case 1:
						return triage.DependencyDown(0, errors.New("down"))
					case 2, 3: // the first probes
						defer probes.Done()
						return tc.probe(ctx)
					}
					mu.Lock()
					ok[m.MessageID]++
					mu.Unlock()
					return nil
				})))
			})
			for i := range n {
				b.publishJSON(map[string]any{"id": fmt.Sprint(i)}, amqp.Publishing{MessageId: fmt.Sprintf("m-%d", i)})
			}
			select {
			case <-closedCh:
			case <-time.After(20 * time.Second):
				t.Fatalf("breaker never closed: %+v", b.consumer.Breakers())
			}
			// Every message ends acked or (a panicking probe) quarantined.
			deadline := time.After(30 * time.Second)
			for final := 0; final < n; {
				select {
				case o := <-b.settled:
					if o == OutcomeAcked || o == OutcomeQuarantined {
						final++
					}
				case <-deadline:
					t.Fatalf("%d of %d settled for good; breakers %+v", final, n, b.consumer.Breakers())
				}
			}
			mu.Lock()
			defer mu.Unlock()
			for id, c := range ok {
				if c != 1 {
					t.Errorf("%s handled %d times", id, c)
				}
			}
		})
	}
}

// Many open → half-open → closed cycles, each a basic.cancel and a new
// basic.consume with acks in flight, with prefetch 1 and more workers than
// probes: every message is handled with success exactly once, none comes
// back redelivered (a delivery dropped after a cancel-ok would sit unacked
// and return only when the session ends), and nothing is left behind.
func TestBreakerManyCyclesLoseNothing(t *testing.T) {
	t.Parallel()
	for _, prefetch := range []int{1, 10} {
		t.Run(fmt.Sprint("prefetch=", prefetch), func(t *testing.T) {
			t.Parallel()
			b := setup(t, func(q *config.Queue) {
				q.Consumer.Prefetch = prefetch
				q.Consumer.Concurrency = 4
				q.Breaker.Probes = 2
				q.Retry.MaxAttempts = 10
				q.DeliveryLimit = 20
			})
			var opens atomic.Int32
			b.cfg.hooks.breaker = func(_ string, tr triage.Transition) {
				if tr.To == triage.BreakerOpen {
					opens.Add(1)
				}
			}
			const n = 200
			var mu sync.Mutex
			calls, ok, redelivered, failedIDs := 0, map[string]int{}, 0, map[string]bool{}
			b.cfg.Logger = slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelError}))
			done := make(chan struct{})
			b.start(func(c *Consumer) {
				must(t, c.Handle(b.queue.Name, testType, HandlerFunc(func(ctx context.Context, m *Message) error {
					mu.Lock()
					defer mu.Unlock()
					calls++
					if v, has := m.Headers["x-delivery-count"]; has && fmt.Sprint(v) != "0" {
						redelivered++
						t.Logf("%s attempt %d x-delivery-count %v (failed before: %v)", m.MessageID, m.Attempt, v, failedIDs[m.MessageID])
					}
					if calls%7 == 0 { // a short outage, every few calls
						failedIDs[m.MessageID] = true
						return triage.DependencyDown(time.Millisecond, errors.New("blip"))
					}
					ok[m.MessageID]++
					if len(ok) == n {
						select {
						case <-done:
						default:
							close(done)
						}
					}
					return nil
				})))
			})
			for i := range n {
				b.publishJSON(map[string]any{"id": fmt.Sprint(i)}, amqp.Publishing{MessageId: fmt.Sprintf("m-%d", i)})
			}
			select {
			case <-done:
			case <-time.After(60 * time.Second):
				mu.Lock()
				defer mu.Unlock()
				t.Fatalf("%d of %d handled after %d calls, %d opens; breakers %+v", len(ok), n, calls, opens.Load(), b.consumer.Breakers())
			}
			mu.Lock()
			defer mu.Unlock()
			t.Logf("%d calls, %d opens, %d redelivered", calls, opens.Load(), redelivered)
			for id, c := range ok {
				if c != 1 {
					t.Errorf("%s handled %d times", id, c)
				}
			}
			if redelivered != 0 {
				t.Errorf("%d deliveries came back with a raised x-delivery-count", redelivered)
			}
			if opens.Load() < 10 {
				t.Errorf("only %d opens; the test did not exercise the cycle", opens.Load())
			}
		})
	}
}

// A breaker whose queue goes quiet while it is open (the message that
// signalled was its last, and it went to the quarantine) must not report
// "open" forever: its period is over, so it is half-open, waiting for a
// probe. Before the fix its status, gauge and /readyz line kept saying
// "open, until <a time long past>".
func TestBreakerOfIdleQueueLeavesOpenWhenItsPeriodEnds(t *testing.T) {
	t.Parallel()
	b := setup(t, func(q *config.Queue) { q.Retry.MaxAttempts = 1 })
	trs := make(chan triage.Transition, 8)
	b.cfg.hooks.breaker = func(_ string, tr triage.Transition) { trs <- tr }
	b.start(func(c *Consumer) {
		must(t, c.Handle(b.queue.Name, testType, HandlerFunc(func(context.Context, *Message) error {
			return triage.DependencyDown(200*time.Millisecond, errors.New("503"))
		})))
	})
	b.publishJSON(map[string]any{"id": "a"}, amqp.Publishing{MessageId: "a"})
	b.waitOutcome(OutcomeQuarantined, 15*time.Second)
	for _, want := range []triage.BreakerState{triage.BreakerOpen, triage.BreakerHalfOpen} {
		select {
		case tr := <-trs:
			if tr.To != want {
				t.Fatalf("transition %s, want to %s", tr, want)
			}
		case <-time.After(10 * time.Second):
			st := b.consumer.Breakers()
			t.Fatalf("no transition to %s; breakers %+v (now %s)", want, st, time.Now().Format(time.RFC3339Nano))
		}
	}
	if s := b.consumer.Breakers(); s[0].State != triage.BreakerHalfOpen {
		t.Fatalf("breaker %+v, want half-open", s[0])
	}
	if g := testutil.ToFloat64(b.consumer.metrics.breakerState.WithLabelValues(b.queue.Name)); g != 1 {
		t.Fatalf("dlxbridge_breaker_state = %v, want 1 (half-open)", g)
	}
}

// The broker node dies while the breaker is open and deliveries are held
// (a private node, SIGKILLed, then started again): no held delivery
// reaches a handler on the dead channel (the broker requeues them; a
// handler called then would handle each twice), the breaker stays open
// across the reconnect, and the new session consumes nothing meanwhile.
func TestBreakerHoldingThroughNodeKill(t *testing.T) {
	if testing.Short() {
		t.Skip("fault injection on a private broker node: skipped in -short")
	}
	node := brokertest.StartPrivateNode(t)
	b := setupOn(t, node.Env(t), func(q *config.Queue) {
		q.Consumer.Concurrency = 1
		q.Retry.MaxAttempts = 5
		q.DeliveryLimit = 10
		q.Consumer.CrashLoopDeliveries = 8
	})
	opened := make(chan struct{}, 8)
	b.cfg.hooks.breaker = func(_ string, tr triage.Transition) {
		if tr.To == triage.BreakerOpen {
			opened <- struct{}{}
		}
	}
	var calls atomic.Int32
	const n = 6
	for i := range n {
		b.publishJSON(map[string]any{"id": fmt.Sprint(i)}, amqp.Publishing{MessageId: fmt.Sprintf("m-%d", i)})
	}
	b.start(func(c *Consumer) {
		must(t, c.Handle(b.queue.Name, testType, HandlerFunc(func(context.Context, *Message) error {
			calls.Add(1)
			return triage.DependencyDown(time.Minute, errors.New("down"))
		})))
	})
	select {
	case <-opened:
	case <-time.After(30 * time.Second):
		t.Fatal("the breaker did not open")
	}
	b.waitOutcome(OutcomeRetried, 15*time.Second)
	for len(b.consuming) > 0 {
		<-b.consuming
	}
	node.Kill()
	node.Start()
	b.waitConsumingWithin(90 * time.Second)
	if c := calls.Load(); c != 1 {
		t.Fatalf("handler called %d times; want 1 (held deliveries must not reach a handler on a dead channel)", c)
	}
	if s := b.consumer.Breakers(); s[0].State != triage.BreakerOpen {
		t.Fatalf("breaker %+v after the reconnect, want open", s[0])
	}
}
