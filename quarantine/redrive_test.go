package quarantine

import (
	"maps"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/triage"
	"github.com/dlxbridge/dlxbridge/wire"
)

// A redrive count is trusted only under a signature made with the key: the
// replay's redrive signature, or a valid envelope signature of version 2
// (which covers the count). A count a producer set is no prior replay and
// is kept as a note; a version 1 envelope does not vouch for a count.
func TestRedriveCountNeedsASignature(t *testing.T) {
	t.Parallel()
	signer, err := triage.NewSigner([]byte("the consumers' key, 32 bytes...."))
	if err != nil {
		t.Fatal(err)
	}
	body := []byte(`{"id":"j-1"}`)
	deliver := func(h amqp.Table) *amqp.Delivery {
		return &amqp.Delivery{Headers: h, Exchange: "orders.dead", MessageId: "m-1", Body: body}
	}
	check := func(name string, d *amqp.Delivery, want int, noted bool) {
		t.Helper()
		env, _ := ReadVerified(d, signer)
		n, note := trustedRedrives(d, signer, env.Verified)
		if n != want || (note != "") != noted {
			t.Errorf("%s: count %d note %q, want %d (noted %v)", name, n, note, want, noted)
		}
		if noted && !strings.HasPrefix(note, `redrive count not verified: the message claimed "99" prior replays (dlxbridge-redrive-count)`) {
			t.Errorf("%s: note %q", name, note)
		}
	}
	check("no count", deliver(amqp.Table{}), 0, false)
	check("a producer's count", deliver(amqp.Table{wire.HeaderRedriveCount: int64(99)}), 0, true)

	// A replay's count, signed: survives as long as the id and body do.
	replayed := amqp.Table{wire.HeaderRedriveCount: int64(99)}
	replayed[wire.HeaderRedriveSignature] = signer.SignRedrive("m-1", body, replayed)
	check("a signed replay count", deliver(replayed), 99, false)
	moved := deliver(replayed)
	moved.Body = []byte(`{"id":"j-2"}`)
	if n, note := trustedRedrives(moved, signer, false); n != 0 || note == "" {
		t.Errorf("a redrive signature moved to another body: %d %q", n, note)
	}
	// Without a key nothing can be verified: the claim counts (and the
	// caller says so).
	if n, note := trustedRedrives(deliver(amqp.Table{wire.HeaderRedriveCount: int64(99)}), nil, false); n != 99 || note != "" {
		t.Errorf("without a key: %d %q", n, note)
	}

	// The runtime's envelope (version 2), which kept the count: the
	// envelope signature vouches, even without a redrive signature (the
	// body was redacted).
	env := Envelope{Source: SourceBridge, Class: "permanent", Reason: "r", Attempts: 1}
	eh := amqp.Table{wire.HeaderRedriveCount: int64(99)}
	env.Apply(eh)
	signEnvelope(signer, eh, "orders.dead", "m-1", body)
	check("a signed envelope's count", deliver(eh), 99, false)
	raised := maps.Clone(eh)
	raised[wire.HeaderRedriveCount] = int64(100)
	if ev, _ := ReadVerified(deliver(raised), signer); ev.Verified {
		t.Error("an envelope with a raised count still verified")
	}
	// A version 1 envelope (signed before the count was covered) verifies,
	// but does not vouch for a count beside it.
	v1 := amqp.Table{}
	env.Apply(v1)
	v1[wire.HeaderEnvelope] = int32(1)
	v1[wire.HeaderEnvelopeSignature] = signer.SignEnvelope(envelopeSubject("orders.dead", "m-1", body), v1, envelopeFieldsV1)
	v1[wire.HeaderRedriveCount] = int64(99)
	if ev, _ := ReadVerified(deliver(v1), signer); !ev.Verified {
		t.Fatal("a version 1 envelope no longer verifies")
	}
	check("a count beside a version 1 envelope", deliver(v1), 0, true)
}

// A replay signs the count it sets whatever the record's origin (a broker
// dead letter's too), on the body it sends, and counts from the prior
// count it is given.
func TestReplaySignsTheRedriveCount(t *testing.T) {
	t.Parallel()
	signer, err := triage.NewSigner([]byte("the consumers' key, 32 bytes...."))
	if err != nil {
		t.Fatal(err)
	}
	body := []byte(`{}`)
	r := &Record{Envelope: Envelope{Source: SourceBroker}, Properties: Properties{MessageID: "m-1"}, Body: body, Exchange: "orders.dead",
		headers: amqp.Table{wire.HeaderRedriveCount: int64(99), wire.HeaderRedriveSignature: "v1:forged"}}
	patched := []byte(`{"fixed":true}`)
	h := (&Replayer{Signer: signer}).message(r, patched, 2, "why", "orders", nil, "run1").Headers
	if h[wire.HeaderRedriveCount] != int64(3) || !signer.VerifyRedrive("m-1", patched, h).Valid {
		t.Fatalf("replayed count %v, signature %v", h[wire.HeaderRedriveCount], signer.VerifyRedrive("m-1", patched, h))
	}
	h = (&Replayer{}).message(r, body, 0, "why", "orders", nil, "run1").Headers
	if _, present := h[wire.HeaderRedriveSignature]; present || h[wire.HeaderRedriveCount] != int64(1) {
		t.Fatalf("without a key: %v", h)
	}
}
