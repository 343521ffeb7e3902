package consumer

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/schemas"
	"github.com/dlxbridge/dlxbridge/triage"
)

// Handler handles one validated message. Return nil on success. Return
// triage.Permanent(err) for a failure no retry can fix, triage.RetryAfter(d,
// err) to suggest a delay; any other error is transient and retried with
// backoff. A panic is recovered and treated as a transient failure (class
// "panic"); a handler that runs past its deadline fails with class "timeout".
type Handler interface {
	Handle(ctx context.Context, m *Message) error
}

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(ctx context.Context, m *Message) error

// Handle calls f.
func (f HandlerFunc) Handle(ctx context.Context, m *Message) error { return f(ctx, m) }

// Message is what a handler sees: a message that passed the schema gate, or,
// on a queue whose gate is in report mode, one that failed it (GateError), or,
// on a queue whose gate is off, one nobody checked.
type Message struct {
	// Queue is the work queue it came from.
	Queue string
	// Type and Version name its schema. After an upcast, Version is the
	// version the handler was registered for and OriginalVersion the one on
	// the wire. With the queue's gate off they are the AMQP type property
	// and the version header, "" when absent.
	Type, Version, OriginalVersion string
	// Body is the payload as received. Treat it as read-only: it is the
	// same slice the runtime republishes on a retry, and Bind and Data read
	// from it. With queues[].retry.immediate_retries set, each call gets a
	// copy of its own, since another call on the same delivery may follow.
	Body []byte
	// Headers are a copy of the AMQP headers as received, nested tables,
	// arrays and byte arrays included: writing into it changes nothing the
	// runtime republishes or another call reads.
	Headers amqp.Table
	// MessageID, CorrelationID: AMQP properties.
	MessageID, CorrelationID string
	// IdempotencyKey is the idempotency-key header, else the message id:
	// at-least-once delivery means a handler may see a message twice.
	IdempotencyKey string
	// Attempt is this attempt's number, 1 on the first delivery.
	Attempt int
	// ReceivedAt is when the runtime received the delivery.
	ReceivedAt time.Time
	// GateError is the schema gate's objection when the queue's gate is in
	// report mode and the message failed it: the handler gets the message
	// anyway, with Type, Version and Data as far as the gate read them
	// (Data fails, wrapping GateError, if the body is not JSON). nil
	// otherwise. Each call gets a copy of its own. Returning it, or an
	// error that wraps it, quarantines the message as a schema failure.
	GateError *schemas.ValidationError

	// raw: the queue's gate is off, nothing was decoded.
	raw bool
	// text is the JSON text the gate validated; nil once an upcaster
	// replaced the data.
	text []byte
	// gated is the gate's message, which decodes text on demand.
	gated schemas.Message
	// data is the value, once decoded or upcast (hasData).
	data    any
	hasData bool
}

// Data returns the validated JSON value, decoded as encoding/json does with
// UseNumber (map[string]any, []any, string, json.Number, bool, nil); for
// envelope-style messages, the envelope's "data" member; after an upcast,
// the upcasters' result. The gate validates the body without decoding it
// into a tree: the first call decodes the text the gate validated, later
// calls return the same value (a handler may change it; Bind does not see
// that). Like the rest of a Message, it is not safe for concurrent use. A
// handler that decodes into a struct calls Bind instead, which is one pass.
// It returns nil with the queue's gate off (Bind decodes Body then), and,
// when a report-mode gate read no data (the body is not JSON), an error
// that wraps GateError.
func (m *Message) Data() (any, error) {
	if m.hasData || m.raw {
		return m.data, nil
	}
	if m.text == nil && m.GateError != nil {
		return nil, fmt.Errorf("data %s: no data: %w", m.Type, m.GateError)
	}
	v, err := m.gated.Data()
	if err != nil {
		return nil, err
	}
	m.data, m.hasData = v, true
	return v, nil
}

// setData replaces the message's data (an upcast's result, which has no
// text).
func (m *Message) setData(v any) {
	m.data, m.hasData, m.text = v, true, nil
}

// Bind decodes the message's data into v (a struct pointer, typically) with
// encoding/json, in one pass over the JSON text the gate validated (Body, or
// an envelope's "data" member); changes a handler makes to Data's value are
// not seen. With the queue's gate off it decodes the whole body as received.
// After an upcast, whose result has no text, it encodes the data and decodes
// that. When a report-mode gate read no data (the body is not JSON), Bind
// returns an error that wraps GateError.
func (m *Message) Bind(v any) error {
	if m.raw {
		return json.Unmarshal(m.Body, v)
	}
	if m.text != nil {
		return json.Unmarshal(m.text, v)
	}
	data, err := m.Data()
	if m.GateError != nil && (err != nil || data == nil) {
		return fmt.Errorf("bind %s: no data: %w", m.Type, m.GateError)
	}
	if err != nil {
		return fmt.Errorf("bind %s: %w", m.Type, err)
	}
	b, err := json.Marshal(data)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

// UpcastFunc turns a message's data of one schema version into the next.
// data is the older version's Message.Data value, decoded as encoding/json does
// with UseNumber (map[string]any, []any, string, json.Number, bool, nil);
// the result must be made of the same kinds of values (a struct is
// refused), and the newer version's schema checks it before any handler
// sees it. An error, or a result that fails that schema, quarantines the
// message as a permanent failure. examples/library has an upcaster.
type UpcastFunc func(data any) (any, error)

type routeKey struct{ typ, version string }

type upcastKey struct {
	typ  string
	from string
}

type upcaster struct {
	to string
	fn UpcastFunc
}

// router picks a handler for (type, version): an exact version handler; else
// a version handler reachable through a chain of upcasters; else a handler for
// the whole type; else the queue's default handler (type "").
type router struct {
	byVersion map[routeKey]Handler
	byType    map[string]Handler
	upcasts   map[upcastKey]upcaster
}

func newRouter() *router {
	return &router{byVersion: map[routeKey]Handler{}, byType: map[string]Handler{}, upcasts: map[upcastKey]upcaster{}}
}

func (r *router) empty() bool { return len(r.byVersion) == 0 && len(r.byType) == 0 }

// errNoHandler is a permanent failure: the config accepts a type no handler
// was registered for.
type errNoHandler struct{ typ, version string }

func (e errNoHandler) Error() string {
	return fmt.Sprintf("no handler registered for %s v%s", e.typ, e.version)
}

// route returns the handler, the version it expects and the upcast chain.
func (r *router) route(typ, version string) (Handler, string, []upcaster, error) {
	if h, ok := r.byVersion[routeKey{typ, version}]; ok {
		return h, version, nil, nil
	}
	// Follow upcasters until a registered version handler is found.
	var chain []upcaster
	seen := map[string]bool{version: true}
	v := version
	for {
		u, ok := r.upcasts[upcastKey{typ, v}]
		if !ok || seen[u.to] {
			break
		}
		seen[u.to] = true
		chain = append(chain, u)
		v = u.to
		if h, ok := r.byVersion[routeKey{typ, v}]; ok {
			return h, v, chain, nil
		}
	}
	if h, ok := r.byType[typ]; ok {
		return h, version, nil, nil
	}
	if h, ok := r.byType[""]; ok {
		return h, version, nil, nil
	}
	return nil, "", nil, triage.Permanent(errNoHandler{typ, version})
}
