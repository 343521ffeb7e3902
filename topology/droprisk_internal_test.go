package topology

import (
	"encoding/json"
	"testing"
)

// The broker reports a quorum queue's effective delivery limit as a number
// or "unlimited" (4.3.6), and nothing on 3.x: only a finite limit below
// SafeDeliveryLimit without a dead-letter exchange, or a drop-head
// overflow, is a risk, and only on a quarantine.
func TestDropRisks(t *testing.T) {
	t.Parallel()
	q := QueueSpec{Name: "q.quarantine", Role: RoleQuarantine}
	tests := []struct {
		name string
		spec QueueSpec
		have MgmtQueue
		want int
	}{
		{"unlimited", q, MgmtQueue{Type: QueueTypeQuorum, DeliveryLimit: "unlimited"}, 0},
		{"not reported (3.x)", q, MgmtQueue{Type: QueueTypeQuorum}, 0},
		{"4.x default 20", q, MgmtQueue{Type: QueueTypeQuorum, DeliveryLimit: json.Number("20")}, 1},
		{"large finite", q, MgmtQueue{Type: QueueTypeQuorum, DeliveryLimit: float64(SafeDeliveryLimit)}, 0},
		{"small, with a dead-letter exchange", q, MgmtQueue{Type: QueueTypeQuorum, DeliveryLimit: float64(5),
			EffectivePolicy: map[string]any{"dead-letter-exchange": "elsewhere"}}, 0},
		{"drop-head by policy", q, MgmtQueue{Type: QueueTypeQuorum, DeliveryLimit: "unlimited",
			EffectivePolicy: map[string]any{"overflow": "drop-head"}}, 1},
		{"drop-head by policy, argument wins", q, MgmtQueue{Type: QueueTypeQuorum, DeliveryLimit: "unlimited",
			Arguments: map[string]any{ArgOverflow: OverflowReject}, EffectivePolicy: map[string]any{"overflow": "drop-head"}}, 0},
		{"work queue", QueueSpec{Name: "q", Role: RoleWork}, MgmtQueue{Type: QueueTypeQuorum, DeliveryLimit: float64(5)}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := dropRisks(tt.spec, &tt.have)
			if len(got) != tt.want {
				t.Fatalf("dropRisks = %v, want %d problems", got, tt.want)
			}
			for _, p := range got {
				if p.Issue != IssueCanDrop || p.Object != queueObject(tt.spec.Name) {
					t.Errorf("problem %s", p)
				}
			}
		})
	}
}
