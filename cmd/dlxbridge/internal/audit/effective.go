package audit

import (
	"sort"
	"strings"

	"github.com/dlxbridge/dlxbridge/internal/mgmtapi"
	"github.com/dlxbridge/dlxbridge/internal/wireval"
	"github.com/dlxbridge/dlxbridge/topology"
)

// setting is one effective setting of a queue and where it comes from.
type setting struct {
	value  any // nil: not set
	source string
}

func (s setting) set() bool { return s.value != nil }

func (s setting) str() string {
	v, _ := s.value.(string)
	return v
}

func (s setting) int() (int64, bool) {
	n, res := wireval.Int(s.value)
	return n, res == wireval.IntOK
}

// Evidence renders the setting under its policy-key name.
func (s setting) evidence(name string) Evidence {
	return Evidence{Setting: name, Value: topology.FormatArg(s.value), Source: s.source}
}

// effective is a queue's settings with its arguments, policy and operator
// policy applied the way the broker applies them: for the dead-letter keys
// and the overflow behaviour the queue's argument wins over a policy; for
// TTLs and lengths the lower value wins. The delivery limit has its own
// rule (see limit).
type effective struct {
	q                                *Queue
	dlx, dlrk, strategy, overflow    setting
	ttl, maxLength, maxBytes, maxAge setting
	limit                            setting // quorum only: a number, "unlimited", or nil for none
	haKeys                           []string
	policyDefs                       []policySource
	// reported: the broker reported the queue's policy; else the audit
	// matched the vhost's policies itself.
	reported bool
}

// policySource is one policy's definition as it applies to a queue.
type policySource struct {
	label string // "policy 'p'" or "operator policy 'p'"
	name  string
	op    bool
	def   map[string]any
}

// policiesOf lists the policy and the operator policy in effect on q: as
// the broker reports them when it has, else as the vhost's policies match
// it (highest priority first, as the broker picks).
func policiesOf(vh *Vhost, q *Queue) []policySource {
	var out []policySource
	if q.PolicyReported {
		for _, p := range []struct {
			name string
			op   bool
		}{{q.Policy, false}, {q.OperatorPolicy, true}} {
			if p.name == "" {
				continue
			}
			def := q.EffectivePolicy
			if found := mgmtapi.FindPolicy(vh.Policies, p.name, p.op); found != nil {
				def = found.Definition
			}
			out = append(out, policySource{mgmtapi.PolicyLabel(p.name, p.op), p.name, p.op, def})
		}
		if len(out) == 0 && len(q.EffectivePolicy) > 0 {
			out = append(out, policySource{"the effective policy", "", false, q.EffectivePolicy})
		}
		return out
	}
	for _, op := range []bool{false, true} {
		if p := mgmtapi.MatchPolicy(vh.Policies, q.Name, q.Type, op); p != nil {
			out = append(out, policySource{mgmtapi.PolicyLabel(p.Name, op), p.Name, op, p.Definition})
		}
	}
	return out
}

// matchesExchanges reports whether a policy can apply to exchanges.
func matchesExchanges(applyTo string) bool { return applyTo == "all" || applyTo == "exchanges" }

// argWins is a setting where the queue's argument beats any policy.
func argWins(q *Queue, arg, key string, pols []policySource) setting {
	if v, ok := q.Arguments[arg]; ok && v != nil {
		return setting{v, "argument"}
	}
	for _, p := range pols {
		if v, ok := p.def[key]; ok && v != nil {
			return setting{v, p.label}
		}
	}
	return setting{}
}

// lowest is a setting where the lowest of argument and policies wins.
func lowest(q *Queue, arg, key string, pols []policySource) setting {
	var best setting
	var bestN int64
	consider := func(v any, source string) {
		n, res := wireval.Int(v)
		if res != wireval.IntOK {
			if v != nil && !best.set() {
				best = setting{v, source} // shown as it is
			}
			return
		}
		if !best.set() || n < bestN {
			best, bestN = setting{v, source}, n
		}
	}
	if v, ok := q.Arguments[arg]; ok && v != nil {
		consider(v, "argument")
	}
	for _, p := range pols {
		if v, ok := p.def[key]; ok && v != nil {
			consider(v, p.label)
		}
	}
	return best
}

// unlimited is how an unlimited delivery limit shows.
const unlimited = "unlimited"

// deliveryLimit is a quorum queue's effective delivery limit: the broker's
// own figure where it reports one (4.3+), else computed. On 3.x the lowest
// of argument and policy wins, negative included, and no limit is set by
// default. On 4.x a non-negative value beats a negative one (which means
// unlimited), and a queue with neither has the default limit of 20.
func deliveryLimit(v topology.BrokerVersion, q *Queue, pols []policySource) setting {
	if q.DeliveryLimit != nil {
		if n, res := wireval.Int(q.DeliveryLimit); res == wireval.IntOK {
			return setting{n, "broker"}
		}
		if s, _ := q.DeliveryLimit.(string); s == unlimited {
			return setting{unlimited, "broker"}
		}
	}
	type cand struct {
		n      int64
		source string
	}
	var cands []cand
	if n, res := wireval.Int(q.Arguments[topology.ArgDeliveryLimit]); res == wireval.IntOK {
		cands = append(cands, cand{n, "argument"})
	}
	for _, p := range pols {
		if n, res := wireval.Int(p.def["delivery-limit"]); res == wireval.IntOK {
			cands = append(cands, cand{n, p.label})
		}
	}
	if !v.HasDefaultDeliveryLimit() {
		if len(cands) == 0 {
			return setting{}
		}
		best := cands[0]
		for _, c := range cands[1:] {
			if c.n < best.n {
				best = c
			}
		}
		return setting{best.n, best.source}
	}
	var best *cand
	negative := ""
	for i := range cands {
		c := &cands[i]
		if c.n < 0 {
			if negative == "" {
				negative = c.source
			}
			continue
		}
		if best == nil || c.n < best.n {
			best = c
		}
	}
	switch {
	case best != nil:
		return setting{best.n, best.source}
	case negative != "":
		return setting{unlimited, negative}
	}
	return setting{int64(20), "the 4.x default"}
}

// effectiveOf computes q's effective settings.
func effectiveOf(v topology.BrokerVersion, vh *Vhost, q *Queue) *effective {
	pols := policiesOf(vh, q)
	e := &effective{q: q, policyDefs: pols, reported: q.PolicyReported}
	e.dlx = argWins(q, topology.ArgDeadLetterExchange, "dead-letter-exchange", pols)
	e.dlrk = argWins(q, topology.ArgDeadLetterRK, "dead-letter-routing-key", pols)
	e.strategy = argWins(q, topology.ArgDeadLetterStrategy, "dead-letter-strategy", pols)
	e.overflow = argWins(q, topology.ArgOverflow, "overflow", pols)
	e.ttl = lowest(q, topology.ArgMessageTTL, "message-ttl", pols)
	e.maxLength = lowest(q, topology.ArgMaxLength, "max-length", pols)
	e.maxBytes = lowest(q, "x-max-length-bytes", "max-length-bytes", pols)
	e.maxAge = argWins(q, topology.ArgMaxAge, "max-age", pols)
	if q.Type == topology.QueueTypeQuorum {
		e.limit = deliveryLimit(v, q, pols)
	}
	for _, p := range pols {
		for k := range p.def {
			if strings.HasPrefix(k, "ha-") {
				e.haKeys = append(e.haKeys, k)
			}
		}
	}
	sort.Strings(e.haKeys)
	return e
}

// hasDLX: a dead-letter exchange is set. "" (the default exchange) is one.
func (e *effective) hasDLX() bool { _, ok := e.dlx.value.(string); return ok }

// finiteLimit is the delivery limit when it is a non-negative number.
func (e *effective) finiteLimit() (int64, bool) {
	n, ok := e.limit.int()
	return n, ok && n >= 0
}

// overflowMode is the effective x-overflow, the broker's default drop-head
// when unset.
func (e *effective) overflowMode() setting {
	if e.overflow.set() {
		return e.overflow
	}
	return setting{"drop-head", "the broker default"}
}

// strategyMode is the effective dead-letter strategy of a quorum queue.
func (e *effective) strategyMode() setting {
	if e.strategy.set() {
		return e.strategy
	}
	return setting{"at-most-once", "the broker default"}
}

// lengthBound: a max-length or max-length-bytes is set.
func (e *effective) lengthBound() bool { return e.maxLength.set() || e.maxBytes.set() }

// movesOnItsOwn: the queue dead-letters messages without a consumer: they
// expire (a message TTL), or are pushed out at a length limit whose
// overflow dead-letters.
func (e *effective) movesOnItsOwn() (string, bool) {
	if e.ttl.set() {
		return "message-ttl " + topology.FormatArg(e.ttl.value), true
	}
	if o := e.overflowMode().str(); e.lengthBound() && (o == "drop-head" || o == "reject-publish-dlx") {
		return "a length limit with overflow " + o, true
	}
	return "", false
}

// deadLetters reports whether q dead-letters (has a dead-letter exchange).
// The dead-letter exchange does not depend on the broker version, so none
// is passed.
func deadLetters(vh *Vhost, q *Queue) bool {
	return effectiveOf(topology.BrokerVersion{}, vh, q).hasDLX()
}

// evidence is the basic evidence of a queue finding: its type and the
// settings named, in that order.
func (e *effective) evidence(names ...string) []Evidence {
	ev := []Evidence{{Setting: "type", Value: topology.FormatArg(e.q.Type), Source: "broker"}}
	for _, n := range names {
		var s setting
		switch n {
		case "dead-letter-exchange":
			s = e.dlx
		case "dead-letter-routing-key":
			s = e.dlrk
		case "dead-letter-strategy":
			s = e.strategyMode()
		case "overflow":
			s = e.overflowMode()
		case "message-ttl":
			s = e.ttl
		case "max-length":
			s = e.maxLength
		case "max-length-bytes":
			s = e.maxBytes
		case "max-age":
			s = e.maxAge
		case "delivery-limit":
			s = e.limit
		}
		ev = append(ev, s.evidence(n))
	}
	if !e.reported && len(e.policyDefs) > 0 {
		ev = append(ev, Evidence{Setting: "policy", Value: e.policyDefs[0].label, Source: "matched by the audit: the broker had not reported the queue's policy yet"})
	}
	return ev
}
