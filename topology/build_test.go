package topology_test

import (
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/dlxbridge/dlxbridge/config"
	"github.com/dlxbridge/dlxbridge/topology"
)

// shortConfig is one work queue with short tiers and no jitter, every name
// starting with prefix.
func shortConfig(t testing.TB, prefix string, deliveryLimit int) *config.Config {
	t.Helper()
	jitter := 0.0
	cfg := &config.Config{Queues: []config.Queue{{
		Name:          prefix + ".work",
		Exchange:      config.Exchange{Name: prefix + ".ex", Type: "direct"},
		Bindings:      []string{"k"},
		DeliveryLimit: deliveryLimit,
		Retry:         config.Retry{Tiers: []time.Duration{200 * time.Millisecond, 400 * time.Millisecond}, Jitter: &jitter},
		Accepts:       []config.Accept{{Type: "test.event", Versions: []string{"1"}}},
	}}}
	cfg.ApplyDefaults()
	if err := cfg.Validate(); err != nil {
		t.Fatalf("test config: %v", err)
	}
	return cfg
}

func mustVersion(t *testing.T, s string) topology.BrokerVersion {
	t.Helper()
	v, err := topology.VersionFromProperties(map[string]any{"version": s, "product": "RabbitMQ"})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestBuildIsVersionAware(t *testing.T) {
	t.Parallel()
	cfg := shortConfig(t, "p", 3)
	for _, tc := range []struct {
		version        string
		quarantineArgs map[string]any
	}{
		// 3.x: -1 would dead-letter on the first requeue; no limit at all
		// is the right thing (3.x has no default limit).
		{"3.10.8", map[string]any{topology.ArgQueueType: "quorum", topology.ArgOverflow: "reject-publish"}},
		{"3.13.7", map[string]any{topology.ArgQueueType: "quorum", topology.ArgOverflow: "reject-publish"}},
		// 4.x applies a default limit of 20 to every quorum queue; the
		// quarantine has no DLX, so it must be disabled.
		{"4.0.0", map[string]any{topology.ArgQueueType: "quorum", topology.ArgOverflow: "reject-publish", topology.ArgDeliveryLimit: int64(-1)}},
		{"4.1.0-rc.1", map[string]any{topology.ArgQueueType: "quorum", topology.ArgOverflow: "reject-publish", topology.ArgDeliveryLimit: int64(-1)}},
	} {
		t.Run(tc.version, func(t *testing.T) {
			v := mustVersion(t, tc.version)
			topo, err := topology.Build(cfg, v)
			if err != nil {
				t.Fatal(err)
			}
			if topo.Broker != v {
				t.Fatalf("topology built for %v, want %v", topo.Broker, v)
			}
			for _, q := range topo.Queues {
				if lim, ok := q.Args[topology.ArgDeliveryLimit]; ok && v.Major < 4 && topology.FormatArg(lim) == "-1" {
					t.Errorf("%s: x-delivery-limit=-1 sent to %s", q.Name, v)
				}
				isStream := q.Role == topology.RoleRecords || q.Role == topology.RoleEvents
				if !isStream && q.Args[topology.ArgQueueType] != topology.QueueTypeQuorum {
					t.Errorf("%s: not a quorum queue: %v", q.Name, q.Args)
				}
				if isStream && (q.Args[topology.ArgQueueType] != topology.QueueTypeStream || q.Args[topology.ArgMaxAge] == nil) {
					t.Errorf("%s: not a stream with x-max-age: %v", q.Name, q.Args)
				}
				switch q.Role {
				case topology.RoleQuarantine:
					if got, want := fmtArgs(q.Args), fmtArgs(tc.quarantineArgs); got != want {
						t.Errorf("quarantine args %s, want %s", got, want)
					}
				case topology.RoleWork, topology.RoleRetry:
					// At-least-once dead-lettering needs reject-publish and a DLX.
					if q.Args[topology.ArgDeadLetterStrategy] != topology.StrategyAtLeastOnce ||
						q.Args[topology.ArgOverflow] != topology.OverflowReject {
						t.Errorf("%s: at-least-once args missing: %v", q.Name, q.Args)
					}
					if _, ok := q.Args[topology.ArgDeadLetterExchange]; !ok {
						t.Errorf("%s: no DLX: %v", q.Name, q.Args)
					}
				}
				if q.Role == topology.RoleWork && topology.FormatArg(q.Args[topology.ArgDeliveryLimit]) != "3" {
					t.Errorf("work queue delivery limit %v, want 3", q.Args[topology.ArgDeliveryLimit])
				}
			}
		})
	}
}

func TestRetryLanesReturnToTheirOwnWorkQueue(t *testing.T) {
	t.Parallel()
	topo, err := topology.Build(shortConfig(t, "p", 3), mustVersion(t, "3.10.8"))
	if err != nil {
		t.Fatal(err)
	}
	w, ok := topo.WorkQueue("p.work")
	if !ok || len(w.Tiers) != 2 {
		t.Fatalf("work queue %+v", w)
	}
	for _, tier := range w.Tiers {
		for _, lane := range tier.Lanes {
			var spec *topology.QueueSpec
			for i := range topo.Queues {
				if topo.Queues[i].Name == lane.Queue {
					spec = &topo.Queues[i]
				}
			}
			if spec == nil {
				t.Fatalf("lane %s not declared", lane.Queue)
			}
			// Dead-lettered through the default exchange by queue name:
			// only the work queue, never others bound to its exchange.
			if spec.Args[topology.ArgDeadLetterExchange] != "" || spec.Args[topology.ArgDeadLetterRK] != w.Name {
				t.Errorf("%s dead-letters to %v/%v", lane.Queue, spec.Args[topology.ArgDeadLetterExchange], spec.Args[topology.ArgDeadLetterRK])
			}
			if got := topology.FormatArg(spec.Args[topology.ArgMessageTTL]); got != topology.FormatArg(lane.MaxDelay.Milliseconds()) {
				t.Errorf("%s TTL %s, want %s", lane.Queue, got, lane.MaxDelay)
			}
		}
	}
}

// fmtArgs renders every argument, sorted, with FormatArg.
func fmtArgs(m map[string]any) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + topology.FormatArg(m[k])
	}
	return strings.Join(parts, " ")
}

// twoQueueConfig is queues a and b, defaulted but not validated, so Build
// sees what a caller that skips validation would hand it.
func twoQueueConfig(edit func(a, b *config.Queue)) *config.Config {
	cfg := &config.Config{Queues: []config.Queue{
		{Name: "a", Exchange: config.Exchange{Name: "a"}, Accepts: []config.Accept{{Type: "t", Versions: []string{"1"}}}},
		{Name: "b", Exchange: config.Exchange{Name: "b"}, Accepts: []config.Accept{{Type: "t", Versions: []string{"1"}}}},
	}}
	edit(&cfg.Queues[0], &cfg.Queues[1])
	cfg.ApplyDefaults()
	return cfg
}

// The collision from the hardening issue: b's quarantine named like a's
// first retry lane. Build kept the first object, so b's dead letters went to
// a's TTL lane and from there into a. It must refuse instead.
func TestBuildRefusesTwoObjectsWithOneName(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		edit func(a, b *config.Queue)
		want []string
	}{
		{"quarantine named like a retry lane", func(a, b *config.Queue) { b.Quarantine.Queue = "a.retry.1s.l0" },
			[]string{`queue "a.retry.1s.l0"`, `retry lane 0 of 1s of queue "a"`, `quarantine of queue "b"`}},
		{"work exchange named like a dead-letter exchange", func(a, b *config.Queue) { b.Exchange.Name = "a.dead" },
			[]string{`exchange "a.dead"`, `dead-letter exchange of queue "a"`, `work exchange of queue "b"`}},
		{"one exchange, two types", func(a, b *config.Queue) {
			a.Exchange = config.Exchange{Name: "x", Type: "topic"}
			b.Exchange = config.Exchange{Name: "x", Type: "direct"}
		}, []string{`exchange "x"`, "topic work exchange", "direct work exchange"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			topo, err := topology.Build(twoQueueConfig(tc.edit), mustVersion(t, "3.10.8"))
			if err == nil {
				t.Fatalf("Build accepted it: %d queues %d exchanges", len(topo.Queues), len(topo.Exchanges))
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}

func TestBuildSharesWhatTheConfigShares(t *testing.T) {
	t.Parallel()
	cfg := twoQueueConfig(func(a, b *config.Queue) {
		a.Exchange.Name, b.Exchange.Name = "events", "events"
		a.Quarantine.Queue, b.Quarantine.Queue = "parked", "parked"
	})
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	topo, err := topology.Build(cfg, mustVersion(t, "4.0.5"))
	if err != nil {
		t.Fatal(err)
	}
	count := map[string]int{}
	for _, x := range topo.Exchanges {
		count["exchange "+x.Name]++
	}
	for _, q := range topo.Queues {
		count["queue "+q.Name]++
	}
	if count["exchange events"] != 1 || count["queue parked"] != 1 {
		t.Errorf("shared objects declared %d and %d times, want once", count["exchange events"], count["queue parked"])
	}
	for _, dead := range []string{"a.dead", "b.dead"} {
		found := false
		for _, b := range topo.Bindings {
			found = found || (b.Exchange == dead && b.Queue == "parked")
		}
		if !found {
			t.Errorf("%s is not bound to the shared quarantine", dead)
		}
	}
}

// The shipped config's capacity, counted from what Build declares (the
// numbers docs/topology.md quotes): 1 work queue + tiers × lanes retry lanes
// + 1 quarantine per work queue.
func TestTotalsOfTheShippedConfig(t *testing.T) {
	t.Parallel()
	cfg, err := config.Load("../config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	topo, err := topology.Build(cfg, mustVersion(t, "4.0.5"))
	if err != nil {
		t.Fatal(err)
	}
	// As it would be on per-queue lanes (the shipped file uses the shared
	// tiers: TestSharedTiersOfTheShippedConfig).
	for i := range cfg.Queues {
		cfg.Queues[i].Retry.TierQueues = config.TierQueuesPerQueue
	}
	topo, err = topology.Build(cfg, mustVersion(t, "4.0.5"))
	if err != nil {
		t.Fatal(err)
	}
	got := topo.Totals()
	want := topology.Totals{WorkQueues: 2, QuorumQueues: 29, Streams: 4, Exchanges: 6, Bindings: 31, PerWorkQueue: []topology.WorkQueueTotals{
		{Name: "orders", QuorumQueues: 18, RetryLanes: 16, Streams: 2, Exchanges: 3, Bindings: 19},
		{Name: "notifications", QuorumQueues: 11, RetryLanes: 9, Streams: 2, Exchanges: 3, Bindings: 12},
	}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("totals\n got %+v\nwant %+v", got, want)
	}
	// Shared objects count once, for the first queue naming them.
	shared, err := topology.Build(twoQueueConfig(func(a, b *config.Queue) {
		a.Exchange.Name, b.Exchange.Name = "events", "events"
		a.Quarantine.Queue, b.Quarantine.Queue = "parked", "parked"
	}), mustVersion(t, "3.10.8"))
	if err != nil {
		t.Fatal(err)
	}
	st := shared.Totals()
	var q, x, bnd int
	for _, w := range st.PerWorkQueue {
		q, x, bnd = q+w.QuorumQueues, x+w.Exchanges, bnd+w.Bindings
	}
	if q != st.QuorumQueues || x != st.Exchanges || bnd != st.Bindings || st.PerWorkQueue[1].QuorumQueues != 17 || st.PerWorkQueue[1].Exchanges != 2 {
		t.Errorf("shared objects miscounted: %+v", st)
	}
}
