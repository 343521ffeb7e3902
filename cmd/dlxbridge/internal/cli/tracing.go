package cli

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.37.0"
	"go.opentelemetry.io/otel/trace"
)

// otlpTracing returns a tracer provider that exports spans over OTLP/HTTP
// when OTEL_EXPORTER_OTLP_ENDPOINT (or ..._TRACES_ENDPOINT) is set, and a
// function that flushes and stops it; nil when neither is set (the runtime
// then uses the global provider, a no-op unless the process set one).
// The exporter reads the standard OTEL_EXPORTER_OTLP_* variables itself.
func otlpTracing(ctx context.Context, env *Env, service string) (trace.TracerProvider, func(), error) {
	if env.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") == "" && env.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") == "" {
		return nil, func() {}, nil
	}
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, nil, err
	}
	name := env.Getenv("OTEL_SERVICE_NAME")
	if name == "" {
		name = service
	}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp),
		sdktrace.WithResource(resource.NewSchemaless(semconv.ServiceName(name))),
	)
	return tp, func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = tp.Shutdown(sctx)
	}, nil
}
