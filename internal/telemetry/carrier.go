// Package telemetry carries W3C trace context through AMQP headers, holds
// the OpenTelemetry messaging attribute names dlxbridge uses, and registers
// its Prometheus collectors.
package telemetry

import (
	"context"

	"github.com/dlxbridge/dlxbridge/internal/wireval"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// Propagator is W3C traceparent/tracestate plus baggage. dlxbridge always
// uses it rather than the global propagator, which is a no-op until an
// application sets one: trace context must survive retries, quarantine and
// replay whether or not the host process configured OpenTelemetry.
var Propagator propagation.TextMapPropagator = propagation.NewCompositeTextMapPropagator(
	propagation.TraceContext{}, propagation.Baggage{},
)

// HeaderCarrier adapts amqp.Table to propagation.TextMapCarrier. Values that
// are not strings are ignored on Get.
type HeaderCarrier amqp.Table

// Get returns the header as a string (see wireval.String), or "".
func (c HeaderCarrier) Get(key string) string { return wireval.Str(c, key) }

// Set stores value under key.
func (c HeaderCarrier) Set(key, value string) { c[key] = value }

// Keys lists the header names.
func (c HeaderCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}

// Inject writes ctx's trace context into headers (which must be non-nil).
func Inject(ctx context.Context, headers amqp.Table) {
	Propagator.Inject(ctx, HeaderCarrier(headers))
}

// InjectTable returns ctx's trace context as headers to add to a
// publishing, or nil when Propagator writes none (no valid span context
// and no baggage): a copy's publish span is a no-op one's without a
// tracer provider, and a table for nothing was an allocation per copy.
func InjectTable(ctx context.Context) amqp.Table {
	if !trace.SpanContextFromContext(ctx).IsValid() && baggage.FromContext(ctx).Len() == 0 {
		return nil
	}
	h := amqp.Table{}
	Inject(ctx, h)
	return h
}

// Extract returns ctx with the trace context found in headers, if any.
func Extract(ctx context.Context, headers amqp.Table) context.Context {
	if headers == nil {
		return ctx
	}
	return Propagator.Extract(ctx, HeaderCarrier(headers))
}

// OpenTelemetry messaging semantic-convention attributes used on spans.
var (
	AttrSystemRabbitMQ   = attribute.String("messaging.system", "rabbitmq")
	AttrOperationProcess = attribute.String("messaging.operation.type", "process")
	AttrOperationPublish = attribute.String("messaging.operation.type", "send")
)

// Attribute keys whose values vary per message (span attributes only, never
// metric labels).
const (
	AttrDestination    = "messaging.destination.name"
	AttrRoutingKey     = "messaging.rabbitmq.destination.routing_key"
	AttrMessageID      = "messaging.message.id"
	AttrConversationID = "messaging.message.conversation_id"
	AttrBodySize       = "messaging.message.body.size"
)
