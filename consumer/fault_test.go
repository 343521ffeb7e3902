package consumer

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/config"
	"github.com/dlxbridge/dlxbridge/internal/amqpx"
	"github.com/dlxbridge/dlxbridge/internal/brokertest"
	"github.com/dlxbridge/dlxbridge/quarantine"
	"github.com/dlxbridge/dlxbridge/triage"
)

// faultN is how many messages TestBrokerRestartAndCrashLoseNothing sends.
const faultN = 500

// faultKind is what the handler does with message i: most succeed, some fail
// once (a retry through a TTL lane, then success), some fail permanently
// (quarantine).
func faultKind(i int) string {
	switch i % 10 {
	case 3, 6:
		return "transient-once"
	case 7:
		return "permanent"
	default:
		return "ok"
	}
}

// A private node is stopped cleanly and, later, SIGKILLed and started again
// while messages are being published, handled, retried through the TTL lanes
// and quarantined. Every message must end up handled successfully or in the
// quarantine: no loss. Duplicates (at-least-once) are counted and logged.
func TestBrokerRestartAndCrashLoseNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("fault injection on a private broker node: skipped in -short")
	}
	testStart := time.Now()
	node := brokertest.StartPrivateNode(t)
	b := setupOn(t, node.Env(t), func(q *config.Queue) {
		q.Consumer.Prefetch = 20
		q.Consumer.Concurrency = 4
		q.Consumer.HandlerTimeout = 5 * time.Second
		// Each fault requeues what was unacked and raises its delivery
		// count; leave room so a message caught by both faults is still
		// handled rather than quarantined as a crash loop.
		q.DeliveryLimit = 10
		q.Consumer.CrashLoopDeliveries = 8
	})
	l := newFaultLedger()

	var reconnects atomic.Int32
	reconnectCauses := make(chan string, 64)
	b.cfg.hooks.reconnecting = func(err error) {
		reconnects.Add(1)
		select {
		case reconnectCauses <- fmt.Sprint(err):
		default:
		}
	}
	var outcomesMu sync.Mutex
	outcomes := map[Outcome]int{}
	b.cfg.OnSettled = func(s Settled) {
		outcomesMu.Lock()
		outcomes[s.Outcome]++
		outcomesMu.Unlock()
	}
	b.start(func(c *Consumer) {
		must(t, c.Handle(b.queue.Name, testType, l.handler(5*time.Millisecond)))
	})

	// The test's own publisher must not lose messages either: every
	// message is published with confirm + mandatory, and republished on a
	// fresh connection until confirmed.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pub := &brokertest.Publisher{URL: b.env.URL, Name: b.env.Prefix + "/fault-publisher", Exchange: b.queue.Exchange.Name, Pace: 5 * time.Millisecond}
	pubDone := make(chan error, 1)
	go func() { pubDone <- pub.PublishAll(ctx, faultN, faultMessage) }()

	// Fault 1: a clean stop of the node, then start. Fault 2: SIGKILL, then
	// start. Each is triggered by progress, so handlers, retry lanes and
	// the publisher are busy when it lands.
	faults := []struct {
		name   string
		inject func()
	}{
		{"stop+start", node.Stop},
		{"SIGKILL+start", node.Kill},
	}
	for _, f := range faults {
		// After 100 more successes, handlers park at the gate; the fault is
		// injected once one is parked (so deliveries are unacked in flight
		// and the publisher keeps filling the queue), and the gate opens
		// when the node is back.
		target := l.successCount() + 100
		l.closeGateAt(target)
		if !l.waitFor(func() bool { return l.parked > 0 }, 90*time.Second) {
			t.Fatalf("before %s: no handler reached the gate (%d successes, want %d)", f.name, l.successCount(), target)
		}
		for len(b.consuming) > 0 { // drop stale consuming signals
			<-b.consuming
		}
		before := snapshotDepths(t, b)
		atFault, published := l.successCount(), pub.Confirmed()
		t0 := time.Now()
		f.inject()
		down := time.Now()
		node.Start()
		up := time.Now()
		l.openGate()
		b.waitConsumingWithin(60 * time.Second) // reconnect backoff tops out at ReconnectMax, but a loaded machine is slow
		consuming := time.Now()
		n0 := l.successCount()
		if !l.waitFor(func() bool { return l.nSuccess > n0 }, 60*time.Second) {
			t.Fatalf("after %s: no handler success within 60s of consuming again", f.name)
		}
		t.Logf("%s at %d handler successes, %d messages confirmed to the publisher, %d in retry lanes, %d ready in the work queue: "+
			"node down after %s, up after %s; runtime consuming %s after that, next success %s later; recovered %s after the fault",
			f.name, atFault, published, before.lanes, before.work,
			down.Sub(t0).Round(time.Millisecond), up.Sub(t0).Round(time.Millisecond),
			consuming.Sub(up).Round(time.Millisecond), time.Since(consuming).Round(time.Millisecond), time.Since(t0).Round(time.Millisecond))
	}

	// Collect the quarantine (the node is up for good now) until every
	// message is accounted for: succeeded in a handler, or quarantined.
	qctx, qcancel := context.WithCancel(ctx)
	qDone := make(chan error, 1)
	go func() {
		qDone <- readQuarantine(qctx, b.env.URL, b.env.Prefix+"/quarantine-reader", b.wq.Quarantine, l)
	}()
	accounted := l.waitFor(func() bool { return len(l.accounted) == faultN }, 90*time.Second)
	if !accounted {
		cancel() // a publisher still retrying would never return
	}
	if err := <-pubDone; err != nil {
		t.Errorf("publisher: %v", err)
	}
	// Let in-flight duplicates settle before counting them: the work queue
	// and the retry lanes drain (ready counts; bounded, not required).
	drainDeadline := time.Now().Add(10 * time.Second)
	for d := snapshotDepths(t, b); d.work+d.lanes > 0 && time.Now().Before(drainDeadline); d = snapshotDepths(t, b) {
		time.Sleep(100 * time.Millisecond) // polling the broker; no event to wait on
	}
	qcancel()
	if err := <-qDone; err != nil {
		t.Errorf("quarantine reader: %v", err)
	}

	l.mu.Lock()
	defer l.mu.Unlock()
	var missing, permNotQuarantined, okQuarantined []string
	var dupSuccess, dupQuarantine, both, transientRetried int
	for i := range faultN {
		id := fmt.Sprintf("m-%04d", i)
		s, q := l.successes[id], l.quarantined[id]
		if s == 0 && q == 0 {
			missing = append(missing, id)
		}
		if s > 1 {
			dupSuccess++
		}
		if q > 1 {
			dupQuarantine++
		}
		if s > 0 && q > 0 {
			both++
		}
		switch faultKind(i) {
		case "permanent":
			if q == 0 {
				permNotQuarantined = append(permNotQuarantined, id)
			}
		default:
			if q > 0 {
				okQuarantined = append(okQuarantined, id+"("+strings.Join(l.classes[id], ",")+")")
			}
			if faultKind(i) == "transient-once" && s > 0 {
				transientRetried++
			}
		}
	}
	outcomesMu.Lock()
	outs := maps.Clone(outcomes)
	outcomesMu.Unlock()
	t.Logf("N=%d: %d handler calls, %d ids succeeded (%d after a retry), %d ids quarantined; duplicates: %d ids succeeded more than once, %d quarantined more than once, %d both succeeded and quarantined; publisher: %d failed attempts retried, %d messages sent more than once; runtime reconnects %d; outcomes %v; total %s",
		faultN, l.nCalls, countNonZero(l.successes), transientRetried, countNonZero(l.quarantined), dupSuccess, dupQuarantine, both,
		pub.Retried(), pub.Resent(), reconnects.Load(), outs, time.Since(testStart).Round(time.Millisecond))
	if len(okQuarantined) > 0 {
		t.Logf("quarantined although the handler would succeed (at-least-once side effect, not a loss): %v", okQuarantined)
	}
	if !accounted || len(missing) > 0 {
		t.Errorf("LOST %d of %d messages (neither handled successfully nor quarantined): %v", len(missing), faultN, missing)
	}
	if len(permNotQuarantined) > 0 {
		t.Errorf("%d permanent failures are not in the quarantine: %v", len(permNotQuarantined), permNotQuarantined)
	}
	if reconnects.Load() < int32(len(faults)) {
		t.Errorf("runtime reconnected %d times, want at least %d (one per fault)", reconnects.Load(), len(faults))
	}
	close(reconnectCauses)
	var causes []string
	for c := range reconnectCauses {
		causes = append(causes, c)
	}
	t.Logf("reconnect causes: %q", causes)
}

// faultLedger records what happened to each message id.
type faultLedger struct {
	mu          sync.Mutex
	failed      int // handler calls that returned an error (a deadline at the gate too)
	calls       map[string]int
	successes   map[string]int
	quarantined map[string]int
	classes     map[string][]string
	accounted   map[string]bool
	nCalls      int
	nSuccess    int
	gateAt      int                // handlers park once nSuccess reaches it...
	gateCh      chan struct{}      // ...on this channel, until it is closed (nil: no gate)
	parked      int                // handlers that reached the current gate
	changed     brokertest.Changes // one waiter: waitFor
}

func newFaultLedger() *faultLedger {
	return &faultLedger{
		calls: map[string]int{}, successes: map[string]int{}, quarantined: map[string]int{},
		classes: map[string][]string{}, accounted: map[string]bool{}, changed: brokertest.NewChanges(),
	}
}

// handler is the fault tests' handler: it parks at the gate (so a fault
// lands while handlers are in flight and messages wait in the queue,
// however fast or slow this machine is), does work, then what faultKind says
// of the message, and records it.
func (l *faultLedger) handler(work time.Duration) HandlerFunc {
	return func(ctx context.Context, m *Message) error {
		i, err := strconv.Atoi(strings.TrimPrefix(m.MessageID, "m-"))
		if err != nil {
			return triage.Permanent(fmt.Errorf("unexpected message id %q", m.MessageID))
		}
		if gate := l.gate(); gate != nil {
			select {
			case <-gate:
			case <-ctx.Done():
				// A failed call too: the runtime settles it like any other.
				l.fail()
				return ctx.Err()
			}
		}
		l.call(m.MessageID)
		time.Sleep(work)
		var herr error
		switch faultKind(i) {
		case "permanent":
			herr = triage.Permanent(errors.New("permanently bad"))
		case "transient-once":
			if m.Attempt == 1 {
				herr = errors.New("transiently bad")
			}
		}
		if herr != nil {
			l.fail()
			return herr
		}
		l.succeeded(m.MessageID)
		return nil
	}
}

func (l *faultLedger) call(id string) {
	l.mu.Lock()
	l.calls[id]++
	l.nCalls++
	l.mu.Unlock()
}

// fail counts a handler call that returns an error.
func (l *faultLedger) fail() {
	l.mu.Lock()
	l.failed++
	l.mu.Unlock()
	l.notify()
}

func (l *faultLedger) succeeded(id string) {
	l.mu.Lock()
	l.successes[id]++
	l.nSuccess++
	l.accounted[id] = true
	l.mu.Unlock()
	l.notify()
}

func (l *faultLedger) inQuarantine(id string, class triage.Class) {
	l.mu.Lock()
	l.quarantined[id]++
	l.classes[id] = append(l.classes[id], string(class))
	l.accounted[id] = true
	l.mu.Unlock()
	l.notify()
}

// closeGateAt makes handlers park (see gate) once n handler calls have
// succeeded.
func (l *faultLedger) closeGateAt(n int) {
	l.mu.Lock()
	l.gateAt, l.gateCh, l.parked = n, make(chan struct{}), 0
	l.mu.Unlock()
}

// gate returns the channel a handler must wait on, or nil to go ahead.
func (l *faultLedger) gate() chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.gateCh == nil || l.nSuccess < l.gateAt {
		return nil
	}
	l.parked++
	l.notifyLocked()
	return l.gateCh
}

// openGate lets parked and later handlers through.
func (l *faultLedger) openGate() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.gateCh != nil {
		close(l.gateCh)
		l.gateCh = nil
	}
}

func (l *faultLedger) notifyLocked() { l.changed.Notify() }

func (l *faultLedger) successCount() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.nSuccess
}

func (l *faultLedger) notify() { l.changed.Notify() }

// waitFor waits until cond (called with l.mu held) holds, or within passes.
func (l *faultLedger) waitFor(cond func() bool, within time.Duration) bool {
	return l.changed.WaitFor(&l.mu, cond, within)
}

func countNonZero(m map[string]int) int {
	n := 0
	for _, v := range m {
		if v > 0 {
			n++
		}
	}
	return n
}

// faultMessage is message i of the fault test: m-0000…, valid for the
// test type.
func faultMessage(i int) (string, amqp.Publishing) {
	id := fmt.Sprintf("m-%04d", i)
	return "job.fault", amqp.Publishing{
		ContentType:  "application/json",
		Type:         testType,
		MessageId:    id,
		DeliveryMode: amqp.Persistent,
		Headers:      amqp.Table{"schema-version": "1"},
		Body:         []byte(`{"id":"` + id + `"}`),
	}
}

// readQuarantine consumes the quarantine (acking) and records each message
// until ctx ends.
func readQuarantine(ctx context.Context, url, name, queue string, l *faultLedger) error {
	return brokertest.Drain(ctx, url, name, queue, func(d *amqp.Delivery) {
		env, _ := quarantine.Read(d)
		l.inQuarantine(d.MessageId, env.Class)
	})
}

type depths struct{ work, lanes int }

// snapshotDepths reads the ready counts of the work queue and of all its
// retry lanes on a short-lived connection.
func snapshotDepths(t testing.TB, b *testBundle) depths {
	t.Helper()
	conn, err := amqpx.Dial(b.env.URL, b.env.Prefix+"/depths")
	if err != nil {
		t.Fatalf("dial for queue depths: %v", err)
	}
	defer conn.Close()
	depth := func(q string) int {
		ch, err := conn.Channel()
		if err != nil {
			t.Fatalf("channel for queue depths: %v", err)
		}
		defer ch.Close()
		st, err := ch.QueueDeclarePassive(q, true, false, false, false, nil)
		if err != nil {
			t.Fatalf("passive declare %s: %v", q, err)
		}
		return st.Messages
	}
	d := depths{work: depth(b.wq.Name)}
	var lanes []string
	for _, tier := range b.wq.Tiers {
		for _, lane := range tier.Lanes {
			lanes = append(lanes, lane.Queue)
		}
	}
	for _, q := range slices.Compact(lanes) {
		d.lanes += depth(q)
	}
	return d
}
