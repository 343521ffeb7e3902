package consumer

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/config"
	"github.com/dlxbridge/dlxbridge/quarantine"
	"github.com/dlxbridge/dlxbridge/schemas"
	"github.com/dlxbridge/dlxbridge/topology"
	"github.com/dlxbridge/dlxbridge/triage"
	"github.com/dlxbridge/dlxbridge/wire"
)

// Issue 7, items 7 and 9: a producer-set header must not make a valid
// message skip its handler or lose its retry budget. Each forged message
// reaches its handler on every attempt, gets max_attempts attempts and a
// fresh time budget, as if the header were absent, and the note about the
// forgery, made on the first delivery, survives both retries into the
// quarantine envelope.
func TestForgedHeadersNeitherSkipTheHandlerNorSpendTheBudget(t *testing.T) {
	t.Parallel()
	b := setup(t, func(q *config.Queue) {
		elapsed := 10 * time.Minute // the time budget is on: a forged first failure must not spend it
		q.Retry.MaxElapsed = &elapsed
	}) // max_attempts 3, crash_loop_deliveries 2, delivery_limit 4
	lane := b.wq.Tiers[0].Lanes[0].Queue
	otherKey, err := triage.NewSigner([]byte("not the consumers' key, 32 bytes"))
	must(t, err)
	at := time.Now().Add(-time.Minute)

	type forgery struct {
		headers func(id string, body []byte) amqp.Table
		note    string
	}
	forgeries := map[string]forgery{
		"delivery-count-50": {
			headers: func(string, []byte) amqp.Table { return amqp.Table{"x-delivery-count": int64(50)} },
			note:    "x-delivery-count=50 ignored",
		},
		"x-death-work-queue-delivery-limit": {
			headers: func(string, []byte) amqp.Table {
				return amqp.Table{"x-death": []any{amqp.Table{"queue": b.queue.Name, "reason": "delivery_limit", "count": int64(3), "exchange": "", "routing-keys": []any{b.queue.Name}, "time": at}},
					"x-first-death-queue": b.queue.Name, "x-first-death-reason": "delivery_limit"}
			},
			note: "delivery_limit} (count 3) ignored",
		},
		"attempts-999999": {
			headers: func(string, []byte) amqp.Table { return amqp.Table{wire.HeaderAttempts: int64(999_999)} },
			note:    "dlxbridge-attempts=999999 ignored: no dlxbridge-signature",
		},
		"attempts-signed-with-another-key": {
			headers: func(id string, body []byte) amqp.Table {
				h := amqp.Table{wire.HeaderAttempts: int64(4)}
				h[wire.HeaderSignature] = otherKey.Sign(triage.Subject{Queue: b.queue.Name, MessageID: id, Body: body}, h, signedHeaders)
				return h
			},
			note: "dlxbridge-attempts=4 ignored: dlxbridge-signature does not match",
		},
		"x-death-lane-count-1e9": {
			headers: func(string, []byte) amqp.Table {
				return amqp.Table{"x-death": []any{amqp.Table{"queue": lane, "reason": "expired", "count": int64(1_000_000_000), "exchange": "", "routing-keys": []any{lane}, "time": at}}}
			},
			note: "expired} count 1000000000 not counted",
		},
		"first-failure-2001": {
			headers: func(string, []byte) amqp.Table {
				return amqp.Table{wire.HeaderFirstFailureAt: "2001-01-01T00:00:00Z"}
			},
			note: `dlxbridge-first-failure-at="2001-01-01T00:00:00Z" ignored`,
		},
	}

	var mu sync.Mutex
	calls := map[string][]int{} // message id → the attempts its handler saw
	b.start(func(c *Consumer) {
		must(t, c.Handle(b.queue.Name, testType, HandlerFunc(func(ctx context.Context, m *Message) error {
			mu.Lock()
			calls[m.MessageID] = append(calls[m.MessageID], m.Attempt)
			mu.Unlock()
			return fmt.Errorf("downstream unavailable")
		})))
	})
	start := time.Now()
	for id, f := range forgeries {
		body, _ := json.Marshal(map[string]any{"id": id})
		b.publish(body, amqp.Publishing{MessageId: id, Headers: f.headers(id, body)})
	}

	deadline := time.After(60 * time.Second)
	for quarantined := 0; quarantined < len(forgeries); {
		select {
		case o := <-b.settled:
			switch o {
			case OutcomeRetried:
			case OutcomeQuarantined:
				quarantined++
			default:
				t.Fatalf("unexpected outcome %q", o)
			}
		case <-deadline:
			t.Fatalf("only %d of %d forged messages reached the quarantine", quarantined, len(forgeries))
		}
	}
	records := b.drainQuarantine(len(forgeries))

	mu.Lock()
	defer mu.Unlock()
	for _, d := range records {
		f, ok := forgeries[d.MessageId]
		if !ok {
			t.Errorf("unexpected message %q in the quarantine", d.MessageId)
			continue
		}
		env, _ := quarantine.Read(&d)
		if got := calls[d.MessageId]; fmt.Sprint(got) != "[1 2 3]" {
			t.Errorf("%s: the handler saw attempts %v, want [1 2 3]", d.MessageId, got)
		}
		if env.Class != triage.ClassTransient || env.Attempts != 3 || !strings.Contains(env.Reason, "attempt budget exhausted (3/3)") {
			t.Errorf("%s: class %q attempts %d reason %q; want transient, 3, budget exhausted", d.MessageId, env.Class, env.Attempts, env.Reason)
		}
		if env.FirstFailureAt.Before(start.Add(-time.Second)) {
			t.Errorf("%s: first failure %v, before the test started", d.MessageId, env.FirstFailureAt)
		}
		if !strings.Contains(strings.Join(env.Notes, "\n"), f.note) {
			t.Errorf("%s: notes %q lack %q", d.MessageId, env.Notes, f.note)
		}
		if _, kept := d.Headers[wire.HeaderSignature]; kept {
			t.Errorf("%s: the quarantined copy carries a signature", d.MessageId)
		}
	}
}

// A retry's signed state can't be lifted onto another message: a producer
// that copies a real retry's headers (signature included) onto a new message
// gets the full budget for it.
func TestCopiedRetryHeadersDoNotCarryOver(t *testing.T) {
	t.Parallel()
	b := setup(t, nil) // max_attempts 3
	var mu sync.Mutex
	calls := map[string][]int{}
	var stolen amqp.Table
	b.start(func(c *Consumer) {
		must(t, c.Handle(b.queue.Name, testType, HandlerFunc(func(ctx context.Context, m *Message) error {
			mu.Lock()
			defer mu.Unlock()
			calls[m.MessageID] = append(calls[m.MessageID], m.Attempt)
			if m.MessageID == "victim" && m.Attempt == 2 {
				stolen = m.Headers // attempts 1, signed for "victim"
				return nil
			}
			return fmt.Errorf("down")
		})))
	})
	b.publishJSON(map[string]any{"id": "v"}, amqp.Publishing{MessageId: "victim"})
	b.waitOutcome(OutcomeRetried, 10*time.Second)
	b.waitOutcome(OutcomeAcked, 10*time.Second)

	mu.Lock()
	h := amqp.Table{}
	for k, v := range stolen {
		if !strings.HasPrefix(k, "x-") {
			h[k] = v
		}
	}
	mu.Unlock()
	if h[wire.HeaderSignature] == nil || h[wire.HeaderAttempts] != int64(1) {
		t.Fatalf("the retry carried no signed attempt count: %v", h)
	}
	h[wire.HeaderAttempts] = int64(2) // and raise it
	b.publishJSON(map[string]any{"id": "v"}, amqp.Publishing{MessageId: "thief", Headers: h})
	b.waitOutcome(OutcomeRetried, 10*time.Second)
	b.waitOutcome(OutcomeRetried, 10*time.Second)
	b.waitOutcome(OutcomeQuarantined, 10*time.Second)
	mu.Lock()
	defer mu.Unlock()
	if got := fmt.Sprint(calls["thief"]); got != "[1 2 3]" {
		t.Fatalf("the copied headers changed the budget: attempts %s, want [1 2 3]", got)
	}
}

// upstream declares a quorum queue whose dead-letter exchange is the work
// queue's exchange (routing key job.test), publishes one valid message to
// it, delivers it k times there (requeueing) and rejects it, so the broker
// dead-letters it into the work queue: a chain of services, each dead-lettering into the next.
func (b *testBundle) upstreamReject(id string, k int) {
	b.t.Helper()
	b.upstreamRejectWith(id, k, amqp.Table{})
}

// upstreamRejectWith is upstreamReject for a message with headers h.
func (b *testBundle) upstreamRejectWith(id string, k int, h amqp.Table) {
	b.t.Helper()
	h["schema-version"] = "1"
	up := b.env.Name("upstream-" + id)
	b.env.TrackQueue(up)
	ch := b.env.Channel("upstream")
	if _, err := ch.QueueDeclare(up, true, false, false, false, amqp.Table{
		"x-queue-type":              "quorum",
		"x-dead-letter-exchange":    b.queue.Exchange.Name,
		"x-dead-letter-routing-key": "job.test",
	}); err != nil {
		b.t.Fatal(err)
	}
	must(b.t, ch.Confirm(false))
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, 1))
	body, _ := json.Marshal(map[string]any{"id": id})
	must(b.t, ch.PublishWithContext(context.Background(), "", up, true, false, amqp.Publishing{
		ContentType: "application/json", Type: testType, MessageId: id, Body: body, Headers: h,
	}))
	if c := <-confirms; !c.Ack {
		b.t.Fatal("upstream publish nacked")
	}
	for i := 1; i <= k; i++ {
		var d amqp.Delivery
		deadline := time.Now().Add(10 * time.Second)
		for {
			var ok bool
			var err error
			d, ok, err = ch.Get(up, false)
			must(b.t, err)
			if ok {
				break
			}
			if time.Now().After(deadline) {
				b.t.Fatalf("upstream delivery %d never came", i)
			}
			time.Sleep(20 * time.Millisecond) // polling the broker; no event to wait on
		}
		if i < k {
			must(b.t, d.Reject(true))
		} else {
			must(b.t, d.Reject(false))
		}
	}
}

// Issue 13: on RabbitMQ 4.x a message the broker dead-letters into the work
// queue arrives with redelivered=true and x-delivery-count 1. Its first
// delivery there must reach the handler once and be acked, with
// delivery_limit 2 (crash_loop_deliveries 1) and with the defaults.
func TestUpstreamDeadLetterIsHandledOnce(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		limit     int
		wantGuard int
		upstreamK int
	}{
		{"delivery_limit 2", 2, 1, 1},
		{"delivery_limit 2, upstream delivered 3 times", 2, 1, 3},
		{"defaults", 0, 4, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, func(q *config.Queue) {
				q.DeliveryLimit = tc.limit
				q.Consumer.CrashLoopDeliveries = 0 // its default
			})
			if b.queue.Consumer.CrashLoopDeliveries != tc.wantGuard {
				t.Fatalf("crash_loop_deliveries = %d, want %d", b.queue.Consumer.CrashLoopDeliveries, tc.wantGuard)
			}
			rec := newRecorder()
			b.start(func(c *Consumer) {
				must(t, c.Handle(b.queue.Name, testType, HandlerFunc(func(ctx context.Context, m *Message) error {
					rec.record(m)
					return nil
				})))
			})
			b.upstreamReject("m-up", tc.upstreamK)

			var outcomes []Outcome
			for done := false; !done; {
				select {
				case o := <-b.settled:
					outcomes = append(outcomes, o)
					switch o {
					case OutcomeAcked:
						done = true
					case OutcomeReadmitted:
					default:
						t.Fatalf("outcome %q (so far %v), want the handler to run and ack", o, outcomes)
					}
				case <-time.After(15 * time.Second):
					t.Fatalf("not handled within 15s (outcomes %v)", outcomes)
				}
			}
			t.Logf("broker %s: outcomes %v", b.env.ServerVersion, outcomes)
			if n := rec.count(); n != 1 {
				t.Fatalf("handler ran %d times, want 1", n)
			}
			c := <-rec.ch
			if c.attempt != 1 {
				t.Errorf("attempt %d, want 1", c.attempt)
			}
			if _, ok := c.msg.Headers["x-death"]; !ok {
				t.Errorf("the handler lost the upstream x-death: %v", c.msg.Headers)
			}
			if d := b.queueDepth(b.wq.Quarantine); d != 0 {
				t.Errorf("quarantine holds %d", d)
			}
			if d := b.queueDepth(b.queue.Name); d != 0 {
				t.Errorf("work queue holds %d", d)
			}
		})
	}
}

// The broker's backstop, as the bridge relies on it (docs/topology.md): with
// delivery_limit 2 the work queue delivers a message 3 times before the
// broker dead-letters it to the quarantine. On 3.10 and 4.0 that holds
// whatever count an upstream dead letter arrived with. RabbitMQ 4.3 carries
// an upstream quorum queue's count into the work queue and its limit takes
// that count as spent (seen on 4.3.6: rejected after one upstream delivery,
// the message arrives with x-delivery-count 1 and gets 2 deliveries). The
// bridge re-admits such a message before its handler runs, so its copy
// starts at zero (TestUpstreamDeadLetterIsHandledOnce); this test reads the
// raw broker, without the bridge.
func TestDeliveryLimitCountsOnlyThisQueue(t *testing.T) {
	t.Parallel()
	b := setup(t, func(q *config.Queue) { q.DeliveryLimit = 2; q.Consumer.CrashLoopDeliveries = 1 })
	v, err := topology.ParseBrokerVersion(b.env.ServerVersion)
	must(t, err)
	b.upstreamReject("m-limit", 1)
	ch := b.env.Channel("raw-consumer")
	deliveries := 0
	var carried int64
	deadline := time.Now().Add(15 * time.Second)
	for b.queueDepth(b.wq.Quarantine) == 0 {
		d, ok, err := ch.Get(b.queue.Name, false)
		must(t, err)
		if ok {
			if deliveries == 0 && d.Redelivered {
				carried, _ = d.Headers["x-delivery-count"].(int64)
			}
			deliveries++
			must(t, d.Reject(true))
			continue
		}
		if time.Now().After(deadline) {
			t.Fatalf("not dead-lettered after %d deliveries", deliveries)
		}
		time.Sleep(20 * time.Millisecond) // polling the broker; no event to wait on
	}
	want := 3
	if v.AtLeast(4, 3) {
		if carried != 1 {
			t.Fatalf("the first delivery in the work queue carried x-delivery-count %d, want 1 from upstream", carried)
		}
		want -= int(carried)
	}
	if deliveries != want {
		t.Fatalf("broker %s: the work queue delivered it %d times before the broker gave up, want %d (limit 2, %d carried)", v, deliveries, want, carried)
	}
}

// drainQuarantine takes (and acks) n messages from the quarantine.
func (b *testBundle) drainQuarantine(n int) []amqp.Delivery {
	b.t.Helper()
	ch := b.env.Channel("drain")
	var out []amqp.Delivery
	deadline := time.Now().Add(10 * time.Second)
	for len(out) < n {
		d, ok, err := ch.Get(b.wq.Quarantine, false)
		must(b.t, err)
		if ok {
			must(b.t, d.Ack(false))
			out = append(out, d)
			continue
		}
		if time.Now().After(deadline) {
			b.t.Fatalf("quarantine held %d messages, want %d", len(out), n)
		}
		time.Sleep(20 * time.Millisecond) // polling the broker; no event to wait on
	}
	return out
}

// crashChildEnv makes the test binary run crashChild instead of the tests:
// its value is the path of the child's config (JSON of config.Config).
const crashChildEnv = "DLXBRIDGE_TEST_CRASH_CHILD"

// crashChild is a consumer process whose handler announces itself on
// stdout ("handler <id> <attempt>") and then hangs until the parent test
// SIGKILLs the process: a handler that crashes its worker. Each settled
// outcome is announced too ("settled <outcome>"); after a quarantine the
// child stops cleanly.
func crashChild() int {
	fail := func(err error) int { fmt.Fprintln(os.Stderr, "crash child:", err); return 2 }
	raw, err := os.ReadFile(os.Getenv(crashChildEnv))
	if err != nil {
		return fail(err)
	}
	var file config.Config
	if err := json.Unmarshal(raw, &file); err != nil {
		return fail(err)
	}
	registry, err := schemas.Load(schemas.LoadOptions{Dir: file.Schemas.Dir})
	if err != nil {
		return fail(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out sync.Mutex
	say := func(format string, args ...any) {
		out.Lock()
		defer out.Unlock()
		fmt.Fprintf(os.Stdout, format+"\n", args...)
	}
	c, err := New(&Config{
		URL: os.Getenv("RABBITMQ_URL"), File: &file, Registry: registry,
		ConnectionName: os.Getenv("DLXBRIDGE_TEST_CRASH_NAME"),
		SigningKey:     []byte(testSigningKey),
		Logger:         slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		DrainTimeout:   2 * time.Second,
		// The parent reads the quarantine queue itself.
		KeepQuarantineIntake: true,
		OnSettled: func(s Settled) {
			say("settled %s", s.Outcome)
			if s.Outcome == OutcomeQuarantined {
				cancel()
			}
		},
	})
	if err != nil {
		return fail(err)
	}
	hang := make(chan struct{})
	if err := c.Handle(file.Queues[0].Name, testType, HandlerFunc(func(ctx context.Context, m *Message) error {
		say("handler %s %d", m.MessageID, m.Attempt)
		<-hang // until SIGKILL
		return nil
	})); err != nil {
		return fail(err)
	}
	if err := c.Run(ctx); err != nil {
		return fail(err)
	}
	return 0
}

// Issue 13: a real crash loop is still caught at the configured count. A
// consumer process is SIGKILLed while its handler runs, again and again;
// the guard quarantines the message as crash-loop after the handler ran
// crash_loop_deliveries times, both for a producer's message and for one an
// upstream queue dead-lettered into the work queue (which 4.x re-admits
// first).
func TestCrashLoopOfAKilledConsumerIsCaughtAtTheConfiguredCount(t *testing.T) {
	if testing.Short() {
		t.Skip("starts and SIGKILLs consumer processes: skipped in -short")
	}
	t.Parallel()
	b := setup(t, func(q *config.Queue) {
		q.DeliveryLimit = 3
		q.Consumer.CrashLoopDeliveries = 2
		q.Consumer.HandlerTimeout = time.Minute // the kill comes first
		// One worker: a re-admitted copy is handled only after the original
		// was acked, so the kill (at the copy's handler) can't leave the
		// original unacked and have it re-admitted twice (a duplicate that
		// at-least-once allows, but that this count can't tell apart).
		q.Consumer.Concurrency = 1
	})
	cfgPath := childConfig(t, b)

	// run starts one consumer process and reads what it says until its
	// handler runs (then SIGKILLs it) or it quarantines the message (then it
	// stops by itself). It returns the lines.
	run := func() []string {
		c := startChild(t, crashChildEnv+"="+cfgPath, "RABBITMQ_URL="+b.env.URL,
			"DLXBRIDGE_TEST_CRASH_NAME="+b.env.Prefix+"/crash-child")
		var said []string
		timeout := time.After(60 * time.Second)
		for {
			select {
			case l, ok := <-c.lines:
				if !ok {
					if err := c.stop(0); err != nil {
						t.Fatalf("consumer process ended: %v (it said %q)", err, said)
					}
					return said
				}
				said = append(said, l)
				if strings.HasPrefix(l, "handler ") {
					_ = c.stop(syscall.SIGKILL)
					return said
				}
			case <-timeout:
				_ = c.stop(syscall.SIGKILL)
				t.Fatalf("consumer process said %q and then nothing for 60s", said)
			}
		}
	}

	scenarios := []struct {
		id      string
		publish func(id string)
	}{
		{"from-a-producer", func(id string) { b.publishJSON(map[string]any{"id": id}, amqp.Publishing{MessageId: id}) }},
		{"from-upstream", func(id string) { b.upstreamReject(id, 1) }},
	}
	for _, sc := range scenarios {
		sc.publish(sc.id)
		handlerRuns := 0
		var transcript []string
		for runs := 0; ; runs++ {
			if runs > b.queue.Consumer.CrashLoopDeliveries+2 {
				t.Fatalf("%s: still not quarantined after %d consumer processes: %q", sc.id, runs, transcript)
			}
			said := run()
			transcript = append(transcript, said...)
			last := said[len(said)-1]
			if strings.HasPrefix(last, "handler ") {
				handlerRuns++
				continue
			}
			if last != "settled "+string(OutcomeQuarantined) {
				t.Fatalf("%s: consumer process ended with %q", sc.id, said)
			}
			break
		}
		t.Logf("%s on %s: %q", sc.id, b.env.ServerVersion, transcript)
		if handlerRuns != b.queue.Consumer.CrashLoopDeliveries {
			t.Errorf("%s: the handler ran %d times, want crash_loop_deliveries = %d", sc.id, handlerRuns, b.queue.Consumer.CrashLoopDeliveries)
		}
		recs := b.drainQuarantine(1)
		env, _ := quarantine.Read(&recs[0])
		if recs[0].MessageId != sc.id || env.Class != triage.ClassCrashLoop || !strings.Contains(env.Reason, "delivered 3 times") {
			t.Errorf("%s: quarantined %q class %q reason %q; want crash-loop, delivered 3 times", sc.id, recs[0].MessageId, env.Class, env.Reason)
		}
		if d := b.queueDepth(b.queue.Name); d != 0 {
			t.Errorf("%s: work queue holds %d", sc.id, d)
		}
	}
}

// testWriter sends a child process's stderr to the test log.
type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Logf("consumer process: %s", strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// The note on an unverified origin quotes what was claimed, whatever its
// type or size, says whether a replay claimed it, and is absent when no
// origin header is there.
func TestUnverifiedOriginNote(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("x", 10*maxClaimBytes)
	cases := map[string]struct {
		h        amqp.Table
		want     []string
		notWant  []string
		maxBytes int
	}{
		"none":     {h: amqp.Table{wire.HeaderNotes: "[]"}},
		"producer": {h: amqp.Table{wire.HeaderOriginalExchange: "ex"}, want: []string{`origin not verified: the message claimed exchange "ex" (dlxbridge-original-exchange) (no dlxbridge-signature)`}, notWant: []string{"replay"}},
		"replay": {h: amqp.Table{wire.HeaderOriginalExchange: "ex", wire.HeaderOriginalRoutingKey: []byte("k"), wire.HeaderRedriveCount: int64(1)},
			want: []string{`a replay claimed exchange "ex" (dlxbridge-original-exchange), routing key "k" (dlxbridge-original-routing-key)`, "signing_key_env"}},
		"odd types": {h: amqp.Table{wire.HeaderOriginalExchange: int64(7), wire.HeaderOriginalRoutingKey: amqp.Table{"a": 1}, wire.HeaderOriginalQueue: long},
			want: []string{`exchange "(int64)"`, `routing key "(amqp091.Table)"`, "[truncated]"}, maxBytes: 3 * maxClaimBytes}, // one value cut to maxClaimBytes, the rest fixed text
	}
	for name, c := range cases {
		got := unverifiedOrigin(c.h, "no dlxbridge-signature")
		if len(c.want) == 0 && got != "" {
			t.Errorf("%s: %q, want none", name, got)
		}
		for _, w := range c.want {
			if !strings.Contains(got, w) {
				t.Errorf("%s: %q lacks %q", name, got, w)
			}
		}
		for _, w := range c.notWant {
			if strings.Contains(got, w) {
				t.Errorf("%s: %q has %q", name, got, w)
			}
		}
		if c.maxBytes > 0 && len(got) > c.maxBytes {
			t.Errorf("%s: %d bytes", name, len(got))
		}
	}
}

// A process with no configured key signs with a random one of its own, and
// its keeper verifies nothing with it (it cannot check another process's
// signature, and a failed check would drop a genuine envelope's class):
// envelopes are kept as unverified claims. With a key, the keeper verifies
// with it.
func TestKeeperVerifiesOnlyWithAConfiguredKey(t *testing.T) {
	t.Parallel()
	file := ungatedOrders(t, "security: {signing_key_env: DLXBRIDGE_TEST_NEVER_SET_KEY}\n")
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	keyless, err := New(&Config{URL: "amqp://127.0.0.1:1/", File: file, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if keyless.deps.signer == nil || keyless.deps.verifier != nil {
		t.Errorf("no key: signer %v, keeper's verifier %v; want a random signer and no verifier", keyless.deps.signer != nil, keyless.deps.verifier != nil)
	}
	keyed, err := New(&Config{URL: "amqp://127.0.0.1:1/", File: file, Logger: quiet, SigningKey: []byte("0123456789abcdef-keeper")})
	if err != nil {
		t.Fatal(err)
	}
	if keyed.deps.verifier == nil || keyed.deps.verifier != keyed.deps.signer {
		t.Error("a configured key: the keeper does not verify with it")
	}
}

// ungatedOrders is a config of one queue, orders, with the gate off, after
// head (top-level settings, or "").
func ungatedOrders(t testing.TB, head string) *config.Config {
	t.Helper()
	file, err := config.Parse([]byte(head + `queues:
  - name: orders
    exchange: {name: orders}
    bindings: [order.created]
    gate: off
`))
	if err != nil {
		t.Fatal(err)
	}
	return file
}
