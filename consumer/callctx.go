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

	mu    sync.Mutex
	done  chan struct{} // made on first use
	err   error
	after []*afterFunc
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
	if pd, ok := ctx.Deadline(); ok && pd.Before(deadline) {
		deadline = pd
	}
	return &callCtx{values: context.WithoutCancel(ctx), deadline: deadline}
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
		c.after = append(c.after, a)
	}
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		stopped := !a.stopped
		a.stopped = true
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
	for _, a := range c.after {
		if !a.stopped {
			a.stopped = true
			go a.f()
		}
	}
	c.after = nil
}

func (c *callCtx) String() string { return "dlxbridge handler context" }
