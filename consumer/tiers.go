package consumer

import (
	"errors"
	"log/slog"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/topology"
)

// retryRoute is where this session publishes wq's retries: wq itself, or,
// for a queue on the shared tiers whose delay exchange the broker does not
// have yet (the config moved to shared tiers before `topology apply`
// declared them) while the queue's own retry exchange is there, a copy of
// wq that retries into its own lanes. A retry published to a missing
// exchange closes the publishing channel and is rejected with requeue, so
// that until the apply every failure would spend a delivery instead of
// waiting its delay; the old lanes still bring retries back. The next
// session after the apply retries into the shared tiers. A check that
// cannot tell (the broker did not answer) keeps wq.
func retryRoute(conn *amqp.Connection, wq *topology.WorkQueue, log *slog.Logger) *topology.WorkQueue {
	if wq == nil || !wq.Shared() || wq.PerQueue == nil {
		return wq
	}
	if exists(conn, wq.RetryExchange) != errNotFound {
		ensureReturn(conn, wq, log)
		return wq
	}
	if exists(conn, wq.PerQueue.Exchange) != nil {
		log.Warn("the shared delay tiers are not declared: retries will fail until `dlxbridge topology apply` declares them", "queue", wq.Name, "exchange", wq.RetryExchange)
		return wq
	}
	log.Warn("the shared delay tiers are not declared: retrying into the queue's own lanes until `dlxbridge topology apply` declares them and the runtime reconnects",
		"queue", wq.Name, "shared_exchange", wq.RetryExchange, "own_exchange", wq.PerQueue.Exchange)
	own := *wq
	own.RetryExchange, own.Tiers, own.ReturnExchange = wq.PerQueue.Exchange, wq.PerQueue.Tiers, ""
	return &own
}

// ensureReturn binds wq to the shared return exchange under its own name,
// as `topology apply` does. The delay exchange being there does not prove
// the binding is: on a virtual host where another config's apply declared
// the shared tiers, a runtime started before its own config's apply finds
// the tiers but no binding, and each retry would wait its delay and then
// find no route home, landing in the catch-all as if the queue had been
// deleted (every transient failure quarantined instead of retried). AMQP
// cannot read a binding back, but binding is idempotent. A user without
// the permission (write on the queue, read on the exchange) is refused,
// on a channel of its own; then only the warning says what to check.
func ensureReturn(conn *amqp.Connection, wq *topology.WorkQueue, log *slog.Logger) {
	if wq.ReturnExchange == "" {
		return
	}
	ch, err := conn.Channel()
	if err == nil {
		err = ch.QueueBind(wq.Name, wq.Name, wq.ReturnExchange, false, nil)
		_ = ch.Close()
	}
	const why = "if `dlxbridge topology apply` has not run for this config, its retries go to the shared tiers' catch-all instead of coming back (`dlxbridge topology verify` with the management API shows a missing binding)"
	var ae *amqp.Error
	switch {
	case err == nil:
	case errors.As(err, &ae) && ae.Code == amqp.AccessRefused:
		// The permissions docs/topology.md recommends give the runtime
		// no write on its queue: the common case, said once a session.
		log.Info("not allowed to bind the queue to the shared return exchange; "+why, "queue", wq.Name, "exchange", wq.ReturnExchange)
	default:
		log.Warn("could not make sure the queue is bound to the shared return exchange: "+why,
			"queue", wq.Name, "exchange", wq.ReturnExchange, "error", err)
	}
}

var errNotFound = errors.New("not found")

// exists checks an exchange passively on a channel of its own (a 404 closes
// it): nil if it exists, errNotFound if the broker has none, else the error.
func exists(conn *amqp.Connection, exchange string) error {
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	err = ch.ExchangeDeclarePassive(exchange, "direct", true, false, false, false, nil)
	var ae *amqp.Error
	if errors.As(err, &ae) && ae.Code == amqp.NotFound {
		return errNotFound
	}
	return err
}

// retryQueues are the queues whose expiries bring wq's own retries back:
// its lanes, and for a queue on the shared tiers also its own per-queue
// lanes (messages an earlier config left there still return to it). The
// crash-loop guard and the attempt notes treat an x-death from them as the
// bridge's retry loop.
func retryQueues(wq *topology.WorkQueue) map[string]bool {
	out := map[string]bool{}
	for _, t := range wq.Tiers {
		for _, l := range t.Lanes {
			out[l.Queue] = true
		}
	}
	if wq.PerQueue != nil {
		for _, t := range wq.PerQueue.Tiers {
			for _, l := range t.Lanes {
				out[l.Queue] = true
			}
		}
	}
	return out
}
