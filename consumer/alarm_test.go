package consumer

import (
	"context"
	"fmt"
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/config"
	"github.com/dlxbridge/dlxbridge/internal/amqpx"
	"github.com/dlxbridge/dlxbridge/internal/brokertest"
)

// During a memory alarm the broker reads nothing from a connection that
// publishes, so retries and quarantines can't be parked. The runtime must
// stall safely (hold what it can't park, ack nothing of it), stop within
// DrainTimeout of cancel even so, and a fresh Run after the alarm clears
// must account for every message: handled, or in the quarantine.
func TestResourceAlarmStallsSafelyAndStopsInTime(t *testing.T) {
	if testing.Short() {
		t.Skip("resource alarm on a private broker node: skipped in -short")
	}
	const n = 60
	const concurrency = 3
	node := brokertest.StartPrivateNode(t)
	b := setupOn(t, node.Env(t), func(q *config.Queue) {
		q.Consumer.Prefetch = 10
		q.Consumer.Concurrency = concurrency
		// Handlers wait at the gate while the alarm is raised, which boots
		// rabbitmqctl's Erlang VM: seconds, and more under load. A handler
		// deadline there would settle the message (a retry published
		// before the alarm) instead of holding it into the alarm, so the
		// deadline is only a hang guard.
		q.Consumer.HandlerTimeout = 2 * time.Minute
		// Messages held at the stop are requeued with a raised delivery
		// count: leave room so none is mistaken for a crash loop.
		q.DeliveryLimit = 10
		q.Consumer.CrashLoopDeliveries = 8
	})
	b.cfg.DrainTimeout = 3 * time.Second
	// If Run hangs (the defect), the alarm must still clear at the end so
	// that it returns and nothing outlives the test.
	alarmOn := false
	t.Cleanup(func() {
		if alarmOn {
			node.ClearMemoryAlarm()
		}
	})

	l := newFaultLedger()
	blocked := make(chan bool, 16)
	b.cfg.hooks.blocked = func(active bool) { blocked <- active }
	var mu sync.Mutex
	outcomes := map[Outcome]int{}
	b.cfg.OnSettled = func(s Settled) {
		mu.Lock()
		outcomes[s.Outcome]++
		mu.Unlock()
		l.notify()
	}
	// held is how many failed deliveries (each needs a retry or quarantine
	// publish) are neither parked (retried, quarantined) nor given back
	// (requeued, abandoned): a worker holds each, waiting to publish. Called
	// with l.mu held.
	held := func() int {
		mu.Lock()
		defer mu.Unlock()
		return l.failed - outcomes[OutcomeRetried] - outcomes[OutcomeQuarantined] - outcomes[OutcomeRequeued] - outcomes[OutcomeAbandoned]
	}

	l.closeGateAt(0) // every handler parks until the alarm is on
	register := func(c *Consumer) {
		must(t, c.Handle(b.queue.Name, testType, l.handler(0)))
	}
	stop := b.start(register)
	for i := range n {
		id := fmt.Sprintf("m-%04d", i)
		b.publishJSON(map[string]any{"id": id}, amqp.Publishing{MessageId: id})
	}
	parked := 0
	if !l.waitFor(func() bool { parked = l.parked; return parked >= concurrency }, 30*time.Second) {
		t.Fatalf("only %d handlers reached the gate, want %d", parked, concurrency)
	}

	node.RaiseMemoryAlarm()
	alarmOn = true
	l.openGate()
	select {
	case active := <-blocked:
		if !active {
			t.Fatal("the publishing connection was unblocked, want blocked")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the runtime's publishing connection was not blocked by the alarm")
	}
	if g := testutil.ToFloat64(b.consumer.metrics.publishingBlocked.WithLabelValues(b.queue.Name)); g != 1 {
		t.Errorf("dlxbridge_publishing_blocked %v during the alarm, want 1", g)
	}
	// Stalled: every worker holds a failed delivery it can't park.
	stalled := 0
	if !l.waitFor(func() bool { stalled = held(); return stalled >= concurrency }, 30*time.Second) {
		t.Fatalf("%d workers hold a failed delivery, want all %d", stalled, concurrency)
	}
	mu.Lock()
	during := maps.Clone(outcomes)
	mu.Unlock()
	t.Logf("stalled during the alarm: %d handler successes, outcomes %v", l.successCount(), during)

	cancelled := time.Now()
	stop()
	took := time.Since(cancelled)
	t.Logf("Run returned %s after cancel (DrainTimeout %s)", took.Round(time.Millisecond), b.cfg.DrainTimeout)
	// Past DrainTimeout the stop waits at most abandonGrace (and 250 ms) for
	// the workers, then closes the consume channel and the connection, each
	// waiting at most amqpx.CloseTimeout for a close-ok, which a loaded
	// broker can take (seen: 1.5 s past DrainTimeout on a busy 2-core
	// machine). A Run held by the alarm (the defect) returns only after it
	// clears, which this test does after the check.
	if limit := b.cfg.DrainTimeout + abandonGrace + 250*time.Millisecond + 2*amqpx.CloseTimeout + time.Second; took > limit {
		t.Errorf("Run returned %s after cancel during the alarm, want within %s", took.Round(time.Millisecond), limit)
	}
	mu.Lock()
	if got := outcomes[OutcomeAbandoned] + outcomes[OutcomeRequeued]; got < concurrency {
		t.Errorf("%d held deliveries were given back at the stop, want at least %d (outcomes %v)", got, concurrency, outcomes)
	}
	mu.Unlock()

	// The session ended while blocked: nothing publishes now.
	if g := testutil.ToFloat64(b.consumer.metrics.publishingBlocked.WithLabelValues(b.queue.Name)); g != 0 {
		t.Errorf("dlxbridge_publishing_blocked %v after Run returned, want 0", g)
	}
	node.ClearMemoryAlarm()
	alarmOn = false

	// A fresh Run drains everything.
	b.cfg.Registerer = prometheus.NewRegistry()
	b.start(register)
	qctx, qcancel := context.WithCancel(context.Background())
	qDone := make(chan error, 1)
	go func() {
		qDone <- readQuarantine(qctx, b.env.URL, b.env.Prefix+"/quarantine-reader", b.wq.Quarantine, l)
	}()
	accounted := l.waitFor(func() bool { return len(l.accounted) == n }, 60*time.Second)
	qcancel()
	if err := <-qDone; err != nil {
		t.Errorf("quarantine reader: %v", err)
	}

	l.mu.Lock()
	defer l.mu.Unlock()
	var missing, permNotQuarantined []string
	dups := 0
	for i := range n {
		id := fmt.Sprintf("m-%04d", i)
		s, q := l.successes[id], l.quarantined[id]
		if s == 0 && q == 0 {
			missing = append(missing, id)
		}
		if s+q > 1 {
			dups++
		}
		if faultKind(i) == "permanent" && q == 0 {
			permNotQuarantined = append(permNotQuarantined, id)
		}
	}
	mu.Lock()
	t.Logf("after the alarm: %d handler calls, %d ids succeeded, %d quarantined, %d duplicates (at-least-once); outcomes %v",
		l.nCalls, countNonZero(l.successes), countNonZero(l.quarantined), dups, outcomes)
	mu.Unlock()
	if !accounted || len(missing) > 0 {
		t.Errorf("LOST %d of %d messages (neither handled successfully nor quarantined): %v", len(missing), n, missing)
	}
	if len(permNotQuarantined) > 0 {
		t.Errorf("%d permanent failures are not in the quarantine: %v", len(permNotQuarantined), permNotQuarantined)
	}
}
