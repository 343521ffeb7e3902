package config_test

import (
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/dlxbridge/dlxbridge/config"
)

// A configuration built in code and completed is the one Parse makes of the
// same document: defaults and rules are applied in one place.
func TestCompleteMatchesParse(t *testing.T) {
	t.Parallel()
	parsed, err := config.Parse([]byte(`queues:
  - name: orders
    exchange: {name: orders}
    bindings: [order.created]
    retry: {tiers: [1s], jitter: 0}
    accepts:
      - {type: orders.created, versions: ["v1", "2"]}
`))
	if err != nil {
		t.Fatal(err)
	}
	noJitter := 0.0
	built := &config.Config{Queues: []config.Queue{{
		Name:     "orders",
		Exchange: config.Exchange{Name: "orders"},
		Bindings: []string{"order.created"},
		Retry:    config.Retry{Tiers: []time.Duration{time.Second}, Jitter: &noJitter},
		Accepts:  []config.Accept{{Type: "orders.created", Versions: []string{"v1", "2"}}},
	}}}
	if err := built.Complete(); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(built, parsed) {
		t.Errorf("built in code:\n%+v\nparsed:\n%+v", built, parsed)
	}
	again := *built
	if err := again.Complete(); err != nil || !reflect.DeepEqual(&again, parsed) {
		t.Errorf("a second Complete changed the config or failed: %v", err)
	}
}

// Complete reports every problem of a code-built config with the path the
// same field has in config.yaml.
func TestCompleteReportsFieldPaths(t *testing.T) {
	t.Parallel()
	cfg := &config.Config{Queues: []config.Queue{{
		Name:     "orders",
		Consumer: config.Consumer{Prefetch: 5000},
		Accepts:  []config.Accept{{Type: "orders.created"}},
	}}}
	err := cfg.Complete()
	es, ok := config.AsErrors(err)
	if !ok {
		t.Fatalf("want config.Errors, got %v", err)
	}
	got := map[string]bool{}
	for _, e := range es {
		got[e.Path] = true
	}
	for _, want := range []string{"queues[0].exchange.name", "queues[0].consumer.prefetch", "queues[0].accepts[0].versions"} {
		if !got[want] {
			t.Errorf("no error for %s in:\n%v", want, err)
		}
	}
}

func ExampleConfig_Complete() {
	cfg := &config.Config{Queues: []config.Queue{{
		Name:     "orders",
		Exchange: config.Exchange{Name: "orders"},
		Bindings: []string{"order.created"},
		Accepts:  []config.Accept{{Type: "orders.created", Versions: []string{"1", "2"}}},
	}}}
	if err := cfg.Complete(); err != nil {
		fmt.Println(err)
		return
	}
	q := cfg.Queues[0]
	fmt.Println(q.Quarantine.Queue, q.DeliveryLimit, q.Retry.Tiers)
	// Output: orders.quarantine 5 [1s 5s 30s 2m0s]
}
