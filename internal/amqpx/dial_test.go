package amqpx_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/internal/amqpx"
	"github.com/dlxbridge/dlxbridge/internal/brokertest"
)

// deadNode is a URL whose port refuses at once: a node that is down.
const deadNode = "amqp://guest:guest@127.0.0.1:1/"

func TestParseURLList(t *testing.T) {
	t.Parallel()
	eps, err := amqpx.ParseURLList("amqp://u:p%23w@n1:5672/vh, amqps://u:pw@n2/vh,amqp://v:x@n3:5673/vh?heartbeat=5")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, ep := range eps {
		got = append(got, ep.String())
	}
	if want := "amqp://u@n1:5672/vh amqps://u@n2:5671/vh amqp://v@n3:5673/vh"; strings.Join(got, " ") != want {
		t.Errorf("got %q, want %q", got, want)
	}
	// One URL whose password holds a comma is still one URL.
	if eps, err := amqpx.ParseURLList("amqp://u:pa,ss@n1/"); err != nil || len(eps) != 1 {
		t.Errorf("a password with a comma: %v, %v", eps, err)
	}
	for _, c := range []struct{ raw, says string }{
		{"amqp://n1/,", "AMQP URL 2 of 2 (empty"},
		{"amqp://n1/,,amqp://n2/", "AMQP URL 2 of 3 (empty"},
		{"amqp://n1/,amqps://n2:99999/", "AMQP URL 2 of 2 (the port is out of range"},
		{"amqp://n1/a,amqp://n2/b", `URL 2 names vhost "b", URL 1 vhost "a"`},
		{"amqp://u:s3cr3t@n1:5672,n2:5672/", "each with its scheme"},
	} {
		_, err := amqpx.ParseURLList(c.raw)
		var ue *amqpx.URLError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%q: %v, want a *URLError saying %q", c.raw, err, c.says)
		}
		if err != nil && strings.Contains(err.Error(), "s3cr3t") {
			t.Errorf("%q: the error shows the password: %v", c.raw, err)
		}
	}
	// A hostile password in the second URL is named by position only.
	for _, s := range brokertest.HostileSecrets() {
		raw := "amqp://guest:guest@127.0.0.1:1/," + brokertest.WithPassword("amqp", "leakuser", s.Password, "127.0.0.1:1/")
		eps, err := amqpx.ParseURLList(raw)
		if err == nil {
			// Some parse (as a vhost or a query): then dialing must not
			// show them either.
			if len(eps) != 2 {
				t.Errorf("password %q: %d entries", s.Password, len(eps))
			}
			_, err = amqpx.Dial(raw, "leak-test")
		}
		if err == nil {
			t.Fatalf("password %q: dial to port 1 succeeded", s.Password)
		}
		s.Check(t, "the list's error", err.Error())
	}
}

// logRecorder is a slog handler that keeps every record's text and signals
// each message.
type logRecorder struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	text slog.Handler
	msgs chan string
}

func newLogRecorder() *logRecorder {
	r := &logRecorder{msgs: make(chan string, 64)}
	r.text = slog.NewTextHandler(&r.buf, nil)
	return r
}

func (r *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (r *logRecorder) Handle(ctx context.Context, rec slog.Record) error {
	r.mu.Lock()
	err := r.text.Handle(ctx, rec)
	r.mu.Unlock()
	select {
	case r.msgs <- rec.Message:
	default:
	}
	return err
}
func (r *logRecorder) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *logRecorder) WithGroup(string) slog.Handler      { return r }
func (r *logRecorder) String() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.buf.String()
}

// A list whose first node is down connects to the second and says so: the
// node's address and the broker's cluster name in the log line, the
// connection's name on the broker.
func TestDialFailsOverToTheNextNode(t *testing.T) {
	t.Parallel()
	env := brokertest.Require(t)
	d, err := amqpx.NewDialer(deadNode + "," + env.URL)
	if err != nil {
		t.Fatal(err)
	}
	logs := newLogRecorder()
	d.Logger = slog.New(logs)
	conn, node, err := d.Dial(context.Background(), env.Prefix+"/failover")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	want, _ := amqpx.ParseAMQPURL(env.URL)
	if node.Endpoint != want {
		t.Fatalf("connected to %s, want %s", node.Endpoint, want)
	}
	cluster, _ := conn.Properties["cluster_name"].(string)
	if cluster == "" || node.ClusterName != cluster || node.Version != env.ServerVersion {
		t.Errorf("node %+v, want cluster %q and version %q", node, cluster, env.ServerVersion)
	}
	out := logs.String()
	for _, s := range []string{
		`msg="node did not answer; trying the next" node=127.0.0.1:1`,
		"msg=connected node=" + node.Addr() + " cluster=" + cluster + " version=" + env.ServerVersion,
		"connection=" + env.Prefix + "/failover",
	} {
		if !strings.Contains(out, s) {
			t.Errorf("the log lacks %q:\n%s", s, out)
		}
	}
	if strings.Contains(out, "guest:guest") {
		t.Errorf("the log shows the password:\n%s", out)
	}
	// The next connection of the process goes to the node that answered,
	// without trying the dead one first.
	before := strings.Count(logs.String(), "did not answer")
	conn2, node2, err := d.Dial(context.Background(), env.Prefix+"/failover-2")
	if err != nil {
		t.Fatal(err)
	}
	defer conn2.Close()
	if node2.Endpoint != want || strings.Count(logs.String(), "did not answer") != before {
		t.Errorf("second dial went to %s after more failures:\n%s", node2.Endpoint, logs.String())
	}
}

// All nodes down: one error naming each, not permanent.
func TestDialNoNodeAnswers(t *testing.T) {
	t.Parallel()
	_, err := amqpx.Dial(deadNode+",amqp://guest:guest@127.0.0.1:2/", "none")
	var ne *amqpx.NodesError
	if !errors.As(err, &ne) || len(ne.Errs) != 2 || amqpx.IsPermanent(err) {
		t.Fatalf("got %v, want a NodesError of 2, transient", err)
	}
	for _, s := range []string{"none of the 2 nodes answered", "127.0.0.1:1", "127.0.0.1:2"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("%q lacks %q", err, s)
		}
	}
	if strings.Contains(err.Error(), "guest:guest") {
		t.Errorf("the error shows the password: %v", err)
	}
}

// After Lost, the next round starts at the node after the lost one, even
// though the lost one still answers: a node whose connection dropped is
// probably going down.
func TestDialerStartsAfterTheLostNode(t *testing.T) {
	t.Parallel()
	env := brokertest.Require(t)
	a, b := env.Proxy(), env.Proxy()
	d, err := amqpx.NewDialer(a.URL + "," + b.URL)
	if err != nil {
		t.Fatal(err)
	}
	var addrs []string
	for range 3 {
		conn, node, err := d.Dial(context.Background(), env.Prefix+"/rotate")
		if err != nil {
			t.Fatal(err)
		}
		addrs = append(addrs, node.Addr())
		_ = conn.Close()
		d.Lost(node)
	}
	if want := []string{a.Addr, b.Addr, a.Addr}; strings.Join(addrs, " ") != strings.Join(want, " ") {
		t.Errorf("nodes %v, want %v", addrs, want)
	}
}

// A node that accepts the TCP connection but never speaks AMQP (a hung
// broker) holds the round up only for the URL's connection_timeout, and a
// context that ends cuts the wait short.
func TestDialMovesOnFromASilentNode(t *testing.T) {
	t.Parallel()
	env := brokertest.Require(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var held sync.WaitGroup
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			held.Add(1)
			go func() { // read and say nothing until the client gives up
				defer held.Done()
				_, _ = c.Read(make([]byte, 1024))
				_, _ = c.Read(make([]byte, 1024))
				_ = c.Close()
			}()
		}
	}()
	silent := "amqp://guest:guest@" + ln.Addr().String() + "/?connection_timeout=300"
	started := time.Now()
	conn, node, err := mustDialer(t, silent+","+env.URL).Dial(context.Background(), env.Prefix+"/silent")
	if err != nil {
		t.Fatal(err)
	}
	_ = conn.Close()
	took := time.Since(started)
	if want, _ := amqpx.ParseAMQPURL(env.URL); node.Endpoint != want {
		t.Fatalf("connected to %s", node.Endpoint)
	}
	if took < 300*time.Millisecond || took > 5*time.Second {
		t.Errorf("took %s to pass a silent node with a 300ms timeout", took)
	}

	// Without connection_timeout (10s), the context bounds the wait.
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	started = time.Now()
	_, _, err = mustDialer(t, "amqp://guest:guest@"+ln.Addr().String()+"/").Dial(ctx, env.Prefix+"/silent-ctx")
	if took := time.Since(started); err == nil || took > 3*time.Second || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("dial to a silent node under a 200ms context: %v after %s", err, took)
	}
	_ = ln.Close()
	held.Wait()
}

func mustDialer(t *testing.T, raw string) *amqpx.Dialer {
	t.Helper()
	d, err := amqpx.NewDialer(raw)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// DialRetry rides out a moment when every node is down: after a round that
// failed it pauses and tries again, and the node that came back answers.
func TestDialRetryWaitsForANodeToComeBack(t *testing.T) {
	t.Parallel()
	env := brokertest.Require(t)
	a, b := env.Proxy(), env.Proxy()
	a.Down()
	b.Down()
	d := mustDialer(t, a.URL+","+b.URL)
	logs := newLogRecorder()
	d.Logger = slog.New(logs)
	go func() {
		for m := range logs.msgs {
			if m == "no node answered; trying again" {
				if err := b.Up(); err != nil {
					t.Error(err)
				}
				return
			}
		}
	}()
	conn, node, err := d.DialRetry(context.Background(), env.Prefix+"/retry", amqpx.Retry{Rounds: 5, Min: 50 * time.Millisecond})
	if err != nil {
		t.Fatalf("%v\n%s", err, logs)
	}
	defer conn.Close()
	if node.Addr() != b.Addr {
		t.Errorf("connected to %s, want %s", node.Addr(), b.Addr)
	}
}

// A refusal that will not pass ends DialRetry at once: a wrong password is
// wrong on every node, so it is not retried round after round.
func TestDialRetryStopsAtAPermanentRefusal(t *testing.T) {
	t.Parallel()
	env := brokertest.Require(t)
	u, err := url.Parse(env.URL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(u.User.Username(), "n0t-the-pa55")
	d := mustDialer(t, deadNode+","+u.String())
	logs := newLogRecorder()
	d.Logger = slog.New(logs)
	_, _, err = d.DialRetry(context.Background(), env.Prefix+"/refused", amqpx.Retry{Rounds: 5, Min: time.Millisecond})
	if !errors.Is(err, amqp.ErrCredentials) || !amqpx.IsPermanent(err) {
		t.Fatalf("got %v, want the refused login, permanent", err)
	}
	if strings.Contains(logs.String(), "trying again") || strings.Contains(err.Error(), "n0t-the-pa55") {
		t.Errorf("retried a refused login, or showed its password: %v\n%s", err, logs)
	}
}
