package quarantine

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/config"
	"github.com/dlxbridge/dlxbridge/internal/brokertest"
	"github.com/dlxbridge/dlxbridge/schemas"
	"github.com/dlxbridge/dlxbridge/topology"
	"github.com/dlxbridge/dlxbridge/triage"
)

// storeBundle is one quarantine test: a work queue with its quarantine
// intake and streams declared under the test's prefix (deleted at cleanup).
type storeBundle struct {
	t    *testing.T
	env  *brokertest.Env
	cfg  *config.Config
	q    *config.Queue
	conn *amqp.Connection
	pub  *amqp.Channel
	conf chan amqp.Confirmation
}

func setupStore(t *testing.T, mutate func(q *config.Queue)) *storeBundle {
	t.Helper()
	return setupStoreConfig(t, func(_ *brokertest.Env, cfg *config.Config) {
		if mutate != nil {
			mutate(&cfg.Queues[0])
		}
	})
}

// setupStoreConfig is setupStore with the whole config to change (e.g. to
// add queues, named with env.Name so that they are cleaned up).
func setupStoreConfig(t *testing.T, mutate func(env *brokertest.Env, cfg *config.Config)) *storeBundle {
	t.Helper()
	return setupStoreOn(t, brokertest.Require(t), mutate)
}

// setupStoreOn is setupStoreConfig on the broker of env (e.g. a private
// node's).
func setupStoreOn(t *testing.T, env *brokertest.Env, mutate func(env *brokertest.Env, cfg *config.Config)) *storeBundle {
	t.Helper()
	cfg := &config.Config{Queues: []config.Queue{{
		Name:     env.Name("work"),
		Exchange: config.Exchange{Name: env.Name("ex"), Type: "direct"},
		Bindings: []string{"k"},
		Retry:    config.Retry{Tiers: []time.Duration{200 * time.Millisecond}},
		Accepts:  []config.Accept{{Type: "test.job", Versions: []string{"1"}}},
		Owner:    config.Owner{Team: "payments", Contact: "#payments-oncall"},
	}}}
	mutate(env, cfg)
	if err := cfg.Complete(); err != nil {
		t.Fatal(err)
	}
	conn := env.Dial("store")
	topo, err := topology.BuildFor(cfg, conn)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := (&topology.Broker{Conn: conn}).Apply(context.Background(), topo); err != nil {
		t.Fatal(err)
	}
	pub, err := env.Dial("producer").Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := pub.Confirm(false); err != nil {
		t.Fatal(err)
	}
	return &storeBundle{t: t, env: env, cfg: cfg, q: &cfg.Queues[0], conn: conn, pub: pub,
		conf: pub.NotifyPublish(make(chan amqp.Confirmation, 1024))}
}

// publish sends msg to queue through the default exchange and waits for its
// confirm.
func (b *storeBundle) publish(queue string, msg amqp.Publishing) {
	b.t.Helper()
	if err := b.pub.PublishWithContext(context.Background(), "", queue, true, false, msg); err != nil {
		b.t.Fatal(err)
	}
	if c := <-b.conf; !c.Ack {
		b.t.Fatal("publish nacked")
	}
}

// keep runs a Keeper on the test's intake until want records were kept.
func (b *storeBundle) keep(want int) {
	b.t.Helper()
	b.keepVerifying(want, nil)
}

// keepVerifying is keep with a Keeper that verifies envelopes with v.
func (b *storeBundle) keepVerifying(want int, v *triage.Signer) {
	b.t.Helper()
	kept := make(chan string, want+16)
	k := &Keeper{Consume: b.env.Dial("keeper"), Publish: b.env.Dial("keeper-pub"), Verifier: v,
		Intake: b.q.Quarantine.Queue, Records: b.q.Quarantine.RecordsStream(), kept: func(id string) { kept <- id }}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- k.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			b.t.Errorf("keeper: %v", err)
		}
	}()
	for i := 0; i < want; i++ {
		select {
		case <-kept:
		case err := <-done:
			done <- err
			b.t.Fatalf("keeper stopped after %d of %d: %v", i, want, err)
		case <-time.After(30 * time.Second):
			b.t.Fatalf("keeper kept %d of %d", i, want)
		}
	}
}

func (b *storeBundle) inspector() *Inspector {
	return &Inspector{Conn: b.env.Dial("inspector"), Config: b.cfg}
}

func (b *storeBundle) snapshot(in *Inspector) *Snapshot {
	b.t.Helper()
	s, err := in.Snapshot(context.Background())
	if err != nil {
		b.t.Fatal(err)
	}
	return s
}

// envelopeHeaders is a bridge quarantine envelope for a test.job message.
func envelopeHeaders(queue, fingerprint, errText string, at time.Time) amqp.Table {
	h := amqp.Table{"schema-version": "1"}
	e := Envelope{Source: SourceBridge, Class: "permanent", Reason: "handler refused it", Error: errText,
		Fingerprint: fingerprint, Attempts: 1, QuarantinedAt: at, OriginalQueue: queue, OriginalExchange: "ex",
		OriginalRouting: "k", MessageType: "test.job", SchemaVersion: "1"}
	e.Apply(h)
	return h
}

const testJobSchema = `{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "type": "object",
  "required": ["id"],
  "properties": {"id": {"type": "string", "minLength": 1}, "n": {"type": "integer"}},
  "additionalProperties": false
}`

func (b *storeBundle) registry() *schemas.Registry {
	b.t.Helper()
	dir := b.t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "test.job"), 0o755); err != nil {
		b.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "test.job", "v1.json"), []byte(testJobSchema), 0o644); err != nil {
		b.t.Fatal(err)
	}
	reg, err := schemas.Load(schemas.LoadOptions{Dir: dir})
	if err != nil {
		b.t.Fatal(err)
	}
	return reg
}

// quarantineJobs puts n test.job messages of one fingerprint into the intake
// (as the runtime would) with bodies from body(i), and returns their ids.
func (b *storeBundle) quarantineJobs(n int, fingerprint string, body func(i int) string) {
	b.t.Helper()
	now := time.Now().UTC()
	for i := 0; i < n; i++ {
		h := envelopeHeaders(b.q.Name, fingerprint, "failed "+fingerprint, now)
		h["dlxbridge-attempts"] = int64(3)
		h["x-death"] = []any{amqp.Table{"count": int64(1), "reason": "rejected", "queue": b.q.Name}}
		h["x-delivery-count"] = int64(2)
		b.publish(b.q.Quarantine.Queue, amqp.Publishing{
			MessageId: fmt.Sprintf("%s-%d", fingerprint, i), Type: "test.job", ContentType: "application/json",
			Headers: h, Body: []byte(body(i)),
		})
	}
}

func validJob(i int) string { return fmt.Sprintf(`{"id":"j-%d","n":%d}`, i, i) }

func (b *storeBundle) replayer() *Replayer {
	return &Replayer{Conn: b.env.Dial("replayer"), Config: b.cfg, Registry: b.registry(), By: "tester@test"}
}

func nowUTC() time.Time { return time.Now().UTC() }
