package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/dlxbridge/dlxbridge/internal/amqpx"
	"github.com/dlxbridge/dlxbridge/internal/frame"
)

// returnThenHold returns the first publish (a retry, for want of its
// queue), calls before(), then hands each later publish's confirm to held.
type returnThenHold struct {
	mu     sync.Mutex
	n      int
	before func()
	held   chan func(error)
}

func (r *returnThenHold) Publish(_ context.Context, _, _ string, _ amqp.Publishing, confirmed func(error)) {
	r.mu.Lock()
	r.n++
	n := r.n
	r.mu.Unlock()
	if n == 1 {
		if r.before != nil {
			r.before()
		}
		confirmed(&amqpx.ReturnedError{ReplyCode: 312, ReplyText: "NO_ROUTE"})
		return
	}
	r.held <- confirmed
}

// The drain deadline passes while the quarantine copy of a returned retry
// awaits its confirm: the original is neither acked nor requeued (the
// channel close requeues it: whether the broker has the copy is unknown),
// it is recorded once, as abandoned, and the worker's settlements are not
// done until that copy's confirmation is in: its slot is still counted,
// so a stop cannot end before it and close the pipeline under it.
func TestADrainDeadlineWhileAReturnedRetrysQuarantineCopyWaitsAbandonsIt(t *testing.T) {
	t.Parallel()
	b := newSettleBundle(t, frame.DefaultFrameSize)
	out := &returnThenHold{held: make(chan func(error), 1)}
	b.w.out = out
	a := &fakeAcker{}
	b.w.settleFailure(context.Background(), noop.Span{}, a, delivery(), retryFailure())
	var confirmed func(error)
	select {
	case confirmed = <-out.held:
	case <-time.After(5 * time.Second):
		t.Fatal("no quarantine copy was published after the retry was returned")
	}
	settled := make(chan struct{})
	go func() { b.w.settling.Wait(); close(settled) }()
	select {
	case <-settled:
		t.Fatal("the settlements are done while the quarantine copy awaits its confirm")
	case <-time.After(50 * time.Millisecond): // a wrong Done would end the wait at once
	}
	b.stop() // the drain deadline
	confirmed(context.Canceled)
	select {
	case <-settled:
	case <-time.After(5 * time.Second):
		t.Fatal("the settlement did not end once the copy's confirm wait failed")
	}
	b.w.s.acks.flush(true)
	if a.log() != "" || strings.Join(b.outcomes(), ",") != string(OutcomeAbandoned) {
		t.Fatalf("acker calls %q, outcomes %v; want none, abandoned", a.log(), b.outcomes())
	}
}

// The broker's max message size is learned (another copy refused) between
// a retry's publish and its return: the quarantine copy that would replace
// it is over the limit and is not sent. The original is rejected without
// requeue, so the broker dead-letters it as received into the quarantine:
// not requeued for ever, not acked without a copy.
func TestAReturnedRetryWhoseQuarantineCopyIsOverTheLimitIsDeadLettered(t *testing.T) {
	t.Parallel()
	b := newSettleBundle(t, frame.DefaultFrameSize)
	out := &returnThenHold{held: make(chan func(error), 1)}
	out.before = func() { b.w.s.maxSize.learn(4) }
	b.w.out = out
	a := &fakeAcker{}
	b.settle(context.Background(), a, delivery(), retryFailure())
	select {
	case <-out.held:
		t.Fatal("a quarantine copy over the broker's limit was published")
	default:
	}
	if a.log() != "reject" || strings.Join(b.outcomes(), ",") != string(OutcomeDeadLettered) {
		t.Fatalf("acker calls %q, outcomes %v; want reject, dead_lettered", a.log(), b.outcomes())
	}
	var ol *overLimitError
	if s := b.settled[0]; !errors.As(s.SettleErr, &ol) || !strings.Contains(s.Reason, "retry tier queue") {
		t.Fatalf("settle error %v, reason %q", s.SettleErr, s.Reason)
	}
}

// A tier queue gone under a storm of failures: every retry for it is
// returned. Each message is quarantined and counted, and its own
// "quarantined" line has the reason, but the error line that says the
// tier is gone is sampled like the gate's report-mode lines (at most
// reportLogBurst per window and queue, with what it held back): one error
// line per message as well would double the log at the worst moment.
func TestRetriesReturnedForAMissingTierAreLoggedSampled(t *testing.T) {
	t.Parallel()
	const n = 3 * reportLogBurst
	b := newSettleBundle(t, frame.DefaultFrameSize)
	logs := &syncBuffer{}
	b.w.deps.log = slog.New(slog.NewJSONHandler(logs, nil))
	lane := b.w.s.wq.Tiers[1].Lanes[0]
	b.out.fail = func(p published) error {
		if p.key == lane.RoutingKey {
			return &amqpx.ReturnedError{ReplyCode: 312, ReplyText: "NO_ROUTE"}
		}
		return nil
	}
	for i := range n {
		d := delivery()
		d.MessageId, d.DeliveryTag = fmt.Sprintf("m-%d", i), uint64(i+1)
		b.settle(context.Background(), &fakeAcker{}, d, retryFailure())
	}
	if got := strings.Count(strings.Join(b.outcomes(), ","), string(OutcomeQuarantined)); got != n {
		t.Fatalf("%d of %d quarantined: %v", got, n, b.outcomes())
	}
	if got := testutil.ToFloat64(b.w.deps.metrics.retryQueueMissing.WithLabelValues(settleQueue, lane.Queue)); got != n {
		t.Fatalf("dlxbridge_retry_queue_missing_total = %v, want %d", got, n)
	}
	const msg = "retry tier queue is missing or unbound: the broker returned the retry; quarantining the message instead"
	if got := len(logs.records(t, msg)); got != reportLogBurst {
		t.Fatalf("%d error lines for %d returned retries, want %d (sampled)", got, n, reportLogBurst)
	}
	if got := len(logs.records(t, "quarantined")); got != n {
		t.Fatalf("%d quarantined lines, want %d", got, n)
	}
}
