package quarantine

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"reflect"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/dlxbridge/dlxbridge/wire"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/config"
)

// fullDelivery sets every property and every envelope header, so that a
// field the binary meta forgets shows.
func fullDelivery() *amqp.Delivery {
	at := time.Date(2026, 11, 30, 12, 0, 0, 123456789, time.UTC)
	h := amqp.Table{"schema-version": "2", wire.HeaderRedriveCount: int64(3), "x": everyType()}
	e := Envelope{Source: SourceBridge, Class: "permanent", Reason: "handler refused it", Error: "boom ünï",
		Fingerprint: "fp", Attempts: 5, FirstFailureAt: at.Add(-time.Hour), LastFailureAt: at.Add(-time.Minute),
		QuarantinedAt: at, OriginalExchange: "ex", OriginalRouting: "k", OriginalQueue: "q",
		IdempotencyKey: "idem", MessageType: "test.job", SchemaVersion: "2",
		Validation: []Violation{{Pointer: "/a", Keyword: "type", Message: "want string"}, {Message: "second"}},
		TraceID:    "0af7651916cd43dd8448eb211c80319c", WorkerHost: "host", WorkerVersion: "v1",
		Redacted: []string{"header:secret"}, RedactionFailed: "not JSON", Notes: []string{"n1", "n2"}, Stack: "goroutine 1"}
	e.Apply(h)
	h[wire.HeaderDropped] = `["header:big"]`
	h["traceparent"] = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	return &amqp.Delivery{
		Exchange: "dlx", RoutingKey: "rk", Headers: h, ContentType: "application/json", ContentEncoding: "gzip",
		DeliveryMode: 2, Priority: 7, CorrelationId: "corr", ReplyTo: "reply", Expiration: "60000",
		MessageId: "m-1", Timestamp: time.Unix(1700000000, 0), Type: "test.job", UserId: "guest", AppId: "app",
		Body: []byte(`{"id":"j-1"}`),
	}
}

// encodeLayout1 writes d's record the way layout 1 did (JSON meta with the
// headers inside), to check that such records still read.
func encodeLayout1(t *testing.T, d *amqp.Delivery, intake string, now time.Time) []byte {
	t.Helper()
	id, err := recordID(d)
	if err != nil {
		t.Fatal(err)
	}
	headers, err := marshalTable(d.Headers)
	if err != nil {
		t.Fatal(err)
	}
	env, _ := Read(d)
	meta, err := json.Marshal(recordMeta{ID: id, Intake: intake, StoredAt: now.UTC(), Exchange: d.Exchange,
		RoutingKey: d.RoutingKey, Props: propertiesOf(d), Headers: headers, Envelope: &env,
		Redrives: redrives(d.Headers), Version: "2"})
	if err != nil {
		t.Fatal(err)
	}
	body := append([]byte(recordMagic), binary.BigEndian.AppendUint32(nil, uint32(len(meta)))...)
	return append(append(body, meta...), d.Body...)
}

func TestRecordLayoutsReadTheSame(t *testing.T) {
	t.Parallel()
	d := fullDelivery()
	now := time.Now()
	msg, _, err := encodeRecord(d, "q.quarantine", now, nil)
	if err != nil {
		t.Fatal(err)
	}
	if string(msg.Body[:len(recordMagic3)]) != recordMagic3 {
		t.Fatalf("the keeper writes %q, want layout 3", msg.Body[:8])
	}
	set := &quarantineSet{cfg: &config.Queue{Name: "q", Quarantine: config.Quarantine{Queue: "q.quarantine"}}}
	got, err := recordFrom(msg.Body, 7, set)
	if err != nil {
		t.Fatal(err)
	}
	old, err := recordFrom(encodeLayout1(t, d, "q.quarantine", now), 7, set)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := Read(d)
	if !reflect.DeepEqual(normalized(got.Envelope), normalized(want)) {
		t.Errorf("layout 3 envelope:\n got %+v\nwant %+v", got.Envelope, want)
	}
	if !reflect.DeepEqual(normalized(old.Envelope), normalized(got.Envelope)) {
		t.Errorf("layouts differ in the envelope:\n1: %+v\n2: %+v", old.Envelope, got.Envelope)
	}
	for _, r := range []*Record{got, old} {
		if r.ID == "" || r.Intake != "q.quarantine" || !r.StoredAt.Equal(now) || r.Exchange != "dlx" || r.RoutingKey != "rk" ||
			r.Redrives != 3 || r.version != "2" || string(r.Body) != `{"id":"j-1"}` || r.Offset != 7 {
			t.Errorf("record fields: %+v", r)
		}
		p := r.Properties
		p.Timestamp = p.Timestamp.UTC()
		wantP := propertiesOf(d)
		wantP.Timestamp = wantP.Timestamp.UTC()
		if p != wantP {
			t.Errorf("properties:\n got %+v\nwant %+v", p, wantP)
		}
		if !sameValue(r.Headers(), d.Headers) {
			t.Errorf("headers changed:\n got %#v\nwant %#v", r.Headers(), d.Headers)
		}
	}
	if got.ID != old.ID {
		t.Errorf("ids differ: %s, %s", got.ID, old.ID)
	}
}

// normalized puts an envelope's times in UTC, so that DeepEqual compares
// instants.
func normalized(e Envelope) Envelope {
	e.FirstFailureAt, e.LastFailureAt, e.QuarantinedAt = e.FirstFailureAt.UTC(), e.LastFailureAt.UTC(), e.QuarantinedAt.UTC()
	return e
}

// TestRecordMetaFields fails when a field is added to what the binary meta
// writes: appendMeta and readMeta need it, under a new layout digit.
func TestRecordMetaFields(t *testing.T) {
	t.Parallel()
	for typ, n := range map[reflect.Type]int{
		reflect.TypeOf(recordMeta{}): 10, reflect.TypeOf(Properties{}): 12, reflect.TypeOf(Envelope{}): 28,
		reflect.TypeOf(Violation{}): 3, reflect.TypeOf(PayloadOmitted{}): 2,
	} {
		if typ.NumField() != n {
			t.Errorf("%s has %d fields, the binary meta knows %d: add the new ones to appendMeta and readMeta (recordMagic3)", typ, typ.NumField(), n)
		}
	}
}

func TestBinaryMetaRefusesEveryCutAndTrailingBytes(t *testing.T) {
	t.Parallel()
	d := fullDelivery()
	env, _ := Read(d)
	env.PayloadOmitted = &PayloadOmitted{Reason: "too big", Bytes: 1 << 20}
	meta := appendMeta(nil, &recordMeta{ID: "abc", Intake: "i", StoredAt: time.Now(), Props: propertiesOf(d), Envelope: &env})
	m, err := readMeta(meta, true)
	if err != nil {
		t.Fatal(err)
	}
	if *m.Envelope.PayloadOmitted != *env.PayloadOmitted {
		t.Errorf("payload omitted: %+v", m.Envelope.PayloadOmitted)
	}
	for n := range len(meta) {
		if _, err := readMeta(meta[:n], true); !errors.Is(err, errMeta) {
			t.Fatalf("cut at %d of %d: err %v", n, len(meta), err)
		}
	}
	if _, err := readMeta(append(meta, 0), true); !errors.Is(err, errMeta) {
		t.Fatalf("trailing byte: err %v", err)
	}
	// A forged length or count larger than what remains allocates nothing.
	huge := binary.AppendUvarint(nil, 1<<62)
	if _, err := readMeta(huge, true); !errors.Is(err, errMeta) {
		t.Fatalf("huge length: err %v", err)
	}
	if _, err := readMeta([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}, true); !errors.Is(err, errMeta) {
		t.Fatalf("varint over 64 bits: err %v", err)
	}
}

func FuzzDecodeRecord(f *testing.F) {
	msg, _, _ := encodeRecord(fullDelivery(), "q.quarantine", time.Now(), nil)
	f.Add(msg.Body)
	f.Add([]byte(recordMagic2 + "\x00\x00\x00\x01\x00"))
	set := &quarantineSet{cfg: &config.Queue{Name: "q", Quarantine: config.Quarantine{Queue: "q.quarantine"}}}
	f.Fuzz(func(t *testing.T, body []byte) {
		r, err := recordFrom(body, 0, set)
		if err != nil {
			if !errors.Is(err, ErrNotRecord) {
				t.Fatalf("err %v does not wrap ErrNotRecord", err)
			}
			return
		}
		_ = r.Headers()
	})
}

// A binary meta that announces more items than it could hold allocates
// no more than a few times its size before it is refused.
func TestBinaryMetaCountsAllocateNothingLarge(t *testing.T) {
	var meta []byte
	// Every field empty up to the validation list, then a count as large
	// as the rest, then garbage that fails at once.
	m := appendMeta(nil, &recordMeta{Envelope: &Envelope{}})
	// Find where the validation count sits: re-encode up to it with a
	// marker, by encoding a meta with one violation and locating it.
	one := appendMeta(nil, &recordMeta{Envelope: &Envelope{Validation: []Violation{{Pointer: "\xfe"}}}})
	at := -1
	for i := range one {
		if one[i] == 1 && i+2 < len(one) && one[i+1] == 1 && one[i+2] == 0xfe {
			at = i
			break
		}
	}
	if at < 0 || !slices.Equal(m[:at], one[:at]) {
		t.Fatal("cannot find the validation count")
	}
	const rest = 4 << 20
	meta = append(meta, m[:at]...)
	meta = binary.AppendUvarint(meta, rest)
	for range rest {
		meta = append(meta, 0xff) // the first violation's pointer length runs over 64 bits
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	if _, err := readMeta(meta, true); err == nil {
		t.Fatal("a malformed meta was read")
	}
	runtime.ReadMemStats(&after)
	if got := after.TotalAlloc - before.TotalAlloc; got > 4*uint64(len(meta)) {
		t.Fatalf("a %d-byte meta allocated %d bytes before it was refused", len(meta), got)
	}
}
