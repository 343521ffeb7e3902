package amqpx_test

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/internal/amqpx"
	"github.com/dlxbridge/dlxbridge/internal/brokertest"
)

// The broker's size refusal, as 3.10.8 and 4.0.5 word it, names the size
// and the limit; nothing else is read as one.
func TestParseTooLarge(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		text      string
		size, max int64
		ok        bool
	}{
		{"PRECONDITION_FAILED - message size 65537 is larger than configured max size 65536", 65537, 65536, true},
		{"PRECONDITION_FAILED - message size 536870913 is larger than max size 536870912", 536870913, 536870912, true},
		{"message size 16777300 is larger than configured max size 16777216", 16777300, 16777216, true},
		{"PRECONDITION_FAILED - inequivalent arg 'x-message-ttl' for queue 'q'", 0, 0, false},
		{"PRECONDITION_FAILED - message size x is larger than configured max size 1", 0, 0, false},
		{"PRECONDITION_FAILED - message size 10 is larger than configured max size ", 0, 0, false},
		{"PRECONDITION_FAILED - message size 10 is larger than configured max size 20", 0, 0, false}, // not over: not a refusal
		{"PRECONDITION_FAILED - message size 10 is larger than configured max size 0", 0, 0, false},
		{"PRECONDITION_FAILED - message size 10 is larger than configured maximum 5", 0, 0, false},
		{"", 0, 0, false},
	} {
		size, max, ok := amqpx.ParseTooLarge(c.text)
		if size != c.size || max != c.max || ok != c.ok {
			t.Errorf("%q: %d %d %v, want %d %d %v", c.text, size, max, ok, c.size, c.max, c.ok)
		}
	}
}

// tooLargeLimit is the private nodes' max_message_size in these tests: a
// limit reached with 64 KiB, not 16 MiB.
const tooLargeLimit = 65536

// A body over the broker's max message size makes it close the channel
// (406). Of the publishes in flight, the refused one learns why and the
// limit (TooLargeError, which the broker named); the others learn that
// they were failed beside it (ErrBesideRefusal), not for anything of
// theirs. Headers do not count toward the limit: a body of exactly the
// limit passes with headers of several KB.
func TestPipelineTellsTheOversizedPublishFromTheOthersOnItsChannel(t *testing.T) {
	t.Parallel()
	shared := brokertest.Require(t)
	opts := brokertest.LikeShared(shared)
	opts.Config = "max_message_size = 65536"
	node := brokertest.StartPrivateNodeWith(t, opts)
	env := node.Env(t)
	_, ex, _ := declareBound(t, env)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := amqpx.NewPipeline(ctx, env.Dial("pipeline-size"), 16)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	results := make(chan error, 1)
	if err := p.Publish(ctx, ex, "bound", amqp.Publishing{Body: bytes.Repeat([]byte("l"), tooLargeLimit),
		Headers: amqp.Table{"big": string(bytes.Repeat([]byte("h"), 8000))}}, func(err error) { results <- err }); err != nil {
		t.Fatal(err)
	}
	if err := <-results; err != nil {
		t.Fatalf("a body of exactly the limit, with 8 KB of headers: %v", err)
	}

	type result struct {
		name string
		err  error
	}
	all := make(chan result, 8)
	publish := func(name string, size int) {
		// Refused at once once the pipeline broke: nothing was written.
		if err := p.Publish(ctx, ex, "bound", amqp.Publishing{MessageId: name, Body: bytes.Repeat([]byte("b"), size)},
			func(err error) { all <- result{name, err} }); err != nil {
			all <- result{name, err}
		}
	}
	publish("before", 10)
	publish("huge", tooLargeLimit+1)
	publish("after", 10)
	publish("after-2", 10)
	got := map[string]error{}
	for len(got) < 4 {
		select {
		case r := <-all:
			got[r.name] = r.err
		case <-ctx.Done():
			t.Fatalf("results missing: %v", got)
		}
	}
	var tl *amqpx.TooLargeError
	if !errors.As(got["huge"], &tl) || tl.Size != tooLargeLimit+1 || tl.Max != tooLargeLimit || !errors.Is(got["huge"], amqpx.ErrPublisherClosed) {
		t.Fatalf("the oversized publish: %v, want a TooLargeError naming %d over %d", got["huge"], tooLargeLimit+1, tooLargeLimit)
	}
	if max, ok := amqpx.IsTooLarge(got["huge"]); !ok || max != tooLargeLimit {
		t.Fatalf("IsTooLarge: %d %v", max, ok)
	}
	// A publish after the refusal is refused at once, with the same word:
	// nothing is wrong with it.
	<-p.Done()
	if err := p.Publish(ctx, ex, "bound", amqp.Publishing{Body: []byte("late")}, func(error) { t.Error("done called for a refused publish") }); !errors.Is(err, amqpx.ErrBesideRefusal) {
		t.Errorf("a publish after the refusal: %v, want ErrBesideRefusal", err)
	}
	for _, n := range []string{"before", "after", "after-2"} {
		if err := got[n]; err != nil && !errors.Is(err, amqpx.ErrBesideRefusal) {
			t.Errorf("%s: %v, want nil or ErrBesideRefusal", n, err)
		}
		if _, ok := amqpx.IsTooLarge(got[n]); ok {
			t.Errorf("%s was reported as the oversized one: %v", n, got[n])
		}
	}
}
