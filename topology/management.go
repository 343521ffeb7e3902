package topology

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/internal/amqpx"
	"github.com/dlxbridge/dlxbridge/internal/mgmtapi"
	"github.com/dlxbridge/dlxbridge/internal/urllist"
)

// ErrNotFound is the management API's 404.
var ErrNotFound = mgmtapi.ErrNotFound

// Management reads what AMQP cannot: a queue's actual arguments and
// effective policy, an exchange's properties, and bindings. Read-only.
type Management struct {
	// BaseURL is e.g. "http://127.0.0.1:15672", without credentials.
	BaseURL string
	// Vhost is the virtual host of the AMQP connection.
	Vhost          string
	User, Password string
	// Client defaults to one with a 10s timeout. NewManagement, given the
	// APIs of several nodes, sets one that sends each request to the node
	// that last answered, else to the next, with 10s for each.
	Client *http.Client
}

// NewManagement builds a client for baseURL. Credentials come from
// baseURL's userinfo if it has one, else from the AMQP URL's; the vhost is
// the AMQP URL's. Either may list several nodes, comma separated: the
// AMQP URL's first node gives the credentials and vhost (every one names
// the same vhost), and requests go to the management API that last
// answered, else to the next (see Client). Errors quote neither URL, not
// even one that does not parse.
func NewManagement(baseURL, amqpURL string) (*Management, error) {
	entries := urllist.Split(baseURL, "http", "https")
	var bases []*url.URL
	var user *url.Userinfo
	for i, e := range entries {
		kind := "management URL"
		if len(entries) > 1 {
			kind = fmt.Sprintf("management URL %d of %d", i+1, len(entries))
		}
		u, err := amqpx.ParseURL(kind, e)
		var ue *amqpx.URLError
		if errors.As(err, &ue) && strings.Contains(e, ",") {
			return nil, &amqpx.URLError{Kind: kind, Reason: ue.Reason + "; several nodes' APIs are URLs separated by commas, each with its scheme: http://h1:15672,http://h2:15672"}
		}
		if err != nil {
			return nil, err
		}
		if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" {
			return nil, &amqpx.URLError{Kind: kind, Reason: "want http(s)://[user:password@]host[:port][/path], e.g. http://127.0.0.1:15672"}
		}
		if i == 0 {
			user = u.User
		} else if u.User.String() != user.String() {
			return nil, &amqpx.URLError{Kind: kind, Reason: "its user name or password differs from URL 1's: the nodes of one cluster share their users, so give the same (or none, for the AMQP URL's)"}
		}
		bases = append(bases, &url.URL{Scheme: u.Scheme, Host: u.Host, Path: strings.TrimRight(u.Path, "/")})
	}
	eps, err := amqpx.ParseURLList(amqpURL)
	if err != nil {
		return nil, err
	}
	first := urllist.Split(amqpURL, "amqp", "amqps")[0]
	uri, err := amqp.ParseURI(first)
	if err != nil { // ParseURLList accepted it: cannot happen
		return nil, &amqpx.URLError{Kind: "AMQP URL", Reason: "does not parse"}
	}
	m := &Management{Vhost: eps[0].Vhost, User: uri.Username, Password: uri.Password}
	if user != nil {
		m.User = user.Username()
		m.Password, _ = user.Password()
	}
	m.BaseURL = bases[0].String()
	if len(bases) > 1 {
		m.Client = newNodesClient(bases)
	}
	return m, nil
}

// MgmtQueue is the part of GET /api/queues/{vhost}/{name} that verify uses.
type MgmtQueue struct {
	Name       string         `json:"name"`
	Type       string         `json:"type"`
	Durable    bool           `json:"durable"`
	AutoDelete bool           `json:"auto_delete"`
	Arguments  map[string]any `json:"arguments"`
	// Policy and OperatorPolicy name the policies in effect, and
	// EffectivePolicy is their merged definition. The broker fills these in
	// with its stats, a few seconds after a queue is declared;
	// PolicyReported is false until then.
	Policy          string         `json:"policy"`
	OperatorPolicy  string         `json:"operator_policy"`
	EffectivePolicy map[string]any `json:"effective_policy_definition"`
	PolicyReported  bool           `json:"-"`
	// Consumers is the broker's count from its statistics, a few seconds
	// late (absent, so 0, until first reported), and ConsumerDetails the
	// consumers it lists, which it adds at once but, for a stream reader
	// whose channel closed without a cancel, kept listing for half a minute
	// and more (3.10.8 and 4.0.5). On a stream, these are the only count:
	// a passive declare says 0 with a reader attached. See ConsumerCount.
	Consumers       int               `json:"consumers"`
	ConsumerDetails []json.RawMessage `json:"consumer_details"`
	// DeliveryLimit is a quorum queue's effective delivery limit, argument
	// and policies applied, as RabbitMQ 4.x reports it: a number or
	// "unlimited" (seen on 4.3.6, a few seconds after a policy changed).
	// Absent (nil) on 3.x and before the broker reports it.
	DeliveryLimit any `json:"delivery_limit"`
	// Members, Online and Leader are a quorum queue's or stream's
	// replicas: every member's node, the nodes the broker counts online,
	// and the leader's node. State is the broker's word for the queue
	// ("running", "minority", ...; 3.x reports none for quorum queues, and
	// some versions a table for a classic queue, hence any). See Replicas.
	Members []string `json:"members"`
	Online  []string `json:"online"`
	Leader  string   `json:"leader"`
	State   any      `json:"state"`
}

// ConsumerCount is the larger of Consumers and len(ConsumerDetails): a
// reader that either one still shows counts.
func (q *MgmtQueue) ConsumerCount() int { return max(q.Consumers, len(q.ConsumerDetails)) }

// MgmtExchange is the part of GET /api/exchanges/{vhost}/{name} verify uses.
type MgmtExchange struct {
	Name       string         `json:"name"`
	Type       string         `json:"type"`
	Durable    bool           `json:"durable"`
	AutoDelete bool           `json:"auto_delete"`
	Internal   bool           `json:"internal"`
	Arguments  map[string]any `json:"arguments"`
}

// MgmtBinding is one binding as the management API lists it.
type MgmtBinding struct {
	Source          string         `json:"source"`
	Destination     string         `json:"destination"`
	DestinationType string         `json:"destination_type"`
	RoutingKey      string         `json:"routing_key"`
	Arguments       map[string]any `json:"arguments"`
}

// MgmtPolicy is a policy or operator policy.
type MgmtPolicy struct {
	Name       string         `json:"name"`
	Pattern    string         `json:"pattern"`
	ApplyTo    string         `json:"apply-to"`
	Priority   int            `json:"priority"`
	Definition map[string]any `json:"definition"`
	Operator   bool           `json:"-"`
}

// Ping checks that the management API answers with these credentials.
func (m *Management) Ping(ctx context.Context) error {
	var who struct {
		Name string `json:"name"`
	}
	if err := m.get(ctx, "/api/whoami", &who); err != nil {
		if errors.Is(err, ErrNotFound) {
			return fmt.Errorf("management API at %s: /api/whoami not found", m.BaseURL)
		}
		return err
	}
	return nil
}

// ErrOtherBroker: the management API answers for another cluster than the
// AMQP connection's.
var ErrOtherBroker = errors.New("not the same broker")

// sameBroker refuses a management API of another cluster than the one conn
// is connected to (a broker.management_url left at the local default while
// the AMQP URL names another broker): verifying against it would report
// the other broker's objects. Either side without a cluster name passes.
func (m *Management) sameBroker(ctx context.Context, conn *amqp.Connection) error {
	if conn == nil {
		return nil
	}
	amqpName, _ := conn.Properties["cluster_name"].(string)
	var overview struct {
		ClusterName string `json:"cluster_name"`
	}
	if err := m.get(ctx, "/api/overview", &overview); err != nil {
		return err
	}
	if amqpName != "" && overview.ClusterName != "" && amqpName != overview.ClusterName {
		return fmt.Errorf("management API at %s is of cluster %q, but the AMQP connection is to %q: %w", m.BaseURL, overview.ClusterName, amqpName, ErrOtherBroker)
	}
	return nil
}

// Queue reads one queue; ErrNotFound if it does not exist.
func (m *Management) Queue(ctx context.Context, name string) (*MgmtQueue, error) {
	var raw map[string]json.RawMessage
	if err := m.get(ctx, "/api/queues/"+m.vh()+"/"+url.PathEscape(name), &raw); err != nil {
		return nil, fmt.Errorf("%s: %w", queueObject(name), err)
	}
	var q MgmtQueue
	if err := decodeRaw(raw, &q); err != nil {
		return nil, fmt.Errorf("%s: %w", queueObject(name), err)
	}
	_, q.PolicyReported = raw["effective_policy_definition"]
	return &q, nil
}

// Exchange reads one exchange; ErrNotFound if it does not exist.
func (m *Management) Exchange(ctx context.Context, name string) (*MgmtExchange, error) {
	var x MgmtExchange
	if err := m.get(ctx, "/api/exchanges/"+m.vh()+"/"+url.PathEscape(name), &x); err != nil {
		return nil, fmt.Errorf("%s: %w", exchangeObject(name), err)
	}
	return &x, nil
}

// QueueBindings lists every binding whose destination is the queue (the
// default exchange's implicit one included).
func (m *Management) QueueBindings(ctx context.Context, queue string) ([]MgmtBinding, error) {
	var bs []MgmtBinding
	if err := m.get(ctx, "/api/queues/"+m.vh()+"/"+url.PathEscape(queue)+"/bindings", &bs); err != nil {
		return nil, fmt.Errorf("bindings of %s: %w", queueObject(queue), err)
	}
	return bs, nil
}

// ExchangeBindings lists every binding whose source is the exchange.
func (m *Management) ExchangeBindings(ctx context.Context, exchange string) ([]MgmtBinding, error) {
	var bs []MgmtBinding
	if err := m.get(ctx, "/api/exchanges/"+m.vh()+"/"+url.PathEscape(exchange)+"/bindings/source", &bs); err != nil {
		return nil, fmt.Errorf("bindings from %s: %w", exchangeObject(exchange), err)
	}
	return bs, nil
}

// Policies lists the vhost's policies and operator policies.
func (m *Management) Policies(ctx context.Context) ([]MgmtPolicy, error) {
	var ps, ops []MgmtPolicy
	if err := m.get(ctx, "/api/policies/"+m.vh(), &ps); err != nil {
		return nil, fmt.Errorf("policies: %w", err)
	}
	if err := m.get(ctx, "/api/operator-policies/"+m.vh(), &ops); err != nil && !errors.Is(err, ErrNotFound) {
		return nil, fmt.Errorf("operator policies: %w", err)
	}
	for i := range ops {
		ops[i].Operator = true
	}
	return append(ps, ops...), nil
}

func (m *Management) vh() string {
	v := m.Vhost
	if v == "" {
		v = "/"
	}
	return url.PathEscape(v)
}

// get reads path through the project's one management client (bounded
// bodies, exact numbers, errors that quote no credentials).
func (m *Management) get(ctx context.Context, path string, into any) error {
	c := &mgmtapi.Client{BaseURL: m.BaseURL, User: m.User, Password: m.Password, HTTP: m.Client}
	return c.Get(ctx, path, into)
}

// decodeRaw decodes an already split object, keeping numbers exact.
func decodeRaw(raw map[string]json.RawMessage, into any) error {
	b, err := json.Marshal(raw)
	if err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	return dec.Decode(into)
}
