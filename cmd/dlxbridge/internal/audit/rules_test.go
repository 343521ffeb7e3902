package audit_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/dlxbridge/dlxbridge/cmd/dlxbridge/internal/audit"
	"github.com/dlxbridge/dlxbridge/config"
	"github.com/dlxbridge/dlxbridge/topology"
)

var (
	v3  = topology.BrokerVersion{Major: 3, Minor: 10, Patch: 8}
	v40 = topology.BrokerVersion{Major: 4, Minor: 0, Patch: 5}
	v43 = topology.BrokerVersion{Major: 4, Minor: 3, Patch: 6}
)

var allRead = audit.Listings{Queues: true, Exchanges: true, Bindings: true, Policies: true, Consumers: true}

// world builds a one-vhost snapshot.
type world struct {
	v  topology.BrokerVersion
	vh audit.Vhost
}

func newWorld(v topology.BrokerVersion) *world {
	w := &world{v: v, vh: audit.Vhost{Name: "/", Read: allRead}}
	w.exchange("", "direct")
	return w
}

func (w *world) queue(name, kind string, args map[string]any) *world {
	if args == nil {
		args = map[string]any{}
	}
	w.vh.Queues = append(w.vh.Queues, audit.Queue{Name: name, Type: kind, Durable: true, Arguments: args, PolicyReported: true, EffectivePolicy: map[string]any{}})
	return w
}

func (w *world) last() *audit.Queue { return &w.vh.Queues[len(w.vh.Queues)-1] }

func (w *world) exchange(name, kind string) *world {
	w.vh.Exchanges = append(w.vh.Exchanges, audit.Exchange{Name: name, Type: kind, Arguments: map[string]any{}})
	return w
}

func (w *world) bind(x, q, key string) *world {
	w.vh.Bindings = append(w.vh.Bindings, audit.Binding{Source: x, Destination: q, DestinationType: "queue", RoutingKey: key})
	return w
}

func (w *world) policy(name, pattern, applyTo string, def map[string]any) *world {
	w.vh.Policies = append(w.vh.Policies, audit.Policy{Name: name, Pattern: pattern, ApplyTo: applyTo, Definition: def})
	return w
}

func (w *world) run() *audit.Report {
	vh := w.vh
	return audit.Run(&audit.Snapshot{Version: w.v, Cluster: "c", Vhosts: []*audit.Vhost{&vh}}, nil, audit.Options{})
}

func rules(r *audit.Report) []string {
	var ids []string
	for _, f := range r.Findings {
		ids = append(ids, f.Rule+" "+f.Object)
	}
	return ids
}

func wantFindings(t *testing.T, r *audit.Report, want ...string) {
	t.Helper()
	got := rules(r)
	if !slices.Equal(got, want) {
		b, _ := json.MarshalIndent(r.Findings, "", "  ")
		t.Errorf("findings %q, want %q\n%s", got, want, b)
	}
}

func TestQuorumWithoutDLXDropsAtTheLimit(t *testing.T) {
	t.Parallel()
	// 4.x: the default limit of 20 applies to a queue declared without one.
	r := newWorld(v40).queue("q", "quorum", nil).run()
	wantFindings(t, r, "quorum-no-dlx-limit q")
	if ev := audit.EvidenceText(r.Findings[0].Evidence); !strings.Contains(ev, "delivery-limit 20 (the 4.x default)") {
		t.Errorf("evidence %q does not name the 4.x default", ev)
	}
	// 3.x has no default limit; an explicit one drops there too.
	wantFindings(t, newWorld(v3).queue("q", "quorum", nil).run())
	wantFindings(t, newWorld(v3).queue("q", "quorum", map[string]any{"x-delivery-limit": json.Number("5")}).run(), "quorum-no-dlx-limit q")
	// -1 as an argument on 4.x is unlimited; a DLX makes any limit safe.
	wantFindings(t, newWorld(v40).queue("q", "quorum", map[string]any{"x-delivery-limit": int64(-1)}).run())
	w := newWorld(v43).exchange("dlx", "fanout").queue("dlq", "quorum", map[string]any{"x-delivery-limit": int64(-1)}).
		queue("q", "quorum", map[string]any{"x-dead-letter-exchange": "dlx"}).bind("dlx", "dlq", "")
	wantFindings(t, w.run())
	// A positive policy limit beats -1 on 4.x; 4.3's own figure wins.
	w = newWorld(v40).queue("q", "quorum", map[string]any{"x-delivery-limit": int64(-1)}).policy("p", "^q$", "queues", map[string]any{"delivery-limit": int64(7)})
	w.last().Policy, w.last().EffectivePolicy = "p", map[string]any{"delivery-limit": int64(7)}
	r = w.run()
	wantFindings(t, r, "quorum-no-dlx-limit q")
	if ev := audit.EvidenceText(r.Findings[0].Evidence); !strings.Contains(ev, "delivery-limit 7 (policy 'p')") {
		t.Errorf("evidence %q does not name the policy", ev)
	}
	w = newWorld(v43).queue("q", "quorum", map[string]any{"x-delivery-limit": int64(-1)})
	w.last().DeliveryLimit = "unlimited"
	wantFindings(t, w.run())
	w = newWorld(v43).queue("q", "quorum", map[string]any{"x-delivery-limit": int64(-1)})
	w.last().DeliveryLimit = json.Number("20")
	wantFindings(t, w.run(), "quorum-no-dlx-limit q")
}

func TestPolicyIsMatchedBeforeTheBrokerReportsIt(t *testing.T) {
	t.Parallel()
	w := newWorld(v3).queue("work.q", "quorum", nil).policy("limit", `^work\.`, "quorum_queues", map[string]any{"delivery-limit": int64(3)}).
		policy("other", `^work\.`, "classic_queues", map[string]any{"delivery-limit": int64(1)})
	w.last().PolicyReported = false
	r := w.run()
	wantFindings(t, r, "quorum-no-dlx-limit work.q")
	if ev := audit.EvidenceText(r.Findings[0].Evidence); !strings.Contains(ev, "delivery-limit 3 (policy 'limit')") || !strings.Contains(ev, "matched by the audit") {
		t.Errorf("evidence %q", ev)
	}
}

func TestClassicDLXIsAtMostOnce(t *testing.T) {
	t.Parallel()
	w := newWorld(v3).exchange("dlx", "fanout").queue("dlq", "classic", nil).bind("dlx", "dlq", "").
		queue("c", "classic", map[string]any{"x-dead-letter-exchange": "dlx", "x-dead-letter-strategy": "at-least-once"})
	r := w.run()
	wantFindings(t, r, "classic-dlx-at-most-once c")
	if !strings.Contains(r.Findings[0].Problem, "ignored on classic") {
		t.Errorf("problem %q does not say the strategy is ignored", r.Findings[0].Problem)
	}
}

func TestMirroringPolicies(t *testing.T) {
	t.Parallel()
	w := newWorld(v3).queue("m", "classic", nil).policy("ha", "^m$", "queues", map[string]any{"ha-mode": "all"})
	w.last().Policy, w.last().EffectivePolicy = "ha", map[string]any{"ha-mode": "all"}
	r := w.run()
	wantFindings(t, r, "classic-mirroring-policy ha")
	if ev := audit.EvidenceText(r.Findings[0].Evidence); !strings.Contains(ev, `ha-mode "all"`) || !strings.Contains(ev, "queues 1") {
		t.Errorf("evidence %q", ev)
	}
	// The policy listing refused: the queues' effective definitions tell.
	w.vh.Policies, w.vh.Read.Policies = nil, false
	wantFindings(t, w.run(), "classic-mirroring-policy ha")
}

func TestDeadLetterTargets(t *testing.T) {
	t.Parallel()
	args := func(x, key string) map[string]any {
		a := map[string]any{"x-dead-letter-exchange": x}
		if key != "" {
			a["x-dead-letter-routing-key"] = key
		}
		return a
	}
	w := newWorld(v3).
		queue("gone", "classic", args("nope", "")).
		exchange("d", "direct").queue("dlq", "classic", nil).bind("d", "dlq", "dead").
		queue("bound", "classic", args("d", "dead")).
		queue("unbound", "classic", args("d", "other")).
		queue("ownkey", "classic", args("d", "")).
		exchange("empty", "topic").queue("toempty", "classic", args("empty", "")).
		queue("default", "classic", args("", "dlq")).
		queue("defaultnone", "classic", args("", "nosuchqueue")).
		exchange("ae", "fanout").bind("ae", "dlq", "").exchange("withae", "direct").
		queue("viaae", "classic", args("withae", "x"))
	w.vh.Exchanges[len(w.vh.Exchanges)-1].Arguments["alternate-exchange"] = "ae"
	r := audit.Run(&audit.Snapshot{Version: v3, Vhosts: []*audit.Vhost{&w.vh}}, nil, audit.Options{Match: regexp.MustCompile("^")})
	var got []string
	for _, f := range r.Findings {
		if f.Rule != "classic-dlx-at-most-once" {
			got = append(got, f.Rule+" "+f.Object)
		}
	}
	want := []string{"dlx-missing gone", "dlx-unroutable defaultnone", "dlx-unroutable toempty", "dlx-unroutable unbound"}
	if !slices.Equal(got, want) {
		t.Errorf("findings %q, want %q", got, want)
	}
}

func TestAtLeastOnceStaysStuckRatherThanDropped(t *testing.T) {
	t.Parallel()
	w := newWorld(v43).queue("q", "quorum", map[string]any{"x-dead-letter-exchange": "gone", "x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish"})
	r := w.run()
	wantFindings(t, r, "dlx-missing q")
	if !strings.Contains(r.Findings[0].Problem, "stay in the queue") {
		t.Errorf("problem %q", r.Findings[0].Problem)
	}
	w = newWorld(v43).exchange("d", "fanout").queue("t", "quorum", map[string]any{"x-delivery-limit": int64(-1)}).bind("d", "t", "").
		queue("q", "quorum", map[string]any{"x-dead-letter-exchange": "d", "x-dead-letter-strategy": "at-least-once"})
	wantFindings(t, w.run(), "at-least-once-drop-head q")
}

func TestCycles(t *testing.T) {
	t.Parallel()
	// Two TTL queues dead-lettering into each other, nobody consuming.
	w := newWorld(v3).
		queue("a", "classic", map[string]any{"x-message-ttl": int64(1000), "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "b"}).
		queue("b", "classic", map[string]any{"x-message-ttl": int64(1000), "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "a"})
	r := w.run()
	wantFindings(t, r, "dead-letter-cycle a", "classic-dlx-at-most-once a", "classic-dlx-at-most-once b")
	if ev := audit.EvidenceText(r.Findings[0].Evidence); !strings.Contains(ev, "cycle a -> b -> a") {
		t.Errorf("evidence %q", ev)
	}
	// The classic retry loop: work (consumed, rejects) -> retry (TTL) ->
	// work. Safe on 3.x without a limit; on 4.x the work queue's default
	// delivery limit dead-letters into the loop without a rejection.
	loop := func(v topology.BrokerVersion) *world {
		w := newWorld(v).exchange("retry", "direct").
			queue("work", "quorum", map[string]any{"x-dead-letter-exchange": "retry", "x-dead-letter-routing-key": "r"}).
			queue("wait", "quorum", map[string]any{"x-message-ttl": int64(5000), "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "work"}).
			bind("retry", "wait", "r")
		w.vh.Queues[0].Consumers = 1
		return w
	}
	wantFindings(t, loop(v3).run())
	wantFindings(t, loop(v40).run(), "dead-letter-cycle-drops work")
	// A self-loop by TTL.
	wantFindings(t, newWorld(v3).queue("s", "quorum", map[string]any{"x-message-ttl": int64(1), "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "s"}).run(), "dead-letter-cycle s")
}

func TestDeadLetterQueues(t *testing.T) {
	t.Parallel()
	w := newWorld(v3).exchange("d", "fanout").
		queue("src", "quorum", map[string]any{"x-dead-letter-exchange": "d"}).
		queue("dlq", "quorum", nil).bind("d", "dlq", "").
		queue("capped", "classic", map[string]any{"x-max-length": int64(10)}).bind("d", "capped", "")
	w.vh.Queues[1].Messages = 5
	wantFindings(t, w.run(), "dlq-drop-head capped", "dlq-unconsumed-unbounded dlq")
	w.vh.Queues[1].Consumers = 1
	wantFindings(t, w.run(), "dlq-drop-head capped")
}

func TestDeliveryLimitSigns(t *testing.T) {
	t.Parallel()
	// -1 by policy (4.x accepts it; 3.10 refuses the policy).
	w := newWorld(v40).policy("dl", "^x", "quorum_queues", map[string]any{"delivery-limit": json.Number("-1")})
	wantFindings(t, w.run(), "delivery-limit-unlimited-by-policy dl")
	// A negative argument on 3.x dead-letters on the first requeue.
	w = newWorld(v3).exchange("d", "fanout").queue("t", "classic", nil).bind("d", "t", "").
		queue("q", "quorum", map[string]any{"x-delivery-limit": int64(-1), "x-dead-letter-exchange": "d"})
	wantFindings(t, w.run(), "delivery-limit-negative-3x q")
	// On 4.x the same is unlimited, and no finding.
	w.v = v40
	wantFindings(t, w.run())
}

func TestDropsBetweenReads(t *testing.T) {
	t.Parallel()
	k := audit.DropSeries{Reason: "expired", QueueType: "rabbit_classic_queue"}
	s := &audit.Snapshot{Version: v40, Cluster: "c", Drops: &audit.DropSample{IntervalSeconds: 10,
		Before: map[audit.DropSeries]float64{k: 3}, After: map[audit.DropSeries]float64{k: 5}}}
	r := audit.Run(s, nil, audit.Options{Match: regexp.MustCompile("^nothing$")})
	wantFindings(t, r, "dead-letters-dropped c")
	s.Drops.After[k] = 3
	wantFindings(t, audit.Run(s, nil, audit.Options{}))
}

func TestPerMessageTTLAndPrefetch(t *testing.T) {
	t.Parallel()
	w := newWorld(v3).exchange("d", "fanout").queue("t", "classic", nil).bind("d", "t", "").
		queue("delay", "quorum", map[string]any{"x-dead-letter-exchange": "d"})
	w.last().Ready = 2
	r := w.run()
	wantFindings(t, r, "per-message-ttl-delay delay")
	if r.Findings[0].Severity != audit.Info || r.Failing() {
		t.Errorf("an info finding fails the default audit: %+v", r.Findings[0])
	}
	w.last().Ready = 0
	w.vh.Consumers = []audit.Consumer{{Queue: "delay", Tag: "c1", AckRequired: true, GlobalPrefetch: -1}, {Queue: "delay", Tag: "c2", Prefetch: 10, AckRequired: true}}
	wantFindings(t, w.run(), "consumer-no-prefetch delay")
	w.vh.Consumers[0].GlobalPrefetch = 50 // basic.qos global on its channel
	wantFindings(t, w.run())
}

func TestDelayedMessageExchange(t *testing.T) {
	t.Parallel()
	w := newWorld(v3).exchange("later", "x-delayed-message")
	w.vh.Exchanges[len(w.vh.Exchanges)-1].Arguments["x-delayed-type"] = "direct"
	wantFindings(t, w.run(), "delayed-message-exchange later")
}

func TestRulesNeedTheirListings(t *testing.T) {
	t.Parallel()
	w := newWorld(v3).queue("gone", "classic", map[string]any{"x-dead-letter-exchange": "nope"})
	w.vh.Read.Exchanges = false
	r := w.run()
	wantFindings(t, r, "classic-dlx-at-most-once gone")
	if r.Complete() || !strings.Contains(strings.Join(r.NotChecked, "\n"), "dlx-missing") {
		t.Errorf("not checked %q", r.NotChecked)
	}
}

// The bridge's own topology, as `topology apply` declares it for each
// broker version, gives no finding.
func TestTheBridgesTopologyIsClean(t *testing.T) {
	t.Parallel()
	for _, v := range []topology.BrokerVersion{v3, v40, v43} {
		r := audit.Run(&audit.Snapshot{Version: v, Vhosts: []*audit.Vhost{bridgeVhost(t, v)}}, nil, audit.Options{FailOn: audit.Info})
		if len(r.Findings) > 0 {
			b, _ := json.MarshalIndent(r.Findings, "", "  ")
			t.Errorf("%s: the bridge's topology has findings:\n%s", v, b)
		}
	}
}

// With the bridge stopped its queues hold messages and nobody consumes
// them: the work queues, which the delay queues dead-letter back into,
// are not unread dead-letter queues. The quarantine intakes are (nothing
// moves their dead letters to the records stream until the bridge is
// back), and so is a queue fed by a non-delay queue.
func TestAStoppedBridgeIsNoUnreadDeadLetterQueue(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		v     topology.BrokerVersion
		tiers string
	}{{v3, config.TierQueuesPerQueue}, {v40, config.TierQueuesPerQueue}, {v43, config.TierQueuesPerQueue}, {v43, config.TierQueuesShared}} {
		v := c.v
		vh := bridgeVhostWith(t, v, c.tiers)
		for i := range vh.Queues {
			vh.Queues[i].Messages = 50
		}
		r := audit.Run(&audit.Snapshot{Version: v, Vhosts: []*audit.Vhost{vh}}, nil, audit.Options{FailOn: audit.Info})
		intakes := 0
		for _, f := range r.Findings {
			if f.Rule != audit.RuleDLQUnbounded || !strings.HasSuffix(f.Object, ".quarantine") {
				b, _ := json.MarshalIndent(f, "", "  ")
				t.Errorf("%s: a stopped bridge's topology has a finding beside its intakes':\n%s", v, b)
			}
			intakes++
		}
		if intakes == 0 {
			t.Errorf("%s: a stopped bridge's intakes, holding dead letters nobody reads, gave no finding", v)
		}
	}
	w := newWorld(v3).exchange("d", "fanout").
		queue("delay", "quorum", map[string]any{"x-dead-letter-exchange": "d", "x-message-ttl": int64(1000)}).
		queue("plain", "quorum", map[string]any{"x-dead-letter-exchange": "d"}).
		queue("dlq", "quorum", nil).bind("d", "dlq", "")
	w.vh.Queues[2].Messages = 5
	wantFindings(t, w.run(), "dlq-unconsumed-unbounded dlq")
}

func TestEveryRuleIsListedOnce(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for _, r := range audit.Rules() {
		if seen[r.ID] || r.ID == "" || r.Summary == "" {
			t.Errorf("rule %+v listed twice or without a summary", r)
		}
		seen[r.ID] = true
	}
}

func TestReportJSONIsStable(t *testing.T) {
	t.Parallel()
	r := newWorld(v40).queue("q", "quorum", nil).run()
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	var back map[string]any
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"schema", "broker", "vhosts", "scanned", "api_requests", "seconds", "fail_on", "findings", "summary", "not_checked"} {
		if _, ok := back[k]; !ok {
			t.Errorf("report JSON has no %q: %s", k, b)
		}
	}
	f := back["findings"].([]any)[0].(map[string]any)
	for _, k := range []string{"rule", "severity", "vhost", "kind", "object", "problem", "evidence", "fix"} {
		if _, ok := f[k]; !ok {
			t.Errorf("finding JSON has no %q: %s", k, b)
		}
	}
	if back["schema"] != audit.Schema || f["severity"] != "error" || back["fail_on"] != "warning" {
		t.Errorf("report JSON %s", b)
	}
}

// docs/audit.md documents every rule, with its severity, in its table.
func TestEveryRuleIsDocumented(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile(filepath.Join("..", "..", "..", "..", "docs", "audit.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range audit.Rules() {
		if !strings.Contains(string(doc), "| `"+r.ID+"` | "+r.Severity.String()+" |") {
			t.Errorf("docs/audit.md has no table row for rule %s (severity %s)", r.ID, r.Severity)
		}
	}
}
