package mgmtapi

import (
	"fmt"
	"regexp"
	"sync"
)

// Policy is a policy or an operator policy as the management API lists it.
// topology's verify and the audit both pick the one in effect on a queue
// the way the broker does, with MatchPolicy, so that they cannot disagree.
type Policy struct {
	Name       string         `json:"name"`
	Pattern    string         `json:"pattern"`
	ApplyTo    string         `json:"apply-to"`
	Priority   int            `json:"priority"`
	Definition map[string]any `json:"definition"`
	Operator   bool           `json:"-"`
}

// FindPolicy returns the policy (or operator policy) named name in ps.
func FindPolicy(ps []Policy, name string, operator bool) *Policy {
	for i := range ps {
		if ps[i].Name == name && ps[i].Operator == operator {
			return &ps[i]
		}
	}
	return nil
}

// MatchPolicy picks the policy the broker applies to the queue named name
// of type queueType ("classic", "quorum", "stream"): the one of highest
// priority, then lowest name, whose pattern matches the name and that
// applies to the type. A pattern Go's regexp cannot compile (Erlang's has
// more) is skipped.
func MatchPolicy(ps []Policy, name, queueType string, operator bool) *Policy {
	var best *Policy
	for i := range ps {
		p := &ps[i]
		if p.Operator != operator || !AppliesToQueue(p.ApplyTo, queueType) || !PatternMatches(p.Pattern, name) {
			continue
		}
		if best == nil || p.Priority > best.Priority || (p.Priority == best.Priority && p.Name < best.Name) {
			best = p
		}
	}
	return best
}

// AppliesToQueue reports whether a policy with this apply-to can apply to
// a queue of queueType ("" counts as classic, the broker's default).
func AppliesToQueue(applyTo, queueType string) bool {
	switch applyTo {
	case "all", "queues", "":
		return true
	case "classic_queues":
		return queueType == "classic" || queueType == ""
	case "quorum_queues":
		return queueType == "quorum"
	case "streams":
		return queueType == "stream"
	}
	return false
}

// patterns caches compiled policy patterns: every queue is matched against
// every policy.
var patterns sync.Map // pattern -> *regexp.Regexp, or nil when it does not compile

// PatternMatches reports whether a policy's pattern matches name. A
// pattern Go's regexp cannot compile matches nothing.
func PatternMatches(pattern, name string) bool {
	v, ok := patterns.Load(pattern)
	if !ok {
		re, err := regexp.Compile(pattern)
		if err != nil {
			re = nil
		}
		v, _ = patterns.LoadOrStore(pattern, re)
	}
	re, _ := v.(*regexp.Regexp)
	return re != nil && re.MatchString(name)
}

// PolicyLabel names a policy in a finding: "policy 'x'" or
// "operator policy 'x'".
func PolicyLabel(name string, operator bool) string {
	if operator {
		return fmt.Sprintf("operator policy '%s'", name)
	}
	return fmt.Sprintf("policy '%s'", name)
}
