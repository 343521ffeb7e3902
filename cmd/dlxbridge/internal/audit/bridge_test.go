package audit_test

import (
	"path/filepath"
	"testing"

	"github.com/dlxbridge/dlxbridge/cmd/dlxbridge/internal/audit"
	"github.com/dlxbridge/dlxbridge/config"
	"github.com/dlxbridge/dlxbridge/topology"
)

// bridgeVhost is the repository's config.yaml as `topology apply` declares
// it on broker version v, in the shape the management API lists it.
func bridgeVhost(t *testing.T, v topology.BrokerVersion) *audit.Vhost {
	t.Helper()
	return bridgeVhostWith(t, v, "")
}

// bridgeVhostWith is bridgeVhost with every queue's retries waiting in
// tierQueues (config.TierQueuesShared or TierQueuesPerQueue; "" leaves
// config.yaml's choice).
func bridgeVhostWith(t *testing.T, v topology.BrokerVersion, tierQueues string) *audit.Vhost {
	t.Helper()
	cfg, err := config.Load(filepath.Join("..", "..", "..", "..", "config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if tierQueues != "" {
		for i := range cfg.Queues {
			cfg.Queues[i].Retry.TierQueues = tierQueues
		}
	}
	topo, err := topology.Build(cfg, v)
	if err != nil {
		t.Fatal(err)
	}
	vh := &audit.Vhost{Name: "/", Read: allRead}
	vh.Exchanges = append(vh.Exchanges, audit.Exchange{Name: "", Type: "direct", Arguments: map[string]any{}})
	for _, x := range topo.Exchanges {
		vh.Exchanges = append(vh.Exchanges, audit.Exchange{Name: x.Name, Type: x.Kind, Arguments: map[string]any{}})
	}
	for _, q := range topo.Queues {
		kind, _ := q.Args[topology.ArgQueueType].(string)
		vh.Queues = append(vh.Queues, audit.Queue{Name: q.Name, Type: kind, Durable: true, Arguments: q.Args, PolicyReported: true, EffectivePolicy: map[string]any{}})
		vh.Bindings = append(vh.Bindings, audit.Binding{Source: "", Destination: q.Name, DestinationType: "queue", RoutingKey: q.Name})
	}
	for _, b := range topo.Bindings {
		vh.Bindings = append(vh.Bindings, audit.Binding{Source: b.Exchange, Destination: b.Queue, DestinationType: "queue", RoutingKey: b.Key})
	}
	if len(topo.Queues) < 10 {
		t.Fatalf("config.yaml declares only %d queues", len(topo.Queues))
	}
	return vh
}
