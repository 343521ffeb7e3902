package consumer

import (
	"slices"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/internal/frame"
	"github.com/dlxbridge/dlxbridge/quarantine"
	"github.com/dlxbridge/dlxbridge/triage"
	"github.com/dlxbridge/dlxbridge/wire"
)

func envSigBundle(t *testing.T) (*settleBundle, *triage.Signer) {
	t.Helper()
	b := newSettleBundle(t, frame.DefaultFrameSize)
	signer, err := triage.NewSigner(b.key)
	if err != nil {
		t.Fatal(err)
	}
	return b, signer
}

// Nor through a retry: the producer's dlxbridge-dropped must not ride a
// retry copy (whose signature does not cover it) into a signed quarantine
// envelope on the copy's next delivery.
func TestRetryLaundersNoProducerDroppedIntoTheEnvelope(t *testing.T) {
	t.Parallel()
	b, signer := envSigBundle(t)
	d := delivery()
	d.Headers[wire.HeaderDropped] = `["header:x-producer-forged"]`
	retry, err := build(b.input(d, retryFailure()))
	if err != nil {
		t.Fatal(err)
	}
	next := &amqp.Delivery{Exchange: "orders.retry", RoutingKey: settleQueue, MessageId: retry.p.MessageId, Body: retry.p.Body, Headers: retry.p.Headers}
	sig, _ := b.w.q.verify(next)
	if !sig.Valid {
		t.Fatalf("retry copy not trusted: %s", sig.Problem)
	}
	f := quarantineFailure()
	f.attempts = triage.CountAttempts(triage.AttemptInput{Headers: next.Headers, Signature: sig})
	got, err := build(b.input(next, f))
	if err != nil {
		t.Fatal(err)
	}
	p := got.p
	env, _ := quarantine.ReadVerified(&amqp.Delivery{Exchange: got.exchange, MessageId: p.MessageId, Body: p.Body, Headers: p.Headers}, signer)
	if !env.Verified {
		t.Fatalf("not verified: %+v", env)
	}
	if slices.Contains(env.Dropped, "header:x-producer-forged") {
		t.Errorf("verified envelope lists the producer's dropped entries: %q", env.Dropped)
	}
}
