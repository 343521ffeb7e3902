package quarantine

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"regexp"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/triage"
)

// quarantineTransient puts n test.job messages into the intake as the
// runtime with signer's key would park them after an outage: class
// transient, their last failure at, the envelope signed.
func (b *storeBundle) quarantineTransient(n int, signer *triage.Signer, at time.Time) {
	b.t.Helper()
	for i := range n {
		id, body := fmt.Sprintf("outage-%d", i), []byte(validJob(i))
		h := amqp.Table{"schema-version": "1"}
		e := Envelope{Source: SourceBridge, Class: triage.ClassTransient, Reason: "dependency down", Error: "payments API: 503",
			Fingerprint: "fp-outage", Attempts: 1, FirstFailureAt: at, LastFailureAt: at, QuarantinedAt: at,
			OriginalQueue: b.q.Name, OriginalExchange: "ex", OriginalRouting: "k", MessageType: "test.job", SchemaVersion: "1"}
		e.Apply(h)
		signEnvelope(signer, h, "", id, body)
		b.publish(b.q.Quarantine.Queue, amqp.Publishing{MessageId: id, Type: "test.job", ContentType: "application/json",
			Headers: h, Body: body})
	}
}

// fillUntilRefused publishes to queue until the broker refuses one (a
// length limit with reject-publish): the queue is full.
func (b *storeBundle) fillUntilRefused(queue string) {
	b.t.Helper()
	for range 100 {
		if err := b.pub.PublishWithContext(context.Background(), "", queue, true, false, amqp.Publishing{Body: []byte(validJob(99))}); err != nil {
			b.t.Fatal(err)
		}
		if c := <-b.conf; !c.Ack {
			return
		}
	}
	b.t.Fatalf("%s took 100 messages without refusing one", queue)
}

// An automatic redrive whose sends fail (here the work queue is full
// after the outage: a length limit with reject-publish nacks the first
// replayed message) has not redriven its outage: the window stays pending
// for the next redrive, and the job does not read as done. Before, the
// replay-finished event said "not stopped", which covered the window for
// good: its records stayed open and no automatic redrive took them again.
func TestARedriveThatCannotSendLeavesItsWindowPending(t *testing.T) {
	t.Parallel()
	b := setupStore(t, nil)
	signer := envSigner(t, eventKey)
	at := time.Now().UTC()
	b.quarantineTransient(3, signer, at)
	b.keepVerifying(3, signer)
	rp := b.replayer()
	rp.Signer, rp.By = signer, AutoBy
	ctx := context.Background()
	w := OutageWindow{ID: "w-full", Queue: b.q.Name, From: at.Add(-time.Minute), Until: at.Add(time.Second)}
	for _, ended := range []bool{false, true} {
		if err := rp.Outage(ctx, w, ended); err != nil {
			t.Fatal(err)
		}
	}
	b.env.QuorumPolicy(b.env.Name("full"), "^"+regexp.QuoteMeta(b.q.Name)+"$", map[string]any{"max-length": 1})
	b.fillUntilRefused(b.q.Name)

	res, err := rp.Redrive(ctx, RedriveOptions{Queue: b.q.Name, Rate: 1000})
	if err == nil || res == nil || len(res.Sent) != 0 || res.Selected != 3 {
		t.Fatalf("redrive into a full queue: %+v, %v; want an error and nothing sent of 3", res, err)
	}
	in := b.inspector()
	in.Verifier = signer
	snap := b.snapshot(in)
	if open := snap.List(Filter{Queue: b.q.Name}); len(open) != 3 {
		t.Fatalf("%d records open, want 3", len(open))
	}
	if ended, _ := PendingWindows(snap.Events, b.q.Name); len(ended) != 1 {
		t.Errorf("the window reads as redriven (pending %v), yet its 3 records are open and were never sent", ended)
	}
	jobs, err := in.Jobs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	j, err := FindJob(jobs, res.Run)
	if err != nil {
		t.Fatal(err)
	}
	if j.State == JobDone || j.Stop == "" {
		t.Errorf("a job that sent 0 of 3 and failed reads as %s (stop %q)", j.State, j.Stop)
	}
}

// A replay-outcome event without a valid signature counts for nothing for
// a reader with the key, wherever it stands: only the runtime writes
// outcomes, always signed, so an unsigned one is a forgery even before a
// stream's first signed event (settleEvents counts such early events, for
// the kinds older versions wrote unsigned). Here the job's events are in
// one quarantine's stream and a producer published "handled" for its
// record into another quarantine's events stream, which had no signed
// event yet. Without the key it counts, marked unverified, as every
// event does.
func TestAnUnsignedOutcomeNeverCountsWithTheKey(t *testing.T) {
	t.Parallel()
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	signed := func(kind string, s int, mod func(*Event)) Event {
		e := Event{Kind: kind, Run: "j1", At: at(s), By: "op@host", Verified: true, Quarantine: "orders.quarantine"}
		if mod != nil {
			mod(&e)
		}
		return e
	}
	forged := Event{Kind: EventReplayOutcome, Run: "j1", At: at(3), By: "runtime@host", Outcome: JobHandled, IDs: []string{"r1"},
		Quarantine: "billing.quarantine", Unverified: "no dlxbridge-event-signature" + unverifiedEarly}
	events := []Event{
		signed(EventClaimed, 0, nil),
		signed(EventReplayStarted, 1, func(e *Event) { e.Counts = map[string]int{"selected": 1, "to_send": 1} }),
		signed(EventReplayed, 2, func(e *Event) { e.IDs, e.ToQueue = []string{"r1"}, "orders" }),
		forged,
		signed(EventReplayFinished, 4, func(e *Event) { e.Counts = map[string]int{"selected": 1, "sent": 1, "published": 1} }),
	}
	jobs := jobsOf(events)
	if len(jobs) != 1 || jobs[0].Handled != 0 || jobs[0].Pending != 1 {
		t.Fatalf("with the key, a forged outcome counted: %+v", jobs)
	}
	for i := range events {
		events[i].Verified, events[i].Unverified = false, unverifiedNoKey
	}
	if jobs := jobsOf(events); len(jobs) != 1 || jobs[0].Handled != 1 || !jobs[0].Unverified {
		t.Fatalf("without the key: %+v", jobs)
	}
}

// A flapping breaker (a flaky dependency: it closes, opens again a few
// seconds later, for hours) leaves a window per flap, and while its
// redrives keep stopping, the windows stay pending. Every event an
// automatic redrive writes must not carry them all: each attempt would
// write a copy of every pending window (into its claim's replay-started,
// replay-finished), so the events stream, which every listing, page and
// redrive reads whole into memory, would grow with the square of the
// flaps. The windows are still covered, all of them, once a redrive
// finishes.
func TestARedriveAfterManyFlapsWritesSmallEvents(t *testing.T) {
	t.Parallel()
	const flaps = 400
	b := setupStore(t, nil)
	signer := envSigner(t, eventKey)
	rp := b.replayer()
	rp.Signer, rp.By = signer, AutoBy
	ctx := context.Background()
	at := time.Now().UTC().Add(-time.Hour)
	for i := range flaps {
		w := OutageWindow{ID: fmt.Sprintf("flap%08d", i), Queue: b.q.Name, From: at.Add(time.Duration(i) * 5 * time.Second)}
		w.Until = w.From.Add(2 * time.Second)
		if err := rp.Outage(ctx, w, true); err != nil {
			t.Fatal(err)
		}
	}
	res, err := rp.Redrive(ctx, RedriveOptions{Queue: b.q.Name, Rate: 1000})
	if err != nil || res.Stopped {
		t.Fatalf("redrive: %+v %v", res, err)
	}
	in := b.inspector()
	in.Verifier = signer
	snap := b.snapshot(in)
	if ended, ongoing := PendingWindows(snap.Events, b.q.Name); len(ended)+len(ongoing) != 0 {
		t.Errorf("after a finished redrive %d windows are pending, want none", len(ended)+len(ongoing))
	}
	const most = 8 << 10
	for _, e := range snap.Events {
		if e.Run != res.Run {
			continue
		}
		raw, _ := json.Marshal(e)
		if len(raw) > most {
			t.Errorf("the redrive's %s event is %d bytes (%d windows), want at most %d", e.Kind, len(raw), len(e.Windows), most)
		}
	}
}

// A finished automatic redrive covers the windows whose end precedes its
// claim, up to that end, and nothing else: not a window another replica
// ended after the claim (the redrive never read it), not an extension
// written after it, and not for another queue's or an operator's run.
func TestAFinishedRedriveCoversWhatPrecedesItsClaim(t *testing.T) {
	t.Parallel()
	a, b := win("a", 10, 20), win("b", 30, 40)
	claim := func(run, by, queue string) Event {
		return Event{Kind: EventClaimed, Verified: true, Run: run, By: by, Filter: autoFilter(queue)}
	}
	done := func(run string) Event {
		return Event{Kind: EventReplayFinished, Verified: true, Run: run, By: AutoBy, Counts: map[string]int{"stopped": 0}}
	}
	cases := []struct {
		name    string
		events  []Event
		pending []string
	}{
		{"both ended before the claim", []Event{outageEvent(EventOutageEnded, a), outageEvent(EventOutageEnded, b), claim("r", AutoBy, "orders"), done("r")}, nil},
		{"one ended after the claim", []Event{outageEvent(EventOutageEnded, a), claim("r", AutoBy, "orders"), outageEvent(EventOutageEnded, b), done("r")}, []string{"b"}},
		{"extended after the claim", []Event{outageEvent(EventOutageEnded, a), claim("r", AutoBy, "orders"), outageEvent(EventOutageEnded, win("a", 10, 25)), done("r")}, []string{"a"}},
		{"another queue's redrive", []Event{outageEvent(EventOutageEnded, a), claim("r", AutoBy, "billing"), done("r")}, []string{"a"}},
		{"an operator's replay", []Event{outageEvent(EventOutageEnded, a), claim("r", "op@host", "orders"), done("r")}, []string{"a"}},
		{"stopped", []Event{outageEvent(EventOutageEnded, a), claim("r", AutoBy, "orders"),
			{Kind: EventReplayFinished, Verified: true, Run: "r", By: AutoBy, Counts: map[string]int{"stopped": 1}}}, []string{"a"}},
	}
	for _, c := range cases {
		ended, _ := PendingWindows(c.events, "orders")
		var got []string
		for _, w := range ended {
			got = append(got, w.ID)
		}
		if fmt.Sprint(got) != fmt.Sprint(c.pending) {
			t.Errorf("%s: pending %v, want %v", c.name, got, c.pending)
		}
	}
}

// Redrive refuses a rate below a replay's slowest (one message an hour)
// before it takes any lock: the ramp would wait past the end of time for
// its second message, holding the quarantine's replay lock.
func TestRedriveRefusesARateTooSmallToPace(t *testing.T) {
	t.Parallel()
	for _, rate := range []float64{1e-300, MinRate / 2, math.NaN(), 0} {
		if _, err := (&Replayer{}).Redrive(context.Background(), RedriveOptions{Queue: "orders", Rate: rate}); err == nil {
			t.Errorf("rate %g accepted", rate)
		}
	}
}

// An automatic redrive runs inside the runtime, beside the handlers. Its
// selection reads every record of the quarantine (open or resolved, every
// class, as long as retention keeps them) to find the few an outage
// parked: it must not hold all their payloads at once, only those of the
// records it sends. Here 60 large permanent records sit beside 3
// transient ones of the outage; the 3 go out byte for byte.
func TestARedriveHoldsOnlyThePayloadsItSends(t *testing.T) {
	t.Parallel()
	b := setupStore(t, nil)
	signer := envSigner(t, eventKey)
	at := time.Now().UTC()
	big := `{"id":"p","n":1,"pad":"` + strings.Repeat("x", 32<<10) + `"}`
	b.quarantineJobs(60, "fp-perm", func(int) string { return big })
	b.quarantineTransient(3, signer, at)
	b.keepVerifying(63, signer)
	rp := b.replayer()
	rp.Signer, rp.By = signer, AutoBy
	held := -1
	rp.selected = func(snap *Snapshot) {
		held = 0
		for _, r := range snap.Records {
			held += len(r.Body)
		}
	}
	ctx := context.Background()
	w := OutageWindow{ID: "w-big", Queue: b.q.Name, From: at.Add(-time.Minute), Until: at.Add(time.Second)}
	if err := rp.Outage(ctx, w, true); err != nil {
		t.Fatal(err)
	}
	res, err := rp.Redrive(ctx, RedriveOptions{Queue: b.q.Name, Rate: 1000})
	if err != nil || len(res.Sent) != 3 {
		t.Fatalf("redrive: %+v %v", res, err)
	}
	if held < 0 || held > 4<<10 {
		t.Errorf("the redrive's selection held %d bytes of payloads, want at most those of the 3 it sends", held)
	}
	got := map[string]string{}
	for _, d := range b.drain(b.q.Name, 3) {
		got[d.MessageId] = string(d.Body)
	}
	for i := range 3 {
		if id := fmt.Sprintf("outage-%d", i); got[id] != validJob(i) {
			t.Errorf("%s arrived as %q, want %q", id, got[id], validJob(i))
		}
	}
}
