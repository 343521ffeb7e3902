package faulttest

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlxbridge/dlxbridge/internal/brokertest"
)

// partitionHold is how long the partition lasts at most when the runtime
// does not consume again by itself before: long enough for the nodes to
// see each other gone (net_ticktime 4 s) and for the queues on the
// majority side to go on.
const partitionHold = 30 * time.Second

// partitionMin is how long the partition lasts at least.
const partitionMin = 20 * time.Second

// A network partition: the node the runtime is connected to is cut off
// from the other two (its network namespace's routes to them blackholed,
// both ways), while the publisher goes on through the majority. The work
// queue's leader is on the majority side. The runtime, on the minority
// side, must not lose or quarantine anything; the test records whether it
// consumed again during the partition (on another node of its list) or
// only once the partition healed, and how long handling stalled.
// Runs on the --netns layout of scripts/rabbitmq-cluster, started for this
// test and stopped after it.
func TestClusterPartitionConsumerOnMinority(t *testing.T) {
	skipShort(t)
	if !full() {
		t.Skip("cluster tests run with DLXBRIDGE_FAULTS=full")
	}
	const n = 1500
	c := brokertest.RequirePartition(t)
	w := newWorldOn(t, c, n)
	lead := leader(t, c, w.queue.Name)
	minority, pubNode := others(c, lead)
	w.connect(c, roles{consumer: minority, publisher: pubNode, reader: lead})
	w.readQuarantine()
	w.runConsumer(nil, nil)
	pub, published := w.publish(5 * time.Millisecond)
	if !w.ledger.waitFor(func() bool { return len(w.ledger.successes) >= n/4 }, 120*time.Second) {
		t.Fatalf("only %d ids succeeded before the partition", w.ledger.successCount())
	}
	if nodes, err := c.AwaitConnectionNodes(w.env.Prefix+"/consumer", 30*time.Second); err != nil || len(nodes) != 1 || nodes[0] != minority {
		t.Fatalf("the runtime's connection is on nodes %v (%v), want [%d]", nodes, err, minority)
	}
	// The runtime's readiness, polled: it goes false when it loses its
	// session and true when it consumes again.
	var lostAt atomic.Int64
	stopWatch := make(chan struct{})
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for {
			select {
			case <-stopWatch:
				return
			case <-time.After(10 * time.Millisecond):
			}
			if !w.consumer.Ready() && lostAt.Load() == 0 {
				lostAt.Store(time.Now().UnixNano())
			}
		}
	}()
	defer func() { close(stopWatch); <-watched }()

	c.Isolate(minority)
	at := time.Now() // the cut is in place: nothing published from now on crosses it
	var d time.Duration
	recovered := w.ledger.waitFor(func() bool {
		var ok bool
		d, ok = w.ledger.recoveryLocked(at)
		return ok
	}, partitionHold)
	// The partition lasts partitionMin at least, well past the time the
	// nodes take to see each other gone, whatever the runtime did.
	time.Sleep(time.Until(at.Add(partitionMin)))
	healedAt := time.Now()
	c.HealPartition()
	where := "during the partition"
	if !recovered {
		where = "only after the heal"
		d = w.awaitRecovery(at, 120*time.Second)
	}
	nodes, _ := c.ConnectionNodes(w.env.Prefix + "/consumer")
	lost := "never"
	if v := lostAt.Load(); v != 0 {
		lost = time.Duration(v-at.UnixNano()).Round(time.Millisecond).String() + " after the cut"
	}
	t.Logf("node %d (the runtime's) cut off from the others for %s; the runtime lost its session: %s; the first id published after the cut was handled %s after it, %s; the runtime is now on nodes %v; %s",
		minority, healedAt.Sub(at).Round(time.Millisecond), lost, d.Round(time.Millisecond), where, nodes, w.consumer.Node())
	pub.Unpace()
	if err := published(); err != nil {
		t.Fatalf("publisher: %v", err)
	}
	pause := w.ledger.longestPause(at, time.Now())
	t.Logf("longest pause in handling from the cut until the last id was published: %s", pause.Round(time.Millisecond))
	r := w.verify(180*time.Second, true)
	result(t, "the runtime's node cut off (network partition), "+where, resentNote(pub), r, pause)
}
