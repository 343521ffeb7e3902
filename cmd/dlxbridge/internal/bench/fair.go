package bench

import (
	"context"
	"encoding/json"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/config"
)

// fairAttemptHeader carries the fair floor's attempt count on its delayed
// copies. The broker's x-death cannot serve: 4.x ignores a client's copy
// of it and starts a fresh count at each dead-lettering.
const fairAttemptHeader = "fair-attempt"

// drainFair is the fair floor: the least code that retries through the
// broker, as the bridge does, and loses nothing. The floor (drainFloor)
// retries in process; any consumer with delayed retries on the broker pays
// more, and this is that much more, without the bridge's own cost.
//
//   - Each delivery is decoded with json.Unmarshal, once.
//   - A message that breaks the schema (the hand-written check drainFloor
//     uses) is published to the quarantine queue.
//   - A failed attempt is published to one TTL queue, the bridge's first
//     retry lane of the same topology (quorum, its TTL, dead-lettering
//     through the default exchange to the work queue), with its attempt
//     count in one header; the broker brings it back when it expires. The
//     attempt after the last retry is published to the quarantine instead.
//   - Every such publish is mandatory, persistent and confirmed before its
//     delivery is acked (drainByHand), with the floor's ack coalescing.
//
// No gate, envelope, signature, lanes, tiers, tracing or metrics. The one
// delay is the first tier's for every retry (the bridge waits the first,
// then the second), so the last always-failing message settles sooner.
func drainFair(ctx context.Context, s *sideSpec, rep *reporter, enough <-chan struct{}, wantQuarantined int, r *sideResult) error {
	tiers := s.Tiers
	if len(tiers) == 0 {
		tiers = defaultTiers
	}
	work := s.Prefix + ".work"
	lane := config.RetryQueueName(work, tiers[0], 0)
	quarantine := s.Prefix + ".quarantine"
	return drainByHand(ctx, s, rep, enough, wantQuarantined, r, func(d *amqp.Delivery, i int) (park, bool) {
		attempt := fairAttempt(d.Headers)
		switch fairHandle(s.Scenario, i, attempt, d.Body, rep) {
		case fairOK:
			return park{}, false
		case fairRetry:
			return park{key: lane, headers: amqp.Table{fairAttemptHeader: int32(attempt + 1)}}, true
		default:
			return park{key: quarantine, headers: amqp.Table{fairAttemptHeader: int32(attempt)}, quarantine: true}, true
		}
	})
}

// fairAttempt is the attempt a delivery is: 1 without the header.
func fairAttempt(h amqp.Table) int {
	switch n := h[fairAttemptHeader].(type) {
	case int32:
		return max(1, int(n))
	case int64:
		return max(1, int(n))
	}
	return 1
}

type fairOutcome int

const (
	fairOK fairOutcome = iota
	fairRetry
	fairQuarantine
)

// fairHandle is the fair floor's handler for attempt of message i.
func fairHandle(scenario string, i, attempt int, body []byte, rep *reporter) fairOutcome {
	var o Order
	_ = json.Unmarshal(body, &o)
	for _, li := range o.LineItems {
		if li.Quantity < 1 {
			rep.report(i, body, false)
			return fairQuarantine
		}
	}
	switch KindOf(scenario, i) {
	case TransientOnce:
		if attempt == 1 {
			rep.report(i, body, false)
			return fairRetry
		}
	case AlwaysFailing:
		rep.report(i, body, false)
		if attempt < maxAttempts {
			return fairRetry
		}
		return fairQuarantine
	}
	rep.report(i, body, true)
	return fairOK
}
