package faulttest

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlxbridge/dlxbridge/cmd/dlxbridge/internal/bench"
	"github.com/dlxbridge/dlxbridge/internal/amqpx"
	"github.com/dlxbridge/dlxbridge/internal/brokertest"
	"github.com/dlxbridge/dlxbridge/quarantine"
	"github.com/dlxbridge/dlxbridge/schemas"
	"github.com/dlxbridge/dlxbridge/triage"
)

// The cluster fault suite: the runtime on the three-node 4.3.6 cluster of
// scripts/rabbitmq-cluster, every queue replicated on all three nodes, a
// known set of ids published under load while nodes are killed, drained
// and stopped. Each scenario proves every id handled or quarantined, none
// lost, duplicates counted apart, and no message that would succeed
// quarantined (as a crash loop, over budget or otherwise) because of the
// fault; it logs a "cluster result" line for the table in
// docs/performance.md.

// newClusterWorld declares the fault config's topology, replicated on
// every node, through node 1 (so every queue's leader starts there: the
// brokers place a new queue's leader on the declaring client's node).
func newClusterWorld(t *testing.T, n int) (*world, *brokertest.Cluster) {
	t.Helper()
	c := requireCluster(t)
	return newWorldOn(t, c, n), c
}

// newWorldOn is newClusterWorld on the cluster c.
func newWorldOn(t *testing.T, c *brokertest.Cluster, n int) *world {
	t.Helper()
	env := c.Env(t)
	cfg := clusterConfig(t, c, env.Prefix)
	w := &world{t: t, env: env, cfg: cfg, queue: &cfg.Queues[0], n: n, ledger: newLedger(n)}
	w.declare()
	return w
}

// roles says which node each client connects to first.
type roles struct{ consumer, publisher, reader int }

// connect points the runtime, the publisher and the quarantine reader at
// their nodes. The runtime gets the node list, its node first, and fails
// over by itself; the publisher and the reader (test code) go through
// front doors, which hand a new connection to the next node when theirs
// is down, as a load balancer would.
func (w *world) connect(c *brokertest.Cluster, r roles) {
	w.t.Helper()
	w.publishURL = c.Front(r.publisher).URL
	w.readerURL = c.Front(r.reader).URL
	list := make([]string, 0, c.Size())
	for k := range c.Size() {
		list = append(list, c.URLs[(r.consumer-1+k)%c.Size()])
	}
	w.consumerURL = strings.Join(list, ",")
	w.t.Logf("runtime on node %d first (then the next nodes of its list); publisher on node %d, quarantine reader on node %d", r.consumer, r.publisher, r.reader)
}

// leader is the node leading queue, failing the test if it is unknown.
func leader(t *testing.T, c *brokertest.Cluster, queue string) int {
	t.Helper()
	i, err := c.Leader(queue)
	if err != nil {
		t.Fatal(err)
	}
	return i
}

// others are the two nodes that are not i.
func others(c *brokertest.Cluster, i int) (int, int) {
	return i%c.Size() + 1, (i+1)%c.Size() + 1
}

// awaitRecovery waits until an id published after at has been handled and
// returns how long after at that was.
func (w *world) awaitRecovery(at time.Time, within time.Duration) time.Duration {
	w.t.Helper()
	var d time.Duration
	if !w.ledger.waitFor(func() bool {
		var ok bool
		d, ok = w.ledger.recoveryLocked(at)
		return ok
	}, within) {
		w.t.Fatalf("no id published after the fault was handled within %s", within)
	}
	return d
}

// result logs a scenario's line of the table; sent says how the ids were
// sent (and how many again).
func result(t *testing.T, scenario, sent string, r tally, recovered time.Duration) {
	t.Helper()
	t.Logf("cluster result | %s | %d (%s) | %d | %d | %d | %d (%d handled twice, %d quarantined twice, %d both) | %d (%d crash-loop or over budget) | %s |",
		scenario, r.n, sent, r.handled, r.quarantined, r.lost, r.duplicates, r.dupHandled, r.dupQuarantined, r.both,
		r.innocents, r.crashLoopOrBudget, recovered.Round(10*time.Millisecond))
}

// resentNote is the publisher's part of a result line.
func resentNote(p *brokertest.Publisher) string { return fmt.Sprintf("%d sent again", p.Resent()) }

// The node leading the work queue (and, declared there, every other queue)
// is SIGKILLed while the publisher sends and handlers run, and started
// again once the flow has recovered. The runtime and the publisher are on
// the other two nodes: a new leader is elected among them.
func TestClusterWorkQueueLeaderKilled(t *testing.T) {
	const n = 1500
	w, c := newClusterWorld(t, n)
	victim := leader(t, c, w.queue.Name)
	a, b := others(c, victim)
	w.connect(c, roles{consumer: a, publisher: b, reader: b})
	w.readQuarantine()
	w.runConsumer(nil, nil)
	pub, published := w.publish(5 * time.Millisecond)
	if !w.ledger.waitFor(func() bool { return len(w.ledger.successes) >= n/4 }, 120*time.Second) {
		t.Fatalf("only %d ids succeeded before the fault", w.ledger.successCount())
	}
	before, sent := time.Now(), pub.Confirmed()
	c.Kill(victim)
	at := time.Now() // the VM is gone: the script waits for that
	recovered := w.awaitRecovery(at, 120*time.Second)
	// The management API names the new leader with its statistics, some
	// seconds late (polled: it has no events).
	next := victim
	for deadline := time.Now().Add(20 * time.Second); next == victim && time.Now().Before(deadline); {
		time.Sleep(500 * time.Millisecond)
		next = leader(t, c, w.queue.Name)
	}
	t.Logf("node %d (the leader) SIGKILLed at %d confirmed; the first id published after it was handled %s later; new leader node %d (as the management API reported %s after the kill)",
		victim, sent, recovered.Round(time.Millisecond), next, time.Since(at).Round(time.Millisecond))
	c.Start(victim)
	t.Logf("node %d started again %s after the kill", victim, time.Since(at).Round(time.Millisecond))
	pub.Unpace()
	if err := published(); err != nil {
		t.Fatalf("publisher: %v", err)
	}
	pause := w.ledger.longestPause(before, time.Now())
	t.Logf("longest pause in handling from the kill until the last id was published: %s", pause.Round(time.Millisecond))
	r := w.verify(180*time.Second, true)
	result(t, "work queue leader SIGKILLed, restarted", resentNote(pub), r, pause)
}

// A rolling restart, as an operator upgrades: each node in turn waits until
// losing it leaves every queue a majority (await_online_quorum_plus_one),
// is drained (rabbitmq-upgrade drain: its clients disconnected, its leaders
// moved away), stopped, started and revived, while the publisher sends and
// handlers run.
func TestClusterRollingRestartDrained(t *testing.T) {
	// Publishing at this pace would outlast the restart (35-45 s here);
	// what is left is sent unpaced once it is over.
	const n = 3000
	w, c := newClusterWorld(t, n)
	w.connect(c, roles{consumer: 1, publisher: 2, reader: 3})
	w.readQuarantine()
	w.runConsumer(nil, nil)
	pub, published := w.publish(15 * time.Millisecond)
	if !w.ledger.waitFor(func() bool { return len(w.ledger.successes) >= n/20 }, 120*time.Second) {
		t.Fatalf("only %d ids succeeded before the restart", w.ledger.successCount())
	}
	start := time.Now()
	var worst time.Duration
	for i := 1; i <= c.Size(); i++ {
		c.AwaitQuorumPlusOne(i)
		at := time.Now()
		c.Drain(i)
		drained := time.Since(at)
		c.Stop(i)
		c.Start(i)
		c.Revive(i)
		d, ok := w.ledger.recovery(at)
		if !ok && pub.Confirmed() < n {
			d = w.awaitRecovery(at, 120*time.Second)
			ok = true
		}
		if ok {
			worst = max(worst, d)
		}
		t.Logf("node %d: drained in %s, back after %s; first id published after the drain began handled %s after it (%t); %d confirmed, %d ids handled",
			i, drained.Round(time.Millisecond), time.Since(at).Round(time.Millisecond), d.Round(time.Millisecond), ok, pub.Confirmed(), w.ledger.successCount())
	}
	end := time.Now()
	t.Logf("rolling restart of %d nodes took %s; publishing went on throughout: %t", c.Size(), end.Sub(start).Round(time.Millisecond), pub.Confirmed() < n)
	pub.Unpace()
	if err := published(); err != nil {
		t.Fatalf("publisher: %v", err)
	}
	// Once the paced publisher is done, handling rests: a pause after the
	// last publish is no stall.
	to := end
	if last := w.ledger.lastPublished(); last.Before(to) {
		to = last
	}
	pause := w.ledger.longestPause(start, to)
	t.Logf("longest pause in handling during the rolling restart, while ids were published: %s (worst first-id-after-drain: %s)", pause.Round(time.Millisecond), worst.Round(time.Millisecond))
	r := w.verify(180*time.Second, true)
	result(t, "rolling restart, each node drained", resentNote(pub), r, pause)
}

// The node the runtime is connected to is stopped (rabbitmqctl stop) while
// messages flow: the runtime must reconnect to another node within
// seconds, and nothing is lost or quarantined for it. The work queue's
// leader is elsewhere, so this is the runtime's failover alone.
func TestClusterConsumersNodeStopped(t *testing.T) {
	const n = 1500
	w, c := newClusterWorld(t, n)
	lead := leader(t, c, w.queue.Name)
	victim, pubNode := others(c, lead)
	w.connect(c, roles{consumer: victim, publisher: pubNode, reader: lead})
	w.readQuarantine()
	w.runConsumer(nil, nil)
	pub, published := w.publish(5 * time.Millisecond)
	if !w.ledger.waitFor(func() bool { return len(w.ledger.successes) >= n/4 }, 120*time.Second) {
		t.Fatalf("only %d ids succeeded before the fault", w.ledger.successCount())
	}
	nodes, err := c.AwaitConnectionNodes(w.env.Prefix+"/consumer", 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if len(nodes) != 1 || nodes[0] != victim {
		t.Fatalf("the runtime's connection is on nodes %v, want [%d]", nodes, victim)
	}
	// Ready goes false when the runtime loses its session and true when
	// it consumes again; polled, as the runtime has no event for it.
	var lostAt, backAt atomic.Int64
	watchCtx, stopWatch := context.WithCancel(context.Background())
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for watchCtx.Err() == nil {
			ready := w.consumer.Ready()
			now := time.Now().UnixNano()
			if !ready && lostAt.Load() == 0 {
				lostAt.Store(now)
			}
			if ready && lostAt.Load() != 0 && backAt.Load() == 0 {
				backAt.Store(now)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()
	defer func() { stopWatch(); <-watched }()
	at := time.Now()
	c.Stop(victim)
	stopped := time.Since(at)
	recovered := w.awaitRecovery(at, 120*time.Second)
	if !w.ledger.waitFor(func() bool { return backAt.Load() != 0 }, 60*time.Second) && backAt.Load() == 0 {
		t.Fatal("the runtime did not consume again within 60s of its node stopping")
	}
	reconnected := time.Duration(backAt.Load() - at.UnixNano())
	t.Logf("node %d (the runtime's) stopped in %s; the runtime consumed again %s after the stop began (lost its session %s in), the first id published after it was handled %s after",
		victim, stopped.Round(time.Millisecond), reconnected.Round(time.Millisecond), time.Duration(lostAt.Load()-at.UnixNano()).Round(time.Millisecond), recovered.Round(time.Millisecond))
	if reconnected > 15*time.Second {
		t.Errorf("the runtime took %s to consume again on another node, want seconds", reconnected)
	}
	c.Start(victim)
	pub.Unpace()
	if err := published(); err != nil {
		t.Fatalf("publisher: %v", err)
	}
	pause := w.ledger.longestPause(at, time.Now())
	t.Logf("longest pause in handling from the stop until the last id was published: %s", pause.Round(time.Millisecond))
	r := w.verify(180*time.Second, true)
	result(t, "the runtime's node stopped", resentNote(pub), r, pause)
}

// The quarantine's leader (its intake and both streams, declared on one
// node) is SIGKILLed during a paced replay. First every id is quarantined
// (the handler refuses them all, class permanent, besides the storm's
// schema-invalid and always-failing ones); then the handler accepts them
// and the permanent ones are replayed at 100 a second. The replay finishes,
// or is run again on what it left open, until nothing is; then every
// replayed id must be handled, and every id sent twice (sent, but its
// replayed event lost to the fault) is counted. The replay runs on another
// node (it goes on through the fault) or on the leader's (its connection
// dies with the node, and the next run resumes).
func TestClusterQuarantineLeaderKilledDuringReplay(t *testing.T) {
	t.Run("replay on another node", func(t *testing.T) { replayThroughKill(t, false) })
	t.Run("replay on the leader's node", func(t *testing.T) { replayThroughKill(t, true) })
}

func replayThroughKill(t *testing.T, onLeader bool) {
	const n = 300
	w, c := newClusterWorld(t, n)
	victim := leader(t, c, w.queue.Quarantine.EventsStream())
	for _, q := range []string{w.queue.Quarantine.Queue, w.queue.Quarantine.RecordsStream()} {
		if l := leader(t, c, q); l != victim {
			t.Logf("%s is led by node %d, the events stream by node %d", q, l, victim)
		}
	}
	a, b := others(c, victim)
	w.connect(c, roles{consumer: a, publisher: a, reader: b})
	replayURL := w.readerURL
	if onLeader {
		replayURL = c.Front(victim).URL
	}
	var accept atomic.Bool
	w.run(consumerSpec{keeper: true, ok: func(i int) error {
		if !accept.Load() {
			return triage.Permanent(errors.New("fault test: refused until the replay"))
		}
		w.ledger.succeeded(i)
		return nil
	}})
	began := time.Now()
	_, published := w.publish(0)
	if err := published(); err != nil {
		t.Fatalf("publisher: %v", err)
	}
	readerConn, err := amqpx.Dial(w.readerURL, w.env.Prefix+"/inspect")
	if err != nil {
		t.Fatal(err)
	}
	defer readerConn.Close()
	in := &quarantine.Inspector{Conn: readerConn, Config: w.cfg}
	// byID reads every record of the quarantine, by message id.
	byID := func() map[int][]*quarantine.Record {
		t.Helper()
		snap, err := in.Snapshot(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		m := map[int][]*quarantine.Record{}
		for _, r := range snap.List(quarantine.Filter{States: []quarantine.State{quarantine.StateOpen, quarantine.StateReplayed}}) {
			if i := bench.Index(r.Properties.MessageID); i >= 0 && i < n {
				m[i] = append(m[i], r)
			}
		}
		return m
	}
	deadline := time.Now().Add(180 * time.Second)
	for len(byID()) < n {
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d ids in the quarantine's records", len(byID()), n)
		}
		time.Sleep(time.Second) // the keeper stores records on its own time
	}
	t.Logf("all %d ids published and in the quarantine's records %s after the first publish", n, time.Since(began).Round(time.Millisecond))
	accept.Store(true)

	registry, err := schemas.Load(schemas.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var progress []time.Time
	killed := make(chan time.Time, 1)
	filter := quarantine.Filter{Queue: w.queue.Name, Class: string(triage.ClassPermanent)}
	sentBy := map[string]int{} // record id -> runs that sent it
	runs := 0
	var at time.Time // of the kill
	restarted := false
	// Run again until nothing is open, as an operator would: a run
	// refused (locked, or its node's replica not back yet) is tried
	// again 2 s later.
	giveUp := time.Now().Add(180 * time.Second)
	done := false
	for ; !done && time.Now().Before(giveUp); runs++ {
		conn, err := amqpx.Dial(replayURL, fmt.Sprintf("%s/replay-%d", w.env.Prefix, runs))
		if err != nil {
			t.Fatal(err)
		}
		rp := &quarantine.Replayer{Conn: conn, Config: w.cfg, Registry: registry, LockWait: 10 * time.Second}
		res, err := rp.Replay(context.Background(), quarantine.ReplayOptions{Filter: filter, Rate: 100, Reason: "cluster fault test",
			Progress: func(p quarantine.Progress) {
				mu.Lock()
				progress = append(progress, time.Now())
				mu.Unlock()
				if runs == 0 && p.Done == p.Total/3 {
					// The kill blocks for a moment; the replay goes on.
					go func() { c.Kill(victim); killed <- time.Now() }()
				}
			}})
		_ = conn.Close()
		if res != nil {
			for _, id := range res.Sent {
				sentBy[id]++
			}
			t.Logf("replay run %d: %d selected, %d sent, stopped %t, in %s; error: %v", runs+1, res.Selected, len(res.Sent), res.Stopped, time.Duration(res.Duration).Round(time.Millisecond), err)
			done = err == nil && res.Selected == 0
		} else {
			t.Logf("replay run %d refused: %v", runs+1, err)
			time.Sleep(2 * time.Second) // the operator's pause before trying again
		}
		if runs == 0 {
			select {
			case at = <-killed:
			case <-time.After(60 * time.Second):
				t.Fatal("the node was not killed during the replay")
			}
		}
		if errors.Is(err, quarantine.ErrLocked) && !restarted {
			// The lock is an exclusive queue of the dead run's
			// connection, on the dead node: seen on 4.3.6, it stays
			// until that node is back. An operator starts it again.
			var lock map[string]any
			lockErr := c.MgmtGet("/api/queues/%2F/"+url.PathEscape(w.queue.Quarantine.Queue+".replay-lock")+"?columns=name,node,state,exclusive,owner_pid_details", &lock)
			t.Logf("the replay lock %s after the kill: %v %v; starting node %d", time.Since(at).Round(time.Millisecond), lock, lockErr, victim)
			c.Start(victim)
			restarted = true
			t.Logf("node %d back %s after the kill", victim, time.Since(at).Round(time.Millisecond))
		}
	}
	if !done {
		t.Fatalf("%d replay runs in 180s and permanent records still open", runs)
	}
	if !restarted {
		c.Start(victim)
	}

	// Every replayed message must be handled; wait for the ones sent.
	want := map[int]bool{}
	for i := range n {
		if !bench.KindOf(scenario, i).Quarantined() {
			want[i] = true
		}
	}
	l := w.ledger
	if !l.waitFor(func() bool {
		for i := range want {
			if l.successes[i] == 0 {
				return false
			}
		}
		return true
	}, 180*time.Second) {
		l.mu.Lock()
		var missing []string
		for i := range want {
			if l.successes[i] == 0 {
				missing = append(missing, bench.ID(i))
			}
		}
		l.mu.Unlock()
		t.Errorf("LOST: %d replayed ids never handled: %v", len(missing), missing)
	}
	w.waitDrained(10 * time.Second)

	records := byID()
	r := tally{n: n}
	sentTwice := 0
	for _, k := range sentBy {
		if k > 1 {
			sentTwice++
		}
	}
	l.mu.Lock()
	for i := range n {
		s := l.successes[i]
		open := 0
		var classes []triage.Class
		for _, rec := range records[i] {
			if rec.State == quarantine.StateOpen {
				open++
				classes = append(classes, rec.Envelope.Class)
			}
		}
		// Every open record of a valid id was replayed: one open now
		// is a copy quarantined again after its replay.
		if want[i] && open > 0 {
			r.innocents++
			if slices.ContainsFunc(classes, func(c triage.Class) bool { return c == triage.ClassCrashLoop || c.Retryable() }) {
				r.crashLoopOrBudget++
			}
			t.Errorf("%s (valid) is open in the quarantine after the replay: classes %v", bench.ID(i), classes)
		}
		switch {
		case s > 0:
			r.handled++
		case open > 0:
			r.quarantined++
		default:
			r.lost++
		}
		if s > 1 {
			r.dupHandled++
		}
		if want[i] && open > 0 && s > 0 {
			r.both++
		}
		if s > 1 || want[i] && open > 0 && s > 0 {
			r.duplicates++
		}
	}
	l.mu.Unlock()
	if r.lost > 0 {
		t.Errorf("LOST %d ids: neither handled nor open in the quarantine", r.lost)
	}
	if r.handled != len(want) {
		t.Errorf("%d ids handled, want the %d valid ones", r.handled, len(want))
	}
	mu.Lock()
	var stall time.Duration
	for k := 1; k < len(progress); k++ {
		stall = max(stall, progress[k].Sub(progress[k-1]))
	}
	mu.Unlock()
	t.Logf("node %d (the events stream's leader) SIGKILLed %s after the first send; %d replay runs (the last one finding nothing open); %d records sent, %d of them by two runs; longest pause between two sends %s; %d ids handled twice",
		victim, at.Sub(progress[0]).Round(time.Millisecond), runs, len(sentBy), sentTwice, stall.Round(time.Millisecond), r.dupHandled)
	where := "replay on another node"
	if onLeader {
		where = "replay on the leader's node"
	}
	result(t, "quarantine leader SIGKILLed during a paced replay, "+where, fmt.Sprintf("%d replayed, %d by two runs", len(sentBy), sentTwice), r, stall)
}
