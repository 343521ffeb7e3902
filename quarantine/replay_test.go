package quarantine

import (
	"context"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/config"
	"github.com/dlxbridge/dlxbridge/schemas"
	"github.com/dlxbridge/dlxbridge/triage"
	"github.com/dlxbridge/dlxbridge/wire"
)

// 100 records across 3 fingerprints: stats groups them exactly; two readers
// at once, each on its own connection, and a third read after them, see the
// same records in the same order; reading changes nothing on the broker.
func TestStatsGroupExactlyAndConcurrentReadersAgree(t *testing.T) {
	t.Parallel()
	b := setupStore(t, nil)
	b.quarantineJobs(50, "fp-a", validJob)
	b.quarantineJobs(30, "fp-b", validJob)
	b.quarantineJobs(20, "fp-c", validJob)
	b.keep(100)

	var wg sync.WaitGroup
	snaps := make([]*Snapshot, 2)
	for i := range snaps {
		wg.Add(1)
		go func() { defer wg.Done(); snaps[i] = b.snapshot(b.inspector()) }()
	}
	wg.Wait()
	third := b.snapshot(b.inspector())
	for _, s := range append(snaps, third) {
		if len(s.Records) != 100 {
			t.Fatalf("read %d records, want 100", len(s.Records))
		}
		for i, r := range s.Records {
			if r.ID != third.Records[i].ID || r.Offset != third.Records[i].Offset {
				t.Fatalf("readers disagree at %d: %s@%d vs %s@%d", i, r.ID, r.Offset, third.Records[i].ID, third.Records[i].Offset)
			}
		}
	}
	groups := third.Stats(Filter{})
	got := map[string]int{}
	for _, g := range groups {
		if g.Queue != b.q.Name || g.Class != "permanent" || g.Owner.Team != "payments" || g.Replayed+g.Purged+g.Expired != 0 {
			t.Errorf("group %+v", g)
		}
		got[g.Fingerprint] = g.Open
	}
	if len(groups) != 3 || got["fp-a"] != 50 || got["fp-b"] != 30 || got["fp-c"] != 20 || groups[0].Fingerprint != "fp-a" {
		t.Fatalf("groups %+v", groups)
	}
	if n := len(third.List(Filter{Fingerprint: "fp-b"})); n != 30 {
		t.Fatalf("list fp-b: %d", n)
	}
	// The keeper acks an intake message once its record is confirmed in
	// the stream, so the readers can see a record a moment before its ack
	// lands; the broker gives no event for it.
	deadline := time.Now().Add(10 * time.Second)
	n := b.depth(b.q.Quarantine.Queue)
	for n != 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
		n = b.depth(b.q.Quarantine.Queue)
	}
	if n != 0 {
		t.Fatalf("intake holds %d after 10s", n)
	}
}

// Replaying one fingerprint at 50/s moves exactly those, paced (100 at 50/s
// is 99 intervals: 1.98 s), with their retry state reset and a redrive
// count, and leaves the rest open. The lower bound is strict; the upper one
// is loose (+50%), because the machine running the suite is shared and a
// confirm can stall.
func TestReplayOneFingerprintAtRate(t *testing.T) {
	t.Parallel()
	b := setupStore(t, nil)
	b.quarantineJobs(100, "fp-a", validJob)
	b.quarantineJobs(10, "fp-b", validJob)
	b.keep(110)
	rp := b.replayer()

	if _, err := rp.Replay(context.Background(), ReplayOptions{}); !errors.Is(err, ErrNoSelector) {
		t.Fatalf("replay without a selector: %v", err)
	}
	dry, err := rp.Replay(context.Background(), ReplayOptions{Filter: Filter{Fingerprint: "fp-a"}, DryRun: true, Max: 7})
	if err != nil || len(dry.Plan) != 7 || len(dry.Sent) != 0 || dry.Selected != 100 {
		t.Fatalf("dry run: %+v %v", dry, err)
	}
	if n := b.depth(b.q.Name); n != 0 {
		t.Fatalf("dry run sent %d", n)
	}

	res, err := rp.Replay(context.Background(), ReplayOptions{Filter: Filter{Fingerprint: "fp-a"}, Rate: 50, Reason: "fixed the bug"})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("replayed %d at 50/s in %s", len(res.Sent), time.Duration(res.Duration))
	if len(res.Sent) != 100 {
		t.Fatalf("sent %d, want 100", len(res.Sent))
	}
	// The rate is a ceiling: 100 at 50/s take 1.98s at least. The upper
	// bound only catches a pacer that waits far too long (a loaded CI
	// machine took 3.07s once): it is no performance target.
	if d := time.Duration(res.Duration); d < 1980*time.Millisecond || d > 15*time.Second {
		t.Fatalf("duration %s, want about 2s (1.98s at least)", time.Duration(res.Duration))
	}
	if n := b.depth(b.q.Name); n != 100 {
		t.Fatalf("work queue holds %d, want 100", n)
	}
	ch := b.env.Channel("check")
	d, ok, err := ch.Get(b.q.Name, false)
	if err != nil || !ok {
		t.Fatalf("get: %v %v", ok, err)
	}
	// basic.get on a 3.10 quorum queue shows x-delivery-count 0 on a first
	// delivery: anything else came from the replay.
	if n, has := d.Headers["x-delivery-count"]; has && n != int64(0) {
		t.Errorf("replayed message carries x-delivery-count %v", n)
	}
	for _, k := range []string{"x-death", "dlxbridge-attempts", wire.HeaderClass, wire.HeaderFingerprint, wire.HeaderEnvelope} {
		if _, has := d.Headers[k]; has {
			t.Errorf("replayed message still carries %s", k)
		}
	}
	if d.Headers[wire.HeaderRedriveCount] != int64(1) || d.Headers[wire.HeaderRedriveReason] != "fixed the bug" || d.Headers[wire.HeaderRedriveAt] == nil {
		t.Errorf("redrive headers %v", d.Headers)
	}
	if d.Type != "test.job" || d.MessageId == "" || d.Headers["schema-version"] != "1" {
		t.Errorf("replayed message lost its identity: %+v", d)
	}

	snap := b.snapshot(b.inspector())
	for _, g := range snap.Stats(Filter{}) {
		switch g.Fingerprint {
		case "fp-a":
			if g.Open != 0 || g.Replayed != 100 {
				t.Errorf("fp-a %+v", g)
			}
		case "fp-b":
			if g.Open != 10 || g.Replayed != 0 {
				t.Errorf("fp-b %+v", g)
			}
		}
	}
	var kinds []string
	for _, e := range snap.Events {
		if e.Kind != EventReplayed {
			kinds = append(kinds, e.Kind)
		}
	}
	if len(kinds) != 3 || kinds[0] != EventClaimed || kinds[1] != EventReplayStarted || kinds[2] != EventReplayFinished {
		t.Fatalf("audit events %v", kinds)
	}
}

// Two replays of the same selection at once send each message once: the
// second waits for the first's lock and then finds nothing open.
func TestConcurrentReplaysSendEachMessageOnce(t *testing.T) {
	t.Parallel()
	b := setupStore(t, nil)
	b.quarantineJobs(40, "fp-a", validJob)
	b.keep(40)
	var wg sync.WaitGroup
	results := make([]*ReplayResult, 2)
	errs := make([]error, 2)
	for i := range results {
		rp := b.replayer()
		rp.LockWait = 30 * time.Second
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = rp.Replay(context.Background(), ReplayOptions{Filter: Filter{Fingerprint: "fp-a"}, Rate: 200})
		}()
	}
	wg.Wait()
	var sent []string
	for i := range results {
		if errs[i] != nil {
			t.Fatalf("replay %d: %v", i, errs[i])
		}
		sent = append(sent, results[i].Sent...)
	}
	sort.Strings(sent)
	for i := 1; i < len(sent); i++ {
		if sent[i] == sent[i-1] {
			t.Fatalf("%s sent twice", sent[i])
		}
	}
	if len(sent) != 40 || b.depth(b.q.Name) != 40 {
		t.Fatalf("sent %d, work queue holds %d; want 40", len(sent), b.depth(b.q.Name))
	}
}

// A replay reads the events stream up to the claim it wrote under its
// lock, not up to an end found by waiting: a reader that gives up waiting
// at once (a loaded machine, past any wait) still sees what an earlier
// replay resolved, so nothing is sent twice, and an empty events stream is
// not waited on. A listing, which writes nothing, still waits.
func TestReplayReadsEventsUpToItsClaim(t *testing.T) {
	t.Parallel()
	b := setupStore(t, nil)
	b.quarantineJobs(3, "fp-a", validJob)
	b.keep(3)
	impatient := streamWaits{empty: time.Nanosecond, idle: time.Nanosecond}
	for round, want := range []int{3, 0} {
		rp := b.replayer()
		rp.eventWaits = impatient
		res, err := rp.Replay(context.Background(), ReplayOptions{Filter: Filter{Fingerprint: "fp-a"}})
		if err != nil {
			t.Fatalf("replay %d: %v", round+1, err)
		}
		if len(res.Sent) != want {
			t.Fatalf("replay %d sent %d, want %d (work queue holds %d)", round+1, len(res.Sent), want, b.depth(b.q.Name))
		}
	}
	if n := b.depth(b.q.Name); n != 3 {
		t.Fatalf("work queue holds %d, want 3", n)
	}
	snap := b.snapshot(b.inspector())
	claims := 0
	for _, e := range snap.Events {
		if e.Kind == EventClaimed {
			claims++
			if e.By != "tester@test" || e.Filter != "fingerprint=fp-a" || e.Run == "" {
				t.Errorf("claimed event %+v", e)
			}
		}
	}
	if claims != 2 || len(snap.List(Filter{})) != 0 {
		t.Fatalf("%d claimed events, %d open", claims, len(snap.List(Filter{})))
	}
}

// Invalid payloads refuse the replay (nothing sent) unless skipped; a patch
// that still fails the schema is refused and the original kept open; one
// that fixes it is sent; a message over its redrive budget is refused.
func TestReplayChecksSchemaPatchAndBudget(t *testing.T) {
	t.Parallel()
	b := setupStore(t, func(q *config.Queue) { one := 1; q.Quarantine.MaxRedrives = &one })
	b.quarantineJobs(3, "fp-bad", func(i int) string { return `{"id":"","n":"x"}` })
	b.quarantineJobs(1, "fp-ok", validJob)
	b.keep(4)
	rp := b.replayer()
	ctx := context.Background()

	res, err := rp.Replay(ctx, ReplayOptions{Filter: Filter{Queue: b.q.Name}})
	if !errors.Is(err, ErrInvalid) || len(res.Invalid) != 3 || len(res.Sent) != 0 || b.depth(b.q.Name) != 0 {
		t.Fatalf("invalid payloads: %+v %v", res, err)
	}
	// The refused run ends in the audit trail beside its claim.
	refused := 0
	for _, e := range b.snapshot(b.inspector()).Events {
		if e.Run == res.Run && e.Kind == EventReplayRefused {
			refused++
			if len(e.IDs) != 3 || e.Counts["invalid"] != 3 || e.Counts["sent"] != 0 {
				t.Errorf("refused event: %+v", e)
			}
		}
	}
	if refused != 1 {
		t.Errorf("%d replay-refused events for the refused run, want 1", refused)
	}
	stillBad := &Patch{Merge: []byte(`{"n":1}`)}
	res, err = rp.Replay(ctx, ReplayOptions{Filter: Filter{Fingerprint: "fp-bad"}, Patch: stillBad})
	if !errors.Is(err, ErrInvalid) || b.depth(b.q.Name) != 0 {
		t.Fatalf("patch that still fails: %+v %v", res, err)
	}
	if open := b.snapshot(b.inspector()).List(Filter{Fingerprint: "fp-bad"}); len(open) != 3 {
		t.Fatalf("originals not kept: %d open", len(open))
	}
	fix := &Patch{Merge: []byte(`{"id":"repaired","n":1}`)}
	res, err = rp.Replay(ctx, ReplayOptions{Filter: Filter{Fingerprint: "fp-bad"}, Patch: fix})
	if err != nil || len(res.Sent) != 3 {
		t.Fatalf("patched replay: %+v %v", res, err)
	}
	d, _, _ := b.env.Channel("check").Get(b.q.Name, true)
	if string(d.Body) != `{"id":"repaired","n":1}` {
		t.Fatalf("patched body %s", d.Body)
	}

	// Skip-invalid sends the valid one only (nothing invalid is open now,
	// so put a bad one back).
	b.quarantineJobs(1, "fp-bad2", func(int) string { return `{}` })
	b.keep(1)
	res, err = rp.Replay(ctx, ReplayOptions{Filter: Filter{Queue: b.q.Name}, SkipInvalid: true})
	if err != nil || len(res.Sent) != 1 || len(res.Invalid) != 1 {
		t.Fatalf("skip-invalid: %+v %v", res, err)
	}

	// A message that was replayed once comes back with redrive count 1; with
	// max_redrives 1 it is refused.
	h := envelopeHeaders(b.q.Name, "fp-again", "failed again", time.Now())
	h[wire.HeaderRedriveCount] = int64(1)
	b.publish(b.q.Quarantine.Queue, amqp.Publishing{MessageId: "again", Type: "test.job", Headers: h, Body: []byte(validJob(1))})
	b.keep(1)
	res, err = rp.Replay(ctx, ReplayOptions{Filter: Filter{Fingerprint: "fp-again"}})
	if err != nil || len(res.Sent) != 0 || len(res.OverBudget) != 1 || !strings.Contains(res.Plan[0].Refused, "is not verified: this replay has no signing key") {
		t.Fatalf("over budget (no key: the count is not verified): %+v %v", res, err)
	}
	t.Logf("refused: %s", res.Plan[0].Refused)
}

// Purge needs a selector and a reason, resolves without sending, and is
// in the audit trail; a record older than the retention is counted as
// expired, not open.
func TestPurgeAuditAndExpiry(t *testing.T) {
	t.Parallel()
	b := setupStore(t, func(q *config.Queue) { q.Quarantine.Retention = time.Hour })
	b.quarantineJobs(5, "fp-a", validJob)
	b.quarantineJobs(2, "fp-b", validJob)
	b.keep(7)
	rp := b.replayer()
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	rp.Metrics = m
	ctx := context.Background()
	if _, err := rp.Purge(ctx, PurgeOptions{Filter: Filter{Fingerprint: "fp-a"}}); !errors.Is(err, ErrNoReason) {
		t.Fatalf("purge without reason: %v", err)
	}
	if _, err := rp.Purge(ctx, PurgeOptions{Reason: "x"}); !errors.Is(err, ErrNoSelector) {
		t.Fatalf("purge without selector: %v", err)
	}
	res, err := rp.Purge(ctx, PurgeOptions{Filter: Filter{Fingerprint: "fp-a"}, Reason: "test data"})
	if err != nil || len(res.Purged) != 5 {
		t.Fatalf("purge: %+v %v", res, err)
	}
	if n := b.depth(b.q.Name); n != 0 {
		t.Fatalf("purge sent %d", n)
	}
	snap := b.snapshot(b.inspector())
	var purgedEvent *Event
	for i := range snap.Events {
		if snap.Events[i].Kind == EventPurged {
			purgedEvent = &snap.Events[i]
		}
	}
	if purgedEvent == nil || purgedEvent.By != "tester@test" || purgedEvent.Reason != "test data" || len(purgedEvent.IDs) != 5 || purgedEvent.Filter != "fingerprint=fp-a" {
		t.Fatalf("audit event %+v", purgedEvent)
	}

	later := &Inspector{Conn: b.env.Dial("later"), Config: b.cfg, Now: func() time.Time { return time.Now().Add(2 * time.Hour) }}
	s := b.snapshot(later)
	var expired, purged int
	for _, g := range s.Stats(Filter{}) {
		expired += g.Expired
		purged += g.Purged
	}
	if expired != 2 || purged != 5 || len(s.List(Filter{})) != 0 {
		t.Fatalf("after retention: %d expired, %d purged, %d open", expired, purged, len(s.List(Filter{})))
	}
	if got := testutil.ToFloat64(m.purges.WithLabelValues(b.q.Name, "permanent")); got != 5 {
		t.Fatalf("purges metric %v", got)
	}
	m.Observe(s)
	if got := testutil.ToFloat64(m.records.WithLabelValues(b.q.Name, "permanent", "expired")); got != 2 {
		t.Fatalf("expired metric %v", got)
	}
}

// An expired record is written as an expired event once (two writers
// name it twice; it is counted once), and it stays counted in stats and
// the metric after the broker's retention has removed it from the records
// stream (until its event expires in turn), without being listed.
func TestExpiriesStayCountedAfterTheRecordsAreGone(t *testing.T) {
	t.Parallel()
	b := setupStore(t, func(q *config.Queue) { q.Quarantine.Retention = time.Hour })
	b.quarantineJobs(3, "fp-a", validJob)
	b.quarantineJobs(1, "fp-b", validJob)
	b.keep(4)
	later := func() time.Time { return time.Now().Add(2 * time.Hour) }
	in := &Inspector{Conn: b.env.Dial("later"), Config: b.cfg, Now: later}
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	snap := b.snapshot(in)
	for i := range 2 { // two runtimes refreshing from the same snapshot
		rp := b.replayer()
		rp.Now, rp.Metrics = later, m
		if n, err := rp.RecordExpiries(context.Background(), snap); err != nil || n != 4 {
			t.Fatalf("writer %d named %d: %v", i+1, n, err)
		}
	}
	rp := b.replayer()
	rp.Now = later
	if n, err := rp.RecordExpiries(context.Background(), b.snapshot(in)); err != nil || n != 0 {
		t.Fatalf("named again %d: %v", n, err)
	}
	if got := testutil.ToFloat64(m.expires.WithLabelValues(b.q.Name, "permanent")); got != 8 {
		t.Fatalf("expiries metric %v (two writers of 4)", got)
	}

	// The broker's retention deletes whole segments; here, the whole stream.
	ch := b.env.Channel("retention")
	if _, err := ch.QueueDelete(b.q.Quarantine.RecordsStream(), false, false, false); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(b.q.Quarantine.RecordsStream(), true, false, false, false, amqp.Table{"x-queue-type": "stream"}); err != nil {
		t.Fatal(err)
	}
	gone := b.snapshot(in)
	if len(gone.Records) != 0 || len(gone.Gone) != 4 {
		t.Fatalf("%d records, %d gone; want 0 and 4", len(gone.Records), len(gone.Gone))
	}
	groups := map[string]Group{}
	for _, g := range gone.Stats(Filter{}) {
		groups[g.Fingerprint] = g
	}
	if groups["fp-a"].Expired != 3 || groups["fp-b"].Expired != 1 || groups["fp-a"].Owner.Team != "payments" || groups["fp-a"].Queue != b.q.Name {
		t.Fatalf("stats after the records are gone: %+v", groups)
	}
	m.Observe(gone)
	if got := testutil.ToFloat64(m.records.WithLabelValues(b.q.Name, "permanent", "expired")); got != 4 {
		t.Fatalf("expired gauge %v", got)
	}
	if len(gone.List(Filter{States: []State{StateExpired}})) != 0 {
		t.Fatal("a gone record is listed")
	}
}

// Stopping a replay (Ctrl-C cancels the context) ends it after the message
// in flight: what was sent is marked, the rest stay open, and the audit
// trail says it stopped.
func TestReplayStopsCleanlyWhenCancelled(t *testing.T) {
	t.Parallel()
	b := setupStore(t, nil)
	b.quarantineJobs(30, "fp-a", validJob)
	b.keep(30)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	res, err := b.replayer().Replay(ctx, ReplayOptions{Filter: Filter{Fingerprint: "fp-a"}, Rate: 20,
		Progress: func(p Progress) {
			if p.Done == 5 {
				cancel()
			}
		}})
	if err != nil || !res.Stopped || len(res.Sent) != 5 {
		t.Fatalf("stopped replay: sent %d, stopped %v, %v", len(res.Sent), res.Stopped, err)
	}
	snap := b.snapshot(b.inspector())
	if open := len(snap.List(Filter{Fingerprint: "fp-a"})); open != 25 || b.depth(b.q.Name) != 5 {
		t.Fatalf("%d open, %d sent to the work queue", open, b.depth(b.q.Name))
	}
	last := snap.Events[len(snap.Events)-1]
	if last.Kind != EventReplayFinished || last.Counts["stopped"] != 1 || last.Counts["sent"] != 5 {
		t.Fatalf("last event %+v", last)
	}
}

// A replay signs an origin only from an envelope whose signature verifies
// with its key, read from the record's headers: never one a header names
// (a message the broker dead-lettered on its own keeps the producer's
// headers, forged dlxbridge-original-* included), nor a broker dead
// letter's (x-death is no signature), nor the record's meta.
func TestReplaySignsOnlyAVerifiedEnvelopesOrigin(t *testing.T) {
	t.Parallel()
	signer, err := triage.NewSigner([]byte("the consumers' key, 32 bytes...."))
	if err != nil {
		t.Fatal(err)
	}
	body := []byte(`{}`)
	sub := triage.Subject{Queue: "orders", MessageID: "m-1", Body: body}

	// A broker dead letter: the envelope's origin travels, unsigned.
	r := &Record{
		Envelope:   Envelope{Source: SourceBroker, OriginalExchange: "orders", OriginalRouting: "order.created", OriginalQueue: "orders"},
		Properties: Properties{MessageID: "m-1"}, Body: body, Exchange: "orders.dead",
		headers: amqp.Table{wire.HeaderOriginalExchange: "forged", wire.HeaderOriginalRoutingKey: "forged.key", "keep": "me"},
	}
	h := (&Replayer{Signer: signer}).message(r, body, 0, "why", "orders", nil, "run1").Headers
	if h[wire.HeaderOriginalExchange] != "orders" || h[wire.HeaderOriginalRoutingKey] != "order.created" || h["keep"] != "me" {
		t.Fatalf("replayed headers %v", h)
	}
	if _, signed := h[wire.HeaderSignature]; signed {
		t.Fatalf("a broker dead letter's origin was signed: %v", h)
	}

	// The runtime's envelope, signed: its origin is signed.
	env := Envelope{Source: SourceBridge, Class: "permanent", Reason: "r", Fingerprint: "fp", Attempts: 2,
		OriginalExchange: "orders", OriginalRouting: "order.created", OriginalQueue: "orders"}
	eh := amqp.Table{"keep": "me"}
	env.Apply(eh)
	signEnvelope(signer, eh, "orders.dead", "m-1", body)
	r = &Record{Envelope: env, Properties: Properties{MessageID: "m-1"}, Body: body, Exchange: "orders.dead", headers: eh}
	h = (&Replayer{Signer: signer}).message(r, body, 0, "why", "orders", nil, "run1").Headers
	if v := signer.Verify(sub, h, triage.SignedHeaders()); !v.Valid || h[wire.HeaderOriginalExchange] != "orders" {
		t.Fatalf("verified envelope's origin: %s %v", v.Problem, h)
	}
	if _, kept := h[wire.HeaderEnvelopeSignature]; kept {
		t.Fatal("the replay carried the envelope signature")
	}

	// A record whose meta says verified but whose headers do not verify
	// (written into the stream by hand, or by another key): unsigned.
	forged := maps.Clone(eh)
	forged[wire.HeaderOriginalExchange] = "payments"
	r = &Record{Envelope: Envelope{Source: SourceBridge, Verified: true, OriginalExchange: "payments", OriginalRouting: "pay"},
		Properties: Properties{MessageID: "m-1"}, Body: body, Exchange: "orders.dead", headers: forged}
	h = (&Replayer{Signer: signer}).message(r, body, 0, "why", "orders", nil, "run1").Headers
	if _, signed := h[wire.HeaderSignature]; signed {
		t.Fatalf("an envelope that does not verify had its origin signed: %v", h)
	}
	// Signed with another key.
	other, _ := triage.NewSigner([]byte("another key, at least 16 bytes"))
	r = &Record{Envelope: env, Properties: Properties{MessageID: "m-1"}, Body: body, Exchange: "orders.dead", headers: eh}
	if _, signed := (&Replayer{Signer: other}).message(r, body, 0, "why", "orders", nil, "run1").Headers[wire.HeaderSignature]; signed {
		t.Fatal("another key signed the origin")
	}
}

// A replay whose schema check meets a costly-but-allowed pattern on a long
// value (seconds of CPU) stops when its context ends, promptly, sends
// nothing and leaves the record open, its run refused in the audit trail.
func TestReplayStopsInACostlySchemaCheck(t *testing.T) {
	t.Parallel()
	b := setupStore(t, nil)
	b.quarantineJobs(1, "fp-long", func(int) string { return `{"id":"` + strings.Repeat("a", 256<<10) + `","n":1}` })
	b.keep(1)
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "test.job"), 0o755); err != nil {
		t.Fatal(err)
	}
	costly := `{"type": "object", "properties": {"id": {"type": "string", "pattern": "[a-z]{0,900}x"}}}`
	if err := os.WriteFile(filepath.Join(dir, "test.job", "v1.json"), []byte(costly), 0o644); err != nil {
		t.Fatal(err)
	}
	reg, err := schemas.Load(schemas.LoadOptions{Dir: dir, NoEmbedded: true})
	if err != nil {
		t.Fatal(err)
	}
	rp := b.replayer()
	rp.Registry = reg
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	checking := time.AfterFunc(500*time.Millisecond, cancel)
	defer checking.Stop()
	begin := time.Now()
	res, err := rp.Replay(ctx, ReplayOptions{Filter: Filter{Fingerprint: "fp-long"}})
	if took := time.Since(begin); !errors.Is(err, schemas.ErrStopped) || res != nil || took > 10*time.Second {
		t.Fatalf("after %s: %+v, %v; want the check stopped", took, res, err)
	}
	if b.depth(b.q.Name) != 0 {
		t.Error("something was sent")
	}
	snap := b.snapshot(b.inspector())
	if open := snap.List(Filter{Fingerprint: "fp-long"}); len(open) != 1 {
		t.Errorf("%d open, want the record still open", len(open))
	}
	if last := snap.Events[len(snap.Events)-1]; last.Kind != EventReplayRefused {
		t.Errorf("the stopped run's last event: %+v", last)
	}
}
