package consumer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/dlxbridge/dlxbridge/config"
	"github.com/dlxbridge/dlxbridge/internal/amqpx"
	"github.com/dlxbridge/dlxbridge/internal/brokertest"
	"github.com/dlxbridge/dlxbridge/internal/frame"
	"github.com/dlxbridge/dlxbridge/quarantine"
	"github.com/dlxbridge/dlxbridge/topology"
	"github.com/dlxbridge/dlxbridge/triage"
	"github.com/dlxbridge/dlxbridge/wire"
)

// Settlement without a broker: the builders are pure, and the ack, reject
// and publish steps go through the acker and confirmer seam, here faked.

type fakeAcker struct {
	mu                 sync.Mutex
	calls              []string
	ackErr, requeueErr error
	rejectErr          error
	onAck              func()
}

func (a *fakeAcker) note(s string) { a.mu.Lock(); a.calls = append(a.calls, s); a.mu.Unlock() }
func (a *fakeAcker) Ack(report func(error)) {
	a.note("ack")
	if a.onAck != nil {
		a.onAck()
	}
	report(a.ackErr)
}
func (a *fakeAcker) Requeue() error { a.note("requeue"); return a.requeueErr }
func (a *fakeAcker) Reject() error  { a.note("reject"); return a.rejectErr }
func (a *fakeAcker) log() string    { a.mu.Lock(); defer a.mu.Unlock(); return strings.Join(a.calls, ",") }

type published struct {
	exchange, key string
	p             amqp.Publishing
}

type fakeConfirmer struct {
	mu   sync.Mutex
	sent []published
	// fail, if set, is returned for a publish (after it is recorded).
	fail func(p published) error
	// block, if set, holds the publish until ctx ends.
	block bool
}

func (f *fakeConfirmer) Publish(ctx context.Context, exchange, key string, p amqp.Publishing, confirmed func(error)) {
	pub := published{exchange, key, p}
	f.mu.Lock()
	f.sent = append(f.sent, pub)
	fail, block := f.fail, f.block
	f.mu.Unlock()
	switch {
	case block:
		go func() {
			<-ctx.Done()
			confirmed(context.Cause(ctx))
		}()
	case fail != nil:
		confirmed(fail(pub))
	default:
		confirmed(nil)
	}
}

type settleBundle struct {
	w       *worker
	out     *fakeConfirmer
	settled []Settled
	stop    context.CancelFunc
	key     []byte
}

const settleQueue = "orders"

func newSettleBundle(t testing.TB, frameMax int) *settleBundle {
	t.Helper()
	file, err := config.Parse([]byte(`queues:
  - name: orders
    exchange: {name: orders}
    bindings: [order.created]
    gate: off
    retry: {tiers: [1s, 5s], jitter: 0, max_attempts: 3}
    quarantine: {redact: {headers: [secret]}}
`))
	if err != nil {
		t.Fatal(err)
	}
	b := &settleBundle{out: &fakeConfirmer{}, key: []byte("0123456789abcdef-settle")}
	var mu sync.Mutex
	c, err := New(&Config{
		URL: "amqp://guest:guest@127.0.0.1:5672/", File: file,
		Logger:     slog.New(slog.NewTextHandler(io.Discard, nil)),
		SigningKey: b.key, WorkerVersion: "test",
		TracerProvider: noop.NewTracerProvider(),
		Rand:           func() float64 { return 0 },
		Now:            func() time.Time { return time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC) },
		OnSettled:      func(s Settled) { mu.Lock(); b.settled = append(b.settled, s); mu.Unlock() },
	})
	if err != nil {
		t.Fatal(err)
	}
	v, _ := topology.ParseBrokerVersion("3.10.8")
	topo, err := topology.Build(file, v)
	if err != nil {
		t.Fatal(err)
	}
	wq, _ := topo.WorkQueue(settleQueue)
	ctx, cancel := context.WithCancel(context.Background())
	b.stop = cancel
	t.Cleanup(cancel)
	qr := c.queues[settleQueue]
	qs := &queueSession{deps: c.deps, q: qr, wq: wq, isRetry: map[string]bool{}, frameMax: frameMax, maxSize: &sizeLimit{},
		handlerCtx: ctx, cancelHandler: cancel, stopping: make(chan struct{}), cancelled: make(chan struct{})}
	qs.acks = newAckWindow(qs.settle, 200, 1)
	b.w = newWorker(qs, b.out)
	t.Cleanup(b.w.close)
	return b
}

// settleFailure is what process and settle do with a failed delivery:
// its outcome, settled. False for a re-admission that cannot be sent:
// process builds a re-admission itself and handles the message instead.
func (w *worker) settleFailure(ctx context.Context, span trace.Span, a acker, d *amqp.Delivery, f failure) bool {
	o := outcome{kind: kindFailed, a: a, d: d, ctx: ctx, span: span, settled: w.settled, failed: &failedOutcome{f: f}}
	if f.verdict.Action == triage.ActionReadmit {
		if o = w.buildCopy(o); o.kind == kindDeadLetter {
			return false
		}
	}
	w.settle(o)
	return true
}

// settle is settleFailure through to its end: the confirm's arrival, the
// ack's write.
func (b *settleBundle) settle(ctx context.Context, a acker, d *amqp.Delivery, f failure) {
	b.w.settleFailure(ctx, noop.Span{}, a, d, f)
	b.w.settling.Wait()
	b.w.s.acks.flush(true)
}

func (b *settleBundle) outcomes() []string {
	var out []string
	for _, s := range b.settled {
		out = append(out, string(s.Outcome))
	}
	return out
}

func delivery() *amqp.Delivery {
	return &amqp.Delivery{
		Exchange: "orders", RoutingKey: "order.created", MessageId: "m-1", CorrelationId: "c-1",
		ContentType: "application/json", Type: "orders.created", Expiration: "60000", UserId: "alice",
		Timestamp: time.Date(2026, 11, 30, 11, 0, 0, 0, time.UTC),
		Headers: amqp.Table{
			"secret": "s3cr3t", "x-app": "kept", wire.HeaderIdempotencyKey: "idem-1",
			wire.HeaderXDeath:        []any{amqp.Table{"queue": "orders", "reason": "rejected", "count": int64(1)}},
			wire.HeaderDeliveryCount: int64(2), wire.HeaderTraceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		},
		Body: []byte(`{"id":  "1"}`), // odd spacing: must go out byte for byte
	}
}

func retryFailure() failure {
	return failure{
		verdict:  triage.Verdict{Action: triage.ActionRetry, Class: triage.ClassTransient, Attempt: 1, Tier: 1, Lane: 0, Delay: 5 * time.Second, Reason: "transient failure; retry 1 in 5s"},
		attempts: triage.Attempts{Notes: []string{"a note"}},
		err:      errors.New("downstream busy"),
	}
}

func quarantineFailure() failure {
	return failure{
		verdict:  triage.Verdict{Action: triage.ActionQuarantine, Class: triage.ClassPermanent, Attempt: 1, Reason: "permanent failure"},
		err:      errors.New("no such customer"),
		msgType:  "orders.created",
		version:  "1",
		attempts: triage.Attempts{Notes: []string{"a note"}},
	}
}

func (b *settleBundle) input(d *amqp.Delivery, f failure) *buildInput {
	in := b.w.buildInput(d, f, noop.Span{})
	in.trace = amqp.Table{wire.HeaderTraceparent: "00-11111111111111111111111111111111-2222222222222222-01"}
	return &in
}

func TestBuildRetry(t *testing.T) {
	t.Parallel()
	b := newSettleBundle(t, frame.DefaultFrameSize)
	d := delivery()
	got, err := build(b.input(d, retryFailure()))
	if err != nil {
		t.Fatal(err)
	}
	p, h := got.p, got.p.Headers
	if got.exchange != "orders.retry" || got.key != b.w.s.wq.Tiers[1].Lanes[0].RoutingKey {
		t.Errorf("to %q %q", got.exchange, got.key)
	}
	if !bytes.Equal(p.Body, d.Body) || p.Expiration != "5000" || p.DeliveryMode != amqp.Persistent || p.MessageId != "m-1" || p.Type != "orders.created" {
		t.Errorf("publishing %+v", p)
	}
	for _, k := range []string{wire.HeaderXDeath, wire.HeaderDeliveryCount} {
		if _, ok := h[k]; ok {
			t.Errorf("the broker's %s went back into the work queue", k)
		}
	}
	want := map[string]any{
		"x-app": "kept", "secret": "s3cr3t", wire.HeaderAttempts: int64(1),
		wire.HeaderOriginalExchange: "orders", wire.HeaderOriginalRoutingKey: "order.created", wire.HeaderOriginalQueue: settleQueue,
		wire.HeaderFirstFailureAt: "2026-11-30T12:00:00Z", wire.HeaderLastError: "downstream busy",
		wire.HeaderOriginalExpiration: "60000", wire.HeaderOriginalUserID: "alice",
		wire.HeaderTraceparent: "00-11111111111111111111111111111111-2222222222222222-01",
		wire.HeaderNotes:       `["a note"]`,
	}
	for k, v := range want {
		if h[k] != v {
			t.Errorf("%s = %#v, want %#v", k, h[k], v)
		}
	}
	signer, _ := triage.NewSigner(b.key)
	if v := signer.Verify(subject(settleQueue, d), h, signedHeaders); !v.Valid {
		t.Errorf("the retry state does not verify: %s", v.Problem)
	}
}

func TestBuildReadmit(t *testing.T) {
	t.Parallel()
	b := newSettleBundle(t, frame.DefaultFrameSize)
	d := delivery()
	f := failure{verdict: triage.Verdict{Action: triage.ActionReadmit, Class: triage.ClassCrashLoop, Reason: "re-admitted"}}
	got, err := build(b.input(d, f))
	if err != nil {
		t.Fatal(err)
	}
	h := got.p.Headers
	if got.exchange != "" || got.key != settleQueue {
		t.Errorf("to %q %q", got.exchange, got.key)
	}
	if _, ok := h[wire.HeaderDeliveryCount]; ok {
		t.Error("x-delivery-count kept")
	}
	if _, ok := h[wire.HeaderXDeath]; !ok {
		t.Error("x-death dropped")
	}
	if h[wire.HeaderReadmitted] != triage.XDeathDigest(d.Headers) || h[wire.HeaderNotes] != `["re-admitted"]` {
		t.Errorf("readmitted %v, notes %v", h[wire.HeaderReadmitted], h[wire.HeaderNotes])
	}
	signer, _ := triage.NewSigner(b.key)
	if v := signer.Verify(subject(settleQueue, d), h, signedHeaders); !v.Valid {
		t.Errorf("the re-admission does not verify: %s", v.Problem)
	}
}

func TestBuildQuarantine(t *testing.T) {
	t.Parallel()
	b := newSettleBundle(t, frame.DefaultFrameSize)
	d := delivery()
	d.Headers[wire.HeaderSignature] = "v1:forged"
	got, err := build(b.input(d, quarantineFailure()))
	if err != nil {
		t.Fatal(err)
	}
	p := got.p
	if got.exchange != "orders.dead" || got.key != settleQueue || !bytes.Equal(p.Body, d.Body) {
		t.Errorf("to %q %q, body %q", got.exchange, got.key, p.Body)
	}
	if _, ok := p.Headers[wire.HeaderSignature]; ok {
		t.Error("the quarantine carries a signature")
	}
	if p.Headers["secret"] != redactedValue {
		t.Errorf("secret = %v, want it redacted", p.Headers["secret"])
	}
	env, ok := quarantine.Read(&amqp.Delivery{MessageId: p.MessageId, Headers: p.Headers})
	if !ok {
		t.Fatal("no envelope")
	}
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	if env.Source != quarantine.SourceBridge || env.Class != triage.ClassPermanent || env.Reason != "permanent failure" ||
		env.Error != "no such customer" || env.Attempts != 1 || !env.QuarantinedAt.Equal(now) || !env.FirstFailureAt.Equal(now) ||
		env.OriginalExchange != "orders" || env.OriginalRouting != "order.created" || env.OriginalQueue != settleQueue ||
		env.IdempotencyKey != "idem-1" || env.MessageType != "orders.created" || env.SchemaVersion != "1" ||
		env.WorkerVersion != "test" || len(env.Redacted) != 1 || env.Fingerprint == "" {
		t.Errorf("envelope %+v", env)
	}
	if strings.Join(env.Notes, ";") != "a note" {
		t.Errorf("notes %q", env.Notes)
	}
}

// A retry whose producer headers can't fit is no retry; a quarantine drops
// the producer's headers to fit, and notes it.
func TestBuildFitsOneFrame(t *testing.T) {
	t.Parallel()
	b := newSettleBundle(t, 4096)
	d := delivery()
	d.Headers["x-big"] = strings.Repeat("b", 8000)
	if _, err := build(b.input(d, retryFailure())); !errors.Is(err, frame.ErrNoFit) {
		t.Fatalf("retry: %v, want ErrNoFit", err)
	}
	got, err := build(b.input(d, quarantineFailure()))
	if err != nil {
		t.Fatal(err)
	}
	if _, kept := got.p.Headers["x-big"]; kept || frame.HeaderFrameSize(&got.p) > 4096 {
		t.Errorf("x-big kept, frame %d", frame.HeaderFrameSize(&got.p))
	}
	if len(got.changed) == 0 || !strings.Contains(strings.Join(got.changed, " "), "x-big") {
		t.Errorf("changed %v", got.changed)
	}
}

// The original is acked only after the broker confirmed its copy.
func TestSettleAcksOnlyAfterConfirm(t *testing.T) {
	t.Parallel()
	b := newSettleBundle(t, frame.DefaultFrameSize)
	a := &fakeAcker{}
	a.onAck = func() {
		if len(b.out.sent) != 1 {
			t.Error("acked before the copy was published")
		}
	}
	b.settle(context.Background(), a, delivery(), retryFailure())
	if a.log() != "ack" || strings.Join(b.outcomes(), ",") != string(OutcomeRetried) {
		t.Fatalf("calls %q, outcomes %v", a.log(), b.outcomes())
	}
	if b.out.sent[0].exchange != "orders.retry" {
		t.Errorf("published to %q", b.out.sent[0].exchange)
	}
	if n := testutil.ToFloat64(b.w.deps.metrics.retries.WithLabelValues(settleQueue, "1")); n != 1 {
		t.Errorf("retries metric %v", n)
	}
}

// A publish that fails (returned, nacked, channel lost) requeues the
// original with a reject, never acks it.
func TestSettleRequeuesWhenThePublishFails(t *testing.T) {
	t.Parallel()
	for _, cause := range []error{amqpx.ErrUnroutable, amqpx.ErrNacked, amqp.ErrClosed} {
		b := newSettleBundle(t, frame.DefaultFrameSize)
		b.out.fail = func(published) error { return cause }
		a := &fakeAcker{}
		b.settle(context.Background(), a, delivery(), quarantineFailure())
		if a.log() != "requeue" || strings.Join(b.outcomes(), ",") != string(OutcomeRequeued) || !errors.Is(b.settled[0].SettleErr, cause) {
			t.Errorf("%v: calls %q, settled %+v", cause, a.log(), b.settled)
		}
		if why, n := b.w.q.publishFailures.take("m-1"); n != 1 || why == "" {
			t.Errorf("%v: publish failure not remembered for the crash-loop note", cause)
		}
	}
}

// A retry that cannot fit is parked in the quarantine; what even the
// quarantine can't fit is rejected without requeue (the broker dead-letters
// it as received), never acked.
func TestSettleNeverAcksWhatCouldNotBeParked(t *testing.T) {
	t.Parallel()
	b := newSettleBundle(t, 4096)
	d := delivery()
	d.Headers["x-big"] = strings.Repeat("b", 8000)
	a := &fakeAcker{}
	b.settle(context.Background(), a, d, retryFailure())
	if a.log() != "ack" || len(b.out.sent) != 1 || b.out.sent[0].exchange != "orders.dead" || b.settled[0].Outcome != OutcomeQuarantined ||
		!strings.Contains(b.settled[0].Reason, "not retried") {
		t.Fatalf("calls %q, sent %d, settled %+v", a.log(), len(b.out.sent), b.settled)
	}

	b = newSettleBundle(t, 600) // not even the bare envelope fits
	a = &fakeAcker{}
	b.settle(context.Background(), a, delivery(), quarantineFailure())
	if a.log() != "reject" || len(b.out.sent) != 0 || strings.Join(b.outcomes(), ",") != string(OutcomeDeadLettered) {
		t.Fatalf("calls %q, sent %d, outcomes %v", a.log(), len(b.out.sent), b.outcomes())
	}
	if n := testutil.ToFloat64(b.w.deps.metrics.deadLettered.WithLabelValues(settleQueue, deadLetterFrameMax)); n != 1 {
		t.Errorf("dead_lettered{reason=frame_max} = %v, want 1", n)
	}
}

// Shutdown past the drain deadline while the publish waits leaves the
// original unsettled: the channel close requeues it.
func TestSettleLeavesItUnsettledOnShutdownMidPublish(t *testing.T) {
	t.Parallel()
	b := newSettleBundle(t, frame.DefaultFrameSize)
	b.out.block = true
	ctx, cancel := context.WithCancelCause(context.Background())
	go func() {
		for {
			b.out.mu.Lock()
			n := len(b.out.sent)
			b.out.mu.Unlock()
			if n > 0 {
				b.stop() // the drain deadline
				cancel(errors.New("drain deadline"))
				return
			}
			time.Sleep(time.Millisecond)
		}
	}()
	a := &fakeAcker{}
	b.settle(ctx, a, delivery(), quarantineFailure())
	if a.log() != "" || strings.Join(b.outcomes(), ",") != string(OutcomeAbandoned) {
		t.Fatalf("calls %q, outcomes %v", a.log(), b.outcomes())
	}
}

// An ack that fails (the channel is gone) is no "acked": the broker will
// redeliver.
func TestSettleReportsAFailedAck(t *testing.T) {
	t.Parallel()
	b := newSettleBundle(t, frame.DefaultFrameSize)
	a := &fakeAcker{ackErr: amqp.ErrClosed}
	b.settle(context.Background(), a, delivery(), retryFailure())
	if strings.Join(b.outcomes(), ",") != string(OutcomeAckFailed) || !errors.Is(b.settled[0].SettleErr, amqp.ErrClosed) {
		t.Fatalf("outcomes %v, settled %+v", b.outcomes(), b.settled)
	}
}

// A reject that fails (the channel is gone) is reported once, like a failed
// ack: OnSettled hears of every delivery the runtime took up.
func TestSettleReportsAFailedReject(t *testing.T) {
	t.Parallel()
	b := newSettleBundle(t, 600) // not even the bare envelope fits
	a := &fakeAcker{rejectErr: amqp.ErrClosed}
	b.settle(context.Background(), a, delivery(), quarantineFailure())
	if a.log() != "reject" || strings.Join(b.outcomes(), ",") != string(OutcomeAckFailed) || !errors.Is(b.settled[0].SettleErr, amqp.ErrClosed) {
		t.Fatalf("calls %q, settled %+v", a.log(), b.settled)
	}
}

// A re-admission that cannot fit is not settled at all: the caller hands the
// message to its handler instead (rejecting it would quarantine a message
// whose handler never ran).
func TestSettleLeavesAnUnfittableReadmissionToTheHandler(t *testing.T) {
	t.Parallel()
	b := newSettleBundle(t, 4096)
	d := delivery()
	d.Headers["x-big"] = strings.Repeat("b", 8000)
	a := &fakeAcker{}
	f := failure{verdict: triage.Verdict{Action: triage.ActionReadmit, Class: triage.ClassCrashLoop, Reason: "re-admitted"}}
	if b.w.settleFailure(context.Background(), noop.Span{}, a, d, f) {
		t.Fatal("settleFailure reported the re-admission settled")
	}
	if a.log() != "" || len(b.out.sent) != 0 || len(b.settled) != 0 {
		t.Fatalf("calls %q, sent %d, settled %+v", a.log(), len(b.out.sent), b.settled)
	}
	// What OnSettled later reports is the handler's outcome, not the
	// re-admission's class and reason.
	if s := b.w.settled; s.Class != "" || s.Reason != "" {
		t.Errorf("the re-admission was noted for the handler's outcome: %+v", s)
	}
}

// recordingAcknowledger is an amqp.Acknowledger that reports each call.
type recordingAcknowledger struct{ calls chan string }

func (r recordingAcknowledger) Ack(uint64, bool) error { r.calls <- "ack"; return nil }
func (r recordingAcknowledger) Nack(uint64, bool, bool) error {
	r.calls <- "nack"
	return nil
}
func (r recordingAcknowledger) Reject(_ uint64, requeue bool) error {
	if requeue {
		r.calls <- "requeue"
	} else {
		r.calls <- "reject"
	}
	return nil
}

// Every settlement, the "can't fit" reject without requeue too, waits
// between a stop's basic.cancel and its cancel-ok: each gives the consumer
// credit for a message the client would drop after the cancel-ok.
func TestSessionSettlementWaitsForTheCancelOk(t *testing.T) {
	t.Parallel()
	ack := func(sd sessionDelivery) error {
		written := make(chan error, 1)
		sd.Ack(func(err error) { written <- err })
		sd.s.acks.flush(true)
		return <-written
	}
	for name, settle := range map[string]func(sessionDelivery) error{
		"ack": ack, "requeue": sessionDelivery.Requeue, "reject": sessionDelivery.Reject,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := newSettleBundle(t, frame.DefaultFrameSize)
			qs := b.w.s
			calls := make(chan string, 1)
			d := delivery()
			d.Acknowledger = recordingAcknowledger{calls}
			d.DeliveryTag = 1
			close(qs.stopping) // basic.cancel sent, no cancel-ok yet
			done := make(chan error, 1)
			go func() { done <- settle(sessionDelivery{s: qs, d: d}) }()
			select {
			case c := <-calls:
				t.Fatalf("%s written before the cancel-ok", c)
			case <-time.After(50 * time.Millisecond):
			}
			close(qs.cancelled)
			if c := <-calls; c != name {
				t.Errorf("wrote %s", c)
			}
			if err := <-done; err != nil {
				t.Error(err)
			}
		})
	}
}

// heldConfirmer keeps each publish's confirm for the test to release, in
// any order.
type heldConfirmer struct {
	mu      sync.Mutex
	held    map[string]func(error) // by message id
	changed chan struct{}          // closed at the next publish
}

func (h *heldConfirmer) Publish(_ context.Context, _, _ string, p amqp.Publishing, confirmed func(error)) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.held == nil {
		h.held = map[string]func(error){}
	}
	h.held[p.MessageId] = confirmed
	if h.changed != nil {
		close(h.changed)
		h.changed = nil
	}
}

// await reports whether a publish of id is held, waiting up to timeout
// for one.
func (h *heldConfirmer) await(id string, timeout time.Duration) bool {
	deadline := time.After(timeout)
	for {
		h.mu.Lock()
		ok := h.held[id] != nil
		if h.changed == nil {
			h.changed = make(chan struct{})
		}
		changed := h.changed
		h.mu.Unlock()
		if ok {
			return true
		}
		select {
		case <-changed:
		case <-deadline:
			return false
		}
	}
}

func (h *heldConfirmer) release(id string, err error) {
	h.mu.Lock()
	confirmed := h.held[id]
	delete(h.held, id)
	h.mu.Unlock()
	confirmed(err)
}

// Publishes are pipelined: the worker goes on while confirms are awaited,
// and each original is acked when its own confirm arrives, in whatever
// order they come, or requeued when its publish was returned (a retry's
// quarantine copy too), nacked or lost with its channel.
func TestSettlePipelinedFinishesEachOnItsOwnConfirm(t *testing.T) {
	t.Parallel()
	b := newSettleBundle(t, frame.DefaultFrameSize)
	held := &heldConfirmer{}
	b.w.out = held
	ids := []string{"m-1", "m-2", "m-3", "m-4", "m-5"}
	ackers := map[string]*fakeAcker{}
	for _, id := range ids {
		d := delivery()
		d.MessageId = id
		ackers[id] = &fakeAcker{}
		b.w.settled = Settled{Queue: settleQueue, MessageID: id}
		if !b.w.settleFailure(context.Background(), noop.Span{}, ackers[id], d, retryFailure()) {
			t.Fatal("not taken up")
		}
	}
	if n := len(b.w.awaiting); n != len(ids) {
		t.Fatalf("%d publishes awaited, want %d", n, len(ids))
	}
	for _, id := range ids {
		if ackers[id].log() != "" {
			t.Fatalf("%s settled before its confirm: %q", id, ackers[id].log())
		}
	}
	confirms := []struct {
		id   string
		err  error
		want string
	}{
		{"m-3", nil, "ack"},
		{"m-5", &amqpx.ReturnedError{Exchange: "orders.retry"}, "requeue"},
		{"m-1", nil, "ack"},
		{"m-4", amqpx.ErrNacked, "requeue"},
		{"m-2", amqpx.ErrPublisherClosed, "requeue"},
	}
	for i, c := range confirms {
		if c.id == "m-5" {
			// A returned retry is sent again as its quarantine copy
			// (retryQueueMissing); that copy returned too is requeued.
			held.release(c.id, c.err)
			if !held.await(c.id, 5*time.Second) {
				t.Fatalf("%s: the returned retry was not sent again as its quarantine copy", c.id)
			}
		}
		held.release(c.id, c.err)
		for deadline := time.Now().Add(5 * time.Second); ackers[c.id].log() == "" && time.Now().Before(deadline); {
			time.Sleep(time.Millisecond)
		}
		if got := ackers[c.id].log(); got != c.want {
			t.Errorf("%s: %q after its confirm (%v), want %q", c.id, got, c.err, c.want)
		}
		for _, later := range confirms[i+1:] {
			if got := ackers[later.id].log(); got != "" {
				t.Errorf("%s settled (%q) before its confirm", later.id, got)
			}
		}
	}
	b.w.settling.Wait()
	got := map[string]Outcome{}
	for _, s := range b.settled {
		got[s.MessageID] = s.Outcome
	}
	want := map[string]Outcome{"m-1": OutcomeRetried, "m-2": OutcomeRequeued, "m-3": OutcomeRetried, "m-4": OutcomeRequeued, "m-5": OutcomeRequeued}
	for id, o := range want {
		if got[id] != o {
			t.Errorf("%s: outcome %q, want %q (all: %v)", id, got[id], o, got)
		}
	}
}

// A channel lost with several confirms outstanding requeues every one of
// their originals; none is acked.
func TestSettlePipelinedChannelLossRequeuesAllOutstanding(t *testing.T) {
	t.Parallel()
	b := newSettleBundle(t, frame.DefaultFrameSize)
	held := &heldConfirmer{}
	b.w.out = held
	var ackers []*fakeAcker
	for i := range 3 {
		d := delivery()
		d.MessageId = fmt.Sprint("m-", i)
		a := &fakeAcker{}
		ackers = append(ackers, a)
		b.w.settleFailure(context.Background(), noop.Span{}, a, d, quarantineFailure())
	}
	// What the pipeline does when its channel closes: fail them all.
	for i := range 3 {
		held.release(fmt.Sprint("m-", i), amqpx.ErrPublisherClosed)
	}
	b.w.settling.Wait()
	for i, a := range ackers {
		if a.log() != "requeue" {
			t.Errorf("m-%d: %q, want requeue", i, a.log())
		}
	}
	if strings.Join(b.outcomes(), ",") != "requeued,requeued,requeued" {
		t.Errorf("outcomes %v", b.outcomes())
	}
}

// tagAcknowledger records the acks written, as (tag, multiple).
type tagAcknowledger struct {
	mu   sync.Mutex
	acks []string
}

func (r *tagAcknowledger) Ack(tag uint64, multiple bool) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.acks = append(r.acks, fmt.Sprintf("%d%s", tag, map[bool]string{true: "+", false: ""}[multiple]))
	return nil
}
func (r *tagAcknowledger) Nack(uint64, bool, bool) error { return nil }
func (r *tagAcknowledger) Reject(uint64, bool) error     { return nil }
func (r *tagAcknowledger) take() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := strings.Join(r.acks, " ")
	r.acks = nil
	return s
}

// Coalesced acks cover only a settled prefix of the delivery tags: never a
// tag still in a handler, never one the broker no longer holds (rejected or
// acked on its own).
func TestAckWindowCoversOnlyTheSettledPrefix(t *testing.T) {
	t.Parallel()
	rec := &tagAcknowledger{}
	w := newAckWindow(func(write func() error) error { return write() }, 1000, 1)
	reported := map[uint64]int{}
	var mu sync.Mutex
	del := func(tag uint64) *amqp.Delivery { return &amqp.Delivery{DeliveryTag: tag, Acknowledger: rec} }
	ack := func(tag uint64) {
		w.ack(del(tag), func(err error) {
			if err != nil {
				t.Errorf("ack %d: %v", tag, err)
			}
			mu.Lock()
			reported[tag]++
			mu.Unlock()
		})
	}
	ack(1)
	ack(2)
	w.rejected(del(3))
	ack(5) // 4 is still in a handler
	w.flush(false)
	if got := rec.take(); got != "2+" {
		t.Fatalf("wrote %q, want one multiple ack of 2", got)
	}
	ack(4)
	w.flush(false)
	if got := rec.take(); got != "5+" {
		t.Fatalf("wrote %q, want 5+", got)
	}
	// A prefix that ends with a rejected tag is acked up to the last acked
	// one.
	ack(6)
	w.rejected(del(7))
	w.flush(false)
	if got := rec.take(); got != "6+" {
		t.Fatalf("wrote %q, want 6+", got)
	}
	// A forced flush acks what waits beyond a gap on its own; the later
	// multiple ack names a tag still outstanding.
	ack(9) // 8 is in a handler
	w.flush(true)
	if got := rec.take(); got != "9" {
		t.Fatalf("wrote %q, want 9 alone", got)
	}
	ack(8)
	w.flush(false)
	if got := rec.take(); got != "8+" {
		t.Fatalf("wrote %q, want 8+", got)
	}
	w.flush(true)
	if got := rec.take(); got != "" {
		t.Fatalf("wrote %q with nothing waiting", got)
	}
	for _, tag := range []uint64{1, 2, 4, 5, 6, 8, 9} {
		if reported[tag] != 1 {
			t.Errorf("tag %d reported %d times", tag, reported[tag])
		}
	}
	if w.held() != 0 || w.prefix != 9 {
		t.Errorf("window holds %d entries, prefix %d", w.held(), w.prefix)
	}
}

// A tag that stays unsettled (a handler may hold it up to its timeout)
// pins the prefix, and the forced flushes ack what settles behind it one by
// one, which frees the prefetch for more deliveries: the window keeps no
// entry per tag written behind it, never acks over it, and once it settles
// one multiple ack covers it.
func TestAckWindowBehindAStuckTagStaysBounded(t *testing.T) {
	t.Parallel()
	rec := &tagAcknowledger{}
	const prefetch, n = 100, 20000
	w := newAckWindow(func(write func() error) error { return write() }, prefetch, 1)
	w.maxDelay = time.Hour
	del := func(tag uint64) *amqp.Delivery { return &amqp.Delivery{DeliveryTag: tag, Acknowledger: rec} }
	most := 0
	// Tag 1 is in a handler throughout; so is, for a while, every tenth
	// tag (settled 30 tags later), and every seventh is rejected.
	settle := func(tag uint64) {
		if tag%7 == 0 {
			w.rejected(del(tag))
		} else {
			w.ack(del(tag), func(error) {})
		}
	}
	for tag := uint64(2); tag <= n; tag++ {
		if tag%10 != 0 {
			settle(tag)
		}
		if tag > 30 && (tag-30)%10 == 0 {
			settle(tag - 30)
		}
		if tag%50 == 0 {
			w.flush(true)
		}
		most = max(most, w.held())
	}
	for tag := uint64(n - 29); tag <= n; tag++ {
		if tag%10 == 0 {
			settle(tag)
		}
	}
	w.flush(true)
	for _, a := range strings.Fields(rec.take()) {
		if strings.HasSuffix(a, "+") {
			t.Fatalf("wrote %s with tag 1 unsettled", a)
		}
	}
	if most > prefetch {
		t.Errorf("the window held up to %d entries behind a stuck tag, prefetch %d", most, prefetch)
	}
	if got := w.held(); got != 1 {
		t.Errorf("window holds %d entries, want one range of written tags", got)
	}
	w.ack(del(1), func(error) {})
	w.flush(false)
	if got := rec.take(); got != "1+" {
		t.Fatalf("wrote %q, want 1+", got)
	}
	if w.held() != 0 || w.prefix != n {
		t.Errorf("window holds %d entries, prefix %d, want 0 and %d", w.held(), w.prefix, n)
	}
}

// A tag the feeder never saw is a delivery the client dropped (addressed
// to a consumer a breaker's pause cancelled): nothing would settle it, so
// it would pin the prefix until the channel closes. It is nacked with
// requeue (no attempt charged) once a later tag shows it was skipped, and the prefix passes it.
func TestAckWindowRequeuesDeliveriesTheClientDropped(t *testing.T) {
	t.Parallel()
	m := &modelChannel{t: t, unacked: map[uint64]bool{}, settled: map[uint64]bool{}}
	w := newAckWindow(func(write func() error) error { return write() }, 1000, 1)
	w.maxDelay = time.Hour
	for tag := uint64(1); tag <= 6; tag++ {
		m.unacked[tag] = true
	}
	del := func(tag uint64) *amqp.Delivery { return &amqp.Delivery{DeliveryTag: tag, Acknowledger: m} }
	for _, tag := range []uint64{1, 2, 5, 6} { // 3 and 4 went to no consumer
		if dropped, err := w.received(del(tag)); err != nil || (tag == 5) != (len(dropped) > 0) {
			t.Fatalf("received %d: dropped %v, error %v", tag, dropped, err)
		}
		m.settled[tag] = true
		w.ack(del(tag), func(error) {})
	}
	w.flush(false)
	if got := strings.Join(m.nacked, " "); got != "3 4" {
		t.Errorf("nacked %q (requeued %q), want 3 4: a reject would charge them a delivery on 4.3+", got, strings.Join(m.requeued, " "))
	}
	if len(m.unacked) != 0 || w.held() != 0 || w.prefix != 6 {
		t.Errorf("unacked %v; window holds %d entries, prefix %d", m.unacked, w.held(), w.prefix)
	}
}

// The window against a model of the broker's unacked deliveries, over
// random settlement orders: every delivery is acked or rejected exactly
// once, a multiple ack names a tag still unacked and covers only settled
// ones.
func TestAckWindowAgainstAModel(t *testing.T) {
	t.Parallel()
	for seed := range int64(50) {
		rng := rand.New(rand.NewSource(seed))
		m := &modelChannel{t: t, unacked: map[uint64]bool{}, settled: map[uint64]bool{}}
		w := newAckWindow(func(write func() error) error { return write() }, 4+rng.Intn(64), 1)
		w.maxDelay = time.Hour
		const n = 2000
		var open []uint64 // delivered, not settled
		next := uint64(1)
		for next <= n || len(open) > 0 {
			if next <= n && (len(open) == 0 || rng.Intn(2) == 0) {
				m.unacked[next] = true
				open = append(open, next)
				next++
				continue
			}
			i := rng.Intn(len(open))
			if rng.Intn(20) == 0 {
				i = 0 // the oldest, sometimes, after a long time
			}
			tag := open[i]
			open = slices.Delete(open, i, i+1)
			m.settled[tag] = true
			d := &amqp.Delivery{DeliveryTag: tag, Acknowledger: m}
			switch rng.Intn(6) {
			case 0:
				delete(m.unacked, tag) // the reject
				w.rejected(d)
			default:
				w.ack(d, func(err error) {
					if err != nil {
						t.Errorf("seed %d: ack %d: %v", seed, tag, err)
					}
				})
			}
			switch rng.Intn(8) {
			case 0:
				w.flush(true)
			case 1:
				w.flush(false)
			}
		}
		w.flush(true)
		if len(m.unacked) != 0 {
			t.Fatalf("seed %d: %d deliveries neither acked nor rejected", seed, len(m.unacked))
		}
		if w.held() != 0 || w.prefix != n {
			t.Fatalf("seed %d: window holds %d entries, prefix %d", seed, w.held(), w.prefix)
		}
	}
}

// modelChannel is an amqp.Acknowledger that keeps the broker's unacked
// tags and fails the test on an ack the broker would refuse or that covers
// a delivery not settled.
type modelChannel struct {
	t                *testing.T
	unacked, settled map[uint64]bool
	requeued, nacked []string
}

func (m *modelChannel) Ack(tag uint64, multiple bool) error {
	m.t.Helper()
	if !m.unacked[tag] {
		m.t.Fatalf("ack of tag %d, not unacked (unknown delivery tag)", tag)
	}
	if !multiple {
		delete(m.unacked, tag)
		return nil
	}
	for t := range m.unacked {
		if t <= tag {
			if !m.settled[t] {
				m.t.Fatalf("multiple ack of %d covers %d, not settled", tag, t)
			}
			delete(m.unacked, t)
		}
	}
	return nil
}
func (m *modelChannel) Nack(tag uint64, multiple, requeue bool) error {
	if multiple || !requeue || m.settled[tag] {
		m.t.Fatalf("nack of tag %d (multiple %v, requeue %v): only a dropped delivery is nacked, alone, with requeue", tag, multiple, requeue)
	}
	m.nacked = append(m.nacked, fmt.Sprint(tag))
	return m.Reject(tag, true)
}
func (m *modelChannel) Reject(tag uint64, requeue bool) error {
	if !m.unacked[tag] {
		m.t.Fatalf("reject of tag %d, not unacked (unknown delivery tag)", tag)
	}
	delete(m.unacked, tag)
	if requeue {
		m.requeued = append(m.requeued, fmt.Sprint(tag))
	}
	return nil
}

// Acks wait for a batch, or for ackDelay, while the worker is busy. Behind
// a delivery not settled yet (its retry or quarantine publish awaits its
// confirm, or it is in another worker's handler) a batch waits for it, not
// written one frame per tag: each such frame is a broker command, and the
// confirm, which comes within moments, lets one multiple ack cover them.
func TestAckWindowBatches(t *testing.T) {
	t.Parallel()
	rec := &tagAcknowledger{}
	w := newAckWindow(func(write func() error) error { return write() }, 16, 1) // batch 4, spill 8
	w.maxDelay = time.Hour
	for tag := uint64(1); tag <= 3; tag++ {
		w.ack(&amqp.Delivery{DeliveryTag: tag, Acknowledger: rec}, func(error) {})
	}
	if got := rec.take(); got != "" {
		t.Fatalf("wrote %q before a batch", got)
	}
	w.ack(&amqp.Delivery{DeliveryTag: 4, Acknowledger: rec}, func(error) {})
	if got := rec.take(); got != "4+" {
		t.Fatalf("wrote %q, want 4+", got)
	}
	// 5 is not settled: a batch behind it, and a worker about to wait
	// with less than half the prefetch behind it, write nothing.
	for tag := uint64(6); tag <= 12; tag++ {
		w.ack(&amqp.Delivery{DeliveryTag: tag, Acknowledger: rec}, func(error) {})
	}
	w.beforeWait()
	if got := rec.take(); got != "" {
		t.Fatalf("wrote %q behind an unsettled tag, want nothing", got)
	}
	// 5 settles: one frame covers all.
	w.ack(&amqp.Delivery{DeliveryTag: 5, Acknowledger: rec}, func(error) {})
	if got := rec.take(); got != "12+" {
		t.Fatalf("wrote %q once the gap settled, want 12+", got)
	}
}

// A worker about to wait for a delivery with half the prefetch acked
// behind a gap writes those acks one by one: the broker may have stopped
// delivering because of them.
func TestAckWindowSpillsHalfThePrefetchBeforeAWait(t *testing.T) {
	t.Parallel()
	rec := &tagAcknowledger{}
	w := newAckWindow(func(write func() error) error { return write() }, 16, 1) // spill 8
	w.maxDelay = time.Hour
	// 1 is not settled.
	for tag := uint64(2); tag <= 9; tag++ {
		w.ack(&amqp.Delivery{DeliveryTag: tag, Acknowledger: rec}, func(error) {})
	}
	if got := rec.take(); got != "" {
		t.Fatalf("wrote %q before the wait", got)
	}
	w.beforeWait()
	got := strings.Fields(rec.take())
	sort.Strings(got)
	if strings.Join(got, " ") != "2 3 4 5 6 7 8 9" {
		t.Fatalf("wrote %q, want 2 to 9 one by one", got)
	}
	if n := w.held(); n != 1 {
		t.Fatalf("the window holds %d entries, want 1 (the range written)", n)
	}
	// Once 1 settles, it is acked over what was written: 1 alone, multiple
	// (the broker holds no other tag up to it).
	w.ack(&amqp.Delivery{DeliveryTag: 1, Acknowledger: rec}, func(error) {})
	w.beforeWait()
	if got := rec.take(); got != "1+" {
		t.Fatalf("wrote %q once the gap settled, want 1+", got)
	}
}

// What waits behind a gap that stays (a long handler in another worker) is
// written by the timer once it has waited ackStale, even with no worker
// flushing.
func TestAckWindowTimerSpillsWhatWaitedTooLongBehindAGap(t *testing.T) {
	t.Parallel()
	rec := &tagAcknowledger{}
	w := newAckWindow(func(write func() error) error { return write() }, 1000, 1)
	done := make(chan error, 3)
	start := time.Now()
	for tag := uint64(2); tag <= 4; tag++ { // 1 is in a handler
		w.ack(&amqp.Delivery{DeliveryTag: tag, Acknowledger: rec}, func(err error) { done <- err })
	}
	for range 3 {
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(3 * time.Second):
			t.Fatal("acks behind a gap waited 3s with nobody to flush them")
		}
	}
	if waited := time.Since(start); waited < ackStale {
		t.Errorf("written after %v, before ackStale (%v): one frame each, sooner than needed", waited, ackStale)
	}
	got := strings.Fields(rec.take())
	sort.Strings(got)
	if strings.Join(got, " ") != "2 3 4" {
		t.Fatalf("wrote %q, want 2 3 4 one by one", got)
	}
}

// An ack never waits on another worker's handler: a retry confirmed while
// an earlier delivery tag is still in a (long) handler, its worker idle,
// is acked on its own within moments, not when that handler ends.
func TestSettledAckBehindABusyTagIsWrittenPromptly(t *testing.T) {
	t.Parallel()
	b := newSettleBundle(t, frame.DefaultFrameSize)
	held := &heldConfirmer{}
	b.w.out = held
	rec := &tagAcknowledger{}
	// Tag 1 is in another worker's handler for as long as the test runs.
	d := delivery()
	d.DeliveryTag, d.Acknowledger = 2, rec
	b.w.settled = Settled{Queue: settleQueue, MessageID: d.MessageId}
	if !b.w.settleFailure(context.Background(), noop.Span{}, sessionDelivery{s: b.w.s, d: d}, d, retryFailure()) {
		t.Fatal("not taken up")
	}
	held.release(d.MessageId, nil)
	deadline := time.Now().Add(3 * time.Second)
	var got string
	for got == "" && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
		got = rec.take()
	}
	if got != "2" {
		t.Fatalf("acks written within 3s: %q, want 2 (on its own)", got)
	}
}

// A worker that acked and went straight into a long handler does not hold
// its ack for that handler's duration: the window writes what has waited
// its delay by itself.
func TestAckWindowWritesWhatWaitedItsDelay(t *testing.T) {
	t.Parallel()
	rec := &tagAcknowledger{}
	w := newAckWindow(func(write func() error) error { return write() }, 1000, 1)
	done := make(chan error, 1)
	w.ack(&amqp.Delivery{DeliveryTag: 1, Acknowledger: rec}, func(err error) { done <- err })
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("the ack waited 3s with nobody to flush it")
	}
	if got := rec.take(); got != "1+" {
		t.Fatalf("wrote %q, want 1+", got)
	}
}

// Publishes that fail together (their channel lost with several awaiting
// confirms) pause together: their originals are requeued after one
// backoff, not after the sum of a growing backoff per failure, one after
// another on the settler (8 failures: 11s with jitter 0).
func TestSettleFailuresThatComeTogetherPauseTogether(t *testing.T) {
	t.Parallel()
	b := newSettleBundle(t, frame.DefaultFrameSize)
	held := &heldConfirmer{}
	b.w.out = held
	const n = 8
	ackers := make([]*fakeAcker, n)
	for i := range n {
		d := delivery()
		d.MessageId = fmt.Sprint("m-", i)
		ackers[i] = &fakeAcker{}
		b.w.settleFailure(context.Background(), noop.Span{}, ackers[i], d, retryFailure())
	}
	for i := range n {
		held.release(fmt.Sprint("m-", i), amqpx.ErrPublisherClosed)
	}
	done := make(chan struct{})
	go func() { b.w.settling.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(4 * time.Second):
		t.Fatal("the originals of publishes that failed together were not requeued within 4s")
	}
	for i, a := range ackers {
		if a.log() != "requeue" {
			t.Errorf("m-%d: %q, want requeue", i, a.log())
		}
	}
}

// A publish that fails on its own (nothing of it written) leaves the
// worker's pipeline and the publishes in flight on it alone: closing the
// pipeline would fail them all, and their originals would come back as
// requeued duplicates of copies the broker confirms.
func TestSessionPublisherKeepsItsPipelineThroughAPublishErrorOfItsOwn(t *testing.T) {
	t.Parallel()
	env := brokertest.Require(t)
	q := env.Name("own")
	if _, err := env.Channel("setup").QueueDeclare(q, true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	conn := env.Dial("publish")
	qs := &queueSession{pubConn: conn, blocking: amqpx.WatchBlocked(conn, func(amqp.Blocking) {}), handlerCtx: ctx}
	sp := &sessionPublisher{s: qs}
	defer sp.close()
	results := make(chan error, 3)
	publish := func(msg amqp.Publishing) { sp.Publish(ctx, "", q, msg, func(err error) { results <- err }) }
	publish(amqp.Publishing{Body: []byte("a")})
	pipe := sp.pipe
	own := make(chan error, 1)
	sp.Publish(ctx, "", q, amqp.Publishing{Body: []byte("b"), Headers: amqp.Table{"n": uint64(1)}}, func(err error) { own <- err })
	if err := <-own; err == nil || errors.Is(err, amqpx.ErrPublisherClosed) {
		t.Fatalf("the publish with a header AMQP cannot carry: %v, want an error of its own", err)
	}
	publish(amqp.Publishing{Body: []byte("c")})
	if sp.pipe != pipe {
		t.Error("a publish error of its own replaced the pipeline (failing what it held)")
	}
	for range 2 {
		select {
		case err := <-results:
			if err != nil {
				t.Errorf("a publish in flight failed: %v", err)
			}
		case <-ctx.Done():
			t.Fatal("confirms missing")
		}
	}
}

// With more workers than half the prefetch, the broker can stop delivering
// with fewer than half the prefetch acked behind a gap: the rest are in
// other workers' (long) handlers. A worker about to wait then waits for
// nothing but the timer (ackStale for every few messages) unless it
// writes what waits behind the gap.
func TestAckWindowSpillsBeforeAWaitWhenHandlersHoldTheRestOfThePrefetch(t *testing.T) {
	t.Parallel()
	rec := &tagAcknowledger{}
	const prefetch, concurrency = 10, 8
	w := newAckWindow(func(write func() error) error { return write() }, prefetch, concurrency)
	w.maxDelay = time.Hour
	// Tags 1 to 7 are in seven workers' long handlers; the eighth acked
	// 8, 9 and 10: all ten are unacked, and the broker sends no more.
	for tag := uint64(8); tag <= 10; tag++ {
		w.ack(&amqp.Delivery{DeliveryTag: tag, Acknowledger: rec}, func(error) {})
	}
	w.beforeWait()
	got := strings.Fields(rec.take())
	sort.Strings(got)
	if strings.Join(got, " ") != "10 8 9" {
		t.Fatalf("a worker about to wait with the whole prefetch unacked wrote %q, want 8 9 10 one by one", got)
	}
}

// delayedConfirmer confirms each publish after delay, from another
// goroutine, as the broker's confirm arrives on the connection's reader.
type delayedConfirmer struct{ delay time.Duration }

func (c delayedConfirmer) Publish(ctx context.Context, exchange, key string, p amqp.Publishing, confirmed func(error)) {
	go func() {
		time.Sleep(c.delay)
		confirmed(nil)
	}()
}

// confirmWaits reads dlxbridge_publish_confirm_seconds{queue,kind} from
// the runtime's collectors: its sample count and sum.
func confirmWaits(t *testing.T, m *metrics, queue, kind string) (n uint64, sum float64) {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(m.publishConfirm); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, s := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range s.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["queue"] == queue && labels["kind"] == kind {
				return s.GetHistogram().GetSampleCount(), s.GetHistogram().GetSampleSum()
			}
		}
	}
	t.Fatalf("no %s series", kind)
	return 0, 0
}

// The time a copy waits for the broker's confirm is observed per kind,
// from its send to its confirm; a publish that failed is not (it is
// counted by dlxbridge_publish_failures_total).
func TestSettleObservesTheConfirmWait(t *testing.T) {
	t.Parallel()
	const delay = 30 * time.Millisecond
	b := newSettleBundle(t, frame.DefaultFrameSize)
	b.w.out = delayedConfirmer{delay}
	b.settle(context.Background(), &fakeAcker{}, delivery(), quarantineFailure())
	b.settle(context.Background(), &fakeAcker{}, delivery(), retryFailure())
	for _, kind := range []string{"quarantine", "retry"} {
		if n, sum := confirmWaits(t, b.w.deps.metrics, settleQueue, kind); n != 1 || sum < delay.Seconds() {
			t.Errorf("%s: %d samples, sum %.3fs; want 1, at least %s", kind, n, sum, delay)
		}
	}
	if n, _ := confirmWaits(t, b.w.deps.metrics, settleQueue, "readmit"); n != 0 {
		t.Errorf("readmit: %d samples, want 0", n)
	}

	failed := newSettleBundle(t, frame.DefaultFrameSize)
	failed.out.fail = func(published) error { return amqpx.ErrNacked }
	failed.settle(context.Background(), &fakeAcker{}, delivery(), quarantineFailure())
	if n, _ := confirmWaits(t, failed.w.deps.metrics, settleQueue, "quarantine"); n != 0 {
		t.Errorf("a nacked publish: %d samples, want 0", n)
	}
}

// Each copy is observed under the kind it went out as: a re-admission as
// readmit, a retry too big to retry and parked in the quarantine instead
// as quarantine. What was never sent (dead-lettered: not even the bare
// envelope fits) and what shutdown cut short are not observed at all.
func TestSettleObservesTheConfirmWaitUnderTheCopysKind(t *testing.T) {
	t.Parallel()
	kinds := func(b *settleBundle) string {
		var s []string
		for _, k := range []string{"retry", "quarantine", "readmit"} {
			n, _ := confirmWaits(t, b.w.deps.metrics, settleQueue, k)
			s = append(s, fmt.Sprintf("%s=%d", k, n))
		}
		return strings.Join(s, " ")
	}
	readmit := failure{verdict: triage.Verdict{Action: triage.ActionReadmit, Class: triage.ClassCrashLoop, Reason: "re-admitted"}}
	b := newSettleBundle(t, frame.DefaultFrameSize)
	b.settle(context.Background(), &fakeAcker{}, delivery(), readmit)
	if got := kinds(b); got != "retry=0 quarantine=0 readmit=1" {
		t.Errorf("a re-admission: %s", got)
	}

	b = newSettleBundle(t, 4096)
	d := delivery()
	d.Headers["x-big"] = strings.Repeat("b", 8000)
	b.settle(context.Background(), &fakeAcker{}, d, retryFailure())
	if b.settled[0].Outcome != OutcomeQuarantined {
		t.Fatalf("the oversized retry was not parked: %+v", b.settled)
	}
	if got := kinds(b); got != "retry=0 quarantine=1 readmit=0" {
		t.Errorf("a retry parked in the quarantine: %s", got)
	}

	b = newSettleBundle(t, 600) // not even the bare envelope fits: dead-lettered, nothing sent
	b.settle(context.Background(), &fakeAcker{}, delivery(), quarantineFailure())
	if got := kinds(b); got != "retry=0 quarantine=0 readmit=0" {
		t.Errorf("a dead-lettered delivery: %s", got)
	}

	b = newSettleBundle(t, frame.DefaultFrameSize)
	b.out.block = true
	ctx, cancel := context.WithCancel(context.Background())
	b.w.settleFailure(ctx, noop.Span{}, &fakeAcker{}, delivery(), retryFailure())
	cancel()
	b.stop()
	b.w.settling.Wait()
	if got := kinds(b); got != "retry=0 quarantine=0 readmit=0" {
		t.Errorf("a publish cut short by shutdown: %s", got)
	}
}
