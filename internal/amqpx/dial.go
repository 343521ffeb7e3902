package amqpx

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/internal/urllist"
)

// A broker URL may name several nodes of one cluster, comma separated
// ("amqp://u:p@n1:5672/,amqp://u:p@n2:5672/"): --url, RABBITMQ_URL and
// consumer.Config.URL all take that form. Every connection the bridge
// opens is dialed here, trying the nodes in turn, so failover has one home.

// DialTimeout bounds one connection attempt to one node (TCP connect, TLS
// and AMQP handshake) unless the URL sets connection_timeout. A node that
// is down usually refuses at once; one that is cut off (a partition, a
// stopped VM) answers nothing, and this is how long it holds up the next.
const DialTimeout = 10 * time.Second

// ParseURLList parses raw as one or more AMQP URLs (see urllist.Split for
// where it splits) and returns what can be shown of each. Every entry must
// parse as ParseAMQPURL reads it, and all must name the same vhost: they are
// meant to be nodes of one cluster, and a list whose vhosts differ would
// switch the bridge to another set of queues on failover. The error is a
// *URLError naming the entry by position, quoting nothing of raw.
func ParseURLList(raw string) ([]Endpoint, error) {
	entries := urllist.Split(raw, "amqp", "amqps")
	if len(entries) == 1 {
		ep, err := ParseAMQPURL(entries[0])
		if err != nil {
			return nil, withListHint(err, entries[0])
		}
		return []Endpoint{ep}, nil
	}
	eps := make([]Endpoint, len(entries))
	for i, e := range entries {
		kind := fmt.Sprintf("AMQP URL %d of %d", i+1, len(entries))
		if e == "" {
			return nil, &URLError{Kind: kind, Reason: "empty (a comma too many?)"}
		}
		ep, err := ParseAMQPURL(e)
		if err != nil {
			var ue *URLError
			if errors.As(withListHint(err, e), &ue) {
				return nil, &URLError{Kind: kind, Reason: ue.Reason}
			}
			return nil, err
		}
		if ep.Vhost != eps[0].Vhost && i > 0 {
			return nil, &URLError{Kind: "AMQP URL list", Reason: fmt.Sprintf(
				"URL %d names vhost %q, URL 1 vhost %q: the nodes of one cluster serve the same vhosts, so every URL must name the same one", i+1, ep.Vhost, eps[0].Vhost)}
		}
		eps[i] = ep
	}
	return eps, nil
}

// withListHint adds, to the error of a URL with a comma in it, how a list
// is written: "amqp://h1:5672,h2:5672/" is not one.
func withListHint(err error, raw string) error {
	var ue *URLError
	if !strings.Contains(raw, ",") || !errors.As(err, &ue) {
		return err
	}
	return &URLError{Kind: ue.Kind, Reason: ue.Reason + "; several nodes are written as URLs separated by commas, each with its scheme: amqp://h1:5672/,amqp://h2:5672/"}
}

// Node is the node a connection was made to.
type Node struct {
	// Endpoint is its URL, without the password.
	Endpoint Endpoint
	// ClusterName and Version are what the broker said of itself in its
	// connection properties (cluster_name, version); "" if it did not say.
	// RabbitMQ does not name the node there: the cluster and the address
	// are what is known.
	ClusterName, Version string
	// index is the node's place in the Dialer's list.
	index int
}

// Addr is the node's host:port.
func (n Node) Addr() string {
	return net.JoinHostPort(n.Endpoint.Host, strconv.Itoa(n.Endpoint.Port))
}

// String is host:port, then the cluster and version when known, e.g.
// "10.0.0.2:5672 (cluster rabbit@n1, RabbitMQ 4.3.6)".
func (n Node) String() string {
	var about []string
	if n.ClusterName != "" {
		about = append(about, "cluster "+n.ClusterName)
	}
	if n.Version != "" {
		about = append(about, "RabbitMQ "+n.Version)
	}
	if len(about) == 0 {
		return n.Addr()
	}
	return n.Addr() + " (" + strings.Join(about, ", ") + ")"
}

// LogAttrs are the node's slog attributes.
func (n Node) LogAttrs() []any {
	attrs := []any{"node", n.Addr()}
	if n.ClusterName != "" {
		attrs = append(attrs, "cluster", n.ClusterName)
	}
	if n.Version != "" {
		attrs = append(attrs, "version", n.Version)
	}
	return attrs
}

// NodesError is a round in which no node of a list of several answered.
// Its text lists each node's error (none quotes a password); errors.Is and
// errors.As see every one of them, so IsPermanent is true if any node
// refused for good (a wrong password is wrong on every node of a cluster).
type NodesError struct{ Errs []error }

func (e *NodesError) Error() string {
	parts := make([]string, len(e.Errs))
	for i, err := range e.Errs {
		parts[i] = err.Error()
	}
	return fmt.Sprintf("none of the %d nodes answered: %s", len(e.Errs), strings.Join(parts, "; "))
}

func (e *NodesError) Unwrap() []error { return e.Errs }

// Dialer connects to the first node of its list that answers. It
// remembers the node that last answered and starts there, so that a
// process's connections land on the same node; after Lost, it starts at
// the node after the lost one. Safe for concurrent use.
type Dialer struct {
	// Logger, if set, hears every connect (the node's address, cluster and
	// version, and the connection's name) and every node that failed while
	// another was left to try. Defaults to nil: silent.
	Logger *slog.Logger

	urls  []string
	eps   []Endpoint
	start atomic.Int32 // where the next round begins
}

// NewDialer parses raw as ParseURLList does.
func NewDialer(raw string) (*Dialer, error) {
	eps, err := ParseURLList(raw)
	if err != nil {
		return nil, err
	}
	return &Dialer{urls: urllist.Split(raw, "amqp", "amqps"), eps: eps}, nil
}

// Endpoints lists the nodes, in order.
func (d *Dialer) Endpoints() []Endpoint { return append([]Endpoint(nil), d.eps...) }

// URL is the first node's URL, password included: what a component that
// takes one URL (the management client's credentials, say) reads.
func (d *Dialer) URL() string { return d.urls[0] }

// Dial makes one round: it tries each node once, in list order starting at
// the node that last answered (or after the one Lost names), and returns
// the first connection made, named name. Between nodes it does not wait: a
// node that is down is passed over at once. With one node the error is
// that node's (*URLError or *DialError); with several, a *NodesError.
func (d *Dialer) Dial(ctx context.Context, name string) (*amqp.Connection, Node, error) {
	n := len(d.urls)
	first := int(d.start.Load()) % n
	var errs []error
	for k := range n {
		i := (first + k) % n
		conn, err := dialOne(ctx, d.urls[i], d.eps[i], name)
		if err == nil {
			node := Node{Endpoint: d.eps[i], index: i}
			node.ClusterName, _ = conn.Properties["cluster_name"].(string)
			node.Version, _ = conn.Properties["version"].(string)
			d.start.Store(int32(i))
			if d.Logger != nil {
				d.Logger.Info("connected", append(node.LogAttrs(), "connection", name)...)
			}
			return conn, node, nil
		}
		errs = append(errs, err)
		if ctx.Err() != nil {
			break
		}
		if d.Logger != nil && k < n-1 {
			d.Logger.Warn("node did not answer; trying the next", "node", Node{Endpoint: d.eps[i]}.Addr(), "connection", name, "error", err)
		}
	}
	if n == 1 {
		return nil, Node{}, errs[0]
	}
	return nil, Node{}, &NodesError{Errs: errs}
}

// Lost says the connection to node was lost: the next round starts at the
// node after it, as the lost one is probably down (in a cluster any node
// serves every queue). A round that started elsewhere since is left alone.
func (d *Dialer) Lost(node Node) {
	if len(d.urls) > 1 {
		d.start.CompareAndSwap(int32(node.index), int32((node.index+1)%len(d.urls)))
	}
}

// Retry bounds DialRetry.
type Retry struct {
	// Rounds is how many rounds over the list are made at most. Defaults
	// to 3.
	Rounds int
	// Min and Max bound the pause between rounds, which doubles from Min up
	// to Max, each drawn with jitter (see Jitter). Default to 250ms and 2s.
	Min, Max time.Duration
}

// DialRetry makes up to r.Rounds rounds of Dial, pausing between them,
// until a node answers, ctx ends, or a node refuses in a way that will not
// pass (IsPermanent). It is for one-shot work (a command, a publisher's
// reconnect) that should ride out a node restarting but not wait forever;
// the runtime paces its own rounds.
func (d *Dialer) DialRetry(ctx context.Context, name string, r Retry) (*amqp.Connection, Node, error) {
	if r.Rounds <= 0 {
		r.Rounds = 3
	}
	if r.Min <= 0 {
		r.Min = 250 * time.Millisecond
	}
	if r.Max < r.Min {
		r.Max = max(r.Min, 2*time.Second)
	}
	pause := r.Min
	for round := 1; ; round++ {
		conn, node, err := d.Dial(ctx, name)
		if err == nil || round >= r.Rounds || IsPermanent(err) || ctx.Err() != nil {
			return conn, node, err
		}
		wait := Jitter(pause, rand.Float64())
		if d.Logger != nil {
			d.Logger.Warn("no node answered; trying again", "connection", name, "in", wait.String(), "round", round, "of", r.Rounds, "error", err)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, Node{}, err
		case <-t.C:
		}
		pause = min(2*pause, r.Max)
	}
}

// Jitter draws a pause in [d/2, d) from r in [0, 1) ("equal jitter"):
// clients that lost the same node do not come back to the next one in
// step, and none waits less than half its backoff.
func Jitter(d time.Duration, r float64) time.Duration {
	return d/2 + time.Duration(r*float64(d/2))
}

// Dial opens a connection whose client-provided name is name, so operators
// can find it in the management UI, to the first node of rawURL (one URL,
// or several comma separated) that answers; see Dialer.Dial. It reads
// header field types the client could not (see readableConn). A URL that
// does not parse is a *URLError, any other failure a *DialError (or, for a
// list, a *NodesError of them); none contains the password.
func Dial(rawURL, name string) (*amqp.Connection, error) {
	d, err := NewDialer(rawURL)
	if err != nil {
		return nil, err
	}
	conn, _, err := d.Dial(context.Background(), name)
	return conn, err
}

// dialOne connects to one node, within the URL's connection_timeout (else
// DialTimeout) and until ctx ends.
func dialOne(ctx context.Context, rawURL string, ep Endpoint, name string) (*amqp.Connection, error) {
	cfg := amqp.Config{
		Properties: amqp.NewConnectionProperties(),
		Heartbeat:  10 * time.Second,
	}
	cfg.Properties.SetClientConnectionName(name)
	uri, _ := amqp.ParseURI(rawURL) // ParseURLList checked it
	timeout := DialTimeout
	if uri.ConnectionTimeout > 0 {
		timeout = time.Duration(uri.ConnectionTimeout) * time.Millisecond
	}
	// readableConn must see the AMQP stream, so under amqps the TLS layer
	// is run here, beneath it, and the client is given the URL as amqp.
	var tlsCfg *tls.Config
	if ep.Scheme == "amqps" {
		var err error
		if tlsCfg, err = tlsConfig(uri); err != nil {
			return nil, &DialError{Endpoint: ep, Err: err}
		}
		u, _ := ParseURL("AMQP URL", rawURL)
		u.Scheme, u.Host = "amqp", net.JoinHostPort(uri.Host, strconv.Itoa(uri.Port))
		rawURL = u.String()
	}
	deadline := time.Now().Add(timeout)
	byCtx := false // the deadline is ctx's
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline, byCtx = d, true
	}
	// amqp091-go's handshake takes no context: once the socket is open, a
	// context that ends sets its deadline to now, which fails the handshake
	// at once. The watch is stopped before the client clears the deadline
	// for good, or the connection is dropped.
	var sock net.Conn
	var stopWatch func() bool
	cfg.Dial = func(network, addr string) (net.Conn, error) {
		dctx, cancel := context.WithDeadline(ctx, deadline)
		defer cancel()
		c, err := (&net.Dialer{}).DialContext(dctx, network, addr)
		if err != nil {
			return nil, err
		}
		if err := c.SetDeadline(deadline); err != nil {
			_ = c.Close()
			return nil, err
		}
		sock = c
		stopWatch = context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Now()) })
		if tlsCfg != nil {
			tc := tls.Client(c, tlsCfg)
			if err := tc.Handshake(); err != nil {
				_ = c.Close()
				return nil, err
			}
			c = tc
		}
		return newReadableConn(c), nil
	}
	conn, err := amqp.DialConfig(rawURL, cfg)
	if stopWatch != nil && !stopWatch() && err == nil {
		// ctx ended during the handshake, whose deadline it then moved:
		// the connection may be cut under the client. Drop it.
		_ = CloseConnection(conn, 0)
		err = context.Cause(ctx)
	}
	if err != nil {
		// The socket's deadline may be ctx's, and pass a moment before
		// ctx's own timer: the cause is then ctx's all the same.
		if ctx.Err() != nil || (sock != nil && byCtx && !time.Now().Before(deadline)) {
			cause := context.Cause(ctx)
			if cause == nil {
				cause = context.DeadlineExceeded
			}
			err = fmt.Errorf("%w (%v)", cause, err)
		}
		return nil, &DialError{Endpoint: ep, Err: err}
	}
	return conn, nil
}
