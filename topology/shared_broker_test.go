package topology_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/config"
	"github.com/dlxbridge/dlxbridge/internal/brokertest"
	"github.com/dlxbridge/dlxbridge/topology"
	"github.com/dlxbridge/dlxbridge/wire"
)

// sharedConfig is two work queues a and b on one exchange, on shared tiers
// named from prefix (or per-queue lanes), tiers of 1.5 s and 3 s.
func sharedConfig(t *testing.T, prefix, layout string) *config.Config {
	t.Helper()
	return sharedConfigWith(t, prefix, layout, 1500*time.Millisecond, 3*time.Second)
}

// sharedConfigWith is sharedConfig with the given tiers.
func sharedConfigWith(t *testing.T, prefix, layout string, tiers ...time.Duration) *config.Config {
	t.Helper()
	jitter := 0.0
	cfg := &config.Config{SharedTiers: config.SharedTiers{Prefix: prefix}}
	for _, s := range []string{"a", "b"} {
		cfg.Queues = append(cfg.Queues, config.Queue{
			Name: prefix + "." + s, Exchange: config.Exchange{Name: prefix + ".ex", Type: "direct"}, Bindings: []string{s},
			Retry:   config.Retry{Tiers: tiers, Jitter: &jitter, TierQueues: layout},
			Accepts: []config.Accept{{Type: "test.event", Versions: []string{"1"}}},
		})
	}
	if err := cfg.Complete(); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// withManagement is a Broker on conn that uses the test broker's
// management API.
func withManagement(t *testing.T, env *brokertest.Env, conn *amqp.Connection) *topology.Broker {
	t.Helper()
	env.RequireManagement()
	m, err := topology.NewManagement(env.ManagementURL, env.URL)
	if err != nil {
		t.Fatal(err)
	}
	in := &topology.Broker{Conn: conn}
	if err := in.UseManagement(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	return in
}

// appliedShared applies sharedConfig on shared tiers named from the test's
// prefix, and returns the broker with the management API.
func appliedShared(t *testing.T) (*brokertest.Env, *topology.Broker, *topology.Topology) {
	t.Helper()
	env := brokertest.Require(t)
	conn := env.Dial("topology")
	in := withManagement(t, env, conn)
	topo, err := topology.BuildFor(sharedConfig(t, env.Prefix, config.TierQueuesShared), conn)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := in.Apply(context.Background(), topo); err != nil {
		t.Fatal(err)
	}
	return env, in, topo
}

// Verify checks the shared objects like the config's own: the return
// exchange internal with its alternate exchange, and no binding on the
// shared exchanges that takes retries somewhere else. Another config's
// tier and work queue bound there the way the runtime binds them are not
// drift; a queue bound to the return exchange under a work queue's name is.
func TestVerifyChecksTheSharedTiers(t *testing.T) {
	t.Parallel()
	env, in, topo := appliedShared(t)
	ctx := context.Background()
	r, err := in.Verify(ctx, topo)
	if err != nil {
		t.Fatal(err)
	}
	if !r.OK() {
		t.Fatalf("verify right after apply: %v", r.Problems)
	}
	ch := env.Channel("other")
	declare := func(name string) {
		if _, err := ch.QueueDeclare(name, true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
			t.Fatal(err)
		}
	}
	ret, delay := env.Prefix+".return", env.Prefix+".delay"
	// Another config's tier and work queue: as the runtime binds them.
	otherTier, otherWork, spy := delay+".9s", env.Name("other"), env.Name("spy")
	for _, q := range []string{otherTier, otherWork, spy} {
		declare(q)
	}
	for _, b := range [][3]string{{otherTier, otherTier, delay}, {otherWork, otherWork, ret}, {spy, env.Prefix + ".a", ret}} {
		if err := ch.QueueBind(b[0], b[1], b[2], false, nil); err != nil {
			t.Fatal(err)
		}
	}
	if r, err = in.Verify(ctx, topo); err != nil {
		t.Fatal(err)
	}
	if len(r.Problems) != 1 || r.Problems[0].Issue != topology.IssueUnexpectedBinding || !strings.Contains(r.Problems[0].Object, spy) {
		t.Fatalf("verify with a spy on the return exchange: %v", r.Problems)
	}
}

// The move from per-queue lanes: plan on a broker that has them lists each
// as retired with what it holds; apply declares the shared tiers and
// leaves the lanes as they are; what waits in an old lane still comes back
// to its queue; delete --retired keeps a lane while it holds a message and
// removes it, and its exchange, once it is empty.
func TestMigrationFromPerQueueLanes(t *testing.T) {
	t.Parallel()
	env := brokertest.Require(t)
	conn := env.Dial("topology")
	in := withManagement(t, env, conn)
	ctx := context.Background()
	// The waiting message must outlast plan, apply and the first delete
	// (which must keep its lane): with a 3 s lane, 3.10.8 under a load
	// average of 30 let it expire back to a first, and the delete rightly
	// removed the empty lane.
	const wait = 12 * time.Second
	old, err := topology.BuildFor(sharedConfigWith(t, env.Prefix, config.TierQueuesPerQueue, 1500*time.Millisecond, wait), conn)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := in.Apply(ctx, old); err != nil {
		t.Fatal(err)
	}
	oldA, _ := old.WorkQueue(env.Prefix + ".a")
	lane := oldA.Tiers[1].Lanes[0] // 12 s
	pub, err := amqpPublisher(env)
	if err != nil {
		t.Fatal(err)
	}
	sent := time.Now()
	if err := pub(oldA.RetryExchange, lane.RoutingKey, amqp.Publishing{MessageId: "waiting", Body: []byte("x")}); err != nil {
		t.Fatal(err)
	}

	topo, err := topology.BuildFor(sharedConfigWith(t, env.Prefix, config.TierQueuesShared, 1500*time.Millisecond, wait), conn)
	if err != nil {
		t.Fatal(err)
	}
	p, err := in.Plan(ctx, topo)
	if err != nil {
		t.Fatal(err)
	}
	var text strings.Builder
	if err := p.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	t.Logf("plan:\n%s", text.String())
	if p.Summary.Retired != 2+4 || p.Summary.Conflict != 0 { // a's and b's exchange and two lanes each
		t.Errorf("plan: %+v", p.Summary)
	}
	if want := "retired   queue '" + lane.Queue + "': " + oldA.Name + "'s own retry lane holding 1 message(s), which still return to " + oldA.Name; !strings.Contains(text.String(), want) {
		t.Errorf("plan does not say %q", want)
	}
	if _, err := in.Apply(ctx, topo); err != nil {
		t.Fatal(err)
	}
	// Applied: the shared tiers exist, and the old lane is still there.
	r, err := in.Delete(ctx, topo, topology.DeleteOptions{Retired: true})
	if err != nil {
		t.Fatal(err)
	}
	// The empty lanes go (a's and b's 1.5 s, b's 12 s, and b's exchange);
	// the lane with a message stays, and so does a's exchange, which
	// leads to it.
	if kept := r.Kept(); r.Summary.Deleted != 4 || len(kept) != 2 || !strings.Contains(strings.Join(kept, " "), lane.Queue) {
		t.Fatalf("delete --retired with a message in %s: deleted %d, kept %v", lane.Queue, r.Summary.Deleted, kept)
	}
	ch := env.Channel("consume")
	ds, err := ch.Consume(oldA.Name, "", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case d := <-ds:
		_ = d.Ack(false)
		// It must have waited out the lane's TTL, not come back at once;
		// 3.10.8 expires a quorum queue's head up to some tens of
		// milliseconds before the TTL as timed from here.
		if d.MessageId != "waiting" || time.Since(sent) < lane.MinDelay-250*time.Millisecond {
			t.Fatalf("got %q after %s", d.MessageId, time.Since(sent))
		}
	case <-time.After(lane.MaxDelay + 10*time.Second):
		t.Fatal("the message in the old lane did not come back")
	}
	r, err = in.Delete(ctx, topo, topology.DeleteOptions{Retired: true})
	if err != nil {
		t.Fatal(err)
	}
	if !r.OK() || r.Summary.Deleted != 2 {
		var b strings.Builder
		_ = r.WriteText(&b)
		t.Fatalf("delete --retired once empty:\n%s", b.String())
	}
	if _, err := in.Mgmt.Queue(ctx, lane.Queue); !errors.Is(err, topology.ErrNotFound) {
		t.Errorf("%s is still there (%v)", lane.Queue, err)
	}
	if _, err := in.Mgmt.Exchange(ctx, oldA.RetryExchange); !errors.Is(err, topology.ErrNotFound) {
		t.Errorf("%s is still there (%v)", oldA.RetryExchange, err)
	}
	if v, err := in.Verify(ctx, topo); err != nil || !v.OK() {
		t.Fatalf("verify after the move: %v %v", err, v.Problems)
	}
}

// amqpPublisher publishes with mandatory and waits for the confirm; a
// basic.return is an error.
func amqpPublisher(env *brokertest.Env) (func(exchange, key string, p amqp.Publishing) error, error) {
	ch, err := env.Dial("publisher").Channel()
	if err != nil {
		return nil, err
	}
	if err := ch.Confirm(false); err != nil {
		return nil, err
	}
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, 1))
	returns := ch.NotifyReturn(make(chan amqp.Return, 1))
	return func(exchange, key string, p amqp.Publishing) error {
		if err := ch.PublishWithContext(context.Background(), exchange, key, true, false, p); err != nil {
			return err
		}
		select {
		case r := <-returns:
			<-confirms
			return errors.New("returned: " + r.ReplyText)
		case c := <-confirms:
			if !c.Ack {
				return errors.New("nacked")
			}
			return nil
		case <-time.After(10 * time.Second):
			return errors.New("no confirm")
		}
	}, nil
}

// A producer cannot use the shared tiers to reach a queue it could not
// publish to before. With the permissions docs/topology.md recommends
// (write on its own work exchanges only), publishing to the delay or the
// return exchange is refused; and the return exchange is internal, so even
// a user that may write everywhere cannot publish to it: only the broker's
// dead-lettering routes into it.
func TestProducerCannotReachAWorkQueueThroughTheSharedTiers(t *testing.T) {
	t.Parallel()
	env := brokertest.Require(t)
	conn := env.Dial("topology")
	cfg := sharedConfig(t, env.Prefix, config.TierQueuesShared)
	topo, err := topology.BuildFor(cfg, conn)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := (&topology.Broker{Conn: conn}).Apply(context.Background(), topo); err != nil {
		t.Fatal(err)
	}
	b := cfg.Queues[1]
	producer := env.User(brokertest.Permissions{Configure: "^$", Write: "^" + strings.ReplaceAll(cfg.Queues[0].Exchange.Name, ".", `\.`) + "$", Read: "^$"})
	everything := env.User(brokertest.Permissions{Configure: "^$", Write: ".*", Read: "^$"})
	lane := topo.Work[1].Tiers[0].Lanes[0].Queue
	try := func(url, exchange, key string) error {
		c, err := amqp.DialConfig(url, amqp.Config{Properties: amqp.Table{"connection_name": env.Prefix + "/producer"}})
		if err != nil {
			return err
		}
		defer c.Close()
		ch, err := c.Channel()
		if err != nil {
			return err
		}
		closed := ch.NotifyClose(make(chan *amqp.Error, 1))
		if err := ch.Confirm(false); err != nil {
			return err
		}
		confirms := ch.NotifyPublish(make(chan amqp.Confirmation, 1))
		h := amqp.Table{wire.HeaderCC: []any{b.Name}}
		if err := ch.PublishWithContext(context.Background(), exchange, key, false, false, amqp.Publishing{Headers: h, Body: []byte("x")}); err != nil {
			return err
		}
		select {
		case e := <-closed:
			return e
		case <-confirms:
			return nil
		case <-time.After(10 * time.Second):
			return errors.New("no answer")
		}
	}
	refused := func(err error) bool {
		var ae *amqp.Error
		return errors.As(err, &ae) && ae.Code == amqp.AccessRefused
	}
	for _, tc := range []struct {
		who, url, exchange, key string
	}{
		{"producer", producer, topo.Work[1].RetryExchange, lane},
		{"producer", producer, topo.Work[1].ReturnExchange, b.Name},
		{"a user that may write anywhere", everything, topo.Work[1].ReturnExchange, b.Name},
	} {
		if err := try(tc.url, tc.exchange, tc.key); !refused(err) {
			t.Errorf("%s publishing to %s: %v, want ACCESS_REFUSED", tc.who, tc.exchange, err)
		}
	}
	// What the producer may do still works, and its CC routes on its own
	// exchange only (where b is not bound under its name).
	if err := try(producer, cfg.Queues[0].Exchange.Name, "a"); err != nil {
		t.Fatalf("producer publishing to its exchange: %v", err)
	}
	ch := env.Channel("depth")
	for name, want := range map[string]int{cfg.Queues[0].Name: 1, b.Name: 0, lane: 0} {
		q, err := ch.QueueDeclarePassive(name, true, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		if q.Messages != want {
			t.Errorf("%s holds %d, want %d", name, q.Messages, want)
		}
	}
}

// Deleting a config on shared tiers removes its tiers only when no other
// config's work queue returns through them: with another queue bound to the
// return exchange, every shared object stays (its retries wait in the same
// tiers); without, the delete leaves nothing of the shared tiers but the
// catch-all's streams (data, kept unless --include-data).
func TestDeleteKeepsSharedTiersAnotherConfigUses(t *testing.T) {
	t.Parallel()
	env := brokertest.Require(t)
	conn := env.Dial("topology")
	in := withManagement(t, env, conn)
	ctx := context.Background()
	topo, err := topology.BuildFor(sharedConfig(t, env.Prefix, config.TierQueuesShared), conn)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := in.Apply(ctx, topo); err != nil {
		t.Fatal(err)
	}
	other := env.Name("other")
	ch := env.Channel("other")
	if _, err := ch.QueueDeclare(other, true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
		t.Fatal(err)
	}
	ret := topo.Work[0].ReturnExchange
	if err := ch.QueueBind(other, other, ret, false, nil); err != nil {
		t.Fatal(err)
	}
	r, err := in.Delete(ctx, topo, topology.DeleteOptions{DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range r.Steps {
		shared := strings.Contains(s.Object, env.Prefix+".delay") || strings.Contains(s.Object, env.Prefix+".return") || strings.Contains(s.Object, env.Prefix+".unrouted")
		if shared && s.Action != topology.DeleteKept {
			t.Errorf("%s: %s, want kept while %s returns through %s", s.Object, s.Action, other, ret)
		}
		if shared && s.Kind == topology.KindQueue && !strings.Contains(s.Reason, other) && !strings.Contains(s.Reason, "stream") {
			t.Errorf("%s kept for %q, which does not name %s", s.Object, s.Reason, other)
		}
		if !shared && s.Action != topology.DeleteWould && !strings.Contains(s.Reason, "stream") {
			t.Errorf("%s: %s (%s), want would delete", s.Object, s.Action, s.Reason)
		}
	}
	if _, err := ch.QueueDelete(other, false, false, false); err != nil {
		t.Fatal(err)
	}
	if r, err = in.Delete(ctx, topo, topology.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, s := range r.Steps {
		stream := strings.HasSuffix(s.Object, ".records'") || strings.HasSuffix(s.Object, ".events'")
		if stream != (s.Action == topology.DeleteKept) {
			t.Errorf("%s: %s (%s)", s.Object, s.Action, s.Reason)
		}
	}
}
