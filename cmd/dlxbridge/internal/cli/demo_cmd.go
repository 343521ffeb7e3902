package cli

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/config"
	"github.com/dlxbridge/dlxbridge/consumer"
	"github.com/dlxbridge/dlxbridge/internal/amqpx"
	"github.com/dlxbridge/dlxbridge/publisher"
	"github.com/dlxbridge/dlxbridge/quarantine"
	"github.com/dlxbridge/dlxbridge/schemas"
	"github.com/dlxbridge/dlxbridge/topology"
	"github.com/dlxbridge/dlxbridge/triage"
	"github.com/dlxbridge/dlxbridge/wire"
)

// Kinds of demo message, by what their handler does.
const (
	demoValid     = "valid"     // handled on the first attempt
	demoFlaky     = "flaky"     // fails (transient) on its first attempt(s), then succeeds
	demoPermanent = "permanent" // the handler refuses it: quarantined at once
	demoCrash     = "crash"     // the handler panics every time: retried, then quarantined
	demoInvalid   = "invalid"   // fails its schema: never reaches a handler
)

// demoMessage is one published message and where it is.
type demoMessage struct {
	id, kind string
	failures int // flaky: attempts that fail before one succeeds
	attempts int
	where    string
	done     bool
	class    string // when quarantined
}

// expected is where the message must end.
func (m *demoMessage) expected() string {
	switch m.kind {
	case demoValid, demoFlaky:
		return "handled"
	case demoPermanent:
		return "quarantined (permanent)"
	case demoCrash:
		return "quarantined (panic)"
	default:
		return "quarantined (schema)"
	}
}

// demoTracker follows every message from the handlers' and the
// quarantine's points of view.
type demoTracker struct {
	mu     sync.Mutex
	byID   map[string]*demoMessage
	order  []*demoMessage
	events chan string
	// redriven receives the id of a replayed message its handler accepted.
	redriven chan string
	tiers    []time.Duration
	max      int
}

func (t *demoTracker) add(m *demoMessage) {
	m.where = "queued"
	t.byID[m.id] = m
	t.order = append(t.order, m)
}

func (t *demoTracker) set(id, where string, done bool, update func(*demoMessage)) {
	t.mu.Lock()
	defer t.mu.Unlock()
	m, ok := t.byID[id]
	if !ok || m.done {
		return
	}
	if update != nil {
		update(m)
	}
	m.where, m.done = where, done
	select {
	case t.events <- fmt.Sprintf("%-18s %s", id, where):
	default:
	}
}

func (t *demoTracker) finished() (handled int, all bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	all = true
	for _, m := range t.order {
		all = all && m.done
		if m.where == "handled" {
			handled++
		}
	}
	return handled, all
}

// handler runs the demo's in-process handler for m's kind and records what
// the runtime will do with the result.
func (t *demoTracker) handler() consumer.Handler {
	return consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) (err error) {
		t.mu.Lock()
		dm, ok := t.byID[m.MessageID]
		t.mu.Unlock()
		if !ok {
			return triage.Permanent(fmt.Errorf("not a demo message: %q", m.MessageID))
		}
		t.set(dm.id, fmt.Sprintf("handling (attempt %d)", m.Attempt), false, func(d *demoMessage) { d.attempts = m.Attempt })
		defer func() {
			if v := recover(); v != nil {
				t.failed(dm.id, m.Attempt, false)
				panic(v) // the runtime recovers it: class panic
			}
			switch {
			case err == nil:
				t.set(dm.id, "handled", true, nil)
			default:
				var permanent bool
				if c, _ := triage.Classify(err); c == triage.ClassPermanent {
					permanent = true
				}
				t.failed(dm.id, m.Attempt, permanent)
			}
		}()
		switch dm.kind {
		case demoValid:
			return nil
		case demoFlaky:
			if m.Attempt <= dm.failures {
				return errors.New("inventory service unavailable")
			}
			return nil
		case demoPermanent:
			if _, replayed := m.Headers[wire.HeaderRedriveCount]; replayed {
				select {
				case t.redriven <- dm.id:
				default: // a redelivery of it: already reported
				}
				return nil
			}
			return triage.Permanent(errors.New("customer account is closed"))
		default: // crash
			var prices map[string]float64
			prices["tax"] = 0.2 // a nil map: the handler crashes
			return nil
		}
	})
}

// failed records a failed attempt: the message waits in a retry tier, or is
// on its way to the quarantine.
func (t *demoTracker) failed(id string, attempt int, permanent bool) {
	if permanent || attempt >= t.max {
		t.set(id, "quarantining", false, nil)
		return
	}
	tier := min(attempt, len(t.tiers)) - 1
	t.set(id, fmt.Sprintf("waiting in retry tier %d (%s)", tier, t.tiers[tier]), false, nil)
}

// runDemo: dlxbridge demo. It declares a demo topology under its own
// prefix, publishes a mix of messages, handles them in-process and shows
// where each one is until all have settled, then prints the final table,
// `quarantine stats`, the replay of the permanent group and the stats after
// it, and deletes what it declared, streams included (unless --keep). Exit
// 0 when every message ended where it should and the replayed message was
// handled; 1 otherwise or on a broker error; 2 bad usage.
func runDemo(ctx context.Context, env *Env, args []string) int {
	fs := newFlagSet(env, "demo", "demo [--url amqp://...] [--keep] [--prefix P] [--timeout 50s]")
	local, _ := amqpx.ParseAMQPURL(amqpx.DefaultURL)
	urlFlag := fs.String("url", "", "AMQP URL (default $RABBITMQ_URL, else "+local.String()+" with the default password)")
	keep := fs.Bool("keep", false, "leave the demo's queues and exchanges (and the quarantined messages) on the broker")
	prefix := fs.String("prefix", "", "name prefix of everything the demo declares (default dlxbridge-demo-<random>)")
	timeout := fs.Duration("timeout", 50*time.Second, "give up if the messages have not settled by then")
	if code, ok := parseFlags(env, fs, args); !ok {
		return code
	}
	c := common{url: *urlFlag}
	url, ok := c.checkedURL(env, "demo")
	if !ok {
		return ExitUsage
	}
	if *prefix == "" {
		b := make([]byte, 3)
		_, _ = rand.Read(b)
		*prefix = "dlxbridge-demo-" + hex.EncodeToString(b)
	}
	// The prefix goes into the demo's config text: a name it cannot make
	// is bad usage, said of --prefix rather than of config fields the user
	// never wrote.
	if !demoPrefixRE.MatchString(*prefix) || strings.HasPrefix(*prefix, "amq.") {
		fmt.Fprintf(env.Stderr, "dlxbridge demo: --prefix %q: use letters, digits, '.', '_', ':' or '-', starting with a letter or digit (at most 100), not \"amq.\"\n", *prefix)
		return ExitUsage
	}
	if err := demo(ctx, env, url, *prefix, *keep, *timeout); err != nil {
		fmt.Fprintf(env.Stderr, "dlxbridge demo: %v\n", err)
		return ExitFail
	}
	return ExitOK
}

// demoPrefixRE is what --prefix may be: the config's name characters, and
// short enough that every name derived from it stays within the config's
// limit of 200.
var demoPrefixRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:-]{0,99}$`)

func demo(ctx context.Context, env *Env, url, prefix string, keep bool, timeout time.Duration) (err error) {
	// `demo | head -20` closes stdout early. A write to a closed pipe on
	// fd 1 kills a Go program with SIGPIPE unless it asks for the signal,
	// which would leave the whole topology on the broker: ask for it (the
	// write then fails with EPIPE), and stop printing at the first failed
	// write, but run to the end and clean up.
	sigpipe := make(chan os.Signal, 1)
	signal.Notify(sigpipe, syscall.SIGPIPE)
	defer signal.Stop(sigpipe)
	tty := isTerminal(env.Stdout)
	out := &stopOnError{w: env.Stdout}
	cfgText := demoConfigYAML(prefix)
	cfg, err := config.Parse(cfgText)
	if err != nil {
		return err
	}
	q := &cfg.Queues[0]
	registry, err := schemas.Load(schemas.LoadOptions{})
	if err != nil {
		return err
	}
	conn, err := dial(ctx, env, url, prefix+"/demo")
	if err != nil {
		return err
	}
	defer conn.Close()
	topo, err := topology.BuildFor(cfg, conn)
	if err != nil {
		return err
	}
	start := time.Now()
	if _, err := (&topology.Broker{Conn: conn}).Apply(ctx, topo); err != nil {
		return fmt.Errorf("declare the demo topology: %w", err)
	}
	fmt.Fprintf(out, "declared %d queues and %d exchanges under %q on %s\n", len(topo.Queues), len(topo.Exchanges), prefix, topo.Broker)
	if keep {
		defer demoKeepConfig(out, prefix, cfgText, topo)
	} else {
		defer func() {
			if cerr := demoCleanup(conn, topo); cerr != nil {
				err = errors.Join(err, cerr)
			} else {
				fmt.Fprintf(out, "deleted the demo's queues and exchanges (--keep leaves them)\n")
			}
		}()
	}

	tr := &demoTracker{byID: map[string]*demoMessage{}, events: make(chan string, 256), redriven: make(chan string, 1), tiers: q.Retry.Tiers, max: q.Retry.MaxAttempts}
	for i := 1; i <= 6; i++ {
		tr.add(&demoMessage{id: fmt.Sprintf("demo-valid-%d", i), kind: demoValid})
	}
	tr.add(&demoMessage{id: "demo-flaky-1", kind: demoFlaky, failures: 1})
	tr.add(&demoMessage{id: "demo-flaky-2", kind: demoFlaky, failures: 2})
	tr.add(&demoMessage{id: "demo-permanent-1", kind: demoPermanent})
	tr.add(&demoMessage{id: "demo-crash-1", kind: demoCrash})
	tr.add(&demoMessage{id: "demo-invalid-1", kind: demoInvalid})
	tr.add(&demoMessage{id: "demo-invalid-2", kind: demoInvalid})

	// One signing key for the runtime and the replay, as in production
	// (security.signing_key_env): the replayed message's origin is then
	// one the runtime trusts. Without the variable set, a key for this run.
	signer, err := envSigner(os.Getenv, cfg)
	if err != nil {
		return err
	}
	var key []byte
	if signer == nil {
		key = make([]byte, 32)
		_, _ = rand.Read(key)
		if signer, err = triage.NewSigner(key); err != nil {
			return err
		}
	} else {
		key = []byte(os.Getenv(cfg.Security.SigningKeyEnv))
	}
	reg := prometheus.NewRegistry()
	c, err := consumer.New(&consumer.Config{
		URL: url, File: cfg, Registry: registry, Registerer: reg, SigningKey: key,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), DrainTimeout: 5 * time.Second,
	})
	if err != nil {
		return err
	}
	if err := c.HandleVersion(q.Name, "orders.created", "2", tr.handler()); err != nil {
		return err
	}

	// The quarantine, read as `dlxbridge quarantine` reads it: the
	// runtime's keeper stores what arrives in the records stream.
	in := &quarantine.Inspector{Conn: conn, Config: cfg}
	watchCtx, stopWatch := context.WithCancel(ctx)
	watched := make(chan struct{})
	go func() { defer close(watched); demoWatchQuarantine(watchCtx, in, tr) }()
	defer func() { stopWatch(); <-watched }()

	runCtx, stopRun := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- c.Run(runCtx) }()
	defer func() {
		stopRun()
		if rerr := <-ran; rerr != nil {
			err = errors.Join(err, rerr)
		}
	}()

	if err := demoPublish(ctx, conn, registry, q, tr); err != nil {
		return err
	}
	fmt.Fprintf(out, "published %d messages to %s: 6 valid orders, 2 that fail then recover, 1 the handler refuses, 1 that crashes its handler, 2 schema-invalid\n\n", len(tr.order), q.Exchange.Name)

	// Live: every change as it happens, and on a terminal the whole table.
	deadline := time.After(timeout)
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	lines := 0
	for settled := false; !settled; {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline:
			demoTable(out, tr)
			return fmt.Errorf("not every message settled within %s", timeout)
		case ev := <-tr.events:
			if !tty {
				fmt.Fprintf(out, "%6.1fs  %s\n", time.Since(start).Seconds(), ev)
			}
		case <-tick.C:
			handled, all := tr.finished()
			acked := demoCounter(reg, "dlxbridge_deliveries_total", "acked")
			settled = all && acked >= float64(handled)
			if tty {
				if lines > 0 {
					fmt.Fprintf(out, "\x1b[%dA\x1b[J", lines)
				}
				lines = demoTable(out, tr)
			}
		}
	}
	if tty && lines > 0 {
		fmt.Fprintf(out, "\x1b[%dA\x1b[J", lines)
	}
	fmt.Fprintf(out, "\nfinal, after %.1fs:\n", time.Since(start).Seconds())
	demoTable(out, tr)
	wrong := demoSummary(out, tr, reg)
	if wrong > 0 {
		return fmt.Errorf("%d message(s) did not end where they should", wrong)
	}
	stopWatch()
	<-watched
	return demoQuarantineTail(ctx, out, in, signer, registry, q, tr)
}

// demoWatchQuarantine marks each message whose quarantine record it reads
// until ctx ends. A snapshot reads the streams to their end (at least
// about 1.5s on an empty stream); there is no event to wait for instead.
func demoWatchQuarantine(ctx context.Context, in *quarantine.Inspector, tr *demoTracker) {
	for ctx.Err() == nil {
		if snap, err := in.Snapshot(ctx); err == nil {
			for _, r := range snap.Records {
				class, attempts := string(r.Envelope.Class), r.Envelope.Attempts
				// The record's count: a schema failure never reached a
				// handler, and its one attempt is the gate's.
				tr.set(r.Properties.MessageID, "quarantined ("+class+")", true, func(m *demoMessage) { m.class, m.attempts = class, attempts })
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// demoConfigYAML is the demo's configuration, as a file would give it: the
// demo runs on what this parses to, and --keep writes the same text out, so
// the quarantine commands read the kept queues with --config.
func demoConfigYAML(prefix string) []byte {
	return []byte(fmt.Sprintf(`# dlxbridge demo %[1]s: written by "dlxbridge demo --keep".
broker:
  connection_name: %[1]s
queues:
  - name: %[1]s.orders
    owner: {team: team-orders}
    exchange: {name: %[1]s.orders, type: topic}
    bindings: [order.created]
    consumer: {prefetch: 10, concurrency: 4, handler_timeout: 5s}
    retry: {tiers: [1s, 2s], jitter: 0, max_attempts: 3, max_elapsed: 0}
    accepts:
      - type: orders.created
        versions: ["2"]
`, prefix))
}

// demoKeepConfig writes the kept demo's configuration next to the system's
// temporary files and says how to look at, and later delete, what is kept.
// The file is new (os.CreateTemp: exclusive, a random suffix): the
// directory is shared, and a name predictable from --prefix could already
// be someone's symlink to a file of ours, which WriteFile would overwrite.
func demoKeepConfig(out io.Writer, prefix string, text []byte, topo *topology.Topology) {
	path, err := writeNewTemp(prefix+"-*.yaml", text)
	if err != nil {
		fmt.Fprintf(out, "\nkept the demo's %d queues and %d exchanges (could not write its config: %v)\n", len(topo.Queues), len(topo.Exchanges), err)
		return
	}
	fmt.Fprintf(out, "\nkept the demo's %d queues and %d exchanges (names start with %s); its config is %s:\n", len(topo.Queues), len(topo.Exchanges), prefix, path)
	self := selfCommand()
	fmt.Fprintf(out, "  %s quarantine list --config %s\n  %s quarantine stats --config %s\n", self, path, self, path)
	fmt.Fprintf(out, "  %s quarantine show <an ID from list> --config %s\n", self, path)
	fmt.Fprintf(out, "  %s quarantine replay --class panic --reason \"tried it\" --dry-run --config %s   (without --dry-run it sends; nothing consumes the kept queue then)\n", self, path)
	// The demo's config names no management API; its names carry the
	// demo's random prefix, so nobody else's object can share them.
	fmt.Fprintf(out, "when done, delete them (the quarantined messages too; --dry-run first shows what goes), then the config:\n  %s topology delete --include-data --without-management --config %s\n  rm %s\n", self, path, path)
}

// selfCommand is how to run this binary again: "go run ./cmd/dlxbridge"
// when it was built by go run (into the build cache's temporary
// directory), else "dlxbridge".
func selfCommand() string {
	if exe, err := os.Executable(); err == nil && strings.Contains(exe, string(filepath.Separator)+"go-build") {
		return "go run ./cmd/dlxbridge"
	}
	return "dlxbridge"
}

// writeNewTemp writes text to a new file in the temporary directory named
// by pattern (as os.CreateTemp) and returns its path.
func writeNewTemp(pattern string, text []byte) (string, error) {
	f, err := os.CreateTemp("", pattern)
	if err != nil {
		return "", err
	}
	_, err = f.Write(text)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(f.Name())
		return "", err
	}
	return f.Name(), nil
}

// demoReplayReason is the replay's reason in the audit trail.
const demoReplayReason = "demo: the customer account was reopened"

// demoQuarantineTail shows the quarantine as `dlxbridge quarantine stats`
// does, replays the permanent group as `dlxbridge quarantine replay` does
// (its handler accepts a replayed message: the account was reopened),
// waits for the handler to take it and shows the stats again.
func demoQuarantineTail(ctx context.Context, out io.Writer, in *quarantine.Inspector, signer *triage.Signer, registry *schemas.Registry, q *config.Queue, tr *demoTracker) error {
	stats := func() error {
		snap, err := in.Snapshot(ctx)
		if err != nil {
			return err
		}
		fmt.Fprintln(out, "\n$ dlxbridge quarantine stats")
		return writeStats(out, snap.Stats(quarantine.Filter{}), snap, false)
	}
	if err := stats(); err != nil {
		return err
	}
	filter := quarantine.Filter{Queue: q.Name, Class: string(triage.ClassPermanent)}
	fmt.Fprintf(out, "\n$ dlxbridge quarantine replay --queue %s --class %s --reason %q\n", filter.Queue, filter.Class, demoReplayReason)
	rp := &quarantine.Replayer{Conn: in.Conn, Config: in.Config, Registry: registry, By: "dlxbridge demo", Signer: signer}
	res, err := rp.Replay(ctx, quarantine.ReplayOptions{Filter: filter, Reason: demoReplayReason})
	if res != nil {
		if werr := writeReplay(out, res); werr != nil {
			return werr
		}
	}
	if err != nil {
		return err
	}
	for range res.Sent {
		select {
		case id := <-tr.redriven:
			fmt.Fprintf(out, "%s: handled after the replay\n", id)
		case <-time.After(15 * time.Second):
			return errors.New("the replayed message was not handled within 15s")
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return stats()
}

// demoPublish sends the mix: valid and failing orders through the
// validating publisher, the invalid ones raw, as a producer the bridge does
// not control would.
func demoPublish(ctx context.Context, conn *amqp.Connection, registry *schemas.Registry, q *config.Queue, tr *demoTracker) error {
	pub, err := publisher.New(conn, publisher.Config{Registry: registry, AppID: "dlxbridge-demo"})
	if err != nil {
		return err
	}
	defer pub.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	if err := ch.Confirm(false); err != nil {
		return err
	}
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, 8))
	for i, m := range tr.order {
		if m.kind != demoInvalid {
			body := fmt.Sprintf(demoOrder, i, 40+i)
			err := pub.Publish(ctx, q.Exchange.Name, "order.created", publisher.Message{
				Type: "orders.created", Version: "2", Body: []byte(body), MessageID: m.id})
			if err != nil {
				return fmt.Errorf("publish %s: %w", m.id, err)
			}
			continue
		}
		body := `{"orderId":"not-a-uuid","customer":{"id":"c-99"}}`
		if m.id == "demo-invalid-2" {
			body = fmt.Sprintf(demoOrder, i, 40+i)[:60] // cut short: not JSON
		}
		err := ch.PublishWithContext(ctx, q.Exchange.Name, "order.created", true, false, amqp.Publishing{
			Type: "orders.created", Headers: amqp.Table{q.Message.VersionHeader: "2"}, MessageId: m.id,
			ContentType: "application/json", DeliveryMode: amqp.Persistent, Body: []byte(body)})
		if err != nil {
			return fmt.Errorf("publish %s: %w", m.id, err)
		}
		if c := <-confirms; !c.Ack {
			return fmt.Errorf("publish %s: nacked", m.id)
		}
	}
	return nil
}

const demoOrder = `{"orderId":"6f1c2b9e-3f4a-4d7b-9a51-2c8e0f6d1a%02d","createdAt":"2026-11-29T10:00:00Z",
 "customer":{"id":"c-%d","email":"ada@example.com"},
 "lineItems":[{"sku":"BOOK-001","quantity":2,"unitPrice":{"amount":"12.50","currency":"EUR"}}],
 "total":{"amount":"25.00","currency":"EUR"}}`

// demoTable prints where every message is and returns the lines written.
func demoTable(w io.Writer, tr *demoTracker) int {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	fmt.Fprintf(w, "%-18s %-10s %-8s %s\n", "MESSAGE", "KIND", "ATTEMPTS", "WHERE")
	for _, m := range tr.order {
		fmt.Fprintf(w, "%-18s %-10s %-8d %s\n", m.id, m.kind, m.attempts, m.where)
	}
	return len(tr.order) + 1
}

// demoSummary prints the totals, cross-checked with the runtime's own
// counters, and returns how many messages ended somewhere unexpected.
func demoSummary(w io.Writer, tr *demoTracker, reg *prometheus.Registry) int {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	wrong, handled := 0, 0
	classes := map[string]int{}
	for _, m := range tr.order {
		if m.where != m.expected() {
			wrong++
			fmt.Fprintf(w, "UNEXPECTED: %s ended %q, expected %q\n", m.id, m.where, m.expected())
		}
		if m.where == "handled" {
			handled++
		} else if m.class != "" {
			classes[m.class]++
		}
	}
	var parts []string
	quarantined := 0
	for c, n := range classes {
		parts = append(parts, fmt.Sprintf("%s %d", c, n))
		quarantined += n
	}
	sort.Strings(parts)
	fmt.Fprintf(w, "\npublished %d: handled %d, quarantined %d (%s); the runtime counted %.0f acked, %.0f retried, %.0f quarantined\n",
		len(tr.order), handled, quarantined, strings.Join(parts, ", "),
		demoCounter(reg, "dlxbridge_deliveries_total", "acked"),
		demoCounter(reg, "dlxbridge_deliveries_total", "retried"),
		demoCounter(reg, "dlxbridge_deliveries_total", "quarantined"))
	return wrong
}

// demoCounter sums a counter's samples whose outcome label is outcome.
func demoCounter(reg *prometheus.Registry, name, outcome string) float64 {
	mfs, err := reg.Gather()
	if err != nil {
		return 0
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "outcome" && l.GetValue() == outcome {
					sum += m.GetCounter().GetValue()
				}
			}
		}
	}
	return sum
}

// demoCleanup deletes the demo's queues, then its exchanges.
func demoCleanup(conn *amqp.Connection, topo *topology.Topology) error {
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	for _, q := range topo.Queues {
		if _, err := ch.QueueDelete(q.Name, false, false, false); err != nil {
			return fmt.Errorf("delete queue %s: %w", q.Name, err)
		}
	}
	for _, x := range topo.Exchanges {
		if err := ch.ExchangeDelete(x.Name, false, false); err != nil {
			return fmt.Errorf("delete exchange %s: %w", x.Name, err)
		}
	}
	return nil
}

// stopOnError writes to w until a write fails (a reader that went away),
// then drops everything: the demo goes on, unseen, to its clean-up.
type stopOnError struct {
	mu     sync.Mutex
	w      io.Writer
	failed bool
}

func (s *stopOnError) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.failed {
		if _, err := s.w.Write(p); err == nil {
			return len(p), nil
		}
		s.failed = true
	}
	return len(p), nil
}

// isTerminal reports whether w is a character device (a terminal).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
