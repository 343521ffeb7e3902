package quarantine

import (
	"bytes"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/config"
	"github.com/dlxbridge/dlxbridge/wire"
)

// keptRecord encodes d as the keeper stores it with red (stub: without its
// payload) and reads the record back.
func keptRecord(t *testing.T, d *amqp.Delivery, v *Redaction, stub bool, key ...string) *Record {
	t.Helper()
	set := &quarantineSet{cfg: &config.Queue{Name: "q", Quarantine: config.Quarantine{Queue: "q.quarantine"}}}
	set.queues = []*config.Queue{set.cfg}
	k := &Keeper{Intake: "q.quarantine"}
	if len(key) > 0 {
		k.Verifier = envSigner(t, key[0])
	}
	if v != nil {
		k.Redaction = *v
	}
	var msg amqp.Publishing
	var err error
	if stub {
		msg, _, err = encodeStub(d, k.Intake, time.Now(), k.Verifier, k.Redaction, errors.New("too large"))
	} else {
		msg, _, err = encodeKept(d, k.Intake, time.Now(), k.Verifier, k.Redaction, nil)
	}
	if err != nil {
		t.Fatal(err)
	}
	r, err := recordFrom(msg.Body, 0, set)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func keeperNote(e Envelope) string {
	for _, n := range e.Notes {
		if strings.HasPrefix(n, keeperRedactedNote) {
			return n
		}
	}
	return ""
}

// A verified envelope's message is stored as it arrived: the runtime
// redacted it, and the keeper's rules change nothing, not even its marks.
// Its record still verifies from its headers and payload.
func TestKeeperLeavesVerifiedRecordsAsTheyArrived(t *testing.T) {
	t.Parallel()
	const key = "the consumers' key, 32 bytes...."
	red := &Redaction{Headers: []string{"schema-version"}, Fields: []string{"/id"}}
	d := signedDelivery(envSigner(t, key))
	plain, kept := keptRecord(t, cloneDelivery(d), nil, false, key), keptRecord(t, cloneDelivery(d), red, false, key)
	if !kept.Envelope.Verified || !bytes.Equal(kept.Body, d.Body) || kept.Headers()["schema-version"] != "2" ||
		!slices.Equal(kept.Envelope.Redacted, plain.Envelope.Redacted) || keeperNote(kept.Envelope) != "" {
		t.Fatalf("verified record changed: body %s, envelope %+v", kept.Body, kept.Envelope)
	}
	if v := verifyEnvelope(envSigner(t, key), &amqp.Delivery{Headers: kept.Headers(), Exchange: kept.Exchange,
		MessageId: kept.Properties.MessageID, Body: kept.Body}); !v.Valid {
		t.Fatalf("stored record does not verify: %s", v.Problem)
	}
}

// A broker dead letter and a forged envelope are redacted: headers, body
// fields, the envelope's copy of a redacted idempotency key; the record
// says what, from what the keeper did (never the claimed
// dlxbridge-redacted), keeps the verdict of the message as it arrived, and
// has the id of what it keeps (an id over the secrets would let a reader
// test guesses of a short one). A keeper without a key redacts every record, a runtime's
// too, and lists each change once.
func TestKeeperRedactsWhatItCannotVerify(t *testing.T) {
	t.Parallel()
	const key = "the consumers' key, 32 bytes...."
	red := &Redaction{Headers: []string{"Authorization", wire.HeaderIdempotencyKey}, Fields: []string{"/card"}}
	secretOf := func(d *amqp.Delivery) *amqp.Delivery {
		d.Headers["authorization"] = "secret-auth"
		d.Headers[wire.HeaderIdempotencyKey] = "secret-idem"
		d.Headers[wire.HeaderIdempotencyKeyCopy] = "secret-idem"
		d.Body = []byte(`{"id":"j-1","card":"secret-card"}`)
		return d
	}
	want := []string{"header:authorization", "header:" + wire.HeaderIdempotencyKey, "body:/card"} // as Apply lists them
	for name, tc := range map[string]struct {
		d   *amqp.Delivery
		key []string
	}{
		"forged":  {secretOf(forgedDelivery(t, true)), []string{key}},
		"broker":  {secretOf(&amqp.Delivery{Exchange: "dlx", MessageId: "m-b", Headers: forgedDelivery(t, true).Headers}), []string{key}},
		"keyless": {secretOf(signedDelivery(envSigner(t, key))), nil},
	} {
		if name == "broker" {
			for _, k := range slices.Clone(envelopeFields) {
				delete(tc.d.Headers, k)
			}
			tc.d.Headers[wire.HeaderIdempotencyKeyCopy] = "secret-idem"
		}
		orig := cloneDelivery(tc.d)
		asArrived, _ := recordID(tc.d)
		redacted := cloneDelivery(tc.d)
		redacted.Headers["authorization"], redacted.Headers[wire.HeaderIdempotencyKey] = redactedValue, redactedValue
		redacted.Headers[wire.HeaderIdempotencyKeyCopy] = redactedValue
		redacted.Body = []byte(`{"id":"j-1","card":"[redacted]"}`)
		id, _ := recordID(redacted)
		r := keptRecord(t, tc.d, red, false, tc.key...)
		h := r.Headers()
		if strings.Contains(string(r.Body), "secret") || h["authorization"] != redactedValue || h[wire.HeaderIdempotencyKey] != redactedValue ||
			h[wire.HeaderIdempotencyKeyCopy] != redactedValue || strings.Contains(r.Envelope.IdempotencyKey, "secret") {
			t.Errorf("%s: stored body %s, headers %v, key %q", name, r.Body, h, r.Envelope.IdempotencyKey)
		}
		if !slices.Equal(r.Envelope.Redacted, want) || r.Envelope.RedactionFailed != "" || keeperNote(r.Envelope) == "" {
			t.Errorf("%s: redacted %q, failed %q, notes %q", name, r.Envelope.Redacted, r.Envelope.RedactionFailed, r.Envelope.Notes)
		}
		if r.ID != id || r.ID == asArrived || r.Envelope.Verified {
			t.Errorf("%s: id %s (want %s, of what is kept, not %s, of the secrets), verified %v", name, r.ID, id, asArrived, r.Envelope.Verified)
		}
		if tc.d.Headers["authorization"] != orig.Headers["authorization"] || !bytes.Equal(tc.d.Body, orig.Body) {
			t.Errorf("%s: the delivery was modified", name)
		}
		// The stub of a message too large to store is redacted too.
		if s := keptRecord(t, orig, red, true, tc.key...); s.Headers()["authorization"] != redactedValue || !slices.Equal(s.Envelope.Redacted, want) {
			t.Errorf("%s: stub headers %v, redacted %q", name, s.Headers(), s.Envelope.Redacted)
		}
	}
}

// A body over max_body_bytes (or not JSON) is kept as received, as the
// runtime keeps it: the record says why, and its headers are redacted.
func TestKeeperRedactionFailureIsRecorded(t *testing.T) {
	t.Parallel()
	d := forgedDelivery(t, true)
	d.Headers["authorization"] = "secret-auth"
	d.Body = []byte(`{"card":"secret-card","pad":"` + strings.Repeat("x", 64) + `"}`)
	r := keptRecord(t, d, &Redaction{Headers: []string{"authorization"}, Fields: []string{"/card"}, MaxBodyBytes: 32}, false, "the consumers' key, 32 bytes....")
	if !bytes.Equal(r.Body, d.Body) || r.Headers()["authorization"] != redactedValue ||
		!strings.Contains(r.Envelope.RedactionFailed, "max_body_bytes") || !strings.Contains(keeperNote(r.Envelope), "max_body_bytes") {
		t.Fatalf("body %s, headers %v, envelope %+v", r.Body, r.Headers(), r.Envelope)
	}
}

// Records whose idempotency key was redacted are not one message's
// history: the key reads "[redacted]" in every one of them.
func TestHistoryIgnoresRedactedIdempotencyKeys(t *testing.T) {
	t.Parallel()
	rec := func(id, msg string) *Record {
		return &Record{ID: id, Properties: Properties{MessageID: msg}, Envelope: Envelope{IdempotencyKey: redactedValue}}
	}
	a, b, again := rec("a", "m-1"), rec("b", "m-2"), rec("c", "m-1")
	s := &Snapshot{Records: []*Record{a, b, again}}
	if h := s.History(a); len(h) != 1 || h[0] != again {
		t.Fatalf("history of a: %v", h)
	}
}
