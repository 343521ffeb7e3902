package topology_test

import (
	"context"
	"strings"
	"testing"

	"github.com/dlxbridge/dlxbridge/internal/brokertest"
	"github.com/dlxbridge/dlxbridge/topology"
)

// A management API of another broker than the AMQP connection's is not
// used: verifying against it would report that broker's objects (all
// "missing", or worse, all present).
func TestUseManagementRefusesAnotherBroker(t *testing.T) {
	t.Parallel()
	env := brokertest.Require(t)
	env.RequireManagement()
	conn := env.Dial("inspect")
	other := brokertest.OtherClusterManagement(t)
	for _, tc := range []struct {
		url     string
		sameOne bool
	}{{env.ManagementURL, true}, {other, false}} {
		m, err := topology.NewManagement(tc.url, env.URL)
		if err != nil {
			t.Fatal(err)
		}
		in := &topology.Broker{Conn: conn}
		err = in.UseManagement(context.Background(), m)
		if tc.sameOne && (err != nil || in.Mgmt == nil) {
			t.Errorf("the broker's own management API: %v", err)
		}
		if !tc.sameOne && (err == nil || in.Mgmt != nil || !strings.Contains(err.Error(), "not the same broker")) {
			t.Errorf("another broker's management API: used (err %v)", err)
		}
	}
}
