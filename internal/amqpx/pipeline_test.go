package amqpx_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
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

// Two publishes identical in exchange, routing key, message id and body,
// of which only the second is unroutable (a headers exchange routes on
// what a return does not show; in the runtime, a binding or queue that
// goes away between them does the same): the second's return overtakes
// the first's confirm (a quorum queue confirms later). The second must
// never count as confirmed: its original would be acked with no copy
// anywhere. The first may count as returned (a copy twice, never none).
func TestPipelineNeverConfirmsAReturnedTwin(t *testing.T) {
	t.Parallel()
	env := brokertest.Require(t)
	ch := env.Channel("setup")
	ex, q := env.Name("hx"), env.Name("hq")
	if err := ch.ExchangeDeclare(ex, "headers", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(q, true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(q, "", ex, false, amqp.Table{"x-match": "all", "route": "yes"}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const pairs = 20
	p, err := amqpx.NewPipeline(ctx, env.Dial("pipeline"), 2*pairs)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	results := make(chan [2]any, 2*pairs)
	for i := range 2 * pairs {
		route := "yes"
		if i%2 == 1 {
			route = "no"
		}
		msg := amqp.Publishing{MessageId: fmt.Sprint("twin-", i/2), Body: []byte(fmt.Sprint("body-", i/2)), Headers: amqp.Table{"route": route}}
		if err := p.Publish(ctx, ex, "", msg, func(err error) { results <- [2]any{i, err} }); err != nil {
			t.Fatal(err)
		}
	}
	for range 2 * pairs {
		var r [2]any
		select {
		case r = <-results:
		case <-ctx.Done():
			t.Fatal("confirms missing")
		}
		if i, err := r[0].(int), r[1]; i%2 == 1 && err == nil {
			t.Errorf("publish %d was returned (unroutable) but counted as confirmed: its original would be acked and lost", i)
		}
	}
}

// A channel that closes while confirms still wait in the pipeline's buffer
// (the client closes the returns channel before the confirms channel): the
// pipeline fails what it holds and ends, never spinning on the closed
// returns channel.
func TestPipelineEndsWhenItsChannelClosesAmidConfirms(t *testing.T) {
	t.Parallel()
	env := brokertest.Require(t)
	_, ex, _ := declareBound(t, env)
	conn := env.Dial("pipeline-close")
	for round := range 30 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		p, err := amqpx.NewPipeline(ctx, conn, 200)
		if err != nil {
			t.Fatal(err)
		}
		// A done that takes a moment (a loaded machine) leaves confirms
		// in the buffer when the close arrives.
		for range 150 {
			_ = p.Publish(ctx, ex, "bound", amqp.Publishing{Body: []byte("x")}, func(error) { time.Sleep(100 * time.Microsecond) })
		}
		_ = p.Publish(ctx, env.Name("missing"), "x", amqp.Publishing{}, func(error) {})
		select {
		case <-p.Done():
		case <-ctx.Done():
			t.Fatalf("round %d: the pipeline did not end after its channel closed", round)
		}
		cancel()
	}
}

// An error of one publish's own (a header value AMQP cannot carry, or its
// context ended) fails that publish alone: nothing of it was written, so
// the publishes in flight and later ones go on (failing them would requeue
// originals whose copies the broker confirms: duplicates for nothing).
func TestPipelinePublishErrorOfItsOwnFailsOnlyIt(t *testing.T) {
	t.Parallel()
	env := brokertest.Require(t)
	ch, ex, q := declareBound(t, env)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	p, err := amqpx.NewPipeline(ctx, env.Dial("pipeline-own"), 8)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	results := make(chan error, 3)
	publish := func(ctx context.Context, msg amqp.Publishing) error {
		return p.Publish(ctx, ex, "bound", msg, func(err error) { results <- err })
	}
	refused := func(what string, err error) {
		t.Helper()
		if err == nil || errors.Is(err, amqpx.ErrPublisherClosed) {
			t.Fatalf("%s: %v, want an error of its own, not ErrPublisherClosed", what, err)
		}
	}
	if err := publish(ctx, amqp.Publishing{Body: []byte("a")}); err != nil {
		t.Fatal(err)
	}
	refused("a uint64 header", publish(ctx, amqp.Publishing{Body: []byte("b"), Headers: amqp.Table{"n": uint64(1)}}))
	if err := publish(ctx, amqp.Publishing{Body: []byte("c")}); err != nil {
		t.Fatalf("publish after a publish of its own failed: %v", err)
	}
	ended, end := context.WithCancel(ctx)
	end()
	refused("an ended context", publish(ended, amqp.Publishing{Body: []byte("d")}))
	if err := publish(ctx, amqp.Publishing{Body: []byte("e")}); err != nil {
		t.Fatalf("publish after a publish of its own failed: %v", err)
	}
	for range 3 {
		select {
		case err := <-results:
			if err != nil {
				t.Errorf("publish in flight failed: %v", err)
			}
		case <-ctx.Done():
			t.Fatal("confirms missing")
		}
	}
	select {
	case err := <-results:
		t.Fatalf("done called for a refused publish (%v)", err)
	default:
	}
	if qi, err := ch.QueueDeclarePassive(q, true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil || qi.Messages != 3 {
		t.Fatalf("queue has %d messages (err %v), want 3", qi.Messages, err)
	}
}

// Confirms that the client handed over before it reported the channel's
// close were sent by the broker before it closed the channel: those
// publishes are in their queue. Failed anyway, the runtime requeues an
// original whose retry or quarantine copy exists (its handler runs again,
// a delivery is counted), or sends the copy a second time (after a size
// refusal). The client hands both over on separate Go channels, so the
// pipeline must read the confirms first, not whichever a select picks.
// Each round leaves the pipeline's goroutine busy (in a done func) while
// four confirms and then the close wait for it; with a random pick, all
// four come first in about one round in sixteen.
func TestPipelineSettlesTheConfirmsThatCameBeforeTheClose(t *testing.T) {
	t.Parallel()
	env := brokertest.Require(t)
	_, ex, _ := declareBound(t, env)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	conn := env.Dial("pipeline-close")
	for round := range 3 {
		p, err := amqpx.NewPipeline(ctx, conn, 16)
		if err != nil {
			t.Fatal(err)
		}
		release := make(chan struct{})
		var releaseOnce sync.Once
		free := func() { releaseOnce.Do(func() { close(release) }) }
		defer p.Close()
		defer free() // before p.Close: the held done func must return
		type result struct {
			id  string
			err error
		}
		results := make(chan result, 8)
		publish := func(exchange, id string, done func(error)) {
			t.Helper()
			if err := p.Publish(ctx, exchange, "bound", amqp.Publishing{MessageId: id, Body: []byte(id)}, done); err != nil {
				t.Fatalf("round %d: publish %s: %v", round, id, err)
			}
		}
		record := func(id string) func(error) { return func(err error) { results <- result{id, err} } }
		publish(ex, "hold", func(err error) { <-release; results <- result{"hold", err} })
		ids := []string{"c1", "c2", "c3", "c4"}
		for _, id := range ids {
			publish(ex, id, record(id))
		}
		waitUntil(ctx, t, "four confirms buffered", func() bool { return p.BufferedConfirms() == len(ids) })
		// To an exchange that does not exist: the broker closes the
		// channel (404), after the confirms above.
		publish(env.Name("missing"), "closer", record("closer"))
		waitUntil(ctx, t, "the close handed over", p.CloseSeen)
		free()
		got := map[string]error{}
		for len(got) < len(ids)+2 {
			select {
			case r := <-results:
				got[r.id] = r.err
			case <-ctx.Done():
				t.Fatalf("round %d: results missing: %v", round, got)
			}
		}
		for _, id := range append([]string{"hold"}, ids...) {
			if got[id] != nil {
				t.Errorf("round %d: %s, confirmed by the broker before the close: %v", round, id, got[id])
			}
		}
		if !errors.Is(got["closer"], amqpx.ErrPublisherClosed) {
			t.Errorf("round %d: the publish that closed the channel: %v, want ErrPublisherClosed", round, got["closer"])
		}
	}
}

// waitUntil polls cond (state with no event to wait on) until it holds or
// ctx ends.
func waitUntil(ctx context.Context, t *testing.T, what string, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-tick.C:
		case <-ctx.Done():
			t.Fatalf("waiting for %s: %v", what, ctx.Err())
		}
	}
}
