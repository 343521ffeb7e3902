package consumer

import (
	"context"
	"errors"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/dlxbridge/dlxbridge/internal/telemetry"
	"github.com/dlxbridge/dlxbridge/quarantine"
	"github.com/dlxbridge/dlxbridge/triage"
)

// publish → fail → retry → succeed is one trace, and a quarantined message's
// envelope holds the same trace id as the publisher's span.
func TestTraceSurvivesRetryAndQuarantine(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	exp := tracetest.NewInMemoryExporter()
	ended := &endSignal{consumerSpans: make(chan struct{}, 64)}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp), sdktrace.WithSpanProcessor(ended))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	b.cfg.TracerProvider = tp

	b.start(func(c *Consumer) {
		must(t, c.Handle(b.queue.Name, testType, HandlerFunc(func(ctx context.Context, m *Message) error {
			switch {
			case m.MessageID == "poison":
				return triage.Permanent(errors.New("never"))
			case m.Attempt == 1:
				return errors.New("first try fails")
			}
			return nil
		})))
	})

	publishTraced := func(id string) trace.TraceID {
		ctx, span := tp.Tracer("test-publisher").Start(context.Background(), "publish", trace.WithSpanKind(trace.SpanKindProducer))
		h := amqp.Table{}
		telemetry.Inject(ctx, h)
		span.End()
		b.publishJSON(map[string]any{"id": id}, amqp.Publishing{MessageId: id, Headers: h})
		return span.SpanContext().TraceID()
	}

	okTrace := publishTraced("ok")
	b.waitOutcome(OutcomeRetried, 10*time.Second)
	b.waitOutcome(OutcomeAcked, 10*time.Second)
	// The consumer span ends just after the ack; wait for both to end.
	for i := 0; i < 2; i++ {
		select {
		case <-ended.consumerSpans:
		case <-time.After(10 * time.Second):
			t.Fatal("consumer spans did not end")
		}
	}

	var consumeSpans, retryPublishes int
	for _, s := range exp.GetSpans() {
		if s.SpanContext.TraceID() != okTrace {
			continue
		}
		switch s.SpanKind {
		case trace.SpanKindConsumer:
			consumeSpans++
		case trace.SpanKindProducer:
			if s.Name == b.wq.RetryExchange+" publish" {
				retryPublishes++
			}
		}
	}
	if consumeSpans != 2 || retryPublishes != 1 {
		t.Fatalf("trace %s has %d consumer spans and %d retry publishes, want 2 and 1 (all spans: %d)",
			okTrace, consumeSpans, retryPublishes, len(exp.GetSpans()))
	}

	poisonTrace := publishTraced("poison")
	b.waitOutcome(OutcomeQuarantined, 10*time.Second)
	env, _ := quarantine.Read(ptr(b.quarantined()))
	if env.TraceID != poisonTrace.String() {
		t.Fatalf("envelope trace id %q, want %s", env.TraceID, poisonTrace)
	}
}

// endSignal signals each ended consumer span.
type endSignal struct{ consumerSpans chan struct{} }

func (e *endSignal) OnStart(context.Context, sdktrace.ReadWriteSpan) {}
func (e *endSignal) OnEnd(s sdktrace.ReadOnlySpan) {
	if s.SpanKind() == trace.SpanKindConsumer {
		e.consumerSpans <- struct{}{}
	}
}
func (e *endSignal) Shutdown(context.Context) error   { return nil }
func (e *endSignal) ForceFlush(context.Context) error { return nil }
