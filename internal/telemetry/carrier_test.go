package telemetry

import (
	"context"
	"maps"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/trace"
)

// InjectTable skips the table when Propagator would write nothing; with a
// span context or baggage it writes what Inject writes.
func TestInjectTable(t *testing.T) {
	sc := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID:    trace.TraceID{1, 2, 3},
		SpanID:     trace.SpanID{4, 5, 6},
		TraceFlags: trace.FlagsSampled,
	})
	member, err := baggage.NewMember("tenant", "a")
	if err != nil {
		t.Fatal(err)
	}
	bag, err := baggage.New(member)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		ctx  context.Context
		want []string // header names
	}{
		{"none", context.Background(), nil},
		{"span", trace.ContextWithSpanContext(context.Background(), sc), []string{"traceparent"}},
		{"baggage", baggage.ContextWithBaggage(context.Background(), bag), []string{"baggage"}},
		{"both", baggage.ContextWithBaggage(trace.ContextWithSpanContext(context.Background(), sc), bag), []string{"traceparent", "baggage"}},
	}
	for _, c := range cases {
		got := InjectTable(c.ctx)
		full := amqp.Table{}
		Inject(c.ctx, full)
		if len(c.want) == 0 {
			if got != nil || len(full) != 0 {
				t.Errorf("%s: InjectTable %v, Inject wrote %v; want nothing", c.name, got, full)
			}
			continue
		}
		if !maps.Equal(got, full) {
			t.Errorf("%s: InjectTable %v, Inject wrote %v", c.name, got, full)
		}
		for _, k := range c.want {
			if _, ok := got[k]; !ok {
				t.Errorf("%s: no %s in %v", c.name, k, got)
			}
		}
	}
}
