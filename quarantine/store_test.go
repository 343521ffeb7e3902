package quarantine

import (
	"context"
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// The keeper drains what was already in the intake when it started into the
// records stream; each record keeps its headers exactly (arrays, tables and
// byte arrays a stream would drop or change), its properties and payload;
// reading the records twice gives the same records in the same order and
// changes nothing on the broker; a record written twice (a crash between
// the stream's confirm and the intake's ack) is listed once.
func TestKeeperStoresRecordsAsReceivedAndReadingChangesNothing(t *testing.T) {
	t.Parallel()
	b := setupStore(t, nil)
	intake := b.q.Quarantine.Queue
	headers := everyType()
	// A quorum queue nacks a publish with a NaN or infinite float header
	// (seen on 3.10.8, and the channel closes), so none reaches an intake.
	delete(headers, "nan")
	delete(headers, "inf")
	delete(headers, "f32nan")
	now := time.Now().UTC().Truncate(time.Second)
	for k, v := range envelopeHeaders(b.q.Name, "fp-a", "boom", now) {
		headers[k] = v
	}
	first := amqp.Publishing{
		Headers: headers, ContentType: "application/json", ContentEncoding: "identity", DeliveryMode: amqp.Persistent,
		Priority: 3, CorrelationId: "corr", ReplyTo: "reply", MessageId: "m-0", Timestamp: now, Type: "test.job",
		UserId: "guest", AppId: "app", Body: []byte(`{"n":0}`),
	}
	b.publish(intake, first)
	for i := 1; i < 5; i++ {
		b.publish(intake, amqp.Publishing{MessageId: fmt.Sprintf("m-%d", i), Type: "test.job",
			Headers: envelopeHeaders(b.q.Name, "fp-b", "bad", now), Body: []byte(fmt.Sprintf(`{"n":%d}`, i))})
	}
	b.keep(5)

	in := b.inspector()
	s1 := b.snapshot(in)
	s2 := b.snapshot(b.inspector()) // a second reader on its own connection
	if len(s1.Records) != 5 || len(s2.Records) != 5 {
		t.Fatalf("records %d and %d, want 5", len(s1.Records), len(s2.Records))
	}
	for i := range s1.Records {
		if s1.Records[i].ID != s2.Records[i].ID || s1.Records[i].Offset != s2.Records[i].Offset {
			t.Fatalf("record %d differs between reads: %s@%d vs %s@%d", i, s1.Records[i].ID, s1.Records[i].Offset, s2.Records[i].ID, s2.Records[i].Offset)
		}
	}
	r := s1.Records[0]
	if !sameValue(r.Headers(), headers) {
		t.Fatalf("headers changed on the way:\n got %#v\nwant %#v", r.Headers(), headers)
	}
	p := r.Properties
	if p.ContentType != "application/json" || p.ContentEncoding != "identity" || p.Priority != 3 || p.CorrelationID != "corr" ||
		p.ReplyTo != "reply" || p.MessageID != "m-0" || !p.Timestamp.Equal(now) || p.Type != "test.job" || p.UserID != "guest" || p.AppID != "app" {
		t.Fatalf("properties changed: %+v", p)
	}
	if string(r.Body) != `{"n":0}` || r.Queue != b.q.Name || r.Owner.Team != "payments" || r.State != StateOpen {
		t.Fatalf("record %+v", r)
	}
	if r.Envelope.Fingerprint != "fp-a" || r.Envelope.Error != "boom" {
		t.Fatalf("envelope %+v", r.Envelope)
	}
	if got, err := s1.Get(r.ID[:6]); err != nil || got != r {
		t.Fatalf("get by prefix: %v", err)
	}
	if q := b.depth(intake); q != 0 {
		t.Fatalf("intake holds %d after the keeper", q)
	}

	// A crash between confirm and ack writes a record again: same id.
	dup, id, err := encodeRecord(&amqp.Delivery{MessageId: "m-1", Type: "test.job", Headers: s1.Records[1].Headers(),
		Body: s1.Records[1].Body, Exchange: s1.Records[1].Exchange, RoutingKey: s1.Records[1].RoutingKey}, intake, time.Now())
	if err != nil || id != s1.Records[1].ID {
		t.Fatalf("re-encoded id %s, want %s (%v)", id, s1.Records[1].ID, err)
	}
	b.publish(b.q.Quarantine.RecordsStream(), dup)
	s3 := b.snapshot(in)
	if len(s3.Records) != 5 {
		t.Fatalf("after a duplicate write: %d records, want 5", len(s3.Records))
	}
}

// The keeper refuses nothing and acks nothing it could not store: with the
// records stream missing, the intake keeps the message.
func TestKeeperLeavesTheIntakeAloneWhenTheStreamIsMissing(t *testing.T) {
	t.Parallel()
	b := setupStore(t, nil)
	ch := b.env.Channel("saboteur")
	if _, err := ch.QueueDelete(b.q.Quarantine.RecordsStream(), false, false, false); err != nil {
		t.Fatal(err)
	}
	b.publish(b.q.Quarantine.Queue, amqp.Publishing{MessageId: "m", Body: []byte("x")})
	k := &Keeper{Consume: b.env.Dial("keeper"), Publish: b.env.Dial("keeper-pub"), Intake: b.q.Quarantine.Queue, Records: b.q.Quarantine.RecordsStream()}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := k.Run(ctx); err == nil {
		t.Fatal("keeper returned nil with no stream to write to")
	}
	if n := b.depth(b.q.Quarantine.Queue); n != 1 {
		t.Fatalf("intake holds %d, want the message back", n)
	}
}

func (b *storeBundle) depth(queue string) int {
	b.t.Helper()
	q, err := b.env.Channel("depth").QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		b.t.Fatal(err)
	}
	return q.Messages
}
