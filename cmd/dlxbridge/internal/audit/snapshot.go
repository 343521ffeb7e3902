// Package audit checks the dead-letter safety of every queue on a broker,
// not only dlxbridge's own: `dlxbridge audit`. Collect reads a Snapshot
// through the management API (read-only; the monitoring tag is enough),
// and Run applies the rules, pure functions over the snapshot, so that they
// can be table-tested and fuzzed without a broker. docs/audit.md lists the
// rules, the JSON report and the exit codes.
//
// It lives under cmd/dlxbridge/internal: the command line is its only user,
// and its findings, severities and rule ids are an output format
// (documented, versioned by Report.Schema), not a Go API.
package audit

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/dlxbridge/dlxbridge/internal/mgmtapi"
	"github.com/dlxbridge/dlxbridge/topology"
)

// Snapshot is what the rules look at: one broker's vhosts as the
// management API showed them, and optionally two reads of its dead-letter
// counters.
type Snapshot struct {
	Version topology.BrokerVersion
	Cluster string
	Vhosts  []*Vhost
	// Drops holds the two reads of the Prometheus counters of dead
	// letters the broker dropped; nil when they were not read.
	Drops *DropSample
}

// Vhost is one virtual host's objects.
type Vhost struct {
	Name      string
	Queues    []Queue
	Exchanges []Exchange
	Bindings  []Binding
	// Policies holds policies and operator policies (Operator set).
	Policies  []Policy
	Consumers []Consumer
	// Read says which listings were read in full. A rule that needs one
	// that was not skips this vhost (the report says so).
	Read Listings
}

// Listings names the management API's listings of a vhost.
type Listings struct {
	Queues, Exchanges, Bindings, Policies, Consumers bool
}

// Queue is one queue as GET /api/queues/{vhost} lists it.
type Queue struct {
	Name      string
	Type      string // classic, quorum, stream
	Durable   bool
	Arguments map[string]any
	// Policy and OperatorPolicy name the policies in effect and
	// EffectivePolicy is their merged definition, which the broker reports
	// with its statistics, a few seconds after a queue is declared;
	// PolicyReported is false until then (the rules then match the vhost's
	// policies themselves).
	Policy, OperatorPolicy string
	EffectivePolicy        map[string]any
	PolicyReported         bool
	Consumers              int
	Messages, Ready        int64
	// DeliveryLimit is the broker's own figure for a quorum queue, policy
	// and argument applied: a number or "unlimited" (4.3+), nil before.
	DeliveryLimit any
}

// Exchange is one exchange.
type Exchange struct {
	Name      string
	Type      string
	Internal  bool
	Arguments map[string]any
}

// Binding is one binding; the default exchange's implicit ones included.
type Binding struct {
	Source          string
	Destination     string
	DestinationType string // queue or exchange
	RoutingKey      string
}

// Policy is a policy or an operator policy.
type Policy = mgmtapi.Policy

// Consumer is one consumer as GET /api/consumers/{vhost} lists it.
type Consumer struct {
	Queue       string
	Tag         string
	Prefetch    int
	AckRequired bool
	// Channel names the consumer's channel, Connection its connection
	// (client-chosen text: hostile, escape it before printing).
	Channel, Connection string
	// GlobalPrefetch is the channel's prefetch shared by its consumers
	// (basic.qos global), read only for consumers that have none of their
	// own; -1 when not read.
	GlobalPrefetch int
}

// DropSample is two reads of the counters of dead letters the broker
// dropped (strategy "disabled": no dead-letter exchange), by reason and
// queue type.
type DropSample struct {
	IntervalSeconds float64
	Before, After   map[DropSeries]float64
}

// DropSeries is one counter: its reason (expired, rejected, maxlen,
// delivery_limit) and queue type label.
type DropSeries struct {
	Reason, QueueType string
}

// decode reads JSON that the management API sends into the shapes above.
// It is lenient where the broker is inconsistent: an empty table may come
// as [] (channel_details on 3.10.8), a name may be null.
type obj map[string]json.RawMessage

func decodeObj(raw json.RawMessage) (obj, error) {
	var o obj
	if err := json.Unmarshal(raw, &o); err != nil {
		return nil, err
	}
	return o, nil
}

func (o obj) has(k string) bool {
	v, ok := o[k]
	return ok && !bytes.Equal(bytes.TrimSpace(v), []byte("null"))
}

func (o obj) str(k string) string {
	var s string
	_ = json.Unmarshal(o[k], &s)
	return s
}

func (o obj) boolean(k string) bool {
	var b bool
	_ = json.Unmarshal(o[k], &b)
	return b
}

func (o obj) int(k string) int64 {
	var n json.Number
	if err := json.Unmarshal(o[k], &n); err != nil {
		return 0
	}
	i, err := n.Int64()
	if err != nil {
		f, _ := n.Float64()
		return int64(f)
	}
	return i
}

// table reads a JSON object with numbers kept exact; an empty list or
// anything else that is not an object is an empty table.
func (o obj) table(k string) map[string]any {
	return table(o[k])
}

func table(raw json.RawMessage) map[string]any {
	m := map[string]any{}
	if len(raw) == 0 {
		return m
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return m
	}
	if t, ok := v.(map[string]any); ok {
		return t
	}
	return m
}

func (o obj) any(k string) any {
	raw, ok := o[k]
	if !ok {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil
	}
	return v
}

func decodeQueue(raw json.RawMessage) (Queue, error) {
	o, err := decodeObj(raw)
	if err != nil {
		return Queue{}, fmt.Errorf("a queue: %w", err)
	}
	q := Queue{
		Name:            o.str("name"),
		Type:            o.str("type"),
		Durable:         o.boolean("durable"),
		Arguments:       o.table("arguments"),
		Policy:          o.str("policy"),
		OperatorPolicy:  o.str("operator_policy"),
		EffectivePolicy: o.table("effective_policy_definition"),
		PolicyReported:  o.has("effective_policy_definition"),
		Consumers:       int(o.int("consumers")),
		Messages:        o.int("messages"),
		Ready:           o.int("messages_ready"),
		DeliveryLimit:   o.any("delivery_limit"),
	}
	if q.Type == "" {
		q.Type = "classic"
	}
	return q, nil
}

func decodeExchange(raw json.RawMessage) (Exchange, error) {
	o, err := decodeObj(raw)
	if err != nil {
		return Exchange{}, fmt.Errorf("an exchange: %w", err)
	}
	return Exchange{Name: o.str("name"), Type: o.str("type"), Internal: o.boolean("internal"), Arguments: o.table("arguments")}, nil
}

func decodeBinding(raw json.RawMessage) (Binding, error) {
	o, err := decodeObj(raw)
	if err != nil {
		return Binding{}, fmt.Errorf("a binding: %w", err)
	}
	return Binding{Source: o.str("source"), Destination: o.str("destination"), DestinationType: o.str("destination_type"), RoutingKey: o.str("routing_key")}, nil
}

func decodePolicy(raw json.RawMessage, operator bool) (Policy, error) {
	o, err := decodeObj(raw)
	if err != nil {
		return Policy{}, fmt.Errorf("a policy: %w", err)
	}
	return Policy{Name: o.str("name"), Pattern: o.str("pattern"), ApplyTo: o.str("apply-to"), Priority: int(o.int("priority")),
		Definition: o.table("definition"), Operator: operator}, nil
}

func decodeConsumer(raw json.RawMessage) (Consumer, error) {
	o, err := decodeObj(raw)
	if err != nil {
		return Consumer{}, fmt.Errorf("a consumer: %w", err)
	}
	c := Consumer{Tag: o.str("consumer_tag"), Prefetch: int(o.int("prefetch_count")), AckRequired: o.boolean("ack_required"), GlobalPrefetch: -1}
	if q, err := decodeObj(o["queue"]); err == nil {
		c.Queue = q.str("name")
	}
	if ch, err := decodeObj(o["channel_details"]); err == nil { // [] on 3.10.8 when unknown
		c.Channel, c.Connection = ch.str("name"), ch.str("connection_name")
	}
	return c, nil
}
