package consumer

import (
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// ackWindow coalesces the acks of one consume channel. The channel numbers
// its deliveries 1, 2, 3, ... (one consumer per channel), and an ack with
// multiple set settles every outstanding delivery up to its tag; so one ack
// may cover the settled prefix of the tags, and never a tag beyond the
// first one still being worked on (or never taken up by a worker: that tag
// is not settled either).
//
// A delivery is settled for the window when its ack is asked for (ack) or
// once its reject, with or without requeue, was written (rejected). Acks are
// written by flush: when a worker is about to wait for its next delivery,
// when batch acks are waiting, or when the oldest has waited maxDelay (a
// timer: the worker that asked may be in its next handler, and the one
// holding a gap in the prefix may be in a long one); each waiting ack's
// report is then called with the write's result. What the prefix cannot
// cover (a delivery ahead of it still in a handler) waits for it until a
// forced flush acks it on its own: a worker's before it waits, or the
// timer's, at most every ackStale.
//
// The write goes through settle: between a stop's basic.cancel and its
// cancel-ok it waits (see queueSession.settle).
type ackWindow struct {
	settle   func(write func() error) error
	batch    int
	maxDelay time.Duration

	mu      sync.Mutex
	prefix  uint64               // every tag up to prefix is settled and written
	tags    map[uint64]*ackState // settled tags past prefix
	waiting int                  // acks not yet written
	oldest  time.Time            // when the oldest of them was asked for
	channel amqp.Acknowledger    // the channel of the deliveries
	timer   *time.Timer          // flushes maxDelay after an ack waits
	armed   bool                 // timer is set
	forced  time.Time            // the latest forced flush
}

type ackState struct {
	written bool        // acked on its own, or rejected
	report  func(error) // nil once written
}

// ackBatch is how many acks may wait for one write, at most; ackDelay how
// long the oldest may wait while the worker is busy, and ackIdle how long a
// worker with acks waiting waits for its next delivery before it writes
// them.
const (
	ackBatch = 64
	ackDelay = 5 * time.Millisecond
	ackIdle  = time.Millisecond
)

func newAckWindow(settle func(func() error) error, prefetch int) *ackWindow {
	return &ackWindow{settle: settle, batch: max(1, min(ackBatch, prefetch/4)), maxDelay: ackDelay, tags: map[uint64]*ackState{}}
}

// ack asks for d's ack; report is called once it was written (nil) or could
// not be (the channel is gone).
func (w *ackWindow) ack(d *amqp.Delivery, report func(error)) {
	w.mu.Lock()
	w.channel = d.Acknowledger
	if w.waiting == 0 {
		w.oldest = time.Now()
	}
	w.waiting++
	w.tags[d.DeliveryTag] = &ackState{report: report}
	due := w.waiting >= w.batch || time.Since(w.oldest) >= w.maxDelay
	if !due {
		w.arm()
	}
	w.mu.Unlock()
	if due {
		w.flush(false)
	}
}

// ackStale is how often, at most, the timer acks on their own what waits
// behind a gap: forced flushes write one frame per ack.
const ackStale = 50 * time.Millisecond

// arm sets the timer unless it is set. Called with mu held.
func (w *ackWindow) arm() {
	if w.armed {
		return
	}
	w.armed = true
	if w.timer == nil {
		w.timer = time.AfterFunc(w.maxDelay, w.expire)
	} else {
		w.timer.Reset(w.maxDelay)
	}
}

// expire writes what waited maxDelay: the settled prefix, and what waits
// behind a gap too unless a forced flush was written within ackStale (then
// it tries again later).
func (w *ackWindow) expire() {
	w.mu.Lock()
	w.armed = false
	force := time.Since(w.forced) >= ackStale
	w.mu.Unlock()
	w.flush(force)
	w.mu.Lock()
	if w.waiting > 0 {
		w.arm()
	}
	w.mu.Unlock()
}

// holds says whether acks wait to be written.
func (w *ackWindow) holds() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.waiting > 0
}

// rejected notes that d's reject was written (or could not be: its channel
// is gone): the prefix may pass it.
func (w *ackWindow) rejected(d *amqp.Delivery) {
	w.mu.Lock()
	w.tags[d.DeliveryTag] = &ackState{written: true}
	w.mu.Unlock()
}

// flush writes one ack with multiple set for the settled prefix, if it holds
// an ack. With force, or while batch acks still wait behind a delivery that
// is in a handler, it acks those one by one. Writes are made in order under
// the window's lock (a tag acked twice would close the channel); the
// reports run after it.
func (w *ackWindow) flush(force bool) {
	var reports []func(error)
	var errs []error
	w.mu.Lock()
	if w.waiting > 0 {
		// The multiple ack names the last tag of the prefix still unacked:
		// a tag the broker no longer holds would be an unknown delivery tag.
		var last uint64
		for tag := w.prefix + 1; ; tag++ {
			st, ok := w.tags[tag]
			if !ok {
				break
			}
			if !st.written {
				last = tag
				reports = append(reports, st.report)
				st.written, st.report = true, nil
			}
		}
		if last > 0 {
			err := w.write(last, true)
			w.waiting -= len(reports)
			for range reports {
				errs = append(errs, err)
			}
		}
		if force || w.waiting >= w.batch {
			w.forced = time.Now()
			for tag, st := range w.tags {
				if st.written {
					continue
				}
				reports = append(reports, st.report)
				st.written, st.report = true, nil
				w.waiting--
				errs = append(errs, w.write(tag, false))
			}
		}
		w.oldest = time.Now()
	}
	w.advance()
	w.mu.Unlock()
	for i, r := range reports {
		r(errs[i])
	}
}

// advance moves the prefix over written tags and forgets them.
func (w *ackWindow) advance() {
	for {
		st, ok := w.tags[w.prefix+1]
		if !ok || !st.written {
			return
		}
		delete(w.tags, w.prefix+1)
		w.prefix++
	}
}

func (w *ackWindow) write(tag uint64, multiple bool) error {
	ch := w.channel
	return w.settle(func() error { return ch.Ack(tag, multiple) })
}
