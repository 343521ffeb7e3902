package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/config"
)

// drainFloor is the least a hand-written consumer can do and still lose
// nothing in a storm: the floor under what any failure handling costs on
// this machine and broker, to read the bridge's storm rate against.
//
//   - One channel consumes with the bench's prefetch; a second, in confirm
//     mode, publishes.
//   - Each delivery is decoded with json.Unmarshal, as raw does. A message
//     that fails once is handled again at once, in process (the bridge with
//     --immediate-retries 1 does the same); its second call decodes again.
//   - A message that breaks the schema is found by a hand-written check of
//     the one rule the bench's invalid bodies break (a line item's quantity
//     below 1): cheaper than any schema validation, and no error message.
//   - A message that always fails fails twice in process, then is parked
//     with no delayed retry: it skips the retry lanes the bridge uses.
//   - Whatever is parked is published as received (body and message id, one
//     short header) to the side's dead-letter exchange, which routes to its
//     quarantine queue, mandatory and persistent. Its delivery is acked only
//     after the broker confirmed that publish, and acks go out as one
//     multiple ack over the settled prefix, never over a parked delivery
//     whose confirm is still out.
//
// No envelope, fingerprint, signature, tracing, metrics, logging or
// reconnection: what it leaves out is the bridge's own cost. What it keeps
// is what the broker must do for a failure however it is handled: a
// confirmed, routed, persistent publish into a quorum queue.
func drainFloor(ctx context.Context, s *sideSpec, rep *reporter, enough <-chan struct{}, wantQuarantined int, r *sideResult) error {
	exchange := config.DeadExchangeName(s.Prefix + ".work")
	return drainByHand(ctx, s, rep, enough, wantQuarantined, r, func(d *amqp.Delivery, i int) (park, bool) {
		reason := floorHandle(s.Scenario, i, d.Body, rep)
		if reason == "" {
			return park{}, false
		}
		return park{exchange: exchange, key: d.RoutingKey, headers: amqp.Table{"floor-reason": reason}, quarantine: true}, true
	})
}

// park is where a hand-written side publishes a delivery it does not
// settle by a plain ack: a retry or the quarantine.
type park struct {
	exchange, key string
	headers       amqp.Table
	quarantine    bool // counts toward the quarantined ids the side waits for
}

// drainByHand is the loop of the hand-written sides that park (floor and
// fair): consume, let handle say whether a delivery is parked and where,
// publish what is parked mandatory, persistent and confirmed, and ack each
// delivery only after its publish is confirmed. A returned or refused
// publish stops the side with an error: its delivery is never acked, and
// goes back to the queue when the connection closes.
func drainByHand(ctx context.Context, s *sideSpec, rep *reporter, enough <-chan struct{}, wantQuarantined int, r *sideResult,
	handle func(d *amqp.Delivery, i int) (park, bool)) error {
	conn, sub, deliveries, err := consume(s)
	if conn != nil {
		defer conn.Close()
	}
	if err != nil {
		return err
	}
	pub, err := conn.Channel()
	if err != nil {
		return err
	}
	if err := pub.Confirm(false); err != nil {
		return err
	}
	// Buffered beyond the prefetch: the library blocks its reader on a full
	// confirmation channel, and this loop is the only one that drains it.
	confirms := pub.NotifyPublish(make(chan amqp.Confirmation, s.Prefetch+1))
	returns := pub.NotifyReturn(make(chan amqp.Return, 1))

	acks := floorAcks{}
	idle := time.NewTimer(s.Idle)
	defer idle.Stop()
	var clock stopwatch
	defer func() {
		// As raw: let the last acks reach a 3.10 broker before the close.
		time.Sleep(50 * time.Millisecond)
	}()
	// parkedIDs are the distinct ids published to the quarantine: a
	// duplicate delivery of one is parked again, and must not stand for
	// another id (nor stall the count as one too many).
	parkedIDs := map[int]bool{}
	// sent is when each parked publish (by sequence number) went out,
	// until its confirm: waited sums the confirms' waits.
	sent := map[uint64]time.Time{}
	var waited time.Duration
	var confirmed int
	defer func() {
		if confirmed > 0 {
			r.ConfirmWaitMS = float64(waited) / float64(confirmed) / float64(time.Millisecond)
		}
	}()
	wake := enough // nil once seen: a closed channel would wake the select forever
	batch := uint64(max(1, s.Prefetch/4))
	// Settled deliveries behind a parked one whose confirm is still out
	// are acked one frame each once half the prefetch waits there, as the
	// bridge's window does at one worker: else the broker, its prefetch
	// used up, stops delivering until the confirm comes.
	spill := uint64(max(1, s.Prefetch/2))
	// Acks wait for a quarter of the prefetch, or for a millisecond
	// without a delivery or confirm: one frame for however many
	// deliveries settled since the last, as the bridge's ack window does.
	ackIdle := time.NewTimer(time.Hour)
	defer ackIdle.Stop()
	ack := func() error {
		if tag, ok := acks.ackable(); ok {
			return sub.Ack(tag, true)
		}
		return nil
	}
	for {
		if acks.waiting() >= batch {
			if err := ack(); err != nil {
				return err
			}
		}
		if acks.behind() >= spill {
			for _, tag := range acks.spill() {
				if err := sub.Ack(tag, false); err != nil {
					return err
				}
			}
		}
		// idle: every publish confirmed, every delivery acked.
		if closed(enough) && len(parkedIDs) >= wantQuarantined && acks.idle() {
			clock.stop(r)
			return nil
		}
		var tick <-chan time.Time
		if acks.waiting() > 0 {
			ackIdle.Reset(time.Millisecond)
			tick = ackIdle.C
		}
		select {
		case <-tick:
			if err := ack(); err != nil {
				return err
			}
		case d, ok := <-deliveries:
			if !ok {
				return fmt.Errorf("the %s consumer's channel closed", s.Side)
			}
			clock.start()
			i := rep.index(d.MessageId)
			if i < 0 {
				return fmt.Errorf("unknown message id %q", d.MessageId)
			}
			if to, ok := handle(&d, i); ok {
				p := amqp.Publishing{
					MessageId: d.MessageId, ContentType: d.ContentType, Type: d.Type,
					DeliveryMode: amqp.Persistent, Headers: to.headers, Body: d.Body,
				}
				seq := pub.GetNextPublishSeqNo()
				if err := pub.PublishWithContext(ctx, to.exchange, to.key, true, false, p); err != nil {
					return err
				}
				sent[seq] = time.Now()
				acks.park(seq, d.DeliveryTag)
				if to.quarantine {
					parkedIDs[i] = true
				}
			} else {
				acks.settle(d.DeliveryTag)
			}
			idle.Reset(s.Idle)
		case c := <-confirms:
			// The broker sends a publish's return before its ack, and the
			// library hands them over in that order: a return is in its
			// channel by now, and the select may have picked the ack.
			select {
			case ret := <-returns:
				return errReturned(ret)
			default:
			}
			if !c.Ack {
				return fmt.Errorf("the broker refused a parked publish (seq %d)", c.DeliveryTag)
			}
			if at, ok := sent[c.DeliveryTag]; ok {
				waited += time.Since(at)
				confirmed++
				delete(sent, c.DeliveryTag)
			}
			acks.confirm(c.DeliveryTag)
		case ret := <-returns:
			return errReturned(ret)
		case <-wake:
			wake = nil
		case <-idle.C:
			r.TimedOut = true
			clock.stop(r)
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func errReturned(ret amqp.Return) error {
	return fmt.Errorf("a parked publish of %s was returned: %s", ret.MessageId, ret.ReplyText)
}

// floorHandle is the floor's handler for message i: "" when it succeeds,
// or why it is parked.
func floorHandle(scenario string, i int, body []byte, rep *reporter) string {
	var o Order
	_ = json.Unmarshal(body, &o)
	for _, li := range o.LineItems {
		if li.Quantity < 1 {
			rep.report(i, body, false)
			return "schema"
		}
	}
	switch KindOf(scenario, i) {
	case TransientOnce:
		rep.report(i, body, false)
		var again Order
		_ = json.Unmarshal(body, &again)
	case AlwaysFailing:
		rep.report(i, body, false)
		var again Order
		_ = json.Unmarshal(body, &again)
		rep.report(i, body, false)
		return "failed twice"
	}
	rep.report(i, body, true)
	return ""
}

// floorAcks tracks the floor's deliveries, in tag order: settled ones and
// parked ones whose quarantine publish awaits its confirm. The ackable
// prefix ends before the oldest parked delivery still unconfirmed.
type floorAcks struct {
	highest uint64          // highest tag settled or parked
	acked   uint64          // tags up to here are acked
	spilled uint64          // tags past the gap up to here were acked one by one (but the parked ones still out)
	single  map[uint64]bool // tags acked one by one, past acked
	parked  []floorPark     // in publish order, which is tag order; confirmed ones leave from the front
}

type floorPark struct {
	seq, tag  uint64
	confirmed bool
}

func (a *floorAcks) settle(tag uint64) { a.highest = max(a.highest, tag) }

func (a *floorAcks) park(seq, tag uint64) {
	a.highest = max(a.highest, tag)
	a.parked = append(a.parked, floorPark{seq: seq, tag: tag})
}

// confirm marks the publishes a broker confirmation covers (one, or every
// one up to seq when the broker confirms several at once; amqp091-go hands
// them over one by one) and returns how many it newly confirmed.
func (a *floorAcks) confirm(seq uint64) int {
	n := 0
	for k := range a.parked {
		if p := &a.parked[k]; p.seq == seq && !p.confirmed {
			p.confirmed = true
			n++
		}
	}
	for len(a.parked) > 0 && a.parked[0].confirmed {
		a.parked = a.parked[1:]
	}
	return n
}

// behind is how many settled deliveries wait behind the oldest parked one
// whose confirm is still out, not acked yet.
func (a *floorAcks) behind() uint64 {
	if len(a.parked) == 0 {
		return 0
	}
	from := max(a.parked[0].tag, a.spilled)
	n := a.highest - min(from, a.highest)
	for _, p := range a.parked[1:] {
		if p.tag > from && !p.confirmed {
			n--
		}
	}
	return n
}

// spill returns the tags behind the gap to ack one by one (skipping the
// parked ones whose confirm is still out), and counts them acked. A later
// multiple ack may cover them (it settles only what is outstanding), but
// must name a tag still outstanding: the broker refuses an unknown one.
func (a *floorAcks) spill() []uint64 {
	if len(a.parked) == 0 {
		return nil
	}
	from := max(a.parked[0].tag, a.spilled)
	unconfirmed := map[uint64]bool{}
	for _, p := range a.parked {
		if !p.confirmed {
			unconfirmed[p.tag] = true
		}
	}
	var tags []uint64
	if a.single == nil {
		a.single = map[uint64]bool{}
	}
	for t := from + 1; t <= a.highest; t++ {
		if !unconfirmed[t] {
			tags = append(tags, t)
			a.single[t] = true
		}
	}
	a.spilled = a.highest
	return tags
}

// limit is the highest tag the settled prefix reaches.
func (a *floorAcks) limit() uint64 {
	if len(a.parked) > 0 {
		return a.parked[0].tag - 1
	}
	return a.highest
}

// waiting is how many tags an ack could cover now.
func (a *floorAcks) waiting() uint64 { return a.limit() - min(a.acked, a.limit()) }

// ackable is the highest tag a multiple ack may cover now, if it moved.
func (a *floorAcks) ackable() (uint64, bool) {
	limit := a.limit()
	if limit <= a.acked {
		return 0, false
	}
	prev := a.acked
	tag := limit
	for tag > prev && a.single[tag] {
		tag--
	}
	for t := range a.single {
		if t <= limit {
			delete(a.single, t)
		}
	}
	a.acked = limit
	return tag, tag > prev // else every tag it would cover went one by one
}

// idle reports whether every delivery seen is acked.
func (a *floorAcks) idle() bool { return len(a.parked) == 0 && a.acked == a.highest }
