package topology

import (
	"context"
	"fmt"
	"net/url"
	"strings"
)

// ReplicaHealth is how the members of a quorum queue or stream stand, as
// the management API reports them.
type ReplicaHealth struct {
	// Members is how many replicas the queue has, online or not.
	Members int
	// Online is how many of them the broker counts online.
	Online int
	// Offline names the members that are not online.
	Offline []string
	// BelowQuorum: fewer than a majority of the members are online, or the
	// broker says the queue is in minority. Such a queue takes no publish
	// (a publisher confirm never comes) and delivers nothing until enough
	// members are back.
	BelowQuorum bool
}

// Quorum is the majority of the members: how many must be online.
func (h ReplicaHealth) Quorum() int { return h.Members/2 + 1 }

func (h ReplicaHealth) String() string {
	s := fmt.Sprintf("%d of %d replicas online", h.Online, h.Members)
	if len(h.Offline) > 0 {
		s += " (" + strings.Join(h.Offline, ", ") + " offline)"
	}
	return s
}

// Replicas reads q's members. ok is false for a queue that is neither a
// quorum queue nor a stream, or whose members the broker does not report
// (yet).
//
// The broker's member lists come with its statistics, some seconds late:
// seen on 4.3.6, a quorum queue listed a stopped node as online for about
// 5 s, and a stream listed a SIGKILLed node as online for 15 s and more
// while its state already said "minority". So the state counts too.
func (q *MgmtQueue) Replicas() (h ReplicaHealth, ok bool) {
	if (q.Type != QueueTypeQuorum && q.Type != QueueTypeStream) || len(q.Members) == 0 {
		return ReplicaHealth{}, false
	}
	online := make(map[string]bool, len(q.Online))
	for _, n := range q.Online {
		online[n] = true
	}
	h.Members = len(q.Members)
	for _, m := range q.Members {
		if online[m] {
			h.Online++
		} else {
			h.Offline = append(h.Offline, m)
		}
	}
	state, _ := q.State.(string)
	h.BelowQuorum = h.Online < h.Quorum() || state == "minority"
	return h, true
}

// QueueReplicas lists the vhost's queues with what Replicas reads: name,
// type, members, online members, leader and state. One request for every
// queue, so a caller that checks many queues often (the runtime's
// readiness) does not ask once per queue.
func (m *Management) QueueReplicas(ctx context.Context) ([]MgmtQueue, error) {
	var qs []MgmtQueue
	cols := url.Values{"columns": {"name,type,members,online,leader,state"}}
	if err := m.get(ctx, "/api/queues/"+m.vh()+"?"+cols.Encode(), &qs); err != nil {
		return nil, fmt.Errorf("queues: %w", err)
	}
	return qs, nil
}

// clusterNodes counts the cluster's nodes, running or not.
func (m *Management) clusterNodes(ctx context.Context) (int, error) {
	var ns []struct {
		Name string `json:"name"`
	}
	if err := m.get(ctx, "/api/nodes?columns=name", &ns); err != nil {
		return 0, fmt.Errorf("nodes: %w", err)
	}
	return len(ns), nil
}

// replicaFindings are the problem (below quorum) and notes (members
// offline, fewer members than configured) of one queue as have reports
// it. nodes is the cluster's size, 0 when not known.
func replicaFindings(want QueueSpec, have *MgmtQueue, replicas, nodes int) (problems, notes []Problem) {
	h, ok := have.Replicas()
	if !ok {
		return nil, nil
	}
	obj := queueObject(want.Name)
	switch {
	case h.BelowQuorum:
		have := h.String()
		if h.Online >= h.Quorum() {
			have += ", but the broker reports it in minority"
		}
		problems = append(problems, Problem{Kind: KindQueue, Object: obj, Issue: IssueBelowQuorum, Arg: "online replicas",
			Want: fmt.Sprintf("at least %d of %d", h.Quorum(), h.Members), Have: have + ": it takes no publish and delivers nothing"})
	case len(h.Offline) > 0:
		notes = append(notes, Problem{Kind: KindQueue, Object: obj, Issue: IssueReplicasOffline, Arg: "online replicas",
			Want: fmt.Sprintf("%d of %d", h.Members, h.Members), Have: h.String() + fmt.Sprintf("; %d more down and it stops", h.Online-h.Quorum()+1)})
	}
	if replicas > 0 && h.Members < replicas && (nodes == 0 || h.Members < nodes) {
		grow := "rabbitmq-queues grow <node> all"
		if have.Type == QueueTypeStream {
			grow = "rabbitmq-streams add_replica " + want.Name + " <node>"
		}
		notes = append(notes, Problem{Kind: KindQueue, Object: obj, Issue: IssueFewerReplicas, Arg: "replicas",
			Want: fmt.Sprint(replicas), Have: fmt.Sprintf("%d (declared while fewer nodes ran, or before broker.replicas; %s adds one)", h.Members, grow)})
	}
	return problems, notes
}
