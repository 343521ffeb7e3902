package audit_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/dlxbridge/dlxbridge/cmd/dlxbridge/internal/audit"
	"github.com/dlxbridge/dlxbridge/internal/mgmtapi"
)

// fakeBroker answers a management API with no objects and a Prometheus
// endpoint of cluster promCluster whose expired-and-dropped counter rises
// by one per read.
func fakeBroker(t *testing.T, promCluster string) (mgmt, prom *httptest.Server) {
	t.Helper()
	mgmt = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/api/overview":
			fmt.Fprint(w, `{"rabbitmq_version":"4.0.5","cluster_name":"rabbit@here"}`)
		case strings.HasPrefix(r.URL.Path, "/api/queues/"), strings.HasPrefix(r.URL.Path, "/api/exchanges/"):
			fmt.Fprint(w, `{"page":1,"page_count":0,"items":[]}`)
		default:
			fmt.Fprint(w, `[]`)
		}
	}))
	t.Cleanup(mgmt.Close)
	var reads atomic.Int64
	prom = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := reads.Add(1)
		fmt.Fprintf(w, "# TYPE rabbitmq_identity_info untyped\nrabbitmq_identity_info{rabbitmq_node=\"rabbit@n\",rabbitmq_cluster=%q,rabbitmq_cluster_permanent_id=\"x\"} 1\n", promCluster)
		fmt.Fprintf(w, "rabbitmq_global_messages_dead_lettered_expired_total{queue_type=\"rabbit_quorum_queue\",dead_letter_strategy=\"disabled\"} %d\n", n)
		fmt.Fprint(w, "rabbitmq_global_messages_dead_lettered_expired_total{queue_type=\"rabbit_quorum_queue\",dead_letter_strategy=\"at_least_once\"} 7\n")
		fmt.Fprint(w, "rabbitmq_global_messages_dead_lettered_confirmed_total{queue_type=\"rabbit_quorum_queue\",dead_letter_strategy=\"disabled\"} 9\n")
	}))
	t.Cleanup(prom.Close)
	return mgmt, prom
}

func collectWith(t *testing.T, promCluster string) *audit.Report {
	t.Helper()
	mgmt, prom := fakeBroker(t, promCluster)
	pc, err := audit.NewPrometheus(prom.URL)
	if err != nil {
		t.Fatal(err)
	}
	spec := audit.Spec{Prometheus: pc, BetweenReads: func(context.Context) error { return nil }}
	s, nc, err := audit.Collect(context.Background(), &mgmtapi.Client{BaseURL: mgmt.URL}, spec)
	if err != nil {
		t.Fatal(err)
	}
	return audit.Run(s, nc, audit.Options{})
}

func TestDropsAreCountedFromTheDisabledStrategyOnly(t *testing.T) {
	t.Parallel()
	r := collectWith(t, "rabbit@here")
	wantFindings(t, r, "dead-letters-dropped rabbit@here")
	if ev := audit.EvidenceText(r.Findings[0].Evidence); len(r.Findings[0].Evidence) != 1 || !strings.Contains(ev, "1 -> 2") {
		t.Errorf("evidence %q: want only the disabled expired counter, 1 -> 2", ev)
	}
}

// A Prometheus endpoint of another cluster than the management API's is
// not read as this broker's: the rule does not run and the report says why.
func TestPrometheusOfAnotherClusterIsRefused(t *testing.T) {
	t.Parallel()
	r := collectWith(t, "rabbit@elsewhere")
	wantFindings(t, r)
	if r.Complete() || !strings.Contains(strings.Join(r.NotChecked, "\n"), "not the same broker") {
		t.Errorf("not checked %q", r.NotChecked)
	}
}
