package schemas_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/dlxbridge/dlxbridge/schemas"
)

// TestExamplesPass: every example message passes the gate.
func TestExamplesPass(t *testing.T) {
	t.Parallel()
	g, err := schemas.NewGate(schemas.GateConfig{Registry: registry(t)})
	if err != nil {
		t.Fatal(err)
	}
	for _, ex := range schemas.Examples(t) {
		if _, err := g.Check(orderInput(ex.Type, ex.Version, string(ex.Body))); err != nil {
			t.Errorf("example %s v%s: %v", ex.Type, ex.Version, err)
		}
	}
}

// BenchmarkGateVsUnmarshal checks each example message with the gate and
// decodes the same bytes with json.Unmarshal into any, alternating within
// one loop so that both see the same machine load, and reports each one's
// time per message and their ratio (gate/unmarshal).
func BenchmarkGateVsUnmarshal(b *testing.B) {
	g, err := schemas.NewGate(schemas.GateConfig{Registry: registry(b)})
	if err != nil {
		b.Fatal(err)
	}
	for _, ex := range schemas.Examples(b) {
		b.Run(ex.Type+"/v"+ex.Version, func(b *testing.B) {
			in := orderInput(ex.Type, ex.Version, string(ex.Body))
			var gate, plain time.Duration
			b.SetBytes(int64(len(in.Body)))
			n := 0
			for b.Loop() {
				t0 := time.Now()
				if _, err := g.Check(in); err != nil {
					b.Fatal(err)
				}
				t1 := time.Now()
				var v any
				if err := json.Unmarshal(in.Body, &v); err != nil {
					b.Fatal(err)
				}
				t2 := time.Now()
				gate += t1.Sub(t0)
				plain += t2.Sub(t1)
				n++
			}
			b.ReportMetric(float64(gate.Nanoseconds())/float64(n), "gate-ns/op")
			b.ReportMetric(float64(plain.Nanoseconds())/float64(n), "unmarshal-ns/op")
			b.ReportMetric(float64(gate)/float64(plain), "gate/unmarshal")
		})
	}
}
