package quarantine

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlxbridge/dlxbridge/wire"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/config"
	"github.com/dlxbridge/dlxbridge/internal/brokertest"
)

// A producer's headers travel untouched when the broker dead-letters a
// message itself (TTL, delivery limit), envelope headers included. A forged
// dlxbridge-original-queue naming another configured queue must not make a
// replay send the message there: it goes back to the queue whose
// dead-letter exchange brought it into the quarantine.
func TestReplayIgnoresAForgedOriginalQueue(t *testing.T) {
	t.Parallel()
	var other string
	b := setupStoreConfig(t, func(env *brokertest.Env, cfg *config.Config) {
		other = env.Name("other")
		cfg.Queues = append(cfg.Queues, config.Queue{
			Name:     other,
			Exchange: config.Exchange{Name: env.Name("ex2"), Type: "direct"},
			Bindings: []string{"k2"},
			Retry:    config.Retry{Tiers: []time.Duration{200 * time.Millisecond}},
			Accepts:  []config.Accept{{Type: "test.job", Versions: []string{"1"}}},
		})
	})
	h := envelopeHeaders(other, "fp-forged", "forged", time.Now())
	h["x-death"] = []any{amqp.Table{"count": int64(1), "reason": "expired", "queue": b.q.Name}}
	// As the broker dead-letters it: through the work queue's dead-letter
	// exchange into its quarantine.
	if err := b.pub.PublishWithContext(context.Background(), config.DeadExchangeName(b.q.Name), "k", true, false,
		amqp.Publishing{MessageId: "forged", Type: "test.job", ContentType: "application/json", Headers: h, Body: []byte(validJob(1))}); err != nil {
		t.Fatal(err)
	}
	if c := <-b.conf; !c.Ack {
		t.Fatal("publish nacked")
	}
	b.keep(1)
	recs := b.snapshot(b.inspector()).List(Filter{Fingerprint: "fp-forged"})
	if len(recs) != 1 || recs[0].Queue != b.q.Name {
		t.Fatalf("record's queue: %+v, want %s", recs, b.q.Name)
	}
	res, err := b.replayer().Replay(context.Background(), ReplayOptions{Filter: Filter{Fingerprint: "fp-forged"}})
	if err != nil || len(res.Sent) != 1 {
		t.Fatalf("replay: %+v %v", res, err)
	}
	if n := b.depth(other); n != 0 {
		t.Fatalf("the forged header sent it to %s (%d messages)", other, n)
	}
	if n := b.depth(b.q.Name); n != 1 {
		t.Fatalf("%s holds %d, want the replayed message", b.q.Name, n)
	}
}

// A forged negative dlxbridge-redrive-count must not buy a message more
// redrives than the budget.
func TestForgedNegativeRedriveCountKeepsTheBudget(t *testing.T) {
	t.Parallel()
	b := setupStore(t, func(q *config.Queue) { one := 1; q.Quarantine.MaxRedrives = &one })
	h := envelopeHeaders(b.q.Name, "fp-neg", "failed", time.Now())
	h[wire.HeaderRedriveCount] = int64(-1000)
	b.publish(b.q.Quarantine.Queue, amqp.Publishing{MessageId: "neg", Type: "test.job", Headers: h, Body: []byte(validJob(1))})
	b.keep(1)
	res, err := b.replayer().Replay(context.Background(), ReplayOptions{Filter: Filter{Fingerprint: "fp-neg"}, DryRun: true})
	if err != nil || len(res.Plan) != 1 {
		t.Fatalf("dry run: %+v %v", res, err)
	}
	if p := res.Plan[0]; p.Redrives != 1 {
		t.Fatalf("a replay would carry redrive count %d, want 1", p.Redrives)
	}
}

// A producer's header table may nest deeper than the record encoding
// reads back; the broker and amqp091-go take it. The keeper must still
// store the message (and the ones behind it), not return it to the intake
// forever.
func TestKeeperStoresAMessageWithADeeplyNestedHeader(t *testing.T) {
	t.Parallel()
	b := setupStore(t, nil)
	deep := amqp.Table{"leaf": "x"}
	for i := 0; i < maxCodecDepth+5; i++ {
		deep = amqp.Table{"n": deep}
	}
	b.publish(b.q.Quarantine.Queue, amqp.Publishing{MessageId: "deep", Headers: amqp.Table{"deep": deep, "ok": "kept"}, Body: []byte("not json")})
	b.publish(b.q.Quarantine.Queue, amqp.Publishing{MessageId: "behind", Body: []byte("x")})
	b.keep(2)
	snap := b.snapshot(b.inspector())
	if len(snap.Records) != 2 || snap.Intake[b.q.Quarantine.Queue] != 0 {
		t.Fatalf("%d records, intake holds %d", len(snap.Records), snap.Intake[b.q.Quarantine.Queue])
	}
	r, err := snap.Get(snap.Records[0].ID)
	if err != nil {
		t.Fatal(err)
	}
	if r.Properties.MessageID != "deep" || r.Headers()["ok"] != "kept" || r.Headers()["deep"] != notKept || string(r.Body) != "not json" {
		t.Fatalf("record %+v headers %v body %q", r.Properties, r.Headers(), r.Body)
	}
	if _, err := r.MarshalJSON(); err != nil {
		t.Fatal(err)
	}
}

// --id takes a unique prefix (at least 4 characters). A prefix that two
// records share must refuse the replay or purge, not send both: with
// 100,000 records, most 4-character prefixes are shared.
func TestReplayRefusesAnAmbiguousIDPrefix(t *testing.T) {
	t.Parallel()
	b := setupStore(t, nil)
	intake := b.q.Quarantine.Queue
	msg := func(i int) amqp.Publishing {
		return amqp.Publishing{MessageId: "amb", Type: "test.job", ContentType: "application/json",
			Headers: envelopeHeaders(b.q.Name, "fp-amb", "failed", time.Unix(1700000000, 0)), Body: []byte(validJob(i))}
	}
	id := func(p amqp.Publishing) string {
		s, err := recordID(&amqp.Delivery{Exchange: "", RoutingKey: intake, Headers: p.Headers, ContentType: p.ContentType,
			MessageId: p.MessageId, Type: p.Type, Body: p.Body})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	// Two messages whose record ids share their first 4 characters.
	byPrefix := map[string]int{}
	var a, c int
	for i := 0; ; i++ {
		p := id(msg(i))[:4]
		if j, ok := byPrefix[p]; ok {
			a, c = j, i
			break
		}
		byPrefix[p] = i
	}
	b.publish(intake, msg(a))
	b.publish(intake, msg(c))
	b.keep(2)
	snap := b.snapshot(b.inspector())
	if len(snap.Records) != 2 || snap.Records[0].ID != id(msg(a)) || snap.Records[1].ID != id(msg(c)) {
		t.Fatalf("records %v, %v: not the ids expected (%s, %s)", snap.Records[0].ID, snap.Records[len(snap.Records)-1].ID, id(msg(a)), id(msg(c)))
	}
	prefix := id(msg(a))[:4]
	rp := b.replayer()
	res, err := rp.Replay(context.Background(), ReplayOptions{Filter: Filter{IDs: []string{prefix}}})
	if !errors.Is(err, ErrAmbiguous) {
		t.Errorf("replay --id %s: %+v %v, want refused as ambiguous", prefix, res, err)
	}
	if n := b.depth(b.q.Name); n != 0 {
		t.Errorf("replay of an ambiguous prefix sent %d", n)
	}
	pres, err := rp.Purge(context.Background(), PurgeOptions{Filter: Filter{IDs: []string{prefix}}, Reason: "test"})
	if !errors.Is(err, ErrAmbiguous) {
		t.Errorf("purge --id %s: %+v %v, want refused as ambiguous", prefix, pres, err)
	}
	if open := b.snapshot(b.inspector()).List(Filter{Fingerprint: "fp-amb"}); len(open) != 2 {
		t.Errorf("%d open, want 2", len(open))
	}
}
