package topology

import (
	"encoding/json"
	"testing"
)

func TestPolicyOverridesAreDrift(t *testing.T) {
	t.Parallel()
	q := QueueSpec{Name: "orders.quarantine", Role: RoleQuarantine, Args: map[string]any{ArgQueueType: QueueTypeQuorum}}
	policies := []MgmtPolicy{
		{Name: "low", Pattern: "^orders", ApplyTo: "queues", Priority: 0, Definition: map[string]any{"max-length": json.Number("10")}},
		{Name: "high", Pattern: `\.quarantine$`, ApplyTo: "all", Priority: 5, Definition: map[string]any{"message-ttl": json.Number("60000"), "ha-mode": "all"}},
		{Name: "exchanges-only", Pattern: ".*", ApplyTo: "exchanges", Priority: 9, Definition: map[string]any{"alternate-exchange": "x"}},
		{Name: "op", Pattern: ".*", ApplyTo: "quorum_queues", Operator: true, Definition: map[string]any{"delivery-limit": json.Number("3")}},
	}

	// Stats not in yet: the policy is found by matching, like the broker.
	got, _ := policyProblems(q, &MgmtQueue{Name: q.Name}, policies)
	want := []Problem{
		{Kind: KindQueue, Object: "queue 'orders.quarantine'", Issue: IssuePolicy, Arg: "message-ttl", Want: "none", Have: "60000", Policy: "policy 'high'"},
		{Kind: KindQueue, Object: "queue 'orders.quarantine'", Issue: IssuePolicy, Arg: "delivery-limit", Want: "none", Have: "3", Policy: "operator policy 'op'"},
	}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("problem %d: got %v, want %v", i, got[i], want[i])
		}
	}

	// Reported by the broker: its word wins over matching.
	reported := &MgmtQueue{Name: q.Name, PolicyReported: true, Policy: "low", EffectivePolicy: map[string]any{"max-length": json.Number("10")}}
	got, _ = policyProblems(q, reported, policies)
	if len(got) != 1 || got[0].Arg != "max-length" || got[0].Policy != "policy 'low'" {
		t.Fatalf("reported policy: got %v", got)
	}
	if got, _ := policyProblems(q, &MgmtQueue{PolicyReported: true}, policies); len(got) != 0 {
		t.Fatalf("no policy in effect: got %v", got)
	}
}

// Before the broker reports a queue's policy, the one matched is the one
// that can apply to the queue's type, as the broker picks: a streams
// policy that shortens the records stream's retention is drift, and a
// quorum_queues policy of higher priority does not hide it.
func TestPolicyMatchingFollowsTheQueueType(t *testing.T) {
	t.Parallel()
	stream := QueueSpec{Name: "orders.quarantine.records", Role: RoleQuarantine, Args: map[string]any{ArgQueueType: QueueTypeStream}}
	policies := []MgmtPolicy{
		{Name: "quorum-only", Pattern: "^orders", ApplyTo: "quorum_queues", Priority: 9, Definition: map[string]any{"max-length": json.Number("10")}},
		{Name: "short-streams", Pattern: "^orders", ApplyTo: "streams", Priority: 1, Definition: map[string]any{"max-age": "1h"}},
	}
	got, _ := policyProblems(stream, &MgmtQueue{Name: stream.Name}, policies)
	if len(got) != 1 || got[0].Arg != "max-age" || got[0].Policy != "policy 'short-streams'" {
		t.Fatalf("stream: got %v, want the streams policy's max-age only", got)
	}
	quorum := QueueSpec{Name: "orders.quarantine", Role: RoleQuarantine, Args: map[string]any{ArgQueueType: QueueTypeQuorum}}
	got, _ = policyProblems(quorum, &MgmtQueue{Name: quorum.Name}, policies)
	if len(got) != 1 || got[0].Arg != "max-length" || got[0].Policy != "policy 'quorum-only'" {
		t.Fatalf("quorum queue: got %v, want the quorum_queues policy's max-length only", got)
	}
}

// A broker-wide policy raising a limit the queue sets lower itself (a
// delivery limit above 4.x's default of 20, say) changes nothing on the
// queue: the broker applies the lower. It is a note, not drift, or every
// dlxbridge queue would fail verify (and `run` refuse to start) on such a
// broker. A policy lowering it, or setting one the queue does not, still is.
func TestPolicyOutrankedByTheArgumentIsANote(t *testing.T) {
	t.Parallel()
	q := QueueSpec{Name: "orders", Role: RoleWork, Args: map[string]any{ArgQueueType: QueueTypeQuorum, ArgDeliveryLimit: 5, ArgMessageTTL: int64(1000)}}
	for _, c := range []struct {
		def         map[string]any
		drift, note int
	}{
		{map[string]any{"delivery-limit": json.Number("50")}, 0, 1},
		{map[string]any{"delivery-limit": json.Number("-1")}, 0, 1},
		{map[string]any{"delivery-limit": json.Number("5")}, 0, 1},
		{map[string]any{"delivery-limit": json.Number("2")}, 1, 0},
		{map[string]any{"message-ttl": json.Number("60000")}, 0, 1},
		{map[string]any{"message-ttl": json.Number("10")}, 1, 0},
		{map[string]any{"max-length": json.Number("1000000")}, 1, 0}, // the queue sets none
		{map[string]any{"dead-letter-exchange": "elsewhere"}, 1, 0},
	} {
		policies := []MgmtPolicy{{Name: "all", Pattern: ".*", ApplyTo: "queues", Definition: c.def}}
		ps, notes := policyProblems(q, &MgmtQueue{Name: q.Name}, policies)
		if len(ps) != c.drift || len(notes) != c.note {
			t.Errorf("policy %v: %d problems %v, %d notes %v; want %d, %d", c.def, len(ps), ps, len(notes), notes, c.drift, c.note)
		}
		for _, n := range notes {
			if n.Issue != IssuePolicyOutranked {
				t.Errorf("policy %v: note %v", c.def, n)
			}
		}
	}
}
