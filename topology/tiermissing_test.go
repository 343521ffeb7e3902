package topology_test

import (
	"context"
	"slices"
	"testing"

	"github.com/dlxbridge/dlxbridge/topology"
)

// A deleted shared tier queue (the runtime quarantines the retries the
// broker returns for want of it) is what verify reports, with its binding
// from the delay exchange, and what apply restores.
func TestVerifyReportsAMissingTierQueueAndApplyRestoresIt(t *testing.T) {
	t.Parallel()
	env, in, topo := appliedShared(t)
	ctx := context.Background()
	lane := topo.Work[0].Tiers[0].Lanes[0]
	if _, err := env.Channel("delete").QueueDelete(lane.Queue, false, false, false); err != nil {
		t.Fatal(err)
	}
	r, err := in.Verify(ctx, topo)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range r.Problems {
		got = append(got, string(p.Issue)+" "+p.Object)
	}
	want := []string{
		string(topology.IssueMissing) + " queue '" + lane.Queue + "'",
		string(topology.IssueMissing) + " binding '" + topo.Work[0].RetryExchange + "' -> '" + lane.Queue + "' key '" + lane.RoutingKey + "'",
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("verify with tier queue %s deleted:\n got %q\nwant %q", lane.Queue, got, want)
	}
	if _, err := in.Apply(ctx, topo); err != nil {
		t.Fatal(err)
	}
	if r, err = in.Verify(ctx, topo); err != nil {
		t.Fatal(err)
	} else if !r.OK() {
		t.Fatalf("verify after apply: %v", r.Problems)
	}
}
