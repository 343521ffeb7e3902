package topology_test

import (
	"context"
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/dlxbridge/dlxbridge/internal/brokertest"
	"github.com/dlxbridge/dlxbridge/topology"
)

// A quarantine has no dead-letter exchange: given a small delivery limit by
// policy, a message requeued that often there is dropped. verify reads the
// limit the broker applies (not the policy) and fails naming the queue and
// the risk.
func TestVerifyFailsOnAQuarantineThatCanDrop(t *testing.T) {
	t.Parallel()
	env := brokertest.Require(t)
	env.RequireManagement()
	ctx := context.Background()
	conn := env.Dial("topology")
	cfg := shortConfig(t, env.Prefix, 3)
	topo, err := topology.BuildFor(cfg, conn)
	if err != nil {
		t.Fatal(err)
	}
	in := &topology.Broker{Conn: conn}
	if in.Mgmt, err = topology.NewManagement(env.ManagementURL, env.URL); err != nil {
		t.Fatal(err)
	}
	if _, err := in.Apply(ctx, topo); err != nil {
		t.Fatal(err)
	}
	quarantine := cfg.Queues[0].Quarantine.Queue
	applyTo := "quorum_queues" // 3.x knows queues only
	if !topo.Broker.HasDefaultDeliveryLimit() {
		applyTo = "queues"
	}
	if err := env.TryPolicy(env.Prefix+".small-limit", "^"+regexp.QuoteMeta(quarantine)+"$", applyTo, map[string]any{"delivery-limit": 5}); err != nil {
		t.Fatal(err)
	}
	// The broker applies a policy on its own time; wait until it reports
	// the limit it applies (polled: there is no event). 3.x reports no
	// delivery_limit of its own, only the effective policy.
	deadline := time.Now().Add(30 * time.Second)
	for {
		var q struct {
			DeliveryLimit any            `json:"delivery_limit"`
			Effective     map[string]any `json:"effective_policy_definition"`
		}
		_ = json.Unmarshal(env.ManagementGet("/api/queues/"+env.ManagementVhost()+"/"+quarantine), &q)
		if f, ok := q.DeliveryLimit.(float64); ok && f == 5 {
			break
		}
		if f, ok := q.Effective["delivery-limit"].(float64); ok && f == 5 && !topo.Broker.HasDefaultDeliveryLimit() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the broker reports delivery_limit %v, want the policy's 5", q.DeliveryLimit)
		}
		time.Sleep(200 * time.Millisecond)
	}
	r, err := in.Verify(ctx, topo)
	if err != nil {
		t.Fatal(err)
	}
	var found *topology.Problem
	for i, p := range r.Problems {
		if p.Issue == topology.IssueCanDrop {
			found = &r.Problems[i]
		}
	}
	if r.OK() || found == nil {
		t.Fatalf("verify problems %+v, want %s on %s", r.Problems, topology.IssueCanDrop, quarantine)
	}
	if !strings.Contains(found.Object, quarantine) || found.Arg != "delivery_limit" || !strings.Contains(found.Have, "dropped") {
		t.Fatalf("problem %s, want the quarantine's delivery limit named with the risk", found)
	}
}
