package topology

import (
	"context"
	"errors"
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/config"
)

// ErrConflict: an object exists with different arguments or type. Apply
// refuses and declares nothing; it never deletes anything to fix it.
var ErrConflict = errors.New("topology conflicts with the broker")

// Broker is one RabbitMQ node as the topology sees it. Plan and Verify only
// read it; Apply declares what is missing and Delete removes a topology, so
// a Broker changes the broker (unlike quarantine.Inspector, which reads).
// Conn is required; Mgmt is optional and, when set, lets Plan see bindings
// and Verify see actual arguments, policies and bindings.
type Broker struct {
	Conn *amqp.Connection
	Mgmt *Management
	// MgmtError says why a configured management API is not used (set by
	// UseManagement); reports carry it. Empty when none was configured.
	MgmtError string
	mgmtErr   error // MgmtError's error
}

// UseManagement checks that m answers and, if it does, sets Mgmt. If it
// does not (the plugin is not enabled, a wrong port, refused credentials),
// the Broker goes on with AMQP alone, its reports say why, and the error
// is returned for the caller to warn with.
func (in *Broker) UseManagement(ctx context.Context, m *Management) error {
	if err := m.Ping(ctx); err != nil {
		in.Mgmt, in.MgmtError, in.mgmtErr = nil, err.Error(), err
		return err
	}
	if err := m.sameBroker(ctx, in.Conn); err != nil {
		in.Mgmt, in.MgmtError, in.mgmtErr = nil, err.Error(), err
		return err
	}
	in.Mgmt, in.MgmtError, in.mgmtErr = m, "", nil
	return nil
}

// withoutMgmt says why a check that needs the management API did not run.
func (in *Broker) withoutMgmt() string {
	if in.MgmtError != "" {
		return "the management API did not answer"
	}
	return "set broker.management_url or $RABBITMQ_MANAGEMENT_URL"
}

// Version reads the broker's version from the connection's server
// properties.
func (in *Broker) Version() (BrokerVersion, error) {
	return VersionFromProperties(in.Conn.Properties)
}

// BuildFor builds cfg's topology for the version of the broker conn is
// connected to.
func BuildFor(cfg *config.Config, conn *amqp.Connection) (*Topology, error) {
	v, err := VersionFromProperties(conn.Properties)
	if err != nil {
		return nil, err
	}
	return Build(cfg, v)
}

// Plan probes every object of t on throwaway channels and says what Apply
// would do. It declares nothing: existence is checked passively first, and
// the equivalence probe (an active redeclare) only runs on objects that
// exist, where an equivalent declare is a no-op.
func (in *Broker) Plan(ctx context.Context, t *Topology) (*Plan, error) {
	p := &Plan{BrokerVersion: t.Broker.String(), BindingsChecked: in.Mgmt != nil, ManagementError: in.MgmtError, Totals: t.Totals(), Replicas: t.Replicas}
	missing := map[string]bool{} // "exchange name" / "queue name" that will be created
	for _, x := range t.Exchanges {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		pr, d, err := probeExchange(in.Conn, x)
		if err != nil {
			return nil, err
		}
		if pr == probeMissing {
			missing["exchange "+x.Name] = true
		}
		p.add(Step{Kind: KindExchange, Object: exchangeObject(x.Name), Action: action(pr), Diff: d})
	}
	for _, q := range t.Queues {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		pr, d, err := probeQueue(in.Conn, q)
		if err != nil {
			return nil, err
		}
		if pr == probeMissing {
			missing["queue "+q.Name] = true
		}
		p.add(Step{Kind: KindQueue, Object: queueObject(q.Name), Action: action(pr), Diff: d})
	}
	bound := map[string][]MgmtBinding{}
	for _, b := range t.Bindings {
		act := ActionEnsure
		switch {
		case missing["exchange "+b.Exchange] || missing["queue "+b.Queue]:
			act = ActionCreate
		case in.Mgmt != nil:
			bs, ok := bound[b.Queue]
			if !ok {
				var err error
				if bs, err = in.Mgmt.QueueBindings(ctx, b.Queue); err != nil {
					return nil, err
				}
				bound[b.Queue] = bs
			}
			act = ActionCreate
			if hasBinding(bs, b) {
				act = ActionUnchanged
			}
		}
		p.add(Step{Kind: KindBinding, Object: bindingObject(b), Action: act})
	}
	if p.Summary.Ensure > 0 {
		p.NotChecked = append(p.NotChecked, fmt.Sprintf("whether %d binding(s) of existing objects exist: AMQP cannot list bindings, so apply binds them again, which is idempotent (%s)", p.Summary.Ensure, in.withoutMgmt()))
	}
	if err := in.planRetired(ctx, t, p); err != nil {
		return nil, err
	}
	return p, nil
}

// planRetired adds a step for each per-queue retry exchange and lane of
// t.Retired that the broker still has: the move to the shared tiers, as it
// stands. A lane's step counts what waits in it (a passive declare), which
// still returns to its work queue.
func (in *Broker) planRetired(ctx context.Context, t *Topology, p *Plan) error {
	if t.Retired == nil {
		return nil
	}
	for _, x := range t.Retired.Exchanges {
		if err := ctx.Err(); err != nil {
			return err
		}
		err := withChannel(in.Conn, func(ch *amqp.Channel) error { return declareExchange(ch, x, passive) })
		if pr, _, err := classify(exchangeObject(x.Name), err); err != nil {
			return err
		} else if pr == probeOK {
			p.add(Step{Kind: KindExchange, Object: exchangeObject(x.Name), Action: ActionRetired,
				Note: fmt.Sprintf("%s's own retry exchange; %s now retries through the shared tiers", x.Owner, x.Owner)})
		}
	}
	for _, q := range t.Retired.Queues {
		if err := ctx.Err(); err != nil {
			return err
		}
		var st amqp.Queue
		err := withChannel(in.Conn, func(ch *amqp.Channel) error {
			var err error
			st, err = ch.QueueDeclarePassive(q.Name, true, false, false, false, nil)
			return err
		})
		if pr, _, err := classify(queueObject(q.Name), err); err != nil {
			return err
		} else if pr == probeOK {
			note := fmt.Sprintf("%s's own retry lane, empty", q.Owner)
			if st.Messages > 0 {
				note = fmt.Sprintf("%s's own retry lane holding %d message(s), which still return to %s as they expire", q.Owner, st.Messages, q.Owner)
			}
			p.add(Step{Kind: KindQueue, Object: queueObject(q.Name), Action: ActionRetired, Note: note})
		}
	}
	return nil
}

func action(p probe) Action {
	switch p {
	case probeMissing:
		return ActionCreate
	case probeConflict:
		return ActionConflict
	case probeKeep:
		return ActionKeep
	default:
		return ActionUnchanged
	}
}

func hasBinding(bs []MgmtBinding, b BindingSpec) bool {
	for _, x := range bs {
		if x.Source == b.Exchange && x.Destination == b.Queue && x.DestinationType == "queue" && x.RoutingKey == b.Key {
			return true
		}
	}
	return false
}

// firstConflict names the plan's first conflict, and how many more there
// are, for an error that says what to fix without the plan at hand.
func (p *Plan) firstConflict() string {
	for _, s := range p.Steps {
		if s.Action != ActionConflict {
			continue
		}
		what := s.Object
		if s.Diff != nil {
			what = fmt.Sprintf("%s: %s: want %s, have %s", s.Object, s.Diff.Arg, s.Diff.Want, s.Diff.Have)
		}
		if more := p.Summary.Conflict - 1; more > 0 {
			what += fmt.Sprintf(" (and %d more)", more)
		}
		return what
	}
	return fmt.Sprintf("%d object(s) differ", p.Summary.Conflict)
}

// Apply declares what Plan says is missing. It is idempotent: on a broker
// that already matches, it declares nothing and reports every object
// unchanged. If any object conflicts it declares nothing and returns the
// plan with an error wrapping ErrConflict: it never deletes a queue or
// exchange to make it fit.
func (in *Broker) Apply(ctx context.Context, t *Topology) (*Plan, error) {
	p, err := in.Plan(ctx, t)
	if err != nil {
		return nil, err
	}
	if p.Summary.Conflict > 0 {
		return p, fmt.Errorf("%w: %s; nothing was declared", ErrConflict, p.firstConflict())
	}
	exchanges := map[string]ExchangeSpec{}
	for _, x := range t.Exchanges {
		exchanges[exchangeObject(x.Name)] = x
	}
	queues := map[string]QueueSpec{}
	for _, q := range t.Queues {
		queues[queueObject(q.Name)] = q
	}
	bindings := map[string]BindingSpec{}
	for _, b := range t.Bindings {
		bindings[bindingObject(b)] = b
	}
	for _, s := range p.Steps {
		if s.Action != ActionCreate && s.Action != ActionEnsure {
			continue
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		var err error
		switch s.Kind {
		case KindExchange:
			err = withChannel(in.Conn, func(ch *amqp.Channel) error { return declareExchange(ch, exchanges[s.Object], active) })
		case KindQueue:
			err = withChannel(in.Conn, func(ch *amqp.Channel) error { return declareQueue(ch, queues[s.Object], active) })
		case KindBinding:
			err = withChannel(in.Conn, func(ch *amqp.Channel) error { return bindQueue(ch, bindings[s.Object]) })
		}
		if err != nil {
			if pr, d, cerr := classify(s.Object, err); cerr == nil && pr == probeConflict {
				return nil, fmt.Errorf("%w: declare %s: %s: want %s, have %s (changed since the plan)", ErrConflict, s.Object, d.Arg, d.Want, d.Have)
			}
			return nil, fmt.Errorf("declare %s: %w", s.Object, err)
		}
	}
	p.Applied = true
	return p, nil
}
