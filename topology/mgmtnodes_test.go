package topology_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/dlxbridge/dlxbridge/internal/amqpx"
	"github.com/dlxbridge/dlxbridge/internal/brokertest"
	"github.com/dlxbridge/dlxbridge/topology"
)

// The management APIs of several nodes, the first one down: reads go to
// the next, which answers for the real broker, and stay there.
func TestManagementFailsOverToTheNextNode(t *testing.T) {
	t.Parallel()
	env := brokertest.Require(t)
	api := env.RequireManagement()
	// The second node is a relay to the real API that counts what it
	// serves; the first refuses connections.
	var served atomic.Int32
	relay := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		served.Add(1)
		req, _ := http.NewRequestWithContext(r.Context(), r.Method, api+r.URL.RequestURI(), nil)
		req.Header = r.Header.Clone()
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		w.WriteHeader(resp.StatusCode)
		buf := make([]byte, 32<<10)
		for {
			n, err := resp.Body.Read(buf)
			_, _ = w.Write(buf[:n])
			if err != nil {
				return
			}
		}
	}))
	defer relay.Close()
	m, err := topology.NewManagement("http://127.0.0.1:1,"+relay.URL, "amqp://guest:guest@127.0.0.1:1/,"+env.URL)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := m.Ping(ctx); err != nil {
		t.Fatalf("Ping: %v", err)
	}
	if _, err := m.Policies(ctx); err != nil {
		t.Fatalf("Policies: %v", err)
	}
	if _, err := m.Queue(ctx, env.Name("absent")); !errors.Is(err, topology.ErrNotFound) {
		t.Fatalf("Queue of an absent queue: %v, want ErrNotFound", err)
	}
	if n := served.Load(); n < 3 {
		t.Errorf("the second node served %d requests, want every one", n)
	}
}

// No node answers: the error names each node's address, not its
// credentials.
func TestManagementNoNodeAnswers(t *testing.T) {
	t.Parallel()
	m, err := topology.NewManagement("http://admin:s3cr3t@127.0.0.1:1,http://admin:s3cr3t@127.0.0.1:2/", "amqp://guest:guest@127.0.0.1:1/")
	if err != nil {
		t.Fatal(err)
	}
	err = m.Ping(context.Background())
	if err == nil {
		t.Fatal("Ping succeeded")
	}
	for _, s := range []string{"no management API of the 2 nodes answered", "127.0.0.1:1", "127.0.0.1:2"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("%q lacks %q", err, s)
		}
	}
	if strings.Contains(err.Error(), "s3cr3t") {
		t.Errorf("the error shows the password: %v", err)
	}
}

func TestNewManagementChecksEveryNode(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ mgmt, amqp, says string }{
		{"http://n1:15672,ftp://n2", "amqp://n1/", "each with its scheme"},
		{"http://n1:15672,http://n2:15672?x=1", "amqp://n1/", "management URL 2 of 2"},
		{"http://a:s3cr3t@n1:15672,http://b:s3cr3t@n2:15672", "amqp://n1/", "differs from URL 1's"},
		{"http://a:s3cr3t@n1:15672,http://n2:15672", "amqp://n1/", "differs from URL 1's"},
		{"http://n1:15672", "amqp://n1/a,amqp://n2/b", "every URL must name the same one"},
	} {
		_, err := topology.NewManagement(c.mgmt, c.amqp)
		var ue *amqpx.URLError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%s with %s: %v, want a URL error saying %q", c.mgmt, c.amqp, err, c.says)
		}
		if err != nil && strings.Contains(err.Error(), "s3cr3t") {
			t.Errorf("the error shows the password: %v", err)
		}
	}
	m, err := topology.NewManagement("http://a:p@n1:15672/x/, http://a:p@n2:15673/x", "amqp://u:pw@n1/vh,amqp://u:pw@n2/vh")
	if err != nil {
		t.Fatal(err)
	}
	if m.BaseURL != "http://n1:15672/x" || m.User != "a" || m.Password != "p" || m.Vhost != "vh" || m.Client == nil {
		t.Errorf("got %+v", m)
	}
}
