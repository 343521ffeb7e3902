package quarantine

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/config"
)

// A record written into this quarantine's records stream by someone else
// names an intake in its meta; the stream it is read from decides its
// intake, as it decides its queue. Otherwise a replay marks it in another
// quarantine's (or a missing) events stream: here the mark fails, the
// record stays open, and every later replay sends it again.
func TestAForgedRecordIntakeIsNotTrusted(t *testing.T) {
	t.Parallel()
	b := setupStore(t, nil)
	d := &amqp.Delivery{MessageId: "forged-intake", Type: "test.job", ContentType: "application/json",
		Headers: envelopeHeaders(b.q.Name, "fp-intake", "failed", time.Now()), Body: []byte(validJob(1))}
	msg, _, err := encodeRecord(d, b.env.Name("elsewhere"), time.Now(), nil)
	if err != nil {
		t.Fatal(err)
	}
	b.publish(b.q.Quarantine.RecordsStream(), msg)
	snap := b.snapshot(b.inspector())
	if len(snap.Records) != 1 || snap.Records[0].Intake != b.q.Quarantine.Queue {
		t.Errorf("record intake %q, want %q", snap.Records[0].Intake, b.q.Quarantine.Queue)
	}
	for round := range 2 {
		res, err := b.replayer().Replay(context.Background(), ReplayOptions{Filter: Filter{Fingerprint: "fp-intake"}})
		if err != nil {
			t.Errorf("replay %d: %v", round+1, err)
		}
		_ = res
	}
	if n := b.depth(b.q.Name); n != 1 {
		t.Fatalf("the work queue holds %d copies, want 1", n)
	}
}

// An expired event's entries are counted (Snapshot.Gone, the records
// gauge) under the queue they name: one forged event must not add groups
// and metric series for queues that are not this quarantine's.
func TestAForgedExpiredEventAddsNoForeignQueues(t *testing.T) {
	t.Parallel()
	b := setupStore(t, nil)
	var xs []ExpiredRecord
	for i := range 50 {
		xs = append(xs, ExpiredRecord{ID: fmt.Sprintf("forged%06d", i), Queue: fmt.Sprintf("label-%d", i), Class: fmt.Sprintf("c-%d", i)})
	}
	xs = append(xs, ExpiredRecord{ID: "mine00000001", Queue: b.q.Name, Class: "permanent"})
	body, _ := json.Marshal(Event{Kind: EventExpired, Run: "forged", Expired: xs})
	b.publish(b.q.Quarantine.EventsStream(), amqp.Publishing{Body: body})
	snap := b.snapshot(b.inspector())
	for _, g := range snap.Gone {
		if g.Queue != b.q.Name {
			t.Fatalf("a gone record of queue %q, not this quarantine's (%d gone)", g.Queue, len(snap.Gone))
		}
	}
	if len(snap.Gone) != 1 {
		t.Fatalf("%d gone, want the one of %s", len(snap.Gone), b.q.Name)
	}
}

// An expired event naming a record that is still in the stream and within
// the retention neither hides it nor makes it expired: an event is
// evidence only for a record that is gone.
func TestAnExpiredEventDoesNotExpireAPresentRecord(t *testing.T) {
	t.Parallel()
	b := setupStore(t, nil)
	b.quarantineJobs(2, "fp-a", validJob)
	b.keep(2)
	snap := b.snapshot(b.inspector())
	if len(snap.Records) != 2 {
		t.Fatalf("%d records, want 2", len(snap.Records))
	}
	target := snap.Records[0]
	body, _ := json.Marshal(Event{Kind: EventExpired, Run: "forged",
		Expired: []ExpiredRecord{{ID: target.ID, Queue: b.q.Name, Class: "permanent"}}})
	b.publish(b.q.Quarantine.EventsStream(), amqp.Publishing{Body: body})
	snap = b.snapshot(b.inspector())
	r, err := snap.Get(target.ID)
	if err != nil {
		t.Fatal(err)
	}
	if r.State != StateOpen {
		t.Fatalf("record named by an expired event is %s, want open", r.State)
	}
	res, err := b.replayer().Replay(context.Background(), ReplayOptions{Filter: Filter{IDs: []string{target.ID}}})
	if err != nil || len(res.Sent) != 1 {
		t.Fatalf("replay of the named record: %+v %v", res, err)
	}
}

// A replay killed after its claimed event and before publishing anything
// leaves every record open and the lock free: the next replay sends them.
func TestAReplayKilledAfterItsClaimLosesNothing(t *testing.T) {
	t.Parallel()
	b := setupStore(t, nil)
	b.quarantineJobs(3, "fp-a", validJob)
	b.keep(3)
	dead := b.replayer()
	sets := lockedSets((&Inspector{Config: b.cfg}).quarantines(), "")
	if _, err := dead.lock(context.Background(), sets); err != nil {
		t.Fatal(err)
	}
	if _, err := dead.claim(context.Background(), sets, Event{Run: "killed"}); err != nil {
		t.Fatal(err)
	}
	_ = dead.Conn.Close() // as SIGKILL: the connection goes, nothing is released by hand
	rp := b.replayer()
	rp.LockWait = 10 * time.Second
	res, err := rp.Replay(context.Background(), ReplayOptions{Filter: Filter{Fingerprint: "fp-a"}})
	if err != nil || len(res.Sent) != 3 {
		t.Fatalf("replay after a killed one: %+v %v", res, err)
	}
}

// Garbage published straight into the records and events streams (cut
// or oversized lengths, an unknown layout digit, events that are not
// JSON or not of this shape, a claimed event with no run) is counted as
// undecodable or skipped: listing and replay still see the real records,
// and replay sends each once.
func TestGarbageInTheStreamsIsSkipped(t *testing.T) {
	t.Parallel()
	b := setupStore(t, nil)
	b.quarantineJobs(2, "fp-a", validJob)
	b.keep(2)
	d := &amqp.Delivery{MessageId: "x", Headers: envelopeHeaders(b.q.Name, "fp-g", "failed", time.Now()), Body: []byte(validJob(9))}
	good, _, err := encodeRecord(d, b.q.Quarantine.Queue, time.Now(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var bodies [][]byte
	bodies = append(bodies,
		nil,
		[]byte(recordMagic2),
		append([]byte(recordMagic2), 0xff, 0xff, 0xff, 0xff, 1, 2, 3),
		append([]byte(recordMagic), 0, 0, 0, 3, '{', '"', 'x'),
		append([]byte("DLXREC4\n"), good.Body[len(recordMagic3):]...),
		append([]byte(recordMagic2), good.Body[len(recordMagic3):]...), // layout 3's meta read as layout 2's: one byte too many
		good.Body[:len(good.Body)-len(d.Body)-3],                       // cut inside the headers
	)
	// A record whose header table is not marshalTable's: it lists, with no
	// headers.
	meta, rest, _ := cutSized(good.Body[len(recordMagic3):])
	_, payload, _ := cutSized(rest)
	bad := append([]byte(recordMagic3), good.Body[len(recordMagic3):len(recordMagic3)+4+len(meta)]...)
	bad = append(bad, 0, 0, 0, 5, '[', '[', '[', '[', '[')
	bad = append(bad, payload...)
	bodies = append(bodies, bad)
	for _, body := range bodies {
		b.publish(b.q.Quarantine.RecordsStream(), amqp.Publishing{Body: body})
	}
	for _, ev := range []string{"not json", `[1,2]`, `{"kind":"replayed","ids":"abc"}`, `{"kind":"claimed"}`, `{"kind":"expired","expired":[{"id":""}]}`, `{}`} {
		b.publish(b.q.Quarantine.EventsStream(), amqp.Publishing{Body: []byte(ev)})
	}
	snap := b.snapshot(b.inspector())
	if len(snap.Records) != 3 || snap.Undecodable != len(bodies)-1 {
		t.Fatalf("%d records, %d undecodable; want 3 and %d", len(snap.Records), snap.Undecodable, len(bodies)-1)
	}
	if h := snap.Records[2].Headers(); len(h) != 0 || snap.Records[2].Envelope.Fingerprint != "fp-g" {
		t.Fatalf("the record with garbage headers: %v %+v", h, snap.Records[2].Envelope)
	}
	if groups := snap.Stats(Filter{}); len(groups) != 2 {
		t.Fatalf("stats %+v", groups)
	}
	for round, want := range []int{2, 0} {
		res, err := b.replayer().Replay(context.Background(), ReplayOptions{Filter: Filter{Fingerprint: "fp-a"}})
		if err != nil || len(res.Sent) != want {
			t.Fatalf("replay %d: %+v %v", round+1, res, err)
		}
	}
	if n := b.depth(b.q.Name); n != 2 {
		t.Fatalf("work queue holds %d, want 2", n)
	}
}

// A runtime names each expired record once, even when a later refresh
// stops reading the events stream before its own expired events (a loaded
// machine outlasting the wait for the end): otherwise every such refresh
// writes an expired event for every expired record again (100 events of
// 1000 for 100,000 records, every 30 s) and counts them again in
// dlxbridge_quarantine_expiries_total.
func TestARuntimeNamesEachExpiredRecordOnce(t *testing.T) {
	t.Parallel()
	b := setupStore(t, func(q *config.Queue) { q.Quarantine.Retention = time.Hour })
	b.quarantineJobs(4, "fp-a", validJob)
	b.keep(4)
	later := func() time.Time { return time.Now().Add(2 * time.Hour) }
	rp := b.replayer()
	rp.Now = later
	in := &Inspector{Conn: b.env.Dial("later"), Config: b.cfg, Now: later}
	if n, err := rp.RecordExpiries(context.Background(), b.snapshot(in)); err != nil || n != 4 {
		t.Fatalf("first refresh named %d: %v", n, err)
	}
	snap := b.snapshot(in)
	snap.Events, snap.expiredNamed = nil, nil // as read by a reader that stopped before any event
	if n, err := rp.RecordExpiries(context.Background(), snap); err != nil || n != 0 {
		t.Fatalf("a refresh that missed the events named %d again: %v", n, err)
	}
}
