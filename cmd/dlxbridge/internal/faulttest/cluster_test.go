package faulttest

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/dlxbridge/dlxbridge/cmd/dlxbridge/internal/sidecar"
	"github.com/dlxbridge/dlxbridge/config"
	"github.com/dlxbridge/dlxbridge/internal/amqpx"
	"github.com/dlxbridge/dlxbridge/internal/brokertest"
	"github.com/dlxbridge/dlxbridge/schemas"
	"github.com/dlxbridge/dlxbridge/topology"
)

// The cluster tests run on the three-node cluster of scripts/rabbitmq-cluster
// (docs/cluster.md), only with DLXBRIDGE_FAULTS=full: .ci/run starts the
// cluster for that pass alone.
func requireCluster(t *testing.T) *brokertest.Cluster {
	t.Helper()
	skipShort(t)
	if !full() {
		t.Skip("cluster tests run with DLXBRIDGE_FAULTS=full")
	}
	return brokertest.RequireCluster(t)
}

// clusterConfig is faultConfig with every queue replicated on the three
// nodes and every node's management API.
func clusterConfig(t *testing.T, c *brokertest.Cluster, prefix string) *config.Config {
	t.Helper()
	cfg, err := faultConfig(prefix)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Broker.Replicas = c.Size()
	cfg.Broker.ManagementURL = strings.Join(c.ManagementURLs, ",")
	if err := cfg.Complete(); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// verifyOn runs topology verify through node i (AMQP and management API).
func verifyOn(t *testing.T, c *brokertest.Cluster, i int, cfg *config.Config) *topology.VerifyReport {
	t.Helper()
	conn, err := amqpx.Dial(c.URLs[i-1], "faulttest/verify")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	m, err := topology.NewManagement(c.ManagementURLs[i-1], c.URLs[i-1])
	if err != nil {
		t.Fatal(err)
	}
	in := &topology.Broker{Conn: conn, Mgmt: m}
	topo, err := topology.BuildFor(cfg, conn)
	if err != nil {
		t.Fatal(err)
	}
	r, err := in.Verify(context.Background(), topo)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// A quorum queue or stream whose members are mostly down takes no publish
// and delivers nothing: verify fails naming it, and the runtime's /readyz
// answers 503 with it, while one node down is only noted (verify passes,
// /readyz stays 200 and lists it). Node 3 is stopped, then node 2 killed,
// then both started; node 1 keeps the test's connections and management API.
func TestClusterReplicasBelowQuorum(t *testing.T) {
	c := requireCluster(t)
	env := c.Env(t)
	cfg := clusterConfig(t, c, env.Prefix)
	endpoint := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
	t.Cleanup(endpoint.Close)
	cfg.Queues[0].Forward.URL = endpoint.URL
	registry, err := schemas.Load(schemas.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() {
		ran <- sidecar.Run(ctx, sidecar.Options{URL: c.URLs[0], Config: cfg, Registry: registry, Topology: sidecar.TopologyApply,
			Listener: ln, ReplicaRefresh: 500 * time.Millisecond,
			Logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-ran; err != nil {
			t.Errorf("sidecar.Run: %v", err)
		}
	})
	readyz := func() (int, string) {
		resp, err := http.Get("http://" + ln.Addr().String() + "/readyz")
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	work := cfg.Queues[0].Name
	// wait polls verify and /readyz until ok holds (the broker's member
	// lists and the runtime's view of them have no events).
	wait := func(what string, ok func(r *topology.VerifyReport, code int, body string) bool) (*topology.VerifyReport, string) {
		t.Helper()
		deadline := time.Now().Add(90 * time.Second)
		for {
			r := verifyOn(t, c, 1, cfg)
			code, body := readyz()
			if ok(r, code, body) {
				return r, body
			}
			if time.Now().After(deadline) {
				var b strings.Builder
				_ = r.WriteText(&b)
				t.Fatalf("%s: not seen within 90s; last verify:\n%s/readyz %d: %s", what, b.String(), code, body)
			}
			time.Sleep(500 * time.Millisecond)
		}
	}
	issues := func(ps []topology.Problem, issue topology.Issue) map[string]bool {
		m := map[string]bool{}
		for _, p := range ps {
			if p.Issue == issue {
				m[p.Object] = true
			}
		}
		return m
	}
	wq := "queue '" + work + "'"

	wait("all replicas online and ready", func(r *topology.VerifyReport, code int, body string) bool {
		return r.OK() && len(r.Notes) == 0 && code == http.StatusOK && !strings.Contains(body, "replicas")
	})
	t0 := time.Now()
	c.Stop(3)
	r, body := wait("node 3 down noted", func(r *topology.VerifyReport, code int, body string) bool {
		return r.OK() && issues(r.Notes, topology.IssueReplicasOffline)[wq] && code == http.StatusOK && strings.Contains(body, "replicas offline: "+wq)
	})
	t.Logf("node 3 stopped: verify passes with %d notes, /readyz 200 after %s:\n%s", len(r.Notes), time.Since(t0).Round(100*time.Millisecond), body)

	t0 = time.Now()
	c.Kill(2)
	r, body = wait("below quorum reported", func(r *topology.VerifyReport, code int, body string) bool {
		return issues(r.Problems, topology.IssueBelowQuorum)[wq] && code == http.StatusServiceUnavailable && strings.Contains(body, "below quorum: ") && strings.Contains(body, wq)
	})
	var text strings.Builder
	_ = r.WriteText(&text)
	t.Logf("node 2 killed too, after %s: verify:\n%s/readyz 503: %s", time.Since(t0).Round(100*time.Millisecond), text.String(), body)
	if r.OK() {
		t.Errorf("verify passes with the work queue below quorum")
	}
	// Every queue and stream the config declares is below quorum now.
	down := issues(r.Problems, topology.IssueBelowQuorum)
	for _, n := range cfg.Queues[0].Names(cfg.SharedTiers) {
		if n.Kind == config.KindQueue && !down["queue '"+n.Name+"'"] {
			t.Errorf("verify does not report %s (%s) below quorum", n.Name, n.Role)
		}
	}

	t0 = time.Now()
	c.Heal()
	wait("recovered", func(r *topology.VerifyReport, code int, body string) bool {
		return r.OK() && len(r.Notes) == 0 && code == http.StatusOK && !strings.Contains(body, "replicas")
	})
	t.Logf("nodes 2 and 3 started: verify clean and /readyz ready %s later", time.Since(t0).Round(100*time.Millisecond))
}
