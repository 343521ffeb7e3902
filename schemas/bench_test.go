package schemas_test

import (
	"encoding/json"
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
