package consumer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/dlxbridge/dlxbridge/config"
	"github.com/dlxbridge/dlxbridge/internal/amqpx"
	"github.com/dlxbridge/dlxbridge/internal/brokertest"
	"github.com/dlxbridge/dlxbridge/internal/frame"
	"github.com/dlxbridge/dlxbridge/quarantine"
	"github.com/dlxbridge/dlxbridge/triage"
)

// The pure decisions: only the body counts, a limit not yet learned never
// holds a copy back, and what cannot be sent says why.
func TestOverLimitAndUnsendable(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		size  int
		limit int64
		over  bool
	}{
		{10, 0, false},        // not learned yet: send, the broker decides
		{1 << 30, 0, false},   // however large
		{65536, 65536, false}, // exactly the limit passes
		{65537, 65536, true},  // one byte over does not
		{0, 1, false},         // an empty body
		{16 << 20, 16 << 20, false},
	} {
		if got := overLimit(c.size, c.limit); got != c.over {
			t.Errorf("overLimit(%d, %d) = %v, want %v", c.size, c.limit, got, c.over)
		}
	}
	tooLarge := &amqpx.TooLargeError{Size: 11, Max: 10, Closed: amqpx.ErrPublisherClosed}
	for _, c := range []struct {
		err    error
		reason string
	}{
		{nil, ""},
		{errors.New("downstream"), ""},
		{amqpx.ErrPublisherClosed, ""},
		{fmt.Errorf("%w: %w", amqpx.ErrBesideRefusal, amqpx.ErrPublisherClosed), ""}, // sent again, not given up
		{amqpx.ErrNacked, ""},
		{fmt.Errorf("build: %w", frame.ErrNoFit), deadLetterFrameMax},
		{&overLimitError{size: 11, limit: 10}, deadLetterMaxMessageSize},
		{fmt.Errorf("publish: %w", tooLarge), deadLetterMaxMessageSize},
	} {
		reason, ok := unsendable(c.err)
		if reason != c.reason || ok != (c.reason != "") {
			t.Errorf("unsendable(%v) = %q %v, want %q", c.err, reason, ok, c.reason)
		}
	}
}

// Once the connection knows the broker's limit, a retry or quarantine copy
// whose body is over it is never sent (a refusal would close the channel
// under the other publishes in flight): the original is rejected without
// requeue, and the broker dead-letters it as received into the quarantine.
// A body of exactly the limit is sent as usual.
func TestSettleDeadLettersWhatIsOverTheLearnedLimit(t *testing.T) {
	t.Parallel()
	body := int64(len(delivery().Body))
	for _, f := range []failure{retryFailure(), quarantineFailure()} {
		b := newSettleBundle(t, frame.DefaultFrameSize)
		b.w.s.maxSize.learn(body - 1)
		a := &fakeAcker{}
		b.settle(context.Background(), a, delivery(), f)
		if a.log() != "reject" || len(b.out.sent) != 0 || strings.Join(b.outcomes(), ",") != string(OutcomeDeadLettered) {
			t.Fatalf("%s: calls %q, sent %d, outcomes %v", f.verdict.Action, a.log(), len(b.out.sent), b.outcomes())
		}
		var ol *overLimitError
		if s := b.settled[0]; !errors.As(s.SettleErr, &ol) || s.Class != f.verdict.Class {
			t.Fatalf("%s: settled %+v", f.verdict.Action, s)
		}
		if n := testutil.ToFloat64(b.w.deps.metrics.deadLettered.WithLabelValues(settleQueue, deadLetterMaxMessageSize)); n != 1 {
			t.Errorf("%s: dead_lettered{reason=max_message_size} = %v, want 1", f.verdict.Action, n)
		}
		if n := testutil.ToFloat64(b.w.deps.metrics.quarantined.WithLabelValues(settleQueue, string(f.verdict.Class))); n != 1 {
			t.Errorf("%s: quarantined = %v, want 1 (it ends in the quarantine)", f.verdict.Action, n)
		}

		b = newSettleBundle(t, frame.DefaultFrameSize)
		b.w.s.maxSize.learn(body)
		a = &fakeAcker{}
		b.settle(context.Background(), a, delivery(), f)
		if a.log() != "ack" || len(b.out.sent) != 1 {
			t.Fatalf("%s at exactly the limit: calls %q, sent %d, outcomes %v", f.verdict.Action, a.log(), len(b.out.sent), b.outcomes())
		}
	}

	// A re-admission over the limit is left to the handler, like one over
	// a frame: rejecting it would quarantine a message never handled.
	b := newSettleBundle(t, frame.DefaultFrameSize)
	b.w.s.maxSize.learn(body - 1)
	a := &fakeAcker{}
	if b.w.settleFailure(context.Background(), noop.Span{}, a, delivery(), failure{verdict: triage.Verdict{Action: triage.ActionReadmit, Class: triage.ClassCrashLoop, Reason: "re-admitted"}}) {
		t.Fatal("settleFailure settled a re-admission over the limit")
	}
	if a.log() != "" || len(b.out.sent) != 0 || len(b.settled) != 0 {
		t.Fatalf("re-admission: calls %q, sent %d, settled %+v", a.log(), len(b.out.sent), b.settled)
	}
}

// The first refusal teaches the connection the limit: that delivery is
// rejected into the broker's dead-lettering (the broker refused its copy
// before routing it, so no copy exists; none of its body can ever be sent),
// never requeued to be refused again until the delivery limit, and a later
// failure over the limit is not even sent. A refused re-admission, whose
// handler never ran, is requeued instead: it comes back and is handled in
// place.
func TestSettleLearnsTheLimitFromTheBrokersRefusal(t *testing.T) {
	t.Parallel()
	body := int64(len(delivery().Body))
	refusal := &amqpx.TooLargeError{Size: body, Max: body - 1, Closed: fmt.Errorf("%w: 406", amqpx.ErrPublisherClosed)}
	b := newSettleBundle(t, frame.DefaultFrameSize)
	b.out.fail = func(published) error { return refusal }
	a := &fakeAcker{}
	b.settle(context.Background(), a, delivery(), retryFailure())
	if a.log() != "reject" || len(b.out.sent) != 1 || strings.Join(b.outcomes(), ",") != string(OutcomeDeadLettered) || !errors.Is(b.settled[0].SettleErr, refusal) {
		t.Fatalf("calls %q, sent %d, settled %+v", a.log(), len(b.out.sent), b.settled)
	}
	if got := b.w.s.maxSize.get(); got != body-1 {
		t.Fatalf("learned limit %d, want %d", got, body-1)
	}
	a = &fakeAcker{}
	b.settle(context.Background(), a, delivery(), quarantineFailure())
	if a.log() != "reject" || len(b.out.sent) != 1 || strings.Join(b.outcomes(), ",") != string(OutcomeDeadLettered+","+OutcomeDeadLettered) {
		t.Fatalf("after learning: calls %q, sent %d, outcomes %v", a.log(), len(b.out.sent), b.outcomes())
	}

	b = newSettleBundle(t, frame.DefaultFrameSize)
	b.out.fail = func(published) error { return refusal }
	a = &fakeAcker{}
	b.settle(context.Background(), a, delivery(), failure{verdict: triage.Verdict{Action: triage.ActionReadmit, Class: triage.ClassCrashLoop, Reason: "re-admitted"}})
	if a.log() != "requeue" || strings.Join(b.outcomes(), ",") != string(OutcomeRequeued) || b.w.s.maxSize.get() != body-1 {
		t.Fatalf("re-admission: calls %q, outcomes %v, limit %d", a.log(), b.outcomes(), b.w.s.maxSize.get())
	}
}

// sizeLimitForTests is the private nodes' max_message_size here: reached
// with 64 KiB bodies, not 16 MiB ones on a shared broker.
const sizeLimitForTests = 65536

// One oversized copy must not cost the other publishes on its channel
// anything: the broker closes the channel under all of them, and the
// worker's publisher sends those again on a new channel (the refused one
// alone reports the refusal). Before, each came back as a failed publish
// and its original was requeued (a delivery counted, the handler run
// again).
func TestSessionPublisherSendsAgainWhatAnOversizedPublishTookDown(t *testing.T) {
	t.Parallel()
	opts := brokertest.LikeShared(brokertest.Require(t))
	opts.Config = fmt.Sprintf("max_message_size = %d", sizeLimitForTests)
	node := brokertest.StartPrivateNodeWith(t, opts)
	env := node.Env(t)
	t.Logf("private node: RabbitMQ %s", env.ServerVersion)
	q := env.Name("resend")
	ch := env.Channel("setup")
	if _, err := ch.QueueDeclare(q, true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	conn := env.Dial("publish")
	qs := &queueSession{pubConn: conn, blocking: amqpx.WatchBlocked(conn, func(amqp.Blocking) {}), handlerCtx: ctx, maxSize: &sizeLimit{}}
	sp := &sessionPublisher{s: qs}
	defer sp.close()
	type result struct {
		id  string
		err error
	}
	results := make(chan result, 8)
	names := []string{"a", "b", "huge", "c", "d"}
	for _, id := range names {
		body := []byte("small " + id)
		if id == "huge" {
			body = bytes.Repeat([]byte("x"), sizeLimitForTests+1)
		}
		sp.Publish(ctx, "", q, amqp.Publishing{MessageId: id, Body: body}, func(err error) { results <- result{id, err} })
	}
	got := map[string]error{}
	for len(got) < len(names) {
		select {
		case r := <-results:
			got[r.id] = r.err
		case <-ctx.Done():
			t.Fatalf("results missing: %v", got)
		}
	}
	if max, ok := amqpx.IsTooLarge(got["huge"]); !ok || max != sizeLimitForTests {
		t.Fatalf("the oversized publish: %v, want the broker's refusal naming %d", got["huge"], sizeLimitForTests)
	}
	for _, id := range names {
		if id != "huge" && got[id] != nil {
			t.Errorf("%s, in flight beside the oversized one: %v, want confirmed", id, got[id])
		}
	}
	var in []string
	for {
		d, ok, err := ch.Get(q, true)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			break
		}
		in = append(in, d.MessageId)
	}
	for _, id := range names {
		if id != "huge" && !slices.Contains(in, id) {
			t.Errorf("%s is not in the queue (it holds %v)", id, in)
		}
	}
	if slices.Contains(in, "huge") {
		t.Errorf("the refused message is in the queue: %v", in)
	}
}

// A message already in a work queue when the broker's max message size is
// lowered under it (a restart with a new config; the limit counts the body
// only, so nothing else makes a retry's copy too large) fails its handler: its retry copy is refused.
// The runtime learns the limit from that refusal, rejects the message
// without requeue, and the broker dead-letters it, byte for byte, into the
// quarantine; the next such message is not even sent. Nothing is lost,
// nothing loops through requeues up to the delivery limit, and the small
// messages failing beside them are retried as usual, never requeued.
func TestRetryOverTheBrokersMaxMessageSizeIsDeadLetteredNotLooped(t *testing.T) {
	t.Parallel()
	node := brokertest.StartPrivateNodeWith(t, brokertest.LikeShared(brokertest.Require(t)))
	env := node.Env(t)
	t.Logf("private node: RabbitMQ %s", env.ServerVersion)
	b := setupOn(t, env, func(q *config.Queue) {
		q.Consumer.Concurrency = 1 // one publishing channel: the others are in flight on it
		q.Consumer.Prefetch = 10
	})
	type msg struct {
		id   string
		body []byte
	}
	var msgs []msg
	for i := range 3 {
		small := fmt.Sprintf("small-%d", i)
		msgs = append(msgs, msg{small, []byte(`{"id":"` + small + `"}`)})
		big := fmt.Sprintf("big-%d", i)
		msgs = append(msgs, msg{big, []byte(`{"id":"` + big + `","note":"` + strings.Repeat("n", sizeLimitForTests) + `"}`)})
	}
	for _, m := range msgs {
		b.publish(m.body, amqp.Publishing{MessageId: m.id})
	}
	node.Reconfigure(fmt.Sprintf("max_message_size = %d", sizeLimitForTests)) // the messages stay

	var mu sync.Mutex
	calls := map[string]int{}
	outcomes := map[string][]Outcome{}
	changed := make(chan struct{}, 64)
	b.cfg.OnSettled = func(s Settled) {
		mu.Lock()
		outcomes[s.MessageID] = append(outcomes[s.MessageID], s.Outcome)
		mu.Unlock()
		changed <- struct{}{}
	}
	done := func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, m := range msgs {
			o := outcomes[m.id]
			if len(o) == 0 || strings.HasPrefix(m.id, "small") && o[len(o)-1] != OutcomeAcked {
				return false
			}
		}
		return true
	}
	b.start(func(c *Consumer) {
		must(t, c.Handle(b.queue.Name, testType, HandlerFunc(func(ctx context.Context, m *Message) error {
			mu.Lock()
			calls[m.MessageID]++
			n := calls[m.MessageID]
			mu.Unlock()
			if n == 1 {
				return errors.New("downstream busy") // transient: a delayed retry
			}
			return nil
		})))
	})
	deadline := time.After(60 * time.Second)
	for !done() {
		select {
		case <-changed:
		case <-deadline:
			mu.Lock()
			t.Fatalf("not settled within 60s: outcomes %v, calls %v", outcomes, calls)
			mu.Unlock()
		}
	}
	mu.Lock()
	for _, m := range msgs {
		o := outcomes[m.id]
		if strings.HasPrefix(m.id, "big") {
			if !slices.Equal(o, []Outcome{OutcomeDeadLettered}) {
				t.Errorf("%s: outcomes %v, want only %s (handler ran %d times)", m.id, o, OutcomeDeadLettered, calls[m.id])
			}
			continue
		}
		// A retry copy written before the refused one may have reached its
		// lane unconfirmed: sent again, it comes back twice (at least
		// once). Never a requeue.
		if o[0] != OutcomeRetried || slices.ContainsFunc(o[1:], func(s Outcome) bool { return s != OutcomeAcked }) {
			t.Errorf("%s: outcomes %v, want %s and then %s (handler ran %d times)", m.id, o, OutcomeRetried, OutcomeAcked, calls[m.id])
		} else if len(o) > 2 {
			t.Logf("%s: a duplicate (outcomes %v)", m.id, o)
		}
	}
	mu.Unlock()
	if n := testutil.ToFloat64(b.consumer.deps.metrics.deadLettered.WithLabelValues(b.queue.Name, deadLetterMaxMessageSize)); n != 3 {
		t.Errorf("dead_lettered{reason=max_message_size} = %v, want 3", n)
	}

	// In the quarantine's intake, as received: the broker's dead letters.
	ch := b.env.Channel("inspect")
	kept := map[string]amqp.Delivery{}
	for wait := time.Now().Add(10 * time.Second); len(kept) < 3; {
		d, ok, err := ch.Get(b.wq.Quarantine, true)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			if time.Now().After(wait) {
				break
			}
			time.Sleep(50 * time.Millisecond) // the broker dead-letters on its own time; no event to wait on
			continue
		}
		kept[d.MessageId] = d
	}
	for _, m := range msgs {
		d, ok := kept[m.id]
		if strings.HasPrefix(m.id, "small") {
			if ok {
				t.Errorf("%s was quarantined", m.id)
			}
			continue
		}
		if !ok {
			t.Errorf("%s is not in the quarantine (lost?): it holds %d", m.id, len(kept))
			continue
		}
		env, _ := quarantine.Read(&d)
		if !bytes.Equal(d.Body, m.body) || env.Source != quarantine.SourceBroker || env.Class != triage.ClassRejected || env.OriginalQueue != b.queue.Name {
			t.Errorf("%s in the quarantine: body %d bytes (want %d), envelope %+v", m.id, len(d.Body), len(m.body), env)
		}
	}
}

// The whole way, with the runtime's keeper on: a message over the lowered
// limit fails for good, the broker dead-letters it into the intake, and
// the keeper, whose record of it is larger still, keeps a stub saying how
// large the payload was and why it is missing (docs/quarantine.md). The
// record is the broker's (class rejected, the work queue as its origin).
func TestMessageOverTheLimitEndsAsARecordThatSaysSo(t *testing.T) {
	t.Parallel()
	node := brokertest.StartPrivateNodeWith(t, brokertest.LikeShared(brokertest.Require(t)))
	env := node.Env(t)
	t.Logf("private node: RabbitMQ %s", env.ServerVersion)
	b := setupOn(t, env, nil)
	b.cfg.hooks.keeper = true
	body := []byte(`{"id":"big","note":"` + strings.Repeat("n", sizeLimitForTests) + `"}`)
	b.publish(body, amqp.Publishing{MessageId: "big"})
	node.Reconfigure(fmt.Sprintf("max_message_size = %d", sizeLimitForTests))
	b.start(func(c *Consumer) {
		must(t, c.Handle(b.queue.Name, testType, HandlerFunc(func(ctx context.Context, m *Message) error {
			return triage.Permanent(errors.New("no such customer"))
		})))
	})
	b.waitOutcome(OutcomeDeadLettered, 30*time.Second)
	// After the restart a stream answers "home node … is down" for a while
	// (seen on 3.10.8 under load): read until it answers.
	in := &quarantine.Inspector{Conn: b.env.Dial("inspector"), Config: b.file}
	var snap *quarantine.Snapshot
	for deadline := time.Now().Add(60 * time.Second); ; {
		var err error
		snap, err = in.Snapshot(context.Background())
		if err == nil && len(snap.Records) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no record within 60s (last read: %v)", err)
		}
		time.Sleep(200 * time.Millisecond) // polling the broker: a stream has no event to wait on
	}
	r := snap.Records[0]
	om := r.Envelope.PayloadOmitted
	if r.Properties.MessageID != "big" || om == nil || om.Bytes != len(body) || !strings.Contains(om.Reason, "max message size") {
		t.Fatalf("record %s: payload omitted %+v", r.Properties.MessageID, om)
	}
	if e := r.Envelope; e.Source != quarantine.SourceBroker || e.Class != triage.ClassRejected || e.OriginalQueue != b.queue.Name {
		t.Fatalf("record envelope %+v", e)
	}
	if n := b.queueDepth(b.wq.Quarantine); n != 0 {
		t.Fatalf("intake holds %d", n)
	}
}
