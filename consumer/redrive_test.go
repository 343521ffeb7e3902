package consumer

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/config"
	"github.com/dlxbridge/dlxbridge/quarantine"
	"github.com/dlxbridge/dlxbridge/triage"
	"github.com/dlxbridge/dlxbridge/wire"
)

// setupRedrive is setup for a queue whose quarantine allows one replay
// per message, with the runtime keeping its records, and the consumers'
// key for replays.
func setupRedrive(t *testing.T, redact ...string) (*testBundle, *triage.Signer) {
	t.Helper()
	b := setup(t, func(q *config.Queue) { one := 1; q.Quarantine.MaxRedrives = &one; q.Quarantine.Redact.Fields = redact })
	b.cfg.hooks.keeper = true
	signer, err := triage.NewSigner([]byte(testSigningKey))
	must(t, err)
	return b, signer
}

// A header is evidence, never a command: a plain producer that sets
// dlxbridge-redrive-count on its own message, which the runtime then
// quarantines (schema-invalid), does not make it look replayed. With the
// consumers' key its record has no prior replays, the claim is kept as a
// note, the envelope does not carry it, and replay does not refuse it as
// over its redrive budget.
func TestForgedRedriveCountIsNoPriorReplay(t *testing.T) {
	t.Parallel()
	b, signer := setupRedrive(t)
	b.start(func(c *Consumer) {
		must(t, c.Handle(b.queue.Name, testType, HandlerFunc(func(ctx context.Context, m *Message) error { return nil })))
	})
	b.publish([]byte(`{"id": 42, "unexpected": true}`), amqp.Publishing{MessageId: "m-forged-count",
		Headers: amqp.Table{wire.HeaderRedriveCount: int64(99)}})
	b.waitOutcome(OutcomeQuarantined, 10*time.Second)

	in := &quarantine.Inspector{Conn: b.env.Dial("inspector"), Config: b.file}
	r := waitRecords(t, in, 1).Records[0]
	if r.Redrives != 0 {
		t.Errorf("record shows %d prior replays, want 0 (the producer's claim)", r.Redrives)
	}
	if _, kept := r.Headers()[wire.HeaderRedriveCount]; kept {
		t.Errorf("the envelope carries the claimed count: %v", r.Headers()[wire.HeaderRedriveCount])
	}
	want := `redrive count not verified: the message claimed "99" prior replays (` + wire.HeaderRedriveCount + `)`
	if !strings.Contains(strings.Join(r.Envelope.Notes, "\n"), want) {
		t.Errorf("notes %q, want the claim (%s)", r.Envelope.Notes, want)
	}
	if !r.Envelope.Verified {
		t.Errorf("runtime's envelope not verified: %+v", r.Envelope)
	}

	for _, key := range []*triage.Signer{nil, signer} {
		rp := &quarantine.Replayer{Conn: b.env.Dial("replayer"), Config: b.file, Registry: b.registry, Signer: key}
		res, err := rp.Replay(context.Background(), quarantine.ReplayOptions{Filter: quarantine.Filter{IDs: []string{r.ID}}, DryRun: true,
			Patch: &quarantine.Patch{Merge: []byte(`{"id":"fixed","unexpected":null}`)}})
		if err != nil || len(res.OverBudget) != 0 || len(res.Plan) != 1 || res.Plan[0].Refused != "" || res.Plan[0].Redrives != 1 {
			t.Fatalf("replay (key %v): %+v %v", key != nil, res, err)
		}
	}
}

// A genuine replay's count survives: the replayed message fails again and
// is quarantined again, by the runtime after its retries (the count and
// its signature travel through the retry copies, and the envelope keeps
// the count under the envelope signature) or by the broker (a copy rejected from a plain
// queue into the quarantine: the replay's redrive signature vouches); its
// new record reads 1 and replay refuses it at max_redrives 1. With
// redaction the record's body is not the one the replay signed: the
// envelope signature vouches for the count.
func TestReplayedCountSurvivesAnotherQuarantine(t *testing.T) {
	t.Parallel()
	for _, by := range []string{"runtime", "broker", "redacted", "broker-redacted"} {
		t.Run(by, func(t *testing.T) {
			t.Parallel()
			var redact []string
			redacted, broker := strings.HasSuffix(by, "redacted"), strings.HasPrefix(by, "broker")
			if redacted {
				redact = []string{"/email"}
			}
			b, signer := setupRedrive(t, redact...)
			// In the runtime the message is retried first: the count and its
			// signature travel through the retry copies.
			fail, failed := triage.Permanent(errors.New("customer unknown")), []Outcome{OutcomeQuarantined}
			if by == "runtime" {
				fail, failed = errors.New("customer service down"), []Outcome{OutcomeRetried, OutcomeRetried, OutcomeQuarantined}
			}
			b.start(func(c *Consumer) {
				must(t, c.Handle(b.queue.Name, testType, HandlerFunc(func(ctx context.Context, m *Message) error { return fail })))
			})
			waitFailed := func() {
				for _, o := range failed {
					b.waitOutcome(o, 10*time.Second)
				}
			}
			b.publishJSON(map[string]any{"id": "j-1", "email": "a@example.com"}, amqp.Publishing{MessageId: "m-" + by})
			waitFailed()
			in := &quarantine.Inspector{Conn: b.env.Dial("inspector"), Config: b.file}
			first := waitRecords(t, in, 1).Records[0]

			rp := &quarantine.Replayer{Conn: b.env.Dial("replayer"), Config: b.file, Registry: b.registry, Signer: signer}
			opts := quarantine.ReplayOptions{Filter: quarantine.Filter{IDs: []string{first.ID}}, Reason: "try again"}
			var raw string
			if redacted {
				// The replay sends (and signs) the address again; the
				// record of its failure keeps it redacted (by the runtime,
				// or by the keeper for a broker dead letter).
				opts.Patch = &quarantine.Patch{Merge: []byte(`{"email":"b@example.com"}`)}
			}
			if broker {
				// A plain queue that dead-letters into the work queue's
				// quarantine, as a crash-looping message would be.
				raw = b.env.Name("raw")
				ch := b.env.Channel("raw")
				if _, err := ch.QueueDeclare(raw, true, false, false, false, amqp.Table{"x-queue-type": "quorum", "x-dead-letter-exchange": b.wq.DeadExchange}); err != nil {
					t.Fatal(err)
				}
				opts.ToQueue = raw
			}
			res, err := rp.Replay(context.Background(), opts)
			if err != nil || len(res.Sent) != 1 {
				t.Fatalf("replay: %+v %v", res, err)
			}
			if broker {
				ch := b.env.Channel("raw-rejecter")
				d, ok, err := ch.Get(raw, false)
				if err != nil || !ok {
					t.Fatalf("get %s: %v %v", raw, ok, err)
				}
				must(t, d.Reject(false))
			} else {
				waitFailed()
			}
			var again *quarantine.Record
			for _, r := range waitRecords(t, in, 2).Records {
				if r.ID != first.ID {
					again = r
				}
			}
			wantSource := quarantine.SourceBridge
			if broker {
				wantSource = quarantine.SourceBroker
			}
			if redacted && !strings.Contains(string(again.Body), redactedValue) {
				t.Fatalf("record body %s: not redacted", again.Body)
			}
			// The runtime's envelope vouches for the count after its
			// redaction; the keeper, which redacts a broker dead letter,
			// signs the count again over the body it keeps.
			redrive := signer.VerifyRedrive(again.Properties.MessageID, again.Body, again.Headers())
			if by == "redacted" && (redrive.Valid || !again.Envelope.Verified) || by == "broker-redacted" && !redrive.Valid {
				t.Fatalf("body %s: redrive signature %+v, envelope verified %v", again.Body, redrive, again.Envelope.Verified)
			}
			if again.Redrives != 1 || again.Envelope.Source != wantSource || by == "runtime" && again.Envelope.Attempts != 3 {
				t.Fatalf("record after one replay: %d prior replays, source %s, notes %q; want 1, %s",
					again.Redrives, again.Envelope.Source, again.Envelope.Notes, wantSource)
			}
			for _, key := range []*triage.Signer{signer, nil} {
				rp := &quarantine.Replayer{Conn: b.env.Dial("replayer"), Config: b.file, Registry: b.registry, Signer: key}
				res, err = rp.Replay(context.Background(), quarantine.ReplayOptions{Filter: quarantine.Filter{IDs: []string{again.ID}}, DryRun: true})
				if err != nil || len(res.OverBudget) != 1 || !strings.Contains(res.Plan[0].Refused, "over its redrive budget: replayed 1 time(s), max_redrives is 1") {
					t.Fatalf("second replay (key %v): %+v %v", key != nil, res, err)
				}
			}
		})
	}
}

// Without a configured key nothing can be verified, and the budget counts
// what a message claims, as the keeper then keeps every envelope as
// claimed: a runtime signing with a random key keeps a replayed count in
// its envelope (unverifiable, not stripped), so a message replayed without
// the key that fails again reads 1 and is refused at max_redrives 1. (The
// orderservice example runs this way.)
func TestKeylessRuntimeKeepsTheReplayedCount(t *testing.T) {
	t.Parallel()
	b, _ := setupRedrive(t)
	b.cfg.SigningKey = nil
	b.file.Security.SigningKeyEnv = "DLXBRIDGE_TEST_NEVER_SET_KEY"
	b.cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil)) // the random-key warning
	b.start(func(c *Consumer) {
		must(t, c.Handle(b.queue.Name, testType, HandlerFunc(func(ctx context.Context, m *Message) error {
			return triage.Permanent(errors.New("customer unknown"))
		})))
	})
	b.publishJSON(map[string]any{"id": "j-1"}, amqp.Publishing{MessageId: "m-keyless"})
	b.waitOutcome(OutcomeQuarantined, 10*time.Second)
	in := &quarantine.Inspector{Conn: b.env.Dial("inspector"), Config: b.file}
	first := waitRecords(t, in, 1).Records[0]

	rp := &quarantine.Replayer{Conn: b.env.Dial("replayer"), Config: b.file, Registry: b.registry}
	again := replayQuarantinedAgain(t, b, in, rp, first)
	if again.Redrives != 1 {
		t.Fatalf("record after one keyless replay: %d prior replays, notes %q; want 1", again.Redrives, again.Envelope.Notes)
	}
	res, err := rp.Replay(context.Background(), quarantine.ReplayOptions{Filter: quarantine.Filter{IDs: []string{again.ID}}, DryRun: true})
	if err != nil || len(res.OverBudget) != 1 {
		t.Fatalf("second replay: %+v %v", res, err)
	}
}

// replayQuarantinedAgain replays first's record with rp, waits until the
// runtime quarantines the replayed message again, and returns its new
// record.
func replayQuarantinedAgain(t *testing.T, b *testBundle, in *quarantine.Inspector, rp *quarantine.Replayer, first *quarantine.Record) *quarantine.Record {
	t.Helper()
	res, err := rp.Replay(context.Background(), quarantine.ReplayOptions{Filter: quarantine.Filter{IDs: []string{first.ID}}, Reason: "try again"})
	if err != nil || len(res.Sent) != 1 {
		t.Fatalf("replay: %+v %v", res, err)
	}
	b.waitOutcome(OutcomeQuarantined, 10*time.Second)
	for _, r := range waitRecords(t, in, 2).Records {
		if r.ID != first.ID {
			return r
		}
	}
	t.Fatal("no second record")
	return nil
}
