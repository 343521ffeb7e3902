package consumer

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/config"
	"github.com/dlxbridge/dlxbridge/quarantine"
	"github.com/dlxbridge/dlxbridge/schemas"
	"github.com/dlxbridge/dlxbridge/triage"
)

// In report mode the gate checks, counts and logs, and every message reaches
// a handler: an invalid one with its data, one that is not JSON without,
// one of a type the queue does not accept through the default handler. A
// handler that returns the gate's error gets the message quarantined as a
// schema failure.
func TestReportModeDeliversWhatTheGateWouldRefuse(t *testing.T) {
	t.Parallel()
	b := setup(t, func(q *config.Queue) { q.Gate = config.GateReport })
	logs := &lockedLog{}
	b.cfg.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	got := make(chan *Message, 16)
	b.start(func(c *Consumer) {
		must(t, c.Handle(b.queue.Name, testType, HandlerFunc(func(ctx context.Context, m *Message) error {
			got <- m
			if m.MessageID == "refuse" {
				return m.GateError // the handler decides: a schema failure after all
			}
			return nil
		})))
		must(t, c.Handle(b.queue.Name, "", HandlerFunc(func(ctx context.Context, m *Message) error {
			got <- m
			return nil
		})))
	})
	b.publishJSON(map[string]any{"id": "j-1"}, amqp.Publishing{MessageId: "valid"})
	b.publish([]byte(`{"id": 42, "unexpected": true}`), amqp.Publishing{MessageId: "invalid"})
	b.publish([]byte(`not json`), amqp.Publishing{MessageId: "not-json"})
	b.publishJSON(map[string]any{"id": "j-4"}, amqp.Publishing{MessageId: "other-type", Type: "other.thing"})
	b.publish([]byte(`{"unexpected": 1}`), amqp.Publishing{MessageId: "refuse"})

	byID := collectByID(t, got, 5)
	outcomes := map[Outcome]int{}
	for range 5 {
		select {
		case o := <-b.settled:
			outcomes[o]++
		case <-time.After(10 * time.Second):
			t.Fatalf("outcomes so far %v, want 5", outcomes)
		}
	}
	if outcomes[OutcomeAcked] != 4 || outcomes[OutcomeQuarantined] != 1 {
		t.Fatalf("outcomes %v, want 4 acked and 1 quarantined", outcomes)
	}

	if m := byID["valid"]; m.GateError != nil {
		t.Errorf("valid message: gate error %v", m.GateError)
	} else if data, err := m.Data(); err != nil || data == nil {
		t.Errorf("valid message: data %v, %v", data, err)
	}
	inv := byID["invalid"]
	if inv.GateError == nil || inv.GateError.Reason != schemas.ReasonInvalid || inv.Type != testType || inv.Version != "1" {
		t.Fatalf("invalid message: gate error %v, %s v%s", inv.GateError, inv.Type, inv.Version)
	}
	var loose struct{ Unexpected bool }
	if err := inv.Bind(&loose); err != nil || !loose.Unexpected {
		t.Errorf("Bind of an invalid message: %v, %+v", err, loose)
	}
	nj := byID["not-json"]
	if nj.GateError == nil || nj.GateError.Reason != schemas.ReasonDecode {
		t.Fatalf("not-JSON message: gate error %v", nj.GateError)
	}
	if data, err := nj.Data(); data != nil || !errors.Is(err, nj.GateError) {
		t.Fatalf("not-JSON message: data %v, %v; want an error wrapping the gate's", data, err)
	}
	var verr *schemas.ValidationError
	if err := nj.Bind(&loose); !errors.As(err, &verr) {
		t.Errorf("Bind of a body that is not JSON: %v, want the gate's error", err)
	}
	if ot := byID["other-type"]; ot.GateError == nil || ot.GateError.Reason != schemas.ReasonUnknownType || ot.Type != "other.thing" {
		t.Errorf("unknown type: gate error %v, type %q", ot.GateError, ot.Type)
	}

	env, _ := quarantine.Read(ptr(b.quarantined()))
	if env.Class != triage.ClassSchema || env.MessageID != "refuse" || len(env.Validation) == 0 {
		t.Errorf("quarantined %q class %q violations %v; want refuse, schema, some", env.MessageID, env.Class, env.Validation)
	}

	count := func(typ, version string, reason schemas.Reason) float64 {
		return testutil.ToFloat64(b.consumer.metrics.validation.WithLabelValues(b.queue.Name, typ, version, string(reason), config.GateReport))
	}
	if n := count(testType, "1", schemas.ReasonInvalid); n != 2 {
		t.Errorf("reported invalid = %v, want 2", n)
	}
	if n := count(testType, "1", schemas.ReasonDecode); n != 1 {
		t.Errorf("reported decode = %v, want 1", n)
	}
	if n := count("other", "other", schemas.ReasonUnknownType); n != 1 {
		t.Errorf("reported unknown_type = %v, want 1", n)
	}
	if n := testutil.CollectAndCount(b.consumer.metrics.validation); n != 3 {
		t.Errorf("%d validation series, want 3 (all reported)", n)
	}
	text := logs.String()
	for _, want := range []string{"delivering it anyway", "message_id=invalid", "reason=invalid", "message_id=not-json", "reason=decode", "reason=unknown_type"} {
		if !strings.Contains(text, want) {
			t.Errorf("logs lack %q:\n%s", want, text)
		}
	}
}

// With the gate off a queue needs no accepts and no registry: any body, of
// any type, reaches its handler as received.
func TestGateOffNeedsNoAcceptsAndDeliversAnything(t *testing.T) {
	t.Parallel()
	b := setup(t, func(q *config.Queue) {
		q.Gate = config.GateOff
		q.Accepts = nil
	})
	b.cfg.Registry = nil
	got := make(chan *Message, 16)
	b.start(func(c *Consumer) {
		record := HandlerFunc(func(ctx context.Context, m *Message) error { got <- m; return nil })
		must(t, c.Handle(b.queue.Name, "legacy.event", record))
		must(t, c.Handle(b.queue.Name, "", record))
		if err := c.Upcast(testType, "1", "2", func(d any) (any, error) { return d, nil }); err == nil {
			t.Error("Upcast without a registry succeeded")
		}
	})
	b.publish([]byte(`plain text`), amqp.Publishing{MessageId: "text", Type: "legacy.event", ContentType: "text/plain", Headers: amqp.Table{"schema-version": "v7"}})
	b.publish([]byte(`{"a": 1, "a": 2}`), amqp.Publishing{MessageId: "json", Type: "unregistered.type"})
	b.publish([]byte{0x1f, 0x8b, 0x00}, amqp.Publishing{MessageId: "gzip", Type: "legacy.event", ContentEncoding: "gzip"})

	byID := collectByID(t, got, 3)
	for range 3 {
		b.waitOutcome(OutcomeAcked, 10*time.Second)
	}
	text := byID["text"]
	if text.Type != "legacy.event" || text.Version != "7" || string(text.Body) != "plain text" || text.GateError != nil {
		t.Errorf("text message: %s v%s body %q gate error %v", text.Type, text.Version, text.Body, text.GateError)
	}
	if data, err := text.Data(); data != nil || err != nil {
		t.Errorf("text message (gate off): data %v, %v", data, err)
	}
	var v map[string]int
	if err := byID["json"].Bind(&v); err != nil || v["a"] != 2 {
		t.Errorf("Bind of the raw body: %v, %v", err, v)
	}
	if byID["json"].Type != "unregistered.type" {
		t.Errorf("json message type %q", byID["json"].Type)
	}
	if g := byID["gzip"]; !bytes.Equal(g.Body, []byte{0x1f, 0x8b, 0x00}) {
		t.Errorf("gzip body %x", g.Body)
	}
	if n := testutil.CollectAndCount(b.consumer.metrics.validation); n != 0 {
		t.Errorf("%d validation series with the gate off", n)
	}
}

// OnSettled hears every settled delivery of a mixed batch, once, with what
// the runtime decided, and nothing else: the same outcomes the deliveries
// metric counts.
func TestOnSettledSeesEveryOutcome(t *testing.T) {
	t.Parallel()
	b := setup(t, nil) // max_attempts 3, crash_loop_deliveries 2
	var mu sync.Mutex
	var seen []Settled
	b.cfg.OnSettled = func(s Settled) {
		mu.Lock()
		seen = append(seen, s)
		mu.Unlock()
		b.settled <- s.Outcome
	}
	// A real crash loop, counted by the broker: a raw consumer takes
	// "crash" and requeues it CrashLoopDeliveries times before the runtime
	// starts. A producer's own x-delivery-count would not do: on a first
	// delivery it is ignored (see
	// TestForgedHeadersNeitherSkipTheHandlerNorSpendTheBudget).
	b.publishJSON(map[string]any{"id": "5"}, amqp.Publishing{MessageId: "crash"})
	raw := b.env.Channel("crashing-worker")
	for i := 0; i < b.queue.Consumer.CrashLoopDeliveries; i++ {
		d, ok, err := raw.Get(b.queue.Name, false)
		must(t, err)
		if !ok {
			t.Fatalf("crash: not in the work queue for delivery %d", i+1)
		}
		must(t, d.Reject(true))
	}
	stop := b.start(func(c *Consumer) {
		must(t, c.Handle(b.queue.Name, testType, HandlerFunc(func(ctx context.Context, m *Message) error {
			switch m.MessageID {
			case "perm":
				return triage.Permanent(errors.New("no such customer"))
			case "flaky":
				if m.Attempt == 1 {
					return errors.New("downstream busy")
				}
			}
			return nil
		})))
	})
	b.publishJSON(map[string]any{"id": "1"}, amqp.Publishing{MessageId: "ok"})
	b.publishJSON(map[string]any{"id": "2"}, amqp.Publishing{MessageId: "perm"})
	b.publishJSON(map[string]any{"id": "3"}, amqp.Publishing{MessageId: "flaky"})
	b.publish([]byte(`{"id": 4}`), amqp.Publishing{MessageId: "bad"})
	for i := range 6 {
		select {
		case <-b.settled:
		case <-time.After(10 * time.Second):
			t.Fatalf("%d outcomes, want 6", i)
		}
	}
	stop()

	mu.Lock()
	defer mu.Unlock()
	type key struct {
		id      string
		outcome Outcome
	}
	byKey := map[key]Settled{}
	perOutcome := map[Outcome]float64{}
	for _, s := range seen {
		k := key{s.MessageID, s.Outcome}
		if _, dup := byKey[k]; dup {
			t.Errorf("%v reported twice", k)
		}
		byKey[k] = s
		perOutcome[s.Outcome]++
		if s.Queue != b.queue.Name {
			t.Errorf("%v: queue %q", k, s.Queue)
		}
	}
	if len(seen) != 6 {
		t.Errorf("%d reports, want 6: %+v", len(seen), seen)
	}
	for _, o := range []Outcome{OutcomeAcked, OutcomeRetried, OutcomeQuarantined, OutcomeRequeued, OutcomeAckFailed, OutcomeAbandoned} {
		if m := testutil.ToFloat64(b.consumer.metrics.deliveries.WithLabelValues(b.queue.Name, string(o))); m != perOutcome[o] {
			t.Errorf("%s: metric %v, reports %v", o, m, perOutcome[o])
		}
	}
	want := []struct {
		id      string
		outcome Outcome
		class   triage.Class
		attempt int
		check   func(Settled) bool
	}{
		{"ok", OutcomeAcked, "", 1, func(s Settled) bool { return s.Err == nil && s.Type == testType && s.Version == "1" }},
		{"perm", OutcomeQuarantined, triage.ClassPermanent, 1, func(s Settled) bool {
			return s.Err != nil && strings.Contains(s.Err.Error(), "no such customer") && s.Reason != ""
		}},
		{"flaky", OutcomeRetried, triage.ClassTransient, 1, func(s Settled) bool {
			return s.Tier == 0 && s.Delay >= b.queue.Retry.Tiers[0] && strings.Contains(s.Err.Error(), "busy")
		}},
		{"flaky", OutcomeAcked, "", 2, func(s Settled) bool { return s.Err == nil }},
		{"bad", OutcomeQuarantined, triage.ClassSchema, 1, func(s Settled) bool {
			var verr *schemas.ValidationError
			return errors.As(s.Err, &verr) && verr.Reason == schemas.ReasonInvalid && s.Type == testType && s.Version == "1"
		}},
		{"crash", OutcomeQuarantined, triage.ClassCrashLoop, 0, func(s Settled) bool {
			return s.Err == nil && strings.Contains(s.Reason, "crash-looping") && s.Attempt >= 1
		}},
	}
	for _, w := range want {
		s, ok := byKey[key{w.id, w.outcome}]
		if !ok {
			t.Errorf("no %s report for %s", w.outcome, w.id)
			continue
		}
		if s.Class != w.class || (w.attempt > 0 && s.Attempt != w.attempt) || !w.check(s) || s.SettleErr != nil || s.GateError != nil {
			t.Errorf("%s %s: %+v", w.id, w.outcome, s)
		}
	}
}

// A panicking OnSettled is logged; the worker goes on.
func TestOnSettledPanicIsRecovered(t *testing.T) {
	t.Parallel()
	logs := &lockedLog{}
	d := &deps{
		cfg: &Config{OnSettled: func(Settled) { panic("host bug") }},
		log: slog.New(slog.NewTextHandler(logs, nil)),
	}
	d.notifySettled(Settled{Queue: "q", MessageID: "m"})
	if !strings.Contains(logs.String(), "host bug") {
		t.Fatalf("the panic was not logged: %q", logs.String())
	}
}

func TestRouterFallsBackToTheDefaultHandler(t *testing.T) {
	t.Parallel()
	named := func(name string) Handler {
		return HandlerFunc(func(ctx context.Context, m *Message) error { return errors.New(name) })
	}
	r := newRouter()
	r.byType["orders.created"] = named("orders")
	if _, _, _, err := r.route("orders.cancelled", "1"); err == nil {
		t.Fatal("routed a type without a handler or a default")
	}
	r.byType[""] = named("default")
	for _, c := range []struct{ typ, want string }{{"orders.created", "orders"}, {"orders.cancelled", "default"}, {"", "default"}} {
		h, _, _, err := r.route(c.typ, "1")
		if err != nil || h.Handle(context.Background(), nil).Error() != c.want {
			t.Errorf("%q: %v, want the %s handler", c.typ, err, c.want)
		}
	}
}

func TestTakes(t *testing.T) {
	t.Parallel()
	q := &config.Queue{Gate: config.GateEnforce, Accepts: []config.Accept{{Type: "a", Versions: []string{"1", "2"}}}}
	off := &config.Queue{Gate: config.GateOff}
	for _, c := range []struct {
		q            *config.Queue
		typ, version string
		want         bool
	}{
		{q, "a", "", true}, {q, "a", "2", true}, {q, "a", "3", false}, {q, "b", "", false},
		{q, "", "", true}, {off, "anything", "", true}, {off, "anything", "9", true},
	} {
		if got := takes(c.q, c.typ, c.version); got != c.want {
			t.Errorf("takes(%s, %q, %q) = %v", c.q.Gate, c.typ, c.version, got)
		}
	}
}

// A message delivered without a gate binds from its body; one a report-mode
// gate could not decode refuses to bind, with the gate's error, which is a
// schema failure to triage.
func TestBindWithoutValidatedData(t *testing.T) {
	t.Parallel()
	var v struct{ A int }
	if err := (&Message{Body: []byte(`{"A": 3}`), raw: true}).Bind(&v); err != nil || v.A != 3 {
		t.Fatalf("raw bind: %v, %+v", err, v)
	}
	verr := &schemas.ValidationError{Reason: schemas.ReasonDecode}
	err := (&Message{Body: []byte(`{"A": 3}`), GateError: verr}).Bind(&v)
	if class, _ := triage.Classify(err); !errors.Is(err, verr) || class != triage.ClassSchema {
		t.Fatalf("bind without data: %v (class %q)", err, class)
	}
}

func TestLogSamplerLetsABurstThroughPerWindow(t *testing.T) {
	t.Parallel()
	var s logSampler
	t0 := time.Unix(1000, 0)
	for i := range reportLogBurst {
		if ok, _ := s.allow(t0); !ok {
			t.Fatalf("event %d of the first burst suppressed", i)
		}
	}
	for range 5 {
		if ok, _ := s.allow(t0.Add(time.Second)); ok {
			t.Fatal("an event over the burst got through")
		}
	}
	ok, suppressed := s.allow(t0.Add(reportLogWindow))
	if !ok || suppressed != 5 {
		t.Fatalf("next window: ok %v suppressed %d, want true 5", ok, suppressed)
	}
	if _, suppressed := s.allow(t0.Add(reportLogWindow)); suppressed != 0 {
		t.Fatalf("suppressed reported twice: %d", suppressed)
	}
}

func TestRegistryIsNeededOnlyWithAGate(t *testing.T) {
	t.Parallel()
	file := func(gate string) *config.Config {
		f := &config.Config{Queues: []config.Queue{{Name: "q", Exchange: config.Exchange{Name: "x"}, Gate: gate,
			Accepts: []config.Accept{{Type: "t", Versions: []string{"1"}}}}}}
		must(t, f.Complete())
		return f
	}
	if _, err := New(&Config{URL: "amqp://localhost/", File: file(config.GateOff)}); err != nil {
		t.Errorf("gate off, no registry: %v", err)
	}
	if _, err := New(&Config{URL: "amqp://localhost/", File: file(config.GateReport)}); err == nil || !strings.Contains(err.Error(), "Registry is required") {
		t.Errorf("gate report, no registry: %v", err)
	}
}

// collectByID receives n messages from handlers, by message id.
func collectByID(t *testing.T, got <-chan *Message, n int) map[string]*Message {
	t.Helper()
	byID := map[string]*Message{}
	for len(byID) < n {
		select {
		case m := <-got:
			byID[m.MessageID] = m
		case <-time.After(10 * time.Second):
			t.Fatalf("handlers saw %d messages, want %d", len(byID), n)
		}
	}
	return byID
}

// lockedLog is a bytes.Buffer for loggers on several goroutines.
type lockedLog struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *lockedLog) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *lockedLog) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// A message that failed a report-mode gate is upcast as it is, and the
// result is not refused for failing the target schema: the gate reported
// it once. Without data there is nothing to upcast: a schema failure.
func TestUpcastOfAReportedMessage(t *testing.T) {
	t.Parallel()
	reg, err := schemas.Load(schemas.LoadOptions{})
	must(t, err)
	qr := &queueRuntime{deps: &deps{cfg: &Config{Registry: reg}}}
	chain := []upcaster{{to: "2", fn: func(d any) (any, error) { return d, nil }}}
	msg := func(data any, gateErr *schemas.ValidationError) *Message {
		// As runHandler builds it; a report-mode gate that read no data
		// leaves no text.
		m := &Message{Type: "orders.created", Version: "2", OriginalVersion: "1", GateError: gateErr}
		if data != nil {
			m.text, m.data, m.hasData = []byte("{}"), data, true
		}
		return m
	}
	bogus := map[string]any{"bogus": true}
	if err := qr.upcast(msg(bogus, nil), chain); err == nil {
		t.Error("an invalid upcast result of a valid message was let through")
	}
	verr := &schemas.ValidationError{Type: "orders.created", Version: "1", Reason: schemas.ReasonInvalid}
	if m := msg(bogus, verr); qr.upcast(m, chain) != nil || m.data == nil {
		t.Errorf("a reported message was not upcast as it is: data %v", m.data)
	}
	err = qr.upcast(msg(nil, verr), chain)
	if class, _ := triage.Classify(err); class != triage.ClassSchema {
		t.Errorf("upcast without data: %v (class %q), want a schema failure", err, class)
	}
}
