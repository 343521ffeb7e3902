package consumer

import (
	"cmp"
	"log/slog"
	"slices"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
)

// ackOutcome asks for o's ack and records o as result once it is written
// (acks are coalesced, see ackWindow). An ack on a dead channel fails: the
// broker will redeliver the message (a duplicate, which idempotency keys
// are for), so it is recorded as OutcomeAckFailed.
func (w *worker) ackOutcome(o outcome, result Outcome) {
	o.a.Ack(func(err error) { w.acked(&o, result, err) })
}

// acked records o once its ack was written (err nil) or could not be.
func (w *worker) acked(o *outcome, result Outcome, err error) {
	if err != nil {
		w.done(o, OutcomeAckFailed, err)
		w.deps.log.Warn("ack failed; the broker will redeliver", "queue", o.settled.Queue, "message_id", o.settled.MessageID, "error", err)
		return
	}
	w.done(o, result, nil)
}

// deadLetter settles a failure that no copy can carry (o.failed.why, see
// unsendable; o.failed.err says why): it is rejected without requeue, so
// the broker dead-letters it as received, with x-death, into the
// quarantine; nothing was published and nothing is acked. A reject that
// cannot be written (the channel is gone) leaves it to the broker to
// redeliver.
func (w *worker) deadLetter(o outcome) {
	fo := o.failed
	if err := o.a.Reject(); err != nil {
		w.failLog(&o).Warn("reject failed (channel gone); the broker will redeliver", "error", err)
		w.done(&o, OutcomeAckFailed, err)
		return
	}
	o.span.SetAttributes(attribute.String("dlxbridge.outcome", string(OutcomeDeadLettered)), attribute.String("dlxbridge.dead_letter_reason", fo.why))
	o.span.SetStatus(codes.Error, "dead-lettered ("+fo.why+"): "+fo.f.verdict.Reason)
	w.done(&o, OutcomeDeadLettered, fo.err)
}

// done records o as settled with result (settleErr: why it could not be
// settled as decided): the deliveries counter, Config.OnSettled, then the
// outcome's own counters and log line. It may run on another worker's
// goroutine (an ack's report): it touches nothing of w's but its queue.
func (w *worker) done(o *outcome, result Outcome, settleErr error) {
	qr := w.q
	st := o.settled
	if settleErr != nil {
		st.SettleErr = settleErr
	}
	qr.recordSettled(st, result)
	w.deps.jobs.settled(qr.cfg.Name, o.d, result)
	if result == OutcomeAbandoned {
		w.s.unsettled.Add(1)
	}
	m := w.deps.metrics
	switch result {
	case OutcomeAcked:
		qr.metrics.succeeded(st.Attempt)
		return
	case OutcomeRetried, OutcomeReadmitted, OutcomeQuarantined, OutcomeDeadLettered:
	default:
		return
	}
	fo := o.failed
	v := fo.f.verdict
	switch result {
	case OutcomeRetried:
		m.retries.WithLabelValues(qr.cfg.Name, tierLabel(v.Tier)).Inc()
		if w.logs(slog.LevelInfo) {
			w.failLog(o).Info("retry scheduled", "delay", v.Delay.String(), "tier", v.Tier, "reason", v.Reason, "error", errString(fo.f.err))
		}
	case OutcomeReadmitted:
		if w.logs(slog.LevelDebug) {
			w.failLog(o).Debug("re-admitted", "reason", v.Reason)
		}
	case OutcomeQuarantined:
		m.quarantined.WithLabelValues(qr.cfg.Name, string(v.Class)).Inc()
		if w.logs(slog.LevelWarn) {
			w.failLog(o).Warn("quarantined", "reason", v.Reason, "error", errString(fo.f.err))
		}
	case OutcomeDeadLettered:
		m.deadLettered.WithLabelValues(qr.cfg.Name, fo.why).Inc()
		m.quarantined.WithLabelValues(qr.cfg.Name, string(v.Class)).Inc()
		w.failLog(o).Error("no retry or quarantine copy can be published; rejected the original without requeue: the broker dead-letters it as received into the quarantine",
			"why", fo.why, "cause", fo.err, "action", v.Action, "reason", v.Reason, "error", errString(fo.f.err))
	}
}

// recordSettled counts a settled delivery and reports it to
// Config.OnSettled. Safe for concurrent use.
func (qr *queueRuntime) recordSettled(st Settled, outcome Outcome) {
	qr.metrics.settled(outcome)
	st.Outcome = outcome
	qr.deps.notifySettled(st)
}

// notifySettled hands s to Config.OnSettled, if set. A panic in it is
// logged, never passed on: the delivery is settled already.
func (d *deps) notifySettled(s Settled) {
	if d.cfg.OnSettled == nil {
		return
	}
	defer func() {
		if r := recover(); r != nil {
			d.log.Error("OnSettled panicked; the delivery was settled regardless", "queue", s.Queue, "message_id", s.MessageID, "panic", r)
		}
	}()
	d.cfg.OnSettled(s)
}

// sessionDelivery is a delivery settled through its session: acks and
// rejects wait out the start of a stop (see queueSession.settle), and acks
// are coalesced in the session's ack window.
type sessionDelivery struct {
	s *queueSession
	d *amqp.Delivery
}

func (sd sessionDelivery) Ack(report func(error)) { sd.s.acks.ack(sd.d, report) }

func (sd sessionDelivery) Requeue() error {
	defer sd.s.acks.rejected(sd.d)
	return sd.s.settle(func() error { return sd.d.Reject(true) })
}

func (sd sessionDelivery) Reject() error {
	defer sd.s.acks.rejected(sd.d)
	return sd.s.settle(func() error { return sd.d.Reject(false) })
}

// settle writes an ack or reject. Between the start of a stop and the
// cancel-ok it waits (until the drain deadline at most): an ack or a
// reject, with or without requeue, gives the consumer credit for one more
// message, and a quorum queue can deliver it after the cancel-ok (the queue
// and the channel settle the cancel separately), where the client drops it
// as addressed to no consumer. It would sit unacked until the channel closes
// and come back with a raised delivery count.
//
// A breaker's pause holds settlements the same way, until its cancel-ok.
func (qs *queueSession) settle(write func() error) error {
	qs.settleMu.RLock()
	for qs.pausing != nil && !closed(qs.pausing) {
		gate := qs.pausing
		qs.settleMu.RUnlock()
		select {
		case <-gate:
		case <-qs.handlerCtx.Done():
			return write()
		}
		qs.settleMu.RLock()
	}
	select {
	case <-qs.stopping:
		qs.settleMu.RUnlock()
		select {
		case <-qs.cancelled:
		case <-qs.handlerCtx.Done():
		}
		return write()
	default:
	}
	defer qs.settleMu.RUnlock()
	return write()
}

func closed(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// ackWindow coalesces the acks of one consume channel, since each ack frame
// costs the broker a command: one ack with multiple set covers the settled
// prefix of the delivery tags, never a tag still in a handler or awaiting
// its copy's confirm. What waits behind such a gap is acked tag by tag (a
// spill) only once waiting would cost more: too much of the prefetch held,
// an ack gone stale, or a stop. Writes pass the session's settle gate
// (queueSession.settle), and the window holds no more than the prefetch.
type ackWindow struct {
	settle   func(write func() error) error
	batch    int // acks waiting that flush the settled prefix
	spill    int // acks waiting that a worker about to wait writes one by one (see newAckWindow)
	maxDelay time.Duration

	mu      sync.Mutex
	prefix  uint64              // every tag up to prefix is settled and written
	asked   map[uint64]askedAck // acks asked for past prefix, not written yet
	written []tagRange          // tags past prefix acked on their own or rejected: in order, apart
	oldest  time.Time           // when the oldest ack waiting was asked for, about (reset by flush)
	channel amqp.Acknowledger   // the channel of the deliveries
	timer   *time.Timer         // flushes maxDelay after an ack waits
	armed   bool                // timer is set
	seen    uint64              // the latest tag the feeder took up; the feeder's alone
}

// askedAck is an ack waiting to be written: its report, and when it was
// asked for.
type askedAck struct {
	report func(error)
	at     time.Time
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

// newAckWindow makes the window of a channel with this prefetch and this
// many workers. A worker about to wait spills at half the prefetch, or
// sooner when the other workers' handlers can hold the rest: with
// concurrency-1 tags in handlers, prefetch-concurrency+1 acks behind them
// leave the broker nothing to send, and the waiting worker would wait
// ackStale for the timer every few deliveries.
func newAckWindow(settle func(func() error) error, prefetch, concurrency int) *ackWindow {
	spill := max(1, min(prefetch/2, prefetch-concurrency+1))
	return &ackWindow{settle: settle, batch: max(1, min(ackBatch, prefetch/4)), spill: spill, maxDelay: ackDelay, asked: map[uint64]askedAck{}}
}

// ack asks for d's ack; report is called once it was written (nil) or could
// not be (the channel is gone).
func (w *ackWindow) ack(d *amqp.Delivery, report func(error)) {
	now := time.Now()
	w.mu.Lock()
	w.channel = d.Acknowledger
	if len(w.asked) == 0 {
		w.oldest = now
	}
	w.asked[d.DeliveryTag] = askedAck{report, now}
	due := len(w.asked) >= w.batch || now.Sub(w.oldest) >= w.maxDelay
	if !due {
		w.arm()
	}
	w.mu.Unlock()
	if due {
		w.flush(false)
		// What waits behind a gap needs the timer too.
		w.mu.Lock()
		if len(w.asked) > 0 {
			w.arm()
		}
		w.mu.Unlock()
	}
}

// ackStale is how long an ack may wait behind a gap before the timer acks
// what waits there one by one.
const ackStale = 100 * time.Millisecond

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
// behind a gap too once an ack there has waited ackStale (else it tries
// again later).
func (w *ackWindow) expire() {
	w.mu.Lock()
	w.armed = false
	stale := false
	for _, a := range w.asked {
		if time.Since(a.at) >= ackStale {
			stale = true
			break
		}
	}
	w.mu.Unlock()
	w.flush(stale)
	w.mu.Lock()
	if len(w.asked) > 0 {
		w.arm()
	}
	w.mu.Unlock()
}

// beforeWait flushes for a worker about to wait for its next delivery: the
// settled prefix, and a spill once spill acks wait behind a gap (see
// newAckWindow).
func (w *ackWindow) beforeWait() {
	w.mu.Lock()
	spill := len(w.asked) >= w.spill
	w.mu.Unlock()
	w.flush(spill)
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

// flush writes one ack with multiple set for the settled prefix, if it holds
// an ack. With spill it also acks one by one what waits behind a delivery
// that is not settled yet. Writes are made in order under the window's lock
// (a tag acked twice would close the channel); the reports run after it.
func (w *ackWindow) flush(spill bool) {
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
			a, ok := w.asked[tag]
			if !ok {
				break
			}
			delete(w.asked, tag)
			reports = append(reports, a.report)
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
		if spill {
			tags := make([]uint64, 0, len(w.asked))
			for tag := range w.asked {
				tags = append(tags, tag)
			}
			slices.Sort(tags)
			for _, tag := range tags {
				reports = append(reports, w.asked[tag].report)
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
