package topology_test

import (
	"context"
	"net/http"
	"net/http/httptest"
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
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/api/whoami":
			_, _ = w.Write([]byte(`{"name":"guest"}`))
		case "/api/overview":
			_, _ = w.Write([]byte(`{"cluster_name":"rabbit@elsewhere"}`))
		default:
			http.NotFound(w, r)
		}
	}))
	defer other.Close()
	for _, tc := range []struct {
		url     string
		sameOne bool
	}{{env.ManagementURL, true}, {other.URL, false}} {
		m, err := topology.NewManagement(tc.url, env.URL)
		if err != nil {
			t.Fatal(err)
		}
		in := &topology.Inspector{Conn: conn}
		err = in.UseManagement(context.Background(), m)
		if tc.sameOne && (err != nil || in.Mgmt == nil) {
			t.Errorf("the broker's own management API: %v", err)
		}
		if !tc.sameOne && (err == nil || in.Mgmt != nil || !strings.Contains(err.Error(), "not the same broker")) {
			t.Errorf("another broker's management API: used (err %v)", err)
		}
	}
}
