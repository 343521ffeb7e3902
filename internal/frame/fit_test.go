package frame

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/dlxbridge/dlxbridge/wire"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/internal/brokertest"
)

// Sizes worked out by hand from amqp091-go's writeTable/writeField: 4-byte
// table length; per field 1+len(key) key, 1 tag, then the value.
func TestEncodedSizeFollowsTheWireEncoding(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		tbl  amqp.Table
		want int
	}{
		{"empty", amqp.Table{}, 4},
		{"string", amqp.Table{"s": "héllo"}, 4 + (1 + 1 + 1 + 4 + 6)},
		{"bytes", amqp.Table{"b": []byte{1, 2, 3}}, 4 + (1 + 1 + 1 + 4 + 3)},
		{"ints", amqp.Table{"a": int32(7), "b": int64(-9), "c": 5, "d": int16(2), "e": int8(1)}, 4 + 5*3 + 4 + 8 + 4 + 2 + 1},
		{"float bool time nil", amqp.Table{"f": 1.5, "t": true, "ts": time.Unix(1700000000, 0), "n": nil}, 4 + (3 + 8) + (3 + 1) + (4 + 8) + (3 + 0)},
		{"array of tables", amqp.Table{"x": []any{amqp.Table{"q": "a"}}}, 4 + (1 + 1 + 1) + 4 + (1 + (4 + (1 + 1 + 1 + 4 + 1)))},
		{"nested table", amqp.Table{"n": amqp.Table{"k": "v"}}, 4 + (1 + 1 + 1) + (4 + (1 + 1 + 1 + 4 + 1))},
	}
	for _, c := range cases {
		if got := EncodedSize(c.tbl); got != c.want {
			t.Errorf("%s: EncodedSize %d, want %d", c.name, got, c.want)
		}
	}
}

// HeaderFrameSize must be exactly what amqp091-go writes: publish through
// the real client to a minimal in-process server and measure the content
// header frame it receives.
func TestHeaderFrameSizeMatchesTheClientsEncoder(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("é", 150) // 300 bytes: the client writes uint8(300)=44 of them
	cases := map[string]amqp.Publishing{
		"nothing set": {},
		"every property": {
			ContentType: "application/json", ContentEncoding: "gzip", DeliveryMode: amqp.Persistent, Priority: 3,
			CorrelationId: "corr", ReplyTo: "reply", Expiration: "1500", MessageId: "m-1",
			Timestamp: time.Unix(1700000000, 0), Type: "orders.created", UserId: "guest", AppId: "app",
		},
		"every field type": {Headers: amqp.Table{
			"bool": true, "byte": byte(7), "int8": int8(-1), "int16": int16(300), "int": 70000, "int32": int32(-5),
			"int64": int64(1) << 40, "float32": float32(1.5), "float64": 2.25, "decimal": amqp.Decimal{Scale: 2, Value: 12345},
			"string": "héllo", "bytes": []byte{0, 1, 2}, "time": time.Unix(1700000000, 0), "void": nil,
			"array": []any{"a", int32(1), []any{int64(2)}, amqp.Table{"k": "v"}},
			"table": amqp.Table{"nested": amqp.Table{"deeper": []any{true, nil}}},
		}},
		"x-death as the broker sends it": {Headers: amqp.Table{"x-death": []any{amqp.Table{
			"count": int64(3), "reason": "expired", "queue": "q.retry.1s.l0", "exchange": "q.retry",
			"routing-keys": []any{"q.retry.1s.l0"}, "time": time.Unix(1700000000, 0),
		}}}},
		"a 130 KB header":              {Headers: amqp.Table{"blob": strings.Repeat("x", 130_800)}, MessageId: "big"},
		"short strings over 255 bytes": {MessageId: long, CorrelationId: strings.Repeat("c", 256), Type: strings.Repeat("t", 511)},
	}
	for name, p := range cases {
		got := capturedHeaderFrame(t, p)
		if want := HeaderFrameSize(&p); len(got) != want {
			t.Errorf("%s: the client wrote a %d-byte header frame, HeaderFrameSize says %d", name, len(got), want)
		}
	}
}

// The client cuts a short string over 255 bytes to len%256 bytes without an
// error, and the broker takes it: Fit must cut such properties itself.
func TestTheClientSilentlyCutsLongShortStrings(t *testing.T) {
	t.Parallel()
	p := amqp.Publishing{MessageId: strings.Repeat("m", 300)}
	frame := capturedHeaderFrame(t, p)
	// header frame: 7-byte frame header, class, weight, body size, flags, then the message id.
	if n := int(frame[7+14]); n != 300%256 {
		t.Fatalf("message id written with length %d, want %d (uint8(300))", n, 300%256)
	}
	if _, err := Fit(&p, 0, func(string) Rank { return ProducerHeader }); err != nil {
		t.Fatal(err)
	}
	if len(p.MessageId) != 255 || !strings.HasSuffix(p.MessageId, "[truncated]") {
		t.Fatalf("message id not cut to 255 bytes: %d", len(p.MessageId))
	}
	if got, _ := stringList(p.Headers[wire.HeaderDropped]); len(got) != 1 || got[0] != "property:message-id" {
		t.Fatalf("%s = %v", wire.HeaderDropped, got)
	}
}

func TestFitLeavesAMessageThatFitsAlone(t *testing.T) {
	t.Parallel()
	p := amqp.Publishing{Headers: amqp.Table{"a": strings.Repeat("x", 100_000), wire.HeaderNotes: "not json"}, Body: []byte("b")}
	changed, err := Fit(&p, 0, func(string) Rank { return ProducerHeader })
	if err != nil || changed != nil || len(p.Headers) != 2 {
		t.Fatalf("changed %v, err %v, headers %d", changed, err, len(p.Headers))
	}
}

// Fit's order: producer headers (largest first), detail texts cut, details
// dropped, trace context, identity, essentials cut to 255; fixed headers
// never change.
func TestFitShrinksInRankOrder(t *testing.T) {
	t.Parallel()
	ranks := map[string]Rank{
		"p-big": ProducerHeader, "p-small": ProducerHeader,
		wire.HeaderError: DetailHeader, wire.HeaderValidationErrors: DetailHeader,
		"traceparent": TraceHeader, "tracestate": TraceHeader,
		"schema-version": IdentityHeader,
		wire.HeaderClass: EssentialHeader, wire.HeaderOriginalRoutingKey: EssentialHeader,
		"fixed": FixedHeader,
	}
	rank := func(k string) Rank {
		if r, ok := ranks[k]; ok {
			return r
		}
		return EssentialHeader
	}
	base := func() amqp.Table {
		return amqp.Table{
			"p-big": strings.Repeat("p", 60_000), "p-small": strings.Repeat("p", 30_000),
			wire.HeaderError:              strings.Repeat("e", 40_000),
			wire.HeaderValidationErrors:   `[` + strings.Repeat(" ", 40_000) + `]`,
			"traceparent":                 strings.Repeat("t", 40_000),
			"tracestate":                  strings.Repeat("s", 20_000),
			"schema-version":              strings.Repeat("v", 40_000),
			wire.HeaderClass:              "transient",
			wire.HeaderOriginalRoutingKey: strings.Repeat("k", 40_000),
			"fixed":                       strings.Repeat("f", 1000),
		}
	}
	// Each frame_max lets exactly one more step run.
	cases := []struct {
		frameMax    int
		gone        []string
		cut         map[string]int // header -> length after
		untouchedOK []string
	}{
		{frameMax: 300_000, gone: []string{"p-big"}, untouchedOK: []string{"p-small", wire.HeaderError}},
		{frameMax: 240_000, gone: []string{"p-big", "p-small"}, untouchedOK: []string{wire.HeaderError}},
		{frameMax: 200_000, gone: []string{"p-big", "p-small"}, cut: map[string]int{wire.HeaderError: MinDetailBytes}, untouchedOK: []string{wire.HeaderValidationErrors}},
		{frameMax: 160_000, gone: []string{"p-big", "p-small", wire.HeaderValidationErrors}, cut: map[string]int{wire.HeaderError: MinDetailBytes}, untouchedOK: []string{"tracestate"}},
		// Dropping the trace headers made room: the error text, cut and then
		// dropped on the way, comes back (cut).
		{frameMax: 100_000, gone: []string{"p-big", "p-small", wire.HeaderValidationErrors, "traceparent", "tracestate"}, cut: map[string]int{wire.HeaderError: MinDetailBytes}, untouchedOK: []string{"schema-version"}},
		{frameMax: 50_000, gone: []string{"schema-version"}, untouchedOK: []string{wire.HeaderOriginalRoutingKey}},
		{frameMax: 8192, gone: []string{"schema-version"}, cut: map[string]int{wire.HeaderOriginalRoutingKey: 255}, untouchedOK: []string{"fixed", wire.HeaderClass}},
	}
	for _, c := range cases {
		t.Run(fmt.Sprint(c.frameMax), func(t *testing.T) {
			body := []byte("body bytes")
			p := amqp.Publishing{Headers: base(), Body: body, MessageId: "m"}
			changed, err := Fit(&p, c.frameMax, rank)
			if err != nil {
				t.Fatal(err)
			}
			if got := HeaderFrameSize(&p); got > c.frameMax {
				t.Fatalf("frame %d > %d", got, c.frameMax)
			}
			if !bytes.Equal(p.Body, body) {
				t.Fatal("body changed")
			}
			for _, k := range c.gone {
				if _, ok := p.Headers[k]; ok {
					t.Errorf("%s kept", k)
				}
			}
			for k, n := range c.cut {
				if s, _ := p.Headers[k].(string); len(s) != n {
					t.Errorf("%s is %d bytes, want cut to %d", k, len(s), n)
				}
			}
			b := base()
			for _, k := range c.untouchedOK {
				if p.Headers[k] != b[k] {
					t.Errorf("%s changed too early", k)
				}
			}
			listed, _ := stringList(p.Headers[wire.HeaderDropped])
			notes, _ := stringList(p.Headers[wire.HeaderNotes])
			if len(listed) != len(changed) || len(notes) != 1 {
				t.Fatalf("changed %v, %s %v, notes %v", changed, wire.HeaderDropped, listed, notes)
			}
			for _, k := range append(c.gone, mapKeys(c.cut)...) {
				if !strings.Contains(strings.Join(listed, " "), "header:"+k) {
					t.Errorf("%s not recorded: %v", k, listed)
				}
			}
			if !strings.Contains(notes[0], "header p-big (60000 bytes) dropped") {
				t.Errorf("note %q", notes[0])
			}
		})
	}
}

func mapKeys(m map[string]int) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	return ks
}

// A header Fit may not change that cannot fit: nothing to send.
func TestFitFailsRatherThanChangeAFixedHeader(t *testing.T) {
	t.Parallel()
	const lastError = "dlxbridge-last-error"
	p := amqp.Publishing{Headers: amqp.Table{
		"x-app-blob":        strings.Repeat("x", 131_000),
		lastError:           strings.Repeat("e", 2000),
		wire.HeaderAttempts: int64(2),
	}}
	rank := func(k string) Rank {
		switch k {
		case lastError:
			return DetailHeader
		case wire.HeaderAttempts:
			return EssentialHeader
		}
		return FixedHeader
	}
	_, err := Fit(&p, 0, rank)
	if !errors.Is(err, ErrNoFit) || !strings.Contains(err.Error(), "x-app-blob (131000 bytes)") {
		t.Fatalf("err %v, want ErrNoFit naming x-app-blob", err)
	}
	if p.Headers["x-app-blob"] != strings.Repeat("x", 131_000) {
		t.Fatal("a fixed header changed")
	}
}

// The record survives hops: earlier notes and drops are kept, Fit adds one
// note and its entries; an earlier notes header that is not a JSON list is
// replaced, and said so.
func TestFitKeepsEarlierRecords(t *testing.T) {
	t.Parallel()
	p := amqp.Publishing{Headers: amqp.Table{
		wire.HeaderNotes:   `["from an earlier hop"]`,
		wire.HeaderDropped: `["header:tracestate"]`,
		"x-app-blob":       strings.Repeat("x", 131_000),
		wire.HeaderClass:   "transient",
	}}
	rank := func(k string) Rank {
		if k == "x-app-blob" {
			return ProducerHeader
		}
		return EssentialHeader
	}
	if _, err := Fit(&p, 0, rank); err != nil {
		t.Fatal(err)
	}
	notes, _ := stringList(p.Headers[wire.HeaderNotes])
	listed, _ := stringList(p.Headers[wire.HeaderDropped])
	if len(notes) != 2 || notes[0] != "from an earlier hop" || !strings.Contains(notes[1], "header x-app-blob (131000 bytes) dropped") {
		t.Fatalf("notes %q", notes)
	}
	if strings.Join(listed, ",") != "header:tracestate,header:x-app-blob" {
		t.Fatalf("%s %v", wire.HeaderDropped, listed)
	}

	p = amqp.Publishing{Headers: amqp.Table{wire.HeaderNotes: strings.Repeat("n", 131_100)}}
	if _, err := Fit(&p, 0, func(string) Rank { return FixedHeader }); err != nil {
		t.Fatal(err)
	}
	notes, _ = stringList(p.Headers[wire.HeaderNotes])
	if len(notes) != 1 || !strings.Contains(notes[0], "header "+wire.HeaderNotes+" (131100 bytes) not a JSON array of strings; replaced") {
		t.Fatalf("notes %q", notes)
	}
}

// Whatever the input, a message with nothing fixed or essential fits even
// the smallest frame_max a broker negotiates (4096), body untouched.
func FuzzFit(f *testing.F) {
	f.Add(uint16(5), uint32(130_800), uint16(255), uint16(4096), uint8(0))
	f.Add(uint16(2000), uint32(64), uint16(255), uint16(4096), uint8(1))
	f.Add(uint16(3), uint32(200_000), uint16(300), uint16(0), uint8(2))
	f.Add(uint16(40), uint32(50_000), uint16(510), uint16(9000), uint8(3))
	f.Add(uint16(2999), uint32(299_999), uint16(510), uint16(9000), uint8(3))
	f.Fuzz(func(t *testing.T, n uint16, size uint32, prop uint16, frameMax uint16, seed uint8) {
		n, size = n%3000, size%300_000
		h := amqp.Table{}
		for i := range int(n) {
			v := strings.Repeat("v", int(size)/(i+1))
			switch (int(seed) + i) % 4 {
			case 0:
				h[fmt.Sprintf("p%d", i)] = v
			case 1:
				h[fmt.Sprintf("dlxbridge-d%d", i)] = v
			case 2:
				h[fmt.Sprintf("t%d", i)] = []any{v, amqp.Table{"k": v}}
			case 3:
				h[fmt.Sprintf("i%d", i)] = v
			}
		}
		s := strings.Repeat("é", int(prop)/2)
		body := []byte(s)
		p := amqp.Publishing{Headers: h, MessageId: s, CorrelationId: s, Type: s, AppId: s, ReplyTo: s, ContentType: s, DeliveryMode: 2, Body: body}
		rank := func(k string) Rank {
			switch k[0] {
			case 'd':
				return DetailHeader
			case 't':
				return TraceHeader
			case 'i':
				return IdentityHeader
			}
			return ProducerHeader
		}
		fm := max(int(frameMax), 4096)
		if _, err := Fit(&p, fm, rank); err != nil {
			t.Fatalf("%d headers of up to %d bytes, frame_max %d: %v", n, size, fm, err)
		}
		if got := HeaderFrameSize(&p); got > fm {
			t.Fatalf("frame %d > %d", got, fm)
		}
		if !bytes.Equal(p.Body, []byte(s)) {
			t.Fatal("body changed")
		}
	})
}

// capturedHeaderFrame publishes p through amqp091-go to an in-process
// server that speaks just enough AMQP 0-9-1, and returns the content header
// frame the client wrote, whole (frame header and frame-end included).
func capturedHeaderFrame(t *testing.T, p amqp.Publishing) []byte {
	t.Helper()
	client, server := net.Pipe()
	defer client.Close()
	frames := make(chan []byte, 1)
	go func() {
		defer server.Close()
		fakeBroker(server, frames)
	}()
	conn, err := amqp.Open(client, amqp.Config{SASL: []amqp.Authentication{&amqp.PlainAuth{Username: "u", Password: "p"}}, Vhost: "/"})
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	ch, err := conn.Channel()
	if err != nil {
		t.Fatalf("channel: %v", err)
	}
	if err := ch.Publish("", "q", false, false, p); err != nil {
		t.Fatalf("publish: %v", err)
	}
	select {
	case f := <-frames:
		return f
	case <-time.After(10 * time.Second):
		t.Fatal("no header frame within 10s")
	}
	return nil
}

// fakeBroker answers the handshake and channel.open, sends every content
// header frame (type 2) it reads to frames, and reads on until the client
// closes.
func fakeBroker(rw io.ReadWriter, frames chan<- []byte) {
	r := bufio.NewReader(rw)
	if _, err := io.ReadFull(r, make([]byte, 8)); err != nil { // "AMQP" 0 0 9 1
		return
	}
	method := func(channel uint16, class, id uint16, args []byte) {
		payload := binary.BigEndian.AppendUint16(binary.BigEndian.AppendUint16(nil, class), id)
		payload = append(payload, args...)
		frame := []byte{1}
		frame = binary.BigEndian.AppendUint16(frame, channel)
		frame = binary.BigEndian.AppendUint32(frame, uint32(len(payload)))
		frame = append(append(frame, payload...), 0xCE)
		_, _ = rw.Write(frame)
	}
	longstr := func(s string) []byte { return append(binary.BigEndian.AppendUint32(nil, uint32(len(s))), s...) }
	// connection.start: version 0-9, no server properties, PLAIN, en_US.
	method(0, 10, 10, append(append([]byte{0, 9, 0, 0, 0, 0}, longstr("PLAIN")...), longstr("en_US")...))
	for {
		var hdr [7]byte
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			return
		}
		size := binary.BigEndian.Uint32(hdr[3:7])
		payload := make([]byte, size+1) // + frame-end
		if _, err := io.ReadFull(r, payload); err != nil {
			return
		}
		if hdr[0] == 2 {
			select {
			case frames <- append(hdr[:], payload...):
			default:
			}
		}
		if hdr[0] != 1 || size < 4 {
			continue
		}
		channel := binary.BigEndian.Uint16(hdr[1:3])
		switch [2]uint16{binary.BigEndian.Uint16(payload[0:2]), binary.BigEndian.Uint16(payload[2:4])} {
		case [2]uint16{10, 11}: // start-ok -> tune: channel-max 0, frame-max 0 (no limit), heartbeat 0
			method(0, 10, 30, []byte{0, 0, 0, 0, 0, 0, 0, 0})
		case [2]uint16{10, 40}: // open -> open-ok
			method(0, 10, 41, []byte{0})
		case [2]uint16{20, 10}: // channel.open -> open-ok
			method(channel, 20, 11, longstr(""))
		}
	}
}

// On the real broker, with frames measured by HeaderFrameSize: a content
// header frame of exactly frame_max bytes is taken (what Fit keeps to, as
// AMQP 0-9-1 counts frame_max: the whole frame). RabbitMQ tolerates 8 bytes
// more (the payload alone may be frame_max); one byte beyond that closes the
// connection with FRAME_ERROR. Seen on 3.10.8 and 4.0.5.
func TestBrokerFrameLimitAsHeaderFrameSizeCountsIt(t *testing.T) {
	t.Parallel()
	env := brokertest.Require(t)
	for _, over := range []int{0, 8, 9} {
		conn := env.Dial(fmt.Sprintf("frame-max-plus-%d", over))
		frameMax := conn.Config.FrameSize
		if frameMax <= 0 {
			t.Fatalf("negotiated frame_max %d", frameMax)
		}
		closed := conn.NotifyClose(make(chan *amqp.Error, 1))
		ch, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		q, err := ch.QueueDeclare(env.Name(fmt.Sprintf("frame-%d", over)), false, true, true, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := ch.Confirm(false); err != nil {
			t.Fatal(err)
		}
		p := amqp.Publishing{MessageId: "m", DeliveryMode: amqp.Persistent, Body: []byte("{}"), Headers: amqp.Table{"blob": ""}}
		p.Headers["blob"] = strings.Repeat("x", frameMax+over-HeaderFrameSize(&p))
		if got := HeaderFrameSize(&p); got != frameMax+over {
			t.Fatalf("built a %d-byte frame, want %d", got, frameMax+over)
		}
		dc, err := ch.PublishWithDeferredConfirm("", q.Name, false, false, p)
		var confirmed <-chan struct{}
		switch {
		case err == nil:
			confirmed = dc.Done()
		case over <= 8:
			t.Fatal(err)
		default:
			// The broker may close the connection for the frame before
			// the client has finished writing it: the close tells.
		}
		select {
		case <-confirmed:
			if over <= 8 {
				if !dc.Acked() {
					t.Fatalf("frame of frame_max+%d: acked %v", over, dc.Acked())
				}
				break
			}
			if dc.Acked() {
				t.Fatalf("frame of frame_max+%d: acked", over)
			}
			// The library settles a publish as not acked when its
			// channel closes, and may do so before it reports the
			// connection's close (CI saw it): the close says why.
			select {
			case e := <-closed:
				if e == nil || e.Code != amqp.FrameError {
					t.Fatalf("frame of frame_max+%d: connection closed: %v", over, e)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("frame of frame_max+%d: not acked, and no close within 10s", over)
			}
		case e := <-closed:
			if over <= 8 || e == nil || e.Code != amqp.FrameError {
				t.Fatalf("frame of frame_max+%d: connection closed: %v", over, e)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("frame of frame_max+%d: neither a confirm nor a close within 10s", over)
		}
	}
}
