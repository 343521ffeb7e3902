package consumer

import (
	"slices"
	"testing"

	"github.com/dlxbridge/dlxbridge/config"
	"github.com/dlxbridge/dlxbridge/internal/frame"
	"github.com/dlxbridge/dlxbridge/topology"
	"github.com/dlxbridge/dlxbridge/triage"
	"github.com/dlxbridge/dlxbridge/wire"
)

// No copy the runtime publishes carries a producer's CC or BCC: the broker
// routes by them, so a re-admission (through the default exchange) would
// reach every queue they name, and a retry the queues bound under them. A
// retry into the shared tiers carries the runtime's own CC, naming the
// queue that failed it, and nothing else.
func TestNoCopyCarriesAProducersCCOrBCC(t *testing.T) {
	t.Parallel()
	shared, err := config.Parse([]byte(`queues:
  - name: orders
    exchange: {name: orders}
    bindings: [order.created]
    gate: off
    retry: {tiers: [1s, 5s], jitter: 0, max_attempts: 3, tier_queues: shared}
`))
	if err != nil {
		t.Fatal(err)
	}
	v, _ := topology.ParseBrokerVersion("4.3.6")
	topo, err := topology.Build(shared, v)
	if err != nil {
		t.Fatal(err)
	}
	sharedWQ, _ := topo.WorkQueue("orders")
	for _, tc := range []struct {
		name   string
		shared bool
		f      failure
		wantCC []any
	}{
		{"retry into own lanes", false, retryFailure(), nil},
		{"retry into the shared tiers", true, retryFailure(), []any{"orders"}},
		{"re-admission", false, failure{verdict: triage.Verdict{Action: triage.ActionReadmit, Class: triage.ClassCrashLoop, Reason: "re-admitted"}}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := newSettleBundle(t, frame.DefaultFrameSize)
			if tc.shared {
				b.w.s.wq = sharedWQ
			}
			d := delivery()
			d.Headers[wire.HeaderCC] = []any{"payments", "orders"}
			d.Headers[wire.HeaderBCC] = []any{"payments"}
			got, err := build(b.input(d, tc.f))
			if err != nil {
				t.Fatal(err)
			}
			cc, hasCC := got.p.Headers[wire.HeaderCC]
			if tc.wantCC == nil && hasCC {
				t.Errorf("CC %v travels on the copy to %q", cc, got.exchange)
			}
			if tc.wantCC != nil && !slices.Equal(cc.([]any), tc.wantCC) {
				t.Errorf("CC %v, want %v", cc, tc.wantCC)
			}
			if bcc, has := got.p.Headers[wire.HeaderBCC]; has {
				t.Errorf("BCC %v travels on the copy", bcc)
			}
			if tc.shared && (got.exchange != sharedWQ.RetryExchange || got.key != sharedWQ.Tiers[1].Lanes[0].RoutingKey) {
				t.Errorf("shared retry to %q %q", got.exchange, got.key)
			}
		})
	}
}
