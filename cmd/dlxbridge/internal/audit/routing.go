package audit

import (
	"sort"
	"strings"

	"github.com/dlxbridge/dlxbridge/internal/mgmtapi"
	"github.com/dlxbridge/dlxbridge/internal/wireval"
)

// router evaluates where the broker would route a message in one vhost,
// from the listed exchanges and bindings.
type router struct {
	vh        *Vhost
	exchanges map[string]*Exchange
	queues    map[string]*Queue
	bySource  map[string][]Binding
}

func newRouter(vh *Vhost) *router {
	r := &router{vh: vh, exchanges: map[string]*Exchange{}, queues: map[string]*Queue{}, bySource: map[string][]Binding{}}
	for i := range vh.Exchanges {
		r.exchanges[vh.Exchanges[i].Name] = &vh.Exchanges[i]
	}
	for i := range vh.Queues {
		r.queues[vh.Queues[i].Name] = &vh.Queues[i]
	}
	for _, b := range vh.Bindings {
		if b.Source == "" {
			continue // the default exchange's implicit bindings: routed by name
		}
		r.bySource[b.Source] = append(r.bySource[b.Source], b)
	}
	return r
}

// route is where a message goes.
type route struct {
	// missing names an exchange on the way that does not exist.
	missing string
	// queues are the queues it certainly reaches.
	queues []string
	// maybe: it may reach (more) queues, depending on what the listing
	// cannot tell: the message's own routing key or headers, or an
	// exchange type whose routing the audit does not model.
	maybe bool
	// via is the alternate exchange that took it, if any.
	via string
}

// nowhere: certainly no queue gets the message.
func (rt route) nowhere() bool { return rt.missing == "" && len(rt.queues) == 0 && !rt.maybe }

// route evaluates exchange x for routing key key (nil: the message's own,
// unknown here).
func (r *router) route(x string, key *string) route {
	var rt route
	seen := map[string]bool{}
	reached := map[string]bool{}
	r.walk(x, key, seen, reached, &rt)
	for q := range reached {
		rt.queues = append(rt.queues, q)
	}
	sort.Strings(rt.queues)
	return rt
}

func (r *router) walk(x string, key *string, seen, reached map[string]bool, rt *route) {
	if seen[x] {
		return
	}
	seen[x] = true
	if x == "" { // the default exchange: to the queue named by the key
		switch {
		case key == nil:
			rt.maybe = true
		case r.queues[*key] != nil:
			reached[*key] = true
		}
		return
	}
	ex, ok := r.exchanges[x]
	if !ok {
		if rt.missing == "" {
			rt.missing = x
		}
		return
	}
	kind := ex.Type
	if kind == "x-delayed-message" { // routes as its x-delayed-type, later
		kind, _ = wireval.String(ex.Arguments["x-delayed-type"])
	}
	before := len(reached)
	wasMaybe := rt.maybe
	for _, b := range r.bySource[x] {
		hit := false
		switch kind {
		case "fanout":
			hit = true
		case "direct":
			if key == nil {
				rt.maybe = true
			} else {
				hit = b.RoutingKey == *key
			}
		case "topic":
			if key == nil {
				rt.maybe = true
			} else {
				hit = topicMatch(b.RoutingKey, *key)
			}
		default: // headers, consistent hash, plugins: depends on the message
			rt.maybe = true
		}
		if !hit {
			continue
		}
		if b.DestinationType == "exchange" {
			r.walk(b.Destination, key, seen, reached, rt)
		} else if r.queues[b.Destination] != nil {
			reached[b.Destination] = true
		}
	}
	if len(reached) == before && rt.maybe == wasMaybe {
		if ae := r.alternateExchange(ex); ae != "" {
			if rt.via == "" {
				rt.via = ae
			}
			r.walk(ae, key, seen, reached, rt)
		}
	}
}

// alternateExchange is ex's alternate exchange: its argument, else a
// policy's (the highest-priority one that matches it).
func (r *router) alternateExchange(ex *Exchange) string {
	if s, ok := wireval.String(ex.Arguments["alternate-exchange"]); ok {
		return s
	}
	var best *Policy
	for i := range r.vh.Policies {
		p := &r.vh.Policies[i]
		if p.Operator || !matchesExchanges(p.ApplyTo) {
			continue
		}
		if !mgmtapi.PatternMatches(p.Pattern, ex.Name) {
			continue
		}
		if best == nil || p.Priority > best.Priority {
			best = p
		}
	}
	if best != nil {
		s, _ := wireval.String(best.Definition["alternate-exchange"])
		return s
	}
	return ""
}

// topicMatch matches an AMQP topic binding pattern: words split by ".",
// "*" one word, "#" zero or more. Both are other applications' text (a
// binding key, a dead-letter routing key): it runs in time proportional to
// their product, not by trying every split of the key at each "#", which
// a pattern of many "#" words that fails at its end makes exponential.
func topicMatch(pattern, key string) bool {
	return topicWords(strings.Split(pattern, "."), strings.Split(key, "."))
}

// topicWords: ok[j] is whether the pattern's words so far match the key's
// first j words, a pattern word at a time.
func topicWords(p, k []string) bool {
	ok := make([]bool, len(k)+1)
	next := make([]bool, len(k)+1)
	ok[0] = true
	for _, w := range p {
		switch w {
		case "#": // any j' <= j that matched
			seen := false
			for j := range ok {
				seen = seen || ok[j]
				next[j] = seen
			}
		default:
			next[0] = false
			for j := 1; j <= len(k); j++ {
				next[j] = ok[j-1] && (w == "*" || k[j-1] == w)
			}
		}
		ok, next = next, ok
	}
	return ok[len(k)]
}
