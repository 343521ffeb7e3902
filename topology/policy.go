package topology

import (
	"sort"

	"github.com/dlxbridge/dlxbridge/internal/mgmtapi"
	"github.com/dlxbridge/dlxbridge/internal/wireval"
)

// overridingPolicyKeys are the policy keys that change how a queue
// dead-letters, expires or caps messages. On dlxbridge's queues any of them
// is drift, whether or not the queue's own argument wins: dead-letter keys
// lose to an argument, but TTL, length and delivery limit take the lower of
// the two (and on 4.x a positive policy delivery-limit beats -1), so a policy
// can silently make the quarantine drop or the retry delays shorter.
var overridingPolicyKeys = map[string]string{
	"dead-letter-exchange":    ArgDeadLetterExchange,
	"dead-letter-routing-key": ArgDeadLetterRK,
	"dead-letter-strategy":    ArgDeadLetterStrategy,
	"message-ttl":             ArgMessageTTL,
	"delivery-limit":          ArgDeliveryLimit,
	"max-length":              ArgMaxLength,
	"max-length-bytes":        "x-max-length-bytes",
	"overflow":                ArgOverflow,
	"expires":                 "x-expires",
	"max-age":                 ArgMaxAge,
}

// lowerWins are the policy keys of which the broker applies the lower of
// the policy's value and the queue's argument.
var lowerWins = map[string]bool{
	"message-ttl": true, "delivery-limit": true, "max-length": true, "max-length-bytes": true, "expires": true,
}

// argumentApplies reports whether the queue's own argument want beats the
// policy's value have for key: a lower-wins key whose argument is the
// lower (for delivery-limit, a positive argument against a higher or
// negative policy value: on 4.x a positive value beats -1). Operators set
// such policies broker-wide (a delivery limit above 4.x's default of 20,
// say); they change nothing on a dlxbridge queue that sets its own.
func argumentApplies(key string, want, have any) bool {
	if !lowerWins[key] || want == nil {
		return false
	}
	a, ra := wireval.Int(want)
	p, rp := wireval.Int(have)
	if ra != wireval.IntOK || rp != wireval.IntOK || a < 0 {
		return false
	}
	if key == "delivery-limit" && p < 0 {
		return a > 0
	}
	return a <= p
}

// policyProblems reports every overriding key of the policy and operator
// policy in effect on a queue, and as notes the lower-wins keys its own
// arguments outrank. The broker reports a queue's policy with its
// stats, a few seconds after the queue is declared; until then the policy
// is found by matching the vhost's policies the way the broker does.
func policyProblems(want QueueSpec, have *MgmtQueue, policies []MgmtPolicy) (ps, notes []Problem) {
	type source struct {
		name string
		def  map[string]any
	}
	var sources []source
	known := make([]mgmtapi.Policy, len(policies))
	for i, p := range policies {
		known[i] = mgmtapi.Policy(p)
	}
	if have.PolicyReported && (have.Policy != "" || have.OperatorPolicy != "") {
		// The merged definition; attribute each key to the policy that
		// has it when we can see the policy.
		for _, p := range []struct {
			name     string
			operator bool
		}{{have.Policy, false}, {have.OperatorPolicy, true}} {
			if p.name == "" {
				continue
			}
			def := have.EffectivePolicy
			if found := mgmtapi.FindPolicy(known, p.name, p.operator); found != nil {
				def = found.Definition
			}
			sources = append(sources, source{mgmtapi.PolicyLabel(p.name, p.operator), def})
		}
	} else if !have.PolicyReported {
		// The queue's type decides which apply-to reaches it: a
		// quorum_queues policy does not touch the records stream.
		qtype, _ := want.Args[ArgQueueType].(string)
		for _, operator := range []bool{false, true} {
			if p := mgmtapi.MatchPolicy(known, want.Name, qtype, operator); p != nil {
				sources = append(sources, source{mgmtapi.PolicyLabel(p.Name, operator), p.Definition})
			}
		}
	}
	for _, s := range sources {
		keys := make([]string, 0, len(s.def))
		for k := range s.def {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			arg, ok := overridingPolicyKeys[k]
			if !ok {
				continue
			}
			p := Problem{Kind: KindQueue, Object: queueObject(want.Name), Issue: IssuePolicy,
				Arg: k, Want: FormatArg(want.Args[arg]), Have: FormatArg(s.def[k]), Policy: s.name}
			if argumentApplies(k, want.Args[arg], s.def[k]) {
				p.Issue = IssuePolicyOutranked
				notes = append(notes, p)
				continue
			}
			ps = append(ps, p)
		}
	}
	return ps, notes
}
