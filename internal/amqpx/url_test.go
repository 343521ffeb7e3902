package amqpx_test

import (
	"errors"
	"testing"

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
