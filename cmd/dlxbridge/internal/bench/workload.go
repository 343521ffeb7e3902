package bench

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/dlxbridge/dlxbridge/config"
)

// The message type every bench message has: the registry's orders.created
// v2, so the gate runs the schema a real service would.
const (
	MessageType    = "orders.created"
	MessageVersion = "2"
	RoutingKey     = "order.created"
)

// Kind is what a handler does with a message, and where it must end up.
type Kind int

const (
	// OK: the handler succeeds on the first attempt.
	OK Kind = iota
	// TransientOnce: the first attempt fails with a plain error (a retry
	// through a TTL lane), the second succeeds.
	TransientOnce
	// AlwaysFailing: every attempt fails with a plain error, until the
	// retry budget is spent and the message is quarantined.
	AlwaysFailing
	// Invalid: the body breaks the schema (a line item's quantity is 0);
	// the gate quarantines it and no handler sees it.
	Invalid
)

func (k Kind) String() string {
	return [...]string{"ok", "transient-once", "always-failing", "schema-invalid"}[k]
}

// Quarantined says whether a message of this kind must end in the
// quarantine (else it must be handled successfully).
func (k Kind) Quarantined() bool { return k == AlwaysFailing || k == Invalid }

// Scenarios.
const (
	Clean = "clean" // every message is valid and succeeds at once
	Storm = "storm" // 10% schema-invalid, 20% transient once, 1% always failing
)

// KindOf is message i's kind in scenario. In a storm the kinds are spread
// evenly (a permutation of each block of 100 ids), not in bursts.
func KindOf(scenario string, i int) Kind {
	if scenario != Storm {
		return OK
	}
	switch r := (i * 37) % 100; {
	case r < 10:
		return Invalid
	case r < 30:
		return TransientOnce
	case r == 30:
		return AlwaysFailing
	default:
		return OK
	}
}

// ID is message i's message id; Index parses it back (-1 if it is not one).
func ID(i int) string { return fmt.Sprintf("m-%07d", i) }

// Index is the inverse of ID.
func Index(id string) int {
	if !strings.HasPrefix(id, "m-") {
		return -1
	}
	i, err := strconv.Atoi(id[2:])
	if err != nil || i < 0 {
		return -1
	}
	return i
}

// MinSize and MaxSize bound Body's size.
const (
	MinSize = 320
	MaxSize = 100 << 10
)

// Body is message i's JSON body, an orders.created v2 order of exactly size
// bytes (within [MinSize, MaxSize]): padding goes into line item names. An
// Invalid message differs only in one line item's quantity (0, below the
// schema's minimum).
func Body(i, size int, kind Kind) []byte {
	size = min(max(size, MinSize), MaxSize)
	qty := 1
	if kind == Invalid {
		qty = 0
	}
	first := fmt.Sprintf(`{"orderId":"00000000-0000-4000-8000-%012d","createdAt":"2026-01-02T03:04:05Z",`+
		`"customer":{"id":"c-%d","email":"c%d@example.com","name":"Customer %d"},"channel":"web",`+
		`"total":{"amount":"12.50","currency":"EUR"},"lineItems":[{"sku":"SKU-%04d","quantity":%d,"name":"`,
		i, i, i, i, i%10000, qty)
	const closeFirst = `"}`
	const tail = `]}`
	const padOpen = `,{"sku":"PAD-0001","quantity":1,"name":"`
	const padClose = `"}`
	overhead := len(padOpen) + len(padClose)
	const maxName = 200 // the schema's maxLength for a line item name
	need := size - len(first) - len(closeFirst) - len(tail)
	// The first item's name takes what whole padding items cannot.
	firstName := 0
	var pads []int
	for need > 0 {
		switch {
		case need >= overhead+maxName:
			pads = append(pads, maxName)
			need -= overhead + maxName
		case need >= overhead:
			pads = append(pads, need-overhead)
			need = 0
		default:
			firstName, need = need, 0
		}
	}
	var b strings.Builder
	b.Grow(size)
	b.WriteString(first)
	b.WriteString(strings.Repeat("x", firstName))
	b.WriteString(closeFirst)
	for _, n := range pads {
		b.WriteString(padOpen)
		b.WriteString(strings.Repeat("x", n))
		b.WriteString(padClose)
	}
	b.WriteString(tail)
	return []byte(b.String())
}

// Order is what handlers decode a body into: the fields of orders.created v2.
type Order struct {
	OrderID   string `json:"orderId"`
	CreatedAt string `json:"createdAt"`
	Customer  struct {
		ID    string `json:"id"`
		Email string `json:"email"`
		Name  string `json:"name"`
	} `json:"customer"`
	Channel   string `json:"channel"`
	Total     Money  `json:"total"`
	LineItems []struct {
		SKU       string `json:"sku"`
		Name      string `json:"name"`
		Quantity  int    `json:"quantity"`
		UnitPrice *Money `json:"unitPrice"`
	} `json:"lineItems"`
	Note string `json:"note"`
}

// Money is the registry's money definition.
type Money struct {
	Amount   string `json:"amount"`
	Currency string `json:"currency"`
}

// defaultTiers is the retry policy of the generated config: short tiers, so
// a storm settles in about a second after its last first attempt. The last
// always-failing message needs their sum after its first attempt: a floor
// under a storm's duration that does not shrink with the count.
var defaultTiers = []time.Duration{100 * time.Millisecond, 200 * time.Millisecond}

// maxAttempts: the first attempt and one retry per tier.
const maxAttempts = 3

// Config is the one-queue configuration of a bench or fault-test run whose
// object names start with prefix: work queue <prefix>.work, bound to topic
// exchange <prefix>.ex with RoutingKey, accepting orders.created v2, with
// short retry tiers (defaultTiers), no jitter and 3 attempts. Prefetch and
// concurrency 0 take the config defaults.
func Config(prefix string, prefetch, concurrency int) (*config.Config, error) {
	return ConfigTiers(prefix, prefetch, concurrency, defaultTiers)
}

// ConfigTiers is Config with retry tiers of the caller's: two of them, one
// per retry of the 3 attempts.
func ConfigTiers(prefix string, prefetch, concurrency int, tiers []time.Duration) (*config.Config, error) {
	noJitter := 0.0
	noBudget := time.Duration(0)
	cfg := &config.Config{
		Broker: config.Broker{ConnectionName: prefix},
		Queues: []config.Queue{{
			Name:     prefix + ".work",
			Exchange: config.Exchange{Name: prefix + ".ex", Type: "topic"},
			Bindings: []string{RoutingKey},
			Consumer: config.Consumer{Prefetch: prefetch, Concurrency: concurrency},
			Retry: config.Retry{
				Tiers:       tiers,
				Jitter:      &noJitter,
				Lanes:       1,
				MaxAttempts: maxAttempts,
				MaxElapsed:  &noBudget,
			},
			Quarantine: config.Quarantine{Queue: prefix + ".quarantine"},
			Accepts:    []config.Accept{{Type: MessageType, Versions: []string{MessageVersion}}},
		}},
	}
	if err := cfg.Complete(); err != nil {
		return nil, err
	}
	return cfg, nil
}
