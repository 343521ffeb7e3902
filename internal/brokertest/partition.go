package brokertest

import (
	"bufio"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// RequirePartition returns the second cluster of scripts/rabbitmq-cluster,
// its --netns layout (docs/cluster.md): three 4.3 nodes, each in a network
// namespace of its own, so that one can be cut off from the others while
// this machine still reaches all three. The test starts it (with the same
// script as the loopback cluster's, DLXBRIDGE_CLUSTER_SCRIPT) and stops it
// when it ends, namespaces and all: it costs three more Erlang VMs only for
// as long as the test runs. Without the script the test is skipped (failed
// under CI=true); a machine where the layout cannot start fails it.
func RequirePartition(t testing.TB) *Cluster {
	t.Helper()
	script := os.Getenv(envClusterScript)
	if script == "" {
		msg := "no cluster script (eval \"$(scripts/rabbitmq-cluster env)\")"
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s under CI=true", msg)
		}
		t.Skip(msg)
	}
	if why := PartitionAvailable(); why != "" {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s under CI=true", why)
		}
		t.Skip(why)
	}
	c := &Cluster{t: t, script: script, layout: []string{"--netns"}}
	// Stopped even if the start fails half way: a node may run already.
	t.Cleanup(func() {
		if out, err := c.try(180*time.Second, "stop"); err != nil {
			t.Errorf("scripts/rabbitmq-cluster --netns stop: %v\n%s", err, out)
		}
	})
	t0 := time.Now()
	c.run(600*time.Second, "start")
	t.Logf("the partition cluster started in %s", time.Since(t0).Round(100*time.Millisecond))
	vars := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(c.run(30*time.Second, "env")))
	for sc.Scan() {
		k, v, ok := strings.Cut(strings.TrimPrefix(sc.Text(), "export "), "=")
		if ok {
			vars[k] = v
		}
	}
	c.URLs = strings.Split(vars["DLXBRIDGE_PARTITION_URLS"], ",")
	c.ManagementURLs = strings.Split(vars["DLXBRIDGE_PARTITION_MANAGEMENT_URLS"], ",")
	c.Nodes = strings.Split(vars["DLXBRIDGE_PARTITION_NODES"], ",")
	if len(c.URLs) != 3 || len(c.ManagementURLs) != 3 || len(c.Nodes) != 3 {
		t.Fatalf("scripts/rabbitmq-cluster --netns env: want three nodes, got %v", vars)
	}
	c.Heal()
	return c
}

// Isolate cuts node i off from the other nodes (both ways); the test's
// process still reaches every node. Heal, or HealPartition, ends it.
func (c *Cluster) Isolate(i int) { c.t.Helper(); c.run(30*time.Second, "isolate", c.n(i)) }

// HealPartition removes every cut Isolate made.
func (c *Cluster) HealPartition() { c.t.Helper(); c.run(30*time.Second, "heal") }

// PartitionAvailable says why this machine cannot make network namespaces
// ("" when it can): the --netns layout needs root and the ip tool.
func PartitionAvailable() string {
	if os.Geteuid() != 0 {
		return "network namespaces need root"
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return "no ip tool (iproute2)"
	}
	return ""
}
