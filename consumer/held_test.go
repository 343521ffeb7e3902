package consumer

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"weak"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/triage"
	"github.com/dlxbridge/dlxbridge/wire"
)

// A held carries a delivery from the feeder to its settlement (receive.go).
// These run the real feeder step (hold, received), several workers' loops,
// the session's ack window and the settlement code against a broker model
// (lockedModel) that grants the prefetch as credit: every delivery must be
// settled at the broker exactly once, never acked before its handler
// returned or its copy was confirmed, reported to OnSettled exactly once
// with the outcome the broker saw, and its held must be garbage once
// settled.

// creditModel is lockedModel behind one lock, granting a credit for every
// tag it settles (the broker's prefetch), and failing every write once
// closed (the channel is gone).
type creditModel struct {
	*lockedModel
	mu     sync.Mutex
	credit chan struct{}
	closed atomic.Bool
}

var errModelClosed = errors.New("model channel closed")

func (c *creditModel) wrap(write func() error) error {
	if c.closed.Load() {
		return errModelClosed
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.lockedModel.mu.Lock()
	before := len(c.unacked)
	c.lockedModel.mu.Unlock()
	err := write()
	c.lockedModel.mu.Lock()
	freed := before - len(c.unacked)
	c.lockedModel.mu.Unlock()
	for range freed {
		c.credit <- struct{}{}
	}
	return err
}

func (c *creditModel) Ack(tag uint64, multiple bool) error {
	return c.wrap(func() error { return c.lockedModel.Ack(tag, multiple) })
}

func (c *creditModel) Nack(tag uint64, multiple, requeue bool) error {
	return c.wrap(func() error { return c.lockedModel.Nack(tag, multiple, requeue) })
}

func (c *creditModel) Reject(tag uint64, requeue bool) error {
	return c.wrap(func() error { return c.lockedModel.Reject(tag, requeue) })
}

func (c *creditModel) settle(tag uint64) {
	c.lockedModel.mu.Lock()
	c.lockedModel.settled[tag] = true
	c.lockedModel.mu.Unlock()
}

// modelConfirmer confirms copies on another goroutine, after a random
// delay, failing the ones fail picks; the tag whose copy it is counts as
// settled by its worker from then on (the ack, or the requeue, may follow).
type modelConfirmer struct {
	m    *creditModel
	fail func(tag uint64) bool
	wg   sync.WaitGroup
}

func (f *modelConfirmer) Publish(ctx context.Context, exchange, key string, p amqp.Publishing, confirmed func(error)) {
	tag, err := strconv.ParseUint(p.MessageId[len("m-"):], 10, 64)
	if err != nil {
		panic(fmt.Sprintf("copy with message id %q", p.MessageId))
	}
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		time.Sleep(time.Duration(tag%3) * time.Millisecond)
		f.m.settle(tag)
		if f.fail != nil && f.fail(tag) {
			confirmed(errors.New("model: publish nacked"))
			return
		}
		confirmed(nil)
	}()
}

// heldRun is one run's shape.
type heldRun struct {
	n, prefetch, concurrency int
	seed                     int64
	// closeAt: the channel is gone once this tag was delivered (0: never);
	// the feeder stops there.
	closeAt uint64
	// drainAt: the drain deadline passes once this tag was delivered (0:
	// never); the feeder stops there.
	drainAt uint64
	// abandon: tags whose handler ignores its deadline.
	abandon map[uint64]bool
	// feeder: the session's own feeder (feed, hand, leave) takes the
	// deliveries up, as a session does, rather than the test's loop.
	feeder bool
	// lostAt: the channel is gone once this tag was delivered (0: never),
	// as a lost channel ends a session: the stop begins, and the workers
	// go on with what they hold (their acks and requeues fail) until the
	// drain deadline, deadlineAfter later (0: none comes).
	lostAt        uint64
	deadlineAfter time.Duration
}

type heldResult struct {
	qs       *queueSession
	m        *creditModel
	settled  map[uint64][]Outcome
	fed      []uint64
	retained []uint64
}

func runHeld(t *testing.T, r heldRun) heldResult {
	t.Helper()
	rng := rand.New(rand.NewSource(r.seed))
	const small, big = 1024, 64 << 10
	// Each tag's fate, decided up front.
	type fate int
	const (
		succeed fate = iota
		transient
		permanent
		panics
		bigFailure // a body over the learned max message size fails: no copy fits, dead-lettered
		readmit    // a carried count (4.x): re-admitted before the handler
		crashLoop  // this queue's count over the guard: quarantined before the handler
		pubFails   // transient, and the retry's publish fails: requeued
	)
	// Percent of the deliveries with each fate, in fate order.
	weights := []int{succeed: 55, transient: 12, permanent: 7, panics: 6, bigFailure: 5, readmit: 6, crashLoop: 5, pubFails: 4}
	fates := make([]fate, r.n+1)
	for tag := 1; tag <= r.n; tag++ {
		x := rng.Intn(100)
		for f, w := range weights {
			if x < w {
				fates[tag] = fate(f)
				break
			}
			x -= w
		}
	}
	for tag := range r.abandon {
		// Its handler must run (the run waits for it): no fate that
		// settles it before (a re-admission, the crash-loop guard).
		fates[tag] = succeed
	}
	m := &creditModel{lockedModel: newLockedModel(t), credit: make(chan struct{}, r.prefetch)}
	for range r.prefetch {
		m.credit <- struct{}{}
	}
	var mu sync.Mutex
	settled := map[uint64][]Outcome{}
	var abandoned sync.WaitGroup
	// Every handler keeps its context and message past its return, as a
	// handler that hands them to a goroutine of its own may: neither may
	// keep the held (the delivery, its outcome) alive.
	var keptMu sync.Mutex
	var kept []any
	b := newProcessBundle(t, func(c *Config) {
		q := &c.File.Queues[0]
		q.Consumer.Concurrency = r.concurrency
		q.Consumer.Prefetch = r.prefetch
		q.Consumer.HandlerTimeout = 300 * time.Millisecond
		q.Retry.ImmediateRetries = 1
		// The breaker (on by default) holds deliveries in the feeder
		// while it pauses: not for long here.
		c.hooks = &testHooks{maxHold: 20 * time.Millisecond}
		c.OnSettled = func(s Settled) {
			tag, err := strconv.ParseUint(s.MessageID[len("m-"):], 10, 64)
			if err != nil {
				t.Errorf("settled %q", s.MessageID)
				return
			}
			mu.Lock()
			settled[tag] = append(settled[tag], s.Outcome)
			mu.Unlock()
		}
	}, func(ctx context.Context, msg *Message) error {
		tag, _ := strconv.ParseUint(msg.MessageID[len("m-"):], 10, 64)
		keptMu.Lock()
		kept = append(kept, ctx, msg)
		keptMu.Unlock()
		if r.abandon[tag] {
			// The goroutine that takes over settles it, whatever its
			// copy's fate (a dead-lettering rejects it).
			m.settle(tag)
			defer abandoned.Done()
			time.Sleep(abandonGrace + 600*time.Millisecond) // ignores ctx
			return nil
		}
		var o processOrder
		if err := msg.Bind(&o); err != nil {
			return err
		}
		switch fates[tag] {
		case transient, pubFails:
			return errors.New("transient")
		case permanent:
			return triage.Permanent(errors.New("permanent"))
		case panics:
			panic("handler panics")
		case bigFailure:
			m.settle(tag) // its dead-lettering (a reject) may follow
			return triage.Permanent(errors.New("permanent, big"))
		}
		m.settle(tag) // the ack may follow
		return nil
	})
	abandoned.Add(len(r.abandon))
	qs := b.w.s
	qs.carriedCounts = true
	qs.maxSize = &sizeLimit{}
	qs.maxSize.learn(16 << 10)
	qs.acks = newAckWindow(qs.settle, r.prefetch, r.concurrency)
	qs.fed = make(chan fedDelivery)
	conf := &modelConfirmer{m: m, fail: func(tag uint64) bool { return fates[tag] == pubFails }}
	for range r.concurrency {
		qs.workers.Add(1)
		go newWorker(qs, conf).work()
	}
	smallBody, bigBody := processBody(small), processBody(big)
	var src chan amqp.Delivery
	feederEnded := make(chan struct{})
	if r.feeder {
		src = make(chan amqp.Delivery)
		qs.sub = &subscription{qs: qs}
		// Open, as far as handOver asks (a stop hands over what the
		// feeder holds).
		qs.ch, qs.pubConn = &amqp.Channel{}, &amqp.Connection{}
		qs.workers.Add(1)
		go func() {
			defer close(feederEnded)
			defer qs.workers.Done()
			qs.feed(context.Background(), src, make(chan error, 1))
		}()
	}
	var deadline *time.Timer
	upstream := []any{amqp.Table{"queue": "upstream", "reason": "rejected", "count": int64(1), "time": time.Now(), "exchange": "", "routing-keys": []any{"upstream"}}}

	// The feeder, as feed runs it: each delivery taken up once (hold),
	// noted in the window (received), handed to a worker.
	var weaks []weak.Pointer[held]
	var fed []uint64
feeding:
	for tag := uint64(1); tag <= uint64(r.n); tag++ {
		select {
		case <-m.credit:
		case <-time.After(20 * time.Second):
			t.Fatalf("no credit for tag %d: a delivery is never settled", tag)
		}
		m.lockedModel.mu.Lock()
		m.unacked[tag] = true
		m.lockedModel.mu.Unlock()
		d := amqp.Delivery{Acknowledger: m, DeliveryTag: tag,
			ContentType: "application/json", Type: "orders.created", DeliveryMode: amqp.Persistent,
			MessageId: "m-" + strconv.FormatUint(tag, 10),
			Headers:   amqp.Table{wire.DefaultVersionHeader: "2"},
			Exchange:  "orders", RoutingKey: "order.created", Body: smallBody}
		switch fates[tag] {
		case bigFailure:
			d.Body = bigBody
		case readmit:
			d.Redelivered = true
			d.Headers["x-death"] = upstream
			d.Headers[wire.HeaderDeliveryCount] = int64(1)
		case crashLoop:
			d.Redelivered = true
			d.Headers[wire.HeaderDeliveryCount] = int64(100)
		}
		if r.feeder {
			// Taken up once the feeder has it: it may have ended (the
			// drain deadline) without taking this one.
			select {
			case src <- d:
			case <-feederEnded:
				break feeding
			}
		} else {
			h := qs.hold(&d)
			weaks = append(weaks, weak.Make(h))
			qs.received(&h.d)
			qs.fed <- fedDelivery{h: h}
		}
		fed = append(fed, tag)
		if tag == r.closeAt {
			m.closed.Store(true)
			qs.cancelHandler() // the session ends with its channel
			break
		}
		if tag == r.drainAt {
			close(qs.stopping)
			close(qs.cancelled)
			qs.cancelHandler()
			break
		}
		if tag == r.lostAt {
			m.closed.Store(true)
			close(qs.stopping)
			close(qs.cancelled)
			if r.deadlineAfter > 0 {
				deadline = time.AfterFunc(r.deadlineAfter, qs.cancelHandler)
			}
			break
		}
	}
	if r.feeder {
		// The consumer is cancelled: the client closes its deliveries.
		qs.sub.mu.Lock()
		qs.sub.stopped = true
		qs.sub.mu.Unlock()
		close(src)
	} else {
		close(qs.fed)
	}
	qs.workers.Wait()
	if deadline != nil {
		deadline.Stop()
	}
	conf.wg.Wait()
	abandoned.Wait()
	qs.acks.flush(true)

	// Every report has run (the workers' closes flushed the window): no
	// held may be reachable any more.
	runtime.GC()
	runtime.GC()
	var retained []uint64
	for i, w := range weaks {
		if w.Value() != nil {
			retained = append(retained, fed[i])
		}
	}
	keptMu.Lock()
	runtime.KeepAlive(kept)
	keptMu.Unlock()
	mu.Lock()
	defer mu.Unlock()
	return heldResult{qs: qs, m: m, settled: settled, fed: fed, retained: retained}
}

// check: each fed tag reported exactly once, with the outcome the broker
// saw; no held retained.
//
// A delivery a worker took past the drain deadline, left for the channel
// close to requeue, is reported too (abandoned); so is a requeue the closed
// channel could not write (ack_failed), never as requeued.
func (res heldResult) check(t *testing.T, name string) {
	t.Helper()
	m := res.m
	m.lockedModel.mu.Lock()
	defer m.lockedModel.mu.Unlock()
	counts := map[Outcome]int{}
	for _, tag := range res.fed {
		outs := res.settled[tag]
		if len(outs) != 1 {
			t.Errorf("%s: tag %d reported %d times: %v", name, tag, len(outs), outs)
			continue
		}
		o := outs[0]
		counts[o]++
		acked, rejected, requeued := m.acked[tag], m.rejected[tag], m.requeued[tag]
		var ok bool
		switch o {
		case OutcomeAcked, OutcomeRetried, OutcomeQuarantined, OutcomeReadmitted:
			ok = acked == 1 && rejected+requeued == 0
		case OutcomeDeadLettered:
			ok = rejected == 1 && acked+requeued == 0
		case OutcomeRequeued:
			ok = requeued == 1 && acked+rejected == 0
		case OutcomeAckFailed, OutcomeAbandoned:
			ok = acked+rejected+requeued == 0
		}
		if !ok {
			t.Errorf("%s: tag %d reported %s; the broker saw %d acks, %d rejects, %d requeues", name, tag, o, acked, rejected, requeued)
		}
	}
	// The stop's count of what it left is the abandoned reports.
	if n := res.qs.unsettled.Load(); n != int64(counts[OutcomeAbandoned]) {
		t.Errorf("%s: the session counted %d deliveries left unsettled; %d were reported abandoned", name, n, counts[OutcomeAbandoned])
	}
	if len(res.retained) > 0 {
		t.Errorf("%s: %d helds still reachable after their settlement (tags %v)", name, len(res.retained), res.retained[:min(10, len(res.retained))])
	}
	t.Logf("%s: %d fed, outcomes %v", name, len(res.fed), counts)
}

// Several workers, prefetch small and large, every settlement path: each
// delivery settled once at the broker, reported once, its held garbage
// once settled.
func TestHeldSettledOnceUnderConcurrentWorkers(t *testing.T) {
	t.Parallel()
	for _, r := range []heldRun{
		{n: 1500, prefetch: 2, concurrency: 2, seed: 1},
		{n: 1500, prefetch: 7, concurrency: 4, seed: 2},
		{n: 3000, prefetch: 300, concurrency: 4, seed: 3, abandon: map[uint64]bool{200: true, 1700: true}},
		{n: 2000, prefetch: 50, concurrency: 8, seed: 4},
	} {
		name := fmt.Sprintf("prefetch %d concurrency %d", r.prefetch, r.concurrency)
		runHeld(t, r).check(t, name)
	}
}

// The channel goes away, or the drain deadline passes, while deliveries
// are held: each is reported at most once (ack failed, abandoned), and a
// delivery the broker settled is reported as it settled it.
func TestHeldSessionEndsMidFlight(t *testing.T) {
	t.Parallel()
	for _, r := range []heldRun{
		{n: 2000, prefetch: 64, concurrency: 4, seed: 5, closeAt: 700},
		{n: 2000, prefetch: 3, concurrency: 2, seed: 6, closeAt: 333},
		{n: 2000, prefetch: 64, concurrency: 4, seed: 7, drainAt: 900},
		{n: 2000, prefetch: 5, concurrency: 3, seed: 8, drainAt: 41},
	} {
		runHeld(t, r).check(t, fmt.Sprintf("closed at %d, drained at %d", r.closeAt, r.drainAt))
	}
}

// The session's own feeder takes the deliveries up, and the session ends
// every way it can: its channel lost while the workers go on (their acks
// and requeues then fail) with or without a drain deadline after it, the
// drain deadline passing, the channel and the handlers ending together;
// over prefetches and concurrencies at random. Every delivery the feeder
// took up is reported exactly once, as the broker saw it, and the
// session's count of what it left is its abandoned reports.
func TestHeldFeederSessionEndsAtRandom(t *testing.T) {
	t.Parallel()
	seed := time.Now().UnixNano()
	rng := rand.New(rand.NewSource(seed))
	t.Logf("seed %d", seed)
	for i := range 6 {
		r := heldRun{n: 300 + rng.Intn(900), prefetch: 2 + rng.Intn(299), concurrency: 2 + rng.Intn(7), seed: rng.Int63(), feeder: true}
		at := uint64(1 + rng.Intn(r.n))
		switch i % 4 {
		case 0:
			r.lostAt = at
		case 1:
			r.lostAt, r.deadlineAfter = at, time.Duration(1+rng.Intn(50))*time.Millisecond
		case 2:
			r.drainAt = at
		case 3:
			r.closeAt = at
		}
		if i%4 == 0 && rng.Intn(2) == 0 {
			// Only where every delivery reaches its handler: the run
			// waits for this one's.
			r.abandon = map[uint64]bool{uint64(1 + rng.Intn(int(at))): true}
		}
		name := fmt.Sprintf("seed %d prefetch %d concurrency %d lost at %d (deadline %s) drained at %d closed at %d",
			r.seed, r.prefetch, r.concurrency, r.lostAt, r.deadlineAfter, r.drainAt, r.closeAt)
		runHeld(t, r).check(t, name)
	}
}
