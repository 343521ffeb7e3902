package config

import (
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/dlxbridge/dlxbridge/triage"
)

// Kinds of broker objects. Queues and exchanges are separate namespaces on
// the broker.
const (
	KindQueue    = "queue"
	KindExchange = "exchange"
)

// Role says what a derived name is for.
type Role string

const (
	RoleWorkExchange  Role = "work exchange"
	RoleDeadExchange  Role = "dead-letter exchange"
	RoleRetryExchange Role = "retry exchange"
	RoleWorkQueue     Role = "work queue"
	RoleRetryLane     Role = "retry lane"
	RoleQuarantine    Role = "quarantine"
	RoleRecordsStream Role = "quarantine records stream"
	RoleEventsStream  Role = "quarantine events stream"
	// RoleSharedTier is a shared delay tier queue; RoleSharedExchange the
	// shared delay, return and unrouted exchanges; RoleSharedCatchAll the
	// catch-all quarantine behind the unrouted exchange and its streams.
	// Every queue that retries through the shared tiers names them.
	RoleSharedTier     Role = "shared delay tier"
	RoleSharedExchange Role = "shared tiers exchange"
	RoleSharedCatchAll Role = "shared tiers catch-all"
)

// shared reports whether several queues may name the object on purpose:
// queues bound to one exchange, or parking in one quarantine.
func (r Role) shared() bool {
	switch r {
	case RoleWorkExchange, RoleQuarantine, RoleRecordsStream, RoleEventsStream,
		RoleSharedTier, RoleSharedExchange, RoleSharedCatchAll:
		return true
	}
	return false
}

// sharedTiers reports whether r is one of the shared tiers' objects.
func (r Role) sharedTiers() bool {
	return r == RoleSharedTier || r == RoleSharedExchange || r == RoleSharedCatchAll
}

// DerivedName is one broker object that a queue's config makes dlxbridge
// declare.
type DerivedName struct {
	Name string
	Kind string // KindQueue or KindExchange
	Role Role
	// Field is the config field the name comes from, relative to the
	// queue, e.g. "name", "retry.tiers[1]" or "quarantine.queue".
	Field string
	// ExchangeType is the type an exchange is declared with.
	ExchangeType string
	// Tier, Lane and Delay place a retry lane (Tier indexes retry.tiers).
	Tier, Lane int
	Delay      time.Duration
}

// Names returns every exchange and queue q makes dlxbridge declare, in
// declaration order: the work exchange, Q.dead, Q.retry (or, retrying
// through the shared tiers, the shared delay, return and unrouted
// exchanges), the work queue, each retry lane tier by tier (or the shared
// tier queue each lane waits in), the quarantine and its streams, and, with
// shared tiers, their catch-all quarantine and its streams. It is the only
// place these names are derived; validation and topology.Build both use
// it.
func (q *Queue) Names(shared SharedTiers) []DerivedName {
	ns := []DerivedName{
		{Name: q.Exchange.Name, Kind: KindExchange, Role: RoleWorkExchange, Field: "exchange.name", ExchangeType: q.Exchange.Type},
		{Name: DeadExchangeName(q.Name), Kind: KindExchange, Role: RoleDeadExchange, Field: "name", ExchangeType: "fanout"},
	}
	if q.Retry.Shared() {
		const f = "retry.tier_queues"
		ns = append(ns,
			DerivedName{Name: shared.DelayExchange(), Kind: KindExchange, Role: RoleSharedExchange, Field: f, ExchangeType: "direct"},
			DerivedName{Name: shared.ReturnExchange(), Kind: KindExchange, Role: RoleSharedExchange, Field: f, ExchangeType: "direct"},
			DerivedName{Name: shared.UnroutedExchange(), Kind: KindExchange, Role: RoleSharedExchange, Field: f, ExchangeType: "fanout"})
	} else {
		ns = append(ns, DerivedName{Name: RetryExchangeName(q.Name), Kind: KindExchange, Role: RoleRetryExchange, Field: "name", ExchangeType: "direct"})
	}
	ns = append(ns, DerivedName{Name: q.Name, Kind: KindQueue, Role: RoleWorkQueue, Field: "name"})
	for i, d := range q.Retry.Tiers {
		for lane := 0; lane < q.Retry.Lanes; lane++ {
			n := DerivedName{Name: RetryQueueName(q.Name, d, lane), Kind: KindQueue, Role: RoleRetryLane,
				Field: fmt.Sprintf("retry.tiers[%d]", i), Tier: i, Lane: lane, Delay: d}
			if q.Retry.Shared() {
				n.Name, n.Role = shared.tierQueue(q.laneTTL(d, lane)), RoleSharedTier
			}
			ns = append(ns, n)
		}
	}
	ns = append(ns,
		DerivedName{Name: q.Quarantine.Queue, Kind: KindQueue, Role: RoleQuarantine, Field: "quarantine.queue"},
		DerivedName{Name: q.Quarantine.RecordsStream(), Kind: KindQueue, Role: RoleRecordsStream, Field: "quarantine.queue"},
		DerivedName{Name: q.Quarantine.EventsStream(), Kind: KindQueue, Role: RoleEventsStream, Field: "quarantine.queue"})
	if q.Retry.Shared() {
		const f = "retry.tier_queues"
		u := Quarantine{Queue: shared.Unrouted()}
		ns = append(ns,
			DerivedName{Name: u.Queue, Kind: KindQueue, Role: RoleSharedCatchAll, Field: f},
			DerivedName{Name: u.RecordsStream(), Kind: KindQueue, Role: RoleSharedCatchAll, Field: f},
			DerivedName{Name: u.EventsStream(), Kind: KindQueue, Role: RoleSharedCatchAll, Field: f})
	}
	return ns
}

// PerQueueNames are the retry exchange and lanes q would have with
// retry.tier_queues "per-queue", in Names' order: for a queue that retries
// through the shared tiers, what an earlier config may have declared, whose
// messages still come back to q until they drain.
func (q *Queue) PerQueueNames() []DerivedName {
	own := *q
	own.Retry.TierQueues = TierQueuesPerQueue
	var ns []DerivedName
	for _, n := range own.Names(SharedTiers{}) {
		if n.Role == RoleRetryExchange || n.Role == RoleRetryLane {
			ns = append(ns, n)
		}
	}
	return ns
}

// laneTTL is the queue TTL of lane of the tier with delay d: the lane's
// longest delay, in whole milliseconds (triage.LaneBounds rounded up).
func (q *Queue) laneTTL(d time.Duration, lane int) time.Duration {
	_, hi := triage.LaneBounds(d, q.Retry.JitterValue(), q.Retry.Lanes, lane)
	if r := hi % time.Millisecond; r > 0 && hi <= math.MaxInt64-time.Millisecond {
		hi += time.Millisecond - r
	}
	return hi
}

// SharableWith reports whether n and o may be one object on the broker: the
// same exchange bound by several queues (with one type), or one quarantine
// for several queues. Any other two objects with one name collide.
func (n DerivedName) SharableWith(o DerivedName) bool {
	return n.Name == o.Name && n.Kind == o.Kind && n.Role == o.Role && n.Role.shared() && n.ExchangeType == o.ExchangeType
}

// Describe says what the object is, e.g. "retry lane 0 of 1s" or "topic
// work exchange".
func (n DerivedName) Describe() string {
	switch {
	case n.Role == RoleRetryLane:
		return fmt.Sprintf("%s %d of %s", n.Role, n.Lane, n.Delay)
	case n.Role == RoleSharedTier:
		return fmt.Sprintf("%s (lane %d of %s)", n.Role, n.Lane, n.Delay)
	case n.Kind == KindExchange:
		return n.ExchangeType + " " + string(n.Role)
	default:
		return string(n.Role)
	}
}

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

// nameClaims finds names two objects would share. A work exchange lives in
// the broker's exchange namespace only (an exchange may be named like a
// queue, e.g. "orders" for both). Every other derived name must be unique
// across queues and exchanges alike, so no queue, lane, quarantine or
// dead/retry exchange reads like another's.
type nameClaims map[claimKey]claim

type claimKey struct{ space, name string }

type claim struct {
	path string // e.g. queues[0].retry.tiers[1]
	n    DerivedName
}

// add records n for the field at path and returns the earlier claim it
// collides with, if any.
func (c nameClaims) add(path string, n DerivedName) (claim, bool) {
	spaces := []string{"", n.Kind}
	if n.Role == RoleWorkExchange {
		spaces = []string{n.Kind}
	}
	for _, s := range spaces {
		k := claimKey{s, n.Name}
		if prev, ok := c[k]; ok {
			if !n.SharableWith(prev.n) {
				return prev, true
			}
			continue
		}
		c[k] = claim{path, n}
	}
	return claim{}, false
}
