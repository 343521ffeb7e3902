package consumer

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/config"
	"github.com/dlxbridge/dlxbridge/internal/brokertest"
	"github.com/dlxbridge/dlxbridge/schemas"
	"github.com/dlxbridge/dlxbridge/topology"
)

// capacityEnv, set to a number of work queues, runs
// TestHundredWorkQueuesWithinTheFileHandleLimit with that many (it needs a
// private 3.x node and some minutes, so it is not part of the suite).
const capacityEnv = "DLXBRIDGE_CAPACITY_QUEUES"

// N work queues with the default retry policy on the shared tiers, each
// with its own quarantine (or, with DLXBRIDGE_CAPACITY_SHARED_QUARANTINE,
// one quarantine for all), declared on a private 3.10 node whose open-files
// limit is Debian's 1024, consumed by one runtime, with a retry round trip
// on each: the node's file-handle use is logged before and after, and the
// node must still take new connections at the end (on 3.x each quorum
// queue takes file handles from the budget sockets come from).
func TestHundredWorkQueuesWithinTheFileHandleLimit(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv(capacityEnv))
	if n <= 0 {
		t.Skipf("set %s to a number of work queues to run it (a private node, minutes)", capacityEnv)
	}
	node := brokertest.StartPrivateNodeWithOpenFiles(t, 1024)
	env := node.Env(t)
	pid := node.PID()
	limit := node.OpenFilesLimit()
	t.Logf("node %s (pid %d): open files limit %s; before: %s", node.Name, pid, limit, node.FileHandles())

	sharedQuarantine := os.Getenv("DLXBRIDGE_CAPACITY_SHARED_QUARANTINE") != ""
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, testType), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, testType, "v1.json"), []byte(testJobSchema), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := &config.Config{Schemas: config.Schemas{Dir: dir}, SharedTiers: config.SharedTiers{Prefix: env.Prefix}}
	for i := range n {
		q := config.Queue{Name: env.Name(fmt.Sprintf("q%03d", i)), Exchange: config.Exchange{Name: env.Name("ex"), Type: "direct"},
			Bindings: []string{fmt.Sprintf("q%03d", i)}, Retry: config.Retry{TierQueues: config.TierQueuesShared},
			Consumer: config.Consumer{Prefetch: 5, Concurrency: 1},
			Accepts:  []config.Accept{{Type: testType, Versions: []string{"1"}}}}
		if sharedQuarantine {
			q.Quarantine.Queue = env.Name("quarantine")
		}
		cfg.Queues = append(cfg.Queues, q)
	}
	if err := cfg.Complete(); err != nil {
		t.Fatal(err)
	}
	conn := env.Dial("apply")
	topo, err := topology.BuildFor(cfg, conn)
	if err != nil {
		t.Fatal(err)
	}
	tot := topo.Totals()
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if _, err := (&topology.Broker{Conn: conn}).Apply(ctx, topo); err != nil {
		t.Fatalf("apply: %v", err)
	}
	t.Logf("declared %d quorum queues, %d streams, %d exchanges, %d bindings in %s; after apply: %s",
		tot.QuorumQueues, tot.Streams, tot.Exchanges, tot.Bindings, time.Since(start).Round(time.Second), node.FileHandles())

	w := &sharedWorld{t: t, env: env, all: cfg, topo: topo, exchange: env.Name("ex")}
	if w.registry, err = schemas.Load(schemas.LoadOptions{Dir: dir}); err != nil {
		t.Fatal(err)
	}
	if w.pubCh, err = env.Dial("test-publisher").Channel(); err != nil {
		t.Fatal(err)
	}
	if err := w.pubCh.Confirm(false); err != nil {
		t.Fatal(err)
	}
	w.confirms = w.pubCh.NotifyPublish(make(chan amqp.Confirmation, 256))
	var shorts, names []string
	for i := range n {
		shorts = append(shorts, fmt.Sprintf("q%03d", i))
		names = append(names, cfg.Queues[i].Name)
	}
	calls := make(chan arrival, 4*n)
	w.run(shorts, failOnce(calls, names...))
	t.Logf("one runtime consuming %d queues: %s", n, node.FileHandles())
	for _, s := range shorts {
		w.publish(s, "m-"+s, nil)
	}
	back := map[string]bool{}
	deadline := time.After(3 * time.Minute)
	for len(back) < n {
		select {
		case c := <-calls:
			if c.attempt == 2 {
				if c.queue != env.Name(strings.TrimPrefix(c.id, "m-")) {
					t.Fatalf("%s came back to %s", c.id, c.queue)
				}
				back[c.queue] = true
			}
		case <-deadline:
			t.Fatalf("%d of %d retries came back", len(back), n)
		}
	}
	t.Logf("every retry came back (%s after the apply); %s", time.Since(start).Round(time.Second), node.FileHandles())
	// A new connection still opens at once.
	probe, err := amqp.DialConfig(env.URL, amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
	if err != nil {
		t.Fatalf("a new connection at the end: %v", err)
	}
	_ = probe.Close()
}
