package quarantine

import (
	"context"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/internal/frame"
)

// A record whose headers nearly fill a frame (the runtime fits what it
// quarantines to the connection's frame_max) gains the replay's headers:
// with a long reason its header frame is over frame_max, and the broker
// closes the whole connection with FRAME_ERROR (for an automatic redrive,
// the runtime's publishing connection, every 30 s for as long as the
// record stays open). The replay cuts its reason to fit instead, and a
// message it cannot make fit is refused, never sent.
func TestAReplayNeverSendsAHeaderFrameOverTheLimit(t *testing.T) {
	t.Parallel()
	b := setupStore(t, nil)
	at := nowUTC()
	h := envelopeHeaders(b.q.Name, "fp-big", "boom", at)
	body := []byte(validJob(1))
	h["x-big"] = ""
	p := amqp.Publishing{MessageId: "big-1", Type: "test.job", ContentType: "application/json", Headers: h, Body: body}
	h["x-big"] = strings.Repeat("a", frame.DefaultFrameSize-frame.HeaderFrameSize(&p)-200) // 200 bytes to spare, as a fitted record may have
	b.publish(b.q.Quarantine.Queue, p)
	b.keep(1)

	rp := b.replayer()
	res, err := rp.Replay(context.Background(), ReplayOptions{Filter: Filter{Queue: b.q.Name, Fingerprint: "fp-big"}, Reason: strings.Repeat("why ", 600)})
	if err != nil || len(res.Sent) != 1 {
		t.Fatalf("replay of a record near the frame limit with a long reason: %+v, %v; want it sent", res, err)
	}
	ch := b.env.Channel("get")
	d, ok, err := ch.Get(b.q.Name, true)
	if err != nil || !ok {
		t.Fatalf("the replayed message is not in the work queue: %v", err)
	}
	if len(d.Headers["x-big"].(string)) != len(h["x-big"].(string)) || !strings.HasPrefix(d.Headers["dlxbridge-redrive-reason"].(string), "why why") {
		t.Errorf("the replayed message lost its header or its reason: reason %q", d.Headers["dlxbridge-redrive-reason"])
	}

	// A record with no room for the replay's headers at all is refused,
	// and the replay goes on with the next on the same connection.
	full := envelopeHeaders(b.q.Name, "fp-full", "boom", at)
	full["x-big"] = ""
	p = amqp.Publishing{MessageId: "full-1", Type: "test.job", ContentType: "application/json", Headers: full, Body: body}
	full["x-big"] = strings.Repeat("a", frame.DefaultFrameSize-frame.HeaderFrameSize(&p)-8)
	b.publish(b.q.Quarantine.Queue, p)
	b.publish(b.q.Quarantine.Queue, amqp.Publishing{MessageId: "small-1", Type: "test.job", ContentType: "application/json",
		Headers: envelopeHeaders(b.q.Name, "fp-full", "boom", at), Body: []byte(validJob(2))})
	b.keep(2)
	res, err = rp.Replay(context.Background(), ReplayOptions{Filter: Filter{Queue: b.q.Name, Fingerprint: "fp-full"}, Reason: "r"})
	if err != nil || len(res.Sent) != 1 || len(res.Plan) != 2 {
		t.Fatalf("replay of a full record and a small one: %+v, %v; want the small one sent", res, err)
	}
	for _, pl := range res.Plan {
		if sent := pl.Refused == ""; sent == (pl.ID == res.Sent[0]) {
			continue
		}
		t.Errorf("plan %+v (sent %v)", pl, res.Sent)
	}
	if refused := res.Plan[0].Refused + res.Plan[1].Refused; !strings.HasPrefix(refused, refusedFrame) {
		t.Errorf("the full record's refusal: %q", refused)
	}
}
