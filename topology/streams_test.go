package topology_test

import (
	"context"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/internal/brokertest"
	"github.com/dlxbridge/dlxbridge/topology"
)

// The quarantine's record and event streams are declared by apply and
// checked by verify like every other queue: as streams (not flagged for not
// being quorum queues), with their x-max-age, and drift in it is reported.
func TestApplyDeclaresQuarantineStreamsAndVerifyChecksThem(t *testing.T) {
	t.Parallel()
	env := brokertest.Require(t)
	ctx := context.Background()
	conn := env.Dial("topology")
	cfg := shortConfig(t, env.Prefix, 3)
	topo, err := topology.BuildFor(cfg, conn)
	if err != nil {
		t.Fatal(err)
	}
	w := topo.Work[0]
	if w.Records != cfg.Queues[0].Quarantine.Queue+".records" || w.Events != cfg.Queues[0].Quarantine.Queue+".events" {
		t.Fatalf("stream names %q %q", w.Records, w.Events)
	}
	in := &topology.Broker{Conn: conn}
	if env.ManagementURL != "" {
		if in.Mgmt, err = topology.NewManagement(env.ManagementURL, env.URL); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := in.Apply(ctx, topo); err != nil {
		t.Fatal(err)
	}
	ch := env.Channel("check")
	// A stream answers a consume with x-stream-offset; a quorum queue refuses it.
	if err := ch.Qos(1, 0, false); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.Consume(w.Records, "", false, false, false, false, amqp.Table{"x-stream-offset": "first"}); err != nil {
		t.Fatalf("records is not a stream: %v", err)
	}
	r, err := in.Verify(ctx, topo)
	if err != nil || !r.OK() {
		t.Fatalf("verify after apply: %+v, %v", r, err)
	}

	// Someone re-creates the records stream with a shorter retention.
	ch = env.Channel("saboteur")
	if _, err := ch.QueueDelete(w.Records, false, false, false); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(w.Records, true, false, false, false, amqp.Table{topology.ArgQueueType: "stream", topology.ArgMaxAge: "60s"}); err != nil {
		t.Fatal(err)
	}
	in.Mgmt = nil // the AMQP path; the management path compares the same arguments
	r, err = in.Verify(ctx, topo)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Problems) != 1 || r.Problems[0].Arg != topology.ArgMaxAge || r.Problems[0].Have != "60s" {
		t.Fatalf("verify problems %+v, want x-max-age 60s", r.Problems)
	}
}
