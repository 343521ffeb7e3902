package consumer

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlxbridge/dlxbridge/triage"
)

// The handler's context (callCtx, on one timer per worker) keeps what
// context.WithTimeout gave handlers: these run one delivery through
// worker.process, without a broker.

// handlerTimeout sets the queue's handler timeout.
func handlerTimeout(d time.Duration) func(*Config) {
	return func(c *Config) { c.File.Queues[0].Consumer.HandlerTimeout = d }
}

func (b *processBundle) waitSettled(t *testing.T) Settled {
	t.Helper()
	select {
	case s := <-b.settled:
		return s
	case <-time.After(10 * time.Second):
		t.Fatal("no outcome")
	}
	return Settled{}
}

// At the deadline the context ends with DeadlineExceeded (its cause too),
// and so do the contexts the handler derived from it and its AfterFuncs;
// the delivery is a timeout.
func TestHandlerContextEndsAtTheDeadline(t *testing.T) {
	t.Parallel()
	type seen struct {
		deadline          bool
		err, cause, child error
	}
	got := make(chan seen, 1)
	b := newProcessBundle(t, handlerTimeout(50*time.Millisecond), func(ctx context.Context, m *Message) error {
		child, cancel := context.WithCancel(ctx)
		defer cancel()
		timed, cancelTimed := context.WithTimeout(ctx, time.Hour)
		defer cancelTimed()
		after := make(chan struct{})
		context.AfterFunc(ctx, func() { close(after) })
		_, hasDeadline := ctx.Deadline()
		<-ctx.Done()
		<-child.Done()
		<-timed.Done()
		<-after
		got <- seen{hasDeadline, ctx.Err(), context.Cause(ctx), timed.Err()}
		return ctx.Err()
	})
	b.w.handle(b.delivery())
	s := <-got
	if !s.deadline || s.err != context.DeadlineExceeded || s.cause != context.DeadlineExceeded || s.child != context.DeadlineExceeded {
		t.Fatalf("handler saw deadline %v, Err %v, Cause %v, derived %v; want a deadline and DeadlineExceeded throughout", s.deadline, s.err, s.cause, s.child)
	}
	if st := b.waitSettled(t); st.Class != triage.ClassTimeout || st.Outcome != OutcomeRetried {
		t.Fatalf("settled %s, class %q; want retried, timeout", st.Outcome, st.Class)
	}
}

// A handler's error after its deadline is a timeout, whatever the error.
func TestHandlerErrorAfterTheDeadlineIsATimeout(t *testing.T) {
	t.Parallel()
	b := newProcessBundle(t, handlerTimeout(20*time.Millisecond), func(ctx context.Context, m *Message) error {
		<-ctx.Done()
		return errors.New("slow dependency")
	})
	b.w.handle(b.delivery())
	if st := b.waitSettled(t); st.Class != triage.ClassTimeout || !errors.Is(st.Err, context.DeadlineExceeded) {
		t.Fatalf("settled %s, class %q, error %v; want a timeout", st.Outcome, st.Class, st.Err)
	}
}

// A context a handler keeps ends once the handler has returned, as a
// cancelled one does; it was live while the handler ran.
func TestHandlerContextEndsWhenTheHandlerReturns(t *testing.T) {
	t.Parallel()
	kept := make(chan context.Context, 1)
	var during error
	b := newProcessBundle(t, nil, func(ctx context.Context, m *Message) error {
		during = ctx.Err()
		kept <- ctx
		return nil
	})
	b.w.handle(b.delivery())
	ctx := <-kept
	if during != nil {
		t.Fatalf("Err while the handler ran: %v", during)
	}
	select {
	case <-ctx.Done():
	default:
		t.Fatal("the kept context is not done")
	}
	if ctx.Err() != context.Canceled || context.Cause(ctx) != context.Canceled {
		t.Fatalf("kept context: Err %v, Cause %v; want Canceled", ctx.Err(), context.Cause(ctx))
	}
}

// The session's handlers being cancelled (the drain deadline) ends the
// handler's context; the delivery is left unsettled.
func TestHandlerContextEndsWithTheSession(t *testing.T) {
	t.Parallel()
	started := make(chan struct{})
	ended := make(chan error, 1)
	b := newProcessBundle(t, nil, func(ctx context.Context, m *Message) error {
		close(started)
		<-ctx.Done()
		ended <- ctx.Err()
		return ctx.Err()
	})
	done := make(chan struct{})
	go func() {
		defer close(done)
		b.w.handle(b.delivery())
	}()
	<-started
	b.cancel()
	if err := <-ended; err != context.Canceled {
		t.Fatalf("handler's context ended with %v, want Canceled", err)
	}
	<-done
	if st := b.waitSettled(t); st.Outcome != OutcomeAbandoned {
		t.Fatalf("settled %s, want %s", st.Outcome, OutcomeAbandoned)
	}
}

// The worker's watchdog is set once for many calls and sets itself again
// when it fires during a later one: a call long after the first still ends
// at its own deadline.
func TestHandlerDeadlineAfterManyCalls(t *testing.T) {
	t.Parallel()
	var block atomic.Bool
	got := make(chan error, 1)
	b := newProcessBundle(t, handlerTimeout(20*time.Millisecond), func(ctx context.Context, m *Message) error {
		if !block.Load() {
			return nil
		}
		<-ctx.Done()
		got <- ctx.Err()
		return ctx.Err()
	})
	// Calls that return at once, until deadlines set by the first ones
	// have passed.
	start := time.Now()
	for n := 0; n < 10 || time.Since(start) < 100*time.Millisecond; n++ {
		b.w.handle(b.delivery())
	}
	block.Store(true)
	done := make(chan struct{})
	go func() {
		defer close(done)
		b.w.handle(b.delivery())
	}()
	select {
	case err := <-got:
		if err != context.DeadlineExceeded {
			t.Fatalf("the last call's context ended with %v, want DeadlineExceeded", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the last call's deadline never fired")
	}
	<-done
}

// A handler that derives and cancels contexts in a loop (a request per
// item, each WithTimeout) must not make its context hold every one of them
// until it returns: context.WithCancel's own parent forgets a cancelled
// child.
func TestCallCtxForgetsStoppedAfterFuncs(t *testing.T) {
	t.Parallel()
	c := newCallCtx(context.Background(), time.Now().Add(time.Hour))
	for range 10000 {
		child, cancel := context.WithTimeout(c, time.Hour)
		cancel()
		<-child.Done()
		stop := context.AfterFunc(c, func() {})
		stop()
	}
	c.mu.Lock()
	n := len(c.after)
	c.mu.Unlock()
	if n > 0 {
		t.Errorf("%d stopped AfterFuncs still held", n)
	}
	ran := make(chan struct{})
	context.AfterFunc(c, func() { close(ran) })
	c.end(context.Canceled)
	<-ran
}
