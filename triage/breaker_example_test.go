package triage_test

import (
	"errors"
	"fmt"
	"time"

	"github.com/dlxbridge/dlxbridge/triage"
)

type noJitter struct{}

func (noJitter) Float64() float64 { return 0 }

// The mail provider answers 503 with Retry-After: 30s. The handler says so
// with DependencyDown; the breaker opens for 30s, then lets one probe
// through, and the probe's success closes it.
func ExampleBreaker() {
	b, err := triage.NewBreaker(triage.BreakerPolicy{ConsecutiveFailures: 5}, noJitter{})
	if err != nil {
		fmt.Println(err)
		return
	}
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

	a := b.Admit(now)
	handlerErr := triage.DependencyDown(30*time.Second, errors.New("mail provider: 503"))
	fmt.Println(a.Verdict, "→", b.Record(now, a.Ticket, triage.OutcomeOf(handlerErr)))

	a = b.Admit(now.Add(10 * time.Second))
	fmt.Println(a.Verdict, "until", a.Until.Format(time.TimeOnly))

	a = b.Admit(now.Add(30 * time.Second))
	fmt.Println(a.Transition)
	fmt.Println(a.Verdict, "→", b.Record(now.Add(31*time.Second), a.Ticket, triage.OutcomeOf(nil)))
	// Output:
	// deliver → breaker closed → open (signal) for 30s, open #1
	// pause until 12:00:30
	// breaker open → half-open (timer)
	// probe → breaker half-open → closed (probes-succeeded)
}
