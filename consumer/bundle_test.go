package consumer

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/config"
	"github.com/dlxbridge/dlxbridge/internal/brokertest"
	"github.com/dlxbridge/dlxbridge/schemas"
	"github.com/dlxbridge/dlxbridge/topology"
)

// testJobSchema is a small schema the runtime tests publish against, so they
// don't depend on the shipped example schemas.
const testJobSchema = `{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "type": "object",
  "required": ["id"],
  "properties": {
    "id": {"type": "string", "minLength": 1},
    "note": {"type": "string"},
    "email": {"type": "string"}
  },
  "additionalProperties": false
}`

const testType = "test.job"

// testSigningKey is the key every test consumer signs its retry state with,
// as replicas sharing $DLXBRIDGE_SIGNING_KEY would.
const testSigningKey = "dlxbridge test signing key, 32 b"

// testBundle is one runtime test's world: a private topology on the real
// broker, a consumer, and signals to wait on instead of sleeping.
type testBundle struct {
	t         testing.TB
	env       *brokertest.Env
	file      *config.Config
	queue     *config.Queue
	topo      *topology.Topology
	wq        *topology.WorkQueue
	registry  *schemas.Registry
	reg       *prometheus.Registry
	cfg       *Config
	consumer  *Consumer
	pubCh     *amqp.Channel
	confirms  chan amqp.Confirmation
	settled   chan Outcome // in order
	consuming chan struct{}
}

// setup declares a one-queue topology with short retry tiers on the shared
// broker. mutate may change the queue config before anything is declared.
func setup(t testing.TB, mutate func(q *config.Queue)) *testBundle {
	t.Helper()
	return setupOn(t, brokertest.Require(t), mutate)
}

// setupOn is setup on the broker of env (e.g. a private node's).
func setupOn(t testing.TB, env *brokertest.Env, mutate func(q *config.Queue)) *testBundle {
	t.Helper()
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, testType), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"v1.json", "v2.json"} {
		if err := os.WriteFile(filepath.Join(dir, testType, v), []byte(testJobSchema), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	jitter := 0.0
	zero := time.Duration(0)
	file := &config.Config{
		Schemas: config.Schemas{Dir: dir},
		Queues: []config.Queue{{
			Name:          env.Name("work"),
			Exchange:      config.Exchange{Name: env.Name("ex"), Type: "topic"},
			Bindings:      []string{"job.#"},
			DeliveryLimit: 4,
			Consumer:      config.Consumer{Prefetch: 10, Concurrency: 2, HandlerTimeout: 2 * time.Second, CrashLoopDeliveries: 2},
			Retry: config.Retry{
				Tiers:       []time.Duration{150 * time.Millisecond, 450 * time.Millisecond, 900 * time.Millisecond},
				Jitter:      &jitter,
				Lanes:       1,
				MaxAttempts: 3,
				MaxElapsed:  &zero,
			},
			Quarantine: config.Quarantine{Queue: env.Name("work.quarantine")},
			Accepts:    []config.Accept{{Type: testType, Versions: []string{"1", "2"}}},
		}},
	}
	if mutate != nil {
		mutate(&file.Queues[0])
	}
	file.ApplyDefaults()
	if err := file.Validate(); err != nil {
		t.Fatalf("test config: %v", err)
	}
	registry, err := schemas.Load(schemas.LoadOptions{Dir: dir})
	if err != nil {
		t.Fatalf("load schemas: %v", err)
	}
	setupConn := env.Dial("setup")
	version, err := topology.VersionFromProperties(setupConn.Properties)
	if err != nil {
		t.Fatal(err)
	}
	topo, err := topology.Build(file, version)
	if err != nil {
		t.Fatal(err)
	}
	applyTopology(t, setupConn, topo)
	wq, _ := topo.WorkQueue(file.Queues[0].Name)

	pubCh, err := env.Dial("test-publisher").Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := pubCh.Confirm(false); err != nil {
		t.Fatal(err)
	}
	b := &testBundle{
		t: t, env: env, file: file, queue: &file.Queues[0], topo: topo, wq: wq, registry: registry,
		reg:      prometheus.NewRegistry(),
		pubCh:    pubCh,
		confirms: pubCh.NotifyPublish(make(chan amqp.Confirmation, 2048)),
		settled:  make(chan Outcome, 4096),
	}
	b.cfg = &Config{
		URL:            env.URL,
		File:           file,
		Registry:       registry,
		ConnectionName: env.Prefix + "/consumer",
		Registerer:     b.reg,
		DrainTimeout:   5 * time.Second,
		ReconnectMin:   50 * time.Millisecond,
		ReconnectMax:   500 * time.Millisecond,
		WorkerVersion:  "test-1.2.3",
		SigningKey:     []byte(testSigningKey),
		Logger:         slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn})),
		OnSettled:      func(s Settled) { b.settled <- s.Outcome },
		hooks:          &testHooks{},
	}
	return b
}

// start builds the consumer (handlers are registered by register) and runs
// it until the test ends (or stop is called), waiting until it consumes.
// stop cancels Run and waits for it to return.
func (b *testBundle) start(register func(c *Consumer)) (stop func()) {
	b.t.Helper()
	consuming := make(chan struct{}, 16)
	b.cfg.hooks.consuming = func() { consuming <- struct{}{} }
	c, err := New(b.cfg)
	if err != nil {
		b.t.Fatalf("consumer.New: %v", err)
	}
	register(c)
	b.consumer = c
	stop = brokertest.Run(b.t, 15*time.Second, c.Run)
	b.consuming = consuming
	b.waitConsuming()
	return stop
}

// waitConsuming waits for the runtime's next "consuming" signal.
func (b *testBundle) waitConsuming() { b.waitConsumingWithin(15 * time.Second) }

// waitConsumingWithin waits up to d for the next "consuming" signal.
func (b *testBundle) waitConsumingWithin(d time.Duration) {
	b.t.Helper()
	select {
	case <-b.consuming:
	case <-time.After(d):
		b.t.Fatalf("consumer did not (re)start consuming within %s", d)
	}
}

// publish sends a test.job v1 message to the work exchange and waits for the
// confirm.
func (b *testBundle) publish(body []byte, p amqp.Publishing) {
	b.t.Helper()
	p.Body = body
	if p.ContentType == "" {
		p.ContentType = "application/json"
	}
	if p.Type == "" {
		p.Type = testType
	}
	if p.Headers == nil {
		p.Headers = amqp.Table{}
	}
	if _, ok := p.Headers["schema-version"]; !ok {
		p.Headers["schema-version"] = "1"
	}
	if err := b.pubCh.PublishWithContext(context.Background(), b.queue.Exchange.Name, "job.test", true, false, p); err != nil {
		b.t.Fatalf("publish: %v", err)
	}
	select {
	case c := <-b.confirms:
		if !c.Ack {
			b.t.Fatal("test publish nacked")
		}
	case <-time.After(10 * time.Second):
		b.t.Fatal("no confirm for test publish")
	}
}

func (b *testBundle) publishJSON(v any, p amqp.Publishing) []byte {
	b.t.Helper()
	body, err := json.Marshal(v)
	if err != nil {
		b.t.Fatal(err)
	}
	b.publish(body, p)
	return body
}

// waitOutcome waits for the next settled outcome and checks it.
func (b *testBundle) waitOutcome(want Outcome, within time.Duration) {
	b.t.Helper()
	select {
	case got := <-b.settled:
		if got != want {
			b.t.Fatalf("outcome %q, want %q", got, want)
		}
	case <-time.After(within):
		b.t.Fatalf("no %q outcome within %s", want, within)
	}
}

// quarantined fetches the one message in the quarantine.
func (b *testBundle) quarantined() amqp.Delivery {
	b.t.Helper()
	ch := b.env.Channel("inspect")
	deadline := time.Now().Add(10 * time.Second)
	for {
		d, ok, err := ch.Get(b.wq.Quarantine, false)
		if err != nil {
			b.t.Fatalf("get from quarantine: %v", err)
		}
		if ok {
			_ = d.Nack(false, true)
			return d
		}
		if time.Now().After(deadline) {
			b.t.Fatal("quarantine is empty")
		}
		time.Sleep(50 * time.Millisecond) // polling the broker; no event to wait on
	}
}

// queueDepth returns the ready count of a queue.
func (b *testBundle) queueDepth(name string) int {
	b.t.Helper()
	ch := b.env.Channel("depth")
	q, err := ch.QueueDeclarePassive(name, true, false, false, false, nil)
	if err != nil {
		b.t.Fatalf("passive declare %s: %v", name, err)
	}
	return q.Messages
}

// recorder counts handler calls and remembers when they happened.
type recorder struct {
	mu    sync.Mutex
	calls []call
	ch    chan call
}

type call struct {
	at      time.Time
	attempt int
	msg     *Message
}

func newRecorder() *recorder { return &recorder{ch: make(chan call, 1024)} }

func (r *recorder) record(m *Message) {
	c := call{at: time.Now(), attempt: m.Attempt, msg: m}
	r.mu.Lock()
	r.calls = append(r.calls, c)
	r.mu.Unlock()
	r.ch <- c
}

func (r *recorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.calls)
}

func applyTopology(t testing.TB, conn *amqp.Connection, topo *topology.Topology) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := (&topology.Broker{Conn: conn}).Apply(ctx, topo); err != nil {
		t.Fatalf("apply topology: %v", err)
	}
}

// startFailing starts the consumer with a handler that fails every call
// (a transient error), and returns its count of calls.
func (b *testBundle) startFailing() *atomic.Int32 {
	var calls atomic.Int32
	b.start(func(c *Consumer) {
		must(b.t, c.Handle(b.queue.Name, testType, HandlerFunc(func(ctx context.Context, m *Message) error {
			calls.Add(1)
			return errors.New("transient")
		})))
	})
	return &calls
}

// settledPastReadmission returns the outcomes up to the first that is not
// a re-admission (4.x re-admits what an upstream queue dead-lettered).
func (b *testBundle) settledPastReadmission() []Outcome {
	b.t.Helper()
	var outcomes []Outcome
	for {
		select {
		case o := <-b.settled:
			outcomes = append(outcomes, o)
			if o != OutcomeReadmitted {
				return outcomes
			}
		case <-time.After(15 * time.Second):
			b.t.Fatalf("not settled within 15s (outcomes %v)", outcomes)
		}
	}
}
