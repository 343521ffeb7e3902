package topology_test

import (
	"context"
	"encoding/json"
	"regexp"
	"strings"
	"testing"

	"github.com/dlxbridge/dlxbridge/internal/brokertest"
	"github.com/dlxbridge/dlxbridge/topology"
)

// broker.replicas reaches every queue and stream as the argument its type
// reads, and nothing is sent when it is unset.
func TestBuildSendsTheReplicaCountToEveryQueue(t *testing.T) {
	t.Parallel()
	v := mustVersion(t, "4.3.6")
	for _, replicas := range []int{0, 3} {
		cfg := shortConfig(t, "p", 3)
		cfg.Broker.Replicas = replicas
		topo, err := topology.Build(cfg, v)
		if err != nil {
			t.Fatal(err)
		}
		if topo.Replicas != replicas {
			t.Errorf("Topology.Replicas = %d, want %d", topo.Replicas, replicas)
		}
		for _, q := range topo.Queues {
			arg, other := topology.ArgQuorumInitialGroupSize, topology.ArgInitialClusterSize
			if q.Args[topology.ArgQueueType] == topology.QueueTypeStream {
				arg, other = other, arg
			}
			got, sent := q.Args[arg]
			switch {
			case replicas == 0 && sent:
				t.Errorf("%s: %s=%v sent with broker.replicas unset", q.Name, arg, got)
			case replicas > 0 && topology.FormatArg(got) != "3":
				t.Errorf("%s: %s=%v, want 3", q.Name, arg, topology.FormatArg(got))
			}
			if _, ok := q.Args[other]; ok {
				t.Errorf("%s: carries %s, which its type does not read", q.Name, other)
			}
		}
	}
}

// Member lists as the management API gave them on 4.3.6 (a three-node
// cluster, nodes stopped and killed) and on 3.10.8 (one node).
func TestReplicasReadsMembersAndState(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, json    string
		ok, below     bool
		online, total int
	}{
		{"all online", `{"name":"q","type":"quorum","leader":"a","members":["a","b","c"],"online":["a","b","c"],"state":"running"}`, true, false, 3, 3},
		{"one stopped", `{"name":"q","type":"quorum","members":["a","b","c"],"online":["a","c"],"state":"running"}`, true, false, 2, 3},
		{"two down", `{"name":"q","type":"quorum","members":["a","b","c"],"online":["a"],"state":"minority"}`, true, true, 1, 3},
		// A stream still listing a killed node online, its state
		// already minority.
		{"stale stream", `{"name":"s","type":"stream","members":["a","b","c"],"online":["a","c"],"state":"minority"}`, true, true, 2, 3},
		{"3.10 one node, no state", `{"name":"q","type":"quorum","members":["rabbit@x"],"online":["rabbit@x"]}`, true, false, 1, 1},
		{"online names a non-member", `{"name":"q","type":"quorum","members":["a","b","c"],"online":["a","z"]}`, true, true, 1, 3},
		{"classic queue", `{"name":"c","type":"classic","state":"running"}`, false, false, 0, 0},
		{"members not reported yet", `{"name":"q","type":"quorum"}`, false, false, 0, 0},
		{"state is a table", `{"name":"c","type":"quorum","members":["a"],"online":["a"],"state":{"syncing":0.5}}`, true, false, 1, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var q topology.MgmtQueue
			if err := json.Unmarshal([]byte(tc.json), &q); err != nil {
				t.Fatal(err)
			}
			h, ok := q.Replicas()
			if ok != tc.ok || h.BelowQuorum != tc.below || h.Online != tc.online || h.Members != tc.total {
				t.Fatalf("Replicas() = %+v, %t; want %d of %d online, below quorum %t, ok %t", h, ok, tc.online, tc.total, tc.below, tc.ok)
			}
			if len(h.Offline) != h.Members-h.Online {
				t.Errorf("offline %v, want %d names", h.Offline, h.Members-h.Online)
			}
		})
	}
}

// A config that adds a replica count to a topology declared without one
// (or changes it) does not make apply refuse: the broker compares the
// argument on redeclare but reads it only at creation. plan and apply keep
// such queues, verify notes the difference, over AMQP and with the
// management API, and a real difference beside it is still a conflict.
func TestAReplicaCountChangeIsKeptNotAConflict(t *testing.T) {
	t.Parallel()
	env := brokertest.Require(t)
	ctx := context.Background()
	conn := env.Dial("topology")
	cfg := shortConfig(t, env.Prefix, 3)
	topo, err := topology.BuildFor(cfg, conn)
	if err != nil {
		t.Fatal(err)
	}
	in := &topology.Broker{Conn: conn}
	if _, err := in.Apply(ctx, topo); err != nil {
		t.Fatal(err)
	}
	for _, q := range topo.Queues {
		env.TrackQueue(q.Name)
	}

	cfg.Broker.Replicas = 3
	replicated, err := topology.BuildFor(cfg, conn)
	if err != nil {
		t.Fatal(err)
	}
	p, err := in.Apply(ctx, replicated)
	if err != nil {
		t.Fatalf("apply with broker.replicas added: %v", err)
	}
	if p.Summary.Keep != len(topo.Queues) || p.Summary.Create != 0 || p.Summary.Conflict != 0 || p.Replicas != 3 {
		t.Fatalf("apply summary %+v (replicas %d), want all %d queues kept, nothing created", p.Summary, p.Replicas, len(topo.Queues))
	}
	var text strings.Builder
	if err := p.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^  kept +queue '` + regexp.QuoteMeta(cfg.Queues[0].Name) + `': x-quorum-initial-group-size: want 3, have none`).MatchString(text.String()) {
		t.Errorf("apply report does not show the work queue kept:\n%s", text.String())
	}

	checkNotes := func(r *topology.VerifyReport, how string) {
		t.Helper()
		if !r.OK() {
			t.Fatalf("verify (%s) fails on a replica count: %v", how, r.Problems)
		}
		notes := map[string]bool{}
		for _, n := range r.Notes {
			if n.Issue == topology.IssueDeclaredWith {
				notes[n.Object] = true
			}
		}
		if len(notes) != len(topo.Queues) {
			t.Fatalf("verify (%s) notes %v, want one per queue (%d)", how, r.Notes, len(topo.Queues))
		}
	}
	r, err := in.Verify(ctx, replicated)
	if err != nil {
		t.Fatal(err)
	}
	checkNotes(r, "AMQP")
	if env.ManagementURL != "" {
		withMgmt := &topology.Broker{Conn: conn}
		if withMgmt.Mgmt, err = topology.NewManagement(env.ManagementURL, env.URL); err != nil {
			t.Fatal(err)
		}
		r, err := withMgmt.Verify(ctx, replicated)
		if err != nil {
			t.Fatal(err)
		}
		checkNotes(r, "management API")
	}

	// Another argument that differs as well is still a conflict.
	cfg.Queues[0].DeliveryLimit = 4
	cfg.Queues[0].Consumer.CrashLoopDeliveries = 3
	changed, err := topology.BuildFor(cfg, conn)
	if err != nil {
		t.Fatal(err)
	}
	p, err = in.Plan(ctx, changed)
	if err != nil {
		t.Fatal(err)
	}
	var conflict *topology.Step
	for i, s := range p.Steps {
		if s.Action == topology.ActionConflict {
			conflict = &p.Steps[i]
		}
	}
	if p.Summary.Conflict != 1 || conflict == nil || conflict.Diff == nil || conflict.Diff.Arg != topology.ArgDeliveryLimit {
		t.Fatalf("plan %+v, want one conflict on %s behind the replica count", p.Summary, topology.ArgDeliveryLimit)
	}
}
