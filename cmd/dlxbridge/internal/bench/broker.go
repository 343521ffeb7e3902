package bench

import (
	"context"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/config"
	"github.com/dlxbridge/dlxbridge/internal/amqpx"
	"github.com/dlxbridge/dlxbridge/topology"
	"github.com/dlxbridge/dlxbridge/wire"
)

// Declare builds cfg's topology for the broker conn is connected to and
// applies it. When applying fails (part of it may be declared) it returns
// the topology with the error, for the caller to Delete.
func Declare(ctx context.Context, conn *amqp.Connection, cfg *config.Config) (*topology.Topology, error) {
	topo, err := topology.BuildFor(cfg, conn)
	if err != nil {
		return nil, err
	}
	if _, err := (&topology.Broker{Conn: conn}).Apply(ctx, topo); err != nil {
		return topo, fmt.Errorf("declare %s: %w", cfg.Queues[0].Name, err)
	}
	return topo, nil
}

// Delete deletes every queue and exchange of topo, each on its own channel
// so that one failure does not stop the rest, and returns the failures.
// When conn is closed (a broker's INTERNAL_ERROR on one delete closes the
// whole connection, seen on 3.10.8) it dials url once more for the rest:
// quorum queues left behind use up a 3.x broker's file handles.
func Delete(url string, conn *amqp.Connection, topo *topology.Topology) error {
	var errs []error
	var fresh *amqp.Connection
	redialed := false
	defer func() {
		if fresh != nil {
			_ = fresh.Close()
		}
	}()
	del := func(what string, op func(ch *amqp.Channel) error) {
		if conn.IsClosed() && !redialed {
			redialed = true
			c, err := dial(url, "dlxbridge-bench/cleanup")
			if err != nil {
				errs = append(errs, fmt.Errorf("dial again to delete the rest: %w", err))
				return
			}
			fresh, conn = c, c
		}
		ch, err := conn.Channel()
		if err == nil {
			err = op(ch)
			_ = ch.Close()
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("delete %s: %w", what, err))
		}
	}
	for _, q := range topo.Queues {
		del("queue "+q.Name, func(ch *amqp.Channel) error {
			_, err := ch.QueueDelete(q.Name, false, false, false)
			return err
		})
	}
	for _, x := range topo.Exchanges {
		del("exchange "+x.Name, func(ch *amqp.Channel) error { return ch.ExchangeDelete(x.Name, false, false) })
	}
	return errors.Join(errs...)
}

// Publishing is message i as a producer sends it: type, version header,
// message id, persistent.
func Publishing(i int, body []byte) amqp.Publishing {
	return amqp.Publishing{
		ContentType:  "application/json",
		Type:         MessageType,
		MessageId:    ID(i),
		DeliveryMode: amqp.Persistent,
		Headers:      amqp.Table{wire.DefaultVersionHeader: MessageVersion},
		Body:         body,
	}
}

// publishWindow is how many publishes may await their confirm at once.
const publishWindow = 512

// PublishAll publishes msg(0) … msg(n-1) to every exchange in exchanges
// (each message to each exchange, in order) with confirms, keeping up to
// publishWindow unconfirmed, and returns once every one is confirmed; a
// nack or a return (nothing bound) is an error. Messages are made as they
// are sent, so a large n costs no memory.
func PublishAll(ctx context.Context, conn *amqp.Connection, exchanges []string, n int, msg func(i int) amqp.Publishing) error {
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	if err := ch.Confirm(false); err != nil {
		return err
	}
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, publishWindow))
	returns := ch.NotifyReturn(make(chan amqp.Return, 16))
	outstanding := 0
	await := func(n int) error {
		for ; outstanding > n; outstanding-- {
			select {
			case c, ok := <-confirms:
				if !ok {
					return errors.New("publish channel closed")
				}
				if !c.Ack {
					return fmt.Errorf("the broker nacked publish %d", c.DeliveryTag)
				}
			case r := <-returns:
				return fmt.Errorf("message %s returned: %s (is the work queue bound?)", r.MessageId, r.ReplyText)
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(60 * time.Second):
				return errors.New("no publisher confirm within 60s")
			}
		}
		return nil
	}
	for i := range n {
		m := msg(i)
		for _, x := range exchanges {
			if err := await(publishWindow - 1); err != nil {
				return err
			}
			if err := ch.PublishWithContext(ctx, x, RoutingKey, true, false, m); err != nil {
				return err
			}
			outstanding++
		}
	}
	if err := await(0); err != nil {
		return err
	}
	select {
	case r := <-returns:
		return fmt.Errorf("message %s returned: %s", r.MessageId, r.ReplyText)
	default:
		return nil
	}
}

// Depth is queue's ready message count.
func Depth(conn *amqp.Connection, queue string) (int, error) {
	ch, err := conn.Channel()
	if err != nil {
		return 0, err
	}
	defer ch.Close()
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		return 0, err
	}
	return q.Messages, nil
}

// Drain takes every message now in queue (basic.get, acked) and passes each
// to f, until the queue is empty.
func Drain(conn *amqp.Connection, queue string, f func(d *amqp.Delivery)) error {
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	for {
		d, ok, err := ch.Get(queue, false)
		if err != nil {
			return err
		}
		if !ok {
			return nil
		}
		f(&d)
		if err := d.Ack(false); err != nil {
			return err
		}
	}
}

// dial opens a named connection; errors never carry the URL's password.
func dial(url, name string) (*amqp.Connection, error) { return amqpx.Dial(url, name) }
