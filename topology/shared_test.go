package topology_test

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/dlxbridge/dlxbridge/config"
	"github.com/dlxbridge/dlxbridge/topology"
)

// shippedShared is the shipped config.yaml with every queue on the given
// tier layout.
func shippedWith(t *testing.T, layout string) *config.Config {
	t.Helper()
	cfg, err := config.Load("../config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for i := range cfg.Queues {
		cfg.Queues[i].Retry.TierQueues = layout
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// generatedConfig is n work queues with the default retry policy, each
// bound to an exchange of its own, with the given tier layout.
func generatedConfig(t testing.TB, n int, layout string) *config.Config {
	t.Helper()
	cfg := &config.Config{}
	for i := range n {
		name := fmt.Sprintf("gen%03d", i)
		cfg.Queues = append(cfg.Queues, config.Queue{Name: name, Exchange: config.Exchange{Name: name},
			Retry: config.Retry{TierQueues: layout}, Gate: config.GateOff})
	}
	if err := cfg.Complete(); err != nil {
		t.Fatal(err)
	}
	return cfg
}

func queueSpec(topo *topology.Topology, name string) (topology.QueueSpec, bool) {
	for _, q := range topo.Queues {
		if q.Name == name {
			return q, true
		}
	}
	return topology.QueueSpec{}, false
}

// The shipped config on shared tiers: a tier queue per distinct lane TTL
// (the two queues' policies share none), dead-lettering to the return
// exchange without a routing key of its own; the return exchange internal,
// with the unrouted exchange as its alternate, routed to a catch-all
// quarantine; one return binding per work queue; the per-queue lanes kept
// aside as retired.
func TestSharedTiersOfTheShippedConfig(t *testing.T) {
	t.Parallel()
	topo, err := topology.Build(shippedWith(t, config.TierQueuesShared), mustVersion(t, "4.0.5"))
	if err != nil {
		t.Fatal(err)
	}
	got := topo.Totals()
	want := topology.Totals{WorkQueues: 2, QuorumQueues: 30, Streams: 6, Exchanges: 7, Bindings: 34,
		Shared: &topology.WorkQueueTotals{Name: "dlxbridge", QuorumQueues: 26, RetryLanes: 25, Streams: 2, Exchanges: 3, Bindings: 26},
		PerWorkQueue: []topology.WorkQueueTotals{
			{Name: "orders", QuorumQueues: 2, Streams: 2, Exchanges: 2, Bindings: 4},
			{Name: "notifications", QuorumQueues: 2, Streams: 2, Exchanges: 2, Bindings: 4},
		}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("totals\n got %+v %+v\nwant %+v %+v", got, got.Shared, want, want.Shared)
	}
	orders, _ := topo.WorkQueue("orders")
	if orders.RetryExchange != "dlxbridge.delay" || orders.ReturnExchange != "dlxbridge.return" || !orders.Shared() {
		t.Errorf("orders retries through %q, returns through %q", orders.RetryExchange, orders.ReturnExchange)
	}
	lane := orders.Tiers[0].Lanes[0]
	if lane.Queue != "dlxbridge.delay.1.05s" || lane.RoutingKey != lane.Queue || lane.MinDelay != time.Second || lane.MaxDelay != 1050*time.Millisecond {
		t.Errorf("orders' first lane: %+v", lane)
	}
	tier, ok := queueSpec(topo, lane.Queue)
	if !ok {
		t.Fatalf("no queue %s", lane.Queue)
	}
	if tier.Owner != "" || tier.Role != topology.RoleRetry || tier.Args[topology.ArgDeadLetterExchange] != "dlxbridge.return" || tier.Args[topology.ArgMessageTTL] != int64(1050) {
		t.Errorf("tier %s: %+v", tier.Name, tier)
	}
	if _, has := tier.Args[topology.ArgDeadLetterRK]; has {
		t.Errorf("tier %s has a dead-letter routing key: the CC would be dropped (%v)", tier.Name, tier.Args)
	}
	exchanges := map[string]topology.ExchangeSpec{}
	for _, x := range topo.Exchanges {
		exchanges[x.Name] = x
	}
	if x := exchanges["dlxbridge.delay"]; x.Kind != "direct" || x.Internal || x.Owner != "" {
		t.Errorf("delay exchange: %+v", x)
	}
	if x := exchanges["dlxbridge.return"]; x.Kind != "direct" || !x.Internal || x.Args[topology.ArgAlternateExchange] != "dlxbridge.return.unrouted" {
		t.Errorf("return exchange: %+v", x)
	}
	if x := exchanges["dlxbridge.return.unrouted"]; x.Kind != "fanout" || !x.Internal {
		t.Errorf("unrouted exchange: %+v", x)
	}
	if _, has := exchanges["orders.retry"]; has {
		t.Error("orders.retry is declared for a queue on shared tiers")
	}
	catchAll, ok := queueSpec(topo, "dlxbridge.unrouted")
	if !ok || catchAll.Role != topology.RoleQuarantine || catchAll.Args[topology.ArgDeliveryLimit] != int64(-1) {
		t.Errorf("catch-all: %+v (found %t)", catchAll, ok)
	}
	for _, s := range []string{"dlxbridge.unrouted.records", "dlxbridge.unrouted.events"} {
		if _, ok := queueSpec(topo, s); !ok {
			t.Errorf("no stream %s", s)
		}
	}
	bindings := map[topology.BindingSpec]bool{}
	for _, b := range topo.Bindings {
		bindings[b] = true
	}
	for _, b := range []topology.BindingSpec{
		{Exchange: "dlxbridge.return", Queue: "orders", Key: "orders"},
		{Exchange: "dlxbridge.return", Queue: "notifications", Key: "notifications"},
		{Exchange: "dlxbridge.delay", Queue: lane.Queue, Key: lane.Queue},
		{Exchange: "dlxbridge.return.unrouted", Queue: "dlxbridge.unrouted", Key: ""},
	} {
		if !bindings[b] {
			t.Errorf("missing binding %+v", b)
		}
	}
	if orders.PerQueue == nil || orders.PerQueue.Exchange != "orders.retry" || orders.PerQueue.Tiers[0].Lanes[0].Queue != "orders.retry.1s.l0" {
		t.Errorf("orders' own lanes: %+v", orders.PerQueue)
	}
	if r := topo.Retired; r == nil || len(r.Queues) != 25 || len(r.Exchanges) != 2 || len(r.Bindings) != 25 {
		t.Errorf("retired: %+v", r)
	} else if q := r.Queues[0]; q.Name != "orders.retry.1s.l0" || q.Args[topology.ArgDeadLetterRK] != "orders" || q.Args[topology.ArgDeadLetterExchange] != "" {
		t.Errorf("retired lane: %+v", q)
	}
}

// A tier is named by its TTL: two queues with one policy share every tier
// queue, two with different tiers each get their own, and a tier they have
// in common (same delay, jitter and lanes) is one queue.
func TestEqualTiersShareAQueue(t *testing.T) {
	t.Parallel()
	same, err := topology.Build(generatedConfig(t, 2, config.TierQueuesShared), mustVersion(t, "3.10.8"))
	if err != nil {
		t.Fatal(err)
	}
	if s := same.Totals().Shared; s == nil || s.RetryLanes != 16 {
		t.Fatalf("two queues with the default policy: %+v", s)
	}
	a, b := same.Work[0], same.Work[1]
	if !reflect.DeepEqual(a.Tiers, b.Tiers) {
		t.Errorf("one policy, different lanes:\n%+v\n%+v", a.Tiers, b.Tiers)
	}
	cfg := generatedConfig(t, 2, config.TierQueuesShared)
	cfg.Queues[1].Retry.Tiers = []time.Duration{time.Second, 3 * time.Second}
	diff, err := topology.Build(cfg, mustVersion(t, "3.10.8"))
	if err != nil {
		t.Fatal(err)
	}
	if s := diff.Totals().Shared; s.RetryLanes != 20 { // 16 + the 4 lanes of 3s
		t.Errorf("different tiers: %d tier queues, want 20", s.RetryLanes)
	}
	if diff.Work[0].Tiers[0].Lanes[0].Queue != diff.Work[1].Tiers[0].Lanes[0].Queue {
		t.Error("1s is not shared")
	}
	if diff.Work[1].Tiers[1].Lanes[0].Queue != "dlxbridge.delay.3.15s" {
		t.Errorf("3s lane 0 waits in %s", diff.Work[1].Tiers[1].Lanes[0].Queue)
	}
}

// A tier queue's name and its x-message-ttl come from two packages
// (config names it, topology declares it): they must agree, or two
// policies would share a name with different TTLs.
func TestTierNameIsItsTTL(t *testing.T) {
	t.Parallel()
	for _, jitter := range []float64{0, 0.001, 0.13, 0.2, 0.37, 1} {
		for _, lanes := range []int{1, 3, 4, 7, 16} {
			cfg := generatedConfig(t, 1, config.TierQueuesShared)
			j := jitter
			cfg.Queues[0].Retry.Jitter, cfg.Queues[0].Retry.Lanes = &j, lanes
			cfg.Queues[0].Retry.Tiers = []time.Duration{333 * time.Millisecond, 7 * time.Second, 90 * time.Minute}
			if err := cfg.Validate(); err != nil {
				t.Fatal(err)
			}
			topo, err := topology.Build(cfg, mustVersion(t, "4.3.6"))
			if err != nil {
				t.Fatal(err)
			}
			for _, q := range topo.Queues {
				if q.Role != topology.RoleRetry {
					continue
				}
				d, err := time.ParseDuration(strings.TrimPrefix(q.Name, "dlxbridge.delay."))
				if err != nil || d.Milliseconds() != q.Args[topology.ArgMessageTTL] {
					t.Errorf("jitter %g lanes %d: %s has x-message-ttl %v", jitter, lanes, q.Name, q.Args[topology.ArgMessageTTL])
				}
			}
		}
	}
}

// What a work queue costs with the default policy, per-queue and shared,
// for 10 and 100 queues: the shared tiers are a constant 17 quorum queues,
// 2 streams and 3 exchanges, and each queue adds its own queue, its
// quarantine and one binding. Logged for docs/topology.md.
func TestTotalsGrowByOneQueuePerWorkQueue(t *testing.T) {
	t.Parallel()
	for _, n := range []int{1, 10, 100} {
		own, err := topology.Build(generatedConfig(t, n, config.TierQueuesPerQueue), mustVersion(t, "3.10.8"))
		if err != nil {
			t.Fatal(err)
		}
		shared, err := topology.Build(generatedConfig(t, n, config.TierQueuesShared), mustVersion(t, "3.10.8"))
		if err != nil {
			t.Fatal(err)
		}
		o, s := own.Totals(), shared.Totals()
		t.Logf("%3d work queues: per-queue %d quorum queues, %d streams, %d exchanges, %d bindings; shared %d, %d, %d, %d",
			n, o.QuorumQueues, o.Streams, o.Exchanges, o.Bindings, s.QuorumQueues, s.Streams, s.Exchanges, s.Bindings)
		if o.QuorumQueues != 18*n || o.Streams != 2*n || o.Exchanges != 3*n || o.Bindings != 18*n {
			t.Errorf("per-queue, %d queues: %d, %d, %d, %d", n, o.QuorumQueues, o.Streams, o.Exchanges, o.Bindings)
		}
		if s.QuorumQueues != 17+2*n || s.Streams != 2+2*n || s.Exchanges != 3+2*n || s.Bindings != 17+3*n {
			t.Errorf("shared, %d queues: %d, %d, %d, %d", n, s.QuorumQueues, s.Streams, s.Exchanges, s.Bindings)
		}
		for _, w := range s.PerWorkQueue {
			if w.QuorumQueues != 2 || w.RetryLanes != 0 || w.Bindings != 3 {
				t.Errorf("shared, %s adds %+v", w.Name, w)
			}
		}
	}
}

// With one quarantine for every queue as well (queues naming one
// quarantine.queue share it), a work queue on the shared tiers costs one
// quorum queue of its own, its Q.dead exchange and its bindings: the
// figures docs/topology.md gives for 100 queues on 3.10.8.
func TestSharedQuarantineAndTiersCostOneQueuePerWorkQueue(t *testing.T) {
	t.Parallel()
	cfg := generatedConfig(t, 100, config.TierQueuesShared)
	for i := range cfg.Queues {
		cfg.Queues[i].Quarantine.Queue = "parked"
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	topo, err := topology.Build(cfg, mustVersion(t, "3.10.8"))
	if err != nil {
		t.Fatal(err)
	}
	tot := topo.Totals()
	if tot.QuorumQueues != 118 || tot.Streams != 4 || tot.Exchanges != 203 || tot.Bindings != 317 {
		t.Errorf("totals: %d quorum queues, %d streams, %d exchanges, %d bindings; want 118, 4, 203, 317", tot.QuorumQueues, tot.Streams, tot.Exchanges, tot.Bindings)
	}
	for _, w := range tot.PerWorkQueue[1:] {
		if w.QuorumQueues != 1 || w.Streams != 0 || w.Bindings != 3 {
			t.Errorf("%s adds %+v", w.Name, w)
		}
	}
}
