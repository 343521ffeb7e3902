package brokertest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Cluster is the three-node RabbitMQ cluster that scripts/rabbitmq-cluster
// runs, for the cluster fault suite: its nodes may be killed, stopped,
// drained and restarted, unlike the shared brokers. A test finds it through
// the variables `scripts/rabbitmq-cluster env` prints. Each test leaves it
// as it found it: every node running, none in maintenance, the test's
// objects deleted.
type Cluster struct {
	// URLs, ManagementURLs and Nodes are node 1's first: its AMQP URL,
	// its management API and its Erlang node name.
	URLs, ManagementURLs, Nodes []string

	t      testing.TB
	script string
	layout []string // the script's arguments before each command: none, or --netns
}

// Cluster's environment, from `scripts/rabbitmq-cluster env`.
const (
	envClusterURLs   = "DLXBRIDGE_CLUSTER_URLS"
	envClusterMgmt   = "DLXBRIDGE_CLUSTER_MANAGEMENT_URLS"
	envClusterNodes  = "DLXBRIDGE_CLUSTER_NODES"
	envClusterScript = "DLXBRIDGE_CLUSTER_SCRIPT"
)

// RequireCluster returns the cluster, every node of it running, or skips
// the test when none is configured (fails it under CI=true). A cluster
// that is configured but does not answer fails the test.
func RequireCluster(t testing.TB) *Cluster {
	t.Helper()
	c := &Cluster{t: t, script: os.Getenv(envClusterScript)}
	split := func(s string) []string {
		if s == "" {
			return nil
		}
		return strings.Split(s, ",")
	}
	c.URLs, c.ManagementURLs, c.Nodes = split(os.Getenv(envClusterURLs)), split(os.Getenv(envClusterMgmt)), split(os.Getenv(envClusterNodes))
	if len(c.URLs) == 0 || c.script == "" {
		msg := "no RabbitMQ cluster (scripts/rabbitmq-cluster start, then eval \"$(scripts/rabbitmq-cluster env)\")"
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s under CI=true", msg)
		}
		t.Skip(msg)
	}
	if len(c.ManagementURLs) != len(c.URLs) || len(c.Nodes) != len(c.URLs) {
		t.Fatalf("%s, %s and %s name different numbers of nodes", envClusterURLs, envClusterMgmt, envClusterNodes)
	}
	c.Heal()
	return c
}

// Size is how many nodes the cluster has.
func (c *Cluster) Size() int { return len(c.URLs) }

// run runs the script with args and returns its output; the test fails if
// it fails.
func (c *Cluster) run(timeout time.Duration, args ...string) string {
	c.t.Helper()
	out, err := c.try(timeout, args...)
	if err != nil {
		c.t.Fatalf("scripts/rabbitmq-cluster %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

func (c *Cluster) try(timeout time.Duration, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, c.script, append(slices.Clone(c.layout), args...)...)
	// A file, not a pipe: a node the script starts must not hold our
	// pipe open (it gets a session of its own, but its VM inherits
	// descriptors the script has open).
	f, err := os.CreateTemp("", "dlxbridge-cluster-*.out")
	if err != nil {
		return "", err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	cmd.Stdout, cmd.Stderr = f, f
	err = cmd.Run()
	out, _ := os.ReadFile(f.Name())
	return string(out), err
}

func (c *Cluster) n(i int) string {
	c.t.Helper()
	if i < 1 || i > c.Size() {
		c.t.Fatalf("cluster node %d: nodes are 1 to %d", i, c.Size())
	}
	return fmt.Sprint(i)
}

// Kill SIGKILLs node i's Erlang VM (1-based): a crash, no shutdown.
func (c *Cluster) Kill(i int) { c.t.Helper(); c.run(30*time.Second, "kill", c.n(i)) }

// Stop stops node i cleanly and waits until its VM is gone.
func (c *Cluster) Stop(i int) { c.t.Helper(); c.run(120*time.Second, "stop", c.n(i)) }

// Start starts node i (after Stop or Kill) and waits until it has booted.
func (c *Cluster) Start(i int) { c.t.Helper(); c.run(240*time.Second, "start", c.n(i)) }

// Drain puts node i in maintenance mode (rabbitmq-upgrade drain), as an
// operator does before stopping it for an upgrade: it closes the node's
// client connections, stops accepting new ones and moves the leaders of
// its quorum queues and streams to other nodes.
func (c *Cluster) Drain(i int) { c.t.Helper(); c.run(240*time.Second, "upgrade", c.n(i), "drain") }

// Revive takes node i out of maintenance mode (it stays in it across a
// restart).
func (c *Cluster) Revive(i int) { c.t.Helper(); c.run(120*time.Second, "upgrade", c.n(i), "revive") }

// AwaitQuorumPlusOne waits until stopping node i leaves every quorum queue
// and stream a majority online (rabbitmq-upgrade
// await_online_quorum_plus_one): what an operator waits for between two
// nodes of a rolling restart.
func (c *Cluster) AwaitQuorumPlusOne(i int) {
	c.t.Helper()
	c.run(240*time.Second, "upgrade", c.n(i), "await_online_quorum_plus_one", "-t", "200")
}

// Heal ends a partition (the --netns layout), starts every node that does
// not run and revives every node in maintenance, then waits until the
// cluster reports them all running. RequireCluster, RequirePartition and
// each test's cleanup call it.
func (c *Cluster) Heal() {
	c.t.Helper()
	if len(c.layout) > 0 { // the --netns layout: first end any partition
		if out, err := c.try(30*time.Second, "heal"); err != nil {
			c.t.Fatalf("heal the partition: %v\n%s", err, out)
		}
	}
	if c.healthy() {
		return
	}
	var wg sync.WaitGroup
	errs := make([]error, c.Size())
	for i := 1; i <= c.Size(); i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if out, err := c.try(240*time.Second, "start", fmt.Sprint(i)); err != nil {
				errs[i-1] = fmt.Errorf("start %d: %v\n%s", i, err, out)
				return
			}
			// A node drained and restarted is still in maintenance.
			if out, err := c.try(120*time.Second, "upgrade", fmt.Sprint(i), "revive"); err != nil {
				errs[i-1] = fmt.Errorf("revive %d: %v\n%s", i, err, out)
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		c.t.Fatalf("heal the cluster: %v", err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		out, err := c.try(60*time.Second, "status")
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("the cluster's nodes run but are not all clustered: %v\n%s", err, out)
		}
		time.Sleep(time.Second) // the cluster's membership has no event for us
	}
}

// healthy reports whether the management API lists every node running and
// none being drained: one HTTP request, where healing boots a CLI VM per
// node.
func (c *Cluster) healthy() bool {
	var nodes []struct {
		Name         string `json:"name"`
		Running      bool   `json:"running"`
		BeingDrained bool   `json:"being_drained"`
	}
	if c.MgmtGet("/api/nodes?columns=name,running,being_drained", &nodes) != nil || len(nodes) != c.Size() {
		return false
	}
	for _, n := range nodes {
		if !n.Running || n.BeingDrained || c.NodeIndex(n.Name) == 0 {
			return false
		}
	}
	return true
}

// Env is an Env for t on the cluster: names with t's prefix, connections
// to node 1. When t ends, the cluster is healed first, then every queue
// and exchange with the prefix is deleted.
func (c *Cluster) Env(t testing.TB) *Env {
	t.Helper()
	e := &Env{T: t, URL: c.URLs[0], ManagementURL: c.ManagementURLs[0], Prefix: prefixFor(t.Name()), brokerURL: c.URLs[0]}
	t.Cleanup(e.cleanup)
	t.Cleanup(c.Heal) // runs before the cleanup above
	if v, ok := e.Dial("probe").Properties["version"].(string); ok {
		e.ServerVersion = v
	}
	return e
}

// MgmtGet GETs path from the management API of the first node that
// answers, and decodes the JSON into v.
func (c *Cluster) MgmtGet(path string, v any) error {
	var errs []error
	for i, m := range c.ManagementURLs {
		body, err := managementDo(m, c.URLs[i], http.MethodGet, path, http.StatusOK)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		return json.Unmarshal(body, v)
	}
	return fmt.Errorf("no node's management API answered: %w", errors.Join(errs...))
}

// NodeIndex is the 1-based index of the node named name, 0 if none.
func (c *Cluster) NodeIndex(name string) int {
	for i, n := range c.Nodes {
		if n == name {
			return i + 1
		}
	}
	return 0
}

// Leader is the 1-based index of the node that leads queue (a quorum queue
// or stream), as the management API reports it.
func (c *Cluster) Leader(queue string) (int, error) {
	var q struct {
		Leader string `json:"leader"`
	}
	if err := c.MgmtGet("/api/queues/%2F/"+url.PathEscape(queue), &q); err != nil {
		return 0, err
	}
	if i := c.NodeIndex(q.Leader); i > 0 {
		return i, nil
	}
	return 0, fmt.Errorf("queue %s: leader %q is no node of the cluster", queue, q.Leader)
}

// ConnectionNodes lists the 1-based nodes holding connections whose
// client-provided name is name (the management API lists a connection some
// seconds after it opens).
func (c *Cluster) ConnectionNodes(name string) ([]int, error) {
	var conns []struct {
		Node             string `json:"node"`
		ClientProperties struct {
			ConnectionName string `json:"connection_name"`
		} `json:"client_properties"`
	}
	if err := c.MgmtGet("/api/connections?columns=node,client_properties", &conns); err != nil {
		return nil, err
	}
	var nodes []int
	for _, x := range conns {
		if x.ClientProperties.ConnectionName == name {
			nodes = append(nodes, c.NodeIndex(x.Node))
		}
	}
	return nodes, nil
}

// AwaitConnectionNodes is ConnectionNodes once the management API lists a
// connection of that name, or what it lists after within. A node reports a
// new connection with its next stats emission (every 5 s by default), so
// a connection a few seconds old may not be listed yet; there is no event
// to wait on, so it asks again every 200 ms.
func (c *Cluster) AwaitConnectionNodes(name string, within time.Duration) ([]int, error) {
	deadline := time.Now().Add(within)
	for {
		nodes, err := c.ConnectionNodes(name)
		if (err == nil && len(nodes) > 0) || time.Now().After(deadline) {
			return nodes, err
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// Front is a TCP front door to the cluster, as a load balancer in front of
// the nodes is: each new connection goes to the first node, in its order
// of preference, that accepts it, and is cut when that node goes away. A
// client with one URL then reaches another node when its own is down.
type Front struct {
	// URL is the front door's AMQP URL.
	URL string

	c      *Cluster
	ln     net.Listener
	prefer atomic.Int32 // 1-based node tried first
	mu     sync.Mutex
	conns  map[net.Conn]bool
	done   chan struct{}
}

// Front opens a front door that tries node prefer first, then the nodes
// after it in turn. It closes when the test ends.
func (c *Cluster) Front(prefer int) *Front {
	c.t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		c.t.Fatal(err)
	}
	u, err := url.Parse(c.URLs[0])
	if err != nil {
		c.t.Fatal(err)
	}
	u.Host = ln.Addr().String()
	f := &Front{URL: u.String(), c: c, ln: ln, conns: map[net.Conn]bool{}, done: make(chan struct{})}
	f.Prefer(prefer)
	go f.serve()
	c.t.Cleanup(f.close)
	return f
}

// Prefer makes new connections try node i first.
func (f *Front) Prefer(i int) {
	f.c.n(i) // checks i
	f.prefer.Store(int32(i))
}

func (f *Front) serve() {
	defer close(f.done)
	for {
		client, err := f.ln.Accept()
		if err != nil {
			return
		}
		go f.relay(client)
	}
}

func (f *Front) relay(client net.Conn) {
	var server net.Conn
	first := int(f.prefer.Load())
	for k := 0; k < f.c.Size() && server == nil; k++ {
		i := (first-1+k)%f.c.Size() + 1
		u, err := url.Parse(f.c.URLs[i-1])
		if err != nil {
			continue
		}
		server, _ = net.DialTimeout("tcp", u.Host, 2*time.Second)
	}
	if server == nil {
		_ = client.Close()
		return
	}
	if !f.track(client, server) {
		return
	}
	defer f.untrack(client, server)
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		// Either side ending ends both: a node that went away must cut
		// the client, or it would wait on a dead connection.
		_ = dst.Close()
		_ = src.Close()
		done <- struct{}{}
	}
	go pipe(server, client)
	go pipe(client, server)
	<-done
	<-done
}

func (f *Front) track(cs ...net.Conn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.conns == nil {
		for _, c := range cs {
			_ = c.Close()
		}
		return false
	}
	for _, c := range cs {
		f.conns[c] = true
	}
	return true
}

func (f *Front) untrack(cs ...net.Conn) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range cs {
		delete(f.conns, c)
	}
}

func (f *Front) close() {
	_ = f.ln.Close()
	<-f.done
	f.mu.Lock()
	conns := f.conns
	f.conns = nil
	f.mu.Unlock()
	for c := range conns {
		_ = c.Close()
	}
}

// String names the front door for logs.
func (f *Front) String() string {
	return fmt.Sprintf("front door %s (node %d first)", f.ln.Addr(), f.prefer.Load())
}
