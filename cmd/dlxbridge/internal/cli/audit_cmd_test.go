package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/cmd/dlxbridge/internal/audit"
	"github.com/dlxbridge/dlxbridge/cmd/dlxbridge/internal/cli"
	"github.com/dlxbridge/dlxbridge/config"
	"github.com/dlxbridge/dlxbridge/consumer"
	"github.com/dlxbridge/dlxbridge/internal/brokertest"
	"github.com/dlxbridge/dlxbridge/quarantine"
	"github.com/dlxbridge/dlxbridge/schemas"
	"github.com/dlxbridge/dlxbridge/topology"
	"github.com/dlxbridge/dlxbridge/wire"
)

// runAudit runs `dlxbridge audit` with env for the environment.
func runAudit(t *testing.T, vars map[string]string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	e := &cli.Env{Stdout: &out, Stderr: &errOut, Getenv: func(k string) string { return vars[k] }}
	code = cli.Main(context.Background(), append([]string{"audit"}, args...), e)
	return code, out.String(), errOut.String()
}

func auditJSON(t *testing.T, out string) *audit.Report {
	t.Helper()
	var r audit.Report
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("audit JSON: %v\n%s", err, out)
	}
	return &r
}

func findingSet(r *audit.Report) []string {
	var s []string
	for _, f := range r.Findings {
		s = append(s, f.Rule+" "+f.Object)
	}
	sort.Strings(s)
	return s
}

func declare(t *testing.T, ch *amqp.Channel, name string, args amqp.Table) {
	t.Helper()
	if _, err := ch.QueueDeclare(name, true, false, false, false, args); err != nil {
		t.Fatalf("declare %s: %v", name, err)
	}
}

func exchange(t *testing.T, ch *amqp.Channel, name, kind string) {
	t.Helper()
	if err := ch.ExchangeDeclare(name, kind, true, false, false, false, nil); err != nil {
		t.Fatalf("declare exchange %s: %v", name, err)
	}
}

func bind(t *testing.T, ch *amqp.Channel, q, x, key string) {
	t.Helper()
	if err := ch.QueueBind(q, key, x, false, nil); err != nil {
		t.Fatalf("bind %s to %s: %v", q, x, err)
	}
}

// Every rule fires on its fixture, and on nothing else of the test's, on
// every broker version that can express its setting: an exact set, so a
// rule that fires where it should not fails too. The audit runs as a user
// with only the monitoring tag and no configure, write or read permission:
// that is all it needs.
func TestAuditFixturesTriggerEveryRule(t *testing.T) {
	t.Parallel()
	env := brokertest.Require(t)
	env.RequireManagement()
	v, err := topology.ParseBrokerVersion(env.ServerVersion)
	if err != nil {
		t.Fatal(err)
	}
	v4 := v.HasDefaultDeliveryLimit()
	ch := env.Channel("fixtures")
	n := env.Name
	want := []string{}
	expect := func(rule, object string) { want = append(want, rule+" "+object) }

	exchange(t, ch, n("dlx"), "fanout")
	declare(t, ch, n("dlq"), nil) // classic, unbounded, nobody reads it
	bind(t, ch, n("dlq"), n("dlx"), "")
	expect(audit.RuleDLQUnbounded, n("dlq"))
	declare(t, ch, n("capped"), amqp.Table{"x-max-length": int64(10)})
	bind(t, ch, n("capped"), n("dlx"), "")
	expect(audit.RuleDLQDropHead, n("capped"))

	qnodlx := amqp.Table{"x-queue-type": "quorum"}
	if !v4 { // 3.x has no default limit
		qnodlx["x-delivery-limit"] = int64(3)
	}
	declare(t, ch, n("qnodlx"), qnodlx)
	expect(audit.RuleQuorumNoDLX, n("qnodlx"))

	declare(t, ch, n("classic"), amqp.Table{"x-dead-letter-exchange": n("dlx")})
	expect(audit.RuleClassicDLX, n("classic"))

	declare(t, ch, n("gone"), amqp.Table{"x-queue-type": "quorum", "x-dead-letter-exchange": n("nosuch")})
	expect(audit.RuleDLXMissing, n("gone"))
	exchange(t, ch, n("direct"), "direct")
	declare(t, ch, n("unroutable"), amqp.Table{"x-queue-type": "quorum", "x-dead-letter-exchange": n("direct"), "x-dead-letter-routing-key": "k"})
	expect(audit.RuleDLXUnroutable, n("unroutable"))

	// Two TTL queues dead-lettering into each other; nobody consumes.
	declare(t, ch, n("cyc.a"), amqp.Table{"x-queue-type": "quorum", "x-message-ttl": int64(600000), "x-dead-letter-exchange": "", "x-dead-letter-routing-key": n("cyc.b")})
	declare(t, ch, n("cyc.b"), amqp.Table{"x-queue-type": "quorum", "x-message-ttl": int64(600000), "x-dead-letter-exchange": "", "x-dead-letter-routing-key": n("cyc.a")})
	expect(audit.RuleCycle, n("cyc.a"))
	// A retry loop whose consumed work queue also dead-letters at its
	// delivery limit into the loop.
	declare(t, ch, n("loop.work"), amqp.Table{"x-queue-type": "quorum", "x-delivery-limit": int64(5), "x-dead-letter-exchange": "", "x-dead-letter-routing-key": n("loop.wait")})
	declare(t, ch, n("loop.wait"), amqp.Table{"x-queue-type": "quorum", "x-message-ttl": int64(600000), "x-dead-letter-exchange": "", "x-dead-letter-routing-key": n("loop.work")})
	work := env.Channel("loop-work")
	if err := work.Qos(10, 0, false); err != nil {
		t.Fatal(err)
	}
	if _, err := work.Consume(n("loop.work"), "", false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	expect(audit.RuleCycleDrops, n("loop.work"))

	declare(t, ch, n("alo"), amqp.Table{"x-queue-type": "quorum", "x-dead-letter-exchange": n("dlx"), "x-dead-letter-strategy": "at-least-once"})
	expect(audit.RuleAtLeastOnceDropHead, n("alo"))

	// -1 as an argument: on 3.x it dead-letters on the first requeue; on
	// 4.x it means unlimited, and gives no finding.
	declare(t, ch, n("neg"), amqp.Table{"x-queue-type": "quorum", "x-delivery-limit": int64(-1), "x-dead-letter-exchange": n("dlx")})
	if !v4 {
		expect(audit.RuleNegativeLimit3x, n("neg"))
	}

	declare(t, ch, n("delay"), amqp.Table{"x-queue-type": "quorum", "x-dead-letter-exchange": n("dlx")})
	expect(audit.RulePerMessageTTL, n("delay"))
	for _, exp := range []string{"600000", "300000"} {
		if err := ch.PublishWithContext(context.Background(), "", n("delay"), true, false, amqp.Publishing{Body: []byte("x"), Expiration: exp}); err != nil {
			t.Fatal(err)
		}
	}
	if err := ch.PublishWithContext(context.Background(), "", n("dlq"), true, false, amqp.Publishing{Body: []byte("x")}); err != nil {
		t.Fatal(err)
	}

	declare(t, ch, n("noprefetch"), amqp.Table{"x-queue-type": "quorum", "x-dead-letter-exchange": n("dlx")})
	open := env.Channel("noprefetch") // no basic.qos: prefetch 0
	if _, err := open.Consume(n("noprefetch"), "", false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	expect(audit.RuleNoPrefetch, n("noprefetch"))

	// Classic mirroring: only 3.x has it; 4.x refuses the policy.
	declare(t, ch, n("mirrored"), nil)
	err = env.TryPolicy(n("ha"), "^"+regexp.QuoteMeta(n("mirrored"))+"$", "queues", map[string]any{"ha-mode": "all"})
	switch {
	case !v4 && err != nil:
		t.Fatalf("3.x refused an ha-mode policy: %v", err)
	case !v4:
		expect(audit.RuleMirroring, n("ha"))
	case err == nil || !strings.Contains(err.Error(), "not recognised"):
		t.Fatalf("%s accepted an ha-mode policy (or refused it otherwise: %v): the rule's fixture should run here", v, err)
	}
	// delivery-limit -1 by policy: 3.10 refuses it.
	err = env.TryPolicy(n("dlpolicy"), "^"+regexp.QuoteMeta(n("nomatch"))+"$", "quorum_queues", map[string]any{"delivery-limit": -1})
	switch {
	case v4 && err != nil:
		t.Fatalf("%s refused a delivery-limit -1 policy: %v", v, err)
	case v4:
		expect(audit.RulePolicyUnlimited, n("dlpolicy"))
	case err == nil || !strings.Contains(err.Error(), "not a valid delivery limit"):
		t.Fatalf("%s accepted a delivery-limit -1 policy (or refused it otherwise: %v): the rule's fixture should run here", v, err)
	}
	// The delayed-message exchange's type exists only with its plugin,
	// which no CI broker has (and 4.3 cannot run): the fixture is the
	// broker's refusal. The rule itself is covered without a broker.
	if err := env.Channel("delayed").ExchangeDeclare(n("delayed"), "x-delayed-message", true, false, false, false, amqp.Table{"x-delayed-type": "direct"}); err == nil {
		expect(audit.RuleDelayedExchange, n("delayed"))
	}
	sort.Strings(want)

	monitor := env.UserTagged("monitoring", brokertest.Permissions{})
	vars := map[string]string{"RABBITMQ_URL": monitor, "RABBITMQ_MANAGEMENT_URL": env.ManagementURL}
	match := "^" + regexp.QuoteMeta(env.Prefix)
	// The broker reports a queue's statistics (message counts, its
	// policy) a few seconds after it is declared: read until they show.
	var r *audit.Report
	var code int
	var out, errOut string
	deadline := time.Now().Add(60 * time.Second)
	for {
		code, out, errOut = runAudit(t, vars, "--match", match, "--output", "json", "--fail-on", "info")
		if code != cli.ExitFail {
			t.Fatalf("audit: exit %d, want 1\n%s\n%s", code, out, errOut)
		}
		r = auditJSON(t, out)
		if slices.Equal(findingSet(r), want) || time.Now().After(deadline) {
			break
		}
		time.Sleep(500 * time.Millisecond) // the broker's statistics interval is 5s; no event marks it
	}
	if got := findingSet(r); !slices.Equal(got, want) {
		t.Fatalf("on %s the fixtures gave\n  %s\nwant\n  %s\n%s", v, strings.Join(got, "\n  "), strings.Join(want, "\n  "), out)
	}
	if !r.Complete() {
		t.Errorf("a monitoring user could not read everything: %q", r.NotChecked)
	}
	for _, f := range r.Findings {
		if f.Fix == "" || f.Problem == "" || len(f.Evidence) == 0 || f.Vhost != "/" {
			t.Errorf("finding without problem, fix, evidence or vhost: %+v", f)
		}
	}

	// Paged by 10, the same findings in more requests, though other tests
	// create and delete queues in the same vhost meanwhile.
	_, out3, errOut3 := runAudit(t, vars, "--match", match, "--output", "json", "--fail-on", "info", "--page-size", "10")
	r3 := auditJSON(t, out3)
	if !slices.Equal(findingSet(r3), want) || r3.APIRequests <= r.APIRequests {
		t.Errorf("--page-size 10: %d requests (default %d), findings %q, not checked %q\n%s", r3.APIRequests, r.APIRequests, findingSet(r3), r3.NotChecked, errOut3)
	}
	// Text: every line within 100 columns, a block per finding.
	code, text, _ := runAudit(t, vars, "--match", match)
	if code != cli.ExitFail {
		t.Errorf("text audit: exit %d, want 1 (default --fail-on warning)", code)
	}
	for _, l := range strings.Split(text, "\n") {
		if utf8.RuneCountInString(l) > 100 {
			t.Errorf("line wider than 100 columns: %q", l)
		}
	}
	for _, w := range want {
		rule := strings.Fields(w)[0]
		if !strings.Contains(text, " "+rule+"  ") {
			t.Errorf("text output has no %s block:\n%s", rule, text)
		}
	}
	// Only errors fail with --fail-on error; none never fails.
	if code, _, _ := runAudit(t, vars, "--match", "^"+regexp.QuoteMeta(n("delay"))+"$", "--fail-on", "warning"); code != cli.ExitOK {
		t.Errorf("an info finding failed --fail-on warning: exit %d", code)
	}
	if code, _, _ := runAudit(t, vars, "--match", match, "--fail-on", "none"); code != cli.ExitOK {
		t.Errorf("--fail-on none: exit %d", code)
	}
}

// The bridge's own topology, the repository's config.yaml applied under
// the test's prefix, gives the audit nothing to report, at any severity.
func TestAuditFindsNothingInTheBridgesTopology(t *testing.T) {
	t.Parallel()
	env := brokertest.Require(t)
	env.RequireManagement()
	_, topo := applyShipped(t, env)
	vars := map[string]string{"RABBITMQ_URL": env.URL, "RABBITMQ_MANAGEMENT_URL": env.ManagementURL}
	code, out, errOut := runAudit(t, vars, "--match", "^"+regexp.QuoteMeta(env.Prefix), "--output", "json", "--fail-on", "info")
	r := auditJSON(t, out)
	if code != cli.ExitOK || len(r.Findings) > 0 || !r.Complete() {
		t.Fatalf("audit of the bridge's topology: exit %d\n%s\n%s", code, out, errOut)
	}
	if r.Scanned.Queues < len(topo.Queues) {
		t.Errorf("scanned %d queues, the topology has %d", r.Scanned.Queues, len(topo.Queues))
	}
}

// applyShipped applies the repository's config.yaml under the test's
// prefix, its shared delay tiers included.
func applyShipped(t *testing.T, env *brokertest.Env) (*config.Config, *topology.Topology) {
	t.Helper()
	cfg, err := config.Load(filepath.Join("..", "..", "..", "..", "config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for i := range cfg.Queues {
		q := &cfg.Queues[i]
		q.Name, q.Exchange.Name, q.Quarantine.Queue = env.Name(q.Name), env.Name(q.Exchange.Name), env.Name(q.Quarantine.Queue)
	}
	// The shipped queues retry through the shared delay tiers: under the
	// default prefix they would be left on the broker, and shared with
	// every other run.
	cfg.SharedTiers.Prefix = env.Prefix
	conn := env.Dial("apply")
	topo, err := topology.BuildFor(cfg, conn)
	if err != nil {
		t.Fatal(err)
	}
	m, err := topology.NewManagement(env.ManagementURL, env.URL)
	if err != nil {
		t.Fatal(err)
	}
	b := &topology.Broker{Conn: conn}
	if err := b.UseManagement(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Apply(context.Background(), topo); err != nil {
		t.Fatal(err)
	}
	return cfg, topo
}

// The bridge's topology at work is as quiet as when it is idle: the
// runtime consuming every work queue (and, through its keepers, every
// quarantine intake and the shared tiers' catch-all), a retry waiting in a
// shared tier, a message quarantined and stored as a record. An empty
// topology cannot show the rules about queues that hold messages or have
// consumers.
func TestAuditFindsNothingInTheBridgesTopologyAtWork(t *testing.T) {
	t.Parallel()
	env := brokertest.Require(t)
	env.RequireManagement()
	cfg, topo := applyShipped(t, env)
	registry, err := schemas.Load(schemas.LoadOptions{Dir: cfg.Schemas.Dir})
	if err != nil {
		t.Fatal(err)
	}
	c, err := consumer.New(&consumer.Config{URL: env.URL, File: cfg, Registry: registry, ConnectionName: env.Name("runtime")})
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range cfg.Queues {
		for _, a := range q.Accepts {
			if err := c.Handle(q.Name, a.Type, consumer.HandlerFunc(func(context.Context, *consumer.Message) error { return nil })); err != nil {
				t.Fatal(err)
			}
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-ran; err != nil {
			t.Errorf("runtime: %v", err)
		}
	})
	orders := cfg.Queues[0]
	wq, _ := topo.WorkQueue(orders.Name)
	ch := env.Channel("producer")
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, 2))
	// A message the gate refuses (no id, no total): quarantined.
	if err := ch.PublishWithContext(context.Background(), orders.Exchange.Name, orders.Bindings[0], true, false, amqp.Publishing{
		MessageId: "invalid", Type: "orders.created", Headers: amqp.Table{"schema-version": "2"}, ContentType: "application/json", Body: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	// A retry as the runtime parks it in the longest shared tier.
	last := wq.Tiers[len(wq.Tiers)-1].Lanes[0]
	if err := ch.PublishWithContext(context.Background(), wq.RetryExchange, last.RoutingKey, true, false, amqp.Publishing{
		MessageId: "waiting", Type: "orders.created", Headers: amqp.Table{wire.HeaderCC: []any{orders.Name}}, Body: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if c := <-confirms; !c.Ack {
			t.Fatal("publish nacked")
		}
	}
	conn := env.Dial("inspect")
	in := &quarantine.Inspector{Conn: conn, Config: cfg}
	for deadline := time.Now().Add(30 * time.Second); ; {
		s, err := in.Snapshot(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if len(s.List(quarantine.Filter{Queue: orders.Name})) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the invalid message was not stored as a record within 30s")
		}
		time.Sleep(200 * time.Millisecond) // the keeper stores it; no event to wait on
	}
	// The broker reports consumers and message counts with its statistics,
	// seconds late: read until a read is clean, and show the last.
	vars := map[string]string{"RABBITMQ_URL": env.URL, "RABBITMQ_MANAGEMENT_URL": env.ManagementURL}
	var code int
	var out, errOut string
	var r *audit.Report
	for deadline := time.Now().Add(45 * time.Second); ; {
		code, out, errOut = runAudit(t, vars, "--match", "^"+regexp.QuoteMeta(env.Prefix), "--output", "json", "--fail-on", "info")
		r = auditJSON(t, out)
		if code == cli.ExitOK && len(r.Findings) == 0 && r.Complete() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("audit of the bridge's topology at work: exit %d\n%s\n%s", code, out, errOut)
		}
		time.Sleep(500 * time.Millisecond)
	}
	// The clean read saw the retry waiting in its tier (it waits about
	// two minutes).
	if q, err := env.Channel("depth").QueueDeclarePassive(last.Queue, true, false, false, false, nil); err != nil || q.Messages != 1 {
		t.Errorf("the tier %s holds no retry after the audit: the audit may not have seen one", last.Queue)
	}
}

// A vhost the user may not read makes the audit incomplete (exit 3), and
// the report names it; the rest is audited.
func TestAuditIsIncompleteWhereTheUserMayNotRead(t *testing.T) {
	t.Parallel()
	env := brokertest.Require(t)
	env.RequireManagement()
	hidden := env.Name("hidden")
	env.Vhost(hidden)
	monitor := env.UserTagged("monitoring", brokertest.Permissions{})
	vars := map[string]string{"RABBITMQ_URL": monitor, "RABBITMQ_MANAGEMENT_URL": env.ManagementURL}
	code, out, errOut := runAudit(t, vars, "--all-vhosts", "--match", "^"+regexp.QuoteMeta(env.Prefix), "--output", "json")
	if code != cli.ExitIncomplete {
		t.Fatalf("exit %d, want %d (incomplete)\n%s\n%s", code, cli.ExitIncomplete, out, errOut)
	}
	r := auditJSON(t, out)
	note := strings.Join(r.NotChecked, "\n")
	if !strings.Contains(note, fmt.Sprintf("vhost %q", hidden)) || !strings.Contains(note, "give the user permissions") || !slices.Contains(r.Vhosts, "/") || slices.Contains(r.Vhosts, hidden) {
		t.Errorf("the report does not say which vhost it could not read:\n%s", out)
	}
}

// A user without the monitoring tag (management only) is shown only its
// own connections' consumers and only the vhosts it has permissions in:
// the audit of another application's consumer with no prefetch would come
// back clean. Seen on 3.10.8: /api/consumers listed none of another user's
// consumers to a management user, one to a monitoring user. So the audit
// says it is incomplete, and why.
func TestAuditIsIncompleteForAUserWithoutTheMonitoringTag(t *testing.T) {
	t.Parallel()
	env := brokertest.Require(t)
	env.RequireManagement()
	q := env.Name("noprefetch")
	ch := env.Channel("fixture")
	declare(t, ch, q, amqp.Table{"x-queue-type": "quorum", "x-dead-letter-exchange": env.Name("dlx")})
	exchange(t, ch, env.Name("dlx"), "fanout")
	declare(t, ch, env.Name("dlq"), amqp.Table{"x-queue-type": "quorum"})
	bind(t, ch, env.Name("dlq"), env.Name("dlx"), "")
	if _, err := env.Channel("consumer").Consume(q, "", false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	match := "^" + regexp.QuoteMeta(q) + "$"
	for _, tc := range []struct {
		tags     string
		complete bool
	}{{"monitoring", true}, {"management", false}} {
		user := env.UserTagged(tc.tags, brokertest.Permissions{})
		vars := map[string]string{"RABBITMQ_URL": user, "RABBITMQ_MANAGEMENT_URL": env.ManagementURL}
		var code int
		var out, errOut string
		var r *audit.Report
		// The management API lists a new consumer a moment after it
		// starts: read until the monitoring user sees it.
		for deadline := time.Now().Add(30 * time.Second); ; {
			code, out, errOut = runAudit(t, vars, "--match", match, "--output", "json", "--fail-on", "none")
			r = auditJSON(t, out)
			if !tc.complete || len(r.Findings) > 0 || time.Now().After(deadline) {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		note := strings.Join(r.NotChecked, "\n")
		if tc.complete && code == cli.ExitIncomplete && !slices.ContainsFunc(r.NotChecked, func(nc string) bool { return !strings.HasPrefix(nc, "the shared prefetch of") }) {
			code = cli.ExitOK // other tests' consumers can exceed the channels the audit reads
		}
		switch {
		case tc.complete && (code != cli.ExitOK || !slices.Equal(findingSet(r), []string{audit.RuleNoPrefetch + " " + q})):
			t.Errorf("%s user: exit %d, findings %q, not checked %q\n%s", tc.tags, code, findingSet(r), r.NotChecked, errOut)
		case !tc.complete && (code != cli.ExitIncomplete || !strings.Contains(note, "monitoring tag")):
			t.Errorf("%s user: exit %d, not checked %q, want %d (incomplete) naming the monitoring tag\n%s", tc.tags, code, r.NotChecked, cli.ExitIncomplete, out)
		}
	}
}

// The vhost's binding listing is not paged, and holds one implicit
// binding from the default exchange per queue, which the routes never
// read: on a private 3.10.8 node with 20,000 queues it took 56 s to
// answer at load 30, past the audit's 30 s per request. With few
// exchanges the audit reads each one's bindings instead; here the
// vhost's listing fails outright, and the audit is complete all the same,
// its routes evaluated from the exchanges' own.
func TestAuditReadsBindingsByExchange(t *testing.T) {
	t.Parallel()
	var vhostListing, bySource int
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch p := r.URL.EscapedPath(); p {
		case "/api/overview":
			fmt.Fprint(w, `{"rabbitmq_version":"4.0.5","cluster_name":"fake"}`)
		case "/api/whoami":
			fmt.Fprint(w, `{"name":"auditor","tags":["monitoring"]}`)
		case "/api/queues/%2F":
			// Many queues on few exchanges: what makes the vhost's
			// listing mostly implicit bindings.
			items := []string{`{"name":"parked","type":"quorum","arguments":{"x-dead-letter-exchange":"sink"},"consumers":1}`,
				`{"name":"work","type":"quorum","arguments":{"x-dead-letter-exchange":"dlx","x-dead-letter-routing-key":"k"},"consumers":1}`}
			for i := range 98 {
				items = append(items, fmt.Sprintf(`{"name":"w%02d","type":"quorum","arguments":{"x-delivery-limit":-1},"consumers":1}`, i))
			}
			fmt.Fprintf(w, `{"page":1,"page_count":1,"items":[%s]}`, strings.Join(items, ","))
		case "/api/exchanges/%2F":
			fmt.Fprint(w, `{"page":1,"page_count":1,"items":[{"name":"","type":"direct"},{"name":"dlx","type":"direct"},{"name":"sink","type":"direct"}]}`)
		case "/api/bindings/%2F":
			vhostListing++
			http.Error(w, `{"error":"timeout"}`, http.StatusGatewayTimeout)
		case "/api/exchanges/%2F/dlx/bindings/source":
			bySource++
			fmt.Fprint(w, `[{"source":"dlx","vhost":"/","destination":"parked","destination_type":"queue","routing_key":"k","arguments":{}}]`)
		case "/api/exchanges/%2F/sink/bindings/source":
			bySource++
			fmt.Fprint(w, `[]`)
		default:
			if strings.Contains(p, "/bindings") {
				http.Error(w, "unexpected "+p, http.StatusBadRequest)
				return
			}
			fmt.Fprint(w, `[]`)
		}
	}))
	defer srv.Close()
	code, out, errOut := runAudit(t, nil, "--management-url", srv.URL, "--output", "json", "--fail-on", "none")
	r := auditJSON(t, out)
	if code != cli.ExitOK || !r.Complete() {
		t.Fatalf("exit %d, not checked %q, want 0 and complete\n%s", code, r.NotChecked, errOut)
	}
	// work's dead letters reach parked through dlx; parked's go to sink,
	// which routes nowhere.
	if got, want := findingSet(r), []string{audit.RuleDLXUnroutable + " parked"}; !slices.Equal(got, want) {
		t.Errorf("findings %q, want %q", got, want)
	}
	if vhostListing != 0 || bySource != 2 || r.Scanned.Bindings != 1 {
		t.Errorf("read the vhost's listing %d time(s), exchanges' bindings %d time(s), scanned %d binding(s)", vhostListing, bySource, r.Scanned.Bindings)
	}
}

// An API page that fails half way through makes the audit incomplete, not
// wrong: what was read is audited, the rules that need the rest say so.
func TestAuditIsIncompleteWhenAPageFails(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/api/overview":
			fmt.Fprint(w, `{"rabbitmq_version":"4.0.5","cluster_name":"fake"}`)
		case r.URL.Path == "/api/queues/%2F" || r.URL.Path == "/api/queues//":
			if r.URL.Query().Get("page") == "2" {
				http.Error(w, `{"error":"internal"}`, http.StatusInternalServerError)
				return
			}
			items := make([]string, 10)
			for i := range items {
				items[i] = fmt.Sprintf(`{"name":"q%d","type":"quorum","arguments":{}}`, i)
			}
			fmt.Fprintf(w, `{"page":1,"page_count":2,"items":[%s]}`, strings.Join(items, ","))
		case strings.HasPrefix(r.URL.Path, "/api/exchanges/"):
			fmt.Fprint(w, `{"page":1,"page_count":1,"items":[{"name":"","type":"direct"}]}`)
		default:
			fmt.Fprint(w, `[]`)
		}
	}))
	defer srv.Close()
	code, out, errOut := runAudit(t, nil, "--management-url", srv.URL, "--output", "json", "--fail-on", "none", "--page-size", "10")
	if code != cli.ExitIncomplete {
		t.Fatalf("exit %d, want 3\n%s\n%s", code, out, errOut)
	}
	r := auditJSON(t, out)
	note := strings.Join(r.NotChecked, "\n")
	if !strings.Contains(note, `queues of vhost "/"`) || !strings.Contains(note, "500") || !strings.Contains(note, "dlx-missing") {
		t.Errorf("not checked %q", r.NotChecked)
	}
	// The first page's queues are audited all the same.
	var want []string
	for i := range 10 {
		want = append(want, fmt.Sprintf("%s q%d", audit.RuleQuorumNoDLX, i))
	}
	if got := findingSet(r); r.Scanned.Queues != 10 || !slices.Equal(got, want) {
		t.Errorf("scanned %d queues, findings %q; want the first page's queue audited", r.Scanned.Queues, got)
	}
}

func TestAuditUsage(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"--vhost", "a", "--all-vhosts"},
		{"--fail-on", "fatal"},
		{"--match", "("},
		{"--page-size", "501"},
		{"--request-timeout", "0s"},
		{"--prometheus", "ftp://x"},
		{"--management-url", "http://u:p#w@h:15672"},
		{"extra"},
	} {
		code, _, stderr := runAudit(t, nil, args...)
		if code != cli.ExitUsage {
			t.Errorf("audit %q: exit %d, want 2", args, code)
		}
		if strings.Contains(stderr, "p#w") {
			t.Errorf("audit %q: the error quotes the password: %s", args, stderr)
		}
	}
}

// --suggest prints a fragment that config.Load takes, carrying the
// queue's exchange, binding keys and length cap, and says that apply
// refuses while the existing queue is classic.
func TestAuditSuggestsAConfigForAnExistingQueue(t *testing.T) {
	t.Parallel()
	env := brokertest.Require(t)
	env.RequireManagement()
	ch := env.Channel("legacy")
	q, x := env.Name("legacy"), env.Name("legacy.x")
	exchange(t, ch, x, "topic")
	declare(t, ch, q, amqp.Table{"x-max-length": int64(100)})
	bind(t, ch, q, x, "orders.*")
	bind(t, ch, q, x, "orders.created")
	vars := map[string]string{"RABBITMQ_URL": env.URL, "RABBITMQ_MANAGEMENT_URL": env.ManagementURL}
	code, out, errOut := runAudit(t, vars, "--suggest", q)
	if code != cli.ExitOK {
		t.Fatalf("exit %d\n%s\n%s", code, out, errOut)
	}
	cfg, err := config.Parse([]byte(out))
	if err != nil {
		t.Fatalf("the fragment does not load: %v\n%s", err, out)
	}
	got := cfg.Queues[0]
	if got.Name != q || got.Exchange.Name != x || got.Exchange.Type != "topic" || !slices.Equal(got.Bindings, []string{"orders.*", "orders.created"}) || got.MaxLength != 100 {
		t.Errorf("fragment %+v\n%s", got, out)
	}
	if !strings.Contains(out, `# apply refuses while the queue differs: type: want "quorum", have "classic"`) {
		t.Errorf("the fragment does not say apply refuses the classic queue:\n%s", out)
	}
	if code, _, _ := runAudit(t, vars, "--suggest", env.Name("nosuch")); code != cli.ExitFail {
		t.Errorf("--suggest of a missing queue: exit %d, want 1", code)
	}
}

// A vhost of many queues is read page by page, in a handful of requests
// whatever the count. 510 queues (two pages) by default;
// DLXBRIDGE_AUDIT_QUEUES=1000 is the measurement in docs/performance.md.
// Classic non-durable queues: the 3.10.8 node has 1024 file handles.
// Other tests declare and delete queues meanwhile, which shifts the pages:
// every one of the test's queues must be found all the same.
func TestAuditOfManyQueues(t *testing.T) {
	t.Parallel()
	env := brokertest.Require(t)
	env.RequireManagement()
	n := 510
	if s := os.Getenv("DLXBRIDGE_AUDIT_QUEUES"); s != "" {
		var err error
		if n, err = strconv.Atoi(s); err != nil || n < 1 || n > 50000 {
			t.Fatalf("DLXBRIDGE_AUDIT_QUEUES=%q: want 1 to 50000", s)
		}
	}
	ch := env.Channel("many")
	exchange(t, ch, env.Name("work"), "direct")
	exchange(t, ch, env.Name("dlx"), "fanout")
	if _, err := ch.QueueDeclare(env.Name("dlq"), false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	bind(t, ch, env.Name("dlq"), env.Name("dlx"), "")
	began := time.Now()
	for i := range n {
		q := env.Name(fmt.Sprintf("q%04d", i))
		if _, err := ch.QueueDeclare(q, false, false, false, false, amqp.Table{"x-dead-letter-exchange": env.Name("dlx")}); err != nil {
			t.Fatal(err)
		}
		bind(t, ch, q, env.Name("work"), q)
	}
	t.Logf("declared %d classic queues in %.1fs", n, time.Since(began).Seconds())
	vars := map[string]string{"RABBITMQ_URL": env.URL, "RABBITMQ_MANAGEMENT_URL": env.ManagementURL}
	code, out, errOut := runAudit(t, vars, "--output", "json", "--fail-on", "none")
	r := auditJSON(t, out)
	if code == cli.ExitIncomplete {
		// Other tests' consumers on the shared broker can exceed the
		// channels the audit reads for their shared prefetch; nothing else
		// may be missing.
		for _, nc := range r.NotChecked {
			if !strings.HasPrefix(nc, "the shared prefetch of") {
				t.Fatalf("incomplete: %q\n%s", r.NotChecked, errOut)
			}
		}
	} else if code != cli.ExitOK {
		t.Fatalf("exit %d\n%s", code, errOut)
	}
	mine := 0
	for _, f := range r.Findings {
		if f.Rule == audit.RuleClassicDLX && strings.HasPrefix(f.Object, env.Prefix) {
			mine++
		}
	}
	if mine != n {
		t.Errorf("%d classic-dlx findings among the test's %d queues", mine, n)
	}
	// overview, whoami, queue and exchange pages, bindings (each
	// exchange's, with many queues), two policy listings, consumers, and a
	// channel or so of other tests' consumers.
	pages := (r.Scanned.Queues + 499) / 500
	if r.APIRequests > int64(pages+r.Scanned.Exchanges+12) {
		t.Errorf("%d API requests for %d queues (%d pages)", r.APIRequests, r.Scanned.Queues, pages)
	}
	t.Logf("RabbitMQ %s: audited %d queues, %d exchanges, %d bindings in %.2fs with %d API requests (%d findings)",
		r.Broker.Version, r.Scanned.Queues, r.Scanned.Exchanges, r.Scanned.Bindings, r.Seconds, r.APIRequests, len(r.Findings))
	code, text, _ := runAudit(t, vars, "--fail-on", "none")
	if code != cli.ExitOK || strings.Count(text, "WARNING  "+audit.RuleClassicDLX) < n {
		t.Errorf("text audit: exit %d, %d classic-dlx blocks", code, strings.Count(text, "WARNING  "+audit.RuleClassicDLX))
	}
}
