package cli_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/cmd/dlxbridge/internal/cli"
	"github.com/dlxbridge/dlxbridge/config"
	"github.com/dlxbridge/dlxbridge/internal/brokertest"
	"github.com/dlxbridge/dlxbridge/topology"
)

// deleteBundle is an applied topology and one connection to look at it.
type deleteBundle struct {
	*topoBundle
	conn                        *amqp.Connection
	quarantine, records, events string
	lanes                       []string
	exchange, dead, retry       string
}

// setupDelete applies a topology with one lane per tier.
func setupDelete(t *testing.T, tiers ...time.Duration) *deleteBundle {
	t.Helper()
	if len(tiers) == 0 {
		tiers = []time.Duration{200 * time.Millisecond, 400 * time.Millisecond}
	}
	var yaml []string
	for _, d := range tiers {
		yaml = append(yaml, d.String())
	}
	b := setupTopology(t, "tiers: ["+strings.Join(yaml, ", ")+"]\n      jitter: 0")
	b.mustRun(t, cli.ExitOK, "topology", "apply", "--config", b.config)
	q := config.Quarantine{Queue: b.work + config.QuarantineSuffix}
	var lanes []string
	for _, d := range tiers {
		lanes = append(lanes, config.RetryQueueName(b.work, d, 0))
	}
	return &deleteBundle{
		topoBundle: b,
		conn:       b.env.Dial("look"),
		quarantine: q.Queue, records: q.RecordsStream(), events: q.EventsStream(),
		lanes:    lanes,
		exchange: b.env.Name("ex"), dead: config.DeadExchangeName(b.work), retry: config.RetryExchangeName(b.work),
	}
}

// exists checks a queue or an exchange with a passive declare on its own
// channel (a 404 closes it).
func (d *deleteBundle) exists(t *testing.T, kind topology.Kind, name string) bool {
	t.Helper()
	ch, err := d.conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	if kind == topology.KindQueue {
		_, err = ch.QueueDeclarePassive(name, true, false, false, false, nil)
	} else {
		err = ch.ExchangeDeclarePassive(name, "direct", true, false, false, false, nil)
	}
	var ae *amqp.Error
	if errors.As(err, &ae) && ae.Code == amqp.NotFound {
		return false
	}
	if err != nil && kind == topology.KindQueue {
		t.Fatalf("passive declare %s: %v", name, err)
	}
	return true // an exchange of another type answers 406: it exists
}

func (d *deleteBundle) queues() []string {
	return append([]string{d.work, d.quarantine, d.records, d.events}, d.lanes...)
}

func (d *deleteBundle) exchanges() []string { return []string{d.exchange, d.dead, d.retry} }

// want fails the test unless exactly the named objects are left of the
// topology.
func (d *deleteBundle) want(t *testing.T, step string, left ...string) {
	t.Helper()
	keep := map[string]bool{}
	for _, n := range left {
		keep[n] = true
	}
	for _, q := range d.queues() {
		if got := d.exists(t, topology.KindQueue, q); got != keep[q] {
			t.Errorf("%s: queue %s exists = %t, want %t", step, q, got, keep[q])
		}
	}
	for _, x := range d.exchanges() {
		if got := d.exists(t, topology.KindExchange, x); got != keep[x] {
			t.Errorf("%s: exchange %s exists = %t, want %t", step, x, got, keep[x])
		}
	}
}

// bindForeign declares a queue outside the topology bound to E with key
// "other".
func (d *deleteBundle) bindForeign(t *testing.T, foreign string) {
	t.Helper()
	ch, err := d.conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(foreign, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	d.env.TrackQueue(foreign)
	if err := ch.QueueBind(foreign, "other", d.exchange, false, nil); err != nil {
		t.Fatal(err)
	}
	_ = ch.Close()
}

func (d *deleteBundle) publish(t *testing.T, exchange, key string) {
	t.Helper()
	ch, err := d.conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	returns := ch.NotifyReturn(make(chan amqp.Return, 1))
	c, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), exchange, key, true, false, amqp.Publishing{Body: []byte("keep me")})
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := c.WaitContext(context.Background()); !ok || err != nil {
		t.Fatalf("publish to %q/%q not confirmed: %v", exchange, key, err)
	}
	select { // a return arrives before the confirm
	case r := <-returns:
		t.Fatalf("publish to %q/%q returned: %s", exchange, key, r.ReplyText)
	default:
	}
}

// A message in the quarantine intake keeps it, its streams and the
// dead-letter exchange that feeds it; everything empty goes; the command
// exits 1 naming what it kept. --include-data then deletes the rest, and
// a third run finds everything absent.
func TestTopologyDeleteKeepsWhatHoldsData(t *testing.T) {
	t.Parallel()
	d := setupDelete(t)
	d.publish(t, "", d.quarantine)

	out, errOut := d.mustRunAll(t, cli.ExitFail, d.deleteCmd("--dry-run", "--config", d.config)...)
	d.want(t, "dry run", append(d.queues(), d.exchanges()...)...)
	for _, line := range []string{
		"kept         queue '" + d.quarantine + "' (1 message(s)): holds 1 message(s)",
		"would delete queue '" + d.work + "' (0 message(s))",
		"kept         queue '" + d.records + "' (stream)",
		"kept         exchange '" + d.dead + "': leads to kept queue '" + d.quarantine + "'",
		"would delete exchange '" + d.retry + "'",
		"delete --dry-run: 5 would delete, 4 kept, 0 absent",
	} {
		if !strings.Contains(out, line) {
			t.Errorf("dry run lacks %q:\n%s", line, out)
		}
	}
	if !strings.Contains(errOut, "kept queue '"+d.quarantine+"'") {
		t.Errorf("dry run's error does not name the quarantine:\n%s", errOut)
	}
	// JSON: a dry run deleted nothing, and says what it would delete.
	out = d.mustRun(t, cli.ExitFail, d.deleteCmd("--dry-run", "--output", "json", "--config", d.config)...)
	var r topology.DeleteReport
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("dry run JSON: %v\n%s", err, out)
	}
	if want := (topology.DeleteSummary{WouldDelete: 5, Kept: 4}); !r.DryRun || r.Summary != want || !strings.Contains(out, `"would_delete": 5`) {
		t.Errorf("dry run JSON: dry_run %t, summary %+v, want %+v\n%s", r.DryRun, r.Summary, want, out)
	}
	for _, s := range r.Steps {
		if s.Object == "queue '"+d.records+"'" && s.Messages != -1 {
			t.Errorf("dry run JSON: stream %s has messages %d, want -1", d.records, s.Messages)
		}
	}
	d.want(t, "dry run JSON", append(d.queues(), d.exchanges()...)...)

	out, errOut = d.mustRunAll(t, cli.ExitFail, d.deleteCmd("--config", d.config)...)
	d.want(t, "delete", d.quarantine, d.records, d.events, d.dead)
	for _, n := range []string{d.quarantine, d.records, d.events} {
		if !strings.Contains(errOut, "queue '"+n+"'") {
			t.Errorf("delete's error does not name %s:\n%s", n, errOut)
		}
	}
	if !strings.Contains(out, "delete: 5 deleted, 4 kept, 0 absent") {
		t.Errorf("delete:\n%s", out)
	}

	out = d.mustRun(t, cli.ExitOK, d.deleteCmd("--include-data", "--config", d.config)...)
	d.want(t, "delete --include-data")
	if !strings.Contains(out, "delete: 4 deleted, 0 kept, 5 absent") {
		t.Errorf("delete --include-data:\n%s", out)
	}
	out = d.mustRun(t, cli.ExitOK, d.deleteCmd("--config", d.config)...)
	if !strings.Contains(out, "delete: 0 deleted, 0 kept, 9 absent") || !strings.Contains(out, "absent       queue '"+d.work+"'") {
		t.Errorf("delete of a deleted topology:\n%s", out)
	}
}

// The producers' exchange E routes to a queue outside the topology: delete
// keeps E (and that queue and its binding), even with --include-data.
func TestTopologyDeleteKeepsAnExchangeOthersUse(t *testing.T) {
	t.Parallel()
	d := setupDelete(t)
	foreign := d.env.Name("foreign")
	d.bindForeign(t, foreign)

	if d.env.ManagementURL != "" {
		out := d.mustRun(t, cli.ExitFail, d.deleteCmd("--dry-run", "--include-data", "--config", d.config)...)
		if want := "kept         exchange '" + d.exchange + "': in use: bound to queue '" + foreign + "'"; !strings.Contains(out, want) {
			t.Errorf("dry run lacks %q:\n%s", want, out)
		}
		d.want(t, "dry run", append(append(d.queues(), d.exchanges()...), foreign)...)
	}
	out, errOut := d.mustRunAll(t, cli.ExitFail, d.deleteCmd("--include-data", "--config", d.config)...)
	d.want(t, "delete --include-data", d.exchange)
	if !strings.Contains(out, "kept         exchange '"+d.exchange+"': in use") || !strings.Contains(errOut, "kept exchange '"+d.exchange+"'") {
		t.Errorf("delete does not report E kept:\nstdout:\n%s\nstderr:\n%s", out, errOut)
	}
	if d.env.ManagementURL != "" && !strings.Contains(out, "bound to queue '"+foreign+"'") {
		t.Errorf("delete does not name the foreign binding:\n%s", out)
	}
	if !d.exists(t, topology.KindQueue, foreign) {
		t.Fatal("the foreign queue is gone")
	}
	d.publish(t, d.exchange, "other") // mandatory: fails unless still bound
}

// A consumer holding a message unacked leaves the work queue's count at 0:
// the consumer, not the count, is what keeps the queue (and E, which feeds
// it), even with --include-data. A running bridge also publishes retries to
// Q.retry, which route through the lanes back to Q, and dead letters to
// Q.dead, which feeds the quarantine and its streams: all of them stay, and
// a retry still routes to its lane.
func TestTopologyDeleteKeepsAQueueInUse(t *testing.T) {
	t.Parallel()
	d := setupDelete(t)
	d.publish(t, d.exchange, "k")
	ch, err := d.env.Dial("consumer").Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Qos(1, 0, false); err != nil {
		t.Fatal(err)
	}
	deliveries, err := ch.Consume(d.work, "", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-deliveries: // held, unacked
	case <-time.After(10 * time.Second):
		t.Fatal("no delivery")
	}
	out, errOut := d.mustRunAll(t, cli.ExitFail, d.deleteCmd("--include-data", "--config", d.config)...)
	d.want(t, "delete --include-data", append(d.queues(), d.exchanges()...)...)
	if !strings.Contains(out, "kept         queue '"+d.work+"' (0 message(s)): 1 consumer(s) attached") || !strings.Contains(errOut, "kept queue '"+d.work+"'") {
		t.Errorf("delete does not report the work queue kept:\nstdout:\n%s\nstderr:\n%s", out, errOut)
	}
	why := ": work queue '" + d.work + "' is kept (in use)"
	for _, want := range []string{
		"kept         queue '" + d.lanes[0] + "' (0 message(s))" + why,
		"kept         queue '" + d.quarantine + "' (0 message(s))" + why,
		"kept         queue '" + d.records + "' (stream)" + why,
		"kept         exchange '" + d.retry + "'" + why,
		"kept         exchange '" + d.dead + "'" + why,
		"delete: 0 deleted, 9 kept, 0 absent",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("delete lacks %q:\n%s", want, out)
		}
	}
	d.publish(t, d.retry, d.lanes[1]) // mandatory: fails unless routed
}

// A retry waiting in a lane returns to its work queue: the kept lane keeps
// the work queue, which keeps E, and everything a kept work queue needs:
// Q.retry, Q.dead, the quarantine and its streams.
func TestTopologyDeleteKeepsTheWorkQueueOfAKeptRetry(t *testing.T) {
	t.Parallel()
	d := setupDelete(t, time.Hour)
	d.publish(t, "", d.lanes[0])
	out, errOut := d.mustRunAll(t, cli.ExitFail, d.deleteCmd("--config", d.config)...)
	d.want(t, "delete", append(d.queues(), d.exchanges()...)...)
	for _, want := range []string{
		"kept         queue '" + d.work + "' (0 message(s)): kept queue '" + d.lanes[0] + "' dead-letters into it",
		"kept         queue '" + d.quarantine + "' (0 message(s)): work queue '" + d.work + "' is kept",
		"kept         exchange '" + d.retry + "': work queue '" + d.work + "' is kept",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("delete lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "(in use)") {
		t.Errorf("delete says in use with no consumer:\n%s", out)
	}
	if !strings.Contains(errOut, "kept queue '"+d.work+"', queue '"+d.lanes[0]+"'") {
		t.Errorf("delete's error does not name the work queue and the lane:\n%s", errOut)
	}
}

// A queue and an exchange under the config's names but of another type are
// not the config's (another application's, or a conflict plan reports):
// delete keeps them, even with --include-data, when the management API can
// tell (a passive declare ignores the type on 3.10.8 and 4.0.5).
func TestTopologyDeleteKeepsObjectsOfAnotherType(t *testing.T) {
	t.Parallel()
	b := setupTopology(t, "")
	b.env.RequireManagement() // a skip, or under CI=true a failure
	ex := b.env.Name("ex")
	ch, err := b.env.Dial("foreign").Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(b.work, true, false, false, false, amqp.Table{"x-queue-type": "classic"}); err != nil {
		t.Fatal(err)
	}
	b.env.TrackQueue(b.work)
	if err := ch.ExchangeDeclare(ex, "fanout", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	b.env.TrackExchange(ex)
	_ = ch.Close()

	out, errOut := b.mustRunAll(t, cli.ExitFail, "topology", "delete", "--include-data", "--config", b.config)
	for _, want := range []string{
		"kept         queue '" + b.work + "' (0 message(s)): a classic queue where the config has a quorum one",
		"kept         exchange '" + ex + "': a fanout exchange where the config has a direct one",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("delete lacks %q:\nstdout:\n%s\nstderr:\n%s", want, out, errOut)
		}
	}
	look := b.env.Dial("look")
	for kind, name := range map[topology.Kind]string{topology.KindQueue: b.work, topology.KindExchange: ex} {
		if !(&deleteBundle{conn: look}).exists(t, kind, name) {
			t.Errorf("the foreign %s %s is gone", kind, name)
		}
	}
}

// A queue outside the topology is named by someone else: its name, shown
// as the reason E is kept, must not reach the terminal as control
// characters (here: clear the screen, fake a line).
func TestTopologyDeleteEscapesForeignNames(t *testing.T) {
	t.Parallel()
	d := setupDelete(t)
	d.env.RequireManagement() // a skip, or under CI=true a failure
	foreign := d.env.Name("foreign") + "\x1b[2J\n  deleted      everything"
	d.bindForeign(t, foreign)
	for _, args := range [][]string{{"--dry-run"}, nil} {
		out, _ := d.mustRunAll(t, cli.ExitFail, d.deleteCmd(append([]string{"--config", d.config}, args...)...)...)
		if strings.ContainsAny(out, "\x1b") || !strings.Contains(out, `\x1b[2J`) {
			t.Errorf("delete %v prints a foreign name raw:\n%q", args, out)
		}
	}
}

// A quarantine another config shares: its intake is bound from that
// config's dead-letter exchange. Deleting the (empty) intake would leave
// the other work queue's dead letters nowhere to go: it is kept, even with
// --include-data, and names the binding.
func TestTopologyDeleteKeepsAQueueOthersRouteTo(t *testing.T) {
	t.Parallel()
	d := setupDelete(t)
	d.env.RequireManagement() // a skip, or under CI=true a failure
	other := d.env.Name("other.dead")
	ch, err := d.conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.ExchangeDeclare(other, "direct", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	d.env.TrackExchange(other)
	if err := ch.QueueBind(d.quarantine, "other", other, false, nil); err != nil {
		t.Fatal(err)
	}
	_ = ch.Close()
	out, _ := d.mustRunAll(t, cli.ExitFail, d.deleteCmd("--include-data", "--config", d.config)...)
	if want := "kept         queue '" + d.quarantine + "' (0 message(s)): bound from exchange '" + other + "'"; !strings.Contains(out, want) {
		t.Errorf("delete lacks %q:\n%s", want, out)
	}
	d.want(t, "delete --include-data", d.quarantine, d.dead)
	d.publish(t, other, "other") // mandatory: fails unless still bound
}

// deleteCmd is topology delete with args, and --without-management when the
// test broker has no management API (deleting refuses without it).
func (d *deleteBundle) deleteCmd(args ...string) []string {
	cmd := append([]string{"topology", "delete"}, args...)
	if d.env.ManagementURL == "" {
		cmd = append(cmd, "--without-management")
	}
	return cmd
}

// Without the management API (none configured, one that does not answer,
// or another broker's) delete refuses and deletes nothing: only that API
// tells the config's objects from another application's under the same
// names. The refusal gives the cause, with no warning that it goes on.
// --dry-run says so too, with the same message and exit code, instead of
// listing what a delete that refuses would never do; --dry-run
// --without-management shows what --without-management would delete.
func TestTopologyDeleteRefusesWithoutTheManagementAPI(t *testing.T) {
	t.Parallel()
	d := setupDelete(t)
	other := brokertest.OtherClusterManagement(t)
	for mgmt, cause := range map[string]string{
		"":                   "deleting needs the management API (broker.management_url)",
		"http://127.0.0.1:1": "the management API (broker.management_url) did not answer: ",
		other:                `the management API (broker.management_url) is another broker's: management API at ` + other + ` is of cluster "rabbit@elsewhere"`,
	} {
		// The same topology (names come from the test's prefix).
		nm := writeTopologyConfig(t, d.env, mgmt, "tiers: [200ms, 400ms]\n      jitter: 0")
		_, refused := nm.mustRunAll(t, cli.ExitUsage, "topology", "delete", "--include-data", "--config", nm.config)
		if !strings.Contains(refused, cause) || strings.Contains(refused, "warning") || strings.Count(refused, "\n") != 1 {
			t.Errorf("management %q: stderr %q, want one line with %q and no warning", mgmt, refused, cause)
		}
		d.want(t, "refused delete", append(d.queues(), d.exchanges()...)...)
		out, dry := nm.mustRunAll(t, cli.ExitUsage, "topology", "delete", "--dry-run", "--include-data", "--config", nm.config)
		if out != "" || dry != refused {
			t.Errorf("management %q: dry run printed\nstdout:\n%s\nstderr:\n%s\nwant no stdout and the delete's refusal:\n%s", mgmt, out, dry, refused)
		}
		out = nm.mustRun(t, cli.ExitOK, "topology", "delete", "--dry-run", "--include-data", "--without-management", "--config", nm.config)
		if !strings.Contains(out, "delete --dry-run: 9 would delete, 0 kept, 0 absent") {
			t.Errorf("management %q: dry run --without-management:\n%s", mgmt, out)
		}
		d.want(t, "dry run", append(d.queues(), d.exchanges()...)...)
	}
}

// A passive declare counts 0 consumers on a stream with a reader (3.10.8
// and 4.0.5): a reader of the quarantine's records (a `quarantine list`, a
// sidecar's page) would lose the stream under it. With the management API,
// which counts the reader, delete keeps the stream, even with
// --include-data, and says why.
func TestTopologyDeleteKeepsAStreamBeingRead(t *testing.T) {
	t.Parallel()
	d := setupDelete(t)
	d.env.RequireManagement() // a skip, or under CI=true a failure
	ch, err := d.env.Dial("reader").Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Qos(10, 0, false); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.Consume(d.records, "reader", false, false, false, false, amqp.Table{"x-stream-offset": "first"}); err != nil {
		t.Fatal(err)
	}
	d.awaitStreamReader(t, d.records)

	out, errOut := d.mustRunAll(t, cli.ExitFail, d.deleteCmd("--include-data", "--config", d.config)...)
	if want := "kept         queue '" + d.records + "' (stream): 1 consumer(s) attached"; !strings.Contains(out, want) || !strings.Contains(errOut, "kept queue '"+d.records+"'") {
		t.Errorf("delete lacks %q:\nstdout:\n%s\nstderr:\n%s", want, out, errOut)
	}
	d.want(t, "delete --include-data", d.records)
}

// awaitStreamReader waits until the management API counts a consumer on
// the stream (its statistics arrive every few seconds).
func (d *deleteBundle) awaitStreamReader(t *testing.T, stream string) {
	t.Helper()
	path := "/api/queues/" + d.env.ManagementVhost() + "/" + url.PathEscape(stream)
	deadline := time.Now().Add(30 * time.Second)
	for {
		var q struct {
			Consumers       int   `json:"consumers"`
			ConsumerDetails []any `json:"consumer_details"`
		}
		if err := json.Unmarshal(d.env.ManagementGet(path), &q); err != nil {
			t.Fatal(err)
		}
		if q.Consumers > 0 || len(q.ConsumerDetails) > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the management API counts no reader on %s after 30s", stream)
		}
		time.Sleep(250 * time.Millisecond) // the API has nothing to wait on
	}
}

// failingManagement is a management API that passes every request on to
// the test broker's, except that it answers 500 to a GET of the paths in
// fail (escaped, as the client sends them): a management API that fails
// part-way, some checks answered and one not.
func failingManagement(t *testing.T, env *brokertest.Env, fail ...string) string {
	t.Helper()
	target, err := url.Parse(env.RequireManagement())
	if err != nil {
		t.Fatal(err)
	}
	proxy := httputil.NewSingleHostReverseProxy(target)
	proxy.Transport = &http.Transport{DisableKeepAlives: true}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && slices.Contains(fail, r.URL.EscapedPath()) {
			http.Error(w, "injected failure", http.StatusInternalServerError)
			return
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// The management API answers every check but three: the quarantine's
// queue, the retry exchange, and the bindings from E. What it could not
// read is kept (fail closed), and so is Q.dead, which leads to the kept
// quarantine; the dry run says the same, and that E, which the delete
// removes with if-unused, would go unless something else is bound to it.
func TestTopologyDeleteKeepsWhatTheManagementAPIFailedToCheck(t *testing.T) {
	t.Parallel()
	d := setupDelete(t)
	vh := d.env.ManagementVhost()
	mgmt := failingManagement(t, d.env,
		"/api/queues/"+vh+"/"+url.PathEscape(d.quarantine),
		"/api/exchanges/"+vh+"/"+url.PathEscape(d.retry),
		"/api/exchanges/"+vh+"/"+url.PathEscape(d.exchange)+"/bindings/source")
	failing := writeTopologyConfig(t, d.env, mgmt, "tiers: [200ms, 400ms]\n      jitter: 0")

	kept := []string{
		"kept         queue '" + d.quarantine + "' (0 message(s)): the management API could not read it: ",
		"kept         exchange '" + d.retry + "': the management API could not read it: ",
		"kept         exchange '" + d.dead + "': leads to kept queue '" + d.quarantine + "'",
	}
	out := failing.mustRun(t, cli.ExitFail, "topology", "delete", "--dry-run", "--include-data", "--config", failing.config)
	for _, want := range append(kept,
		"would delete queue '"+d.records+"' (stream)",
		"would delete exchange '"+d.exchange+"': unless a queue outside the topology is bound to it (the management API could not list its bindings: ",
		"delete --dry-run: 6 would delete, 3 kept, 0 absent",
	) {
		if !strings.Contains(out, want) {
			t.Errorf("dry run lacks %q:\n%s", want, out)
		}
	}
	d.want(t, "dry run", append(d.queues(), d.exchanges()...)...)

	out, errOut := failing.mustRunAll(t, cli.ExitFail, "topology", "delete", "--include-data", "--config", failing.config)
	for _, want := range append(kept, "delete: 6 deleted, 3 kept, 0 absent") {
		if !strings.Contains(out, want) {
			t.Errorf("delete lacks %q:\n%s", want, out)
		}
	}
	if !strings.Contains(errOut, "kept queue '"+d.quarantine+"', exchange '"+d.dead+"', exchange '"+d.retry+"'") {
		t.Errorf("delete's error does not name what it kept:\n%s", errOut)
	}
	d.want(t, "delete --include-data", d.quarantine, d.dead, d.retry)
}

// A broker error part-way through deleting (here: a login that may not
// configure the quarantine, so its queue.delete is refused with 403 after
// its check passed) stops the delete: the report has what was deleted
// before it and names the step that failed with its error, in text and in
// JSON, and the command exits 1.
func TestTopologyDeleteReportsTheStepThatFailed(t *testing.T) {
	t.Parallel()
	d := setupDelete(t)
	restricted := d.env.User(brokertest.Permissions{
		Configure: "^(?!" + regexp.QuoteMeta(d.quarantine) + "$).*", Write: ".*", Read: ".*",
	})
	args := []string{"topology", "delete", "--include-data", "--url", restricted, "--config", d.config}

	out, errOut := d.mustRunAll(t, cli.ExitFail, append(args, "--output", "json")...)
	var r topology.DeleteReport
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("report JSON: %v\n%s", err, out)
	}
	want := topology.DeleteFailure{Kind: topology.KindQueue, Object: "queue '" + d.quarantine + "'", Step: topology.DeleteStepDelete}
	if f := r.Failed; f == nil || f.Kind != want.Kind || f.Object != want.Object || f.Step != want.Step || !strings.Contains(f.Error, "403") {
		t.Errorf("failed = %+v, want %+v with the broker's 403\n%s", f, want, out)
	}
	if r.Summary != (topology.DeleteSummary{Deleted: 3}) || len(r.Steps) != 3 || r.Steps[0].Object != "queue '"+d.work+"'" {
		t.Errorf("steps before the failure: %+v, summary %+v", r.Steps, r.Summary)
	}
	if !strings.Contains(errOut, "queue '"+d.quarantine+"'") {
		t.Errorf("stderr does not name the failed step:\n%s", errOut)
	}
	d.want(t, "delete stopped at the quarantine", d.quarantine, d.records, d.events, d.exchange, d.dead, d.retry)

	out = d.mustRun(t, cli.ExitFail, args...)
	for _, want := range []string{
		"failed       queue '" + d.quarantine + "': delete: Exception (403)",
		"delete: 0 deleted, 0 kept, 3 absent; stopped at queue '" + d.quarantine + "': what follows it was not checked or deleted",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("text report lacks %q:\n%s", want, out)
		}
	}
}
