package consumer

import (
	"strings"
	"testing"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/dlxbridge/dlxbridge/internal/frame"
	"github.com/dlxbridge/dlxbridge/internal/telemetry"
	"github.com/dlxbridge/dlxbridge/triage"
	"github.com/dlxbridge/dlxbridge/wire"
)

// TestCopyCarriesIncomingTrace: a retry's, re-admission's and quarantine
// record's headers continue the incoming message's trace, traceparent and
// tracestate, whatever the tracer provider: the global one with none
// installed and the no-op one (the publish span is the remote parent's
// context, nothing records), and an SDK one (a new span of the same
// trace). The producer's own traceparent is removed first, so that only
// the injection can put one there.
func TestCopyCarriesIncomingTrace(t *testing.T) {
	t.Parallel()
	const (
		traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
		parent  = "00-" + traceID + "-00f067aa0ba902b7-01"
		state   = "vendor=opaque,other=1"
	)
	sdk := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()))
	t.Cleanup(func() { _ = sdk.Shutdown(t.Context()) })
	for name, tp := range map[string]trace.TracerProvider{"global": otel.GetTracerProvider(), "noop": noop.NewTracerProvider(), "sdk": sdk} {
		for fname, f := range map[string]failure{"retry": retryFailure(), "quarantine": quarantineFailure(), "readmit": readmitReview()} {
			b := newSettleBundle(t, frame.DefaultFrameSize)
			b.w.deps.tracer = tp.Tracer("review")
			d := delivery()
			d.Headers[wire.HeaderTraceparent] = parent
			d.Headers["tracestate"] = state
			ctx := telemetry.Extract(t.Context(), d.Headers)
			ctx, span := b.w.deps.tracer.Start(ctx, "process")
			// What the copy keeps of the producer's headers must not
			// stand in for the injection.
			delete(d.Headers, wire.HeaderTraceparent)
			delete(d.Headers, "tracestate")
			out, err := b.w.prepare(ctx, span, d, f, "")
			span.End()
			if err != nil {
				t.Fatalf("%s %s: %v", name, fname, err)
			}
			h := out.b.p.Headers
			tp, _ := h[wire.HeaderTraceparent].(string)
			ts, _ := h["tracestate"].(string)
			if !strings.HasPrefix(tp, "00-"+traceID+"-") || ts != state {
				t.Errorf("%s %s: traceparent %q tracestate %q, want the incoming trace %s and %q", name, fname, tp, ts, traceID, state)
			}
			if name != "sdk" && tp != parent {
				t.Errorf("%s %s: traceparent %q, want the incoming %q (nothing records)", name, fname, tp, parent)
			}
		}
	}
}

func readmitReview() failure {
	f := retryFailure()
	f.verdict = triage.Verdict{Action: triage.ActionReadmit, Class: triage.ClassCrashLoop, Reason: "re-admitted"}
	return f
}
