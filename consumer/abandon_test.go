package consumer

import (
	"context"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlxbridge/dlxbridge/triage"
)

// The handler runs on the worker's goroutine; one that ignores its deadline
// is abandoned there, and another goroutine takes over as the worker. These
// run a worker's loop (work) on a session with no connection.

// loopWorker starts a worker loop on b's session, fed by the returned
// channel; stop closes it and waits for the loop (whichever goroutine runs
// it by then) to end.
func (b *processBundle) loopWorker(t *testing.T) (fed chan fedDelivery, stop func()) {
	t.Helper()
	qs := b.w.s
	fed = make(chan fedDelivery)
	qs.fed = fed
	qs.workers.Add(1)
	go newWorker(qs, &fakeConfirmer{}).work()
	var once atomic.Bool
	stop = func() {
		if once.CompareAndSwap(false, true) {
			close(fed)
			qs.workers.Wait()
		}
	}
	t.Cleanup(stop)
	return fed, stop
}

// An abandoned handler that returns late: its delivery was settled once, as
// a timeout, by the goroutine that took over, which goes on with the next
// delivery; the late result (a success) is discarded, and the concurrency
// slot it held is freed only when it returns, so the next handler waits for
// it (Concurrency 1).
func TestAbandonedHandlerReturnsLate(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	returned := make(chan struct{})
	var calls, running atomic.Int32
	b := newProcessBundle(t, func(c *Config) {
		c.File.Queues[0].Consumer.HandlerTimeout = 20 * time.Millisecond
		c.File.Queues[0].Consumer.Concurrency = 1
		c.hooks = &testHooks{abandonedReturned: func() { close(returned) }}
	}, func(ctx context.Context, m *Message) error {
		if running.Add(1) > 1 {
			t.Error("two handlers ran at once with Concurrency 1")
		}
		defer running.Add(-1)
		if calls.Add(1) == 1 {
			<-release // ignores ctx
		}
		return nil
	})
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})
	fed, stop := b.loopWorker(t)
	slots := b.w.q.slots

	fed <- b.fed()
	if st := b.waitSettled(t); st.Outcome != OutcomeRetried || st.Class != triage.ClassTimeout {
		t.Fatalf("the abandoned delivery settled %s, class %q; want retried, timeout", st.Outcome, st.Class)
	}
	// The worker goes on: it takes the next delivery while the abandoned
	// handler still holds the only slot.
	fed <- b.fed()
	if n := len(slots); n != 1 {
		t.Fatalf("%d slots held while the abandoned handler runs, want 1", n)
	}
	if calls.Load() != 1 {
		t.Fatal("the next handler started while the abandoned one held the only slot")
	}
	close(release)
	<-returned
	if st := b.waitSettled(t); st.Outcome != OutcomeAcked {
		t.Fatalf("the next delivery settled %s, want acked", st.Outcome)
	}
	stop()
	if n := len(slots); n != 0 {
		t.Fatalf("%d slots held after every handler returned, want 0", n)
	}
	select {
	case st := <-b.settled:
		t.Fatalf("a third settlement (%s): the late result was not discarded", st.Outcome)
	default:
	}
	if got := calls.Load(); got != 2 {
		t.Fatalf("%d handler calls, want 2", got)
	}
}

// At the drain deadline (the session's handlers cancelled) a handler that
// ignores its context is abandoned after the grace: the delivery is left
// unsettled (abandoned), and the worker's loop ends while the handler still
// runs, so a stop is not held by it.
func TestAbandonedAtDrainDeadlineEndsTheLoop(t *testing.T) {
	t.Parallel()
	started := make(chan struct{})
	release := make(chan struct{})
	returned := make(chan struct{})
	b := newProcessBundle(t, func(c *Config) {
		c.hooks = &testHooks{abandonedReturned: func() { close(returned) }}
	}, func(ctx context.Context, m *Message) error {
		close(started)
		<-release // ignores ctx
		return nil
	})
	fed, _ := b.loopWorker(t)
	fed <- b.fed()
	<-started
	b.cancel()
	if st := b.waitSettled(t); st.Outcome != OutcomeAbandoned {
		t.Fatalf("settled %s, want %s", st.Outcome, OutcomeAbandoned)
	}
	b.w.s.workers.Wait() // the loop ended at the cancel, the handler still runs
	close(release)
	<-returned
	if n := len(b.w.q.slots); n != 0 {
		t.Fatalf("%d slots held after the handler returned, want 0", n)
	}
}

// A handler that calls runtime.Goexit (t.FailNow in a test's handler) ends
// the worker's goroutine: the delivery is settled at once as a panic by the
// goroutine that takes over, which goes on with the next delivery. Before,
// it waited for the deadline and its grace (an hour here: no outcome) and
// was then counted a timeout.
func TestHandlerGoexitIsSettledAtOnceAsAPanic(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	b := newProcessBundle(t, handlerTimeout(time.Hour), func(ctx context.Context, m *Message) error {
		if calls.Add(1) == 1 {
			runtime.Goexit()
		}
		return nil
	})
	fed, stop := b.loopWorker(t)
	fed <- b.fed()
	if st := b.waitSettled(t); st.Outcome != OutcomeRetried || st.Class != triage.ClassPanic {
		t.Fatalf("settled %s, class %q; want retried, panic", st.Outcome, st.Class)
	}
	fed <- b.fed()
	if st := b.waitSettled(t); st.Outcome != OutcomeAcked {
		t.Fatalf("the next delivery settled %s, want acked", st.Outcome)
	}
	stop()
	if n := len(b.w.q.slots); n != 0 {
		t.Fatalf("%d slots held after stop, want 0", n)
	}
}
