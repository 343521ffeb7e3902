package consumer

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"maps"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/config"
	"github.com/dlxbridge/dlxbridge/schemas"
	"github.com/dlxbridge/dlxbridge/topology"
	"github.com/dlxbridge/dlxbridge/wire"
)

// The happy path without a broker: one valid orders.created v2 delivery
// through worker.process (signature and attempt count, crash-loop guard,
// schema gate, a handler that Binds the body, the ack into the session's
// ack window), as `dlxbridge bench --scenario clean` drives it, minus the
// network. Its allocs/op is what the work on per-message
// bookkeeping measures:
//
//	go test -run '^$' -bench Process -benchmem ./consumer/

// nopAcknowledger takes the ack window's writes.
type nopAcknowledger struct{ acks atomic.Int64 }

func (a *nopAcknowledger) Ack(uint64, bool) error        { a.acks.Add(1); return nil }
func (a *nopAcknowledger) Nack(uint64, bool, bool) error { return nil }
func (a *nopAcknowledger) Reject(uint64, bool) error     { return nil }

type processBundle struct {
	w       *worker
	ch      *nopAcknowledger
	out     *fakeConfirmer     // the retry and quarantine publishes
	cancel  context.CancelFunc // the session's handlers
	handled atomic.Int64
	acked   atomic.Int64
	settled chan Settled // every outcome, while there is room
	body    []byte
	headers amqp.Table
	tag     uint64
}

// newProcessBundle builds a worker on a session with no connection, its
// queue's gate enforcing orders.created v2 (the embedded registry), and a
// handler that Binds the body (or h, if set); edit changes the runtime's
// Config. Spans go to the global tracer provider, none installed, as in
// the bench.
func newProcessBundle(tb testing.TB, edit func(*Config), h HandlerFunc) *processBundle {
	tb.Helper()
	file, err := config.Parse([]byte(`queues:
  - name: orders
    exchange: {name: orders}
    bindings: [order.created]
    accepts: [{type: orders.created, versions: ["2"]}]
`))
	if err != nil {
		tb.Fatal(err)
	}
	reg, err := schemas.Load(schemas.LoadOptions{})
	if err != nil {
		tb.Fatal(err)
	}
	b := &processBundle{ch: &nopAcknowledger{}, body: processBody(1024), headers: amqp.Table{wire.DefaultVersionHeader: "2"},
		settled: make(chan Settled, 16)}
	cfg := &Config{
		URL: "amqp://guest:guest@127.0.0.1:5672/", File: file, Registry: reg,
		Logger:     slog.New(slog.NewTextHandler(io.Discard, nil)),
		SigningKey: []byte("0123456789abcdef-process"),
		OnSettled: func(s Settled) {
			if s.Outcome == OutcomeAcked {
				b.acked.Add(1)
			}
			select {
			case b.settled <- s:
			default:
			}
		},
	}
	if edit != nil {
		edit(cfg)
	}
	c, err := New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	if h == nil {
		h = func(ctx context.Context, m *Message) error {
			var o processOrder
			if err := m.Bind(&o); err != nil {
				return err
			}
			b.handled.Add(1)
			return nil
		}
	}
	if err := c.HandleVersion("orders", "orders.created", "2", h); err != nil {
		tb.Fatal(err)
	}
	v, _ := topology.ParseBrokerVersion("3.10.8")
	topo, err := topology.Build(file, v)
	if err != nil {
		tb.Fatal(err)
	}
	wq, _ := topo.WorkQueue("orders")
	ctx, cancel := context.WithCancel(context.Background())
	b.cancel = cancel
	qr := c.queues["orders"]
	qr.router = c.routers["orders"] // as Run does
	qs := &queueSession{deps: c.deps, q: qr, wq: wq, isRetry: map[string]bool{},
		handlerCtx: ctx, cancelHandler: cancel, stopping: make(chan struct{}), cancelled: make(chan struct{})}
	qs.acks = newAckWindow(qs.settle, 200, 1)
	b.out = &fakeConfirmer{}
	b.w = newWorker(qs, b.out)
	tb.Cleanup(func() {
		b.w.close()
		cancel()
	})
	return b
}

// processOrder is what the handler binds.
type processOrder struct {
	OrderID   string `json:"orderId"`
	LineItems []struct {
		SKU      string `json:"sku"`
		Name     string `json:"name"`
		Quantity int    `json:"quantity"`
	} `json:"lineItems"`
}

// delivery is the next delivery, as the bench publishes it. Its headers
// and body are shared: the runtime only reads them, and what the client
// allocates per delivery is not the runtime's.
func (b *processBundle) delivery() amqp.Delivery {
	b.tag++
	return amqp.Delivery{
		Acknowledger: b.ch, DeliveryTag: b.tag,
		ContentType: "application/json", Type: "orders.created", DeliveryMode: amqp.Persistent,
		MessageId: "m-0000001",
		Headers:   b.headers,
		Exchange:  "orders", RoutingKey: "order.created",
		Body: b.body,
	}
}

// fed is the next delivery as the feeder hands it to a worker.
func (b *processBundle) fed() fedDelivery {
	d := b.delivery()
	return fedDelivery{h: b.w.s.hold(&d)}
}

// ackedWithin waits up to 5s for want acks to be reported, and returns the
// count: a flush the ack window's timer started may still be calling its
// reports when the caller's own flush returns (no event marks its end).
func (b *processBundle) ackedWithin(want int64) int64 {
	deadline := time.Now().Add(5 * time.Second)
	for b.acked.Load() < want && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	return b.acked.Load()
}

// processBody is a valid orders.created v2 body of about size bytes.
func processBody(size int) []byte {
	head := `{"orderId":"00000000-0000-4000-8000-000000000001","createdAt":"2026-01-02T03:04:05Z",` +
		`"customer":{"id":"c-1","email":"c1@example.com","name":"Customer 1"},"channel":"web",` +
		`"total":{"amount":"12.50","currency":"EUR"},"lineItems":[{"sku":"SKU-0001","quantity":1,"name":"first"}`
	var s strings.Builder
	s.WriteString(head)
	for s.Len() < size-64 {
		s.WriteString(`,{"sku":"PAD-0001","quantity":1,"name":"` + strings.Repeat("x", 100) + `"}`)
	}
	s.WriteString(`]}`)
	return []byte(s.String())
}

func BenchmarkProcess(b *testing.B) {
	pb := newProcessBundle(b, nil, nil)
	d := pb.delivery()
	pb.w.handle(d) // warm: watchdog, metric children
	b.ReportAllocs()
	b.ResetTimer()
	cpu := startCPU()
	for range b.N {
		pb.w.handle(pb.delivery())
	}
	b.StopTimer()
	cpu.report(b)
	pb.w.s.acks.flush(true)
	if got := pb.ackedWithin(int64(b.N) + 1); got != int64(b.N)+1 {
		b.Fatalf("%d acked, want %d", got, b.N+1)
	}
}

// runtimeAllocs bounds the allocations of one clean delivery through
// worker.process (BenchmarkProcess measures it) beyond what the gate's
// check and the handler's json.Unmarshal make on their own: the runtime's
// own bookkeeping. It was 21 before the first cuts (96 in all), 13 after
// (88), 10 once one allocation (held) carried a delivery from the feeder to
// its ack report (one or two more under the race detector); the bound
// catches a cut undone.
const runtimeAllocs = 12

// Not parallel: testing.AllocsPerRun refuses to run in a parallel test.
func TestProcessAllocs(t *testing.T) {
	b := newProcessBundle(t, nil, nil)
	b.w.handle(b.delivery()) // warm: watchdog timer, metric children
	got := testing.AllocsPerRun(200, func() { b.w.handle(b.delivery()) })
	b.w.s.acks.flush(true)
	if got := b.ackedWithin(202); got != 202 { // AllocsPerRun runs it once more to warm up
		t.Fatalf("%d acked, want 202", got)
	}
	d := b.delivery()
	in := schemas.Input{ContentType: d.ContentType, Type: d.Type, Headers: d.Headers, Body: d.Body}
	base := testing.AllocsPerRun(200, func() {
		if _, err := b.w.q.gate.Check(in); err != nil {
			t.Fatal(err)
		}
		var o processOrder
		if err := json.Unmarshal(d.Body, &o); err != nil {
			t.Fatal(err)
		}
	})
	t.Logf("%.0f allocations per delivery, %.0f of them the gate's and the Unmarshal's", got, base)
	if got-base > runtimeAllocs {
		t.Fatalf("the runtime makes %.0f allocations per delivery beyond the gate's and the Unmarshal's, want at most %d", got-base, runtimeAllocs)
	}
}

// BenchmarkProcessKinds is worker.process on each kind of delivery of
// "dlxbridge bench --scenario storm" at --immediate-retries 1, the publishes
// confirmed at once by a fake: what each costs the runtime beyond the
// network. ok is BenchmarkProcess; invalid is refused by the gate and
// quarantined; transient fails its first call and succeeds on the
// immediate retry; failing fails both calls and is sent to a retry lane;
// retried is such a retry back from its lane (its signed state, the
// broker's x-death), and succeeds.
func BenchmarkProcessKinds(b *testing.B) {
	errTransient := errors.New("transient")
	for _, kind := range []string{"ok", "invalid", "transient", "failing", "retried"} {
		b.Run(kind, func(b *testing.B) {
			var calls int
			fail := kind == "failing" || kind == "retried" // retried: its first delivery only
			h := HandlerFunc(func(ctx context.Context, m *Message) error {
				var o processOrder
				if err := m.Bind(&o); err != nil {
					return err
				}
				calls++
				switch {
				case kind == "transient" && m.Attempt == 1, fail:
					return errTransient
				}
				return nil
			})
			pb := newProcessBundle(b, func(c *Config) {
				c.File.Queues[0].Retry.ImmediateRetries = 1
				// As the bench's bridge side: errors only, not a warning
				// per quarantined message.
				c.Logger = slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelError}))
			}, h)
			if kind == "invalid" {
				pb.body = bytes.Replace(pb.body, []byte(`"quantity":1`), []byte(`"quantity":0`), 1)
			}
			pb.w.handle(pb.delivery())
			if kind == "retried" {
				pb.headers = returnedRetry(b, pb.out)
				fail = false
				pb.w.handle(pb.delivery())
			}
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				pb.w.handle(pb.delivery())
				pb.out.mu.Lock()
				pb.out.sent = pb.out.sent[:0]
				pb.out.mu.Unlock()
			}
		})
	}
}

// returnedRetry is the headers of the one retry out sent, as the work
// queue delivers it once its lane's TTL has expired: the broker's x-death
// added.
func returnedRetry(tb testing.TB, out *fakeConfirmer) amqp.Table {
	tb.Helper()
	out.mu.Lock()
	defer out.mu.Unlock()
	if len(out.sent) != 1 {
		tb.Fatalf("%d publishes, want the one retry", len(out.sent))
	}
	r := out.sent[0]
	out.sent = out.sent[:0]
	h := maps.Clone(r.p.Headers)
	h["x-death"] = []any{amqp.Table{
		"count": int64(1), "reason": "expired", "queue": r.key, "exchange": r.exchange,
		"routing-keys": []any{r.key}, "original-expiration": r.p.Expiration, "time": time.Now().Truncate(time.Second),
	}}
	h["x-first-death-exchange"] = r.exchange
	h["x-first-death-queue"] = r.key
	h["x-first-death-reason"] = "expired"
	return h
}
