package frame

import (
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/wire"
)

// Republish is a persistent publishing of body with headers h (used, not
// copied) and d's properties, but for expiration and user-id, which move
// into headers: wire.HeaderOriginalExpiration (unless h already carries an
// earlier hop's) and wire.HeaderOriginalUserID. A copy must not expire on
// its way back, and the broker checks a user-id against the login that
// publishes it.
func Republish(d *amqp.Delivery, h amqp.Table, body []byte) amqp.Publishing {
	if d.Expiration != "" {
		if _, kept := h[wire.HeaderOriginalExpiration]; !kept {
			h[wire.HeaderOriginalExpiration] = d.Expiration
		}
	}
	if d.UserId != "" {
		h[wire.HeaderOriginalUserID] = d.UserId
	}
	return amqp.Publishing{
		Headers:         h,
		ContentType:     d.ContentType,
		ContentEncoding: d.ContentEncoding,
		DeliveryMode:    amqp.Persistent,
		Priority:        d.Priority,
		CorrelationId:   d.CorrelationId,
		ReplyTo:         d.ReplyTo,
		MessageId:       d.MessageId,
		Timestamp:       d.Timestamp,
		Type:            d.Type,
		AppId:           d.AppId,
		Body:            body,
	}
}

// CopyRoom is room for every header a copy may add beside the ones it
// keeps: its retry state or envelope, notes, signature, trace context.
const CopyRoom = 16

// StripHeaders copies h without the headers the broker owns, and without
// those drop (if not nil) names. A copy must not carry the broker's back
// into a work queue:
//   - x-death: on 3.x the broker reads a client's x-death in its cycle
//     check, and a message with an x-death entry for its own work queue
//     without a rejection (say it expired there once and was replayed) is
//     dropped silently when its retry lane expires. The bridge's attempt
//     and first-failure headers carry what the retry loop needs.
//   - x-delivery-count: a stale count from the last hop would trip the
//     crash-loop guard on the copy's first delivery.
//   - CC and BCC (wire.IsRoutingHeader): the broker routes a publish by
//     them, so a producer's would send the bridge's copy wherever the
//     producer named (a retry's return, a replay through the default
//     exchange to any queue). The runtime sets its own where it needs one.
//
// The copy has room for room headers more, the most a caller adds to it
// (CopyRoom if it cannot tell), so that they do not grow it again. Room
// beyond that is not free: a table twice the size costs its allocation,
// and every walk over it (encoding, sizing) visits the empty slots.
func StripHeaders(h amqp.Table, drop func(name string) bool, room int) amqp.Table {
	out := make(amqp.Table, len(h)+room)
	for k, v := range h {
		if wire.IsBrokerHeader(k) || wire.IsRoutingHeader(k) || drop != nil && drop(k) {
			continue
		}
		out[k] = v
	}
	return out
}
