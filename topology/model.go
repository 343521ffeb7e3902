// Package topology owns dlxbridge's declarative model of the broker: the
// exchanges, queues and bindings built from config.yaml, and the operations
// that plan, apply and verify them against a real broker.
//
// For each work queue Q bound to exchange E it declares:
//
//	E ──binding keys──▶ Q (quorum, x-delivery-limit, DLX = Q.dead)
//	                    │ broker dead-letters (delivery_limit, expired, maxlen, reject)
//	                    ▼
//	                  Q.dead (fanout) ──▶ Q.quarantine (quorum, never drops)
//
//	bridge retry publish ─▶ Q.retry (direct) ──rk = lane queue──▶ Q.retry.<delay>.l<n>
//	                    (quorum, x-message-ttl; DLX = "" (default exchange), DL routing key = Q)
//	                    ──expired──▶ Q only, never other queues bound to E
//
// Broker-initiated dead letters never enter the retry loop: the broker drops
// a message silently when it dead-letters (for a reason other than rejected)
// into a cycle without a rejection (see shared rabbitmq-facts, "Dead-letter
// cycles"), so they go to the terminal quarantine instead.
package topology

import (
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/dlxbridge/dlxbridge/config"
	"github.com/dlxbridge/dlxbridge/triage"
)

// Argument names the broker understands. amqp091-go has no constants for
// them; these are the only places they are spelled.
const (
	ArgQueueType          = "x-queue-type"
	ArgDeadLetterExchange = "x-dead-letter-exchange"
	ArgDeadLetterRK       = "x-dead-letter-routing-key"
	ArgDeadLetterStrategy = "x-dead-letter-strategy"
	ArgDeliveryLimit      = "x-delivery-limit"
	ArgMessageTTL         = "x-message-ttl"
	ArgOverflow           = "x-overflow"
	ArgMaxLength          = "x-max-length"

	QueueTypeQuorum     = "quorum"
	OverflowReject      = "reject-publish"
	StrategyAtLeastOnce = "at-least-once"
)

// Role says what a queue is for.
type Role string

const (
	RoleWork       Role = "work"
	RoleRetry      Role = "retry"
	RoleQuarantine Role = "quarantine"
)

// ExchangeSpec is one exchange to declare. All of dlxbridge's exchanges are
// durable and not auto-deleted.
type ExchangeSpec struct {
	Name string
	Kind string // direct, topic, fanout, headers
}

// QueueSpec is one quorum queue to declare, with its exact arguments for the
// broker version the topology was built for.
type QueueSpec struct {
	Name string
	Role Role
	// Owner is the work queue this queue serves; for a shared quarantine, the
	// first work queue that names it.
	Owner string
	Args  map[string]any
}

// BindingSpec binds Queue to Exchange with Key.
type BindingSpec struct {
	Exchange string
	Queue    string
	Key      string
}

// RetryLane is one TTL queue of a retry tier. A retry published to the work
// queue's retry exchange with RoutingKey waits between MinDelay and MaxDelay
// (the queue's TTL caps it at MaxDelay; the publisher picks a per-message
// expiration in the lane's range) and then returns to the work queue only.
type RetryLane struct {
	Queue      string
	RoutingKey string
	MinDelay   time.Duration
	MaxDelay   time.Duration
}

// RetryTier is one delay of the retry policy, split into lanes for jitter.
type RetryTier struct {
	Delay time.Duration
	Lanes []RetryLane
}

// WorkQueue is what the runtime needs to know about one work queue's
// surroundings.
type WorkQueue struct {
	Name          string
	Exchange      string
	DeadExchange  string
	RetryExchange string
	Quarantine    string
	// Records and Events are the quarantine's streams (see
	// QuarantineStreams).
	Records, Events string
	Tiers           []RetryTier
}

// Topology is everything dlxbridge declares for a config, in declaration
// order (exchanges, then queues, then bindings).
type Topology struct {
	Broker    BrokerVersion
	Exchanges []ExchangeSpec
	Queues    []QueueSpec
	Bindings  []BindingSpec
	Work      []WorkQueue
}

// WorkQueue returns the work queue named name.
func (t *Topology) WorkQueue(name string) (*WorkQueue, bool) {
	for i := range t.Work {
		if t.Work[i].Name == name {
			return &t.Work[i], true
		}
	}
	return nil, false
}

// Name helpers: the only place derived names are built.

// DeadExchangeName is where the broker dead-letters work queue q's messages.
func DeadExchangeName(q string) string { return q + ".dead" }

// RetryExchangeName is where the bridge publishes q's delayed retries.
func RetryExchangeName(q string) string { return q + ".retry" }

// RetryQueueName names lane of a tier with delay d of work queue q.
func RetryQueueName(q string, d time.Duration, lane int) string {
	return fmt.Sprintf("%s.retry.%s.l%d", q, compactDuration(d), lane)
}

// compactDuration prints 500ms, 5s, 2m, 1h30m: stable and readable in names.
func compactDuration(d time.Duration) string {
	s := d.String()
	s = strings.Replace(s, "m0s", "m", 1)
	s = strings.Replace(s, "h0m", "h", 1)
	return s
}

// LaneBounds is lane i's delay range, triage.LaneBounds widened to whole
// milliseconds (TTL resolution), so every delay triage draws for the lane
// fits its queue's TTL.
func LaneBounds(d time.Duration, jitter float64, lanes, i int) (lo, hi time.Duration) {
	lo, hi = triage.LaneBounds(d, jitter, lanes, i)
	lo = lo.Truncate(time.Millisecond)
	hi = time.Duration(math.Ceil(float64(hi)/float64(time.Millisecond))) * time.Millisecond
	return lo, hi
}

// Build turns a complete config (from config.Load, or after Config.Complete)
// into the topology for a broker version.
func Build(cfg *config.Config, v BrokerVersion) *Topology {
	t := &Topology{Broker: v}
	seenEx := map[string]bool{}
	addEx := func(name, kind string) {
		if !seenEx[name] {
			seenEx[name] = true
			t.Exchanges = append(t.Exchanges, ExchangeSpec{Name: name, Kind: kind})
		}
	}
	seenQ := map[string]bool{}
	addQ := func(q QueueSpec) {
		if !seenQ[q.Name] {
			seenQ[q.Name] = true
			t.Queues = append(t.Queues, q)
		}
	}
	for i := range cfg.Queues {
		qc := &cfg.Queues[i]
		w := WorkQueue{
			Name:          qc.Name,
			Exchange:      qc.Exchange.Name,
			DeadExchange:  DeadExchangeName(qc.Name),
			RetryExchange: RetryExchangeName(qc.Name),
			Quarantine:    qc.Quarantine.Queue,
		}
		addEx(qc.Exchange.Name, qc.Exchange.Type)
		addEx(w.DeadExchange, "fanout")
		addEx(w.RetryExchange, "direct")

		workArgs := map[string]any{
			ArgQueueType:          QueueTypeQuorum,
			ArgDeadLetterExchange: w.DeadExchange,
			ArgDeliveryLimit:      int64(qc.DeliveryLimit),
		}
		if qc.MaxLength > 0 {
			workArgs[ArgMaxLength] = int64(qc.MaxLength)
			workArgs[ArgOverflow] = OverflowReject
		}
		v.addAtLeastOnce(workArgs)
		addQ(QueueSpec{Name: qc.Name, Role: RoleWork, Owner: qc.Name, Args: workArgs})
		for _, key := range qc.Bindings {
			t.Bindings = append(t.Bindings, BindingSpec{Exchange: qc.Exchange.Name, Queue: qc.Name, Key: key})
		}

		jitter := qc.Retry.JitterValue()
		for _, d := range qc.Retry.Tiers {
			tier := RetryTier{Delay: d}
			for lane := 0; lane < qc.Retry.Lanes; lane++ {
				lo, hi := LaneBounds(d, jitter, qc.Retry.Lanes, lane)
				name := RetryQueueName(qc.Name, d, lane)
				args := map[string]any{
					ArgQueueType:          QueueTypeQuorum,
					ArgMessageTTL:         hi.Milliseconds(),
					ArgDeadLetterExchange: "",
					ArgDeadLetterRK:       qc.Name,
				}
				v.addAtLeastOnce(args)
				addQ(QueueSpec{Name: name, Role: RoleRetry, Owner: qc.Name, Args: args})
				t.Bindings = append(t.Bindings, BindingSpec{Exchange: w.RetryExchange, Queue: name, Key: name})
				tier.Lanes = append(tier.Lanes, RetryLane{Queue: name, RoutingKey: name, MinDelay: lo, MaxDelay: hi})
			}
			w.Tiers = append(w.Tiers, tier)
		}

		qArgs := map[string]any{
			ArgQueueType: QueueTypeQuorum,
			// A full quarantine refuses publishes (the bridge then keeps the
			// original unacked) instead of dropping its oldest message.
			ArgOverflow: OverflowReject,
		}
		if v.HasDefaultDeliveryLimit() {
			// 4.x applies a delivery limit of 20 to every quorum queue; the
			// quarantine has no DLX, so an over-limit message would be
			// dropped. -1 disables it (never sent to 3.x, where it
			// dead-letters on the first requeue).
			qArgs[ArgDeliveryLimit] = int64(-1)
		}
		addQ(QueueSpec{Name: w.Quarantine, Role: RoleQuarantine, Owner: qc.Name, Args: qArgs})
		t.Bindings = append(t.Bindings, BindingSpec{Exchange: w.DeadExchange, Queue: w.Quarantine, Key: ""})
		for _, q := range QuarantineStreams(qc) {
			addQ(q)
		}
		w.Records, w.Events = qc.Quarantine.RecordsStream(), qc.Quarantine.EventsStream()
		t.Work = append(t.Work, w)
	}
	return t
}

// addAtLeastOnce turns on at-least-once dead-lettering where the broker has
// it (quorum queues, 3.10+). It requires x-overflow=reject-publish (with
// drop-head it silently falls back to at-most-once) and a DLX.
func (v BrokerVersion) addAtLeastOnce(args map[string]any) {
	if !v.AtLeast(3, 10) {
		return
	}
	args[ArgDeadLetterStrategy] = StrategyAtLeastOnce
	args[ArgOverflow] = OverflowReject
}
