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
// A work queue with retry.tier_queues "shared" has no retry exchange or
// lanes of its own: its retries wait in the vhost's shared tiers (names from
// config.SharedTiers, prefix P), and it adds one binding on P.return:
//
//	bridge retry publish, CC [Q] ─▶ P.delay (direct) ──rk = tier──▶ P.delay.<ttl> (quorum, x-message-ttl;
//	                    DLX = P.return, no DL routing key: the message's own keys, the CC included, route it)
//	                    ──expired──▶ P.return (direct, internal) ──key Q──▶ Q only
//	                                 └─ unroutable (Q deleted) ─▶ P.return.unrouted (fanout, internal) ─▶ P.unrouted (a quarantine)
//
// Broker-initiated dead letters never enter the retry loop: the broker drops
// a message silently when it dead-letters (for a reason other than rejected)
// into a cycle without a rejection (see docs/topology.md, "Why it is shaped
// like this"), so they go to the terminal quarantine instead.
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
	// ArgQuorumInitialGroupSize and ArgInitialClusterSize are the replica
	// counts of a new quorum queue and a new stream (config
	// broker.replicas). The broker reads them only at creation and
	// refuses a redeclare that differs, so they are declare-time
	// arguments: see declareTimeArg.
	ArgQuorumInitialGroupSize = "x-quorum-initial-group-size"
	ArgInitialClusterSize     = "x-initial-cluster-size"
	// ArgAlternateExchange is an exchange's (not a queue's) argument:
	// where it sends what it cannot route.
	ArgAlternateExchange = "alternate-exchange"

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
	// exchange, the first work queue that names it; "" for the shared
	// tiers' exchanges, which belong to no work queue.
	Owner string
	// Internal exchanges refuse clients' publishes: only the broker routes
	// into them (dead-lettering, an alternate exchange). The shared tiers'
	// return and unrouted exchanges are, so that no client can send to a
	// work queue through them.
	Internal bool
	// Args are the exchange's arguments (the return exchange's
	// alternate exchange), nil for none.
	Args map[string]any
}

// QueueSpec is one quorum queue to declare, with its exact arguments for the
// broker version the topology was built for.
type QueueSpec struct {
	Name string
	Role Role
	// Owner is the work queue this queue serves; for a shared quarantine, the
	// first work queue that names it; "" for the shared tiers' queues.
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
	// Records and Events are the quarantine's streams.
	Records, Events string
	// Tiers are where retries wait; RetryExchange is where they are
	// published: the queue's own lanes, or the shared tiers.
	Tiers []RetryTier
	// ReturnExchange, set when Tiers are the shared tiers, is where they
	// dead-letter: a retry carries the header CC [Name], and the binding
	// Name → Name there takes it back to this queue only.
	ReturnExchange string
	// PerQueue, set when Tiers are the shared tiers, are the queue's own
	// lanes as retry.tier_queues "per-queue" declares them: an earlier
	// config's, whose messages still come back to the queue until they
	// drain. The runtime counts their expiries as its own lanes', and
	// retries into them while the shared tiers are not declared yet.
	PerQueue *PerQueueLanes
}

// PerQueueLanes are one work queue's own retry exchange and lanes.
type PerQueueLanes struct {
	Exchange string
	Tiers    []RetryTier
}

// Shared reports whether w's retries go through the shared tiers.
func (w *WorkQueue) Shared() bool { return w.ReturnExchange != "" }

// Topology is everything dlxbridge declares for a config, in declaration
// order (exchanges, then queues, then bindings).
type Topology struct {
	Broker BrokerVersion
	// Replicas is config broker.replicas: the replica count every queue
	// and stream is declared with, 0 for the broker's default.
	Replicas  int
	Exchanges []ExchangeSpec
	Queues    []QueueSpec
	Bindings  []BindingSpec
	Work      []WorkQueue
	// Retired are the per-queue retry exchanges, lanes and bindings of the
	// work queues that retry through the shared tiers: never declared, and
	// drained by expiry where an earlier config left them. Plan shows
	// which exist and what they hold; Delete with DeleteOptions.Retired
	// removes each once it is empty. Nil when no queue uses the shared
	// tiers.
	Retired *Topology
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
	// Shared counts the shared tiers' objects, which no work queue owns:
	// declared once per virtual host and prefix, whatever the number of
	// work queues. Its Name is the prefix, its RetryLanes the tier queues
	// (its QuorumQueues add the catch-all). Nil when no queue uses them.
	Shared *WorkQueueTotals `json:"shared,omitempty"`
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
	// leaves, or that the shared return exchange takes a retry back to;
	// else (the work exchange's bindings) to the queue it reaches; the
	// shared tiers' own (delay exchange to tier, unrouted to catch-all) to
	// the shared tiers.
	bindingOwner := map[string]string{}
	returns := map[string]bool{}
	for _, w := range t.Work {
		tot.PerWorkQueue = append(tot.PerWorkQueue, WorkQueueTotals{Name: w.Name})
		bindingOwner[w.DeadExchange] = w.Name
		if w.Shared() {
			returns[w.ReturnExchange] = true
		} else {
			bindingOwner[w.RetryExchange] = w.Name
		}
	}
	for i := range tot.PerWorkQueue {
		per[tot.PerWorkQueue[i].Name] = &tot.PerWorkQueue[i]
	}
	shared := &WorkQueueTotals{}
	sharedExchange := map[string]bool{}
	for _, x := range t.Exchanges {
		if x.Owner == "" {
			sharedExchange[x.Name] = true
		}
	}
	owner := func(name string) *WorkQueueTotals {
		if w, ok := per[name]; ok {
			return w
		}
		return shared
	}
	for _, q := range t.Queues {
		o := owner(q.Owner)
		if q.queueType() == QueueTypeStream {
			tot.Streams++
			o.Streams++
			continue
		}
		tot.QuorumQueues++
		o.QuorumQueues++
		if q.Role == RoleRetry {
			o.RetryLanes++
		}
	}
	for _, x := range t.Exchanges {
		owner(x.Owner).Exchanges++
	}
	for _, b := range t.Bindings {
		o, ok := bindingOwner[b.Exchange]
		switch {
		case ok:
		case returns[b.Exchange], !sharedExchange[b.Exchange]:
			o = b.Queue
		}
		owner(o).Bindings++
	}
	if len(sharedExchange) > 0 {
		shared.Name = t.sharedPrefix()
		tot.Shared = shared
	}
	return tot
}

// sharedPrefix is the shared tiers' prefix, read back from the name of
// their delay exchange (the exchange a shared queue publishes retries to).
func (t *Topology) sharedPrefix() string {
	for _, w := range t.Work {
		if w.Shared() {
			return strings.TrimSuffix(w.RetryExchange, ".delay")
		}
	}
	return ""
}

// laneTTLBounds is lane i's delay range, triage.LaneBounds widened to whole
// milliseconds (TTL resolution), so every delay triage draws for the lane
// fits its queue's TTL.
func laneTTLBounds(d time.Duration, jitter float64, lanes, i int) (lo, hi time.Duration) {
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
// one type), a quarantine, and the shared tiers' objects.
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
	st := cfg.SharedTiers
	for i := range cfg.Queues {
		qc := &cfg.Queues[i]
		w := WorkQueue{Name: qc.Name, Exchange: qc.Exchange.Name, Quarantine: qc.Quarantine.Queue}
		jitter := qc.Retry.JitterValue()
		for _, n := range qc.Names(st) {
			isNew, err := first(qc.Name, n)
			if err != nil {
				return nil, err
			}
			if n.Kind == config.KindExchange && isNew {
				x := ExchangeSpec{Name: n.Name, Kind: n.ExchangeType, Owner: qc.Name}
				if n.Role == config.RoleSharedExchange {
					x.Owner = ""
					x.Internal = n.Name != st.DelayExchange()
					if n.Name == st.ReturnExchange() {
						x.Args = map[string]any{ArgAlternateExchange: st.UnroutedExchange()}
					}
				}
				t.Exchanges = append(t.Exchanges, x)
			}
			switch n.Role {
			case config.RoleDeadExchange:
				w.DeadExchange = n.Name
			case config.RoleRetryExchange:
				w.RetryExchange = n.Name
			case config.RoleSharedExchange:
				switch n.Name {
				case st.DelayExchange():
					w.RetryExchange = n.Name
				case st.ReturnExchange():
					w.ReturnExchange = n.Name
				}
			case config.RoleWorkQueue:
				t.Queues = append(t.Queues, QueueSpec{Name: n.Name, Role: RoleWork, Owner: qc.Name, Args: workArgs(qc, w.DeadExchange, v)})
				for _, key := range qc.Bindings {
					t.Bindings = append(t.Bindings, BindingSpec{Exchange: qc.Exchange.Name, Queue: n.Name, Key: key})
				}
				if w.Shared() {
					t.Bindings = append(t.Bindings, BindingSpec{Exchange: w.ReturnExchange, Queue: n.Name, Key: n.Name})
				}
			case config.RoleRetryLane, config.RoleSharedTier:
				lo, hi := laneTTLBounds(n.Delay, jitter, qc.Retry.Lanes, n.Lane)
				if isNew {
					spec, bind := retryLaneSpec(n, qc, w, hi, v)
					t.Queues = append(t.Queues, spec)
					t.Bindings = append(t.Bindings, bind)
				}
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
				for _, q := range quarantineStreams(qc) {
					if isNew && q.Name == n.Name {
						t.Queues = append(t.Queues, q)
					}
				}
			case config.RoleSharedCatchAll:
				if !isNew {
					continue
				}
				u, _ := cfg.UnroutedQuarantine()
				if n.Name == u.Quarantine.Queue {
					t.Queues = append(t.Queues, QueueSpec{Name: n.Name, Role: RoleQuarantine, Args: quarantineArgs(v)})
					t.Bindings = append(t.Bindings, BindingSpec{Exchange: st.UnroutedExchange(), Queue: n.Name, Key: ""})
					continue
				}
				for _, q := range quarantineStreams(u) {
					if q.Name == n.Name {
						q.Owner = ""
						t.Queues = append(t.Queues, q)
					}
				}
			}
		}
		if w.Shared() {
			own, retired := perQueueLanes(qc, v)
			w.PerQueue = own
			if t.Retired == nil {
				t.Retired = &Topology{Broker: v}
			}
			t.Retired.Exchanges = append(t.Retired.Exchanges, retired.Exchanges...)
			t.Retired.Queues = append(t.Retired.Queues, retired.Queues...)
			t.Retired.Bindings = append(t.Retired.Bindings, retired.Bindings...)
		}
		w.Records, w.Events = qc.Quarantine.RecordsStream(), qc.Quarantine.EventsStream()
		t.Work = append(t.Work, w)
	}
	t.replicate(cfg.Broker.Replicas)
	return t, nil
}

// replicate gives every queue the argument that sets its replica count at
// creation, if n > 0: quorum queues and streams name it differently.
func (t *Topology) replicate(n int) {
	t.Replicas = n
	if n <= 0 {
		return
	}
	for _, q := range t.Queues {
		switch q.queueType() {
		case QueueTypeStream:
			q.Args[ArgInitialClusterSize] = int64(n)
		case QueueTypeQuorum:
			q.Args[ArgQuorumInitialGroupSize] = int64(n)
		}
	}
}

// declareTimeArg reports whether the broker reads a queue argument only
// when it creates the queue: a replica count. Changing it in the config
// changes nothing on an existing queue (its members stay; rabbitmq-queues
// grow and shrink, or rabbitmq-streams add_replica, change them), so plan
// and apply keep such a queue as it is and verify notes the difference
// instead of reporting drift.
func declareTimeArg(arg string) bool {
	return arg == ArgQuorumInitialGroupSize || arg == ArgInitialClusterSize
}

// retryLaneSpec is the queue of a retry lane (n: a per-queue lane of qc, or
// a shared tier) with TTL ttl, and its binding from w's retry exchange.
// A per-queue lane dead-letters through the default exchange with its work
// queue's name as routing key, which reaches that queue only; a shared tier
// dead-letters to the return exchange with no dead-letter routing key, so
// that the message's own routing keys (the tier's name and the CC naming
// its work queue) route it.
func retryLaneSpec(n config.DerivedName, qc *config.Queue, w WorkQueue, ttl time.Duration, v BrokerVersion) (QueueSpec, BindingSpec) {
	args := map[string]any{
		ArgQueueType:  QueueTypeQuorum,
		ArgMessageTTL: ttl.Milliseconds(),
	}
	owner := qc.Name
	if n.Role == config.RoleSharedTier {
		args[ArgDeadLetterExchange] = w.ReturnExchange
		owner = ""
	} else {
		args[ArgDeadLetterExchange] = ""
		args[ArgDeadLetterRK] = qc.Name
	}
	v.addAtLeastOnce(args)
	return QueueSpec{Name: n.Name, Role: RoleRetry, Owner: owner, Args: args},
		BindingSpec{Exchange: w.RetryExchange, Queue: n.Name, Key: n.Name}
}

// perQueueLanes are qc's own retry exchange and lanes, as the runtime sees
// them and as a topology declares them: what retry.tier_queues "per-queue"
// makes, for a queue that now retries through the shared tiers.
func perQueueLanes(qc *config.Queue, v BrokerVersion) (*PerQueueLanes, *Topology) {
	own := &PerQueueLanes{}
	t := &Topology{Broker: v}
	w := WorkQueue{Name: qc.Name}
	for _, n := range qc.PerQueueNames() {
		if n.Role == config.RoleRetryExchange {
			own.Exchange, w.RetryExchange = n.Name, n.Name
			t.Exchanges = append(t.Exchanges, ExchangeSpec{Name: n.Name, Kind: n.ExchangeType, Owner: qc.Name})
			continue
		}
		lo, hi := laneTTLBounds(n.Delay, qc.Retry.JitterValue(), qc.Retry.Lanes, n.Lane)
		spec, bind := retryLaneSpec(n, qc, w, hi, v)
		t.Queues = append(t.Queues, spec)
		t.Bindings = append(t.Bindings, bind)
		if n.Tier == len(own.Tiers) {
			own.Tiers = append(own.Tiers, RetryTier{Delay: n.Delay})
		}
		own.Tiers[n.Tier].Lanes = append(own.Tiers[n.Tier].Lanes, RetryLane{Queue: n.Name, RoutingKey: n.Name, MinDelay: lo, MaxDelay: hi})
	}
	return own, t
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
