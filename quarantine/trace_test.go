package quarantine

import (
	"context"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// A replayed message gets a new trace context from a producer span that is
// linked to the message's original trace (not a child of it: the replay
// is a new operation, maybe days later).
func TestReplaySpanLinksTheOriginalTrace(t *testing.T) {
	t.Parallel()
	b := setupStore(t, nil)
	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	h := envelopeHeaders(b.q.Name, "fp-t", "boom", nowUTC())
	h["traceparent"] = "00-" + traceID + "-00f067aa0ba902b7-01"
	b.publish(b.q.Quarantine.Queue, amqp.Publishing{MessageId: "m-t", Type: "test.job", Headers: h, Body: []byte(validJob(1))})
	b.keep(1)
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	rp := b.replayer()
	rp.TracerProvider = tp
	if res, err := rp.Replay(context.Background(), ReplayOptions{Filter: Filter{Fingerprint: "fp-t"}}); err != nil || len(res.Sent) != 1 {
		t.Fatalf("replay: %+v %v", res, err)
	}
	spans := exp.GetSpans()
	if len(spans) != 1 || len(spans[0].Links) != 1 || spans[0].Links[0].SpanContext.TraceID().String() != traceID {
		t.Fatalf("spans %+v", spans)
	}
	newTrace := spans[0].SpanContext.TraceID().String()
	d, ok, err := b.env.Channel("check").Get(b.q.Name, true)
	if err != nil || !ok {
		t.Fatalf("get: %v %v", ok, err)
	}
	if tp, _ := d.Headers["traceparent"].(string); newTrace == traceID || len(tp) < 35 || tp[3:35] != newTrace {
		t.Fatalf("traceparent %v, span trace %s", d.Headers["traceparent"], newTrace)
	}
}
