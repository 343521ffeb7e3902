package quarantine

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/dlxbridge/dlxbridge/wire"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/triage"
)

func TestEnvelopeRoundTrip(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 11, 29, 10, 0, 0, 123456789, time.UTC)
	in := Envelope{
		Source: SourceBridge, Class: triage.ClassSchema, Reason: "schema failure", Error: "invalid",
		Fingerprint: "abc123", Attempts: 3,
		FirstFailureAt: at, LastFailureAt: at.Add(time.Second), QuarantinedAt: at.Add(2 * time.Second),
		OriginalExchange: "orders", OriginalRouting: "order.created", OriginalQueue: "orders",
		IdempotencyKey: "k", MessageType: "orders.created", SchemaVersion: "2",
		Validation: []Violation{{Pointer: "/total", Keyword: "required", Message: "missing"}},
		TraceID:    "4bf92f3577b34da6a3ce929d0e0e4736", WorkerHost: "h", WorkerVersion: "v1",
		Redacted: []string{"header:authorization"}, Notes: []string{"dlxbridge-attempts=-1 ignored"},
		Stack: "goroutine 7 [running]:\nmain.handler()\n\t/src/main.go:12 +0x1d",
	}
	h := amqp.Table{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
	in.Apply(h)
	got, ok := Read(&amqp.Delivery{Headers: h, MessageId: "m"})
	if !ok {
		t.Fatal("Read found no envelope")
	}
	in.MessageID = "m"
	in.Traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	if got.Reason != in.Reason || got.Class != in.Class || got.Attempts != in.Attempts ||
		!got.FirstFailureAt.Equal(in.FirstFailureAt) || !got.QuarantinedAt.Equal(in.QuarantinedAt) ||
		got.OriginalRouting != in.OriginalRouting || got.SchemaVersion != in.SchemaVersion ||
		len(got.Validation) != 1 || got.Validation[0] != in.Validation[0] ||
		got.TraceID != in.TraceID || got.Traceparent != in.Traceparent || got.MessageID != "m" ||
		len(got.Redacted) != 1 || len(got.Notes) != 1 || got.Stack != in.Stack {
		t.Fatalf("round trip:\n got %+v\nwant %+v", got, in)
	}
}

func TestApplyBoundsEveryHeader(t *testing.T) {
	t.Parallel()
	huge := strings.Repeat("é", 10_000)
	var vs []Violation
	for i := 0; i < 1000; i++ {
		vs = append(vs, Violation{Pointer: "/items/" + strings.Repeat("x", 20), Keyword: "type", Message: huge[:100]})
	}
	e := Envelope{Reason: huge, Error: huge, Validation: vs, Notes: []string{huge, huge}, Stack: huge}
	h := amqp.Table{}
	e.Apply(h)
	for k, limit := range map[string]int{wire.HeaderReason: maxErrorBytes, wire.HeaderError: maxErrorBytes, wire.HeaderValidationErrors: maxValidationBytes, wire.HeaderNotes: maxNotesBytes, wire.HeaderStack: MaxStackBytes} {
		s, _ := h[k].(string)
		if len(s) == 0 || len(s) > limit || !utf8.ValidString(s) {
			t.Errorf("%s: %d bytes (limit %d), valid UTF-8 %v", k, len(s), limit, utf8.ValidString(s))
		}
	}
}

// A message the broker dead-lettered itself carries only x-death: Read
// derives the envelope from it, on both header shapes.
func TestReadDerivesBrokerDeadLetters(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 11, 29, 9, 0, 0, 0, time.UTC)
	cases := []struct {
		name    string
		headers amqp.Table
		class   triage.Class
		queue   string
	}{
		{"3.10 delivery limit", amqp.Table{
			"x-death":             []any{amqp.Table{"queue": "orders", "reason": "delivery_limit", "count": int64(1), "exchange": "orders", "routing-keys": []any{"order.created"}, "time": at}},
			"x-first-death-queue": "orders", "x-first-death-reason": "delivery_limit",
		}, triage.ClassCrashLoop, "orders"},
		{"4.x expired, int32 count", amqp.Table{
			"x-death":              []any{amqp.Table{"queue": "orders", "reason": "expired", "count": int32(1), "exchange": "orders", "routing-keys": []any{"order.created"}, "time": at}},
			"x-first-death-reason": "expired", "x-last-death-reason": "expired",
		}, triage.ClassExpired, "orders"},
		{"maxlen", amqp.Table{"x-death": []any{amqp.Table{"queue": "orders", "reason": "maxlen", "count": int64(1)}}}, triage.ClassMaxLen, "orders"},
	}
	for _, c := range cases {
		env, ok := Read(&amqp.Delivery{Headers: c.headers})
		if !ok || env.Source != SourceBroker || env.Class != c.class || env.OriginalQueue != c.queue {
			t.Errorf("%s: ok %v envelope %+v", c.name, ok, env)
		}
	}
	if _, ok := Read(&amqp.Delivery{Headers: amqp.Table{"x-death": "garbage"}}); ok {
		t.Error("garbage x-death read as an envelope")
	}
	if _, ok := Read(&amqp.Delivery{}); ok {
		t.Error("a plain message read as an envelope")
	}
}

func TestReadReturnsTheDropRecord(t *testing.T) {
	t.Parallel()
	b, _ := json.Marshal([]string{"header:x-app-blob"})
	d := amqp.Delivery{Headers: amqp.Table{wire.HeaderEnvelope: int32(1), wire.HeaderDropped: string(b)}}
	env, ok := Read(&d)
	if !ok || len(env.Dropped) != 1 || env.Dropped[0] != "header:x-app-blob" {
		t.Fatalf("env.Dropped %v ok %v", env.Dropped, ok)
	}
}
