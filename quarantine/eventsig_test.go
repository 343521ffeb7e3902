package quarantine

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/config"
	"github.com/dlxbridge/dlxbridge/triage"
	"github.com/dlxbridge/dlxbridge/wire"
)

const eventKey = "the operators' and runtime's key."

// signedSetup is a quarantine of n records, with an Inspector and a
// Replayer that hold the key.
func signedSetup(t *testing.T, n int) (*storeBundle, *Inspector, *Replayer) {
	t.Helper()
	b := setupStore(t, nil)
	b.quarantineJobs(n, "fp-a", validJob)
	b.keep(n)
	signer := envSigner(t, eventKey)
	in := b.inspector()
	in.Verifier = signer
	rp := b.replayer()
	rp.Signer = signer
	return b, in, rp
}

// startSigning is what the runtime with the key does at its first metrics
// refresh.
func startSigning(t *testing.T, b *storeBundle, in *Inspector, rp *Replayer) *Snapshot {
	t.Helper()
	snap := b.snapshot(in)
	if n, err := rp.StartSigning(context.Background(), snap); err != nil || n != 1 {
		t.Fatalf("StartSigning wrote %d signing-started events (%v), want 1", n, err)
	}
	if n, err := rp.StartSigning(context.Background(), b.snapshot(in)); err != nil || n != 0 {
		t.Fatalf("a second StartSigning wrote %d (%v), want 0: the stream holds a signed event", n, err)
	}
	return snap
}

// forgedPurge publishes, through the default exchange as any user with
// write on amq.default may, a purged event naming id, under headers h.
func forgedPurge(b *storeBundle, id string, h amqp.Table) []byte {
	b.t.Helper()
	body, _ := json.Marshal(Event{Kind: EventPurged, At: time.Now().UTC(), By: "alice@ops-host", Reason: "cleanup",
		Run: "f0f0f0f0f0f0", Filter: "id=" + id, IDs: []string{id}, Counts: map[string]int{"selected": 1, "purged": 1}})
	b.publish(b.q.Quarantine.EventsStream(), amqp.Publishing{ContentType: "application/json", Headers: h, Body: body})
	return body
}

func eventOfRun(t *testing.T, snap *Snapshot, run string) Event {
	t.Helper()
	for _, e := range snap.Events {
		if e.Run == run {
			return e
		}
	}
	t.Fatalf("no event of run %s among %d", run, len(snap.Events))
	return Event{}
}

func stateOf(t *testing.T, snap *Snapshot, id string) State {
	t.Helper()
	r, err := snap.Get(id)
	if err != nil {
		t.Fatal(err)
	}
	return r.State
}

// A purged event that someone published through the default exchange
// (alice@ops-host, as a real one says) changes nothing for a reader with
// the key once the stream's events are signed: the record stays open, and
// replay still sends it. The audit lists the event, marked ignored. A
// reader without the key counts it, as before, and marks it unchecked.
func TestAForgedEventChangesNothingOnceEventsAreSigned(t *testing.T) {
	t.Parallel()
	b, in, rp := signedSetup(t, 2)
	target := startSigning(t, b, in, rp).Records[0].ID
	forgedPurge(b, target, nil)

	snap := b.snapshot(in)
	if st := stateOf(t, snap, target); st != StateOpen {
		t.Fatalf("a forged purged event made the record %s, want open", st)
	}
	forged := eventOfRun(t, snap, "f0f0f0f0f0f0")
	if forged.Verified || !forged.Ignored || !strings.Contains(forged.Unverified, "no "+wire.HeaderEventSignature) || !strings.Contains(forged.Unverified, "ignored") {
		t.Fatalf("forged event read as %+v", forged)
	}
	var marker *Event
	for i := range snap.Events {
		if snap.Events[i].Kind == EventSigningStarted {
			marker = &snap.Events[i]
		}
	}
	if marker == nil || !marker.Verified || marker.Unverified != "" {
		t.Fatalf("signing-started event: %+v", marker)
	}

	plain := b.snapshot(b.inspector())
	if st := stateOf(t, plain, target); st != StatePurged {
		t.Errorf("without the key the forged event should count as before; the record is %s", st)
	}
	for _, e := range plain.Events {
		if e.Verified || e.Ignored || e.Unverified != unverifiedNoKey {
			t.Errorf("read without the key: %+v", e)
		}
	}

	res, err := rp.Replay(context.Background(), ReplayOptions{Filter: Filter{IDs: []string{target}}})
	if err != nil || len(res.Sent) != 1 {
		t.Fatalf("replay of the record a forged event named: %+v %v", res, err)
	}
	if st := stateOf(t, b.snapshot(in), target); st != StateReplayed {
		t.Fatalf("after the signed replay the record is %s", st)
	}
}

// The operators' signed events resolve records: a purge and a replay with
// the key, read with the key, are verified and change the state.
func TestSignedEventsResolveRecords(t *testing.T) {
	t.Parallel()
	b, in, rp := signedSetup(t, 2)
	recs := b.snapshot(in).Records
	purged, err := rp.Purge(context.Background(), PurgeOptions{Filter: Filter{IDs: []string{recs[0].ID}}, Reason: "bad data"})
	if err != nil || len(purged.Purged) != 1 {
		t.Fatalf("purge: %+v %v", purged, err)
	}
	replayed, err := rp.Replay(context.Background(), ReplayOptions{Filter: Filter{IDs: []string{recs[1].ID}}})
	if err != nil || len(replayed.Sent) != 1 {
		t.Fatalf("replay: %+v %v", replayed, err)
	}
	snap := b.snapshot(in)
	for id, want := range map[string]State{recs[0].ID: StatePurged, recs[1].ID: StateReplayed} {
		r, err := snap.Get(id)
		if err != nil {
			t.Fatal(err)
		}
		if r.State != want || r.Resolution == nil || !r.Resolution.Verified {
			t.Errorf("record %s: %s, resolution %+v; want %s by a verified event", id, r.State, r.Resolution, want)
		}
	}
	for _, e := range snap.Events {
		if !e.Verified {
			t.Errorf("an event the keyed Replayer wrote does not verify: %+v", e)
		}
	}
}

// An event carrying, as its signature, one the key made in another domain
// over the very same stream name and body (the runtime signs an envelope
// over a body a producer chose) is no signed event: ignored, the record
// stays open.
func TestAnEnvelopeSignatureIsNoEventSignature(t *testing.T) {
	t.Parallel()
	b, in, rp := signedSetup(t, 1)
	target := startSigning(t, b, in, rp).Records[0].ID
	body, _ := json.Marshal(Event{Kind: EventPurged, At: time.Now().UTC(), By: "alice@ops-host", Reason: "cleanup",
		Run: "e0e0e0e0e0e0", IDs: []string{target}})
	stream := b.q.Quarantine.EventsStream()
	sub := triage.Subject{Queue: stream, Body: body}
	for _, sig := range []string{
		rp.Signer.SignEnvelope(sub, amqp.Table{}, nil),
		rp.Signer.SignEnvelope(envelopeSubject(config.DeadExchangeName(b.q.Name), "", body), amqp.Table{}, envelopeFields),
		rp.Signer.Sign(sub, amqp.Table{}, nil),
	} {
		b.publish(stream, amqp.Publishing{Headers: amqp.Table{wire.HeaderEventSignature: sig, wire.HeaderEnvelopeSignature: sig}, Body: body})
	}
	snap := b.snapshot(in)
	if st := stateOf(t, snap, target); st != StateOpen {
		t.Fatalf("an event under an envelope's signature made the record %s, want open", st)
	}
	n := 0
	for _, e := range snap.Events {
		if e.Run == "e0e0e0e0e0e0" {
			n++
			if e.Verified || !e.Ignored || !strings.Contains(e.Unverified, "does not match") {
				t.Errorf("event under another domain's signature: %+v", e)
			}
		}
	}
	if n != 3 {
		t.Fatalf("%d of the 3 events listed", n)
	}
}

// Events an older version wrote (unsigned) before the stream's first
// signed event still count for a reader with the key, marked unverified:
// an upgrade reopens nothing. After that event, an unsigned one (an older
// CLI still in use, or a forgery) is ignored.
func TestUnsignedEventsBeforeSigningStillCount(t *testing.T) {
	t.Parallel()
	b, in, rp := signedSetup(t, 2)
	recs := b.snapshot(in).Records
	old := b.replayer() // as before events were signed: no key
	if _, err := old.Purge(context.Background(), PurgeOptions{Filter: Filter{IDs: []string{recs[0].ID}}, Reason: "before the upgrade"}); err != nil {
		t.Fatal(err)
	}
	snap := b.snapshot(in)
	if st := stateOf(t, snap, recs[0].ID); st != StatePurged {
		t.Fatalf("an older version's purge reads as %s with the key, want purged", st)
	}
	if r, _ := snap.Get(recs[0].ID); r.Resolution.Verified || r.Resolution.Ignored || !strings.Contains(r.Resolution.Unverified, "counted") {
		t.Fatalf("an older version's event: %+v", r.Resolution)
	}
	startSigning(t, b, in, rp)
	if _, err := old.Purge(context.Background(), PurgeOptions{Filter: Filter{IDs: []string{recs[1].ID}}, Reason: "after the upgrade"}); err != nil {
		t.Fatal(err)
	}
	snap = b.snapshot(in)
	if st := stateOf(t, snap, recs[0].ID); st != StatePurged {
		t.Errorf("the purge from before signing began reads as %s now", st)
	}
	if st := stateOf(t, snap, recs[1].ID); st != StateOpen {
		t.Errorf("an unsigned purge after signing began made the record %s, want open", st)
	}
}
