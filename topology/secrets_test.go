package topology_test

import (
	"context"
	"net/url"
	"testing"
	"time"

	"github.com/dlxbridge/dlxbridge/internal/brokertest"
	"github.com/dlxbridge/dlxbridge/topology"
)

// The management client takes credentials from the management URL or the
// AMQP URL. A password in either that is not percent-encoded must not show
// in its errors: neither in NewManagement's nor in a request's (net/http
// quotes the request URL in its errors).
func TestManagementErrorsNeverShowThePassword(t *testing.T) {
	t.Parallel()
	env := brokertest.Require(t)
	mgmt, err := url.Parse(env.RequireManagement())
	if err != nil {
		t.Fatal(err)
	}
	amqpURL, err := url.Parse(env.URL)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, s := range brokertest.HostileSecrets() {
		var outs []string
		// The secret in the management URL, against the real API and a
		// closed port.
		for _, host := range []string{mgmt.Host, "127.0.0.1:1"} {
			m, err := topology.NewManagement(brokertest.WithPassword(mgmt.Scheme, "mgmtuser", s.Password, host), env.URL)
			if err != nil {
				outs = append(outs, err.Error())
				continue
			}
			if _, err := m.Policies(ctx); err == nil {
				t.Errorf("password %q at %s: the management API accepted an unknown user", s.Password, host)
			} else {
				outs = append(outs, err.Error())
			}
		}
		// The secret in the AMQP URL the credentials fall back to.
		badAMQP := brokertest.WithPassword(amqpURL.Scheme, "leakuser", s.Password, amqpURL.Host+"/")
		if m, err := topology.NewManagement(mgmt.String(), badAMQP); err != nil {
			outs = append(outs, err.Error())
		} else if _, err := m.Policies(ctx); err != nil {
			outs = append(outs, err.Error())
		} else {
			t.Errorf("password %q: the management API accepted an unknown user", s.Password)
		}
		for _, o := range outs {
			s.Check(t, "the management client's error", o)
		}
	}
}
