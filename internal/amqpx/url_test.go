package amqpx_test

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"syscall"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/internal/amqpx"
	"github.com/dlxbridge/dlxbridge/internal/brokertest"
)

// A password that is not percent-encoded makes url.Parse fail with text
// that quotes it (`invalid port ":s3cr3t"`), or misread it as a port or a
// vhost. Dial's error must show none of it. Port 1 refuses, so a URL that
// does parse fails fast without a broker.
func TestDialErrorNeverShowsThePassword(t *testing.T) {
	t.Parallel()
	for _, s := range brokertest.HostileSecrets() {
		for _, scheme := range []string{"amqp", "amqps"} {
			raw := brokertest.WithPassword(scheme, "leakuser", s.Password, "127.0.0.1:1/")
			conn, err := amqpx.Dial(raw, "leak-test")
			if err == nil {
				_ = conn.Close()
				t.Fatalf("password %q: dial to port 1 succeeded", s.Password)
			}
			s.Check(t, "Dial's error", err.Error())
		}
	}
}

func TestParseAMQPURLShowsAllButThePassword(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ raw, want string }{
		{"amqp://guest:guest@127.0.0.1:5672/", "amqp://guest@127.0.0.1:5672/"},
		{"amqp://u:p%23w@host/vh%2Fone", "amqp://u@host:5672/vh%2Fone"},
		{"amqps://u:p%23w@host/vh", "amqps://u@host:5671/vh"},
		{"amqp://u:p%40ss@[::1]:5673/%2F", "amqp://u@[::1]:5673/"},
		{"amqp://host", "amqp://guest@host:5672/"},
		{"amqp://u:pw@host/vh?heartbeat=5&auth_mechanism=plain", "amqp://u@host:5672/vh"},
	} {
		ep, err := amqpx.ParseAMQPURL(c.raw)
		if err != nil {
			t.Errorf("%s: %v", c.raw, err)
			continue
		}
		if got := ep.String(); got != c.want {
			t.Errorf("%s: %s, want %s", c.raw, got, c.want)
		}
	}
	for _, raw := range []string{
		"", "http://u:pw@host/", "amqp://u:pw@host/?heartbeat=x", "amqp://u:pw@host/?auth_mechanism=magic",
		"amqp://u:pw@host:99999/", "amqp:u:pw@host", "u:pw@host:5672", "amqp://u:pw@host/ vh",
	} {
		var ue *amqpx.URLError
		if _, err := amqpx.ParseAMQPURL(raw); !errors.As(err, &ue) {
			t.Errorf("%q: %v, want a *URLError", raw, err)
		}
	}
}

func TestIsPermanent(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		err  error
		want bool
	}{
		{&amqpx.URLError{Kind: "AMQP URL", Reason: "x"}, true},
		{&amqpx.DialError{Err: amqp.ErrCredentials}, true},
		{&amqpx.DialError{Err: amqp.ErrVhost}, true},
		{fmt.Errorf("consume: %w", &amqp.Error{Code: amqp.NotFound, Reason: "NOT_FOUND - no queue 'q' in vhost '/'"}), true},
		{&amqp.Error{Code: amqp.AccessRefused, Reason: "ACCESS_REFUSED - access to queue 'q' refused"}, true},
		{&amqp.Error{Code: amqp.NotAllowed, Reason: "NOT_ALLOWED - vhost v not found"}, true},
		{&amqp.Error{Code: amqp.NotFound, Reason: "NOT_FOUND - home node 'rabbit@b' of durable queue 'q' in vhost '/' is down or inaccessible"}, false},
		{&amqpx.DialError{Err: &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}}, false},
		{fmt.Errorf("connection closed: %w", &amqp.Error{Code: amqp.ConnectionForced, Reason: "CONNECTION_FORCED - broker forced connection closure"}), false},
		{amqp.ErrClosed, false},
		{amqpx.ErrConsumerCancelled, false},
		{errors.New("other"), false},
	} {
		if got := amqpx.IsPermanent(c.err); got != c.want {
			t.Errorf("IsPermanent(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}

// What the real broker answers to a wrong password and to a vhost that does
// not exist: both permanent, both said in words, neither showing the
// password.
func TestDialRefusalsArePermanent(t *testing.T) {
	t.Parallel()
	env := brokertest.Require(t)
	u, err := url.Parse(env.URL)
	if err != nil {
		t.Fatal(err)
	}
	pass, _ := u.User.Password()
	wrong := *u
	wrong.User = url.UserPassword(u.User.Username(), "n0t-the-pa55")
	vhost := *u
	vhost.Path = "/" + env.Name("no-such-vhost")
	for _, c := range []struct {
		raw      string
		sentinel error
		says     string
	}{
		{wrong.String(), amqp.ErrCredentials, "refused the login"},
		{vhost.String(), amqp.ErrVhost, "may not open vhost"},
	} {
		conn, err := amqpx.Dial(c.raw, env.Prefix+"/refused")
		if err == nil {
			_ = conn.Close()
			t.Fatalf("dial %s succeeded", c.says)
		}
		if !errors.Is(err, c.sentinel) || !amqpx.IsPermanent(err) || !strings.Contains(err.Error(), c.says) {
			t.Errorf("got %v (permanent %v), want %v, permanent, saying %q", err, amqpx.IsPermanent(err), c.sentinel, c.says)
		}
		if strings.Contains(err.Error(), "n0t-the-pa55") || strings.Contains(err.Error(), ":"+pass+"@") {
			t.Errorf("error shows the password: %v", err)
		}
	}
}
