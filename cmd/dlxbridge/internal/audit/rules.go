package audit

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/dlxbridge/dlxbridge/internal/mgmtapi"
	"github.com/dlxbridge/dlxbridge/topology"
)

// RuleInfo describes one rule.
type RuleInfo struct {
	ID       string
	Severity Severity
	Summary  string
}

// Rules lists every rule, in the order docs/audit.md gives them.
func Rules() []RuleInfo {
	return []RuleInfo{
		{RuleQuorumNoDLX, Error, "a quorum queue with no dead-letter exchange and a finite delivery limit (4.x's default 20 included)"},
		{RuleClassicDLX, Warning, "a classic queue with a dead-letter exchange: it dead-letters at most once"},
		{RuleMirroring, Error, "a policy with ha-* keys (classic queue mirroring): removed in 4.0, it blocks the upgrade"},
		{RuleDLXMissing, Error, "a dead-letter exchange that does not exist"},
		{RuleDLXUnroutable, Error, "a dead-letter exchange that routes the dead-letter routing key to no queue"},
		{RuleCycle, Error, "a dead-letter cycle in which nothing can reject: every message in it is dropped when it comes round"},
		{RuleCycleDrops, Warning, "a dead-letter cycle whose consumed queue also dead-letters for another reason than a rejection: those are dropped"},
		{RuleDLQUnbounded, Warning, "a dead-letter queue holding messages, with no consumer and no length or age bound"},
		{RuleDLQDropHead, Warning, "a dead-letter queue with a length limit and drop-head overflow: the oldest dead letters are dropped"},
		{RuleAtLeastOnceDropHead, Warning, "at-least-once dead-lettering without reject-publish overflow: silently at most once"},
		{RulePolicyUnlimited, Warning, "a policy that sets delivery-limit -1 (4.x): not reliably honoured"},
		{RuleNegativeLimit3x, Error, "a negative x-delivery-limit on 3.x: dead-letters (or drops) on the first requeue"},
		{RuleDropping, Error, "dead letters dropped between two reads of the Prometheus counters (no dead-letter exchange)"},
		{RulePerMessageTTL, Info, "a queue that looks like a delay queue relying on per-message expiration: mixed TTLs expire only at the head"},
		{RuleNoPrefetch, Warning, "a consumer with no prefetch limit on a queue that dead-letters"},
		{RuleDelayedExchange, Warning, "an exchange of the delayed-message plugin's type (archived; cannot run on 4.3)"},
	}
}

// Rule ids: part of the output format, never renamed.
const (
	RuleQuorumNoDLX         = "quorum-no-dlx-limit"
	RuleClassicDLX          = "classic-dlx-at-most-once"
	RuleMirroring           = "classic-mirroring-policy"
	RuleDLXMissing          = "dlx-missing"
	RuleDLXUnroutable       = "dlx-unroutable"
	RuleCycle               = "dead-letter-cycle"
	RuleCycleDrops          = "dead-letter-cycle-drops"
	RuleDLQUnbounded        = "dlq-unconsumed-unbounded"
	RuleDLQDropHead         = "dlq-drop-head"
	RuleAtLeastOnceDropHead = "at-least-once-drop-head"
	RulePolicyUnlimited     = "delivery-limit-unlimited-by-policy"
	RuleNegativeLimit3x     = "delivery-limit-negative-3x"
	RuleDropping            = "dead-letters-dropped"
	RulePerMessageTTL       = "per-message-ttl-delay"
	RuleNoPrefetch          = "consumer-no-prefetch"
	RuleDelayedExchange     = "delayed-message-exchange"
)

// vctx is one vhost's snapshot with what the rules share: every queue's
// effective settings and the dead-letter routes.
type vctx struct {
	s         *Snapshot
	vh        *Vhost
	r         *router
	eff       []*effective
	byName    map[string]*effective
	consumers map[string][]Consumer
	// routes is each dead-lettering queue's route, by queue name.
	routes map[string]route
	// feeders lists, for each queue, the queues that certainly
	// dead-letter into it.
	feeders map[string][]string
}

func (c *vctx) consumerCount(q *Queue) int { return max(q.Consumers, len(c.consumers[q.Name])) }

func (c *vctx) finding(rule string, sev Severity, kind, object, problem string, ev []Evidence, fix string) Finding {
	return Finding{Rule: rule, Severity: sev, Vhost: c.vh.Name, Kind: kind, Object: object, Problem: problem, Evidence: ev, Fix: fix}
}

// checkVhost runs the vhost rules, each only where the listings it needs
// were read.
func checkVhost(s *Snapshot, vh *Vhost) ([]Finding, []string) {
	c := &vctx{s: s, vh: vh, r: newRouter(vh), byName: map[string]*effective{}, consumers: map[string][]Consumer{},
		routes: map[string]route{}, feeders: map[string][]string{}}
	for i := range vh.Queues {
		e := effectiveOf(s.Version, vh, &vh.Queues[i])
		c.eff = append(c.eff, e)
		c.byName[e.q.Name] = e
	}
	for _, cs := range vh.Consumers {
		c.consumers[cs.Queue] = append(c.consumers[cs.Queue], cs)
	}
	routing := vh.Read.Queues && vh.Read.Exchanges && vh.Read.Bindings
	if routing {
		for _, e := range c.eff {
			if !e.hasDLX() {
				continue
			}
			var key *string
			if e.dlrk.set() {
				k := e.dlrk.str()
				key = &k
			}
			rt := c.r.route(e.dlx.str(), key)
			c.routes[e.q.Name] = rt
			for _, t := range rt.queues {
				c.feeders[t] = append(c.feeders[t], e.q.Name)
			}
		}
	}
	type rule struct {
		id    string
		needs Listings
		check func(*vctx) []Finding
	}
	rules := []rule{
		{RuleQuorumNoDLX, Listings{}, checkQuorumNoDLX},
		{RuleClassicDLX, Listings{}, checkClassicDLX},
		{RuleMirroring, Listings{}, checkMirroring},
		{RuleDLXMissing + ", " + RuleDLXUnroutable, Listings{Queues: true, Exchanges: true, Bindings: true}, checkDLXRoutes},
		{RuleCycle + ", " + RuleCycleDrops, Listings{Queues: true, Exchanges: true, Bindings: true}, checkCycles},
		{RuleDLQUnbounded + ", " + RuleDLQDropHead, Listings{Queues: true, Exchanges: true, Bindings: true}, checkDLQs},
		{RuleAtLeastOnceDropHead, Listings{}, checkAtLeastOnce},
		{RulePolicyUnlimited, Listings{}, checkPolicyUnlimited},
		{RuleNegativeLimit3x, Listings{}, checkNegativeLimit},
		{RulePerMessageTTL, Listings{}, checkPerMessageTTL},
		{RuleNoPrefetch, Listings{Consumers: true}, checkNoPrefetch},
		{RuleDelayedExchange, Listings{Exchanges: true}, checkDelayedExchanges},
	}
	var out []Finding
	var notChecked []string
	for _, r := range rules {
		if missing := missingListings(r.needs, vh.Read); missing != "" {
			notChecked = append(notChecked, fmt.Sprintf("rule %s in vhost %q: needs the %s, which could not be read", r.id, vh.Name, missing))
			continue
		}
		out = append(out, r.check(c)...)
	}
	return out, notChecked
}

func missingListings(need, have Listings) string {
	var m []string
	for _, l := range []struct {
		name       string
		need, have bool
	}{{"queues", need.Queues, have.Queues}, {"exchanges", need.Exchanges, have.Exchanges}, {"bindings", need.Bindings, have.Bindings}, {"consumers", need.Consumers, have.Consumers}} {
		if l.need && !l.have {
			m = append(m, l.name)
		}
	}
	return strings.Join(m, " and ")
}

// liftLimit is the advice for a delivery limit that must not drop.
func liftLimit(v topology.BrokerVersion) string {
	if v.HasDefaultDeliveryLimit() {
		return fmt.Sprintf("or lift the limit: x-delivery-limit -1 as an argument at declare time, or a large finite delivery-limit by policy (%d), never -1 by policy", topology.SafeDeliveryLimit)
	}
	return "or remove the x-delivery-limit argument or delivery-limit policy (3.x has no default limit)"
}

func checkQuorumNoDLX(c *vctx) []Finding {
	var out []Finding
	for _, e := range c.eff {
		if e.q.Type != topology.QueueTypeQuorum || e.hasDLX() {
			continue
		}
		n, ok := e.finiteLimit()
		if !ok {
			continue
		}
		out = append(out, c.finding(RuleQuorumNoDLX, Error, "queue", e.q.Name,
			fmt.Sprintf("a message requeued past the delivery limit (%d) is dropped: the queue has no dead-letter exchange", n),
			e.evidence("delivery-limit", "dead-letter-exchange"),
			"give it a dead-letter exchange that routes to a queue someone reads (policy dead-letter-exchange, or x-dead-letter-exchange), "+liftLimit(c.s.Version)))
	}
	return out
}

func checkClassicDLX(c *vctx) []Finding {
	var out []Finding
	for _, e := range c.eff {
		if e.q.Type != "classic" || !e.hasDLX() {
			continue
		}
		problem := "it dead-letters at most once: a dead letter its target does not take (unroutable, full, a node down) is lost"
		names := []string{"dead-letter-exchange", "dead-letter-routing-key"}
		if e.strategy.set() {
			problem += "; x-dead-letter-strategy is ignored on classic queues"
			names = append(names, "dead-letter-strategy")
		}
		out = append(out, c.finding(RuleClassicDLX, Warning, "queue", e.q.Name, problem, e.evidence(names...),
			"move it to a quorum queue with x-dead-letter-strategy at-least-once and x-overflow reject-publish (a queue's type cannot change: declare a new queue, move the consumers, drain the old one)"))
	}
	return out
}

// policyFinding collects what a policy rule found about one policy.
type policyFinding struct {
	p      Policy
	queues int
}

// policiesWith finds the policies whose definition has key (or, with
// prefix, a key that starts with it): those listed and, where the listing
// could not be read, those the queues' effective definitions name.
func (c *vctx) policiesWith(match func(def map[string]any) bool) []policyFinding {
	found := map[string]*policyFinding{}
	var order []string
	add := func(p Policy) *policyFinding {
		key := strconv.FormatBool(p.Operator) + p.Name
		if f, ok := found[key]; ok {
			return f
		}
		f := &policyFinding{p: p}
		found[key] = f
		order = append(order, key)
		return f
	}
	for _, p := range c.vh.Policies {
		if match(p.Definition) {
			add(p)
		}
	}
	for _, e := range c.eff {
		for _, ps := range e.policyDefs {
			if !match(ps.def) {
				continue
			}
			p := Policy{Name: ps.name, Operator: ps.op, Definition: ps.def}
			if found := mgmtapi.FindPolicy(c.vh.Policies, ps.name, ps.op); found != nil {
				p = *found
			}
			add(p).queues++
		}
	}
	out := make([]policyFinding, 0, len(order))
	for _, k := range order {
		out = append(out, *found[k])
	}
	return out
}

func policyKind(operator bool) string {
	if operator {
		return "operator-policy"
	}
	return "policy"
}

func policyEvidence(f policyFinding, keys ...string) []Evidence {
	ev := []Evidence{}
	if f.p.Pattern != "" || f.p.ApplyTo != "" {
		ev = append(ev, Evidence{Setting: "pattern", Value: topology.FormatArg(f.p.Pattern)},
			Evidence{Setting: "apply-to", Value: topology.FormatArg(f.p.ApplyTo)})
	}
	for _, k := range keys {
		ev = append(ev, Evidence{Setting: k, Value: topology.FormatArg(f.p.Definition[k])})
	}
	ev = append(ev, Evidence{Setting: "queues", Value: strconv.Itoa(f.queues), Source: "in effect on, as the audit read them"})
	return ev
}

func checkMirroring(c *vctx) []Finding {
	var out []Finding
	for _, f := range c.policiesWith(func(def map[string]any) bool {
		for k := range def {
			if strings.HasPrefix(k, "ha-") {
				return true
			}
		}
		return false
	}) {
		var keys []string
		for k := range f.p.Definition {
			if strings.HasPrefix(k, "ha-") {
				keys = append(keys, k)
			}
		}
		sort.Strings(keys)
		out = append(out, c.finding(RuleMirroring, Error, policyKind(f.p.Operator), f.p.Name,
			"classic queue mirroring was removed in 4.0: this policy blocks the upgrade, and a mirrored queue's unsynchronised mirrors lose messages when the leader goes",
			policyEvidence(f, keys...),
			"move the queues it matches to quorum queues (a new queue each: the type cannot change), then remove the ha-* keys or the policy"))
	}
	return out
}

func (c *vctx) dlxEvidence(e *effective, rt route) []Evidence {
	ev := e.evidence("dead-letter-exchange", "dead-letter-routing-key", "dead-letter-strategy")
	if rt.via != "" {
		ev = append(ev, Evidence{Setting: "alternate-exchange", Value: topology.FormatArg(rt.via), Source: "of the dead-letter exchange"})
	}
	return ev
}

// lostOrStuck says what happens to a dead letter that reaches no queue.
func lostOrStuck(e *effective) string {
	if e.q.Type == topology.QueueTypeQuorum && e.strategyMode().str() == topology.StrategyAtLeastOnce && e.overflowMode().str() == topology.OverflowReject {
		return "with at-least-once dead-lettering they stay in the queue for ever (and count against its length limit)"
	}
	return "dead letters are dropped"
}

func checkDLXRoutes(c *vctx) []Finding {
	var out []Finding
	for _, e := range c.eff {
		rt, ok := c.routes[e.q.Name]
		if !ok {
			continue
		}
		switch {
		case rt.missing != "":
			out = append(out, c.finding(RuleDLXMissing, Error, "queue", e.q.Name,
				fmt.Sprintf("its dead-letter exchange '%s' does not exist: %s", rt.missing, lostOrStuck(e)),
				c.dlxEvidence(e, rt),
				fmt.Sprintf("declare exchange '%s' and bind the queue that should hold the dead letters, or point the dead-letter exchange at one that exists", rt.missing)))
		case rt.nowhere():
			key := "the message's own routing key"
			if e.dlrk.set() {
				key = "routing key " + topology.FormatArg(e.dlrk.value)
			}
			x := "the default exchange"
			if n := e.dlx.str(); n != "" {
				x = "'" + n + "'"
			}
			out = append(out, c.finding(RuleDLXUnroutable, Error, "queue", e.q.Name,
				fmt.Sprintf("its dead-letter exchange %s routes %s to no queue: %s", x, key, lostOrStuck(e)),
				c.dlxEvidence(e, rt),
				"bind a queue to the dead-letter exchange for that key, give the exchange an alternate exchange, or set a dead-letter routing key that is bound"))
		}
	}
	return out
}

// checkCycles finds dead-letter cycles over certain routes (strongly
// connected components, a self-loop included). When the broker
// dead-letters a message for a reason other than rejected into a queue it
// has been dead-lettered from before, and no rejection happened since, it
// drops it silently.
func checkCycles(c *vctx) []Finding {
	var out []Finding
	for _, comp := range c.cycles() {
		var rejecters []*effective
		var path []string
		for _, name := range comp {
			e := c.byName[name]
			path = append(path, name)
			_, moves := e.movesOnItsOwn()
			if c.consumerCount(e.q) > 0 || !moves {
				rejecters = append(rejecters, e)
			}
		}
		head := comp[0]
		cycle := Evidence{Setting: "cycle", Value: strings.Join(append(path, head), " -> "), Source: "dead-letter routes"}
		if len(rejecters) == 0 {
			ev := []Evidence{cycle}
			for _, name := range comp {
				e := c.byName[name]
				why, _ := e.movesOnItsOwn()
				ev = append(ev, Evidence{Setting: "queue '" + name + "'", Value: why + ", no consumer"})
			}
			out = append(out, c.finding(RuleCycle, Error, "queue", head,
				"a dead-letter cycle in which nothing rejects: every queue in it dead-letters on its own (TTL or length limit) and none is consumed, so a message that comes round is dropped silently",
				ev, "end the cycle in a terminal queue (a quarantine without a dead-letter exchange), or let a consumer reject in it"))
			continue
		}
		for _, e := range rejecters {
			var reasons []string
			if n, ok := e.finiteLimit(); ok {
				reasons = append(reasons, fmt.Sprintf("delivery-limit %d", n))
			}
			if why, ok := e.movesOnItsOwn(); ok {
				reasons = append(reasons, why)
			}
			if len(reasons) == 0 {
				continue
			}
			ev := append([]Evidence{cycle}, e.evidence("delivery-limit", "message-ttl", "max-length", "overflow", "dead-letter-exchange")...)
			out = append(out, c.finding(RuleCycleDrops, Warning, "queue", e.q.Name,
				fmt.Sprintf("it dead-letters into a cycle for other reasons than a rejection (%s): such a dead letter comes back without a rejection on the way and is dropped silently", strings.Join(reasons, ", ")),
				ev, "dead-letter this queue to a terminal queue (a quarantine) and retry by republishing to the delay queues (as the bridge does), or lift the limit"))
		}
	}
	return out
}

// cycles returns the strongly connected components of the certain
// dead-letter graph that hold a cycle, each sorted, in name order.
func (c *vctx) cycles() [][]string {
	edges := map[string][]string{}
	for q, rt := range c.routes {
		edges[q] = rt.queues
	}
	names := make([]string, 0, len(edges))
	for q := range edges {
		names = append(names, q)
	}
	sort.Strings(names)
	// Tarjan's algorithm, iteration order fixed for a stable result.
	index, low := map[string]int{}, map[string]int{}
	onStack := map[string]bool{}
	var stack []string
	var comps [][]string
	next := 0
	var visit func(v string)
	visit = func(v string) {
		index[v], low[v] = next, next
		next++
		stack = append(stack, v)
		onStack[v] = true
		for _, w := range edges[v] {
			if _, seen := index[w]; !seen {
				visit(w)
				low[v] = min(low[v], low[w])
			} else if onStack[w] {
				low[v] = min(low[v], index[w])
			}
		}
		if low[v] == index[v] {
			var comp []string
			for {
				w := stack[len(stack)-1]
				stack = stack[:len(stack)-1]
				onStack[w] = false
				comp = append(comp, w)
				if w == v {
					break
				}
			}
			self := false
			for _, w := range edges[v] {
				self = self || w == v
			}
			if len(comp) > 1 || self {
				sort.Strings(comp)
				comps = append(comps, comp)
			}
		}
	}
	for _, v := range names {
		if _, seen := index[v]; !seen {
			visit(v)
		}
	}
	sort.Slice(comps, func(i, j int) bool { return comps[i][0] < comps[j][0] })
	return comps
}

func checkDLQs(c *vctx) []Finding {
	var out []Finding
	for _, e := range c.eff {
		feeders := c.feeders[e.q.Name]
		if len(feeders) == 0 {
			continue
		}
		sort.Strings(feeders)
		fed := Evidence{Setting: "fed by", Value: strings.Join(feeders, ", "), Source: "dead-letter routes"}
		if e.q.Type == topology.QueueTypeStream {
			if e.q.Messages > 0 && !e.maxAge.set() && !e.maxBytes.set() {
				ev := append(e.evidence("max-age", "max-length-bytes"), Evidence{Setting: "messages", Value: strconv.FormatInt(e.q.Messages, 10), Source: "broker"}, fed)
				out = append(out, c.finding(RuleDLQUnbounded, Warning, "queue", e.q.Name,
					"a stream that receives dead letters and has no retention: it grows until the disk alarm stops every publisher",
					ev, "set x-max-age or x-max-length-bytes (by policy: max-age, max-length-bytes)"))
			}
			continue
		}
		if c.consumerCount(e.q) == 0 && e.q.Messages > 0 && !e.lengthBound() && !e.ttl.set() && !c.fedByDelaysOnly(feeders) {
			ev := append(e.evidence("max-length", "max-length-bytes", "message-ttl"),
				Evidence{Setting: "consumers", Value: "0", Source: "broker"},
				Evidence{Setting: "messages", Value: strconv.FormatInt(e.q.Messages, 10), Source: "broker"}, fed)
			out = append(out, c.finding(RuleDLQUnbounded, Warning, "queue", e.q.Name,
				"dead letters pile up here with nobody reading them and no bound: it grows until the memory or disk alarm stops every publisher",
				ev, "read it (a consumer, or an alert on its depth and someone who acts on it), or bound it with max-length and reject-publish overflow so the sources keep what does not fit"))
		}
		if e.lengthBound() && e.overflowMode().str() == "drop-head" && !e.hasDLX() {
			out = append(out, c.finding(RuleDLQDropHead, Warning, "queue", e.q.Name,
				"at its length limit the broker drops the oldest dead letter to make room, silently",
				append(e.evidence("max-length", "max-length-bytes", "overflow", "dead-letter-exchange"), fed),
				"x-overflow reject-publish (policy overflow) with at-least-once dead-lettering into it, so the sources keep what does not fit; or raise the limit and alert on the depth"))
		}
	}
	return out
}

// fedByDelaysOnly reports whether every queue that dead-letters into a
// queue is a delay queue (one with a message TTL): what arrives is a retry
// coming back when its delay expires, so the queue is a work queue with its
// consumer away (a stopped bridge), not a dead-letter queue left unread.
func (c *vctx) fedByDelaysOnly(feeders []string) bool {
	for _, f := range feeders {
		if e := c.byName[f]; e == nil || !e.ttl.set() {
			return false
		}
	}
	return len(feeders) > 0
}

func checkAtLeastOnce(c *vctx) []Finding {
	var out []Finding
	for _, e := range c.eff {
		if e.q.Type != topology.QueueTypeQuorum || !e.hasDLX() || e.strategyMode().str() != topology.StrategyAtLeastOnce {
			continue
		}
		if e.overflowMode().str() == topology.OverflowReject {
			continue
		}
		out = append(out, c.finding(RuleAtLeastOnceDropHead, Warning, "queue", e.q.Name,
			"at-least-once dead-lettering needs reject-publish overflow: with "+e.overflowMode().str()+" the broker silently dead-letters at most once",
			e.evidence("dead-letter-strategy", "overflow", "dead-letter-exchange"),
			"set x-overflow reject-publish (or policy overflow reject-publish)"))
	}
	return out
}

func checkPolicyUnlimited(c *vctx) []Finding {
	var out []Finding
	for _, f := range c.policiesWith(func(def map[string]any) bool {
		n, ok := (setting{value: def["delivery-limit"]}).int()
		return ok && n < 0
	}) {
		out = append(out, c.finding(RulePolicyUnlimited, Warning, policyKind(f.p.Operator), f.p.Name,
			"delivery-limit -1 by policy is not reliably honoured: 4.1 and 4.2 do not apply a changed limit to existing queues, and a transport lost messages relying on it; a queue may keep the default limit of 20",
			policyEvidence(f, "delivery-limit"),
			fmt.Sprintf("a large finite delivery-limit by policy (%d), or -1 as the queue's x-delivery-limit argument at declare time; read the effective limit back (4.3 reports it)", topology.SafeDeliveryLimit)))
	}
	return out
}

func checkNegativeLimit(c *vctx) []Finding {
	if c.s.Version.HasDefaultDeliveryLimit() {
		return nil // on 4.x a negative limit means unlimited
	}
	var out []Finding
	for _, e := range c.eff {
		n, ok := e.limit.int()
		if e.q.Type != topology.QueueTypeQuorum || !ok || n >= 0 {
			continue
		}
		what := "dead-letters"
		if !e.hasDLX() {
			what = "drops (no dead-letter exchange)"
		}
		out = append(out, c.finding(RuleNegativeLimit3x, Error, "queue", e.q.Name,
			fmt.Sprintf("on %s a negative delivery limit is not unlimited: the broker %s a message on its first requeue", c.s.Version, what),
			e.evidence("delivery-limit", "dead-letter-exchange"),
			"remove x-delivery-limit (3.x has no default limit); -1 means unlimited only from 4.0 on"))
	}
	return out
}

func checkPerMessageTTL(c *vctx) []Finding {
	var out []Finding
	for _, e := range c.eff {
		if e.q.Type == topology.QueueTypeStream || !e.hasDLX() || e.ttl.set() || e.q.Ready == 0 || c.consumerCount(e.q) > 0 {
			continue
		}
		ev := append(e.evidence("message-ttl", "dead-letter-exchange"),
			Evidence{Setting: "consumers", Value: "0", Source: "broker"},
			Evidence{Setting: "messages_ready", Value: strconv.FormatInt(e.q.Ready, 10), Source: "broker"})
		out = append(out, c.finding(RulePerMessageTTL, Info, "queue", e.q.Name,
			"it looks like a delay queue whose messages carry their own expiration (a dead-letter exchange, no queue TTL, no consumer, messages waiting): messages expire only at the head, so a long one holds back every shorter one behind it",
			ev, "one queue per delay with x-message-ttl (as the bridge's retry tiers do), not mixed per-message expirations in one queue"))
	}
	return out
}

func checkNoPrefetch(c *vctx) []Finding {
	var out []Finding
	for _, e := range c.eff {
		if !e.hasDLX() {
			continue
		}
		var open []Consumer
		for _, cs := range c.consumers[e.q.Name] {
			if cs.AckRequired && cs.Prefetch == 0 && cs.GlobalPrefetch <= 0 {
				open = append(open, cs)
			}
		}
		if len(open) == 0 {
			continue
		}
		ev := append(e.evidence("dead-letter-exchange"),
			Evidence{Setting: "consumers without prefetch", Value: strconv.Itoa(len(open)), Source: "broker"},
			Evidence{Setting: "consumer_tag", Value: topology.FormatArg(open[0].Tag), Source: "connection " + topology.FormatArg(open[0].Connection)})
		out = append(out, c.finding(RuleNoPrefetch, Warning, "queue", e.q.Name,
			"a consumer with no prefetch limit takes every message it can (a quorum queue caps it at 2000); when it crashes, times out or loses its connection, all of them are requeued at once, count toward the delivery limit and can be dead-lettered together",
			ev, "set a prefetch (basic.qos) before consuming; the bridge's consumer.prefetch defaults to 20"))
	}
	return out
}

func checkDelayedExchanges(c *vctx) []Finding {
	var out []Finding
	for _, x := range c.vh.Exchanges {
		if x.Type != "x-delayed-message" {
			continue
		}
		out = append(out, c.finding(RuleDelayedExchange, Warning, "exchange", x.Name,
			"the delayed-message exchange plugin is archived: its delayed messages are kept on one node only (lost with it), it ignores mandatory, and it cannot run on 4.3, so it blocks that upgrade",
			[]Evidence{{Setting: "type", Value: topology.FormatArg(x.Type), Source: "broker"}, {Setting: "x-delayed-type", Value: topology.FormatArg(x.Arguments["x-delayed-type"]), Source: "argument"}},
			"delay with TTL queues (one per delay, as the bridge's retry tiers), or 4.3's delayed retry for quorum queues"))
	}
	return out
}

// checkBroker runs the rules about the whole broker.
func checkBroker(s *Snapshot) []Finding {
	if s.Drops == nil {
		return nil
	}
	var out []Finding
	var ev []Evidence
	total := 0.0
	keys := make([]DropSeries, 0, len(s.Drops.After))
	for k := range s.Drops.After {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].Reason != keys[j].Reason {
			return keys[i].Reason < keys[j].Reason
		}
		return keys[i].QueueType < keys[j].QueueType
	})
	for _, k := range keys {
		after := s.Drops.After[k]
		before, ok := s.Drops.Before[k]
		if !ok || after <= before {
			continue
		}
		total += after - before
		ev = append(ev, Evidence{Setting: dropCounter(k.Reason) + `{queue_type="` + k.QueueType + `",dead_letter_strategy="disabled"}`,
			Value: strconv.FormatFloat(before, 'f', -1, 64) + " -> " + strconv.FormatFloat(after, 'f', -1, 64), Source: "Prometheus"})
	}
	if total > 0 {
		out = append(out, Finding{Rule: RuleDropping, Severity: Error, Kind: "broker", Object: s.Cluster,
			Problem: fmt.Sprintf("the broker dropped %s dead letter(s) in %.0fs: queues without a dead-letter exchange are dead-lettering (a reject without requeue, a TTL, a length limit or a delivery limit)",
				strconv.FormatFloat(total, 'f', -1, 64), s.Drops.IntervalSeconds),
			Evidence: ev,
			Fix:      "find the queues with a TTL, length or delivery limit or rejecting consumers and no dead-letter exchange (the queue rules above name the quorum ones), and give them one; the counter's reason says which setting fires"})
	}
	return out
}
