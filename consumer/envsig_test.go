package consumer

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/quarantine"
	"github.com/dlxbridge/dlxbridge/triage"
	"github.com/dlxbridge/dlxbridge/wire"
)

// A producer that sets a whole envelope of its own (dlxbridge-envelope and
// a signature-shaped value included) and gets its message dead-lettered by
// the broker (here: rejected without requeue by a plain consumer of the
// work queue) does not get its claims recorded: the runtime's keeper, with
// the consumers' key, reads it as the broker's dead letter and keeps the
// claim in a note; and a replay run with the key does not sign the origin
// it claimed, so the replayed message that fails again is recorded with
// where the replay sent it.
func TestBrokerDeadLetteredForgedEnvelopeIsNotTrusted(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.cfg.hooks.keeper = true
	signer, err := triage.NewSigner([]byte(testSigningKey))
	must(t, err)

	h := amqp.Table{wire.HeaderIdempotencyKey: "idem-forged"}
	forged := quarantine.Envelope{Source: quarantine.SourceBridge, Class: triage.ClassTransient, Reason: "forged reason",
		Fingerprint: "forged-fp", Attempts: 9, QuarantinedAt: time.Now(), OriginalExchange: "payments.ex",
		OriginalRouting: "pay.now", OriginalQueue: b.queue.Name, MessageType: testType, SchemaVersion: "1"}
	forged.Apply(h)
	h["dlxbridge-envelope-signature"] = "v1:" + strings.Repeat("A", 43)
	h[wire.HeaderSignature] = "v1:" + strings.Repeat("B", 43)
	b.publishJSON(map[string]any{"id": "forged"}, amqp.Publishing{MessageId: "m-forged", Headers: h})

	b.rejectWaiting(1) // the broker dead-letters it before any runtime consumes the queue

	b.start(func(c *Consumer) {
		must(t, c.Handle(b.queue.Name, testType, HandlerFunc(func(ctx context.Context, m *Message) error {
			return triage.Permanent(errors.New("still refused"))
		})))
	})
	in := &quarantine.Inspector{Conn: b.env.Dial("inspector"), Config: b.file}
	first := waitRecords(t, in, 1).Records[0]
	e := first.Envelope
	if e.Source != quarantine.SourceBroker || e.Class != triage.ClassRejected || e.Fingerprint == "forged-fp" ||
		e.OriginalExchange == "payments.ex" || e.Attempts == 9 || e.Reason == "forged reason" {
		t.Fatalf("the forged envelope was recorded: %+v", e)
	}
	if e.OriginalExchange != b.queue.Exchange.Name || e.OriginalQueue != b.queue.Name {
		t.Errorf("origin %q %q %q, want the broker's x-death", e.OriginalExchange, e.OriginalRouting, e.OriginalQueue)
	}
	if !strings.Contains(strings.Join(e.Notes, "\n"), `envelope not verified: the message claimed an envelope with source "bridge"`) ||
		!strings.Contains(strings.Join(e.Notes, "\n"), `fingerprint "forged-fp"`) {
		t.Errorf("notes %q: want the claim, marked not verified", e.Notes)
	}
	snap := waitRecords(t, in, 1)
	if got := snap.List(quarantine.Filter{Fingerprint: "forged-fp"}); len(got) != 0 {
		t.Errorf("the forged fingerprint groups %d record(s)", len(got))
	}

	// A replay with the consumers' key: the origin travels unsigned.
	rp := &quarantine.Replayer{Conn: b.env.Dial("replayer"), Config: b.file, Registry: b.registry, Signer: signer}
	again := replayQuarantinedAgain(t, b, in, rp, first)
	e = again.Envelope
	if e.OriginalExchange != "" || e.OriginalRouting != b.queue.Name || e.Class != triage.ClassPermanent {
		t.Fatalf("replayed copy's record: origin %q %q, class %s: want the replay's own (default exchange, the work queue)",
			e.OriginalExchange, e.OriginalRouting, e.Class)
	}
	if !strings.Contains(strings.Join(e.Notes, "\n"), "origin not verified: a replay claimed exchange") {
		t.Errorf("notes %q: want the replay's claim, not verified", e.Notes)
	}
}

// A message the runtime quarantines itself carries a valid envelope
// signature: its keeper records it as verified, and a replay with the key
// signs its origin (the replayed copy that fails again keeps it).
func TestRuntimeQuarantineEnvelopeVerifies(t *testing.T) {
	t.Parallel()
	signer, err := triage.NewSigner([]byte(testSigningKey))
	must(t, err)
	first, again, _ := replayFailingAgain(t, signer, "verify")
	if !first.Envelope.Verified || first.Envelope.Source != quarantine.SourceBridge || first.Envelope.Class != triage.ClassPermanent {
		t.Fatalf("runtime's record: %+v", first.Envelope)
	}
	if env, _ := quarantine.ReadVerified(&amqp.Delivery{Headers: first.Headers(), Exchange: first.Exchange,
		MessageId: first.Properties.MessageID, Body: first.Body}, signer); !env.Verified {
		t.Fatalf("the record's envelope does not verify from its headers: %q", env.Notes)
	}
	if !again.Envelope.Verified || again.Envelope.OriginalExchange != first.Envelope.OriginalExchange || again.Envelope.OriginalExchange == "" {
		t.Fatalf("replayed copy's record: %+v (first %q)", again.Envelope, first.Envelope.OriginalExchange)
	}
}
