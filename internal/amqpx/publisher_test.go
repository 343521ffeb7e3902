package amqpx_test

import (
	"context"
	"errors"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/internal/amqpx"
	"github.com/dlxbridge/dlxbridge/internal/brokertest"
)

// declareBound declares a direct exchange and a quorum queue bound to it
// with routing key "bound".
func declareBound(t *testing.T, env *brokertest.Env) (ch *amqp.Channel, ex, q string) {
	t.Helper()
	ch = env.Channel("setup")
	ex, q = env.Name("ex"), env.Name("q")
	if err := ch.ExchangeDeclare(ex, "direct", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(q, true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(q, "bound", ex, false, nil); err != nil {
		t.Fatal(err)
	}
	return ch, ex, q
}

func TestPublisherConfirmsRoutedAndRefusesUnroutable(t *testing.T) {
	t.Parallel()
	env := brokertest.Require(t)
	ch, ex, q := declareBound(t, env)
	pub, err := amqpx.NewPublisher(env.Dial("publisher"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	if err := pub.Publish(ctx, ex, "bound", amqp.Publishing{Body: []byte("ok")}); err != nil {
		t.Fatalf("routed publish: %v", err)
	}
	err = pub.Publish(ctx, ex, "nobody-bound", amqp.Publishing{Body: []byte("lost?")})
	var ret *amqpx.ReturnedError
	if !errors.As(err, &ret) || !errors.Is(err, amqpx.ErrUnroutable) {
		t.Fatalf("unroutable publish: got %v, want ReturnedError", err)
	}
	if ret.RoutingKey != "nobody-bound" {
		t.Fatalf("returned routing key %q", ret.RoutingKey)
	}
	// The publisher stays usable after a return.
	if err := pub.Publish(ctx, ex, "bound", amqp.Publishing{Body: []byte("ok2")}); err != nil {
		t.Fatalf("publish after return: %v", err)
	}
	if qi, err := ch.QueueDeclarePassive(q, true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil || qi.Messages != 2 {
		t.Fatalf("queue has %d messages (err %v), want 2", qi.Messages, err)
	}
	// A missing exchange closes the channel: an error, never a silent success.
	if err := pub.Publish(ctx, env.Name("missing"), "x", amqp.Publishing{}); err == nil {
		t.Fatal("publish to a missing exchange succeeded")
	}
	if err := pub.Publish(ctx, ex, "bound", amqp.Publishing{}); !errors.Is(err, amqpx.ErrPublisherClosed) {
		t.Fatalf("publish on a dead publisher: got %v, want ErrPublisherClosed", err)
	}
}

func TestWatchChannelReportsBrokerCancelButNotOwn(t *testing.T) {
	t.Parallel()
	env := brokertest.Require(t)
	admin := env.Channel("admin")
	ch := env.Channel("consumer")
	declare := func(name string) {
		if _, err := admin.QueueDeclare(name, true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
			t.Fatal(err)
		}
		if _, err := ch.Consume(name, name, false, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
	}
	own, theirs := env.Name("own"), env.Name("theirs")
	declare(own)
	declare(theirs)
	stopping := make(chan struct{})
	watch := amqpx.WatchChannel(ch, stopping)

	if _, err := admin.QueueDelete(theirs, false, false, false); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-watch:
		if !errors.Is(err, amqpx.ErrConsumerCancelled) {
			t.Fatalf("got %v, want ErrConsumerCancelled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("broker cancel not reported")
	}

	// After stopping, our own cancel and a clean close report nothing more.
	close(stopping)
	if err := ch.Cancel(own, false); err != nil {
		t.Fatal(err)
	}
	if err := ch.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err, ok := <-watch:
		if ok {
			t.Fatalf("unexpected report %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("watch did not end after Close")
	}
}

// A publish the broker confirmed just before it closed the channel was
// routed: it must not be reported as failed (the caller sends it again: a
// duplicate) nor as returned (the client hands over a closed return
// channel's zero value, which looked like a basic.return). The client
// hands the confirm over before the close, on separate Go channels: each
// round writes the publish, waits until both are handed over, and only
// then lets Publish read them. A random pick gets it right about one round
// in three.
func TestPublisherReportsAConfirmThatCameBeforeTheClose(t *testing.T) {
	t.Parallel()
	env := brokertest.Require(t)
	_, ex, _ := declareBound(t, env)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	conn := env.Dial("publisher-close")
	for round := range 6 {
		pub, err := amqpx.NewPublisher(conn)
		if err != nil {
			t.Fatal(err)
		}
		pub.AfterWrite(func() {
			waitUntil(ctx, t, "the confirm handed over", func() bool { return pub.BufferedConfirms() == 1 })
			// To an exchange that does not exist: the broker closes the
			// channel (404), after the confirm above.
			if err := pub.Channel().Publish(env.Name("missing"), "x", false, false, amqp.Publishing{}); err != nil {
				t.Fatal(err)
			}
			waitUntil(ctx, t, "the close handed over", pub.CloseSeen)
		})
		if err := pub.Publish(ctx, ex, "bound", amqp.Publishing{Body: []byte("confirmed")}); err != nil {
			t.Errorf("round %d: a publish the broker confirmed before closing the channel: %v", round, err)
		}
		pub.AfterWrite(nil)
		if err := pub.Publish(ctx, ex, "bound", amqp.Publishing{Body: []byte("after")}); err == nil {
			t.Errorf("round %d: a publish after the close reported success", round)
		}
		_ = pub.Close()
	}
}
