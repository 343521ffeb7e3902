package faulttest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/cmd/dlxbridge/internal/bench"
	"github.com/dlxbridge/dlxbridge/config"
	"github.com/dlxbridge/dlxbridge/consumer"
	"github.com/dlxbridge/dlxbridge/internal/amqpx"
	"github.com/dlxbridge/dlxbridge/internal/brokertest"
	"github.com/dlxbridge/dlxbridge/schemas"
	"github.com/dlxbridge/dlxbridge/topology"
	"github.com/dlxbridge/dlxbridge/triage"
)

// full says whether the slow variants run (DLXBRIDGE_FAULTS=full).
func full() bool { return os.Getenv("DLXBRIDGE_FAULTS") == "full" }

// Message sizes and the mix: the bench's storm (10% schema-invalid, 20%
// transient once, 1% always failing), so every path runs: ack, retry
// through a TTL lane, quarantine by the gate and by the retry budget.
const (
	bodySize = 400
	scenario = bench.Storm
)

// faultConfig is the one-queue config of a fault test on prefix. Faults
// requeue what was unacked and raise delivery counts: leave room so that a
// message caught by several faults is still handled rather than
// quarantined as a crash loop.
func faultConfig(prefix string) (*config.Config, error) {
	cfg, err := bench.Config(prefix, 20, 4)
	if err != nil {
		return nil, err
	}
	q := &cfg.Queues[0]
	q.DeliveryLimit = 12
	q.Consumer.CrashLoopDeliveries = 10
	q.Consumer.HandlerTimeout = 10 * time.Second
	return cfg, cfg.Validate()
}

// world is one fault test: a private node (or the cluster), the topology
// declared on it, and what each id became.
type world struct {
	t      *testing.T
	node   *brokertest.Node // nil on the cluster
	env    *brokertest.Env
	cfg    *config.Config
	queue  *config.Queue
	topo   *topology.Topology
	n      int // ids 0..n-1
	ledger *ledger
	// Where the runtime, the publisher and the quarantine reader connect:
	// the private node's URL, or on the cluster a node list or a front
	// door each.
	consumerURL, publishURL, readerURL string
	consumer                           *consumer.Consumer // the last one run
}

func newWorld(t *testing.T, n int) *world {
	t.Helper()
	node := brokertest.StartPrivateNode(t)
	env := node.Env(t)
	cfg, err := faultConfig(env.Prefix)
	if err != nil {
		t.Fatal(err)
	}
	w := &world{t: t, node: node, env: env, cfg: cfg, queue: &cfg.Queues[0], n: n, ledger: newLedger(n),
		consumerURL: node.URL, publishURL: node.URL, readerURL: node.URL}
	w.declare()
	return w
}

// declare applies the topology (again: idempotent).
func (w *world) declare() {
	w.t.Helper()
	conn := w.env.Dial("declare")
	defer conn.Close()
	topo, err := bench.Declare(context.Background(), conn, w.cfg)
	if err != nil {
		w.t.Fatal(err)
	}
	w.topo = topo
}

// handle is the fault tests' handler logic: decode, do a little work (so
// that deliveries are in flight when a fault lands), then what the id's
// kind says. It reports success through ok before returning nil, and a
// transient failure (a retry to publish) through failed, if not nil.
func handle(ctx context.Context, m *consumer.Message, ok func(i int, m *consumer.Message) error, failed func()) error {
	var o bench.Order
	if err := m.Bind(&o); err != nil {
		return triage.Permanent(err)
	}
	i := bench.Index(m.MessageID)
	if i < 0 {
		return triage.Permanent(fmt.Errorf("unexpected message id %q", m.MessageID))
	}
	select {
	case <-time.After(3 * time.Millisecond):
	case <-ctx.Done():
		return ctx.Err()
	}
	switch bench.KindOf(scenario, i) {
	case bench.TransientOnce:
		if m.Attempt == 1 {
			if failed != nil {
				failed()
			}
			return errors.New("fault test: transient failure")
		}
	case bench.AlwaysFailing:
		return errors.New("fault test: always fails")
	}
	return ok(i, m)
}

// consumerSpec is a fault test's runtime.
type consumerSpec struct {
	url, name string // where it connects, its connection name
	cfg       *config.Config
	reg       prometheus.Registerer // may be nil
	logTo     io.Writer
	// ok records a success (its error is the handler's); failed, if not
	// nil, is told of each transient failure.
	ok     func(i int) error
	failed func()
	// okMsg, if not nil, records a success instead of ok, with the
	// message; onCall, if not nil, is called first on every handler call.
	okMsg  func(i int, m *consumer.Message) error
	onCall func(m *consumer.Message)
	// keeper runs the quarantine keeper (records into the stream);
	// otherwise the test reads the quarantine queue itself.
	keeper bool
	// logLevel is the runtime's; the zero value is info, so callers
	// that want errors only say so.
	logLevel slog.Level
}

// newConsumer makes the runtime s describes.
func newConsumer(s consumerSpec) (*consumer.Consumer, error) {
	registry, err := schemas.Load(schemas.LoadOptions{})
	if err != nil {
		return nil, err
	}
	c, err := consumer.New(&consumer.Config{
		URL: s.url, File: s.cfg, Registry: registry, ConnectionName: s.name, Registerer: s.reg,
		Logger:       slog.New(slog.NewTextHandler(s.logTo, &slog.HandlerOptions{Level: s.logLevel})),
		DrainTimeout: 5 * time.Second,
		ReconnectMin: 50 * time.Millisecond,
		ReconnectMax: time.Second,
		// A fault may make the broker refuse or lose a queue for a while.
		PermanentFailureTimeout: -1,
		KeepQuarantineIntake:    !s.keeper,
	})
	if err != nil {
		return nil, err
	}
	ok := s.okMsg
	if ok == nil {
		ok = func(i int, _ *consumer.Message) error { return s.ok(i) }
	}
	err = c.HandleVersion(s.cfg.Queues[0].Name, bench.MessageType, bench.MessageVersion, consumer.HandlerFunc(
		func(ctx context.Context, m *consumer.Message) error {
			if s.onCall != nil {
				s.onCall(m)
			}
			return handle(ctx, m, ok, s.failed)
		}))
	return c, err
}

// runConsumer runs a runtime in this process until the test ends or stop
// is called. reg and failed may be nil.
func (w *world) runConsumer(reg prometheus.Registerer, failed func()) (stop func()) {
	w.t.Helper()
	return w.run(consumerSpec{reg: reg, failed: failed, ok: func(i int) error {
		w.ledger.succeeded(i)
		return nil
	}})
}

// run runs the runtime s describes (its url, name, cfg and logTo filled
// in from w) until the test ends or stop is called.
func (w *world) run(s consumerSpec) (stop func()) {
	w.t.Helper()
	s.url, s.name, s.cfg, s.logTo, s.logLevel = w.consumerURL, w.env.Prefix+"/consumer", w.cfg, w.t.Output(), slog.LevelError
	c, err := newConsumer(s)
	if err != nil {
		w.t.Fatal(err)
	}
	w.consumer = c
	return brokertest.Run(w.t, 30*time.Second, c.Run)
}

// ledger counts, per id, handler successes and copies in the quarantine,
// and when each id was first published and each success happened (for the
// time a fault stalls the flow).
type ledger struct {
	mu          sync.Mutex
	successes   map[int]int
	quarantined map[int]int
	classes     map[int][]string
	published   []time.Time // by id: when its first publish began
	handled     []handling  // every success, in order
	changed     brokertest.Changes
}

// handling is one handler success.
type handling struct {
	id int
	at time.Time
}

func newLedger(n int) *ledger {
	return &ledger{successes: map[int]int{}, quarantined: map[int]int{}, classes: map[int][]string{},
		published: make([]time.Time, n), changed: brokertest.NewChanges()}
}

func (l *ledger) succeeded(i int) {
	l.mu.Lock()
	l.successes[i]++
	l.handled = append(l.handled, handling{i, time.Now()})
	l.mu.Unlock()
	l.notify()
}

// publishing notes that id i is about to be published (first time only).
func (l *ledger) publishing(i int) {
	l.mu.Lock()
	if i < len(l.published) && l.published[i].IsZero() {
		l.published[i] = time.Now()
	}
	l.mu.Unlock()
}

// recovery is how long after at the first id published after at was
// handled: the time a fault at at stalled the whole flow, publisher to
// handler. ok is false if no id published after at was handled.
func (l *ledger) recovery(at time.Time) (d time.Duration, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.recoveryLocked(at)
}

// longestPause is the longest time between from and to without a handler
// success: how long a fault stalled handling, when messages were waiting
// or being published throughout.
func (l *ledger) longestPause(from, to time.Time) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	last, longest := from, time.Duration(0)
	for _, h := range l.handled {
		if h.at.Before(from) {
			continue
		}
		if h.at.After(to) {
			break
		}
		longest = max(longest, h.at.Sub(last))
		last = h.at
	}
	return max(longest, to.Sub(last))
}

// lastPublished is when the last id's first publish began.
func (l *ledger) lastPublished() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	var last time.Time
	for _, at := range l.published {
		if at.After(last) {
			last = at
		}
	}
	return last
}

func (l *ledger) recoveryLocked(at time.Time) (d time.Duration, ok bool) {
	for _, h := range l.handled {
		if h.id < len(l.published) && l.published[h.id].After(at) {
			return h.at.Sub(at), true
		}
	}
	return 0, false
}

func (l *ledger) inQuarantine(i int, class triage.Class) {
	l.mu.Lock()
	l.quarantined[i]++
	l.classes[i] = append(l.classes[i], string(class))
	l.mu.Unlock()
	l.notify()
}

func (l *ledger) notify() { l.changed.Notify() }

// successCount is how many ids succeeded at least once.
func (l *ledger) successCount() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.successes)
}

// waitFor waits until cond (called with l.mu held) holds, or within passes.
func (l *ledger) waitFor(cond func() bool, within time.Duration) bool {
	return l.changed.WaitFor(&l.mu, cond, within)
}

// accounted is how many of ids 0..n-1 succeeded or are quarantined; call
// with l.mu held.
func (l *ledger) accounted(n int) int {
	k := 0
	for i := range n {
		if l.successes[i] > 0 || l.quarantined[i] > 0 {
			k++
		}
	}
	return k
}

// readSuccessFile adds the ids a child process recorded, one per line.
func (l *ledger) readSuccessFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	l.mu.Lock()
	defer l.mu.Unlock()
	clear(l.successes)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text()) // the id first; more may follow
		if len(fs) == 0 {
			continue
		}
		if i := bench.Index(fs[0]); i >= 0 {
			l.successes[i]++
		}
	}
	return sc.Err()
}

// publish starts a publisher of ids 0..w.n-1 in the background; the
// returned function waits for it to finish.
func (w *world) publish(pace time.Duration) (*brokertest.Publisher, func() error) {
	p := &brokertest.Publisher{URL: w.publishURL, Name: w.env.Prefix + "/publisher", Exchange: w.queue.Exchange.Name, Pace: pace}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	done := make(chan error, 1)
	go func() {
		done <- p.PublishAll(ctx, w.n, func(i int) (string, amqp.Publishing) {
			w.ledger.publishing(i)
			return bench.RoutingKey, bench.Publishing(i, bench.Body(i, bodySize, bench.KindOf(scenario, i)))
		})
	}()
	w.t.Cleanup(cancel)
	return p, func() error { defer cancel(); return <-done }
}

// readQuarantine consumes the quarantine (acking what it recorded) until
// the test ends, consuming again whenever its connection, channel or
// consumer goes away (forced closes, a node restart, the queue deleted).
func (w *world) readQuarantine() {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	w.t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			_ = w.consumeQuarantine(ctx)
			select {
			case <-time.After(100 * time.Millisecond): // the node or the queue may be gone for a while
			case <-ctx.Done():
			}
		}
	}()
}

func (w *world) consumeQuarantine(ctx context.Context) error {
	return brokertest.Drain(ctx, w.readerURL, w.env.Prefix+"/quarantine-reader", w.queue.Quarantine.Queue, w.recordQuarantined)
}

// recordQuarantined checks a quarantined message's body byte for byte and
// records it.
func (w *world) recordQuarantined(d *amqp.Delivery) {
	i := bench.Index(d.MessageId)
	if i < 0 || i >= w.n {
		w.t.Errorf("quarantine holds an unknown message id %q", d.MessageId)
		return
	}
	if want := bench.Body(i, bodySize, bench.KindOf(scenario, i)); string(d.Body) != string(want) {
		w.t.Errorf("quarantined %s: body differs from the one published (%d bytes, want %d)", d.MessageId, len(d.Body), len(want))
	}
	class, _ := d.Headers["dlxbridge-class"].(string)
	w.ledger.inQuarantine(i, triage.Class(class))
}

// tally is what a fault test's ids became.
type tally struct {
	n, handled, quarantined, lost int
	// duplicates: ids with more than one outcome (handled twice or more,
	// quarantined twice or more, or both), at-least-once, not losses.
	duplicates, dupHandled, dupQuarantined, both int
	// innocents: ids that should have succeeded but are in the
	// quarantine; crashLoopOrBudget of them as crash-loop or over budget.
	innocents, crashLoopOrBudget int
}

// verify waits until every id is accounted for, then checks what each
// became. strict: an id whose kind must succeed may not end only in the
// quarantine (else that is logged, an at-least-once side effect).
func (w *world) verify(within time.Duration, strict bool) tally {
	w.t.Helper()
	l := w.ledger
	all := l.waitFor(func() bool { return l.accounted(w.n) == w.n }, within)
	// Let copies still in flight settle, for the duplicate count: the work
	// queue and the retry lanes drain (bounded; not required).
	w.waitDrained(10 * time.Second)

	l.mu.Lock()
	defer l.mu.Unlock()
	var lost, notQuarantined, quarantinedGood []string
	r := tally{n: w.n, handled: len(l.successes), quarantined: len(l.quarantined)}
	for i := range w.n {
		s, q := l.successes[i], l.quarantined[i]
		kind := bench.KindOf(scenario, i)
		switch {
		case s == 0 && q == 0:
			lost = append(lost, bench.ID(i))
		case kind.Quarantined() && q == 0:
			notQuarantined = append(notQuarantined, bench.ID(i)+"("+kind.String()+")")
		case !kind.Quarantined() && q > 0:
			quarantinedGood = append(quarantinedGood, fmt.Sprintf("%s(%s, %v)", bench.ID(i), kind, l.classes[i]))
			r.innocents++
			for _, c := range l.classes[i] {
				// Over budget keeps the last failure's class, a
				// retryable one.
				if cl := triage.Class(c); cl == triage.ClassCrashLoop || cl.Retryable() {
					r.crashLoopOrBudget++
					break
				}
			}
		}
		if s > 1 {
			r.dupHandled++
		}
		if q > 1 {
			r.dupQuarantined++
		}
		if s > 0 && q > 0 {
			r.both++
		}
		if s+q > 1 {
			r.duplicates++
		}
	}
	r.lost = len(lost)
	w.t.Logf("%d ids: %d succeeded in a handler, %d quarantined; duplicates (at-least-once, not losses): %d ids succeeded more than once, %d quarantined more than once, %d both",
		w.n, len(l.successes), len(l.quarantined), r.dupHandled, r.dupQuarantined, r.both)
	if !all || len(lost) > 0 {
		w.t.Errorf("LOST %d of %d ids (neither handled successfully nor quarantined): %v", len(lost), w.n, lost)
	}
	if len(notQuarantined) > 0 {
		w.t.Errorf("%d ids that can never succeed are not in the quarantine: %v", len(notQuarantined), notQuarantined)
	}
	if len(quarantinedGood) > 0 {
		if strict {
			w.t.Errorf("%d ids that should have succeeded were quarantined: %v", len(quarantinedGood), quarantinedGood)
		} else {
			w.t.Logf("%d ids that would succeed were (also) quarantined (at-least-once side effect of the fault, not a loss): %v", len(quarantinedGood), quarantinedGood)
		}
	}
	return r
}

// waitDrained polls the work queue's and the retry lanes' ready counts
// until they are 0 or within passes.
func (w *world) waitDrained(within time.Duration) {
	conn, err := amqpx.Dial(w.readerURL, w.env.Prefix+"/depths")
	if err != nil {
		w.t.Logf("depths: %v", err)
		return
	}
	defer conn.Close()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		total := 0
		for _, n := range w.queue.Names(config.SharedTiers{}) { // per-queue lanes: no shared tiers
			if n.Kind == config.KindQueue && n.Role != config.RoleQuarantine {
				d, err := bench.Depth(conn, n.Name)
				if err != nil {
					w.t.Logf("depth of %s: %v", n.Name, err)
					return
				}
				total += d
			}
		}
		if total == 0 {
			return
		}
		time.Sleep(100 * time.Millisecond) // polling the broker; no event to wait on
	}
}
