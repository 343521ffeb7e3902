package quarantine

import (
	"context"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// A replay watches its events streams for a cancel from a little before
// it starts, by the broker's timestamps, and the replay's host may run
// ahead of the broker's clock. A minute ahead, the watch asks for a time
// the stream has not reached, the broker attaches it at the stream's end,
// and a cancel written after that still stops the replay after the
// message in flight, with the rest left open (checked: this held before
// any change; it guards the cancel path, which had no test of its own at
// this level).
func TestACancelReachesAReplayWhoseClockRunsAhead(t *testing.T) {
	t.Parallel()
	b := setupStore(t, nil)
	at := nowUTC()
	const n = 8
	for i := range n {
		b.publish(b.q.Quarantine.Queue, amqp.Publishing{MessageId: "c-" + string(rune('a'+i)), Type: "test.job", ContentType: "application/json",
			Headers: envelopeHeaders(b.q.Name, "fp-cancel", "boom", at), Body: []byte(validJob(i))})
	}
	b.keep(n)
	rp := b.replayer()
	rp.Now = func() time.Time { return time.Now().Add(time.Minute) } // the replay's host, a minute ahead
	started := make(chan string, 1)
	type result struct {
		res *ReplayResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := rp.Replay(context.Background(), ReplayOptions{Filter: Filter{Queue: b.q.Name, Fingerprint: "fp-cancel"}, Rate: 1, Reason: "r",
			Started: func(r *ReplayResult) { started <- r.Run }})
		done <- result{res, err}
	}()
	var run string
	select {
	case run = <-started:
	case r := <-done:
		t.Fatalf("the replay ended before it started sending: %+v, %v", r.res, r.err)
	}
	canceller := b.replayer() // the operator's host, on time
	if _, err := canceller.CancelJob(context.Background(), run, "wrong filter"); err != nil {
		t.Fatalf("cancel: %v", err)
	}
	select {
	case r := <-done:
		if r.res == nil || !r.res.Stopped || !strings.Contains(r.res.Stop, "cancelled") || len(r.res.Sent) == n {
			t.Errorf("after the cancel the replay ended: %+v, %v; want it cancelled with records left open", r.res, r.err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the replay did not end")
	}
}
