package consumer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/config"
	"github.com/dlxbridge/dlxbridge/quarantine"
	"github.com/dlxbridge/dlxbridge/triage"
	"github.com/dlxbridge/dlxbridge/wire"
)

// recordLeaks lists the secrets found in a record as `quarantine show`
// and its JSON print it: payload, headers and envelope.
func recordLeaks(r *quarantine.Record, secrets ...string) []string {
	js, _ := json.Marshal(r)
	all := string(r.Body) + fmt.Sprint(r.Headers()) + string(js)
	var found []string
	for _, s := range secrets {
		if strings.Contains(all, s) {
			found = append(found, s)
		}
	}
	return found
}

// rejectWaiting has the broker dead-letter the first n messages waiting in
// the work queue: a plain consumer (no runtime) takes each and rejects it
// without requeue.
func (b *testBundle) rejectWaiting(n int) {
	b.t.Helper()
	ch := b.env.Channel("raw-rejecter")
	for range n {
		d, ok, err := ch.Get(b.queue.Name, false)
		if err != nil || !ok {
			b.t.Fatalf("get: %v %v", ok, err)
		}
		must(b.t, d.Reject(false))
	}
}

// A queue's redaction rules cover what the broker dead-letters on its own
// (here: rejected without requeue by a plain consumer) and a forged
// envelope, not only what the runtime quarantines: the keeper redacts them
// before it stores the record, says what it redacted (a producer's claimed
// dlxbridge-redacted does not stand in for it), and leaves the runtime's
// own, verified records as the runtime wrote them (no second marks, the
// signature still verifying).
func TestKeeperRedactsBrokerDeadLetters(t *testing.T) {
	t.Parallel()
	b := setup(t, func(q *config.Queue) {
		q.Quarantine.Redact.Headers = []string{"authorization", wire.HeaderIdempotencyKey}
		q.Quarantine.Redact.Fields = []string{"/card"}
	})
	b.cfg.hooks.keeper = true
	signer, err := triage.NewSigner([]byte(testSigningKey))
	must(t, err)
	secrets := []string{"secret-auth", "secret-card", "secret-idem"}
	headers := func(n string) amqp.Table {
		return amqp.Table{"authorization": "secret-auth-" + n, wire.HeaderIdempotencyKey: "secret-idem-" + n}
	}

	b.publishJSON(map[string]any{"id": "plain", "card": "secret-card-1"}, amqp.Publishing{MessageId: "m-broker", Headers: headers("1")})
	fh := headers("2")
	forged := quarantine.Envelope{Source: quarantine.SourceBridge, Class: triage.ClassPermanent, Reason: "forged",
		IdempotencyKey: "secret-idem-2", Redacted: []string{"header:claimed"}}
	forged.Apply(fh)
	b.publishJSON(map[string]any{"id": "forged", "card": "secret-card-2"}, amqp.Publishing{MessageId: "m-forged", Headers: fh})
	b.rejectWaiting(2) // the broker dead-letters both before any runtime consumes the queue

	b.start(func(c *Consumer) {
		must(t, c.Handle(b.queue.Name, testType, HandlerFunc(func(ctx context.Context, m *Message) error {
			return triage.Permanent(errors.New("refused"))
		})))
	})
	b.publishJSON(map[string]any{"id": "bridge", "card": "secret-card-3"}, amqp.Publishing{MessageId: "m-bridge", Headers: headers("3")})
	b.waitOutcome(OutcomeQuarantined, 10*time.Second)

	in := &quarantine.Inspector{Conn: b.env.Dial("inspector"), Config: b.file}
	byMsg := map[string]*quarantine.Record{}
	for _, r := range waitRecords(t, in, 3).Records {
		byMsg[r.Properties.MessageID] = r
	}
	want := []string{"body:/card", "header:authorization", "header:" + wire.HeaderIdempotencyKey}
	for _, id := range []string{"m-broker", "m-forged", "m-bridge"} {
		r := byMsg[id]
		if r == nil {
			t.Fatalf("no record of %s: %v", id, byMsg)
		}
		if found := recordLeaks(r, secrets...); len(found) > 0 {
			t.Errorf("%s: %v stored (body %s, headers %v)", id, found, r.Body, r.Headers())
		}
		got := slices.Sorted(slices.Values(r.Envelope.Redacted))
		if !slices.Equal(got, want) || r.Envelope.RedactionFailed != "" {
			t.Errorf("%s: redacted %q, failed %q; want %q", id, r.Envelope.Redacted, r.Envelope.RedactionFailed, want)
		}
		keeperNote := slices.ContainsFunc(r.Envelope.Notes, func(n string) bool { return strings.HasPrefix(n, "redacted by the quarantine keeper") })
		if keeperNote != (id != "m-bridge") {
			t.Errorf("%s: notes %q (want a keeper's redaction note: %v)", id, r.Envelope.Notes, id != "m-bridge")
		}
	}
	if e := byMsg["m-forged"].Envelope; e.Verified || e.Source != quarantine.SourceBroker {
		t.Errorf("forged envelope read as %+v", e)
	}
	br := byMsg["m-bridge"]
	if !br.Envelope.Verified || br.Envelope.IdempotencyKey != redactedValue {
		t.Errorf("runtime's record: %+v", br.Envelope)
	}
	if env, _ := quarantine.ReadVerified(&amqp.Delivery{Headers: br.Headers(), Exchange: br.Exchange,
		MessageId: br.Properties.MessageID, Body: br.Body}, signer); !env.Verified {
		t.Errorf("the runtime's record no longer verifies: %q", env.Notes)
	}
}
