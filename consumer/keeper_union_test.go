package consumer

import (
	"io"
	"log/slog"
	"slices"
	"testing"

	"go.opentelemetry.io/otel/trace/noop"

	"github.com/dlxbridge/dlxbridge/config"
	"github.com/dlxbridge/dlxbridge/topology"
)

// Keepers compete for a shared intake: a process that handles only one of
// the work queues sharing a quarantine stores the broker dead letters of
// the others too, so its keeper must redact with every rule of every queue
// that names the quarantine in the config, not only of the queues it
// handles.
func TestKeeperRedactsWithTheRulesOfQueuesThisProcessDoesNotHandle(t *testing.T) {
	t.Parallel()
	file, err := config.Parse([]byte(`queues:
  - name: a
    exchange: {name: a}
    bindings: [a]
    gate: off
    quarantine: {queue: shared.quarantine, redact: {headers: [secret-a]}}
  - name: b
    exchange: {name: b}
    bindings: [b]
    gate: off
    quarantine: {queue: shared.quarantine, redact: {headers: [secret-b], fields: [/card]}}
`))
	if err != nil {
		t.Fatal(err)
	}
	c, err := New(&Config{URL: "amqp://guest:guest@127.0.0.1:5672/", File: file, SigningKey: []byte("0123456789abcdef-union"),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), TracerProvider: noop.NewTracerProvider()})
	if err != nil {
		t.Fatal(err)
	}
	v, _ := topology.ParseBrokerVersion("3.10.8")
	topo, err := topology.Build(file, v)
	if err != nil {
		t.Fatal(err)
	}
	wq, _ := topo.WorkQueue("a")
	rules := keeperRedactions([]*queueSession{{deps: c.deps, q: c.queues["a"], wq: wq}})
	got := rules[wq.Quarantine]
	if !slices.Contains(got.Headers, "secret-b") || !slices.Contains(got.Fields, "/card") || !slices.Contains(got.Headers, "secret-a") {
		t.Errorf("the keeper of %s redacts %+v: b's rules left out", wq.Quarantine, got)
	}
}
