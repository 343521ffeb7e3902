package quarantine

import (
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/config"
)

func BenchmarkRecordDecode(b *testing.B) {
	now := time.Now()
	d := &amqp.Delivery{MessageId: "m-1", Type: "test.job", Headers: envelopeHeaders("q", "fp", "failed", now), Body: []byte(validJob(1))}
	msg, _, err := encodeRecord(d, "q.quarantine", now, nil)
	if err != nil {
		b.Fatal(err)
	}
	set := &quarantineSet{cfg: &config.Queue{Name: "q"}}
	b.ReportAllocs()
	for b.Loop() {
		r, err := recordFrom(msg.Body, 0, set)
		if err != nil || r == nil {
			b.Fatal(err)
		}
	}
}
