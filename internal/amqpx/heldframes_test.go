package amqpx_test

import (
	"bytes"
	"context"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/internal/amqpx"
	"github.com/dlxbridge/dlxbridge/internal/brokertest"
)

// heldMessage is message i of TestDeliveriesHeldAcrossLaterFramesKeepTheirHeaders
// as published, and its headers as the bridge's connection must read them.
func heldMessage(i int) (amqp.Publishing, amqp.Table) {
	ts := time.Unix(int64(1_700_000_000+i), 0)
	h := amqp.Table{
		"seq":     strconv.Itoa(i),
		"bad-utf": "\xff\xfe" + strconv.Itoa(i), // invalid UTF-8
		"bytes":   []byte("ui\x00u" + strconv.Itoa(i)),
		"dec":     amqp.Decimal{Scale: 2, Value: int32(i)},
		"ts":      ts,
		"f":       float64(i) / 3,
		"b":       int8(i % 100),
		"B":       byte(i),
		"t":       i%2 == 0,
		"void":    nil,
		"nest":    amqp.Table{"deep": amqp.Table{"arr": []any{int32(i), "x" + strconv.Itoa(i), []byte{'i', byte(i)}}}},
	}
	want := amqp.Table{}
	for k, v := range h {
		want[k] = v
	}
	if i%3 == 0 {
		// 's' and 'I' go out and come back as 'u' and 'i': a frame that
		// is rewritten, between ones that pass through as read.
		h["hold-u16"], want["hold-u16"] = int16(-1-i), int32(uint16(int16(-1-i)))
		h["hold-u32"], want["hold-u32"] = int32(-7-i), int64(uint32(int32(-7-i)))
		h["hold-tab"] = amqp.Table{"hold-in32": int32(-i)}
		want["hold-tab"] = amqp.Table{"hold-in32": int64(uint32(int32(-i)))}
	}
	if i%7 == 0 {
		// Frames of different sizes, so the reused buffers grow and are
		// then refilled by smaller frames.
		big := strings.Repeat(string(rune('a'+i%26)), 8000+(i%5)*9000)
		h["big"], want["big"] = big, big
	}
	p := amqp.Publishing{
		MessageId: "m" + strconv.Itoa(i), CorrelationId: "c" + strconv.Itoa(i), Type: "t" + strconv.Itoa(i),
		AppId: "a" + strconv.Itoa(i), ContentType: "application/x-" + strconv.Itoa(i), ContentEncoding: "e" + strconv.Itoa(i),
		ReplyTo: "r" + strconv.Itoa(i), Priority: uint8(i % 10), DeliveryMode: amqp.Persistent, Timestamp: ts,
		Headers: h, Body: []byte("body " + strconv.Itoa(i) + strings.Repeat("!", i%50)),
	}
	return p, want
}

// snapshot is what a delivery carries, as text.
func snapshot(d *amqp.Delivery) string {
	return fmt.Sprintf("%#v|%s|%s|%s|%s|%s|%s|%s|%d|%d|%s|%q", d.Headers, d.MessageId, d.CorrelationId, d.Type, d.AppId,
		d.ContentType, d.ContentEncoding, d.ReplyTo, d.Priority, d.DeliveryMode, d.Timestamp, d.Body)
}

// The bridge's connection reads content header frames into buffers it
// reuses from frame to frame, and passes a frame that needs no rewriting
// on as read. Deliveries held unsettled (as a worker holds its prefetch,
// and a handler its *Message) while hundreds of later frames go through
// those buffers, rewritten or not, larger or smaller, must keep the
// headers, properties and bodies they arrived with. Run with -race: each
// delivery is read on this goroutine while the client's reader goes on.
func TestDeliveriesHeldAcrossLaterFramesKeepTheirHeaders(t *testing.T) {
	t.Parallel()
	env := brokertest.Require(t)
	const n = 300
	queue := env.Name("held")
	setup := env.Channel("setup")
	if _, err := setup.QueueDeclare(queue, false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}

	props := amqp.NewConnectionProperties()
	props.SetClientConnectionName(env.Prefix + "/publish")
	pub, err := amqp.DialConfig(env.URL, amqp.Config{Properties: props, Dial: brokertest.RewritingDial(
		[2][]byte{[]byte("\x08hold-u16s"), []byte("\x08hold-u16u")},
		[2][]byte{[]byte("\x08hold-u32I"), []byte("\x08hold-u32i")},
		[2][]byte{[]byte("\x09hold-in32I"), []byte("\x09hold-in32i")},
	)})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	pch, err := pub.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := pch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	wants := make([]amqp.Table, n)
	for i := range n {
		p, want := heldMessage(i)
		wants[i] = want
		dc, err := pch.PublishWithDeferredConfirmWithContext(context.Background(), "", queue, true, false, p)
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := dc.WaitContext(context.Background()); err != nil || !ok {
			t.Fatalf("publish %d: ack %v, err %v", i, ok, err)
		}
	}

	conn, err := amqpx.Dial(env.URL, env.Prefix+"/held")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Qos(n, 0, false); err != nil {
		t.Fatal(err)
	}
	deliveries, err := ch.Consume(queue, "", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	held := make([]amqp.Delivery, 0, n)
	seen := make([]string, 0, n)
	for len(held) < n {
		select {
		case d, ok := <-deliveries:
			if !ok {
				t.Fatalf("the consuming channel closed after %d deliveries: %v", len(held), conn.IsClosed())
			}
			held = append(held, d)
			seen = append(seen, snapshot(&held[len(held)-1]))
		case <-time.After(30 * time.Second):
			t.Fatalf("only %d of %d delivered within 30s", len(held), n)
		}
	}
	for k, d := range held {
		i, err := strconv.Atoi(strings.TrimPrefix(d.MessageId, "m"))
		if err != nil || i < 0 || i >= n {
			t.Fatalf("delivery %d: message id %q", k, d.MessageId)
		}
		p, _ := heldMessage(i)
		if got := snapshot(&d); got != seen[k] {
			t.Errorf("message %d changed while held:\nthen %.300s\nnow  %.300s", i, seen[k], got)
		}
		if !reflect.DeepEqual(d.Headers, wants[i]) {
			t.Errorf("message %d headers:\ngot  %.400s\nwant %.400s", i, fmt.Sprintf("%#v", d.Headers), fmt.Sprintf("%#v", wants[i]))
		}
		if d.CorrelationId != p.CorrelationId || d.Type != p.Type || d.AppId != p.AppId || d.ContentType != p.ContentType ||
			d.ContentEncoding != p.ContentEncoding || d.ReplyTo != p.ReplyTo || d.Priority != p.Priority ||
			!d.Timestamp.Equal(p.Timestamp) || !bytes.Equal(d.Body, p.Body) {
			t.Errorf("message %d properties or body differ: %s", i, seen[k])
		}
	}
}
