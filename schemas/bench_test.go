package schemas_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/dlxbridge/dlxbridge/schemas"
)

// BenchmarkGateCheck is the gate on a realistic ~1 KB orders.created v2
// message: identity, one decode, validation. Compare BenchmarkJSONUnmarshal.
func BenchmarkGateCheck(b *testing.B) {
	g := ordersGate(b)
	in := orderInput("orders.created", "2", orderV2)
	b.SetBytes(int64(len(in.Body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := g.Check(in); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkGateCheckInvalid is the gate on the schema-invalid body of
// "dlxbridge bench --scenario storm": 1 KB, one line item's quantity 0
// below the schema's minimum 1. The storm sends one in ten of these.
func BenchmarkGateCheckInvalid(b *testing.B) {
	g := ordersGate(b)
	in := orderInput("orders.created", "2", stormBody(7, 0))
	if len(in.Body) != 1024 {
		b.Fatalf("body is %d bytes, want 1024", len(in.Body))
	}
	b.SetBytes(int64(len(in.Body)))
	b.ReportAllocs()
	for b.Loop() {
		_, err := g.Check(in)
		if ve := asValidation(b, err); len(ve.Violations) != 1 || ve.Violations[0].Pointer != "/lineItems/0/quantity" {
			b.Fatalf("got %v", err)
		}
	}
}

// stormBody is cmd/dlxbridge/internal/bench.Body(i, 1024, kind) (which this package's
// tests cannot import without pulling in the broker-side packages): an
// orders.created v2 order whose first line item has quantity qty, padded
// with line items to 1024 bytes.
func stormBody(i, qty int) string {
	pad := `,{"sku":"PAD-0001","quantity":1,"name":"` + strings.Repeat("x", 200) + `"}`
	return fmt.Sprintf(`{"orderId":"00000000-0000-4000-8000-%012d","createdAt":"2026-01-02T03:04:05Z",`+
		`"customer":{"id":"c-%d","email":"c%d@example.com","name":"Customer %d"},"channel":"web",`+
		`"total":{"amount":"12.50","currency":"EUR"},"lineItems":[{"sku":"SKU-%04d","quantity":%d,"name":"`,
		i, i, i, i, i%10000, qty) + strings.Repeat("x", 28) + `"}` + strings.Repeat(pad, 3) + `]}`
}

// BenchmarkJSONUnmarshal is the baseline: plain json.Unmarshal of the same
// bytes into any.
func BenchmarkJSONUnmarshal(b *testing.B) {
	body := []byte(orderV2)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		var v any
		if err := json.Unmarshal(body, &v); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkGateDecodeOnly isolates the decoder: a gate over an empty schema.
func BenchmarkGateDecodeOnly(b *testing.B) {
	g, err := schemas.NewGate(schemas.GateConfig{Registry: registry(b), Accepts: map[string][]string{"common": {"1"}}})
	if err != nil {
		b.Fatal(err)
	}
	in := orderInput("common", "1", orderV2)
	b.SetBytes(int64(len(in.Body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := g.Check(in); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkGateCheckBenchBody is the gate on the valid body of "dlxbridge
// bench" (its clean scenario, and nine in ten of the storm's): 1 KB, four
// line items, most of it their names.
func BenchmarkGateCheckBenchBody(b *testing.B) {
	g := ordersGate(b)
	in := orderInput("orders.created", "2", stormBody(7, 1))
	b.SetBytes(int64(len(in.Body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := g.Check(in); err != nil {
			b.Fatal(err)
		}
	}
}
