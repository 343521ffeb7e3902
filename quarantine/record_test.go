package quarantine

import (
	"errors"
	"slices"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/triage"
	"github.com/dlxbridge/dlxbridge/wire"
)

// recordFailure is a first delivery the runtime quarantines.
func recordFailure(t *testing.T) (*Failure, *triage.Signer) {
	t.Helper()
	signer, err := triage.NewSigner([]byte("0123456789abcdef0123456789abcdef"))
	if err != nil {
		t.Fatal(err)
	}
	d := &amqp.Delivery{
		Exchange: "orders", RoutingKey: "order.created", MessageId: "m-1", ContentType: "application/json",
		Headers: amqp.Table{"x-app": "kept", wire.HeaderIdempotencyKey: "idem-1"},
		Body:    []byte(`{"id":  "1"}`),
	}
	at := time.Date(2026, 11, 30, 11, 0, 0, 0, time.UTC)
	return &Failure{
		Delivery: d, Exchange: "orders.dead",
		OriginalExchange: d.Exchange, OriginalRoutingKey: d.RoutingKey, OriginalQueue: "orders",
		Verdict: triage.Verdict{Action: triage.ActionQuarantine, Class: triage.ClassPermanent, Attempt: 1, Reason: "permanent failure"},
		Err:     errors.New("no such customer"), MessageType: "orders.created", SchemaVersion: "1",
		At: at, Notes: []string{"a note"}, Signer: signer, Verifier: signer,
	}, signer
}

// Every header the envelope signature covers is the runtime's word: the
// runtime writes it or removes it. A producer's own dlxbridge-dropped (or
// any other envelope header) on a message the runtime quarantines on its
// first delivery must not come out signed, as if the runtime had dropped
// those headers to fit a frame.
func TestQuarantineSignsNoProducerEnvelopeHeader(t *testing.T) {
	t.Parallel()
	f, signer := recordFailure(t)
	for _, k := range envelopeFields {
		f.Delivery.Headers[k] = `["producer:` + k + `"]`
	}
	p, _, err := Publishing(f)
	if err != nil {
		t.Fatal(err)
	}
	in := &amqp.Delivery{Exchange: f.Exchange, MessageId: p.MessageId, Body: p.Body, Headers: p.Headers}
	env, _ := ReadVerified(in, signer)
	if !env.Verified {
		t.Fatalf("the runtime's own envelope does not verify: %+v", env)
	}
	for _, k := range envelopeFields {
		if v, ok := p.Headers[k].(string); ok && v == `["producer:`+k+`"]` {
			t.Errorf("%s: the producer's value %q is signed as the runtime's", k, v)
		}
	}
	if slices.Contains(env.Dropped, "producer:"+wire.HeaderDropped) {
		t.Errorf("verified envelope lists the producer's dropped entries: %q", env.Dropped)
	}
}

// A runtime with a random key of its own verifies nothing (Verifier nil)
// and keeps an integer redrive count as claimed; its keeper, without a
// verifier too, then reads the record's prior replays as that count.
func TestPublishingWithARandomKeyKeepsACountTheKeeperReads(t *testing.T) {
	t.Parallel()
	f, _ := recordFailure(t)
	f.Verifier = nil
	f.Delivery.Headers[wire.HeaderRedriveCount] = int64(2)
	p, _, err := Publishing(f)
	if err != nil {
		t.Fatal(err)
	}
	if n := p.Headers[wire.HeaderRedriveCount]; n != int64(2) {
		t.Fatalf("the record's redrive count is %#v, want the claimed 2", n)
	}
	rec := &amqp.Delivery{Exchange: f.Exchange, MessageId: p.MessageId, Headers: p.Headers, Body: p.Body}
	if n, _ := trustedRedrives(rec, nil, false); n != 2 {
		t.Errorf("the keeper reads %d prior replays, want 2", n)
	}
}
