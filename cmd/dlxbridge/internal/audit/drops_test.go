package audit_test

import (
	"context"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/cmd/dlxbridge/internal/audit"
	"github.com/dlxbridge/dlxbridge/internal/brokertest"
	"github.com/dlxbridge/dlxbridge/internal/mgmtapi"
	"github.com/dlxbridge/dlxbridge/topology"
)

// prometheusOf is where scripts/rabbitmq4 and the Debian defaults put a
// node's Prometheus endpoint: the management port + 20 (15672 -> 15692).
func prometheusOf(mgmt string) string {
	u, err := url.Parse(mgmt)
	if err != nil {
		return ""
	}
	port, err := strconv.Atoi(u.Port())
	if err != nil {
		return ""
	}
	u.Host = u.Hostname() + ":" + strconv.Itoa(port+20)
	return u.String()
}

func answers(base string) bool {
	c := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Get(base + "/metrics")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// A queue without a dead-letter exchange drops an expired message; the
// counter of dropped dead letters rises between the audit's two reads of
// the Prometheus endpoint, and the audit reports it. The system 3.10.8
// broker runs without rabbitmq_prometheus, so there the test starts a
// private node of the same version with it.
func TestAuditSeesDeadLettersDroppedBetweenTwoReads(t *testing.T) {
	t.Parallel()
	env := brokertest.Require(t)
	mgmt := env.RequireManagement()
	prom := prometheusOf(mgmt)
	if !answers(prom) {
		opts := brokertest.LikeShared(env)
		opts.Plugins = []string{"rabbitmq_management", "rabbitmq_prometheus"}
		node := brokertest.StartPrivateNodeWith(t, opts)
		env, mgmt, prom = node.Env(t), node.ManagementURL, node.PrometheusURL
		deadline := time.Now().Add(90 * time.Second)
		for !answers(prom) {
			if time.Now().After(deadline) {
				t.Fatalf("the private node's Prometheus endpoint did not answer within 90s")
			}
			time.Sleep(200 * time.Millisecond) // the plugin starts after AMQP; no event says when
		}
	}
	m, err := topology.NewManagement(mgmt, env.URL)
	if err != nil {
		t.Fatal(err)
	}
	client := &mgmtapi.Client{BaseURL: m.BaseURL, User: m.User, Password: m.Password}
	pc, err := audit.NewPrometheus(prom)
	if err != nil {
		t.Fatal(err)
	}
	ch := env.Channel("drops")
	q := env.Name("nodlx")
	if _, err := ch.QueueDeclare(q, false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	dropped := false
	spec := audit.Spec{Vhost: "/", Prometheus: pc, BetweenReads: func(ctx context.Context) error {
		if err := ch.PublishWithContext(ctx, "", q, true, false, amqp.Publishing{Body: []byte("x"), Expiration: "1"}); err != nil {
			return err
		}
		// The queue drops the message at its head once it expires.
		deadline := time.Now().Add(30 * time.Second)
		for time.Now().Before(deadline) {
			st, err := ch.QueueDeclarePassive(q, false, false, false, false, nil)
			if err != nil {
				return err
			}
			if st.Messages == 0 {
				dropped = true
				return nil
			}
			time.Sleep(20 * time.Millisecond)
		}
		return nil
	}}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var s *audit.Snapshot
	var notChecked []string
	// Collect may run before the node's management API answers.
	deadline := time.Now().Add(60 * time.Second)
	for {
		s, notChecked, err = audit.Collect(ctx, client, spec)
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	if !dropped {
		t.Fatalf("the expired message was not dropped within 30s")
	}
	r := audit.Run(s, notChecked, audit.Options{Match: regexp.MustCompile("^" + regexp.QuoteMeta(env.Prefix))})
	var found *audit.Finding
	for i := range r.Findings {
		if r.Findings[i].Rule == audit.RuleDropping {
			found = &r.Findings[i]
		}
	}
	if found == nil {
		t.Fatalf("no %s finding on %s; not checked %q, sample %+v", audit.RuleDropping, env.ServerVersion, r.NotChecked, s.Drops)
	}
	if ev := audit.EvidenceText(found.Evidence); !strings.Contains(ev, "dead_lettered_expired_total") || !strings.Contains(ev, "rabbit_classic_queue") {
		t.Errorf("evidence %q does not name the expired classic counter", ev)
	}
	if found.Object != s.Cluster || s.Cluster == "" {
		t.Errorf("finding about %q, cluster %q", found.Object, s.Cluster)
	}
}
