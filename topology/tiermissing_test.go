package topology_test

import (
	"context"
	"regexp"
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

// A broker-wide policy raising the delivery limit above a work queue's own
// argument changes nothing there (the broker applies the lower): verify
// notes it and passes, so `run` starts. One lowering it is drift.
func TestVerifyNotesAPolicyTheQueuesArgumentOutranks(t *testing.T) {
	t.Parallel()
	env, in, topo := appliedShared(t)
	ctx := context.Background()
	work := topo.Work[0].Name
	var limit int64
	for _, q := range topo.Queues {
		if q.Name == work {
			limit, _ = q.Args[topology.ArgDeliveryLimit].(int64)
			if n, ok := q.Args[topology.ArgDeliveryLimit].(int); ok {
				limit = int64(n)
			}
		}
	}
	if limit < 2 {
		t.Fatalf("work queue %s has delivery limit %d", work, limit)
	}
	pattern := "^" + regexp.QuoteMeta(work) + "$"
	env.QuorumPolicy(env.Name("raise"), pattern, map[string]any{"delivery-limit": limit * 10})
	r, err := in.Verify(ctx, topo)
	if err != nil {
		t.Fatal(err)
	}
	if !r.OK() || !slices.ContainsFunc(r.Notes, func(p topology.Problem) bool {
		return p.Issue == topology.IssuePolicyOutranked && p.Arg == "delivery-limit"
	}) {
		t.Fatalf("a policy raising the delivery limit: problems %v, notes %v; want OK with a note", r.Problems, r.Notes)
	}
	env.QuorumPolicy(env.Name("raise"), pattern, map[string]any{"delivery-limit": limit - 1})
	if r, err = in.Verify(ctx, topo); err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(r.Problems, func(p topology.Problem) bool {
		return p.Issue == topology.IssuePolicy && p.Arg == "delivery-limit"
	}) {
		t.Fatalf("a policy lowering the delivery limit: problems %v; want it as drift", r.Problems)
	}
}
