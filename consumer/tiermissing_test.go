package consumer

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/config"
	"github.com/dlxbridge/dlxbridge/internal/amqpx"
	"github.com/dlxbridge/dlxbridge/internal/brokertest"
	"github.com/dlxbridge/dlxbridge/internal/frame"
	"github.com/dlxbridge/dlxbridge/quarantine"
	"github.com/dlxbridge/dlxbridge/topology"
	"github.com/dlxbridge/dlxbridge/triage"
	"github.com/dlxbridge/dlxbridge/wire"
)

// A retry whose tier queue was deleted (by hand, or a `topology delete`
// of another config), or is there but unbound from the retry exchange, is
// returned by the broker: no queue would hold it. The message is
// quarantined at once, its handler called once, with a reason that names
// the queue, the binding and the command that restores them (the queue
// alone would send whoever finds it in its place looking elsewhere); not
// requeued until the crash-loop guard quarantines it as a crash loop
// (which runs the handler again at every delivery and says nothing of the
// cause). The metric names the missing queue too, and the record is the
// runtime's own (verified, the handler's class, one attempt). Once
// `topology apply` restores the tier, the same consumer, not restarted,
// retries through it again. The same for a queue's own lanes.
func TestARetryToAMissingTierQueueIsQuarantinedNamingIt(t *testing.T) {
	t.Parallel()
	for _, layout := range []string{config.TierQueuesShared, config.TierQueuesPerQueue} {
		for _, how := range []string{"deleted", "unbound"} {
			t.Run(layout+"/"+how, func(t *testing.T) {
				t.Parallel()
				retryToAMissingTierQueue(t, layout, how)
			})
		}
	}
}

func retryToAMissingTierQueue(t *testing.T, layout, how string) {
	env := brokertest.Require(t)
	w := newSharedWorld(t, env, func(q *config.Queue) { q.Retry.TierQueues = layout }, "m")
	m := w.queue("m")
	wq := w.topo.Work[0]
	lane := wq.Tiers[0].Lanes[0]
	ch := env.Channel("break")
	var err error
	if how == "deleted" {
		_, err = ch.QueueDelete(lane.Queue, false, false, false)
	} else {
		err = ch.QueueUnbind(lane.Queue, lane.RoutingKey, wq.RetryExchange, nil)
	}
	if err != nil {
		t.Fatal(err)
	}
	calls := make(chan arrival, 64)
	var c *Consumer
	settled, _ := w.run([]string{"m"}, func(cc *Consumer) { c = cc; failOnce(calls, m.Name)(cc) })
	next := func(id string) Settled {
		t.Helper()
		for deadline := time.After(20 * time.Second); ; {
			select {
			case s := <-settled:
				if s.MessageID == id {
					return s
				}
			case <-deadline:
				t.Fatalf("%s not settled", id)
			}
		}
	}
	w.publish("m", "m-1", nil)

	first := waitArrival(t, calls, 15*time.Second)
	if first.attempt != 1 {
		t.Fatalf("first call: %+v", first)
	}
	s := next("m-1")
	if s.Outcome != OutcomeQuarantined || s.Class == triage.ClassCrashLoop {
		t.Fatalf("settled as %s (class %s, reason %q, settle error %v), want quarantined at once, not requeued into a crash loop", s.Outcome, s.Class, s.Reason, s.SettleErr)
	}
	for _, want := range []string{
		"retry tier queue " + lane.Queue + " is missing",
		"or not bound to exchange " + wq.RetryExchange + " with key " + lane.RoutingKey,
		"dlxbridge topology apply",
	} {
		if !strings.Contains(s.Reason, want) {
			t.Errorf("reason %q does not say %q", s.Reason, want)
		}
	}
	if n := testutil.ToFloat64(c.metrics.retryQueueMissing.WithLabelValues(m.Name, lane.Queue)); n != 1 {
		t.Errorf("dlxbridge_retry_queue_missing_total{queue=%s,retry_queue=%s} = %v, want 1", m.Name, lane.Queue, n)
	}
	// Every retry queue's series was there at 0 before its first event.
	if n, want := testutil.CollectAndCount(c.metrics.retryQueueMissing), len(retryQueues(&w.topo.Work[0])); n != want {
		t.Errorf("dlxbridge_retry_queue_missing_total has %d series, want one per retry queue (%d)", n, want)
	}
	select {
	case a := <-calls:
		t.Fatalf("the handler ran again: %+v", a)
	case <-time.After(500 * time.Millisecond): // a requeue would be redelivered well within this
	}

	// The record in the queue's quarantine says it too.
	rec := w.record("m-1")
	if e := rec.Envelope; rec.Queue != m.Name || !e.Verified || e.Class != triage.ClassTransient || e.Attempts != 1 || e.Reason != s.Reason {
		t.Fatalf("record of queue %q: verified %v, class %q, attempts %d, reason %q (settled with %q)", rec.Queue, e.Verified, e.Class, e.Attempts, e.Reason, s.Reason)
	}

	// Restored, the tier takes the next retry.
	applyTopology(t, env.Dial("restore"), w.topo)
	w.publish("m", "m-2", nil)
	if a := waitArrival(t, calls, 15*time.Second); a.id != "m-2" || a.attempt != 1 {
		t.Fatalf("m-2 first call: %+v", a)
	}
	if s := next("m-2"); s.Outcome != OutcomeRetried || s.Tier != 0 {
		t.Fatalf("m-2 settled as %s tier %d (%q, %v) after the apply, want retried through tier 0", s.Outcome, s.Tier, s.Reason, s.SettleErr)
	}
	if a := waitArrival(t, calls, 15*time.Second); a.id != "m-2" || a.attempt != 2 || a.lane != lane.Queue {
		t.Fatalf("m-2 came back as %+v, want attempt 2 through %s", a, lane.Queue)
	}
	if s := next("m-2"); s.Outcome != OutcomeAcked {
		t.Fatalf("m-2 settled as %s on its retry", s.Outcome)
	}
}

// At the settlement seam: a retry returned is settled by its quarantine
// copy, naming the lane, the original acked after that copy's confirm; a
// quarantine copy returned as well is requeued as any failed publish is,
// not turned into a copy again.
func TestSettleQuarantinesARetryReturnedForWantOfItsQueue(t *testing.T) {
	t.Parallel()
	returned := &amqpx.ReturnedError{ReplyCode: 312, ReplyText: "NO_ROUTE"}
	for _, quarantineReturned := range []bool{false, true} {
		b := newSettleBundle(t, frame.DefaultFrameSize)
		lane := b.w.s.wq.Tiers[1].Lanes[0]
		b.out.fail = func(p published) error {
			if p.key == lane.RoutingKey || quarantineReturned {
				return returned
			}
			return nil
		}
		a := &fakeAcker{}
		b.settle(context.Background(), a, delivery(), retryFailure())
		b.out.mu.Lock()
		sent := len(b.out.sent)
		b.out.mu.Unlock()
		want, log := string(OutcomeQuarantined), "ack"
		if quarantineReturned {
			want, log = string(OutcomeRequeued), "requeue"
		}
		if sent != 2 || a.log() != log || strings.Join(b.outcomes(), ",") != want {
			t.Fatalf("quarantine returned %v: %d publishes, calls %q, settled %+v", quarantineReturned, sent, a.log(), b.settled)
		}
		if r := b.settled[0].Reason; !strings.Contains(r, "retry tier queue "+lane.Queue+" is missing") {
			t.Errorf("reason %q", r)
		}
	}
}

// The tier queue and the quarantine intake both gone: the retry is
// returned, and so is its quarantine copy. Nothing may be lost: the
// original is requeued (not acked), and once `topology apply` restores
// both, the same consumer retries it through the tier and handles it.
func TestARetryReturnedWithItsQuarantineCopyIsRequeuedUntilApply(t *testing.T) {
	t.Parallel()
	env := brokertest.Require(t)
	w := newSharedWorld(t, env, func(q *config.Queue) {
		// Room for the deliveries spent before the apply: neither the
		// crash-loop guard nor the delivery limit may end it meanwhile.
		q.DeliveryLimit, q.Consumer.CrashLoopDeliveries = 20, 10
	}, "m")
	m := w.queue("m")
	lane := w.topo.Work[0].Tiers[0].Lanes[0]
	ch := env.Channel("delete")
	for _, q := range []string{lane.Queue, m.Quarantine.Queue} {
		if _, err := ch.QueueDelete(q, false, false, false); err != nil {
			t.Fatal(err)
		}
	}
	calls := make(chan arrival, 64)
	settled, _ := w.run([]string{"m"}, failOnce(calls, m.Name))
	w.publish("m", "m-1", nil)
	s := nextSettled(t, settled)
	if s.Outcome != OutcomeRequeued || !errors.Is(s.SettleErr, amqpx.ErrUnroutable) {
		t.Fatalf("settled as %s (%v), want requeued: the quarantine copy was returned too", s.Outcome, s.SettleErr)
	}
	applyTopology(t, env.Dial("restore"), w.topo)
	for deadline := time.After(30 * time.Second); s.Outcome != OutcomeAcked; {
		select {
		case s = <-settled:
			if s.Outcome != OutcomeRequeued && s.Outcome != OutcomeRetried && s.Outcome != OutcomeAcked {
				t.Fatalf("settled as %s (%q, %v) after the apply, want retried then acked", s.Outcome, s.Reason, s.SettleErr)
			}
		case <-deadline:
			t.Fatalf("not handled after the apply; last settled as %s", s.Outcome)
		}
	}
	if s.Attempt != 2 {
		t.Fatalf("acked on attempt %d, want 2 (through the restored tier)", s.Attempt)
	}
}

// A producer's headers do not steer the quarantine-instead path: a CC and
// a BCC naming the other tier's routing key (which would take a retry
// there and hide the missing tier), an unsigned attempt count and an
// x-death that claims the other tier. The retry is for tier 0, as for any
// first failure; it is returned for want of tier 0's queue, and the
// record names that queue and says attempt 1. The other tier gets nothing.
func TestProducerHeadersDoNotSteerARetryToAMissingTier(t *testing.T) {
	t.Parallel()
	withoutTier0(t, func(t *testing.T, env *brokertest.Env, w *sharedWorld, m *config.Queue) {
		tiers := w.topo.Work[0].Tiers
		gone, other := tiers[0].Lanes[0], tiers[1].Lanes[0]
		calls := make(chan arrival, 64)
		var c *Consumer
		settled, _ := w.run([]string{"m"}, func(cc *Consumer) { c = cc; failOnce(calls, m.Name)(cc) })
		w.publish("m", "m-1", amqp.Table{
			wire.HeaderCC: []any{other.RoutingKey}, wire.HeaderBCC: []any{other.RoutingKey},
			wire.HeaderAttempts: int64(1),
			wire.HeaderXDeath: []any{amqp.Table{wire.XDeathQueue: other.Queue, wire.XDeathReason: "expired", wire.XDeathCount: int64(1),
				wire.XDeathExchange: "", wire.XDeathRoutingKeys: []any{m.Name}}},
		})
		s := nextSettled(t, settled)
		if s.Outcome != OutcomeQuarantined || s.Attempt != 1 || !strings.Contains(s.Reason, "retry tier queue "+gone.Queue+" is missing") {
			t.Fatalf("settled as %s, attempt %d, reason %q (%v); want quarantined on attempt 1 naming %s", s.Outcome, s.Attempt, s.Reason, s.SettleErr, gone.Queue)
		}
		rec := w.record("m-1")
		if e := rec.Envelope; !e.Verified || e.Attempts != 1 || e.Reason != s.Reason {
			t.Fatalf("record: verified %v, attempts %d, reason %q", e.Verified, e.Attempts, e.Reason)
		}
		if n := testutil.ToFloat64(c.metrics.retryQueueMissing.WithLabelValues(m.Name, other.Queue)); n != 0 {
			t.Fatalf("the other tier %s counted as missing %v times", other.Queue, n)
		}
		if d := depth(t, env.Channel("depth"), other.Queue); d != 0 {
			t.Fatalf("the other tier %s holds %d", other.Queue, d)
		}
	})
}

// record is the quarantine record of the message with id, once the
// world's quarantines show it.
func (w *sharedWorld) record(id string) *quarantine.Record {
	w.t.Helper()
	in := &quarantine.Inspector{Conn: w.env.Dial("inspect"), Config: w.all}
	var rec *quarantine.Record
	snapshotUntil(w.t, in, 20*time.Second, func(snap *quarantine.Snapshot) bool {
		for _, r := range snap.Records {
			if r.Properties.MessageID == id {
				rec = r
			}
		}
		return rec != nil
	})
	return rec
}

// A runtime whose config moved to the shared tiers before they were
// declared retries into the queue's own lanes for as long as its session
// lasts (retryRoute), the apply notwithstanding. An own lane then gone
// (`topology delete --retired` removes an empty one once the apply has
// run; here deleted by hand) returns its retries, and the record must not
// send the operator to `topology apply`, which has run and does not
// declare a retired lane: it says to restart the runtime, which then
// retries through the shared tiers.
func TestARetryReturnedFromAnOwnLaneAfterTheMoveSaysRestart(t *testing.T) {
	t.Parallel()
	env := brokertest.Require(t)
	w := newSharedWorld(t, env, func(q *config.Queue) { q.Retry.TierQueues = config.TierQueuesPerQueue }, "moving")
	own := w.topo.Work[0].Tiers[0].Lanes[0]
	q := w.queue("moving")
	q.Retry.TierQueues = config.TierQueuesShared
	calls := make(chan arrival, 16)
	settled, _ := w.run([]string{"moving"}, failOnce(calls, q.Name)) // before the apply: own lanes

	conn := env.Dial("setup-shared")
	shared, err := topology.BuildFor(w.all, conn)
	if err != nil {
		t.Fatal(err)
	}
	applyTopology(t, conn, shared)
	if _, err := env.Channel("delete").QueueDelete(own.Queue, false, false, false); err != nil {
		t.Fatal(err)
	}
	w.publish("moving", "m-1", nil)
	s := nextSettled(t, settled)
	if s.Outcome != OutcomeQuarantined || !strings.Contains(s.Reason, "retry tier queue "+own.Queue+" is missing") {
		t.Fatalf("settled as %s, reason %q (%v); want quarantined naming %s", s.Outcome, s.Reason, s.SettleErr, own.Queue)
	}
	if !strings.Contains(s.Reason, "restart") || strings.Contains(s.Reason, "run `dlxbridge topology apply` to restore it") {
		t.Fatalf("reason %q: the apply has run and does not restore a retired lane; it should say to restart the runtime", s.Reason)
	}
}

// nextSettled is the next outcome the consumer reports.
func nextSettled(t *testing.T, settled <-chan Settled) Settled {
	t.Helper()
	select {
	case s := <-settled:
		return s
	case <-time.After(20 * time.Second):
		t.Fatal("not settled")
		return Settled{}
	}
}

// A storm against a missing tier: 100 messages over 4 workers with their
// copies pipelined, every other one failing. Each failing one is
// quarantined once and each other acked once, no delivery settled twice
// (an ack twice would close the channel: the runtime would reconnect),
// nothing left in the work queue, and one record per failing message.
func TestAStormAgainstAMissingTierSettlesEachMessageOnce(t *testing.T) {
	t.Parallel()
	const n = 100
	withoutTier0(t, func(t *testing.T, env *brokertest.Env, w *sharedWorld, m *config.Queue) {
		lane := w.topo.Work[0].Tiers[0].Lanes[0]
		var c *Consumer
		settled, _ := w.run([]string{"m"}, func(cc *Consumer) {
			c = cc
			must(t, cc.Handle(m.Name, testType, HandlerFunc(func(ctx context.Context, msg *Message) error {
				var i int
				fmt.Sscanf(msg.MessageID, "m-%d", &i)
				if i%2 == 1 {
					return errors.New("not now")
				}
				return nil
			})))
		})
		for i := range n {
			w.publish("m", fmt.Sprintf("m-%d", i), nil)
		}
		got := map[string][]Outcome{}
		for range n {
			s := nextSettled(t, settled)
			got[s.MessageID] = append(got[s.MessageID], s.Outcome)
		}
		for i := range n {
			id, want := fmt.Sprintf("m-%d", i), OutcomeAcked
			if i%2 == 1 {
				want = OutcomeQuarantined
			}
			if o := got[id]; len(o) != 1 || o[0] != want {
				t.Errorf("%s settled as %v, want once %s", id, o, want)
			}
		}
		select {
		case s := <-settled:
			t.Fatalf("settled again: %+v", s)
		case <-time.After(500 * time.Millisecond): // a redelivery would come well within this
		}
		if r := testutil.ToFloat64(c.metrics.reconnects); r != 0 {
			t.Fatalf("%v reconnects: a channel closed under the storm", r)
		}
		if got := testutil.ToFloat64(c.metrics.retryQueueMissing.WithLabelValues(m.Name, lane.Queue)); got != n/2 {
			t.Fatalf("dlxbridge_retry_queue_missing_total = %v, want %d", got, n/2)
		}
		if d := depth(t, env.Channel("depth"), m.Name); d != 0 {
			t.Fatalf("work queue holds %d", d)
		}
		in := &quarantine.Inspector{Conn: env.Dial("inspect"), Config: w.all}
		snapshotUntil(t, in, 20*time.Second, func(snap *quarantine.Snapshot) bool { return len(openOf(snap, m.Name)) == n/2 })
	})
}

// withoutTier0 runs f, in parallel, on the shared tiers and on per-queue
// lanes: a world of one queue m whose tier 0 queue is deleted.
func withoutTier0(t *testing.T, f func(t *testing.T, env *brokertest.Env, w *sharedWorld, m *config.Queue)) {
	for _, layout := range []string{config.TierQueuesShared, config.TierQueuesPerQueue} {
		t.Run(layout, func(t *testing.T) {
			t.Parallel()
			env := brokertest.Require(t)
			w := newSharedWorld(t, env, func(q *config.Queue) { q.Retry.TierQueues = layout }, "m")
			if _, err := env.Channel("delete").QueueDelete(w.topo.Work[0].Tiers[0].Lanes[0].Queue, false, false, false); err != nil {
				t.Fatal(err)
			}
			f(t, env, w, w.queue("m"))
		})
	}
}

// Immediate retries, then a delayed retry returned for want of its tier:
// the message is quarantined with the attempts made in process counted
// (the handler ran twice: attempt 1 and its immediate retry), in the
// record too, and the handler is not called again.
func TestAnImmediateRetryThenAReturnedRetryCountsBothAttempts(t *testing.T) {
	t.Parallel()
	env := brokertest.Require(t)
	w := newSharedWorld(t, env, func(q *config.Queue) { q.Retry.ImmediateRetries = 1 }, "m")
	m := w.queue("m")
	ch := env.Channel("delete")
	for _, tier := range w.topo.Work[0].Tiers {
		if _, err := ch.QueueDelete(tier.Lanes[0].Queue, false, false, false); err != nil {
			t.Fatal(err)
		}
	}
	calls := make(chan struct{}, 16)
	settled, _ := w.run([]string{"m"}, func(c *Consumer) {
		must(t, c.Handle(m.Name, testType, HandlerFunc(func(ctx context.Context, msg *Message) error {
			calls <- struct{}{}
			return errors.New("not now")
		})))
	})
	w.publish("m", "m-1", nil)
	s := nextSettled(t, settled)
	if s.Outcome != OutcomeQuarantined || s.Attempt != 2 || !strings.Contains(s.Reason, "is missing") || len(calls) != 2 {
		t.Fatalf("settled as %s on attempt %d after %d calls, reason %q; want quarantined on attempt 2 after 2 calls", s.Outcome, s.Attempt, len(calls), s.Reason)
	}
	if e := w.record("m-1").Envelope; !e.Verified || e.Attempts != 2 || e.Reason != s.Reason {
		t.Fatalf("record: verified %v, attempts %d, reason %q", e.Verified, e.Attempts, e.Reason)
	}
	select {
	case s := <-settled:
		t.Fatalf("settled again: %+v", s)
	case <-time.After(500 * time.Millisecond): // a requeue would be redelivered well within this
	}
}

// A message an upstream queue dead-lettered into the work queue after a
// requeue (re-admitted on RabbitMQ 4.x: its count may be upstream's; on
// 3.10 handled at once), whose handler then fails while tier 0's lane is
// gone: quarantined at once naming the lane, the handler run once, one
// attempt, and nothing left in the work queue.
func TestAReadmittedMessageWhoseRetryIsReturnedIsQuarantinedOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	lane := b.wq.Tiers[0].Lanes[0].Queue
	if _, err := b.env.Channel("sabotage").QueueDelete(lane, false, false, false); err != nil {
		t.Fatal(err)
	}
	calls := b.startFailing()
	b.upstreamRejectWith("up", 1, amqp.Table{})
	outcomes := b.settledPastReadmission()
	t.Logf("broker %s: outcomes %v", b.env.ServerVersion, outcomes)
	if n := calls.Load(); n != 1 || outcomes[len(outcomes)-1] != OutcomeQuarantined {
		t.Fatalf("handler ran %d times, outcomes %v; want once, then quarantined", n, outcomes)
	}
	env, _ := quarantine.Read(ptr(b.quarantined()))
	if env.Attempts != 1 || !strings.Contains(env.Reason, "retry tier queue "+lane+" is missing") {
		t.Fatalf("attempts %d, reason %q", env.Attempts, env.Reason)
	}
	if d := b.queueDepth(b.queue.Name); d != 0 {
		t.Fatalf("work queue holds %d, want 0", d)
	}
}
