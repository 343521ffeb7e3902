package quarantine

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/config"
)

// A record read without its body keeps nothing of the stream message:
// scribbling over the message afterwards changes none of its fields, and
// its headers still decode. (Before, the encoded headers were a slice of
// the message, so a record "without" its payload still held all of it.)
func TestRecordWithoutBodyHoldsNothingOfTheMessage(t *testing.T) {
	t.Parallel()
	d := fullDelivery()
	d.Body = bytes.Repeat([]byte("p"), 64<<10)
	msg, _, err := encodeRecord(d, "q.quarantine", time.Now(), nil)
	if err != nil {
		t.Fatal(err)
	}
	set := &quarantineSet{cfg: &config.Queue{Name: "q", Quarantine: config.Quarantine{Queue: "q.quarantine"}}}
	for name, body := range map[string][]byte{"layout 3": msg.Body, "layout 1": encodeLayout1(t, d, "q.quarantine", time.Now())} {
		want, err := recordFrom(bytes.Clone(body), 0, set)
		if err != nil {
			t.Fatal(err)
		}
		got, err := recordFrom(body, 0, set)
		if err != nil {
			t.Fatal(err)
		}
		got.dropBody()
		for i := range body {
			body[i] = 0xff
		}
		if got.Body != nil {
			t.Errorf("%s: Body kept (%d bytes)", name, len(got.Body))
		}
		if fmt.Sprint(got.Headers()) != fmt.Sprint(want.Headers()) || len(got.Headers()) == 0 { // NaN is in them: not DeepEqual
			t.Errorf("%s: headers after the message was overwritten:\n got %v\nwant %v", name, got.Headers(), want.Headers())
		}
		if !reflect.DeepEqual(got.Envelope, want.Envelope) || got.ID != want.ID || got.Properties != want.Properties {
			t.Errorf("%s: fields changed with the message:\n got %+v\nwant %+v", name, got, want)
		}
	}
}

// A snapshot without bodies lists the same records as one with them, and
// ReadBody brings back each one's payload exactly, from its offset; a
// record whose offset holds another record is not found.
func TestSnapshotWithoutBodiesReadsOneBodyOnDemand(t *testing.T) {
	t.Parallel()
	b := setupStore(t, nil)
	stream := b.q.Quarantine.RecordsStream()
	now := time.Now().UTC()
	for i := range 4 {
		body := fmt.Sprintf(`{"id":"j-%d","pad":"%s"}`, i, bytes.Repeat([]byte{'a' + byte(i)}, (i+1)*100<<10))
		d := &amqp.Delivery{MessageId: fmt.Sprintf("m-%d", i), Type: "test.job", ContentType: "application/json",
			Headers: envelopeHeaders(b.q.Name, "fp", "failed", now), Body: []byte(body)}
		msg, _, err := encodeRecord(d, b.q.Quarantine.Queue, now, nil)
		if err != nil {
			t.Fatal(err)
		}
		b.publish(stream, msg)
	}
	full := b.snapshot(b.inspector())
	in := b.inspector()
	in.OmitBodies = true
	lean := b.snapshot(in)
	if len(full.Records) != 4 || len(lean.Records) != 4 {
		t.Fatalf("records: %d with bodies, %d without, want 4", len(full.Records), len(lean.Records))
	}
	for i, r := range lean.Records {
		f := full.Records[i]
		if r.ID != f.ID || r.Offset != f.Offset || !reflect.DeepEqual(r.Envelope, f.Envelope) || !reflect.DeepEqual(r.Headers(), f.Headers()) {
			t.Errorf("record %d differs without its body:\n got %+v\nwant %+v", i, r, f)
		}
		if r.Body != nil {
			t.Errorf("record %s keeps %d body bytes", r.ID, len(r.Body))
		}
		body, err := in.ReadBody(context.Background(), r)
		if err != nil || !bytes.Equal(body, f.Body) || len(body) < 100<<10 {
			t.Errorf("ReadBody(%s): %d bytes, %v; want its %d bytes", r.ID, len(body), err, len(f.Body))
		}
	}
	other := &Record{ID: lean.Records[2].ID, Intake: lean.Records[1].Intake, Offset: lean.Records[1].Offset}
	if _, err := in.ReadBody(context.Background(), other); !errors.Is(err, ErrNoRecord) {
		t.Errorf("ReadBody of an offset that holds another record: %v, want ErrNoRecord", err)
	}
	elsewhere := &Record{ID: lean.Records[0].ID, Intake: "not-configured", Offset: lean.Records[0].Offset}
	if _, err := in.ReadBody(context.Background(), elsewhere); err == nil {
		t.Error("ReadBody of a quarantine not in the config: no error")
	}
}
