package consumer

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/dlxbridge/dlxbridge/config"
	"github.com/dlxbridge/dlxbridge/internal/amqpx"
	"github.com/dlxbridge/dlxbridge/internal/brokertest"
	"github.com/dlxbridge/dlxbridge/internal/frame"
	"github.com/dlxbridge/dlxbridge/quarantine"
	"github.com/dlxbridge/dlxbridge/triage"
)

// A retry whose tier queue was deleted (by hand, or a `topology delete`
// of another config) is returned by the broker: no queue would hold it.
// The message is quarantined at once, its handler called once, with a
// reason that names the missing queue and the command that restores it;
// not requeued until the crash-loop guard quarantines it as a crash loop
// (which runs the handler again at every delivery and says nothing of the
// cause). The metric names the missing queue too. The same for a queue's
// own lanes.
func TestARetryToAMissingTierQueueIsQuarantinedNamingIt(t *testing.T) {
	t.Parallel()
	for _, layout := range []string{config.TierQueuesShared, config.TierQueuesPerQueue} {
		t.Run(layout, func(t *testing.T) {
			t.Parallel()
			retryToAMissingTierQueue(t, layout)
		})
	}
}

func retryToAMissingTierQueue(t *testing.T, layout string) {
	env := brokertest.Require(t)
	w := newSharedWorld(t, env, func(q *config.Queue) { q.Retry.TierQueues = layout }, "m")
	m := w.queue("m")
	lane := w.topo.Work[0].Tiers[0].Lanes[0].Queue
	if _, err := env.Channel("delete").QueueDelete(lane, false, false, false); err != nil {
		t.Fatal(err)
	}
	calls := make(chan arrival, 64)
	var c *Consumer
	settled, _ := w.run([]string{"m"}, func(cc *Consumer) { c = cc; failOnce(calls, m.Name)(cc) })
	w.publish("m", "m-1", nil)

	first := waitArrival(t, calls, 15*time.Second)
	if first.attempt != 1 {
		t.Fatalf("first call: %+v", first)
	}
	var s Settled
	select {
	case s = <-settled:
	case <-time.After(20 * time.Second):
		t.Fatal("not settled")
	}
	if s.Outcome != OutcomeQuarantined || s.Class == triage.ClassCrashLoop {
		t.Fatalf("settled as %s (class %s, reason %q, settle error %v), want quarantined at once, not requeued into a crash loop", s.Outcome, s.Class, s.Reason, s.SettleErr)
	}
	for _, want := range []string{"retry tier queue " + lane + " is missing", "dlxbridge topology apply"} {
		if !strings.Contains(s.Reason, want) {
			t.Errorf("reason %q does not say %q", s.Reason, want)
		}
	}
	if n := testutil.ToFloat64(c.metrics.retryQueueMissing.WithLabelValues(m.Name, lane)); n != 1 {
		t.Errorf("dlxbridge_retry_queue_missing_total{queue=%s,retry_queue=%s} = %v, want 1", m.Name, lane, n)
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
	in := &quarantine.Inspector{Conn: env.Dial("inspect"), Config: w.all}
	var rec *quarantine.Record
	snapshotUntil(t, in, 20*time.Second, func(snap *quarantine.Snapshot) bool {
		for _, r := range snap.Records {
			if r.Properties.MessageID == "m-1" {
				rec = r
			}
		}
		return rec != nil
	})
	if rec.Queue != m.Name || !strings.Contains(rec.Envelope.Reason, "retry tier queue "+lane+" is missing") {
		t.Fatalf("record of queue %q, reason %q", rec.Queue, rec.Envelope.Reason)
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
