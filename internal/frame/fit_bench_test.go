package frame

import (
	"bytes"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
)

// BenchmarkFit is Fit on what a storm publishes: a retry or quarantine
// publishing that already fits (the common case, which must stay cheap),
// and one whose headers must give way.
func BenchmarkFit(b *testing.B) {
	rank := func(k string) Rank {
		if k == "big" {
			return ProducerHeader
		}
		return EssentialHeader
	}
	headers := func() amqp.Table {
		return amqp.Table{
			"dlxbridge-attempts": int64(1), "dlxbridge-original-exchange": "orders", "dlxbridge-original-routing-key": "order.created",
			"dlxbridge-original-queue": "orders", "dlxbridge-first-failure-at": "2026-11-30T12:00:00Z",
			"dlxbridge-signature": "v1:0123456789012345678901234567890123456789abc", "traceparent": "00-11111111111111111111111111111111-2222222222222222-01",
			"dlxbridge-last-error": "bench: transient failure", "x-app": "kept",
		}
	}
	body := bytes.Repeat([]byte("x"), 1024)
	b.Run("fits", func(b *testing.B) {
		b.ReportAllocs()
		p := amqp.Publishing{Headers: headers(), MessageId: "m-0000001", ContentType: "application/json", Type: "orders.created", DeliveryMode: amqp.Persistent, Body: body}
		for b.Loop() {
			if _, err := Fit(&p, DefaultFrameSize, rank); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("shrinks", func(b *testing.B) {
		b.ReportAllocs()
		big := string(bytes.Repeat([]byte("y"), 8<<10))
		for b.Loop() {
			h := headers()
			h["big"] = big
			p := amqp.Publishing{Headers: h, MessageId: "m-0000001", Body: body}
			if _, err := Fit(&p, 4096, rank); err != nil {
				b.Fatal(err)
			}
		}
	})
}
