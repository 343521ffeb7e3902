package quarantine

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
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
	msg, _, err := encodeRecord(d, b.env.Name("elsewhere"), time.Now())
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
