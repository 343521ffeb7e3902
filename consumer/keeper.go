package consumer

import (
	"context"
	"slices"
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
	rules := keeperRedactions(sessions)
	seen := map[string]bool{}
	var keepers []*quarantine.Keeper
	for _, qs := range sessions {
		if seen[qs.wq.Quarantine] {
			continue
		}
		seen[qs.wq.Quarantine] = true
		keepers = append(keepers, &quarantine.Keeper{
			Consume: conn, Publish: pubConn, Intake: qs.wq.Quarantine, Records: qs.wq.Records,
			Now: c.cfg.Now, Logger: c.log, Verifier: c.deps.verifier, Redaction: rules[qs.wq.Quarantine],
			Metrics: c.cfg.QuarantineMetrics, Config: c.cfg.File,
		})
	}
	if k := c.unroutedKeeper(conn, pubConn, sessions); k != nil {
		keepers = append(keepers, k)
	}
	for _, k := range keepers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			superviseKeeper(ctx, func(ctx context.Context) (bool, error) {
				before := k.Moved()
				err := k.Run(ctx)
				return k.Moved() > before, err
			}, c.cfg.ReconnectMin, c.cfg.ReconnectMax, func(ctx context.Context, d time.Duration, err error) bool {
				c.log.Warn("quarantine keeper stopped; starting again", "intake", k.Intake, "error", err, "in", d)
				select {
				case <-ctx.Done():
					return false
				case <-time.After(d):
					return true
				}
			})
		}()
	}
	return func() { cancel(); wg.Wait() }
}

// unroutedKeeper keeps the shared tiers' catch-all (retries whose work
// queue was gone when they came back) when one of the sessions' queues
// retries through the shared tiers, with the union of their redactions;
// nil otherwise.
func (c *Consumer) unroutedKeeper(conn, pubConn *amqp.Connection, sessions []*queueSession) *quarantine.Keeper {
	u, ok := c.cfg.File.UnroutedQuarantine()
	served := false
	for _, qs := range sessions {
		served = served || qs.wq.Shared() // not while it retries into its own lanes (see retryRoute)
	}
	if !ok || !served {
		return nil
	}
	return &quarantine.Keeper{
		Consume: conn, Publish: pubConn, Intake: u.Quarantine.Queue, Records: u.Quarantine.RecordsStream(),
		Now: c.cfg.Now, Logger: c.log, Verifier: c.deps.verifier,
		Redaction: quarantine.Redaction{Headers: u.Quarantine.Redact.Headers, Fields: u.Quarantine.Redact.Fields, MaxBodyBytes: c.cfg.File.Schemas.MaxBodyBytes},
	}
}

// keeperRedactions is, per quarantine queue, what its keeper redacts from
// the records the runtime did not redact itself (quarantine.Keeper's
// Redaction): the union of the rules of every work queue in the config
// that names it, handled by this process or not. A broker dead letter's
// work queue is named only by its headers (x-death, which a producer can
// forge), and keepers compete for a shared intake: a process that handles
// one of the queues stores the others' dead letters too, so a shared
// quarantine's keeper scrubs everything any of them asks for.
func keeperRedactions(sessions []*queueSession) map[string]quarantine.Redaction {
	rules := map[string]quarantine.Redaction{}
	for _, qs := range sessions {
		intake := qs.wq.Quarantine
		if _, done := rules[intake]; done {
			continue
		}
		own := qs.q.redact
		r := quarantine.Redaction{
			Headers:      slices.Clone(own.Headers),
			Fields:       slices.Clone(own.Fields),
			MaxBodyBytes: own.MaxBodyBytes, // the same for every queue: schemas.max_body_bytes
		}
		for _, qc := range qs.deps.cfg.File.Queues {
			if qc.Quarantine.Queue == intake && qc.Name != qs.q.cfg.Name {
				r.Headers = append(r.Headers, qc.Quarantine.Redact.Headers...)
				r.Fields = append(r.Fields, qc.Quarantine.Redact.Fields...)
			}
		}
		rules[intake] = r
	}
	return rules
}

// superviseKeeper calls run until ctx ends, and wait (which reports false
// when ctx ended) between runs. The wait doubles from lo up to hi while runs
// fail without moving a record, and starts again from lo after a run that
// moved some: a keeper that stored records for a day and then lost its
// connection comes back as fast as a new one.
func superviseKeeper(ctx context.Context, run func(context.Context) (moved bool, err error), lo, hi time.Duration, wait func(context.Context, time.Duration, error) bool) {
	backoff := lo
	for {
		moved, err := run(ctx)
		if ctx.Err() != nil {
			return
		}
		if moved {
			backoff = lo
		}
		if !wait(ctx, backoff, err) {
			return
		}
		backoff = min(backoff*2, hi)
	}
}

// startQuarantineMetrics refreshes cfg.QuarantineMetrics (read over conn) at once
// and then every cfg.QuarantineRefresh until the session ends, and writes
// an expired event for each record newly past its retention
// (quarantine.Replayer.RecordExpiries), carries open records forward
// before retention deletes them (quarantine.Replayer.CarryForward) and, with a configured key, a
// signing-started event into each events stream that has no signed event
// yet (quarantine.Replayer.StartSigning). A failed
// refresh is logged; the metrics keep the last snapshot. The events and
// carried records are published over pubConn: during a resource alarm
// the broker stops reading from a connection once it publishes, and on
// the consuming connection that would stall every ack. The returned stop
// waits for the refresher.
func (c *Consumer) startQuarantineMetrics(ctx context.Context, conn, pubConn *amqp.Connection) (stop func()) {
	m := c.cfg.QuarantineMetrics
	if m == nil {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		// Counting needs no payload: without them, a refresh of a large
		// quarantine costs its records' meta, not a copy of every body.
		// With the configured key (never a random one of this process's,
		// which no other writer shares) the events are verified, and the
		// runtime's own are signed: a forged "purged" event then moves no
		// gauge.
		key := c.deps.verifier
		in := &quarantine.Inspector{Conn: conn, Config: c.cfg.File, Now: c.cfg.Now, OmitBodies: true, Verifier: key}
		// Expiries are written as events at each refresh, so that they are
		// still counted after the broker deletes the records.
		rp := &quarantine.Replayer{Conn: pubConn, Config: c.cfg.File, Metrics: m, Now: c.cfg.Now, Signer: key}
		tick := time.NewTicker(c.cfg.QuarantineRefresh)
		defer tick.Stop()
		for {
			snap, err := in.Snapshot(ctx)
			if err == nil {
				m.Observe(snap)
				// The first refresh marks where each stream's signed
				// events begin (see Replayer.StartSigning).
				// Open records near their retention are carried forward
				// first, so that expiry names only what was let go.
				if _, err = rp.StartSigning(ctx, snap); err == nil {
					if _, err = rp.CarryForward(ctx, snap); err == nil {
						_, err = rp.RecordExpiries(ctx, snap)
					}
				}
			}
			if err != nil && ctx.Err() == nil {
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
