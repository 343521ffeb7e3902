package config

import (
	"fmt"
	"strings"
	"time"
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
)

// shared reports whether several queues may name the object on purpose:
// queues bound to one exchange, or parking in one quarantine.
func (r Role) shared() bool {
	return r == RoleWorkExchange || r == RoleQuarantine || r == RoleRecordsStream || r == RoleEventsStream
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
// declaration order: the work exchange, Q.dead, Q.retry, the work queue,
// each retry lane tier by tier, and the quarantine. It is the only place
// these names are derived; validation and topology.Build both use it.
func (q *Queue) Names() []DerivedName {
	ns := []DerivedName{
		{Name: q.Exchange.Name, Kind: KindExchange, Role: RoleWorkExchange, Field: "exchange.name", ExchangeType: q.Exchange.Type},
		{Name: DeadExchangeName(q.Name), Kind: KindExchange, Role: RoleDeadExchange, Field: "name", ExchangeType: "fanout"},
		{Name: RetryExchangeName(q.Name), Kind: KindExchange, Role: RoleRetryExchange, Field: "name", ExchangeType: "direct"},
		{Name: q.Name, Kind: KindQueue, Role: RoleWorkQueue, Field: "name"},
	}
	for i, d := range q.Retry.Tiers {
		for lane := 0; lane < q.Retry.Lanes; lane++ {
			ns = append(ns, DerivedName{Name: RetryQueueName(q.Name, d, lane), Kind: KindQueue, Role: RoleRetryLane,
				Field: fmt.Sprintf("retry.tiers[%d]", i), Tier: i, Lane: lane, Delay: d})
		}
	}
	return append(ns,
		DerivedName{Name: q.Quarantine.Queue, Kind: KindQueue, Role: RoleQuarantine, Field: "quarantine.queue"},
		DerivedName{Name: q.Quarantine.RecordsStream(), Kind: KindQueue, Role: RoleRecordsStream, Field: "quarantine.queue"},
		DerivedName{Name: q.Quarantine.EventsStream(), Kind: KindQueue, Role: RoleEventsStream, Field: "quarantine.queue"})
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
