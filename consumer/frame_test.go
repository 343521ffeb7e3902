package consumer

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlxbridge/dlxbridge/internal/frame"
	"github.com/dlxbridge/dlxbridge/wire"

	"github.com/prometheus/client_golang/prometheus/testutil"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/config"
	"github.com/dlxbridge/dlxbridge/quarantine"
	"github.com/dlxbridge/dlxbridge/triage"
)

// One producer header of ~130 KB fits the producer's frame (frame_max
// 131072) but not the bridge's copy with its retry headers or envelope. For
// every kind of header the bridge keeps, a message carrying one must end in
// the quarantine (body as received, the drop noted) without the broker
// closing the publishing connection over an oversized frame, and the valid
// messages queued behind it must each reach their handler once, on their
// first delivery, as usual.
func TestOversizedHeaderOfEachKindNeverClosesThePublishingConnection(t *testing.T) {
	t.Parallel()
	b := setup(t, func(q *config.Queue) {
		q.Consumer.Concurrency = 1 // in order: the valid messages wait behind the big one
		q.Consumer.Prefetch = 10
	})
	lost := make(chan error, 16)
	b.cfg.hooks.reconnecting = func(err error) { lost <- err }

	const blob = 130_800
	kinds := []struct{ name, header string }{
		{"bridge header", wire.HeaderOriginalRoutingKey},
		{"unknown bridge header", "dlxbridge-blob"},
		{"traceparent", "traceparent"},
		{"tracestate", "tracestate"},
		{"version header", "schema-version"},
		{"custom header", "x-app-blob"},
	}
	type big struct {
		id, header string
		body       []byte
	}
	var bigs []big
	valid := map[string]bool{}
	for _, k := range kinds {
		for _, how := range []string{"permanent", "transient"} {
			id := "big-" + k.header + "-" + how
			h := amqp.Table{k.header: strings.Repeat("h", blob)}
			if k.header == "tracestate" {
				h["traceparent"] = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
			}
			body := []byte(fmt.Sprintf(`{"id": %q,  "note": %q}`, id, how)) // odd spacing: must come back as is
			b.publish(body, amqp.Publishing{MessageId: id, Headers: h})
			bigs = append(bigs, big{id, k.header, body})
			for i := range 5 {
				vid := fmt.Sprintf("ok-%s-%s-%d", k.header, how, i)
				b.publishJSON(map[string]any{"id": vid}, amqp.Publishing{MessageId: vid})
				valid[vid] = false
			}
		}
	}

	var mu sync.Mutex
	handled := map[string]int{}
	firstDelivery := map[string]bool{}
	b.start(func(c *Consumer) {
		must(t, c.Handle(b.queue.Name, testType, HandlerFunc(func(ctx context.Context, m *Message) error {
			mu.Lock()
			handled[m.MessageID]++
			n, _ := m.Headers["x-delivery-count"].(int64)
			firstDelivery[m.MessageID] = m.Attempt == 1 && n == 0
			mu.Unlock()
			if strings.HasPrefix(m.MessageID, "ok-") {
				return nil
			}
			if strings.HasSuffix(m.MessageID, "-permanent") {
				return triage.Permanent(errors.New("refused"))
			}
			return errors.New("downstream unavailable")
		})))
	})

	acked, quarantined := 0, 0
	deadline := time.After(60 * time.Second)
	for acked < len(valid) || quarantined < len(bigs) {
		select {
		case o := <-b.settled:
			switch o {
			case OutcomeAcked:
				acked++
			case OutcomeQuarantined:
				quarantined++
			case OutcomeRetried:
			default:
				t.Fatalf("unexpected outcome %q (acked %d, quarantined %d)", o, acked, quarantined)
			}
		case err := <-lost:
			t.Fatalf("the runtime lost a connection (acked %d, quarantined %d): %v", acked, quarantined, err)
		case <-deadline:
			t.Fatalf("after 60s: acked %d of %d valid, quarantined %d of %d big", acked, len(valid), quarantined, len(bigs))
		}
	}

	mu.Lock()
	for id := range valid {
		if handled[id] != 1 || !firstDelivery[id] {
			t.Errorf("valid message %s: handled %d times, on its first delivery: %v", id, handled[id], firstDelivery[id])
		}
	}
	mu.Unlock()
	if got := testutil.ToFloat64(b.consumer.metrics.reconnects); got != 0 {
		t.Fatalf("the runtime reconnected %v times", got)
	}

	byID := map[string]amqp.Delivery{}
	ch := b.env.Channel("inspect-quarantine")
	for len(byID) < len(bigs) {
		d, ok, err := ch.Get(b.wq.Quarantine, false)
		if err != nil || !ok {
			t.Fatalf("quarantine holds %d messages, want %d (err %v)", len(byID), len(bigs), err)
		}
		byID[d.MessageId] = d
	}
	for _, g := range bigs {
		d, ok := byID[g.id]
		if !ok {
			t.Errorf("%s: not in the quarantine", g.id)
			continue
		}
		if !bytes.Equal(d.Body, g.body) {
			t.Errorf("%s: body %q, want %q", g.id, d.Body, g.body)
		}
		env, _ := quarantine.Read(&d)
		if env.Source != quarantine.SourceBridge || env.Class == "" {
			t.Errorf("%s: envelope %+v", g.id, env)
		}
		if v, _ := d.Headers[g.header].(string); len(v) > 1024 {
			t.Errorf("%s: the %d-byte %s header was kept", g.id, len(v), g.header)
		}
		if notes := strings.Join(env.Notes, "; "); !strings.Contains(notes, g.header) {
			t.Errorf("%s: notes %q do not name %s", g.id, notes, g.header)
		}
		if g.header == wire.HeaderOriginalRoutingKey {
			// Unsigned, so the bridge ignores it (noted above) and writes
			// the real routing key over it: nothing is left to drop.
			if v, _ := d.Headers[g.header].(string); v != "job.test" {
				t.Errorf("%s: %s = %q, want the delivery's routing key", g.id, g.header, frame.Truncate(v, 40))
			}
			continue
		}
		var dropped []string
		_ = json.Unmarshal([]byte(fmt.Sprint(d.Headers[wire.HeaderDropped])), &dropped)
		if !strings.Contains(strings.Join(dropped, " "), g.header) {
			t.Errorf("%s: %s = %v does not name %s", g.id, wire.HeaderDropped, d.Headers[wire.HeaderDropped], g.header)
		}
	}
}

// With a frame too small for even the bare envelope, nothing is published:
// the original is rejected without requeue, and the broker dead-letters it
// as received into the quarantine, with x-death as its record.
func TestMessageThatCannotFitAnyFrameIsDeadLetteredNotSent(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.cfg.hooks.frameMax = 1024 // below AMQP's minimum: only a test can get here
	lost := make(chan error, 16)
	b.cfg.hooks.reconnecting = func(err error) { lost <- err }
	long := strings.Repeat("p", 255)
	body := []byte(`{"id": "tiny-frame"}`)
	b.publish(body, amqp.Publishing{MessageId: long, CorrelationId: long, ReplyTo: long, AppId: long, Headers: amqp.Table{
		wire.HeaderOriginalExchange: long, wire.HeaderOriginalRoutingKey: long, wire.HeaderOriginalQueue: long,
	}})
	var calls int
	var mu sync.Mutex
	b.start(func(c *Consumer) {
		must(t, c.Handle(b.queue.Name, testType, HandlerFunc(func(ctx context.Context, m *Message) error {
			mu.Lock()
			calls++
			mu.Unlock()
			return errors.New("downstream unavailable") // a retry, which cannot fit either
		})))
	})
	select {
	case o := <-b.settled:
		if o != OutcomeDeadLettered {
			t.Fatalf("outcome %q, want %q", o, OutcomeDeadLettered)
		}
	case err := <-lost:
		t.Fatalf("connection lost: %v", err)
	case <-time.After(15 * time.Second):
		t.Fatal("not settled within 15s")
	}
	d := b.quarantined()
	env, ok := quarantine.Read(&d)
	if !ok || env.Source != quarantine.SourceBroker || env.Class != triage.ClassRejected || !bytes.Equal(d.Body, body) || d.MessageId != long {
		t.Fatalf("envelope %+v ok %v body %q", env, ok, d.Body)
	}
	mu.Lock()
	defer mu.Unlock()
	if calls != 1 {
		t.Fatalf("handler ran %d times, want 1", calls)
	}
	if n := b.queueDepth(b.wq.Tiers[0].Lanes[0].Queue); n != 0 {
		t.Fatalf("a retry was published (%d in the lane)", n)
	}
}
