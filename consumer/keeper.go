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
