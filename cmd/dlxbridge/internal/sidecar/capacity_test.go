package sidecar

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/internal/brokertest"
)

// runCapacityEnv, set to a number of work queues, runs
// TestWorkQueuesUnderOneRunWithinTheFileHandleLimit with that many (a
// private 3.x node and some minutes: not part of the suite).
const runCapacityEnv = "DLXBRIDGE_RUN_CAPACITY_QUEUES"

// N work queues with the default retry policy on the shared delay tiers,
// each with its own quarantine (or, with
// DLXBRIDGE_CAPACITY_SHARED_QUARANTINE, one quarantine for all), applied
// and consumed by one `dlxbridge run` process on a private 3.10 node whose
// open-files limit is Debian's 1024. Every queue's first message is
// answered 500 (a transient failure: retried through a shared tier) and
// its second 200: each must come back to its own queue's endpoint. The
// node's file-handle use is logged at each step, and the node must still
// take new connections at the end (on 3.x each quorum queue takes file
// handles from the budget sockets come from).
//
//	DLXBRIDGE_RUN_CAPACITY_QUEUES=100 go test -run TestWorkQueuesUnderOneRunWithinTheFileHandleLimit -v ./cmd/dlxbridge/internal/sidecar/
func TestWorkQueuesUnderOneRunWithinTheFileHandleLimit(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv(runCapacityEnv))
	if n <= 0 {
		t.Skipf("set %s to a number of work queues to run it (a private node, minutes)", runCapacityEnv)
	}
	node := brokertest.StartPrivateNodeWithOpenFiles(t, 1024)
	env := node.Env(t)
	pid := node.PID()
	handles := node.FileHandles
	t.Logf("node %s (pid %d), RabbitMQ %s; before: %s", node.Name, pid, env.ServerVersion, handles())

	type call struct {
		path, id string
		n        int
	}
	calls := make(chan call, 4*n)
	var mu sync.Mutex
	seen := map[string]int{}
	ep := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get(HeaderMessageID)
		mu.Lock()
		seen[r.URL.Path+" "+id]++
		k := seen[r.URL.Path+" "+id]
		mu.Unlock()
		calls <- call{r.URL.Path, id, k}
		if k == 1 {
			http.Error(w, "not yet", http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusOK)
	}))
	defer ep.Close()

	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "schemas", "test.job"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "schemas", "test.job", "v1.json"), []byte(jobSchema), 0o644); err != nil {
		t.Fatal(err)
	}
	var y strings.Builder
	fmt.Fprintf(&y, "broker: {connection_name: %s}\nschemas: {dir: %s}\nrun: {listen: 127.0.0.1:0}\nshared_tiers: {prefix: %s}\nqueues:\n",
		env.Prefix, filepath.Join(dir, "schemas"), env.Prefix)
	shared := os.Getenv("DLXBRIDGE_CAPACITY_SHARED_QUARANTINE") != ""
	for i := range n {
		s := fmt.Sprintf("q%03d", i)
		fmt.Fprintf(&y, "  - name: %s\n    exchange: {name: %s, type: direct}\n    bindings: [%s]\n    consumer: {prefetch: 5, concurrency: 1}\n    retry: {tier_queues: shared}\n",
			env.Name(s), env.Name("ex"), s)
		if shared {
			fmt.Fprintf(&y, "    quarantine: {queue: %s}\n", env.Name("quarantine"))
		}
		fmt.Fprintf(&y, "    accepts: [{type: test.job, versions: [\"1\"]}]\n    forward: {url: \"%s/%s\"}\n", ep.URL, s)
	}
	cfgPath := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(cfgPath, []byte(y.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	p := startSidecarWithin(t, env, env.URL, cfgPath, 10*time.Minute)
	t.Logf("dlxbridge run --apply serving %d queues after %s: %s", n, time.Since(start).Round(time.Second), handles())

	ch := env.Channel("publisher")
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, n))
	for i := range n {
		s := fmt.Sprintf("q%03d", i)
		if err := ch.PublishWithContext(context.Background(), env.Name("ex"), s, true, false, amqp.Publishing{
			Type: "test.job", Headers: amqp.Table{"schema-version": "1"}, MessageId: "m-" + s,
			ContentType: "application/json", DeliveryMode: amqp.Persistent, Body: fmt.Appendf(nil, `{"id":%q}`, s),
		}); err != nil {
			t.Fatal(err)
		}
	}
	for range n {
		if c := <-confirms; !c.Ack {
			t.Fatal("publish nacked")
		}
	}
	published := time.Now()
	back := map[string]bool{}
	deadline := time.After(3 * time.Minute)
	for len(back) < n {
		select {
		case c := <-calls:
			if "/"+strings.TrimPrefix(c.id, "m-") != c.path {
				t.Fatalf("%s reached the endpoint of %s", c.id, c.path)
			}
			if c.n == 2 {
				back[c.path] = true
			}
		case <-deadline:
			t.Fatalf("%d of %d retries came back\n%s", len(back), n, p.stderr.String())
		}
	}
	t.Logf("every retry came back to its own queue within %s of the publish: %s", time.Since(published).Round(time.Millisecond), handles())
	p.waitCounter(`dlxbridge_deliveries_total{outcome="retried",queue="`+env.Name("q000")+`"}`, 1, 10*time.Second)
	probe, err := amqp.DialConfig(env.URL, amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
	if err != nil {
		t.Fatalf("a new connection at the end: %v", err)
	}
	_ = probe.Close()
	longest := ""
	for _, l := range strings.Split(p.stderr.String(), "\n") {
		if len(l) > len(longest) {
			longest = l
		}
	}
	t.Logf("dlxbridge run's longest log line: %d bytes: %.400s", len(longest), longest)
}
