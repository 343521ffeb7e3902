package consumer

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/config"
	"github.com/dlxbridge/dlxbridge/quarantine"
	"github.com/dlxbridge/dlxbridge/triage"
	"github.com/dlxbridge/dlxbridge/wire"
)

// The runtime keeps its quarantine: a message already in the intake when
// it starts, one it quarantines itself and one the broker dead-letters all
// end up as records in the records stream (confirm before ack), the intake
// empty, and the broker's x-death (which a stream would drop on 3.10)
// readable from the record.
func TestRuntimeKeepsQuarantineRecordsInTheStream(t *testing.T) {
	t.Parallel()
	b := setup(t, func(q *config.Queue) { q.DeliveryLimit = 1; q.Consumer.CrashLoopDeliveries = 1 })
	b.cfg.hooks.keeper = true
	// Waiting before the runtime starts.
	if err := b.pubCh.PublishWithContext(context.Background(), "", b.wq.Quarantine, true, false,
		amqp.Publishing{MessageId: "m-early", Body: []byte(`{"id":"early"}`)}); err != nil {
		t.Fatal(err)
	}
	<-b.confirms
	b.start(func(c *Consumer) {
		must(t, c.Handle(b.queue.Name, testType, HandlerFunc(func(ctx context.Context, m *Message) error {
			return triage.Permanent(errors.New("refused"))
		})))
	})
	b.publishJSON(map[string]any{"id": "j-1"}, amqp.Publishing{MessageId: "m-bridge"})
	b.waitOutcome(OutcomeQuarantined, 10*time.Second)
	// A message the broker dead-letters: published straight to the work
	// queue's dead-letter exchange with an x-death of its own making is not
	// the broker's; reject one from a raw consumer of a second queue instead.
	raw := b.env.Name("raw")
	ch := b.env.Channel("raw")
	if _, err := ch.QueueDeclare(raw, true, false, false, false, amqp.Table{"x-queue-type": "quorum", "x-dead-letter-exchange": b.wq.DeadExchange}); err != nil {
		t.Fatal(err)
	}
	if err := b.pubCh.PublishWithContext(context.Background(), "", raw, true, false, amqp.Publishing{MessageId: "m-broker", Body: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	<-b.confirms
	d, ok, err := ch.Get(raw, false)
	if err != nil || !ok {
		t.Fatalf("get raw: %v %v", ok, err)
	}
	_ = d.Reject(false)

	in := &quarantine.Inspector{Conn: b.env.Dial("inspector"), Config: b.file}
	var snap *quarantine.Snapshot
	deadline := time.Now().Add(20 * time.Second)
	for {
		snap, err = in.Snapshot(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if len(snap.Records) >= 3 || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond) // polling the broker: a stream has no event to wait on
	}
	byMsg := map[string]*quarantine.Record{}
	for _, r := range snap.Records {
		byMsg[r.Properties.MessageID] = r
	}
	if len(snap.Records) != 3 || byMsg["m-early"] == nil || byMsg["m-bridge"] == nil || byMsg["m-broker"] == nil {
		t.Fatalf("records %d: %v", len(snap.Records), byMsg)
	}
	if e := byMsg["m-bridge"].Envelope; e.Source != quarantine.SourceBridge || e.Class != triage.ClassPermanent {
		t.Fatalf("bridge record envelope %+v", e)
	}
	br := byMsg["m-broker"]
	if br.Envelope.Source != quarantine.SourceBroker || br.Headers()["x-death"] == nil || br.Envelope.OriginalQueue != raw {
		t.Fatalf("broker record: envelope %+v, x-death %v", br.Envelope, br.Headers()["x-death"])
	}
	if n := b.queueDepth(b.wq.Quarantine); n != 0 {
		t.Fatalf("intake holds %d", n)
	}
}

// A replayed message that fails again comes back to the quarantine with
// redrive count 1, a fresh failure envelope (the attempts start over), and
// its history intact: the first record, now marked replayed, is linked to
// the new one by message id and idempotency key.
func TestReplayedMessageThatFailsAgainComesBackWithItsHistory(t *testing.T) {
	t.Parallel()
	signer, err := triage.NewSigner([]byte(testSigningKey)) // the consumers' key: the origin it keeps is trusted
	must(t, err)
	first, again, snap := replayFailingAgain(t, signer, "customer 99 created")
	if again.Redrives != 1 || again.State != quarantine.StateOpen || again.Envelope.Attempts != 1 || again.Envelope.IdempotencyKey != "idem-1" {
		t.Fatalf("second record: redrives %d, state %s, envelope %+v", again.Redrives, again.State, again.Envelope)
	}
	if e := again.Envelope; e.OriginalExchange != first.Envelope.OriginalExchange || e.OriginalRouting != first.Envelope.OriginalRouting || e.OriginalExchange == "" {
		t.Fatalf("origin lost: first %s/%s, again %s/%s", first.Envelope.OriginalExchange, first.Envelope.OriginalRouting, e.OriginalExchange, e.OriginalRouting)
	}
	if again.Headers()[wire.HeaderRedriveReason] != "customer 99 created" {
		t.Fatalf("redrive reason %v", again.Headers()[wire.HeaderRedriveReason])
	}
	hist := snap.History(again)
	if len(hist) != 1 || hist[0].ID != first.ID || hist[0].State != quarantine.StateReplayed || hist[0].Resolution == nil {
		t.Fatalf("history %+v", hist)
	}
}

// A replay run without the consumers' signing key cannot vouch for the
// origin it carries: the runtime does not use it, but the new record keeps
// what the replay claimed, marked unverified, in a note that says so
// plainly (not as if someone forged it).
func TestUnsignedReplayKeepsTheClaimedOriginMarkedUnverified(t *testing.T) {
	t.Parallel()
	first, again, _ := replayFailingAgain(t, nil, "retry")
	e := again.Envelope
	if first.Envelope.OriginalExchange == "" || e.OriginalExchange == first.Envelope.OriginalExchange {
		t.Fatalf("first origin %q; an unsigned origin was trusted: %+v", first.Envelope.OriginalExchange, e)
	}
	want := fmt.Sprintf("origin not verified: a replay claimed exchange %q (%s), routing key %q (%s)",
		first.Envelope.OriginalExchange, wire.HeaderOriginalExchange, first.Envelope.OriginalRouting, wire.HeaderOriginalRoutingKey)
	var found bool
	for _, n := range e.Notes {
		found = found || strings.HasPrefix(n, want)
		if strings.Contains(n, wire.HeaderOriginalExchange) && strings.Contains(n, "ignored") {
			t.Errorf("note reads like a forgery: %q", n)
		}
	}
	if !found {
		t.Fatalf("notes %q, want one starting %q", e.Notes, want)
	}
}

// replayFailingAgain quarantines a message whose handler always refuses it,
// replays its record with signer (nil: no key) and returns the first
// record, the one the replayed copy made, and the snapshot holding both.
func replayFailingAgain(t *testing.T, signer *triage.Signer, reason string) (first, again *quarantine.Record, snap *quarantine.Snapshot) {
	t.Helper()
	b := setup(t, nil)
	b.cfg.hooks.keeper = true
	b.start(func(c *Consumer) {
		must(t, c.Handle(b.queue.Name, testType, HandlerFunc(func(ctx context.Context, m *Message) error {
			return triage.Permanent(errors.New("customer 99 unknown"))
		})))
	})
	b.publishJSON(map[string]any{"id": "j-1"}, amqp.Publishing{MessageId: "m-1", Headers: amqp.Table{wire.HeaderIdempotencyKey: "idem-1"}})
	b.waitOutcome(OutcomeQuarantined, 10*time.Second)
	in := &quarantine.Inspector{Conn: b.env.Dial("inspector"), Config: b.file}
	first = waitRecords(t, in, 1).Records[0]

	rp := &quarantine.Replayer{Conn: b.env.Dial("replayer"), Config: b.file, Registry: b.registry, Signer: signer}
	res, err := rp.Replay(context.Background(), quarantine.ReplayOptions{Filter: quarantine.Filter{IDs: []string{first.ID}}, Reason: reason})
	if err != nil || len(res.Sent) != 1 {
		t.Fatalf("replay: %+v %v", res, err)
	}
	b.waitOutcome(OutcomeQuarantined, 10*time.Second)
	snap = waitRecords(t, in, 2)
	for _, r := range snap.Records {
		if r.ID != first.ID {
			again = r
		}
	}
	return first, again, snap
}

func waitRecords(t *testing.T, in *quarantine.Inspector, n int) *quarantine.Snapshot {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		snap, err := in.Snapshot(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if len(snap.Records) >= n {
			return snap
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d records, want %d", len(snap.Records), n)
		}
		time.Sleep(100 * time.Millisecond) // polling the broker: a stream has no event to wait on
	}
}

// With QuarantineMetrics the runtime refreshes the quarantine's gauges
// itself: a record it quarantined shows as open, with an age.
func TestRuntimeRefreshesQuarantineMetrics(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.cfg.hooks.keeper = true
	qm, err := quarantine.NewMetrics(b.reg)
	if err != nil {
		t.Fatal(err)
	}
	b.cfg.QuarantineMetrics, b.cfg.QuarantineRefresh = qm, 200*time.Millisecond
	quarantineShowsOpenRecord(t, b)
}

// Registerer alone is enough: the runtime makes the quarantine metrics on
// it and refreshes them.
func TestRegistererAlsoGetsQuarantineMetrics(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.cfg.hooks.keeper = true
	b.cfg.QuarantineRefresh = 200 * time.Millisecond
	quarantineShowsOpenRecord(t, b)
}

// quarantineShowsOpenRecord quarantines a message and waits for it as an
// open record, with an age, in the quarantine metrics on b.reg.
func quarantineShowsOpenRecord(t *testing.T, b *testBundle) {
	t.Helper()
	b.start(func(c *Consumer) {
		must(t, c.Handle(b.queue.Name, testType, HandlerFunc(func(ctx context.Context, m *Message) error {
			return triage.Permanent(errors.New("refused"))
		})))
	})
	b.publishJSON(map[string]any{"id": "j-1"}, amqp.Publishing{MessageId: "m-1"})
	b.waitOutcome(OutcomeQuarantined, 10*time.Second)
	open := fmt.Sprintf("dlxbridge_quarantine_records{class=\"permanent\",queue=%q,state=\"open\"} 1\n", b.queue.Name)
	deadline := time.Now().Add(20 * time.Second)
	for {
		var text strings.Builder
		mfs, err := b.reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if strings.HasPrefix(mf.GetName(), "dlxbridge_quarantine_") {
				_, _ = expfmt.MetricFamilyToText(&text, mf)
			}
		}
		if strings.Contains(text.String(), open) && strings.Contains(text.String(), "dlxbridge_quarantine_oldest_open_age_seconds{queue=") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no open record in the quarantine metrics within 20s:\n%s", text.String())
		}
		time.Sleep(50 * time.Millisecond) // the refresh is on a timer: no event to wait on
	}
}

// The keeper's backoff doubles while runs fail without moving anything and
// starts again from the minimum after a run that moved records, rather than
// stay at the maximum for the rest of the session.
func TestKeeperBackoffResetsAfterARunThatMovedRecords(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	moved := []bool{false, false, true, false, false, false}
	runs := 0
	run := func(context.Context) (bool, error) {
		m := moved[runs]
		runs++
		if runs == len(moved) {
			cancel()
		}
		return m, errors.New("channel closed")
	}
	var waits []time.Duration
	wait := func(_ context.Context, d time.Duration, err error) bool {
		if err == nil {
			t.Error("wait without the run's error")
		}
		waits = append(waits, d)
		return true
	}
	superviseKeeper(ctx, run, time.Second, 8*time.Second, wait)
	want := []time.Duration{time.Second, 2 * time.Second, time.Second, 2 * time.Second, 4 * time.Second}
	if fmt.Sprint(waits) != fmt.Sprint(want) {
		t.Fatalf("waits %v, want %v", waits, want)
	}
}

// The runtime with a configured key marks, at its first quarantine
// refresh, where each events stream's signed events begin: from there on a
// reader with the key ignores an unsigned event (one anyone who may
// publish to amq.default could write), so a quarantine nobody has replayed
// from yet is covered too. Its own expired events would be signed with the
// same key.
func TestRuntimeWithAKeyStartsSigningEvents(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.cfg.hooks.keeper = true
	b.cfg.QuarantineRefresh = 200 * time.Millisecond
	b.start(func(c *Consumer) {
		must(t, c.Handle(b.queue.Name, testType, HandlerFunc(func(ctx context.Context, m *Message) error { return nil })))
	})
	signer, err := triage.NewSigner([]byte(testSigningKey))
	if err != nil {
		t.Fatal(err)
	}
	in := &quarantine.Inspector{Conn: b.env.Dial("inspector"), Config: b.file, Verifier: signer}
	deadline := time.Now().Add(20 * time.Second)
	for {
		snap, err := in.Snapshot(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		var started []quarantine.Event
		for _, e := range snap.Events {
			if e.Kind == quarantine.EventSigningStarted {
				started = append(started, e)
			}
		}
		if len(started) > 0 {
			if len(started) != 1 || !started[0].Verified {
				t.Fatalf("signing-started events: %+v", started)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no signing-started event within 20s (%d events)", len(snap.Events))
		}
		time.Sleep(100 * time.Millisecond) // the refresh is on a timer: no event to wait on
	}
}

// The runtime's refresh carries an open record forward once it is older
// than the retention minus the margin (7s minus 1s here): a signed
// carried-forward event names it and readers still list it once, now at
// the copy's offset.
func TestRuntimeCarriesAnOpenRecordForward(t *testing.T) {
	t.Parallel()
	b := setup(t, func(q *config.Queue) { q.Quarantine.Retention = 7 * time.Second })
	b.cfg.hooks.keeper = true
	b.cfg.QuarantineRefresh = 200 * time.Millisecond
	b.start(func(c *Consumer) {
		must(t, c.Handle(b.queue.Name, testType, HandlerFunc(func(ctx context.Context, m *Message) error {
			return triage.Permanent(errors.New("refused"))
		})))
	})
	b.publishJSON(map[string]any{"id": "j-1"}, amqp.Publishing{MessageId: "m-old"})
	b.waitOutcome(OutcomeQuarantined, 10*time.Second)
	signer, err := triage.NewSigner([]byte(testSigningKey))
	if err != nil {
		t.Fatal(err)
	}
	in := &quarantine.Inspector{Conn: b.env.Dial("inspector"), Config: b.file, Verifier: signer}
	var first *quarantine.Record
	deadline := time.Now().Add(30 * time.Second)
	for {
		snap, err := in.Snapshot(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if first == nil && len(snap.Records) == 1 {
			first = snap.Records[0]
		}
		var carried *quarantine.Event
		for i := range snap.Events {
			if snap.Events[i].Kind == quarantine.EventCarriedForward {
				carried = &snap.Events[i]
			}
		}
		if first != nil && carried != nil {
			r := snap.Records[0]
			if len(snap.Records) != 1 || r.ID != first.ID || r.Offset <= first.Offset || r.State != quarantine.StateOpen || !carried.Verified || carried.IDs[0] != r.ID {
				t.Fatalf("after carrying: %d records, %s@%d %s (first %s@%d), event %+v", len(snap.Records), r.ID, r.Offset, r.State, first.ID, first.Offset, carried)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no carried-forward event within 30s (%d records, %d events)", len(snap.Records), len(snap.Events))
		}
		time.Sleep(200 * time.Millisecond) // the refresh is on a timer: no event to wait on
	}
}
