package consumer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/internal/amqpx"
	"github.com/dlxbridge/dlxbridge/topology"
	"github.com/dlxbridge/dlxbridge/triage"
)

// session runs one connection pair's lifetime: it returns when ctx ends
// (after draining) or when a connection or any consume channel is lost.
//
// Retries and quarantines are published on a connection of their own: when
// a resource alarm blocks publishing connections, the broker stops reading
// from them, and acks sent on a shared connection would stall with them.
// Nothing in a session waits on the broker without a bound: during an alarm
// the broker answers nothing on the publishing connection (no confirm, no
// channel open or close-ok), so workers wait for the unblock only until the
// drain deadline, and closes are abandoned (the socket is closed) after
// amqpx.CloseTimeout, or at once when the connection is known to be blocked.
func (c *Consumer) session(ctx context.Context, queues []*queueRuntime) error {
	conn, node, err := c.dialer.Dial(ctx, c.cfg.ConnectionName)
	if err != nil {
		return err
	}
	defer amqpx.CloseConnection(conn, amqpx.CloseTimeout)
	// Whatever ends the session, the next one starts at the next node:
	// when this one is down, that saves a timeout; when it is not, any node
	// of the cluster serves the queues as well.
	defer func() {
		if ctx.Err() == nil {
			c.dialer.Lost(node)
		}
	}()
	// The publishing connection goes to the same node (the dialer starts
	// where it last succeeded), unless that node fails in between.
	pubConn, _, err := c.dialer.Dial(ctx, c.cfg.ConnectionName+"/publish")
	if err != nil {
		return err
	}
	// One publishing connection for every queue: each queue's gauge says
	// whether it is blocked. A session that ends while blocked leaves them
	// at 0: the next connection is blocked anew (and says so) if the alarm
	// is still on.
	setBlocked := func(v float64) {
		for _, qr := range queues {
			c.deps.metrics.publishingBlocked.WithLabelValues(qr.cfg.Name).Set(v)
		}
	}
	setBlocked(0)
	defer setBlocked(0)
	blocking := amqpx.WatchBlocked(pubConn, func(b amqp.Blocking) {
		if b.Active {
			setBlocked(1)
		} else {
			setBlocked(0)
		}
		if b.Active {
			c.log.Warn("the broker blocked publishing (resource alarm): retries and quarantines wait until it unblocks", "reason", b.Reason)
		} else {
			c.log.Info("the broker unblocked publishing")
		}
		if h := c.cfg.hooks; h != nil && h.blocked != nil {
			h.blocked(b.Active)
		}
	})
	var closePubOnce sync.Once
	closePub := func() {
		closePubOnce.Do(func() {
			within := amqpx.CloseTimeout
			if blocked, _ := blocking.Blocked(); blocked {
				within = 0 // no close-ok comes before the alarm clears
			}
			_ = amqpx.CloseConnection(pubConn, within)
		})
	}
	defer closePub()
	version, err := topology.VersionFromProperties(conn.Properties)
	if err != nil {
		return err
	}
	topo, err := topology.Build(c.cfg.File, version)
	if err != nil {
		return err
	}
	connClosed := amqpx.WatchConnection(conn)
	pubClosed := amqpx.WatchConnection(pubConn)

	lost := make(chan error, len(queues))
	var runners []*queueSession
	maxSize := &sizeLimit{}
	for _, qr := range queues {
		wq, _ := topo.WorkQueue(qr.cfg.Name)
		qs, err := startQueueSession(ctx, conn, pubConn, blocking, maxSize, qr, wq, carriesCounts(version), lost)
		if err != nil {
			c.stopAll(runners, 0, conn, closePub)
			return err
		}
		runners = append(runners, qs)
	}
	stopKeepers := c.startKeepers(ctx, conn, pubConn, runners)
	defer stopKeepers()
	defer c.startQuarantineMetrics(ctx, conn, pubConn)()
	defer c.startJobRecorder(ctx, pubConn)()
	defer c.startRedriver(ctx, pubConn)()
	// Those above publish on pubConn; during a resource alarm the broker
	// answers nothing there (no confirm, channel open or close-ok), and
	// their stops would wait for the alarm to clear. Closing it first ends
	// what they wait for: they stop at once, their writes undone or left
	// to the next session (a replay's unmarked message is sent again, a
	// duplicate).
	defer func() {
		if blocked, _ := blocking.Blocked(); blocked {
			closePub()
		}
	}()
	c.log.Info("consuming", "queues", len(runners), "broker", version.String(), "node", node.Addr(), "cluster", node.ClusterName)
	c.node.Store(&node)
	defer c.node.Store(nil)
	if h := c.cfg.hooks; h != nil && h.consuming != nil {
		h.consuming()
	}
	c.ready.Store(true)

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
	c.ready.Store(false)
	c.stopAll(runners, drain, conn, closePub)
	return cause
}

// stopAll stops every queue session: it cancels their consumers, lets the
// workers handle what was already delivered for up to drain, then closes the
// channels. A graceful stop thus returns nothing to the queues that it
// received in time (a message returned by a channel close counts as a
// delivery toward the queue's delivery limit).
//
// At the drain deadline handlers are told to stop and the publishing
// connection is closed, which ends every publish, confirm wait and channel
// open still waiting on it; past abandonGrace more (a handler that ignores
// its context gets that long) the consuming connection is closed too.
// Deliveries left unsettled are requeued by the broker.
func (c *Consumer) stopAll(runners []*queueSession, drain time.Duration, conn *amqp.Connection, closePub func()) {
	for _, r := range runners {
		r.beginStop()
	}
	done := make(chan struct{})
	go func() {
		for _, r := range runners {
			r.workers.Wait()
		}
		close(done)
	}()
	timer := time.NewTimer(drain)
	defer timer.Stop()
	select {
	case <-done:
	case <-timer.C:
		for _, r := range runners {
			r.cancelHandler()
		}
		if drain > 0 {
			c.log.Warn("drain deadline passed; closing with messages unsettled (the broker requeues them)")
		}
		closePub()
		grace := time.NewTimer(abandonGrace + 250*time.Millisecond)
		defer grace.Stop()
		select {
		case <-done:
		case <-grace.C:
			// Only an ack or reject stuck on the consuming connection's
			// socket is left: end it.
			_ = amqpx.CloseConnection(conn, 0)
			<-done
		}
	}
	// Each was reported (abandoned) as it was left; this says how many a
	// stop handed back, once, where whoever stopped it looks.
	for _, r := range runners {
		if n := r.unsettled.Load(); n > 0 {
			c.log.Warn("deliveries left unsettled at the stop; the broker requeues them when the channel closes", "queue", r.q.cfg.Name, "count", n)
		}
	}
	// An ack written just before a channel close can be lost on some
	// brokers (seen on 3.10.8); a short pause lets acks reach the wire.
	time.Sleep(20 * time.Millisecond)
	var wg sync.WaitGroup
	for _, r := range runners {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = amqpx.CloseChannel(r.ch, amqpx.CloseTimeout)
			r.cancelHandler()
		}()
	}
	wg.Wait()
}

// queueSession is one work queue's consume channel and workers for one
// connection.
type queueSession struct {
	deps *deps
	q    *queueRuntime
	// wq is the queue's topology; its names depend only on the config, but
	// the broker version is read on connect.
	wq *topology.WorkQueue
	// isRetry holds the queues whose expiries return wq's retries (see
	// retryQueues).
	isRetry map[string]bool
	// carriedCounts: the broker may carry a delivery count across
	// dead-lettering (triage.DeliveryInput.CarriedCounts).
	carriedCounts bool

	pubConn  *amqp.Connection // for retry and quarantine publishes
	frameMax int              // pubConn's: what a publishing must fit in
	blocking *amqpx.Blocking  // pubConn's resource-alarm state
	maxSize  *sizeLimit       // pubConn's max message size, once the broker named it
	ch       *amqp.Channel
	tag      string
	workers  sync.WaitGroup
	// handlerCtx is cancelled when the drain deadline passes.
	handlerCtx    context.Context
	cancelHandler context.CancelFunc
	// stopping is closed when the stop begins, under settleMu's write
	// lock; cancelled when basic.cancel has returned.
	stopping  chan struct{}
	cancelled chan struct{}
	// settleMu is held (read) while an ack or reject is written, so that
	// none is written between the start of the stop and the cancel-ok.
	settleMu sync.RWMutex
	// pausing is closed at the cancel-ok of the breaker's latest pause
	// (under settleMu's write lock when set; see subscription.pause).
	pausing chan struct{}
	// sub is the basic.consume that the breaker cancels and renews; fed
	// carries its deliveries from the feeder to the workers (receive.go).
	sub *subscription
	fed chan fedDelivery
	// acks coalesces the channel's acks.
	acks *ackWindow
	// unsettled counts the deliveries reported abandoned: left unsettled
	// for the channel close to requeue (the stop logs it once).
	unsettled atomic.Int64
}

func startQueueSession(ctx context.Context, conn, pubConn *amqp.Connection, blocking *amqpx.Blocking, maxSize *sizeLimit, qr *queueRuntime, wq *topology.WorkQueue, carriedCounts bool, lost chan<- error) (*queueSession, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("queue %q: open channel: %w", qr.cfg.Name, err)
	}
	tag := fmt.Sprintf("dlxbridge-%s-%s-%d", qr.deps.host, qr.cfg.Name, time.Now().UnixNano())
	hctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	qs := &queueSession{deps: qr.deps, q: qr, wq: retryRoute(conn, wq, qr.deps.log), isRetry: retryQueues(wq), carriedCounts: carriedCounts,
		pubConn: pubConn, blocking: blocking, maxSize: maxSize, ch: ch, tag: tag, handlerCtx: hctx, cancelHandler: cancel,
		stopping: make(chan struct{}), cancelled: make(chan struct{}), fed: make(chan fedDelivery)}
	// Each retry queue's series exists at 0 from the start, as forQueue's
	// do, so that an increase() alert sees the first retry a missing queue
	// returns.
	for name := range qs.isRetry {
		qr.deps.metrics.retryQueueMissing.WithLabelValues(qr.cfg.Name, name)
	}
	qs.acks = newAckWindow(qs.settle, qr.cfg.Consumer.Prefetch, qr.cfg.Consumer.Concurrency)
	qs.sub = &subscription{qs: qs}
	// A session that starts while the queue's breaker is open consumes
	// once it allows (see feed).
	var deliveries <-chan amqp.Delivery
	if qr.breaker == nil || qr.breaker.b.State() == triage.BreakerClosed {
		if deliveries, err = qs.sub.start(ctx, qr.cfg.Consumer.Prefetch); err != nil {
			cancel()
			return nil, err
		}
	}
	qs.frameMax = pubConn.Config.FrameSize
	if h := qs.deps.cfg.hooks; h != nil && h.frameMax > 0 {
		qs.frameMax = h.frameMax
	}
	watch := amqpx.WatchChannel(ch, qs.stopping)
	go func() {
		if err, ok := <-watch; ok && err != nil {
			report(lost, fmt.Errorf("queue %q: %w", qr.cfg.Name, err))
		}
	}()
	qs.workers.Add(1)
	go func() {
		defer qs.workers.Done()
		qs.feed(ctx, deliveries, lost)
	}()
	for i := 0; i < qr.cfg.Consumer.Concurrency; i++ {
		qs.workers.Add(1)
		go newWorker(qs, &sessionPublisher{s: qs}).work()
	}
	return qs, nil
}

// beginStop cancels the consumer; the workers go on with what was already
// delivered.
func (qs *queueSession) beginStop() {
	qs.settleMu.Lock()
	close(qs.stopping)
	qs.settleMu.Unlock()
	if h := qs.deps.cfg.hooks; h != nil && h.stopping != nil {
		h.stopping(qs.q.cfg.Name)
	}
	// basic.cancel is a synchronous RPC; don't let a stuck broker hold the
	// drain deadline hostage. The channel close ends it either way.
	go func() {
		defer close(qs.cancelled)
		qs.sub.stop()
	}()
}

// report hands a session-ending error to the session without blocking: the
// first one ends the session, later ones have nobody to read them.
func report(lost chan<- error, err error) {
	select {
	case lost <- err:
	default:
	}
}
