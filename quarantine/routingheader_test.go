package quarantine

import (
	"context"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/internal/brokertest"
	"github.com/dlxbridge/dlxbridge/wire"
)

// A CC or BCC header that is not an array makes the broker refuse the
// publish and close the channel (406 "unacceptable_type_in_header", seen
// on 3.10.8 and 4.3.6). An AMQP 0-9-1 producer cannot get one into a
// queue, but on RabbitMQ 4.x an AMQP 1.0 producer can: an application
// property CC holding a string is delivered to the bridge as a longstr
// header CC (seen on 4.3.6). The record keeps a producer's headers as
// received, so the quarantine publish of such a message closed the
// worker's publishing channel, failing every copy in flight on it (their
// originals requeued, their handlers run again) and requeueing this one to
// do it again on its next delivery. The record must go through, and say
// what it could not carry.
func TestRecordOfAMessageWithANonArrayCCIsPublished(t *testing.T) {
	t.Parallel()
	env := brokertest.Require(t)
	ch := env.Channel("record")
	q := env.Name("records")
	if _, err := ch.QueueDeclare(q, false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	f, signer := recordFailure(t)
	f.Delivery.Headers[wire.HeaderCC] = "payments"
	f.Delivery.Headers[wire.HeaderBCC] = int64(3)
	p, _, err := Publishing(f)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", q, true, false, p)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case e := <-closed:
		t.Fatalf("the broker closed the channel on the record: %v", e)
	case <-dc.Done():
		if !dc.Acked() {
			t.Fatal("the record was nacked")
		}
	case <-ctx.Done():
		t.Fatal("no confirm within 20s")
	}
	in := &amqp.Delivery{Exchange: f.Exchange, MessageId: p.MessageId, Body: p.Body, Headers: p.Headers}
	rec, _ := ReadVerified(in, signer)
	if !rec.Verified {
		t.Fatalf("the record does not verify: %+v", rec)
	}
	notes := strings.Join(rec.Notes, "\n")
	for _, want := range []string{`CC`, `"payments"`, `BCC`} {
		if !strings.Contains(notes, want) {
			t.Errorf("the notes do not say %s was dropped: %q", want, rec.Notes)
		}
	}
}

// A CC or BCC array, which the broker takes, stays in the record as received.
func TestRecordKeepsAnArrayCC(t *testing.T) {
	t.Parallel()
	f, _ := recordFailure(t)
	f.Delivery.Headers[wire.HeaderCC] = []any{"payments", int32(1)}
	p, _, err := Publishing(f)
	if err != nil {
		t.Fatal(err)
	}
	if cc, ok := p.Headers[wire.HeaderCC].([]any); !ok || len(cc) != 2 {
		t.Errorf("CC %#v, want the array as received", p.Headers[wire.HeaderCC])
	}
}
