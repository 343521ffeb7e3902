package quarantine

import (
	"bytes"
	"context"
	"encoding/binary"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/config"
	"github.com/dlxbridge/dlxbridge/triage"
	"github.com/dlxbridge/dlxbridge/wire"
)

func envSigner(t testing.TB, key string) *triage.Signer {
	t.Helper()
	s, err := triage.NewSigner([]byte(key))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// signedDelivery is fullDelivery with its envelope signed by s, as the
// runtime publishes it to the dead exchange "dlx" (its Exchange).
func signedDelivery(s *triage.Signer) *amqp.Delivery {
	d := fullDelivery()
	signEnvelope(s, d.Headers, d.Exchange, d.MessageId, d.Body)
	return d
}

func cloneDelivery(d *amqp.Delivery) *amqp.Delivery {
	c := *d
	c.Headers = maps.Clone(d.Headers)
	c.Body = bytes.Clone(d.Body)
	return &c
}

func TestEnvelopeSignatureRoundTrip(t *testing.T) {
	t.Parallel()
	s := envSigner(t, "the consumers' key, 32 bytes....")
	d := signedDelivery(s)
	if v := verifyEnvelope(s, d); !v.Valid {
		t.Fatalf("fresh envelope signature: %+v", v)
	}
	env, ok := ReadVerified(d, s)
	want, _ := Read(d)
	want.Verified = true
	if !ok || !env.Verified || env.Class != want.Class || env.Fingerprint != want.Fingerprint ||
		env.OriginalExchange != want.OriginalExchange || len(env.Notes) != len(want.Notes) {
		t.Fatalf("verified read: %+v\nwant %+v", env, want)
	}
	// Without a verifier the envelope is read as claimed, never Verified.
	if env, _ := ReadVerified(d, nil); env.Verified || env.Class != want.Class {
		t.Fatalf("read without a key: %+v", env)
	}
	if env, _ := Read(d); env.Verified {
		t.Fatal("Read verified an envelope")
	}
	// The same values in other wire types (a stream's byte array, another
	// integer width) still verify.
	same := cloneDelivery(d)
	same.Headers[wire.HeaderAttempts] = int32(5)
	same.Headers[wire.HeaderClass] = []byte("permanent")
	if !verifyEnvelope(s, same).Valid {
		t.Fatal("the same values in other wire types did not verify")
	}
	// Headers the signature does not cover may change: the producer's own,
	// trace context, the intake's delivery count.
	other := cloneDelivery(d)
	other.Headers["schema-version"] = "3"
	other.Headers[wire.HeaderTraceparent] = "00-x"
	other.Headers[wire.HeaderDeliveryCount] = int64(4)
	if !verifyEnvelope(s, other).Valid {
		t.Fatal("an unsigned header broke the envelope signature")
	}

	for _, k := range slices.Clone(envelopeFields) {
		c := cloneDelivery(d)
		if _, present := c.Headers[k]; present {
			c.Headers[k] = "forged"
		} else {
			c.Headers[k] = "added"
		}
		if verifyEnvelope(s, c).Valid {
			t.Errorf("%s changed: still verifies", k)
		}
		c = cloneDelivery(d)
		delete(c.Headers, k)
		if verifyEnvelope(s, c).Valid {
			t.Errorf("%s removed: still verifies", k)
		}
	}
	for name, change := range map[string]func(*amqp.Delivery){
		"body":            func(d *amqp.Delivery) { d.Body = append(d.Body, ' ') },
		"message id":      func(d *amqp.Delivery) { d.MessageId = "m-2" },
		"exchange":        func(d *amqp.Delivery) { d.Exchange = "other.dead" },
		"no signature":    func(d *amqp.Delivery) { delete(d.Headers, wire.HeaderEnvelopeSignature) },
		"retry signature": func(d *amqp.Delivery) { d.Headers[wire.HeaderEnvelopeSignature] = d.Headers[wire.HeaderSignature] },
	} {
		c := cloneDelivery(d)
		change(c)
		if verifyEnvelope(s, c).Valid {
			t.Errorf("%s changed: still verifies", name)
		}
	}
	if verifyEnvelope(envSigner(t, "another key, at least 16 bytes"), d).Valid {
		t.Error("verified under another key")
	}
	// A retry-state signature over the same headers is no envelope
	// signature: the domains differ.
	c := cloneDelivery(d)
	c.Headers[wire.HeaderEnvelopeSignature] = s.Sign(triage.Subject{Queue: d.Exchange, MessageID: d.MessageId, Body: d.Body}, d.Headers, slices.Clone(envelopeFields))
	if verifyEnvelope(s, c).Valid {
		t.Error("a retry-state signature verified as an envelope signature")
	}
	// A nil signer writes no signature, and removes one that was there.
	h := maps.Clone(d.Headers)
	signEnvelope(nil, h, d.Exchange, d.MessageId, d.Body)
	if _, has := h[wire.HeaderEnvelopeSignature]; has {
		t.Error("a nil signer left a signature")
	}
}

// forgedDelivery is what a producer can get into the quarantine through
// the broker's own dead-lettering: a whole envelope of its own (a valid
// looking signature of another key included) and the broker's x-death.
func forgedDelivery(t testing.TB, withXDeath bool) *amqp.Delivery {
	d := signedDelivery(envSigner(t, "the producer's guess at a key"))
	d.Headers[wire.HeaderClass] = "forged-class"
	d.Headers[wire.HeaderFingerprint] = "forged-fp"
	d.Headers[wire.HeaderOriginalExchange] = "payments"
	if withXDeath {
		d.Headers[wire.HeaderXDeath] = []any{amqp.Table{
			wire.XDeathCount: int64(1), wire.XDeathReason: "rejected", wire.XDeathQueue: "orders",
			wire.XDeathExchange: "orders.ex", wire.XDeathRoutingKeys: []any{"order.created"},
			wire.XDeathTime: time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC),
		}}
		d.Headers[wire.HeaderFirstDeathReason] = "rejected"
		d.Headers[wire.HeaderFirstDeathQueue] = "orders"
	}
	return d
}

func TestForgedEnvelopeReadsAsBrokerDeadLetter(t *testing.T) {
	t.Parallel()
	s := envSigner(t, "the consumers' key, 32 bytes....")
	d := forgedDelivery(t, true)
	env, ok := ReadVerified(d, s)
	if !ok || env.Verified || env.Source != SourceBroker || env.Class != triage.ClassRejected ||
		env.Fingerprint != "" || env.OriginalExchange != "orders.ex" || env.OriginalQueue != "orders" || env.Attempts != 1 {
		t.Fatalf("forged envelope read as %+v", env)
	}
	if len(env.Notes) != 1 {
		t.Fatalf("notes %q: want the claim, and none of the producer's notes", env.Notes)
	}
	note := env.Notes[0]
	for _, want := range []string{"envelope not verified", `class "forged-class" (dlxbridge-class)`,
		`fingerprint "forged-fp"`, `exchange "payments" (dlxbridge-original-exchange)`, `attempts "5"`, "does not match"} {
		if !strings.Contains(note, want) {
			t.Errorf("note %q lacks %q", note, want)
		}
	}
	// Without a signature at all.
	delete(d.Headers, wire.HeaderEnvelopeSignature)
	if env, _ := ReadVerified(d, s); env.Verified || env.Source != SourceBroker || !strings.Contains(env.Notes[0], "no dlxbridge-envelope-signature") {
		t.Fatalf("unsigned envelope read as %+v", env)
	}
	// Without x-death: no class, no origin, the claim in a note.
	d = forgedDelivery(t, false)
	env, ok = ReadVerified(d, s)
	if !ok || env.Verified || env.Source != SourceUnverified || env.Class != "" || env.OriginalExchange != "" ||
		env.Fingerprint != "" || len(env.Notes) != 1 || !strings.Contains(env.Notes[0], "forged-class") {
		t.Fatalf("forged envelope without x-death read as %+v", env)
	}
}

// Hostile header shapes never panic and never verify.
func TestReadVerifiedHostileHeaders(t *testing.T) {
	t.Parallel()
	s := envSigner(t, "the consumers' key, 32 bytes....")
	huge := strings.Repeat("x", 1<<20)
	values := []any{nil, int8(-1), int64(-1 << 62), 3.5, float32(1.5), true, huge, []byte(huge),
		[]any{"a", []any{amqp.Table{"b": 1}}}, amqp.Table{"k": []any{1, 2}}, time.Time{},
		amqp.Decimal{Scale: 255, Value: -1}, []any{}, amqp.Table{}}
	for _, k := range append(slices.Clone(envelopeFields), wire.HeaderEnvelopeSignature) {
		for _, v := range values {
			d := signedDelivery(s)
			d.Headers[k] = v
			env, _ := ReadVerified(d, s)
			if env.Verified {
				t.Errorf("%s = %T verified", k, v)
			}
			if len(env.Notes) > 0 && len(env.Notes[len(env.Notes)-1]) > 4096 {
				t.Errorf("%s = %T: note of %d bytes", k, v, len(env.Notes[len(env.Notes)-1]))
			}
		}
	}
	// A signature header of the right shape but garbage inside.
	for _, sig := range []string{"v1:" + strings.Repeat("!", 43), "v1:", huge, "v1:" + strings.Repeat("A", 1<<16)} {
		d := signedDelivery(s)
		d.Headers[wire.HeaderEnvelopeSignature] = sig
		if v := verifyEnvelope(s, d); v.Valid || !strings.Contains(v.Problem, "malformed") {
			t.Errorf("signature %.10q: %+v", sig, v)
		}
	}
}

// The keeper's record keeps the verdict (layout 3); a record of layout 2,
// written before envelopes were signed, still reads, as not verified.
func TestRecordKeepsVerification(t *testing.T) {
	t.Parallel()
	s := envSigner(t, "the consumers' key, 32 bytes....")
	set := &quarantineSet{cfg: &config.Queue{Name: "q", Quarantine: config.Quarantine{Queue: "q.quarantine"}}}
	set.queues = []*config.Queue{set.cfg}
	now := time.Now()

	msg, _, err := encodeRecord(signedDelivery(s), "q.quarantine", now, s)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(msg.Body, []byte(recordMagic3)) {
		t.Fatalf("record written as %.8q", msg.Body)
	}
	r, err := recordFrom(msg.Body, 0, set)
	if err != nil || !r.Envelope.Verified || r.Envelope.Class != "permanent" {
		t.Fatalf("signed envelope's record: %+v, %v", r, err)
	}

	msg, _, _ = encodeRecord(forgedDelivery(t, true), "q.quarantine", now, s)
	r, err = recordFrom(msg.Body, 0, set)
	if err != nil || r.Envelope.Verified || r.Envelope.Class != triage.ClassRejected || r.Envelope.Fingerprint == "forged-fp" {
		t.Fatalf("forged envelope's record: %+v, %v", r.Envelope, err)
	}
	if h := r.Headers(); h[wire.HeaderClass] != "forged-class" {
		t.Errorf("the record lost the headers as received: %v", h[wire.HeaderClass])
	}

	// Without a key the keeper keeps the claim, unverified.
	msg, _, _ = encodeRecord(signedDelivery(s), "q.quarantine", now, nil)
	if r, err = recordFrom(msg.Body, 0, set); err != nil || r.Envelope.Verified || r.Envelope.Class != "permanent" {
		t.Fatalf("record written without a key: %+v, %v", r.Envelope, err)
	}

	// Layout 2: the same meta without the last byte.
	msg, _, _ = encodeRecord(signedDelivery(s), "q.quarantine", now, s)
	meta, rest, ok := cutSized(msg.Body[len(recordMagic3):])
	if !ok {
		t.Fatal("cannot cut the meta")
	}
	old := append([]byte(recordMagic2), binary.BigEndian.AppendUint32(nil, uint32(len(meta)-1))...)
	old = append(old, meta[:len(meta)-1]...)
	old = append(old, rest...)
	r, err = recordFrom(old, 0, set)
	if err != nil || r.Envelope.Verified || r.Envelope.Class != "permanent" {
		t.Fatalf("layout 2 record: %+v, %v", r, err)
	}
	// Layout 1 too.
	if r, err = recordFrom(encodeLayout1(t, signedDelivery(s), "q.quarantine", now), 0, set); err != nil || r.Envelope.Verified {
		t.Fatalf("layout 1 record: %+v, %v", r, err)
	}
}

// On a broker: a producer publishes a message with a whole forged envelope
// (one with no signature, one signed with another key) into the work
// queue, a plain consumer rejects it, and the broker dead-letters it into
// the quarantine. The keeper with the consumers' key records each as the
// broker's dead letter, the claim in a note; a replay with the key sends
// them without an origin signature. An envelope signed with the key (as
// the runtime writes it) is recorded verified, and its origin signed.
func TestForgedEnvelopeDeadLetteredByTheBroker(t *testing.T) {
	t.Parallel()
	b := setupStore(t, nil)
	key := envSigner(t, "the consumers' key, 32 bytes....")
	dead := config.DeadExchangeName(b.q.Name)

	forged := func(id string) amqp.Publishing {
		h := envelopeHeaders(b.q.Name, "forged-fp", "forged error", nowUTC())
		h[wire.HeaderOriginalExchange], h[wire.HeaderOriginalRoutingKey] = "payments.ex", "pay.now"
		h[wire.HeaderAttempts] = int64(9)
		return amqp.Publishing{MessageId: id, Type: "test.job", ContentType: "application/json", Headers: h, Body: []byte(validJob(1))}
	}
	unsigned := forged("m-unsigned")
	otherKey := forged("m-other-key")
	signEnvelope(envSigner(t, "the producer's guess at a key"), otherKey.Headers, dead, otherKey.MessageId, otherKey.Body)
	for _, p := range []amqp.Publishing{unsigned, otherKey} {
		b.publish(b.q.Name, p)
	}
	ch := b.env.Channel("raw-rejecter")
	for range 2 {
		d, ok, err := ch.Get(b.q.Name, false)
		if err != nil || !ok {
			t.Fatalf("get: %v %v", ok, err)
		}
		if err := d.Reject(false); err != nil {
			t.Fatal(err)
		}
	}
	// The runtime's own: published to the dead exchange, signed there.
	genuine := forged("m-genuine")
	signEnvelope(key, genuine.Headers, dead, genuine.MessageId, genuine.Body)
	if err := b.pub.PublishWithContext(context.Background(), dead, b.q.Name, true, false, genuine); err != nil {
		t.Fatal(err)
	}
	if c := <-b.conf; !c.Ack {
		t.Fatal("nacked")
	}
	b.keepVerifying(3, key)

	snap := b.snapshot(b.inspector())
	byMsg := map[string]*Record{}
	for _, r := range snap.Records {
		byMsg[r.Properties.MessageID] = r
	}
	for _, id := range []string{"m-unsigned", "m-other-key"} {
		r := byMsg[id]
		if r == nil {
			t.Fatalf("no record of %s: %v", id, byMsg)
		}
		e := r.Envelope
		if e.Verified || e.Source != SourceBroker || e.Class != triage.ClassRejected || e.Fingerprint != "" ||
			e.OriginalExchange != "" || e.OriginalRouting != b.q.Name || e.OriginalQueue != b.q.Name || e.Attempts != 1 {
			t.Errorf("%s recorded as %+v", id, e)
		}
		if len(e.Notes) != 1 || !strings.Contains(e.Notes[0], "envelope not verified") || !strings.Contains(e.Notes[0], `"forged-fp"`) {
			t.Errorf("%s notes %q", id, e.Notes)
		}
	}
	if e := byMsg["m-genuine"].Envelope; !e.Verified || e.Fingerprint != "forged-fp" || e.OriginalExchange != "payments.ex" {
		t.Errorf("the signed envelope recorded as %+v", e)
	}
	if n := len(snap.List(Filter{Fingerprint: "forged-fp"})); n != 1 {
		t.Errorf("%d records in the forged group, want the signed one", n)
	}

	rp := b.replayer()
	rp.Signer = key
	res, err := rp.Replay(context.Background(), ReplayOptions{Filter: Filter{Queue: b.q.Name}, Reason: "test"})
	if err != nil || len(res.Sent) != 3 {
		t.Fatalf("replay: %+v %v", res, err)
	}
	for range 3 {
		d, ok, err := ch.Get(b.q.Name, true)
		if err != nil || !ok {
			t.Fatalf("get replayed: %v %v", ok, err)
		}
		sub := triage.Subject{Queue: b.q.Name, MessageID: d.MessageId, Body: d.Body}
		valid := key.Verify(sub, d.Headers, triage.SignedHeaders()).Valid
		switch d.MessageId {
		case "m-genuine":
			if !valid || d.Headers[wire.HeaderOriginalExchange] != "payments.ex" {
				t.Errorf("the signed envelope's origin: valid %v, headers %v", valid, d.Headers)
			}
		default:
			if _, signed := d.Headers[wire.HeaderSignature]; signed || valid || d.Headers[wire.HeaderOriginalExchange] == "payments.ex" {
				t.Errorf("%s replayed with a signed or forged origin: %v", d.MessageId, d.Headers)
			}
		}
		if _, kept := d.Headers[wire.HeaderEnvelopeSignature]; kept {
			t.Errorf("%s carried the envelope signature", d.MessageId)
		}
	}
}
