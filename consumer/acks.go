package consumer

import (
	"cmp"
	"slices"
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
//
// Memory stays bounded by the prefetch while a tag pins the prefix (a
// handler may hold it up to its timeout, and every forced flush frees
// prefetch for more deliveries behind it): asked holds acks not yet
// written, each a delivery the broker counts against the prefetch, and
// written holds the tags past the prefix already written as ranges: one
// range more only for each unsettled tag between them: a delivery in hand
// (which the prefetch bounds too), or one the client dropped, until the
// next delivery shows it and it is requeued (see received).
type ackWindow struct {
	settle   func(write func() error) error
	batch    int
	maxDelay time.Duration

	mu      sync.Mutex
	prefix  uint64                 // every tag up to prefix is settled and written
	asked   map[uint64]func(error) // acks asked for past prefix, not written yet, with their reports
	written []tagRange             // tags past prefix acked on their own or rejected: in order, apart
	oldest  time.Time              // when the oldest ack waiting was asked for
	channel amqp.Acknowledger      // the channel of the deliveries
	timer   *time.Timer            // flushes maxDelay after an ack waits
	armed   bool                   // timer is set
	forced  time.Time              // the latest forced flush
	seen    uint64                 // the latest tag the feeder took up; the feeder's alone
}

// tagRange is the tags lo to hi, both included.
type tagRange struct{ lo, hi uint64 }

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
	return &ackWindow{settle: settle, batch: max(1, min(ackBatch, prefetch/4)), maxDelay: ackDelay, asked: map[uint64]func(error){}}
}

// ack asks for d's ack; report is called once it was written (nil) or could
// not be (the channel is gone).
func (w *ackWindow) ack(d *amqp.Delivery, report func(error)) {
	w.mu.Lock()
	w.channel = d.Acknowledger
	if len(w.asked) == 0 {
		w.oldest = time.Now()
	}
	w.asked[d.DeliveryTag] = report
	due := len(w.asked) >= w.batch || time.Since(w.oldest) >= w.maxDelay
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
	if len(w.asked) > 0 {
		w.arm()
	}
	w.mu.Unlock()
}

// holds says whether acks wait to be written.
func (w *ackWindow) holds() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.asked) > 0
}

// rejected notes that d's reject was written (or could not be: its channel
// is gone): the prefix may pass it.
func (w *ackWindow) rejected(d *amqp.Delivery) {
	w.mu.Lock()
	w.mark(d.DeliveryTag)
	w.advance()
	w.mu.Unlock()
}

// received notes that the feeder took d up, and settles the deliveries the
// client dropped before it. The channel numbers its deliveries one by one
// and the feeder takes them in that order, one subscription after the
// other, so a tag skipped is a delivery the client dropped as addressed to
// a consumer it no longer knows (a quorum queue's delivery that crossed a
// basic.cancel, which queueSession.settle is there to prevent). No handler
// sees it and nothing else would settle it: it would pin the prefix, every
// later ack written on its own, and stay unacked until the channel closes
// (or consumer_timeout closes it). It is nacked with requeue: the broker
// delivers it again. Only the feeder calls received. received returns the dropped tags and the first
// reject's error.
func (w *ackWindow) received(d *amqp.Delivery) (dropped []uint64, err error) {
	// seen is the feeder's alone: no lock on the path of every delivery
	// (a stop's flush holds the lock until the broker's cancel-ok).
	from := w.seen + 1
	w.seen = max(w.seen, d.DeliveryTag)
	for tag := from; tag < d.DeliveryTag; tag++ {
		// Marked only once written: no multiple ack covers it before.
		// A nack, not a reject: no handler saw the message, and from
		// RabbitMQ 4.3 a reject with requeue charges it a delivery.
		if rerr := w.settle(func() error { return d.Acknowledger.Nack(tag, false, true) }); rerr != nil && err == nil {
			err = rerr
		}
		dropped = append(dropped, tag)
		w.mu.Lock()
		w.mark(tag)
		w.advance()
		w.mu.Unlock()
	}
	return dropped, err
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
	if len(w.asked) > 0 {
		// The multiple ack names the last tag of the prefix still unacked:
		// a tag the broker no longer holds would be an unknown delivery tag.
		var last uint64
		tag, passed := w.prefix+1, 0
		for {
			if passed < len(w.written) && w.written[passed].lo == tag {
				tag = w.written[passed].hi + 1
				passed++
				continue
			}
			report, ok := w.asked[tag]
			if !ok {
				break
			}
			delete(w.asked, tag)
			reports = append(reports, report)
			last = tag
			tag++
		}
		if last > 0 {
			err := w.write(last, true)
			for range reports {
				errs = append(errs, err)
			}
			// Every tag before the one that stopped the walk is written.
			w.prefix = tag - 1
			w.written = append(w.written[:0], w.written[passed:]...)
		}
		if force || len(w.asked) >= w.batch {
			w.forced = time.Now()
			tags := make([]uint64, 0, len(w.asked))
			for tag := range w.asked {
				tags = append(tags, tag)
			}
			slices.Sort(tags)
			for _, tag := range tags {
				reports = append(reports, w.asked[tag])
				delete(w.asked, tag)
				errs = append(errs, w.write(tag, false))
				w.mark(tag)
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

// mark notes that tag was written on its own (acked or rejected), in
// written, joining the ranges it touches. Called with mu held.
func (w *ackWindow) mark(tag uint64) {
	rs := w.written
	i, _ := slices.BinarySearchFunc(rs, tag, func(r tagRange, tag uint64) int { return cmp.Compare(r.lo, tag+1) })
	// rs[i-1] is the last range that starts at or before tag.
	switch {
	case i > 0 && rs[i-1].hi >= tag:
		return // written before
	case i > 0 && rs[i-1].hi+1 == tag:
		rs[i-1].hi = tag
		if i < len(rs) && rs[i].lo == tag+1 {
			rs[i-1].hi = rs[i].hi
			w.written = slices.Delete(rs, i, i+1)
		}
	case i < len(rs) && rs[i].lo == tag+1:
		rs[i].lo = tag
	default:
		w.written = slices.Insert(rs, i, tagRange{tag, tag})
	}
}

// advance moves the prefix over the written tags that follow it and
// forgets them. Called with mu held.
func (w *ackWindow) advance() {
	n := 0
	for n < len(w.written) && w.written[n].lo <= w.prefix+1 {
		w.prefix = max(w.prefix, w.written[n].hi)
		n++
	}
	if n > 0 {
		w.written = append(w.written[:0], w.written[n:]...)
	}
}

// held is how many entries the window keeps: acks waiting, and ranges of
// tags written past the prefix.
func (w *ackWindow) held() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.asked) + len(w.written)
}

func (w *ackWindow) write(tag uint64, multiple bool) error {
	ch := w.channel
	return w.settle(func() error { return ch.Ack(tag, multiple) })
}
