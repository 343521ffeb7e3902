package quarantine

import (
	"bytes"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/config"
	"github.com/dlxbridge/dlxbridge/internal/wireval"
	"github.com/dlxbridge/dlxbridge/wire"
)

// Layout 1 (JSON meta) predates envelope signatures: no keeper ever
// checked one for it, so its records read as unverified whatever the JSON
// says (the docs promise "layouts 1 and 2 ... marked not verified"). A
// "verified": true in a layout-1 meta is someone's claim.
func TestLayout1RecordIsNeverVerified(t *testing.T) {
	t.Parallel()
	body := encodeLayout1(t, fullDelivery(), "q.quarantine", time.Now())
	// Same length, so the meta's length prefix still holds.
	forged := bytes.Replace(body, []byte(`"verified":false`), []byte(`"verified":true `), 1)
	if bytes.Equal(forged, body) {
		t.Fatal("no verified field in the layout-1 meta")
	}
	set := &quarantineSet{cfg: &config.Queue{Name: "q", Quarantine: config.Quarantine{Queue: "q.quarantine"}}}
	r, err := recordFrom(forged, 1, set)
	if err != nil {
		t.Fatal(err)
	}
	if r.Envelope.Verified {
		t.Error("a layout-1 record reads as verified")
	}
}

// fuzzValue turns a byte and a string into a header value of one of the
// shapes a producer (or a broker) can send.
func fuzzValue(kind byte, s string, depth int) any {
	switch kind % 14 {
	case 0:
		return s
	case 1:
		return []byte(s)
	case 2:
		return int8(len(s))
	case 3:
		return int32(len(s))
	case 4:
		return int64(len(s)) << 40
	case 5:
		return float64(len(s)) + 0.5
	case 6:
		return len(s)%2 == 0
	case 7:
		return amqp.Decimal{Scale: uint8(len(s)), Value: int32(len(s))}
	case 8:
		return time.Unix(int64(len(s))*1e9, 0)
	case 9:
		v := any(s)
		for range depth {
			if len(s)%2 == 0 {
				v = []any{v}
			} else {
				v = amqp.Table{"k": v}
			}
		}
		return v
	case 10:
		return amqp.Table{"s": s}
	case 11:
		return nil
	case 12:
		return float32(len(s))
	}
	return uint64(1<<63) + uint64(len(s))
}

// wireTypes: every field holds a type amqp091-go decodes from the wire
// and the runtime signs (strings, byte arrays, signed integers) or is
// absent. Go-only types (uint64 over int64, say) need not survive storage.
func wireTypes(h amqp.Table, fields []string) bool {
	for _, k := range fields {
		switch h[k].(type) {
		case nil, string, []byte, int8, int16, int32, int64:
		default:
			return false
		}
	}
	return true
}

// encodable: every field present holds a string or an integer, the values a
// signature vouches for.
func encodable(h amqp.Table, fields []string) bool {
	for _, k := range fields {
		v, present := h[k]
		if !present {
			continue
		}
		_, isString := wireval.String(v)
		if _, res := wireval.Int(v); !isString && res != wireval.IntOK {
			return false
		}
	}
	return true
}

// FuzzReadVerifiedHostile: whatever an envelope header or its signature
// holds, ReadVerified, the keeper's record and reading it back never panic;
// a forged envelope (another key) never verifies; and an envelope of wire
// types that verifies at the intake verifies again from the stored record (the replay
// checks it there); and the record counts a redrive count only if the
// envelope signature vouches for it (a fuzzed redrive signature never
// does).
func FuzzReadVerifiedHostile(f *testing.F) {
	f.Add([]byte{0, 1, 9, 10}, "x", uint8(3), true)
	f.Add([]byte{13, 8, 7, 5, 12}, strings.Repeat("é", 300), uint8(40), false)
	key := envSigner(f, "the consumers' key, 32 bytes....")
	other := envSigner(f, "the producer's guess at a key")
	set := &quarantineSet{cfg: &config.Queue{Name: "q", Quarantine: config.Quarantine{Queue: "q.quarantine"}}}
	set.queues = []*config.Queue{set.cfg}
	f.Fuzz(func(t *testing.T, kinds []byte, s string, depth uint8, signWithKey bool) {
		d := fullDelivery()
		fields := append(slices.Clone(envelopeFields), wire.HeaderRedriveSignature)
		for i, k := range kinds {
			if i >= 64 {
				break
			}
			d.Headers[fields[(int(k)>>4+i)%len(fields)]] = fuzzValue(k, s, int(depth%80))
		}
		signer := other
		if signWithKey {
			signer = key
		}
		signEnvelope(signer, d.Headers, d.Exchange, d.MessageId, d.Body)
		env, ok := ReadVerified(d, key)
		if !ok {
			t.Fatal("an envelope header is present: ReadVerified must return a record")
		}
		// A value neither a string nor an integer is never vouched for
		// (triage.Signer.Sign).
		if want := signWithKey && encodable(d.Headers, fields); env.Verified != want {
			t.Fatalf("signed with the key %v, encodable %v: verified %v", signWithKey, encodable(d.Headers, fields), env.Verified)
		}
		msg, _, err := encodeRecord(d, "q.quarantine", time.Now(), key)
		if err != nil {
			return // refused by the codec: the keeper leaves it on the intake (tested elsewhere)
		}
		r, err := recordFrom(msg.Body, 0, set)
		if err != nil {
			t.Fatalf("record does not read back: %v", err)
		}
		if r.Envelope.Verified != env.Verified {
			t.Fatalf("record verified %v, intake %v", r.Envelope.Verified, env.Verified)
		}
		if r.Redrives != 0 && !(env.Verified && envelopeCoversRedrives(d.Headers)) {
			t.Fatalf("record counts %d prior replays that no signature vouches for (%#v)", r.Redrives, d.Headers[wire.HeaderRedriveCount])
		}
		again := verifyEnvelope(key, &amqp.Delivery{Headers: r.Headers(), Exchange: r.Exchange, MessageId: r.Properties.MessageID, Body: r.Body})
		if env.Verified && !again.Valid && wireTypes(d.Headers, fields) {
			t.Logf("verified at the intake, not from the record: %s", again.Problem)
			for _, k := range fields {
				if !reflect.DeepEqual(d.Headers[k], r.Headers()[k]) {
					t.Logf("  %s: %#v -> %#v", k, d.Headers[k], r.Headers()[k])
				}
			}
			t.Fail()
		}
	})
}

// An envelope field the runtime copies from the producer (the routing key,
// the idempotency key, the handler's error) need not be valid UTF-8. The
// keeper verifies the envelope as received; the replay verifies it again
// from the stored record before it signs the origin: storage must keep
// those bytes, or a verified record's origin is replayed unsigned. A
// producer's own header of such bytes must come back byte for byte too.
func TestRecordKeepsInvalidUTF8(t *testing.T) {
	t.Parallel()
	key := envSigner(t, "the consumers' key, 32 bytes....")
	d := fullDelivery()
	d.Headers[wire.HeaderOriginalRoutingKey] = "order.\xff\xfe"
	d.Headers[wire.HeaderIdempotencyKeyCopy] = "k\x80"
	d.Headers["x-producer"] = "bin\xc3\x28"
	signEnvelope(key, d.Headers, d.Exchange, d.MessageId, d.Body)
	if env, _ := ReadVerified(d, key); !env.Verified {
		t.Fatal("not verified at the intake")
	}
	msg, _, err := encodeRecord(d, "q.quarantine", time.Now(), key)
	if err != nil {
		t.Fatal(err)
	}
	set := &quarantineSet{cfg: &config.Queue{Name: "q", Quarantine: config.Quarantine{Queue: "q.quarantine"}}}
	r, err := recordFrom(msg.Body, 0, set)
	if err != nil {
		t.Fatal(err)
	}
	if !r.Envelope.Verified {
		t.Fatal("record not verified")
	}
	h := r.Headers()
	if v := verifyEnvelope(key, &amqp.Delivery{Headers: h, Exchange: r.Exchange, MessageId: r.Properties.MessageID, Body: r.Body}); !v.Valid {
		t.Errorf("verified at the intake, not from the record: %s (routing key stored as %q)", v.Problem, h[wire.HeaderOriginalRoutingKey])
	}
	if s, _ := wireval.String(h["x-producer"]); s != "bin\xc3\x28" {
		t.Errorf("producer header stored as %#v", h["x-producer"])
	}
}

// An envelope read without a key (a keeper without one, records of layout
// 1 and 2) is a claim. The CLI marks a claim by its source ("bridge" and
// not verified: "?" in list); a forged envelope that claims source
// "broker" must not pass for a record derived from the broker's x-death,
// which the bridge never writes into an envelope.
func TestReadClaimNeverPassesForTheBroker(t *testing.T) {
	t.Parallel()
	for _, claim := range []string{SourceBroker, SourceUnverified} {
		d := fullDelivery()
		d.Headers[wire.HeaderSource] = claim
		env, ok := Read(d)
		if !ok || env.Verified {
			t.Fatalf("%s: %+v", claim, env)
		}
		if env.Source == SourceBroker || env.Source == SourceUnverified {
			t.Errorf("claimed source %q read as %q: the forged class %q passes for the broker's", claim, env.Source, env.Class)
		}
	}
}
