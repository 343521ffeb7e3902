package consumer

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/quarantine"
	"github.com/dlxbridge/dlxbridge/triage"
	"github.com/dlxbridge/dlxbridge/wire"
)

// An automatic redrive that ended with an error nobody asked for (its
// sends refused: the work queue full after the outage) is tried again
// after a while; before, it waited for the next half-open or close of the
// breaker, which may be weeks away, with its records open. One stopped on
// purpose (the breaker reopened, failures returned, the session ended)
// waits for the breaker, and one locked elsewhere looks again soon.
func TestARedriveThatFailedIsTriedAgain(t *testing.T) {
	t.Parallel()
	refused := errors.New("replay abc to orders: publish nacked")
	stopped := &quarantine.ReplayResult{Run: "r", Stopped: true, Stop: "stopped: the circuit breaker reopened"}
	failed := &quarantine.ReplayResult{Run: "r", Stopped: true, Stop: "failed: " + refused.Error()}
	done := &quarantine.ReplayResult{Run: "r"}
	cases := []struct {
		name     string
		res      *quarantine.ReplayResult
		err      error
		ctxDone  bool
		again    bool
		finished bool
	}{
		{"done", done, nil, false, false, true},
		{"stopped by the breaker or the stop rule", stopped, nil, true, false, false},
		{"sends refused", failed, refused, false, true, false},
		{"could not read or lock", nil, errors.New("read events: channel closed"), false, true, false},
		{"the session ended", failed, refused, true, false, false},
		{"locked elsewhere", nil, fmt.Errorf("%w (lock q.replay-lock)", quarantine.ErrLocked), false, true, false},
	}
	for _, c := range cases {
		wait, finished := redriveAgain(c.res, c.err, c.ctxDone)
		if (wait > 0) != c.again || finished != c.finished {
			t.Errorf("%s: again in %v, finished %v; want again %v, finished %v", c.name, wait, finished, c.again, c.finished)
		}
	}
}

// A replayed message copied whole (id, body, headers) into another queue,
// as a handler that forwards what it got does, is not the message the job
// sent there: its outcome in that queue is not recorded in the job. The
// job's signature names the queue the replay sent it to.
func TestAJobOutcomeCountsOnlyInTheQueueTheReplaySentTo(t *testing.T) {
	t.Parallel()
	signer, err := triage.NewSigner([]byte(testSigningKey))
	must(t, err)
	jr := newJobRecorder(signer)
	d := &amqp.Delivery{MessageId: "m", Body: []byte(`{}`), Headers: amqp.Table{
		wire.HeaderReplayJob: "job1", wire.HeaderReplayRecord: "rec1"}}
	d.Headers[wire.HeaderReplayJobSignature] = signer.SignReplayJob("orders", "m", d.Body, d.Headers)
	jr.settled("audit", d, OutcomeAcked)
	if got := jr.take(); len(got) != 0 {
		t.Fatalf("a copy in another queue was recorded: %v", got)
	}
	jr.settled("orders", d, OutcomeQuarantined)
	if got := jr.take(); len(got[jobKey{"orders", "job1", quarantine.JobQuarantinedAgain}]) != 1 {
		t.Fatalf("the message in its queue: %v", got)
	}
}

// In dry-run mode no window is ever covered, so every trigger (each close,
// each half-open of a flapping breaker) plans every record of every window
// so far, and each new record makes a new plan. The runtime logs a plan
// when it changes, and keeps a constant amount to tell: before, it kept
// each distinct plan, whole, for the life of the process (here 300
// plans of up to 300 records: 1.35 MB, growing with the square).
func TestDryRunPlansAreRememberedInConstantSpace(t *testing.T) {
	t.Parallel()
	qo := &queueOutage{}
	var plan []quarantine.Planned
	logged := 0
	for i := range 300 {
		plan = append(plan, quarantine.Planned{ID: fmt.Sprintf("%012x", i), ToQueue: "orders.work", Redrives: 1})
		if qo.dryRunNew(plan) {
			logged++
		}
		if qo.dryRunNew(slices.Clone(plan)) {
			t.Fatalf("plan %d logged twice in a row", i)
		}
	}
	if logged != 300 {
		t.Errorf("%d of 300 changed plans logged", logged)
	}
	if qo.dryRunNew(nil) {
		t.Error("an empty plan logged")
	}
	if n := qo.dryRunRetained(); n > 64 {
		t.Errorf("the dry runs keep %d bytes after 300 plans, want a constant few", n)
	}
}

// The runtime reads the outage windows when a session starts: an outage
// that ended before a restart and was not redriven, and one a killed
// runtime never ended, are on the broker. If that read fails (the events
// stream unavailable for a moment, as after a broker restart, which is
// when outages happen), it is tried again: before, nothing read them until
// the breaker next closed, which may be weeks away, and their records
// stayed open. Here the events stream is missing at the start, then comes
// back holding an ended outage: the runtime redrives it without any
// breaker transition.
func TestAFailedReadOfTheWindowsIsTriedAgain(t *testing.T) {
	t.Parallel()
	b := setup(t, autoRedriveQueue)
	b.cfg.Logger = quietLogger(t)
	b.cfg.hooks.redriveAfterFailedAdopt = 200 * time.Millisecond
	setupConn := b.env.Dial("events")
	signer, err := triage.NewSigner([]byte(testSigningKey))
	must(t, err)
	firstRead := make(chan error, 1)
	var once sync.Once
	b.cfg.hooks.adopted = func(err error) {
		once.Do(func() {
			// The stream comes back, holding the outage, before the
			// runtime reads again (this runs on the runtime's goroutine).
			if err != nil {
				applyTopology(t, setupConn, b.topo)
				rp := &quarantine.Replayer{Conn: setupConn, Config: b.file, Signer: signer, By: "runtime@elsewhere"}
				now := time.Now().UTC()
				if werr := rp.Outage(context.Background(), quarantine.OutageWindow{ID: "before-restart", Queue: b.queue.Name,
					From: now.Add(-time.Minute), Until: now.Add(-30 * time.Second)}, true); werr != nil {
					t.Errorf("write the window: %v", werr)
				}
			}
			firstRead <- err
		})
	}
	redrives := make(chan *quarantine.ReplayResult, 8)
	b.cfg.hooks.redrive = func(_ string, res *quarantine.ReplayResult, err error) {
		if err == nil {
			redrives <- res
		}
	}
	ch, err := setupConn.Channel()
	must(t, err)
	if _, err := ch.QueueDelete(b.queue.Quarantine.EventsStream(), false, false, false); err != nil {
		t.Fatal(err)
	}
	b.start(func(c *Consumer) {
		must(t, c.Handle(b.queue.Name, testType, HandlerFunc(func(context.Context, *Message) error { return nil })))
	})
	select {
	case err := <-firstRead:
		if err == nil {
			t.Fatal("the windows were read from an events stream that does not exist")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the runtime did not read the windows at its start")
	}
	select {
	case res := <-redrives:
		if res.Stopped {
			t.Errorf("the redrive stopped: %s", res.Stop)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the ended outage was not redriven once the events stream was back")
	}
}
