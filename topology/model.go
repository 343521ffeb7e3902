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
// into a cycle without a rejection (see docs/topology.md, "Why it is shaped
// like this"), so they go to the terminal quarantine instead.
package topology

import (
	"fmt"
	"math"
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
	// Owner is the work queue that declares it; for a shared work
	// exchange, the first work queue that names it.
	Owner string
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

// Totals counts what a topology declares, in all and per work queue: the
// capacity it costs on the broker (each quorum queue holds file handles and
// memory; see docs/topology.md, "Capacity").
type Totals struct {
	WorkQueues   int `json:"work_queues"`
	QuorumQueues int `json:"quorum_queues"`
	// Streams are the quarantines' records and events streams.
	Streams   int `json:"streams"`
	Exchanges int `json:"exchanges"`
	Bindings  int `json:"bindings"`
	// PerWorkQueue counts what each work queue declares. A shared
	// quarantine or work exchange counts for the first queue naming it.
	PerWorkQueue []WorkQueueTotals `json:"per_work_queue"`
}

// WorkQueueTotals counts what one work queue declares.
type WorkQueueTotals struct {
	Name string `json:"name"`
	// QuorumQueues includes the work queue, its retry lanes and its
	// quarantine.
	QuorumQueues int `json:"quorum_queues"`
	RetryLanes   int `json:"retry_lanes"`
	// Streams are its quarantine's records and events streams.
	Streams   int `json:"streams"`
	Exchanges int `json:"exchanges"`
	Bindings  int `json:"bindings"`
}

// Totals counts t's objects.
func (t *Topology) Totals() Totals {
	tot := Totals{WorkQueues: len(t.Work), Exchanges: len(t.Exchanges), Bindings: len(t.Bindings)}
	per := map[string]*WorkQueueTotals{}
	// A binding belongs to the work queue whose dead or retry exchange it
	// leaves, else (the work exchange's bindings) to the queue it reaches.
	bindingOwner := map[string]string{}
	for _, w := range t.Work {
		tot.PerWorkQueue = append(tot.PerWorkQueue, WorkQueueTotals{Name: w.Name})
		bindingOwner[w.DeadExchange] = w.Name
		bindingOwner[w.RetryExchange] = w.Name
	}
	for i := range tot.PerWorkQueue {
		per[tot.PerWorkQueue[i].Name] = &tot.PerWorkQueue[i]
	}
	for _, q := range t.Queues {
		if q.queueType() == QueueTypeStream {
			tot.Streams++
			per[q.Owner].Streams++
			continue
		}
		tot.QuorumQueues++
		per[q.Owner].QuorumQueues++
		if q.Role == RoleRetry {
			per[q.Owner].RetryLanes++
		}
	}
	for _, x := range t.Exchanges {
		per[x.Owner].Exchanges++
	}
	for _, b := range t.Bindings {
		owner, ok := bindingOwner[b.Exchange]
		if !ok {
			owner = b.Queue
		}
		per[owner].Bindings++
	}
	return tot
}

// LaneTTLBounds is lane i's delay range, triage.LaneBounds widened to whole
// milliseconds (TTL resolution), so every delay triage draws for the lane
// fits its queue's TTL.
func LaneTTLBounds(d time.Duration, jitter float64, lanes, i int) (lo, hi time.Duration) {
	lo, hi = triage.LaneBounds(d, jitter, lanes, i)
	lo = lo.Truncate(time.Millisecond)
	if r := hi % time.Millisecond; r > 0 && hi <= math.MaxInt64-time.Millisecond {
		// Rounding up to the next millisecond; at the Duration's top the
		// bound stays as it is instead of wrapping.
		hi += time.Millisecond - r
	}
	return lo, hi
}

// Build turns a complete config (from config.Load, or after Config.Complete)
// into the topology for a broker version. Every object comes from
// config.Queue.Names. Two objects with one name are an error, never "keep the
// first": the only names several queues may share are a work exchange (with
// one type) and a quarantine.
func Build(cfg *config.Config, v BrokerVersion) (*Topology, error) {
	t := &Topology{Broker: v}
	type owned struct {
		n     config.DerivedName
		owner string
	}
	seen := map[string]owned{} // kind + " " + name
	// first reports whether n is new, and fails when it collides.
	first := func(owner string, n config.DerivedName) (bool, error) {
		key := n.Kind + " " + n.Name
		prev, ok := seen[key]
		switch {
		case !ok:
			seen[key] = owned{n, owner}
			return true, nil
		case n.SharableWith(prev.n):
			return false, nil
		default:
			return false, fmt.Errorf("topology: %s %q would be declared twice: as the %s of queue %q and as the %s of queue %q",
				n.Kind, n.Name, prev.n.Describe(), prev.owner, n.Describe(), owner)
		}
	}
	for i := range cfg.Queues {
		qc := &cfg.Queues[i]
		w := WorkQueue{Name: qc.Name, Exchange: qc.Exchange.Name, Quarantine: qc.Quarantine.Queue}
		jitter := qc.Retry.JitterValue()
		for _, n := range qc.Names() {
			isNew, err := first(qc.Name, n)
			if err != nil {
				return nil, err
			}
			if n.Kind == config.KindExchange && isNew {
				t.Exchanges = append(t.Exchanges, ExchangeSpec{Name: n.Name, Kind: n.ExchangeType, Owner: qc.Name})
			}
			switch n.Role {
			case config.RoleDeadExchange:
				w.DeadExchange = n.Name
			case config.RoleRetryExchange:
				w.RetryExchange = n.Name
			case config.RoleWorkQueue:
				t.Queues = append(t.Queues, QueueSpec{Name: n.Name, Role: RoleWork, Owner: qc.Name, Args: workArgs(qc, w.DeadExchange, v)})
				for _, key := range qc.Bindings {
					t.Bindings = append(t.Bindings, BindingSpec{Exchange: qc.Exchange.Name, Queue: n.Name, Key: key})
				}
			case config.RoleRetryLane:
				lo, hi := LaneTTLBounds(n.Delay, jitter, qc.Retry.Lanes, n.Lane)
				args := map[string]any{
					ArgQueueType:          QueueTypeQuorum,
					ArgMessageTTL:         hi.Milliseconds(),
					ArgDeadLetterExchange: "",
					ArgDeadLetterRK:       qc.Name,
				}
				v.addAtLeastOnce(args)
				t.Queues = append(t.Queues, QueueSpec{Name: n.Name, Role: RoleRetry, Owner: qc.Name, Args: args})
				t.Bindings = append(t.Bindings, BindingSpec{Exchange: w.RetryExchange, Queue: n.Name, Key: n.Name})
				if n.Tier == len(w.Tiers) {
					w.Tiers = append(w.Tiers, RetryTier{Delay: n.Delay})
				}
				w.Tiers[n.Tier].Lanes = append(w.Tiers[n.Tier].Lanes, RetryLane{Queue: n.Name, RoutingKey: n.Name, MinDelay: lo, MaxDelay: hi})
			case config.RoleQuarantine:
				if isNew {
					t.Queues = append(t.Queues, QueueSpec{Name: n.Name, Role: RoleQuarantine, Owner: qc.Name, Args: quarantineArgs(v)})
				}
				t.Bindings = append(t.Bindings, BindingSpec{Exchange: w.DeadExchange, Queue: n.Name, Key: ""})
			case config.RoleRecordsStream, config.RoleEventsStream:
				for _, q := range QuarantineStreams(qc) {
					if isNew && q.Name == n.Name {
						t.Queues = append(t.Queues, q)
					}
				}
			}
		}
		w.Records, w.Events = qc.Quarantine.RecordsStream(), qc.Quarantine.EventsStream()
		t.Work = append(t.Work, w)
	}
	return t, nil
}

func workArgs(qc *config.Queue, deadExchange string, v BrokerVersion) map[string]any {
	args := map[string]any{
		ArgQueueType:          QueueTypeQuorum,
		ArgDeadLetterExchange: deadExchange,
		ArgDeliveryLimit:      int64(qc.DeliveryLimit),
	}
	if qc.MaxLength > 0 {
		args[ArgMaxLength] = int64(qc.MaxLength)
		args[ArgOverflow] = OverflowReject
	}
	v.addAtLeastOnce(args)
	return args
}

func quarantineArgs(v BrokerVersion) map[string]any {
	args := map[string]any{
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
		args[ArgDeliveryLimit] = int64(-1)
	}
	return args
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
