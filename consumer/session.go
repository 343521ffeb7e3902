package consumer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/config"
	"github.com/dlxbridge/dlxbridge/internal/amqpx"
	"github.com/dlxbridge/dlxbridge/quarantine"
	"github.com/dlxbridge/dlxbridge/schemas"
	"github.com/dlxbridge/dlxbridge/topology"
	"github.com/dlxbridge/dlxbridge/triage"
)

// queueRuntime is what stays fixed for one work queue across reconnects.
type queueRuntime struct {
	c       *Consumer
	cfg     *config.Queue
	gate    *schemas.Gate
	policy  triage.Policy
	redact  quarantine.Redaction
	router  *router
	accepts map[string]map[string]bool
	// slots bounds running handlers to Concurrency across sessions: a
	// handler holds a slot until it returns, even after it was abandoned.
	slots chan struct{}
	// publishFailures remembers, by message id, why this process last
	// failed to publish a message's retry or quarantine copy, so that when
	// the crash-loop guard later quarantines it the envelope says the broker
	// refused publishes rather than leaving a bare "crash-loop".
	publishFailures failureMemo

	// Set per session (topology names depend only on the config, but the
	// broker version is read on connect).
	wq      *topology.WorkQueue
	isRetry map[string]bool
}

func newQueueRuntime(c *Consumer, q *config.Queue) (*queueRuntime, error) {
	accepts := map[string][]string{}
	acceptSet := map[string]map[string]bool{}
	for _, a := range q.Accepts {
		accepts[a.Type] = a.Versions
		acceptSet[a.Type] = map[string]bool{}
		for _, v := range a.Versions {
			acceptSet[a.Type][v] = true
		}
	}
	gate, err := schemas.NewGate(schemas.GateConfig{
		Registry: c.cfg.Registry,
		Identity: schemas.Identity{
			From:           q.Message.From,
			VersionHeader:  q.Message.VersionHeader,
			TypePointer:    q.Message.TypePointer,
			VersionPointer: q.Message.VersionPointer,
		},
		Accepts:      accepts,
		MaxBodyBytes: c.cfg.File.Schemas.MaxBodyBytes,
	})
	if err != nil {
		return nil, fmt.Errorf("queue %q: schema gate: %w", q.Name, err)
	}
	policy := triage.Policy{
		Tiers:               q.Retry.Tiers,
		Lanes:               q.Retry.Lanes,
		Jitter:              q.Retry.JitterValue(),
		MaxAttempts:         q.Retry.MaxAttempts,
		MaxElapsed:          q.Retry.MaxElapsedValue(),
		CrashLoopDeliveries: q.Consumer.CrashLoopDeliveries,
	}
	if err := policy.Validate(); err != nil {
		return nil, fmt.Errorf("queue %q: retry policy: %w", q.Name, err)
	}
	return &queueRuntime{
		c:       c,
		cfg:     q,
		gate:    gate,
		policy:  policy,
		redact:  quarantine.Redaction{Headers: q.Quarantine.Redact.Headers, Fields: q.Quarantine.Redact.Fields},
		accepts: acceptSet,
		slots:   make(chan struct{}, q.Consumer.Concurrency),
	}, nil
}

// session runs one connection pair's lifetime: it returns when ctx ends
// (after draining) or when a connection or any consume channel is lost.
//
// Retries and quarantines are published on a connection of their own: when
// a resource alarm blocks publishing connections, the broker stops reading
// from them, and acks sent on a shared connection would stall with them.
func (c *Consumer) session(ctx context.Context, queues []*queueRuntime) error {
	conn, err := amqpx.Dial(c.cfg.URL, c.cfg.ConnectionName)
	if err != nil {
		return err
	}
	defer conn.Close()
	pubConn, err := amqpx.Dial(c.cfg.URL, c.cfg.ConnectionName+"/publish")
	if err != nil {
		return err
	}
	defer pubConn.Close()
	amqpx.WatchBlocked(pubConn, func(b amqp.Blocking) {
		if b.Active {
			c.log.Warn("the broker blocked publishing (resource alarm): retries and quarantines wait, then requeue", "reason", b.Reason)
		} else {
			c.log.Info("the broker unblocked publishing")
		}
	})
	version, err := topology.VersionFromProperties(conn.Properties)
	if err != nil {
		return err
	}
	topo := topology.Build(c.cfg.File, version)
	connClosed := amqpx.WatchConnection(conn)
	pubClosed := amqpx.WatchConnection(pubConn)

	lost := make(chan error, len(queues))
	var runners []*queueSession
	for _, qr := range queues {
		wq, _ := topo.WorkQueue(qr.cfg.Name)
		qr.wq = wq
		qr.isRetry = map[string]bool{}
		for _, t := range wq.Tiers {
			for _, l := range t.Lanes {
				qr.isRetry[l.Queue] = true
			}
		}
		qs, err := startQueueSession(ctx, conn, pubConn, qr, lost)
		if err != nil {
			for _, r := range runners {
				r.stop(0)
			}
			return err
		}
		runners = append(runners, qs)
	}
	stopKeepers := c.startKeepers(ctx, conn, pubConn, queues)
	defer stopKeepers()
	c.log.Info("consuming", "queues", len(runners), "broker", version.String())
	if h := c.cfg.hooks; h != nil && h.consuming != nil {
		h.consuming()
	}

	// Drain unless the consuming connection itself is gone: after losing the
	// publishing connection or one queue's channel, the other queues can
	// still finish and ack what they hold.
	drain := c.cfg.DrainTimeout
	var cause error
	select {
	case <-ctx.Done():
	case cause = <-connClosed:
		if cause == nil {
			cause = errors.New("connection closed")
		}
		drain = 0 // nothing can be acked any more
	case cause = <-pubClosed:
		if cause == nil {
			cause = errors.New("publishing connection closed")
		}
		cause = fmt.Errorf("publishing connection: %w", cause)
	case cause = <-lost:
	}
	var wg sync.WaitGroup
	for _, r := range runners {
		wg.Add(1)
		go func() { defer wg.Done(); r.stop(drain) }()
	}
	wg.Wait()
	return cause
}

// queueSession is one work queue's consume channel and workers for one
// connection.
type queueSession struct {
	qr      *queueRuntime
	pubConn *amqp.Connection // for retry and quarantine publishes
	ch      *amqp.Channel
	tag     string
	workers sync.WaitGroup
	// handlerCtx is cancelled when the drain deadline passes.
	handlerCtx    context.Context
	cancelHandler context.CancelFunc
	// stopping is closed when stop begins.
	stopping chan struct{}
}

func startQueueSession(ctx context.Context, conn, pubConn *amqp.Connection, qr *queueRuntime, lost chan<- error) (*queueSession, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("queue %q: open channel: %w", qr.cfg.Name, err)
	}
	if err := ch.Qos(qr.cfg.Consumer.Prefetch, 0, false); err != nil {
		return nil, fmt.Errorf("queue %q: set prefetch: %w", qr.cfg.Name, err)
	}
	tag := fmt.Sprintf("dlxbridge-%s-%s-%d", qr.c.host, qr.cfg.Name, time.Now().UnixNano())
	deliveries, err := ch.ConsumeWithContext(context.WithoutCancel(ctx), qr.cfg.Name, tag, false, false, false, false, nil)
	if err != nil {
		return nil, fmt.Errorf("queue %q: consume (was the topology applied?): %w", qr.cfg.Name, err)
	}
	hctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	qs := &queueSession{qr: qr, pubConn: pubConn, ch: ch, tag: tag, handlerCtx: hctx, cancelHandler: cancel, stopping: make(chan struct{})}
	watch := amqpx.WatchChannel(ch, qs.stopping)
	go func() {
		if err, ok := <-watch; ok && err != nil {
			report(lost, fmt.Errorf("queue %q: %w", qr.cfg.Name, err))
		}
	}()
	for i := 0; i < qr.cfg.Consumer.Concurrency; i++ {
		qs.workers.Add(1)
		go func() {
			defer qs.workers.Done()
			w := &worker{qs: qs}
			defer w.close()
			for d := range deliveries {
				select {
				case <-qs.stopping:
					// Prefetched but not started: leave it unsettled; the
					// broker requeues it when the channel closes.
					continue
				default:
				}
				w.process(d)
			}
		}()
	}
	return qs, nil
}

// stop cancels the consumer, waits up to drain for in-flight handlers, then
// closes the channel (the broker requeues anything unacked).
func (qs *queueSession) stop(drain time.Duration) {
	close(qs.stopping)
	// basic.cancel is a synchronous RPC; don't let a stuck broker hold the
	// drain deadline hostage. Close below ends it either way.
	go func() { _ = qs.ch.Cancel(qs.tag, false) }()
	done := make(chan struct{})
	go func() { qs.workers.Wait(); close(done) }()
	timer := time.NewTimer(drain)
	defer timer.Stop()
	select {
	case <-done:
	case <-timer.C:
		qs.cancelHandler()
		if drain > 0 {
			qs.qr.c.log.Warn("drain deadline passed; closing the channel with messages unsettled", "queue", qs.qr.cfg.Name)
		}
	}
	// An ack written just before a channel close can be lost on some
	// brokers (seen on 3.10.8); a short pause lets acks reach the wire.
	time.Sleep(20 * time.Millisecond)
	_ = qs.ch.Close()
	<-done
	qs.cancelHandler()
}

// report hands a session-ending error to the session without blocking: the
// first one ends the session, later ones have nobody to read them.
func report(lost chan<- error, err error) {
	select {
	case lost <- err:
	default:
	}
}
