package brokertest

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

// OtherClusterManagement serves a management API that answers /api/whoami
// and says it is of cluster rabbit@elsewhere: a broker.management_url that
// names another broker than the AMQP URL's. It stops when t ends.
func OtherClusterManagement(t testing.TB) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/api/whoami":
			_, _ = w.Write([]byte(`{"name":"guest"}`))
		case "/api/overview":
			_, _ = w.Write([]byte(`{"cluster_name":"rabbit@elsewhere"}`))
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}
