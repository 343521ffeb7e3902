package consumer

import (
	"context"
	"sync"
	"time"
)

// callCtx is the context a handler runs under, in place of
// context.WithTimeout's: it holds the delivery's values (its trace context),
// and it is done when the handler's deadline passes, when the session's
// handlers are cancelled (the drain deadline), or once the handler has
// returned. The worker, which waits for the handler anyway, ends it (end),
// on one timer of its own: no timer per message, and no registration with
// the session's context, which all its workers share.
type callCtx struct {
	// values is the delivery's context with its cancellation cut off:
	// context.Cause then falls back to Err.
	values   context.Context
	deadline time.Time

	mu   sync.Mutex
	done chan struct{} // made on first use
	err  error
	// after holds the AfterFuncs not yet stopped: a stopped one (a
	// derived context cancelled) is forgotten, as context's own parents
	// forget a cancelled child, or a handler deriving one per request
	// would hold them all until it returns.
	after map[*afterFunc]struct{}
}

type afterFunc struct {
	f       func()
	stopped bool // stopped, or started
}

// closedChan is the Done of a callCtx that ended before anyone asked.
var closedChan = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

// newCallCtx returns the context of a handler call on the delivery's ctx
// that must end by deadline (or the parent's, if earlier, as
// context.WithDeadline does).
func newCallCtx(ctx context.Context, deadline time.Time) *callCtx {
	c := &callCtx{}
	c.init(ctx, deadline)
	return c
}

// init makes c newCallCtx(ctx, deadline) in place (see handlerCall).
func (c *callCtx) init(ctx context.Context, deadline time.Time) {
	if pd, ok := ctx.Deadline(); ok && pd.Before(deadline) {
		deadline = pd
	}
	c.values, c.deadline = context.WithoutCancel(ctx), deadline
}

func (c *callCtx) Deadline() (time.Time, bool) { return c.deadline, true }

func (c *callCtx) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done == nil {
		if c.err != nil {
			c.done = closedChan
		} else {
			c.done = make(chan struct{})
		}
	}
	return c.done
}

func (c *callCtx) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

func (c *callCtx) Value(key any) any { return c.values.Value(key) }

// AfterFunc lets the contexts a handler derives from this one (WithCancel,
// WithTimeout, ...) be ended by it without a goroutine each: package
// context looks for this method on a parent it does not know.
func (c *callCtx) AfterFunc(f func()) (stop func() bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	a := &afterFunc{f: f}
	if c.err != nil {
		a.stopped = true
		go f()
	} else {
		if c.after == nil {
			c.after = make(map[*afterFunc]struct{})
		}
		c.after[a] = struct{}{}
	}
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		stopped := !a.stopped
		a.stopped = true
		delete(c.after, a)
		return stopped
	}
}

// end ends the context with err, unless it has ended already.
func (c *callCtx) end(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return
	}
	c.err = err
	if c.done == nil {
		c.done = closedChan
	} else {
		close(c.done)
	}
	for a := range c.after {
		if !a.stopped {
			a.stopped = true
			go a.f()
		}
	}
	c.after = nil
}

func (c *callCtx) String() string { return "dlxbridge handler context" }

// watchdog ends a worker's handler calls at their deadlines on one timer
// that is not touched per call: calls start one after another, their
// deadlines mostly growing (start + the queue's handler timeout), so the
// timer set for an earlier call's deadline is left as it is, and when it
// fires it sets itself again for the call then in hand, if that call's
// deadline is still ahead. A call with an earlier deadline (an immediate
// retry's, cut to the delivery's share; see worker.immediateTimeout) sets
// it again at start. With the usual 30 s timeout it fires about
// every 30 s while the worker is busy, however many calls it runs. It also
// ends the call in hand when the session's handlers are cancelled (the
// drain deadline), on one context.AfterFunc for the worker's life.
//
// A call it ended that is still running abandonGrace later is abandoned:
// abandon (the worker's takeOver) then runs on a goroutine of its own.
type watchdog struct {
	mu        sync.Mutex
	t         *time.Timer
	at        time.Time // when t fires, if armed
	armed     bool
	call      *handlerCall // the call in hand; nil between calls and once ended
	cancelled bool         // the session's handlers were cancelled
	session   context.Context
	abandon   func(*handlerCall, error)
	// stopCancel unregisters the AfterFunc on the session.
	stopCancel func() bool
}

func newWatchdog(session context.Context, abandon func(*handlerCall, error)) *watchdog {
	wd := &watchdog{session: session, abandon: abandon}
	wd.stopCancel = context.AfterFunc(session, func() {
		wd.mu.Lock()
		wd.cancelled = true
		c := wd.call
		wd.call = nil
		wd.mu.Unlock()
		if c != nil {
			wd.expire(c, session.Err())
		}
	})
	return wd
}

// start watches c until finish.
func (wd *watchdog) start(c *handlerCall) {
	wd.mu.Lock()
	if wd.cancelled {
		wd.mu.Unlock()
		wd.expire(c, wd.session.Err())
		return
	}
	wd.call = c
	if !wd.armed || c.deadline.Before(wd.at) {
		wd.arm(c.deadline)
	} // else it fires first and sets itself again
	wd.mu.Unlock()
}

// arm sets the timer for at. Called with mu held.
func (wd *watchdog) arm(at time.Time) {
	d := time.Until(at)
	if wd.t == nil {
		wd.t = time.AfterFunc(d, wd.fire)
	} else {
		wd.t.Reset(d)
	}
	wd.at, wd.armed = at, true
}

func (wd *watchdog) fire() {
	wd.mu.Lock()
	wd.armed = false
	c := wd.call
	if c == nil {
		wd.mu.Unlock()
		return
	}
	if time.Now().Before(c.deadline) {
		wd.arm(c.deadline)
		wd.mu.Unlock()
		return
	}
	wd.call = nil
	wd.mu.Unlock()
	wd.expire(c, context.DeadlineExceeded)
}

// expire ends call c with err and, the first time, starts its grace
// period: if it is still running at the end, it is abandoned.
func (wd *watchdog) expire(c *handlerCall, err error) {
	c.end(err)
	if c.state.Load() != callRunning || !c.graced.CompareAndSwap(false, true) {
		return
	}
	time.AfterFunc(abandonGrace, func() {
		if c.state.CompareAndSwap(callRunning, callAbandoned) {
			wd.abandon(c, nil)
		}
	})
}

// finish stops watching the call in hand. Only the goroutine that is the
// worker calls it: one whose call was abandoned no longer is.
func (wd *watchdog) finish() {
	wd.mu.Lock()
	wd.call = nil
	wd.mu.Unlock()
}

// stop ends the watchdog (the worker's end).
func (wd *watchdog) stop() {
	wd.stopCancel()
	wd.mu.Lock()
	defer wd.mu.Unlock()
	wd.call = nil
	if wd.t != nil {
		wd.t.Stop()
		wd.armed = false
	}
}
