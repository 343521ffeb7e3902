package topology_test

import (
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
			topo := topology.Build(cfg, v)
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
	topo := topology.Build(shortConfig(t, "p", 3), mustVersion(t, "3.10.8"))
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
