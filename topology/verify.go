package topology

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/dlxbridge/dlxbridge/config"

	"github.com/dlxbridge/dlxbridge/internal/wireval"
)

// Verify compares the broker with t and reports every difference. It
// declares nothing. With Mgmt it reads actual arguments, types, effective
// policies and bindings; without it, it checks existence (passive declare)
// and argument equivalence (an equivalent redeclare on a throwaway channel,
// where the broker's 406 names the first differing argument), and lists in
// NotChecked what AMQP cannot see.
func (in *Broker) Verify(ctx context.Context, t *Topology) (*VerifyReport, error) {
	r := &VerifyReport{BrokerVersion: t.Broker.String(), Management: in.Mgmt != nil, ManagementError: in.MgmtError, Problems: []Problem{}}
	var err error
	if in.Mgmt != nil {
		err = in.verifyManagement(ctx, t, r)
	} else {
		err = in.verifyAMQP(ctx, t, r)
	}
	if err != nil {
		return nil, err
	}
	return r, nil
}

func (in *Broker) verifyAMQP(ctx context.Context, t *Topology, r *VerifyReport) error {
	for _, x := range t.Exchanges {
		if err := ctx.Err(); err != nil {
			return err
		}
		pr, d, err := probeExchange(in.Conn, x)
		if err != nil {
			return err
		}
		r.Objects++
		r.addProbe(KindExchange, exchangeObject(x.Name), pr, d)
	}
	for _, q := range t.Queues {
		if err := ctx.Err(); err != nil {
			return err
		}
		pr, d, err := probeQueue(in.Conn, q)
		if err != nil {
			return err
		}
		r.Objects++
		r.addProbe(KindQueue, queueObject(q.Name), pr, d)
	}
	why := in.withoutMgmt()
	r.NotChecked = []string{
		"bindings: AMQP cannot list them (" + why + ")",
		"policies that override queue arguments: only the management API shows them (" + why + ")",
		"arguments beyond the first difference per queue, and arguments the broker does not compare on redeclare: the broker names one per refused declare (" + why + ")",
		"replicas online: only the management API shows a queue's members (" + why + ")",
	}
	return nil
}

func (r *VerifyReport) addProbe(kind Kind, object string, pr probe, d *ArgDiff) {
	switch pr {
	case probeMissing:
		r.Problems = append(r.Problems, Problem{Kind: kind, Object: object, Issue: IssueMissing})
	case probeConflict:
		r.Problems = append(r.Problems, Problem{Kind: kind, Object: object, Issue: issueFor(kind, d.Arg), Arg: d.Arg, Want: d.Want, Have: d.Have})
	case probeKeep:
		r.Notes = append(r.Notes, declaredWith(object, *d))
	}
}

// declaredWith is the note for a replica count that differs from the one
// the queue was declared with: not drift, since no redeclare can change it.
func declaredWith(object string, d ArgDiff) Problem {
	return Problem{Kind: KindQueue, Object: object, Issue: IssueDeclaredWith, Arg: d.Arg, Want: d.Want,
		Have: d.Have + " (read at creation only: the queue keeps its members; see Replicas in docs/topology.md)"}
}

func issueFor(kind Kind, arg string) Issue {
	switch {
	case kind == KindQueue && arg == ArgQueueType:
		return IssueQueueType
	case kind == KindExchange && arg == "type":
		return IssueExchangeType
	case arg == "durable" || arg == "auto_delete" || arg == "internal" || arg == "exclusive":
		return IssueProperty
	default:
		return IssueArgument
	}
}

func (in *Broker) verifyManagement(ctx context.Context, t *Topology, r *VerifyReport) error {
	m := in.Mgmt
	for _, x := range t.Exchanges {
		r.Objects++
		have, err := m.Exchange(ctx, x.Name)
		if errors.Is(err, ErrNotFound) {
			r.Problems = append(r.Problems, Problem{Kind: KindExchange, Object: exchangeObject(x.Name), Issue: IssueMissing})
			continue
		}
		if err != nil {
			return err
		}
		r.Problems = append(r.Problems, exchangeProblems(x, have)...)
	}
	policies, err := m.Policies(ctx)
	if err != nil {
		return err
	}
	present := map[string]bool{}
	nodes := -1 // the cluster's size, read when first needed; 0 if unreadable
	for _, q := range t.Queues {
		r.Objects++
		have, err := m.Queue(ctx, q.Name)
		if errors.Is(err, ErrNotFound) {
			r.Problems = append(r.Problems, Problem{Kind: KindQueue, Object: queueObject(q.Name), Issue: IssueMissing})
			continue
		}
		if err != nil {
			return err
		}
		present[q.Name] = true
		ps, notes := queueProblems(q, have)
		r.Problems = append(r.Problems, ps...)
		r.Notes = append(r.Notes, notes...)
		ps, notes = policyProblems(q, have, policies)
		r.Problems = append(r.Problems, ps...)
		r.Notes = append(r.Notes, notes...)
		r.Problems = append(r.Problems, dropRisks(q, have)...)
		if h, ok := have.Replicas(); ok && nodes < 0 && t.Replicas > h.Members {
			if nodes, err = m.clusterNodes(ctx); err != nil {
				nodes = 0
				r.NotChecked = append(r.NotChecked, "whether the cluster has the nodes for broker.replicas: "+err.Error())
			}
		}
		ps, notes = replicaFindings(q, have, t.Replicas, max(nodes, 0))
		r.Problems = append(r.Problems, ps...)
		r.Notes = append(r.Notes, notes...)
	}
	return in.verifyBindings(ctx, t, r, present)
}

func exchangeProblems(want ExchangeSpec, have *MgmtExchange) []Problem {
	obj := exchangeObject(want.Name)
	var ps []Problem
	if have.Type != want.Kind {
		ps = append(ps, Problem{Kind: KindExchange, Object: obj, Issue: IssueExchangeType, Arg: "type", Want: FormatArg(want.Kind), Have: FormatArg(have.Type)})
	}
	for _, p := range []struct {
		name       string
		want, have bool
	}{{"durable", true, have.Durable}, {"auto_delete", false, have.AutoDelete}, {"internal", want.Internal, have.Internal}} {
		if p.want != p.have {
			ps = append(ps, Problem{Kind: KindExchange, Object: obj, Issue: IssueProperty, Arg: p.name, Want: FormatArg(p.want), Have: FormatArg(p.have)})
		}
	}
	for _, d := range diffArgs(obj, want.Args, have.Arguments) {
		ps = append(ps, Problem{Kind: KindExchange, Object: obj, Issue: IssueArgument, Arg: d.Arg, Want: d.Want, Have: d.Have})
	}
	return ps
}

// queueProblems compares a queue's type, properties and arguments; a
// replica count other than the declared one is a note, not a problem.
func queueProblems(want QueueSpec, have *MgmtQueue) (ps, notes []Problem) {
	obj := queueObject(want.Name)
	wantType := want.queueType()
	wrongType := have.Type != wantType
	if wrongType {
		ps = append(ps, Problem{Kind: KindQueue, Object: obj, Issue: IssueQueueType, Arg: ArgQueueType, Want: FormatArg(wantType), Have: FormatArg(have.Type)})
	}
	if !have.Durable || have.AutoDelete {
		ps = append(ps, Problem{Kind: KindQueue, Object: obj, Issue: IssueProperty, Arg: "durable, auto_delete",
			Want: "true, false", Have: fmt.Sprintf("%t, %t", have.Durable, have.AutoDelete)})
	}
	for _, d := range diffArgs(obj, want.Args, have.Arguments) {
		if wrongType && d.Arg == ArgQueueType {
			continue
		}
		if declareTimeArg(d.Arg) {
			notes = append(notes, declaredWith(obj, d))
			continue
		}
		ps = append(ps, Problem{Kind: KindQueue, Object: obj, Issue: IssueArgument, Arg: d.Arg, Want: d.Want, Have: d.Have})
	}
	return ps, notes
}

// SafeDeliveryLimit is the smallest effective delivery limit verify accepts
// on a quarantine: it has no dead-letter exchange, so a message requeued
// past the limit (an inspection consumer that nacks, a connection that
// keeps dropping) is dropped. A large finite limit, as a policy may set one,
// is the advice where -1 cannot be used.
const SafeDeliveryLimit = 100000

// dropRisks reports the effective settings, arguments and policies applied
// as the broker reports them, under which a quarantine queue can drop a
// message: a delivery limit below SafeDeliveryLimit with no dead-letter
// exchange, or an overflow that drops the head. The limit is read from the
// broker's own figure (4.x), not derived from the policy, because 4.1 and
// 4.2 do not apply a changed limit to an existing queue; 3.x reports no
// figure, and applies the lower of the argument and the policy's, so that
// is what counts there.
func dropRisks(want QueueSpec, have *MgmtQueue) []Problem {
	if want.Role != RoleQuarantine || have.Type != QueueTypeQuorum {
		return nil
	}
	obj := queueObject(want.Name)
	effective := func(arg, key string) any {
		if v, ok := have.Arguments[arg]; ok {
			return v
		}
		return have.EffectivePolicy[key]
	}
	var ps []Problem
	dlx, _ := effective(ArgDeadLetterExchange, "dead-letter-exchange").(string)
	limit, res := wireval.Int(have.DeliveryLimit)
	if have.DeliveryLimit == nil {
		limit, res = declaredDeliveryLimit(have)
	}
	if n := limit; res == wireval.IntOK && n >= 0 && n < SafeDeliveryLimit && dlx == "" {
		ps = append(ps, Problem{Kind: KindQueue, Object: obj, Issue: IssueCanDrop, Arg: "delivery_limit",
			Want: fmt.Sprintf("unlimited or at least %d", SafeDeliveryLimit),
			Have: fmt.Sprintf("%d, no dead-letter exchange: a message requeued %d times is dropped", n, n)})
	}
	if o, _ := effective(ArgOverflow, "overflow").(string); o == "drop-head" {
		ps = append(ps, Problem{Kind: KindQueue, Object: obj, Issue: IssueCanDrop, Arg: "overflow",
			Want: FormatArg(OverflowReject), Have: FormatArg(o) + ": the oldest message is dropped at the length limit"})
	}
	return ps
}

// declaredDeliveryLimit is the delivery limit in force on a queue whose
// broker reports none of its own (3.x, which has no default limit): the
// lower of its x-delivery-limit argument and its policies' delivery-limit,
// as the broker applies them. res is not IntOK when neither sets one. A
// negative value is left out: 3.10 refuses it in a policy, and dlxbridge
// never declares one there.
func declaredDeliveryLimit(have *MgmtQueue) (limit int64, res wireval.IntResult) {
	res = wireval.IntWrongType
	for _, v := range []any{have.Arguments[ArgDeliveryLimit], have.EffectivePolicy["delivery-limit"]} {
		n, r := wireval.Int(v)
		if r != wireval.IntOK || n < 0 {
			continue
		}
		if res != wireval.IntOK || n < limit {
			limit, res = n, wireval.IntOK
		}
	}
	return limit, res
}

// verifyBindings checks that every configured binding exists, and that
// nothing else is bound to dlxbridge's queues or from the exchanges it owns
// (dead and retry exchanges): an extra binding there sends dead letters or
// retries somewhere the config does not say. Work exchanges are shared with
// other consumers, so their other bindings are not drift.
func (in *Broker) verifyBindings(ctx context.Context, t *Topology, r *VerifyReport, present map[string]bool) error {
	want := map[BindingSpec]bool{}
	for _, b := range t.Bindings {
		want[b] = true
	}
	seen := map[BindingSpec]bool{}
	unexpected := map[BindingSpec]bool{}
	for _, q := range t.Queues {
		if !present[q.Name] {
			continue
		}
		bs, err := in.Mgmt.QueueBindings(ctx, q.Name)
		if err != nil {
			return err
		}
		for _, b := range bs {
			spec := BindingSpec{Exchange: b.Source, Queue: b.Destination, Key: b.RoutingKey}
			switch {
			case b.Source == "": // the default exchange's implicit binding
			case want[spec]:
				seen[spec] = true
			default:
				unexpected[spec] = true
			}
		}
	}
	// The exchanges dlxbridge owns: each work queue's dead-letter and
	// retry exchanges, and the shared tiers' (once; other configs on the
	// vhost share them, so their own tiers and work queues are bound
	// there too: see sharedBindingExpected).
	owned := map[string]bool{}
	var exchanges []string
	for _, w := range t.Work {
		for _, x := range []string{w.DeadExchange, w.RetryExchange, w.ReturnExchange} {
			if x != "" && !owned[x] {
				owned[x] = true
				exchanges = append(exchanges, x)
			}
		}
	}
	for _, x := range t.Exchanges {
		if x.Owner == "" && !owned[x.Name] {
			owned[x.Name] = true
			exchanges = append(exchanges, x.Name)
		}
	}
	shared := t.sharedExchanges()
	for _, x := range exchanges {
		bs, err := in.Mgmt.ExchangeBindings(ctx, x)
		if errors.Is(err, ErrNotFound) {
			continue // reported as a missing exchange
		}
		if err != nil {
			return err
		}
		for _, b := range bs {
			spec := BindingSpec{Exchange: b.Source, Queue: b.Destination, Key: b.RoutingKey}
			if b.DestinationType != "queue" {
				spec.Queue = b.DestinationType + " " + b.Destination
			}
			if !want[spec] && !shared.expected(b) {
				unexpected[spec] = true
			}
		}
	}
	for _, b := range t.Bindings {
		r.Objects++
		if !seen[b] {
			r.Problems = append(r.Problems, Problem{Kind: KindBinding, Object: bindingObject(b), Issue: IssueMissing})
		}
	}
	extra := make([]BindingSpec, 0, len(unexpected))
	for b := range unexpected {
		extra = append(extra, b)
	}
	sort.Slice(extra, func(i, j int) bool { return bindingObject(extra[i]) < bindingObject(extra[j]) })
	for _, b := range extra {
		r.Problems = append(r.Problems, Problem{Kind: KindBinding, Object: bindingObject(b), Issue: IssueUnexpectedBinding})
	}
	return nil
}

// sharedNames are the shared tiers' exchange and catch-all names of a
// topology ("" when it has none).
type sharedNames struct{ delay, ret, unrouted, catchAll string }

func (t *Topology) sharedExchanges() sharedNames {
	p := t.sharedPrefix()
	if p == "" {
		return sharedNames{}
	}
	s := config.SharedTiers{Prefix: p}
	return sharedNames{s.DelayExchange(), s.ReturnExchange(), s.UnroutedExchange(), s.Unrouted()}
}

// expected reports whether b is a binding that another config sharing the
// tiers declares: a tier of its own policy on the delay exchange (named
// "<delay>.*" and bound by its name) or a work queue of its own on the
// return exchange (bound by its name). Anything else bound there receives
// retries that are not its own: a queue bound to the delay exchange with a
// work queue's name as key gets that queue's retries as they are published,
// one bound to the return exchange with another's name gets them as they
// come back.
func (s sharedNames) expected(b MgmtBinding) bool {
	if s.delay == "" || b.DestinationType != "queue" || b.RoutingKey != b.Destination {
		return b.Source == s.unrouted && s.unrouted != "" && b.DestinationType == "queue" && b.Destination == s.catchAll && b.RoutingKey == ""
	}
	switch b.Source {
	case s.delay:
		return strings.HasPrefix(b.Destination, s.delay+".")
	case s.ret:
		return true
	}
	return false
}
