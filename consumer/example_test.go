package consumer_test

import (
	"errors"
	"fmt"
	"time"

	"github.com/dlxbridge/dlxbridge/consumer"
	"github.com/dlxbridge/dlxbridge/triage"
)

// A host program learns every delivery's outcome from OnSettled. The hook
// runs on the worker that settled the delivery, so it hands the value to a
// buffered channel and never blocks; another goroutine does the slow part.
func ExampleConfig_onSettled() {
	events := make(chan consumer.Settled, 1024)
	cfg := &consumer.Config{
		// URL, File and Registry as usual.
		OnSettled: func(s consumer.Settled) {
			select {
			case events <- s:
			default: // full: drop the event rather than hold up the worker
			}
		},
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for s := range events {
			switch s.Outcome {
			case consumer.OutcomeAcked:
				fmt.Printf("%s %s: handled on attempt %d\n", s.Queue, s.MessageID, s.Attempt)
			case consumer.OutcomeRetried:
				fmt.Printf("%s %s: retry in %s (%s): %v\n", s.Queue, s.MessageID, s.Delay, s.Class, s.Err)
			case consumer.OutcomeQuarantined:
				fmt.Printf("%s %s: quarantined (%s): %v\n", s.Queue, s.MessageID, s.Class, s.Err)
			default:
				fmt.Printf("%s %s: %s\n", s.Queue, s.MessageID, s.Outcome)
			}
		}
	}()

	// What the runtime passes for three deliveries: a handler that
	// succeeded, one that failed once, one that said the message is bad.
	cfg.OnSettled(consumer.Settled{Queue: "orders", MessageID: "m-1", Outcome: consumer.OutcomeAcked, Attempt: 1})
	cfg.OnSettled(consumer.Settled{Queue: "orders", MessageID: "m-2", Outcome: consumer.OutcomeRetried,
		Class: triage.ClassTransient, Attempt: 1, Delay: 1200 * time.Millisecond, Err: errors.New("warehouse API: 503")})
	cfg.OnSettled(consumer.Settled{Queue: "orders", MessageID: "m-3", Outcome: consumer.OutcomeQuarantined,
		Class: triage.ClassPermanent, Attempt: 1, Err: errors.New("unknown customer 99")})
	close(events)
	<-done
	// Output:
	// orders m-1: handled on attempt 1
	// orders m-2: retry in 1.2s (transient): warehouse API: 503
	// orders m-3: quarantined (permanent): unknown customer 99
}
