package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/config"
	"github.com/dlxbridge/dlxbridge/internal/brokertest"
	"github.com/dlxbridge/dlxbridge/quarantine"
	"github.com/dlxbridge/dlxbridge/schemas"
	"github.com/dlxbridge/dlxbridge/topology"
	"github.com/dlxbridge/dlxbridge/wire"
)

// sharedWorld is several work queues on one set of shared delay tiers
// (named from the test's prefix), bound to one direct exchange, each by its
// short name. Consumers run over any subset of them, as separate
// deployments sharing a virtual host would.
type sharedWorld struct {
	t        *testing.T
	env      *brokertest.Env
	all      *config.Config // every queue: what the topology declares
	topo     *topology.Topology
	registry *schemas.Registry
	exchange string
	pubCh    *amqp.Channel
	confirms chan amqp.Confirmation
}

// newSharedWorld declares queues named env.Name(short) for each short
// name, with tiers of 300 ms and 900 ms (no jitter) on the shared tiers,
// after mutate (may be nil) had its say.
func newSharedWorld(t *testing.T, env *brokertest.Env, mutate func(q *config.Queue), shorts ...string) *sharedWorld {
	t.Helper()
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, testType), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, testType, "v1.json"), []byte(testJobSchema), 0o644); err != nil {
		t.Fatal(err)
	}
	w := &sharedWorld{t: t, env: env, exchange: env.Name("ex")}
	jitter, zero := 0.0, time.Duration(0)
	w.all = &config.Config{Schemas: config.Schemas{Dir: dir}, SharedTiers: config.SharedTiers{Prefix: env.Prefix}}
	for _, s := range shorts {
		q := config.Queue{
			Name:          env.Name(s),
			Exchange:      config.Exchange{Name: w.exchange, Type: "direct"},
			Bindings:      []string{s},
			DeliveryLimit: 4,
			Consumer:      config.Consumer{Prefetch: 20, Concurrency: 4, HandlerTimeout: 2 * time.Second},
			Retry: config.Retry{Tiers: []time.Duration{300 * time.Millisecond, 900 * time.Millisecond}, Jitter: &jitter, Lanes: 1,
				MaxAttempts: 3, MaxElapsed: &zero, TierQueues: config.TierQueuesShared},
			Quarantine: config.Quarantine{Queue: env.Name(s + ".quarantine")},
			Accepts:    []config.Accept{{Type: testType, Versions: []string{"1"}}},
		}
		if mutate != nil {
			mutate(&q)
		}
		w.all.Queues = append(w.all.Queues, q)
	}
	if err := w.all.Complete(); err != nil {
		t.Fatalf("test config: %v", err)
	}
	var err error
	if w.registry, err = schemas.Load(schemas.LoadOptions{Dir: dir}); err != nil {
		t.Fatal(err)
	}
	conn := env.Dial("setup")
	if w.topo, err = topology.BuildFor(w.all, conn); err != nil {
		t.Fatal(err)
	}
	applyTopology(t, conn, w.topo)
	if w.pubCh, err = env.Dial("test-publisher").Channel(); err != nil {
		t.Fatal(err)
	}
	if err := w.pubCh.Confirm(false); err != nil {
		t.Fatal(err)
	}
	w.confirms = w.pubCh.NotifyPublish(make(chan amqp.Confirmation, 256))
	return w
}

// queue is the config of the queue with short name s.
func (w *sharedWorld) queue(s string) *config.Queue {
	q, ok := w.all.QueueByName(w.env.Name(s))
	if !ok {
		w.t.Fatalf("no queue %s", s)
	}
	return q
}

// publish sends a test.job v1 to the exchange with key (a queue's short
// name) and waits for the confirm.
func (w *sharedWorld) publish(key, id string, headers amqp.Table) {
	w.t.Helper()
	if headers == nil {
		headers = amqp.Table{}
	}
	headers["schema-version"] = "1"
	p := amqp.Publishing{MessageId: id, Type: testType, ContentType: "application/json", Headers: headers,
		Body: fmt.Appendf(nil, `{"id":%q}`, id)}
	if err := w.pubCh.PublishWithContext(context.Background(), w.exchange, key, true, false, p); err != nil {
		w.t.Fatalf("publish: %v", err)
	}
	select {
	case c := <-w.confirms:
		if !c.Ack {
			w.t.Fatal("test publish nacked")
		}
	case <-time.After(10 * time.Second):
		w.t.Fatal("no confirm for test publish")
	}
}

// run starts a consumer of the queues with the given short names (its
// config has only those, with the world's shared tiers), with keepers, and
// returns its outcomes; stop ends it (the test's cleanup does too).
func (w *sharedWorld) run(shorts []string, register func(c *Consumer)) (settled <-chan Settled, stop func()) {
	w.t.Helper()
	file := *w.all
	file.Queues = nil
	for _, s := range shorts {
		file.Queues = append(file.Queues, *w.queue(s))
	}
	out := make(chan Settled, 1024)
	consuming := make(chan struct{}, 16)
	cfg := &Config{
		URL: w.env.URL, File: &file, Registry: w.registry,
		ConnectionName: w.env.Prefix + "/consumer-" + shorts[0],
		DrainTimeout:   5 * time.Second, ReconnectMin: 50 * time.Millisecond, ReconnectMax: 500 * time.Millisecond,
		SigningKey: []byte(testSigningKey),
		Logger:     slog.New(slog.NewTextHandler(w.t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn})),
		OnSettled:  func(s Settled) { out <- s },
		hooks:      &testHooks{keeper: true, consuming: func() { consuming <- struct{}{} }},
	}
	c, err := New(cfg)
	if err != nil {
		w.t.Fatalf("consumer.New: %v", err)
	}
	register(c)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					w.t.Errorf("Run: %v", err)
				}
			case <-time.After(15 * time.Second):
				w.t.Errorf("Run did not return after cancel")
			}
		})
	}
	w.t.Cleanup(stop)
	select {
	case <-consuming:
	case <-time.After(15 * time.Second):
		w.t.Fatal("consumer did not start consuming")
	}
	return out, stop
}

// arrival is one handler call.
type arrival struct {
	queue, id string
	attempt   int
	at        time.Time
	headers   amqp.Table
	lane      string // the retry lane its x-death names, if any
}

// failOnce registers, for each queue, a handler that fails a message's
// first attempt and acks the next, telling calls about each.
func failOnce(calls chan<- arrival, queues ...string) func(c *Consumer) {
	return func(c *Consumer) {
		for _, q := range queues {
			err := c.Handle(q, testType, HandlerFunc(func(ctx context.Context, m *Message) error {
				a := arrival{queue: q, id: m.MessageID, attempt: m.Attempt, at: time.Now(), headers: m.Headers}
				if d, ok := m.Headers[wire.HeaderXDeath].([]any); ok && len(d) > 0 {
					if e, ok := d[0].(amqp.Table); ok {
						a.lane, _ = e[wire.XDeathQueue].(string)
					}
				}
				calls <- a
				if m.Attempt == 1 {
					return errors.New("not yet")
				}
				return nil
			}))
			if err != nil {
				panic(err)
			}
		}
	}
}

func waitArrival(t *testing.T, calls <-chan arrival, within time.Duration) arrival {
	t.Helper()
	select {
	case a := <-calls:
		return a
	case <-time.After(within):
		t.Fatalf("no handler call within %s", within)
		return arrival{}
	}
}

// A retry through a shared tier returns to the queue that failed it and
// to no other: not to the other queue waiting in the same tier, not to a
// spy bound to the work exchange like both work queues, and not to the
// queue a producer's CC or BCC header names (the retry's CC is the
// runtime's own, and says only the queue that failed it).
func TestSharedTierRetryReturnsOnlyToTheQueueThatFailedIt(t *testing.T) {
	t.Parallel()
	env := brokertest.Require(t)
	w := newSharedWorld(t, env, nil, "a", "b")
	a, b := w.queue("a"), w.queue("b")
	spy := env.Name("spy")
	ch := env.Channel("spy")
	if _, err := ch.QueueDeclare(spy, true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"a", "b"} {
		if err := ch.QueueBind(spy, key, w.exchange, false, nil); err != nil {
			t.Fatal(err)
		}
	}
	calls := make(chan arrival, 64)
	settled, _ := w.run([]string{"a", "b"}, failOnce(calls, a.Name, b.Name))

	// Hostile: names b (and the spy) in CC and BCC on a message for a.
	w.publish("a", "m-a", amqp.Table{wire.HeaderCC: []any{b.Name, spy}, wire.HeaderBCC: []any{b.Name}})
	w.publish("b", "m-b", nil)
	seen := map[string][]arrival{}
	for range 4 {
		c := waitArrival(t, calls, 15*time.Second)
		seen[c.id] = append(seen[c.id], c)
	}
	for id, want := range map[string]string{"m-a": a.Name, "m-b": b.Name} {
		got := seen[id]
		if len(got) != 2 || got[0].queue != want || got[1].queue != want || got[1].attempt != 2 {
			t.Fatalf("%s: calls %+v, want attempts 1 and 2 in %s", id, got, want)
		}
		retry := got[1]
		lane := w.topo.Work[0].Tiers[0].Lanes[0].Queue
		if retry.lane != lane {
			t.Errorf("%s came back from %q, want the shared tier %q", id, retry.lane, lane)
		}
		if cc, _ := retry.headers[wire.HeaderCC].([]any); !slices.Equal(cc, []any{want}) {
			t.Errorf("%s came back with CC %v, want [%s]", id, retry.headers[wire.HeaderCC], want)
		}
		if _, has := retry.headers[wire.HeaderBCC]; has {
			t.Errorf("%s came back with a BCC header", id)
		}
	}
	for range 4 { // two retries and two acks
		select {
		case <-settled:
		case <-time.After(10 * time.Second):
			t.Fatal("not every delivery settled")
		}
	}
	// A copy leaked anywhere would have been routed when the retry came
	// back, before its handler call: nothing more is on its way.
	select {
	case c := <-calls:
		t.Fatalf("an extra handler call: %+v", c)
	default:
	}
	for name, want := range map[string]int{spy: 2, a.Name: 0, b.Name: 0} { // the spy: the two originals only
		if n := depth(t, ch, name); n != want {
			t.Errorf("%s holds %d message(s), want %d", name, n, want)
		}
	}
}

func depth(t *testing.T, ch *amqp.Channel, name string) int {
	t.Helper()
	q, err := ch.QueueDeclarePassive(name, true, false, false, false, nil)
	if err != nil {
		t.Fatalf("passive declare %s: %v", name, err)
	}
	return q.Messages
}

// Two queues with different tier lists each wait their own delays: the
// queue with a 300 ms first tier comes back after about 300 ms, the one
// with 1.2 s after about 1.2 s, each from a tier queue of its own.
func TestDifferentTierListsGetTheirOwnDelays(t *testing.T) {
	t.Parallel()
	env := brokertest.Require(t)
	w := newSharedWorld(t, env, func(q *config.Queue) {
		if q.Name == env.Name("slow") {
			q.Retry.Tiers = []time.Duration{1200 * time.Millisecond}
		}
	}, "fast", "slow")
	fast, slow := w.queue("fast"), w.queue("slow")
	calls := make(chan arrival, 16)
	w.run([]string{"fast", "slow"}, failOnce(calls, fast.Name, slow.Name))
	w.publish("fast", "m-fast", nil)
	w.publish("slow", "m-slow", nil)
	first := map[string]arrival{}
	back := map[string]arrival{}
	for range 4 {
		c := waitArrival(t, calls, 15*time.Second)
		if c.attempt == 1 {
			first[c.queue] = c
		} else {
			back[c.queue] = c
		}
	}
	for _, tc := range []struct {
		q    *config.Queue
		want time.Duration
	}{{fast, 300 * time.Millisecond}, {slow, 1200 * time.Millisecond}} {
		wq, _ := w.topo.WorkQueue(tc.q.Name)
		lane := wq.Tiers[0].Lanes[0]
		waited := back[tc.q.Name].at.Sub(first[tc.q.Name].at)
		t.Logf("%s: waited %s in %s (tier %s)", tc.q.Name, waited, back[tc.q.Name].lane, tc.want)
		if back[tc.q.Name].lane != lane.Queue {
			t.Errorf("%s came back from %q, want %q", tc.q.Name, back[tc.q.Name].lane, lane.Queue)
		}
		if waited < tc.want {
			t.Errorf("%s waited %s, less than its tier %s", tc.q.Name, waited, tc.want)
		}
	}
	if back[fast.Name].lane == back[slow.Name].lane {
		t.Errorf("both waited in %s", back[fast.Name].lane)
	}
	if back[fast.Name].at.After(back[slow.Name].at) {
		t.Errorf("the 300 ms retry came back after the 1.2 s one")
	}
}

// A work queue deleted while its retries wait in a shared tier: nothing is
// lost (each retry reaches the catch-all, and `quarantine stats` counts it
// under its queue), and the other queue's retries in the same tier come
// back on time (an unroutable head would otherwise hold the tier: the
// tiers dead-letter at least once, which keeps a message until a queue
// takes it).
func TestDeletedWorkQueueRetriesReachTheCatchAll(t *testing.T) {
	t.Parallel()
	env := brokertest.Require(t)
	w := newSharedWorld(t, env, func(q *config.Queue) { q.Retry.Tiers = []time.Duration{4 * time.Second} }, "gone", "kept") // long enough for gone's runtime to stop and its queue to go while its retries wait
	gone, kept := w.queue("gone"), w.queue("kept")
	// kept's runtime runs from the start, so that its retry is published
	// while gone's still wait in the tier (checked below): behind them.
	keptCalls := make(chan arrival, 64)
	w.run([]string{"kept"}, failOnce(keptCalls, kept.Name))
	goneCalls := make(chan arrival, 64)
	goneSettled, stopGone := w.run([]string{"gone"}, failOnce(goneCalls, gone.Name))
	const n = 5
	for i := range n {
		w.publish("gone", fmt.Sprintf("g-%d", i), nil)
	}
	for range n {
		select {
		case s := <-goneSettled:
			if s.Outcome != OutcomeRetried {
				t.Fatalf("gone: outcome %s, want retried", s.Outcome)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("gone's messages were not retried")
		}
	}
	stopGone()
	ch := env.Channel("delete")
	if _, err := ch.QueueDelete(gone.Name, false, false, false); err != nil {
		t.Fatal(err)
	}
	// kept's retries wait in the same tier, behind gone's. (Without the
	// return exchange's alternate exchange, seen on 4.3.6, kept's still
	// came back on time: a quorum queue holds a dead letter no target takes
	// apart from its ready messages, retrying it for ever, so the orphans
	// do not hold the head. What fails then is the catch-all's count.)
	lane := w.topo.Work[1].Tiers[0].Lanes[0]
	if lane.Queue != w.topo.Work[0].Tiers[0].Lanes[0].Queue {
		t.Fatalf("gone and kept wait in %s and %s", w.topo.Work[0].Tiers[0].Lanes[0].Queue, lane.Queue)
	}
	if d := depth(t, ch, lane.Queue); d != n {
		t.Fatalf("the tier holds %d message(s) before kept's retry, want gone's %d: the test cannot show that kept's waited behind them", d, n)
	}
	w.publish("kept", "k-0", nil)
	firstCall := waitArrival(t, keptCalls, 10*time.Second)
	back := waitArrival(t, keptCalls, 15*time.Second)
	waited := back.at.Sub(firstCall.at)
	t.Logf("kept's retry waited %s behind %d orphans (lane TTL %s)", waited, n, lane.MaxDelay)
	if back.id != "k-0" || back.lane != lane.Queue {
		t.Fatalf("kept got %+v back", back)
	}
	if waited < lane.MinDelay || waited > lane.MaxDelay+time.Second {
		t.Errorf("kept's retry waited %s, want %s to %s", waited, lane.MinDelay, lane.MaxDelay+time.Second)
	}
	// Every orphan is a record of the catch-all, counted under its queue.
	in := &quarantine.Inspector{Conn: env.Dial("inspect"), Config: w.all}
	deadline := time.Now().Add(20 * time.Second)
	for {
		snap, err := in.Snapshot(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, r := range snap.Records {
			if r.Intake == w.all.SharedTiers.Unrouted() && r.Queue == gone.Name {
				ids = append(ids, r.Properties.MessageID)
			}
		}
		if len(ids) == n {
			slices.Sort(ids)
			for i, id := range ids {
				if id != fmt.Sprintf("g-%d", i) {
					t.Fatalf("catch-all records %v", ids)
				}
			}
			var counted int
			for _, g := range snap.Stats(quarantine.Filter{}) {
				if g.Queue == gone.Name {
					counted += g.Open
				}
			}
			if counted != n {
				t.Errorf("quarantine stats count %d of gone's retries, want %d", counted, n)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the catch-all holds %d record(s) of gone, want %d (intake %v)", len(ids), n, snap.Intake)
		}
		time.Sleep(200 * time.Millisecond) // the keeper stores them; no event to wait on
	}
}

// The move of a running queue to the shared tiers. A runtime whose config
// says shared while the broker has only the queue's own lanes (the config
// changed before `topology apply`) retries into those lanes instead of
// failing every retry. After the apply, a new runtime retries into the
// shared tiers, and what still waits in an old lane comes back to the
// queue, with its attempt count, and is handled.
func TestMovingAQueueToTheSharedTiers(t *testing.T) {
	t.Parallel()
	env := brokertest.Require(t)
	w := newSharedWorld(t, env, func(q *config.Queue) { q.Retry.TierQueues = config.TierQueuesPerQueue }, "moving")
	perQueue := w.topo
	q := w.queue("moving")
	q.Retry.TierQueues = config.TierQueuesShared
	conn := env.Dial("setup-shared")
	shared, err := topology.BuildFor(w.all, conn)
	if err != nil {
		t.Fatal(err)
	}
	own, _ := perQueue.WorkQueue(q.Name)
	wq, _ := shared.WorkQueue(q.Name)

	// Shared in the config, not on the broker: the queue's own lanes.
	calls := make(chan arrival, 16)
	_, stop := w.run([]string{"moving"}, failOnce(calls, q.Name))
	w.publish("moving", "before", nil)
	if c := waitArrival(t, calls, 10*time.Second); c.attempt != 1 {
		t.Fatalf("first call: %+v", c)
	}
	if c := waitArrival(t, calls, 10*time.Second); c.attempt != 2 || c.lane != own.Tiers[0].Lanes[0].Queue {
		t.Fatalf("before the apply the retry came back from %q (attempt %d), want %s", c.lane, c.attempt, own.Tiers[0].Lanes[0].Queue)
	}
	stop()

	// A retry waiting in the old 900 ms lane when the tiers are declared.
	applyTopology(t, conn, shared)
	calls = make(chan arrival, 16)
	retryAt := func(c *Consumer) {
		must(t, c.Handle(q.Name, testType, HandlerFunc(func(ctx context.Context, m *Message) error {
			a := arrival{queue: q.Name, id: m.MessageID, attempt: m.Attempt, at: time.Now()}
			if d, ok := m.Headers[wire.HeaderXDeath].([]any); ok && len(d) > 0 {
				a.lane, _ = d[0].(amqp.Table)[wire.XDeathQueue].(string)
			}
			calls <- a
			if m.MessageID == "waiting" && m.Attempt == 1 || m.MessageID == "after" && m.Attempt == 1 {
				return errors.New("not yet")
			}
			return nil
		})))
	}
	_, stop = w.run([]string{"moving"}, retryAt)
	w.publish("moving", "after", nil)
	seen := map[string]arrival{}
	for range 2 {
		c := waitArrival(t, calls, 10*time.Second)
		seen[fmt.Sprint(c.id, c.attempt)] = c
	}
	if c := seen["after2"]; c.lane != wq.Tiers[0].Lanes[0].Queue {
		t.Errorf("after the apply the retry came back from %q, want the shared tier %s", c.lane, wq.Tiers[0].Lanes[0].Queue)
	}
	stop()
	// An old runtime's retry, left in the queue's own 900 ms lane.
	calls = make(chan arrival, 16)
	_, stopOld := (&sharedWorld{t: t, env: env, all: oldConfig(w.all, q.Name), topo: perQueue, registry: w.registry}).run([]string{"moving"}, retryAt)
	w.publish("moving", "waiting", nil)
	if c := waitArrival(t, calls, 10*time.Second); c.attempt != 1 {
		t.Fatalf("first call: %+v", c)
	}
	stopOld()
	_, _ = w.run([]string{"moving"}, retryAt)
	c := waitArrival(t, calls, 10*time.Second)
	if c.id != "waiting" || c.attempt != 2 || c.lane != own.Tiers[0].Lanes[0].Queue {
		t.Fatalf("the retry in the old lane came back as %+v, want attempt 2 from %s", c, own.Tiers[0].Lanes[0].Queue)
	}
}

// oldConfig is cfg with the queue named name back on its own lanes.
func oldConfig(cfg *config.Config, name string) *config.Config {
	out := *cfg
	out.Queues = slices.Clone(cfg.Queues)
	for i := range out.Queues {
		if out.Queues[i].Name == name {
			out.Queues[i].Retry.TierQueues = config.TierQueuesPerQueue
		}
	}
	return &out
}

// How late retries come back, per tier, shared tiers beside per-queue
// lanes in the same run (one queue of each, one policy: tiers 200 ms, 1 s
// and 5 s, jitter 0.2 over 4 lanes): actual − requested, from the handler
// call that failed (the retry is published as it returns) to the next
// call, less the delay the runtime chose. A retry comes back neither well
// before its delay nor seconds late; the figures are logged for
// docs/performance.md.
func TestSharedTierDelayAccuracy(t *testing.T) {
	t.Parallel()
	env := brokertest.Require(t)
	jitter := 0.2
	w := newSharedWorld(t, env, func(q *config.Queue) {
		q.Retry.Tiers = []time.Duration{200 * time.Millisecond, time.Second, 5 * time.Second}
		q.Retry.Jitter, q.Retry.Lanes, q.Retry.MaxAttempts = &jitter, 4, 4
		if q.Name == env.Name("own") {
			q.Retry.TierQueues = config.TierQueuesPerQueue
		}
	}, "shared", "own")
	type key struct {
		queue, id string
		attempt   int
	}
	var mu sync.Mutex
	retried := map[key]Settled{}
	at := map[key]time.Time{}
	register := func(c *Consumer) {
		for _, q := range w.all.Queues {
			must(t, c.Handle(q.Name, testType, HandlerFunc(func(ctx context.Context, m *Message) error {
				mu.Lock()
				at[key{q.Name, m.MessageID, m.Attempt}] = time.Now()
				mu.Unlock()
				if m.Attempt < 4 {
					return errors.New("not yet")
				}
				return nil
			})))
		}
	}
	settled, _ := w.run([]string{"shared", "own"}, register)
	const n = 20
	for i := range n {
		w.publish("shared", fmt.Sprintf("s-%d", i), nil)
		w.publish("own", fmt.Sprintf("o-%d", i), nil)
	}
	acked := 0
	deadline := time.After(60 * time.Second)
	for acked < 2*n {
		select {
		case s := <-settled:
			switch s.Outcome {
			case OutcomeAcked:
				acked++
			case OutcomeRetried:
				mu.Lock()
				retried[key{s.Queue, s.MessageID, s.Attempt}] = s
				mu.Unlock()
			default:
				t.Fatalf("%s %s: %s", s.Queue, s.MessageID, s.Outcome)
			}
		case <-deadline:
			t.Fatalf("%d of %d acked within a minute", acked, 2*n)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for _, q := range w.all.Queues {
		for tier, d := range q.Retry.Tiers {
			var late []time.Duration
			for k, s := range retried {
				if k.queue != q.Name || s.Tier != tier {
					continue
				}
				failed, back := at[k], at[key{k.queue, k.id, k.attempt + 1}]
				if back.IsZero() {
					t.Fatalf("%s %s: no call after retry %d", k.queue, k.id, k.attempt)
				}
				late = append(late, back.Sub(failed)-s.Delay)
			}
			slices.Sort(late)
			if len(late) != n {
				t.Fatalf("%s tier %s: %d retries, want %d", q.Retry.TierQueues, d, len(late), n)
			}
			t.Logf("%-9s tier %-5s: actual − requested min %6.1f ms, median %6.1f ms, max %6.1f ms (%d retries)",
				q.Retry.TierQueues, d, ms(late[0]), ms(late[n/2]), ms(late[n-1]), n)
			// A retry may come back a little early: the broker starts a
			// TTL when the copy reaches the tier, and times its expiry on
			// its own clock and timers (seen up to 54 ms early on a 5 s
			// tier under load, on both kinds of tier alike). Early by more
			// than earlyBound is wrong, and so is late by lateBound: a
			// retry held as long as the 5 s tier, or stuck. Late by less is
			// the machine (seen: 1.07 s on the 200 ms tier of 4.0.5 at a
			// load average of 30, per-queue lanes alike); how late
			// retries come back is measured, not asserted: the log.
			const earlyBound, lateBound = 250 * time.Millisecond, 3 * time.Second
			if late[0] < -earlyBound || late[n-1] > lateBound {
				t.Errorf("%s tier %s: actual − requested from %s to %s", q.Retry.TierQueues, d, late[0], late[n-1])
			}
		}
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
