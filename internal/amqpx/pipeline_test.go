package amqpx_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/internal/amqpx"
	"github.com/dlxbridge/dlxbridge/internal/brokertest"
)

// Routed and unroutable publishes interleaved without waiting: each done
// gets its own message's result (a quorum queue confirms later than a
// return, so returns overtake earlier confirms on the wire), and a lost
// channel fails what is still unconfirmed.
func TestPipelineMatchesEachConfirmAndReturn(t *testing.T) {
	t.Parallel()
	env := brokertest.Require(t)
	ch, ex, q := declareBound(t, env)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const n = 60
	p, err := amqpx.NewPipeline(ctx, env.Dial("pipeline"), n)
	if err != nil {
		t.Fatal(err)
	}
	results := make(chan [2]any, n)
	for i := range n {
		key := "bound"
		if i%3 == 1 {
			key = "nobody-bound"
		}
		// The same message id and body on both keys: only the routing key
		// tells a return's message apart.
		msg := amqp.Publishing{MessageId: fmt.Sprint("m-", i/3), Body: []byte(fmt.Sprint("body-", i/3))}
		if err := p.Publish(ctx, ex, key, msg, func(err error) { results <- [2]any{i, err} }); err != nil {
			t.Fatal(err)
		}
	}
	for range n {
		var r [2]any
		select {
		case r = <-results:
		case <-ctx.Done():
			t.Fatal("confirms missing")
		}
		i, err := r[0].(int), r[1]
		if i%3 == 1 {
			if e, _ := err.(error); !errors.Is(e, amqpx.ErrUnroutable) {
				t.Errorf("publish %d (unroutable): %v", i, err)
			}
		} else if err != nil {
			t.Errorf("publish %d (routed): %v", i, err)
		}
	}
	if qi, err := ch.QueueDeclarePassive(q, true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil || qi.Messages != n-n/3 {
		t.Fatalf("queue has %d messages (err %v), want %d", qi.Messages, err, n-n/3)
	}
	// A missing exchange closes the channel: the publishes awaiting their
	// confirms fail, later ones are refused.
	for i := range 5 {
		_ = p.Publish(ctx, ex, "bound", amqp.Publishing{Body: []byte("x")}, func(err error) { results <- [2]any{i, err} })
	}
	_ = p.Publish(ctx, env.Name("missing"), "x", amqp.Publishing{}, func(err error) { results <- [2]any{-1, err} })
	select {
	case <-p.Done():
	case <-ctx.Done():
		t.Fatal("the pipeline survived its channel")
	}
	close(results)
	for r := range results {
		if e, _ := r[1].(error); e != nil && !errors.Is(e, amqpx.ErrPublisherClosed) {
			t.Errorf("publish %v failed with %v, want nil or ErrPublisherClosed", r[0], e)
		}
	}
	if err := p.Publish(ctx, ex, "bound", amqp.Publishing{}, func(error) { t.Error("done called for a refused publish") }); !errors.Is(err, amqpx.ErrPublisherClosed) {
		t.Fatalf("publish on a broken pipeline: %v", err)
	}
}
