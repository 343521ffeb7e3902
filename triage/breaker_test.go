package triage

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
	"sync"
	"testing"
	"time"
)

var (
	outFail    = Outcome{Class: ClassTransient}
	outTimeout = Outcome{Class: ClassTimeout}
	outOK      = Outcome{}
)

func newBreaker(t *testing.T, p BreakerPolicy) *Breaker {
	t.Helper()
	b, err := NewBreaker(p, fixedRand(0))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// deliver admits one message at now, expecting verdict, and records o.
func deliver(t *testing.T, b *Breaker, now time.Time, want AdmitVerdict, o Outcome) Transition {
	t.Helper()
	a := b.Admit(now)
	if a.Verdict != want {
		t.Fatalf("at +%s: Admit = %s, want %s (status %+v)", now.Sub(t0), a.Verdict, want, status(b))
	}
	return b.Record(now, a.Ticket, o)
}

func wantTransition(t *testing.T, got Transition, from, to BreakerState, cause BreakerCause) {
	t.Helper()
	if got.From != from || got.To != to || got.Cause != cause {
		t.Fatalf("transition = %v, want %s → %s (%s)", got, from, to, cause)
	}
}

func TestBreakerConsecutiveFailures(t *testing.T) {
	t.Parallel()
	b := newBreaker(t, BreakerPolicy{ConsecutiveFailures: 3, MinOpen: 10 * time.Second, Jitter: -1})
	now := t0
	deliver(t, b, now, AdmitDeliver, outFail)
	deliver(t, b, now, AdmitDeliver, outTimeout)
	deliver(t, b, now, AdmitDeliver, outOK) // resets the run
	deliver(t, b, now, AdmitDeliver, outFail)
	deliver(t, b, now, AdmitDeliver, Outcome{Class: ClassPermanent}) // neutral: no reset, no count
	deliver(t, b, now, AdmitDeliver, Outcome{Class: ClassPanic})     // neutral
	deliver(t, b, now, AdmitDeliver, outFail)
	tr := deliver(t, b, now, AdmitDeliver, outTimeout)
	wantTransition(t, tr, BreakerClosed, BreakerOpen, CauseConsecutive)
	if tr.OpenFor != 10*time.Second || tr.Opens != 1 {
		t.Errorf("open for %s (#%d), want 10s (#1)", tr.OpenFor, tr.Opens)
	}
	if a := b.Admit(now.Add(9 * time.Second)); a.Verdict != AdmitPause || !a.Until.Equal(t0.Add(10*time.Second)) {
		t.Errorf("Admit while open = %+v, want pause until +10s", a)
	}
}

func TestBreakerFailureRatio(t *testing.T) {
	t.Parallel()
	p := BreakerPolicy{FailureRatio: 0.5, WindowSize: 10, MinVolume: 6, Window: time.Minute}
	b := newBreaker(t, p)
	now := t0
	// Alternating: 5 outcomes are below MinVolume, the 6th reaches 3/6.
	for i := range 5 {
		o := outOK
		if i%2 == 0 {
			o = outFail
		}
		if tr := deliver(t, b, now, AdmitDeliver, o); tr.Happened() {
			t.Fatalf("outcome %d tripped below the minimum volume: %v", i, tr)
		}
	}
	wantTransition(t, deliver(t, b, now, AdmitDeliver, outFail), BreakerClosed, BreakerOpen, CauseRatio)

	// Outcomes older than Window don't count.
	b = newBreaker(t, p)
	for range 5 {
		deliver(t, b, t0, AdmitDeliver, outFail)
	}
	later := t0.Add(2 * time.Minute)
	for range 5 {
		deliver(t, b, later, AdmitDeliver, outOK)
	}
	if tr := deliver(t, b, later, AdmitDeliver, outFail); tr.Happened() {
		t.Fatalf("failures older than the window counted: %v", tr)
	}
	// Only the latest WindowSize outcomes count: old successes fall out.
	b = newBreaker(t, p)
	for range 20 {
		deliver(t, b, t0, AdmitDeliver, outOK)
	}
	for i := range 4 {
		if tr := deliver(t, b, t0, AdmitDeliver, outFail); tr.Happened() {
			t.Fatalf("failure %d: %d/10 tripped: %v", i+1, i+1, tr)
		}
	}
	wantTransition(t, deliver(t, b, t0, AdmitDeliver, outFail), BreakerClosed, BreakerOpen, CauseRatio)
}

func TestBreakerSignal(t *testing.T) {
	t.Parallel()
	b := newBreaker(t, BreakerPolicy{MaxOpen: time.Minute})
	err := fmt.Errorf("call billing: %w", DependencyDown(30*time.Second, io.EOF))
	tr := deliver(t, b, t0, AdmitDeliver, OutcomeOf(err))
	wantTransition(t, tr, BreakerClosed, BreakerOpen, CauseSignal)
	if tr.OpenFor != 30*time.Second {
		t.Errorf("open for %s, want the signalled 30s", tr.OpenFor)
	}
	// A signal longer than MaxOpen is capped.
	b = newBreaker(t, BreakerPolicy{MaxOpen: time.Minute})
	tr = deliver(t, b, t0, AdmitDeliver, OutcomeOf(DependencyDown(time.Hour, nil)))
	if tr.OpenFor != time.Minute {
		t.Errorf("open for %s, want MaxOpen 1m", tr.OpenFor)
	}
	// A signal without a delay opens for the backoff.
	b = newBreaker(t, BreakerPolicy{MinOpen: 7 * time.Second, Jitter: -1})
	tr = deliver(t, b, t0, AdmitDeliver, OutcomeOf(DependencyDown(0, nil)))
	if tr.OpenFor != 7*time.Second {
		t.Errorf("open for %s, want MinOpen 7s", tr.OpenFor)
	}
}

// Messages in hand when the breaker opened report late: their outcomes
// count for nothing, but a longer signal extends the open period.
func TestBreakerLateOutcomes(t *testing.T) {
	t.Parallel()
	b := newBreaker(t, BreakerPolicy{ConsecutiveFailures: 1, MinOpen: 10 * time.Second, Jitter: -1})
	inHand := b.Admit(t0).Ticket
	deliver(t, b, t0, AdmitDeliver, outFail)
	if tr := b.Record(t0.Add(time.Second), inHand, outOK); tr.Happened() {
		t.Fatalf("a late success moved the breaker: %v", tr)
	}
	b.Record(t0.Add(time.Second), inHand, OutcomeOf(DependencyDown(time.Minute, nil)))
	if st := status(b); st.State != BreakerOpen || !st.Until.Equal(t0.Add(61*time.Second)) {
		t.Fatalf("status %+v, want open until +61s", st)
	}
	b.Record(t0.Add(2*time.Second), inHand, OutcomeOf(DependencyDown(time.Second, nil)))
	if st := status(b); !st.Until.Equal(t0.Add(61 * time.Second)) {
		t.Fatalf("a shorter signal shortened the open period: %+v", st)
	}
}

func TestBreakerHalfOpen(t *testing.T) {
	t.Parallel()
	p := BreakerPolicy{ConsecutiveFailures: 1, MinOpen: 10 * time.Second, MaxOpen: 25 * time.Second, Jitter: -1, Probes: 2}
	b := newBreaker(t, p)
	deliver(t, b, t0, AdmitDeliver, outFail)

	// Deadline reached: half-open, two probes, then hold.
	now := t0.Add(10 * time.Second)
	a1 := b.Admit(now)
	wantTransition(t, a1.Transition, BreakerOpen, BreakerHalfOpen, CauseTimer)
	a2 := b.Admit(now)
	if a1.Verdict != AdmitProbe || a2.Verdict != AdmitProbe || a2.Transition.Happened() {
		t.Fatalf("admissions %+v, %+v: want two probes", a1, a2)
	}
	if a := b.Admit(now); a.Verdict != AdmitHold {
		t.Fatalf("third admission %s, want hold", a.Verdict)
	}
	// An abandoned probe frees its slot; a neutral one too.
	b.Record(now, a1.Ticket, Outcome{Abandoned: true})
	a3 := b.Admit(now)
	if a3.Verdict != AdmitProbe {
		t.Fatalf("after an abandoned probe: %s, want probe", a3.Verdict)
	}
	// One failed probe reopens for longer: 10s × 2.
	tr := b.Record(now, a2.Ticket, outFail)
	wantTransition(t, tr, BreakerHalfOpen, BreakerOpen, CauseProbeFailed)
	if tr.OpenFor != 20*time.Second || tr.Opens != 2 {
		t.Fatalf("reopened for %s (#%d), want 20s (#2)", tr.OpenFor, tr.Opens)
	}
	// The other probe of that half-open period reports late: nothing.
	if tr := b.Record(now, a3.Ticket, outOK); tr.Happened() {
		t.Fatalf("a stale probe moved the breaker: %v", tr)
	}
	// Third open: 40s capped at MaxOpen 25s.
	now = now.Add(20 * time.Second)
	tr = deliver(t, b, now, AdmitProbe, outFail)
	if tr.OpenFor != 25*time.Second {
		t.Fatalf("reopened for %s, want MaxOpen 25s", tr.OpenFor)
	}
	// Both probes succeed: closed, and the backoff starts over.
	now = now.Add(25 * time.Second)
	deliver(t, b, now, AdmitProbe, outOK)
	tr = deliver(t, b, now, AdmitProbe, outOK)
	wantTransition(t, tr, BreakerHalfOpen, BreakerClosed, CauseProbesSucceeded)
	tr = deliver(t, b, now, AdmitDeliver, outFail)
	if tr.OpenFor != 10*time.Second || tr.Opens != 1 {
		t.Fatalf("after closing, opened for %s (#%d), want 10s (#1)", tr.OpenFor, tr.Opens)
	}
}

func TestBreakerProbeSignal(t *testing.T) {
	t.Parallel()
	b := newBreaker(t, BreakerPolicy{ConsecutiveFailures: 1, MinOpen: time.Second, Jitter: -1})
	deliver(t, b, t0, AdmitDeliver, outFail)
	tr := deliver(t, b, t0.Add(time.Second), AdmitProbe, OutcomeOf(DependencyDown(45*time.Second, nil)))
	wantTransition(t, tr, BreakerHalfOpen, BreakerOpen, CauseSignal)
	if tr.OpenFor != 45*time.Second {
		t.Fatalf("open for %s, want the signalled 45s", tr.OpenFor)
	}
}

// With signals alone, a probe's plain transient failure is neutral: it
// frees its slot, and only a signal reopens.
func TestBreakerSignalOnlyProbeIgnoresPlainFailures(t *testing.T) {
	t.Parallel()
	b := newBreaker(t, BreakerPolicy{MinOpen: time.Second, Jitter: -1, Probes: 1})
	deliver(t, b, t0, AdmitDeliver, OutcomeOf(DependencyDown(0, nil)))
	now := t0.Add(time.Second)
	if tr := deliver(t, b, now, AdmitProbe, outFail); tr.Happened() {
		t.Fatalf("a plain failure of a probe moved a signal-only breaker: %v", tr)
	}
	if tr := deliver(t, b, now, AdmitProbe, outOK); tr.To != BreakerClosed {
		t.Fatalf("after a neutral probe and a success: %v, want closed", tr)
	}
	deliver(t, b, now, AdmitDeliver, OutcomeOf(DependencyDown(0, nil)))
	now = now.Add(2 * time.Second)
	tr := deliver(t, b, now, AdmitProbe, OutcomeOf(DependencyDown(0, nil)))
	wantTransition(t, tr, BreakerHalfOpen, BreakerOpen, CauseSignal)
}

// The default policy trips on signals only.
func TestBreakerDefaultsSignalOnly(t *testing.T) {
	t.Parallel()
	b := newBreaker(t, BreakerPolicy{})
	for range 1000 {
		if tr := deliver(t, b, t0, AdmitDeliver, outFail); tr.Happened() {
			t.Fatalf("the default policy tripped on plain failures: %v", tr)
		}
	}
	tr := deliver(t, b, t0, AdmitDeliver, OutcomeOf(DependencyDown(0, nil)))
	if tr.To != BreakerOpen || tr.OpenFor < defaultBreakerMinOpen || tr.OpenFor > defaultBreakerMaxOpen {
		t.Fatalf("transition %v", tr)
	}
}

// A clock that steps back can't shorten an open period: the breaker keeps
// the latest time it was told.
func TestBreakerClockBackwards(t *testing.T) {
	t.Parallel()
	b := newBreaker(t, BreakerPolicy{ConsecutiveFailures: 1, MinOpen: 10 * time.Second, Jitter: -1})
	a := b.Admit(t0.Add(time.Hour))
	tr := b.Record(t0, a.Ticket, outFail) // the clock stepped back an hour
	if !tr.At.Equal(t0.Add(time.Hour)) {
		t.Errorf("transition at %s, want the latest time seen, +1h", tr.At.Sub(t0))
	}
	if a := b.Admit(t0.Add(30 * time.Second)); a.Verdict != AdmitPause || !a.Until.Equal(t0.Add(time.Hour+10*time.Second)) {
		t.Fatalf("clock stepped back: %+v, want pause until +1h10s", a)
	}
	if a := b.Admit(t0.Add(time.Hour + 10*time.Second)); a.Verdict != AdmitProbe {
		t.Fatalf("at the deadline: %s, want probe", a.Verdict)
	}
}

func TestBreakerJitter(t *testing.T) {
	t.Parallel()
	for _, u := range []float64{0, 0.5, math.Nextafter(1, 0), 7, math.NaN()} {
		b, err := NewBreaker(BreakerPolicy{ConsecutiveFailures: 1, MinOpen: 10 * time.Second, Jitter: 0.5}, fixedRand(u))
		if err != nil {
			t.Fatal(err)
		}
		tr := deliver(t, b, t0, AdmitDeliver, outFail)
		if tr.OpenFor < 10*time.Second || tr.OpenFor > 15*time.Second {
			t.Errorf("u=%v: open for %s, want within [10s, 15s]", u, tr.OpenFor)
		}
	}
}

func TestDependencyDown(t *testing.T) {
	t.Parallel()
	err := fmt.Errorf("billing: %w", DependencyDown(3*time.Second, io.ErrUnexpectedEOF))
	if class, hint := Classify(err); class != ClassTransient || hint != 3*time.Second {
		t.Errorf("Classify = %s, %s; want transient, 3s", class, hint)
	}
	if d, ok := IsDependencyDown(err); !ok || d != 3*time.Second {
		t.Errorf("IsDependencyDown = %s, %v", d, ok)
	}
	if !errors.Is(err, io.ErrUnexpectedEOF) || err.Error() != "billing: unexpected EOF" {
		t.Errorf("wrapping lost: %v", err)
	}
	if class, _ := Classify(DependencyDown(time.Second, context.DeadlineExceeded)); class != ClassTimeout {
		t.Errorf("a outTimeout signal classified %s", class)
	}
	if _, ok := IsDependencyDown(RetryAfter(time.Second, io.EOF)); ok {
		t.Error("a plain RetryAfter is a dependency signal")
	}
	if d, ok := IsDependencyDown(DependencyDown(-time.Second, nil)); !ok || d != 0 {
		t.Errorf("negative delay: %s, %v", d, ok)
	}
	if DependencyDown(0, nil) == nil {
		t.Error("DependencyDown(0, nil) is nil")
	}
	// A permanent failure that also signals: the message is quarantined,
	// and the breaker still opens.
	o := OutcomeOf(DependencyDown(time.Second, Permanent(io.EOF)))
	if o.Class != ClassPermanent || !o.DependencyDown || !o.Counted() {
		t.Errorf("outcome %+v", o)
	}
	if o := OutcomeOf(nil); !o.Success() || o.Counted() {
		t.Errorf("nil outcome %+v", o)
	}
}

func TestBreakerPolicyValidate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		p     BreakerPolicy
		field string
	}{
		{BreakerPolicy{}, ""},
		{BreakerPolicy{ConsecutiveFailures: 5, FailureRatio: 0.5, Window: time.Minute, WindowSize: 50, MinVolume: 10, MinOpen: time.Second, MaxOpen: time.Minute, Jitter: 1, Probes: 3}, ""},
		{BreakerPolicy{Jitter: -1}, ""},
		{BreakerPolicy{ConsecutiveFailures: -1}, "ConsecutiveFailures"},
		{BreakerPolicy{FailureRatio: 1.5}, "FailureRatio"},
		{BreakerPolicy{FailureRatio: math.NaN()}, "FailureRatio"},
		{BreakerPolicy{Window: -time.Second}, "Window"},
		{BreakerPolicy{WindowSize: maxBreakerWindowSize + 1}, "WindowSize"},
		{BreakerPolicy{MinVolume: -1}, "MinVolume"},
		{BreakerPolicy{FailureRatio: 0.5, WindowSize: 10}, "MinVolume"}, // default 20 > 10
		{BreakerPolicy{WindowSize: 10}, ""},                             // no ratio: volume irrelevant
		{BreakerPolicy{MinOpen: -1}, "MinOpen"},
		{BreakerPolicy{MaxOpen: -1}, "MaxOpen"},
		{BreakerPolicy{MinOpen: time.Hour}, "MinOpen"}, // > default MaxOpen
		{BreakerPolicy{Jitter: 1.1}, "Jitter"},
		{BreakerPolicy{Jitter: math.NaN()}, "Jitter"},
		{BreakerPolicy{Probes: -1}, "Probes"},
		{BreakerPolicy{Probes: maxBreakerProbes + 1}, "Probes"},
	}
	for _, tt := range tests {
		err := tt.p.Validate()
		var pe *BreakerPolicyError
		switch {
		case tt.field == "" && err != nil:
			t.Errorf("%+v: %v", tt.p, err)
		case tt.field != "" && (!errors.As(err, &pe) || pe.Field != tt.field || !strings.Contains(err.Error(), tt.field)):
			t.Errorf("%+v: got %v, want an error naming %s", tt.p, err, tt.field)
		}
		if _, nerr := NewBreaker(tt.p, nil); (nerr == nil) != (tt.field == "") {
			t.Errorf("%+v: NewBreaker error %v", tt.p, nerr)
		}
	}
}

// One breaker is shared by a queue's workers: under -race, concurrent
// admissions and outcomes never put more than Probes probes in flight.
func TestBreakerConcurrent(t *testing.T) {
	t.Parallel()
	b := newBreaker(t, BreakerPolicy{ConsecutiveFailures: 2, MinOpen: time.Millisecond, MaxOpen: 4 * time.Millisecond, Probes: 2})
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			now := t0
			for i := range 2000 {
				now = now.Add(time.Millisecond)
				a := b.Admit(now)
				if st := status(b); st.ProbesInFlight > 2 {
					t.Errorf("%d probes in flight", st.ProbesInFlight)
					return
				}
				if a.Verdict == AdmitDeliver || a.Verdict == AdmitProbe {
					b.Record(now, a.Ticket, fuzzOutcomes[(w+i)%len(fuzzOutcomes)])
				}
			}
		}()
	}
	wg.Wait()
}

// Tick turns an open breaker half-open at the end of its period without
// admitting anything (a queue gone quiet), and does nothing otherwise.
func TestBreakerTick(t *testing.T) {
	t.Parallel()
	b := newBreaker(t, BreakerPolicy{})
	if tr := b.Tick(t0); tr.Happened() {
		t.Fatalf("Tick on a closed breaker: %s", tr)
	}
	deliver(t, b, t0, AdmitDeliver, OutcomeOf(DependencyDown(10*time.Second, nil)))
	if tr := b.Tick(t0.Add(9 * time.Second)); tr.Happened() {
		t.Fatalf("Tick before the period ended: %s", tr)
	}
	wantTransition(t, b.Tick(t0.Add(10*time.Second)), BreakerOpen, BreakerHalfOpen, CauseTimer)
	if st := status(b); st.State != BreakerHalfOpen || st.ProbesInFlight != 0 {
		t.Fatalf("status %+v, want half-open with no probe out", st)
	}
	if tr := b.Tick(t0.Add(time.Hour)); tr.Happened() {
		t.Fatalf("Tick on a half-open breaker: %s", tr)
	}
	deliver(t, b, t0.Add(time.Hour), AdmitProbe, outOK)
	if st := status(b); st.State != BreakerClosed {
		t.Fatalf("status %+v, want closed after the probe", st)
	}
}

// breakerStatus is what the breaker reports, in one value for assertions.
type breakerStatus struct {
	State                           BreakerState
	Until                           time.Time
	Opens                           int
	ProbesInFlight, ProbesSucceeded int
}

func status(b *Breaker) breakerStatus {
	var s breakerStatus
	s.State, s.Until, s.Opens = b.Status()
	s.ProbesInFlight, s.ProbesSucceeded = b.Probes()
	return s
}
