package topology_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/internal/brokertest"
	"github.com/dlxbridge/dlxbridge/topology"
)

func TestApplyIsIdempotentAndRefusesConflicts(t *testing.T) {
	t.Parallel()
	env := brokertest.Require(t)
	ctx := context.Background()
	conn := env.Dial("topology")
	topo, err := topology.BuildFor(shortConfig(t, env.Prefix, 3), conn)
	if err != nil {
		t.Fatal(err)
	}
	in := &topology.Broker{Conn: conn}
	first, err := in.Apply(ctx, topo)
	if err != nil {
		t.Fatalf("first apply: %v", err)
	}
	objects := len(topo.Exchanges) + len(topo.Queues)
	if first.Summary.Create != objects+len(topo.Bindings) {
		t.Fatalf("first apply: %+v, want %d created", first.Summary, objects+len(topo.Bindings))
	}
	second, err := in.Apply(ctx, topo)
	if err != nil {
		t.Fatalf("second apply: %v", err)
	}
	// Without the management API bindings can't be seen, only re-bound
	// (a no-op when they exist).
	if second.Summary.Create != 0 || second.Summary.Unchanged != objects || second.Summary.Ensure != len(topo.Bindings) {
		t.Fatalf("second apply: %+v, want 0 created, %d unchanged", second.Summary, objects)
	}
	r, err := in.Verify(ctx, topo)
	if err != nil || !r.OK() {
		t.Fatalf("verify after apply: %+v, %v", r, err)
	}

	// Someone redeclares the work queue with another delivery limit.
	work := topo.Work[0].Name
	ch := env.Channel("saboteur")
	if _, err := ch.QueueDelete(work, false, false, false); err != nil {
		t.Fatal(err)
	}
	args := amqp.Table{}
	for k, v := range topo.Queues[0].Args {
		args[k] = v
	}
	args[topology.ArgDeliveryLimit] = int32(7)
	if _, err := ch.QueueDeclare(work, true, false, false, false, args); err != nil {
		t.Fatal(err)
	}

	// Without the management API the 406 of an equivalent redeclare names it.
	r, err = in.Verify(ctx, topo)
	if err != nil {
		t.Fatal(err)
	}
	want := topology.Problem{Kind: topology.KindQueue, Object: "queue '" + work + "'", Issue: topology.IssueArgument, Arg: topology.ArgDeliveryLimit, Want: "3", Have: "7"}
	if len(r.Problems) != 1 || r.Problems[0] != want {
		t.Fatalf("verify problems %+v, want [%+v]", r.Problems, want)
	}
	if len(r.NotChecked) == 0 {
		t.Error("AMQP-only verify must say what it could not check")
	}

	// Apply refuses and leaves the queue as it is.
	p, err := in.Apply(ctx, topo)
	if !errors.Is(err, topology.ErrConflict) || p == nil || p.Summary.Conflict != 1 {
		t.Fatalf("apply over a conflict: %+v, %v", p, err)
	}
	// The error alone says what to fix: a library caller may not print the plan.
	if want := "queue '" + work + "': x-delivery-limit: want 3, have 7"; !strings.Contains(err.Error(), want) {
		t.Errorf("apply error %q does not name the conflict %q", err, want)
	}
	if _, err := ch.QueueDeclarePassive(work, true, false, false, false, args); err != nil {
		t.Fatalf("conflicting queue touched: %v", err)
	}

	env.RequireManagement()
	m, err := topology.NewManagement(env.ManagementURL, env.URL)
	if err != nil {
		t.Fatal(err)
	}
	in.Mgmt = m
	r, err = in.Verify(ctx, topo)
	if err != nil {
		t.Fatal(err)
	}
	found := map[string]bool{}
	for _, p := range r.Problems {
		found[p.String()] = true
	}
	for _, s := range []string{
		want.String(),
		"binding '" + topo.Work[0].Exchange + "' -> '" + work + "' key 'k': missing",
	} {
		if !found[s] {
			t.Errorf("verify with management: missing %q in %v", s, r.Problems)
		}
	}
}
