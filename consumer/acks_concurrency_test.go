package consumer

import (
	"math/rand"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// lockedModel is modelChannel's broker model, safe for the window's
// concurrent writers (the feeder's rejects of dropped tags are written
// outside the window's lock, as are workers' rejects); it reports with
// Errorf so that any goroutine may call it.
type lockedModel struct {
	t       *testing.T
	mu      sync.Mutex
	unacked map[uint64]bool // delivered by the broker, not settled there
	settled map[uint64]bool // a worker settled it (may be written by a multiple ack)
	dropped map[uint64]bool // the client dropped it: only a requeue may settle it
	// what each tag got at the broker
	acked, rejected, requeued map[uint64]int
}

func newLockedModel(t *testing.T) *lockedModel {
	return &lockedModel{t: t, unacked: map[uint64]bool{}, settled: map[uint64]bool{}, dropped: map[uint64]bool{},
		acked: map[uint64]int{}, rejected: map[uint64]int{}, requeued: map[uint64]int{}}
}

func (m *lockedModel) Ack(tag uint64, multiple bool) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.unacked[tag] {
		m.t.Errorf("ack of tag %d (multiple %v), not unacked: PRECONDITION_FAILED, the channel closes", tag, multiple)
		return nil
	}
	if !multiple {
		if !m.settled[tag] {
			m.t.Errorf("ack of tag %d, not settled", tag)
		}
		delete(m.unacked, tag)
		m.acked[tag]++
		return nil
	}
	for u := range m.unacked {
		if u <= tag {
			if !m.settled[u] {
				m.t.Errorf("multiple ack of %d covers %d, not settled (dropped %v)", tag, u, m.dropped[u])
			}
			delete(m.unacked, u)
			m.acked[u]++
		}
	}
	return nil
}

// Nack is how the window requeues a delivery the client dropped (workers
// reject): single, with requeue, and only for a dropped tag.
func (m *lockedModel) Nack(tag uint64, multiple, requeue bool) error {
	m.mu.Lock()
	dropped := m.dropped[tag]
	m.mu.Unlock()
	if multiple || !requeue || !dropped {
		m.t.Errorf("nack of tag %d (multiple %v, requeue %v, dropped %v): only a dropped delivery is nacked, alone, with requeue", tag, multiple, requeue, dropped)
		return nil
	}
	return m.Reject(tag, true)
}

func (m *lockedModel) Reject(tag uint64, requeue bool) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.unacked[tag] {
		m.t.Errorf("reject of tag %d, not unacked: PRECONDITION_FAILED, the channel closes", tag)
		return nil
	}
	if !m.settled[tag] && !(m.dropped[tag] && requeue) {
		m.t.Errorf("reject of tag %d (requeue %v), neither settled by a worker nor dropped", tag, requeue)
	}
	delete(m.unacked, tag)
	if requeue {
		m.requeued[tag]++
	} else {
		m.rejected[tag]++
	}
	return nil
}

// The window under its real concurrency, against the broker model: a
// feeder takes deliveries in tag order (some dropped by the client in
// between), workers settle them in any order (ack, reject, requeue) and
// flush as they wait, and the timer flushes too. Every tag ends acked,
// rejected or requeued exactly once; a dropped tag only requeued; no write
// names a tag the broker no longer holds; no multiple ack covers a tag not
// settled.
func TestAckWindowConcurrentWithDroppedTagsAgainstAModel(t *testing.T) {
	t.Parallel()
	for seed := range int64(20) {
		rng := rand.New(rand.NewSource(seed))
		m := newLockedModel(t)
		prefetch := 4 + rng.Intn(64)
		w := newAckWindow(func(write func() error) error { return write() }, prefetch, 1)
		w.maxDelay = time.Duration(rng.Intn(3)) * time.Millisecond // the timer runs concurrently
		const n = 3000
		fed := make(chan *amqp.Delivery, prefetch)
		// The broker's deliveries and the client's drops, decided up
		// front: a run of drops follows a breaker's pause now and then.
		dropNext := 0
		var order []uint64
		for tag := uint64(1); tag <= n; tag++ {
			m.unacked[tag] = true
			if dropNext == 0 && rng.Intn(200) == 0 {
				dropNext = 1 + rng.Intn(5)
			}
			if dropNext > 0 && tag < n { // the last is fed: it shows the drops
				dropNext--
				m.dropped[tag] = true
				continue
			}
			order = append(order, tag)
		}
		go func() {
			defer close(fed)
			for _, tag := range order {
				d := &amqp.Delivery{DeliveryTag: tag, Acknowledger: m}
				if _, err := w.received(d); err != nil {
					t.Errorf("received %d: %v", tag, err)
				}
				fed <- d
			}
		}()
		var wg sync.WaitGroup
		for g := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := rand.New(rand.NewSource(seed*100 + int64(g)))
				var held []*amqp.Delivery // a worker may hold some: its pipeline of settlements
				settle := func(d *amqp.Delivery) {
					m.mu.Lock()
					m.settled[d.DeliveryTag] = true
					m.mu.Unlock()
					switch r.Intn(8) {
					case 0:
						_ = d.Acknowledger.Reject(d.DeliveryTag, false)
						w.rejected(d)
					case 1:
						_ = d.Acknowledger.Reject(d.DeliveryTag, true)
						w.rejected(d)
					default:
						w.ack(d, func(error) {})
					}
				}
				for d := range fed {
					held = append(held, d)
					for len(held) > 0 && r.Intn(3) != 0 {
						i := r.Intn(len(held))
						settle(held[i])
						held = append(held[:i], held[i+1:]...)
					}
					if r.Intn(4) == 0 {
						w.flush(r.Intn(2) == 0)
					}
				}
				for _, d := range held {
					settle(d)
				}
				w.flush(true)
			}()
		}
		wg.Wait()
		w.flush(true)
		w.mu.Lock()
		if w.timer != nil {
			w.timer.Stop()
		}
		w.mu.Unlock()
		m.mu.Lock()
		for tag := uint64(1); tag <= n; tag++ {
			total := m.acked[tag] + m.rejected[tag] + m.requeued[tag]
			if total != 1 {
				t.Errorf("seed %d: tag %d settled %d times at the broker (dropped %v)", seed, tag, total, m.dropped[tag])
			}
			if m.dropped[tag] && m.requeued[tag] != 1 {
				t.Errorf("seed %d: dropped tag %d not requeued", seed, tag)
			}
		}
		m.mu.Unlock()
		if w.held() != 0 || w.prefix != n {
			t.Errorf("seed %d: window holds %d entries, prefix %d", seed, w.held(), w.prefix)
		}
		if t.Failed() {
			t.Fatalf("seed %d failed", seed)
		}
	}
}
