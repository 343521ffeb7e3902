package consumer

import (
	"context"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/quarantine"
)

// startKeepers runs one quarantine.Keeper per quarantine queue of the
// session's work queues (a shared quarantine once): it moves what arrives
// in the intake, from the broker's dead-lettering or the runtime's own
// quarantine publishes, into the records stream, confirm before ack. A
// keeper that fails (e.g. the streams were not declared yet) logs and
// starts again with backoff; it never ends the session, since work queues
// do not depend on it. The returned stop waits for every keeper.
func (c *Consumer) startKeepers(ctx context.Context, conn, pubConn *amqp.Connection, sessions []*queueSession) (stop func()) {
	if h := c.cfg.hooks; c.cfg.KeepQuarantineIntake || h != nil && !h.keeper {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	seen := map[string]bool{}
	for _, qs := range sessions {
		if seen[qs.wq.Quarantine] {
			continue
		}
		seen[qs.wq.Quarantine] = true
		k := &quarantine.Keeper{
			Consume: conn, Publish: pubConn, Intake: qs.wq.Quarantine, Records: qs.wq.Records,
			Now: c.cfg.Now, Logger: c.log,
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			backoff := c.cfg.ReconnectMin
			for {
				err := k.Run(ctx)
				if ctx.Err() != nil {
					return
				}
				c.log.Warn("quarantine keeper stopped; starting again", "intake", k.Intake, "error", err, "in", backoff)
				select {
				case <-ctx.Done():
					return
				case <-time.After(backoff):
				}
				backoff = min(backoff*2, c.cfg.ReconnectMax)
			}
		}()
	}
	return func() { cancel(); wg.Wait() }
}

// startQuarantineMetrics refreshes cfg.QuarantineMetrics over conn at once
// and then every cfg.QuarantineRefresh until the session ends. A failed
// refresh is logged; the metrics keep the last snapshot. The returned stop
// waits for the refresher.
func (c *Consumer) startQuarantineMetrics(ctx context.Context, conn *amqp.Connection) (stop func()) {
	m := c.cfg.QuarantineMetrics
	if m == nil {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		in := &quarantine.Inspector{Conn: conn, Config: c.cfg.File, Now: c.cfg.Now}
		tick := time.NewTicker(c.cfg.QuarantineRefresh)
		defer tick.Stop()
		for {
			if err := m.Refresh(ctx, in); err != nil && ctx.Err() == nil {
				c.log.Warn("quarantine metrics: refresh failed; keeping the last values", "error", err)
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return func() { cancel(); <-done }
}
