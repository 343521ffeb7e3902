package triage

import (
	"testing"
	"time"
)

// legalEdges are the only transitions a breaker makes, with their causes.
var legalEdges = map[[2]BreakerState][]BreakerCause{
	{BreakerClosed, BreakerOpen}:     {CauseConsecutive, CauseRatio, CauseSignal},
	{BreakerOpen, BreakerHalfOpen}:   {CauseTimer},
	{BreakerHalfOpen, BreakerOpen}:   {CauseProbeFailed, CauseSignal},
	{BreakerHalfOpen, BreakerClosed}: {CauseProbesSucceeded},
}

// fuzzOutcomes are the outcomes a program picks from.
var fuzzOutcomes = []Outcome{
	{},
	{Class: ClassTransient},
	{Class: ClassTimeout},
	{Class: ClassPermanent},
	{Class: ClassSchema},
	{Class: ClassPanic},
	{Class: ClassCrashLoop},
	{Abandoned: true},
	{Class: ClassTransient, DependencyDown: true},
	{Class: ClassTransient, DependencyDown: true, RetryAfter: 3 * time.Second},
	{Class: ClassTransient, DependencyDown: true, RetryAfter: 2 * time.Hour},
	{Class: ClassPermanent, DependencyDown: true, RetryAfter: time.Second},
}

// FuzzBreaker runs a program of admissions, outcomes and clock steps
// against a breaker built from a fuzzed policy, and checks after every step:
// no delivery while open before the deadline; at most Probes probes in
// flight; every open period within MaxOpen and the deadline never earlier
// than announced; transitions only along the legal edges, from the state the
// breaker was in; the consecutive trigger fires exactly when it should.
func FuzzBreaker(f *testing.F) {
	f.Add(uint8(3), uint8(0), uint8(0), uint8(0), uint8(5), uint8(60), uint8(1), uint8(0), []byte{0, 1, 1, 0, 1, 1, 0, 1, 1, 2, 10, 0, 1, 0, 0})
	f.Add(uint8(0), uint8(128), uint8(10), uint8(4), uint8(1), uint8(10), uint8(2), uint8(50), []byte{0, 1, 1, 0, 1, 0, 0, 1, 1, 0, 1, 1, 2, 200, 0, 0, 0, 1, 0, 1, 1, 1})
	f.Add(uint8(1), uint8(0), uint8(0), uint8(0), uint8(2), uint8(3), uint8(3), uint8(255), []byte{0, 1, 9, 2, 3, 0, 0, 0, 0, 1, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0, 1, 0, 1, 0, 1, 0, 1, 0, 3, 200, 0, 4, 8})
	f.Add(uint8(0), uint8(0), uint8(0), uint8(0), uint8(0), uint8(0), uint8(0), uint8(0), []byte{0, 0, 1, 0, 10, 4, 10, 2, 255, 0, 0, 1, 1, 0})

	f.Fuzz(func(t *testing.T, consecutive, ratio, windowSize, minVolume, minOpen, maxOpen, probes, jitter uint8, program []byte) {
		if len(program) > 4096 {
			return
		}
		p := BreakerPolicy{
			ConsecutiveFailures: int(consecutive % 8),
			FailureRatio:        float64(ratio) / 255,
			Window:              time.Duration(windowSize%16) * 5 * time.Second,
			WindowSize:          int(windowSize / 16),
			MinVolume:           int(minVolume % 16),
			MinOpen:             time.Duration(minOpen) * 500 * time.Millisecond,
			MaxOpen:             time.Duration(maxOpen) * time.Second,
			Probes:              int(probes % 5),
			Jitter:              float64(int(jitter)-64) / 191, // some negative: none
		}
		b, err := NewBreaker(p, fixedRand(float64(jitter)/256))
		if err != nil {
			if p.Validate() == nil {
				t.Fatalf("NewBreaker refused a valid policy: %v", err)
			}
			return
		}
		d := p.WithDefaults()

		now := t0
		state := BreakerClosed
		var until time.Time
		var latest time.Time // the latest time the breaker was told: its clock never runs back
		tell := func() {
			if now.After(latest) {
				latest = now
			}
		}
		var tickets []Ticket
		inFlight := 0           // probes of the current half-open period not yet recorded
		period := 0             // transitions seen
		ticketPeriod := []int{} // period of each ticket
		consec := 0             // counted failures in a row in the current closed period
		opens := 0              // open periods since the breaker last closed
		var lastBackoff time.Duration

		check := func(step int, tr Transition, before BreakerState) {
			t.Helper()
			if !tr.Happened() {
				return
			}
			causes, ok := legalEdges[[2]BreakerState{tr.From, tr.To}]
			if !ok || tr.From != before {
				t.Fatalf("step %d: illegal transition %v from state %s", step, tr, before)
			}
			legal := false
			for _, c := range causes {
				legal = legal || c == tr.Cause
			}
			if !legal {
				t.Fatalf("step %d: %v has an illegal cause", step, tr)
			}
			if tr.At.Before(latest) {
				t.Fatalf("step %d: %v at %s, before the latest time told %s", step, tr, tr.At, latest)
			}
			if tr.To == BreakerHalfOpen && latest.Before(until) {
				t.Fatalf("step %d: half-open at %s, before the deadline %s", step, latest, until)
			}
			if tr.To == BreakerOpen {
				if tr.OpenFor < 0 || tr.OpenFor > d.MaxOpen {
					t.Fatalf("step %d: open for %s, outside [0, MaxOpen %s]", step, tr.OpenFor, d.MaxOpen)
				}
				until = tr.At.Add(tr.OpenFor)
			}
			state = tr.To
			period++
			inFlight, consec = 0, 0
		}

		for i := 0; i < len(program); i++ {
			op := program[i]
			arg := byte(0)
			if i+1 < len(program) {
				arg = program[i+1]
			}
			switch op % 5 {
			case 0: // admit (or, one time in four, only tick)
				tell()
				before := state
				if op/5%4 == 3 {
					if st := status(b); state == BreakerOpen {
						if st.Until.Before(until) {
							t.Fatalf("step %d: open until %s, announced until %s", i, st.Until, until)
						}
						until = st.Until // a signal may have extended it
					}
					due := state == BreakerOpen && !latest.Before(until)
					tr := b.Tick(now)
					check(i, tr, before)
					if due != tr.Happened() || due && tr.To != BreakerHalfOpen {
						t.Fatalf("step %d: Tick at %s while %s until %s: %v", i, now, before, until, tr)
					}
					continue
				}
				a := b.Admit(now)
				check(i, a.Transition, before)
				switch a.Verdict {
				case AdmitDeliver:
					if state != BreakerClosed {
						t.Fatalf("step %d: delivered while %s", i, state)
					}
				case AdmitProbe:
					if state != BreakerHalfOpen {
						t.Fatalf("step %d: probe while %s", i, state)
					}
					inFlight++
					if inFlight > d.Probes {
						t.Fatalf("step %d: %d probes in flight, Probes is %d", i, inFlight, d.Probes)
					}
				case AdmitPause:
					if state != BreakerOpen || !now.Before(a.Until) || a.Until.Before(until) {
						t.Fatalf("step %d: pause until %s at %s while %s (announced until %s)", i, a.Until, now, state, until)
					}
					until = a.Until // a signal may have extended it
					continue
				case AdmitHold:
					if state != BreakerHalfOpen || inFlight < d.Probes {
						t.Fatalf("step %d: hold while %s with %d/%d probes in flight", i, state, inFlight, d.Probes)
					}
					continue
				default:
					t.Fatalf("step %d: verdict %q", i, a.Verdict)
				}
				if state == BreakerOpen && now.Before(until) {
					t.Fatalf("step %d: admitted while open until %s at %s", i, until, now)
				}
				tickets = append(tickets, a.Ticket)
				ticketPeriod = append(ticketPeriod, period)
			case 1: // record the outcome of one admitted message
				i++
				if len(tickets) == 0 {
					continue
				}
				tell()
				k := int(arg) % len(tickets)
				tk, tp := tickets[k], ticketPeriod[k]
				tickets = append(tickets[:k], tickets[k+1:]...)
				ticketPeriod = append(ticketPeriod[:k], ticketPeriod[k+1:]...)
				o := fuzzOutcomes[int(arg/16)%len(fuzzOutcomes)]
				before := state
				current := tp == period
				if current && state == BreakerHalfOpen && tk.Probe() {
					inFlight--
				}
				if current && state == BreakerClosed {
					switch {
					case o.Success():
						consec = 0
					case o.Counted():
						consec++
					}
				}
				wantTrip := current && state == BreakerClosed && o.Counted() &&
					(o.DependencyDown || (d.ConsecutiveFailures > 0 && consec >= d.ConsecutiveFailures))
				tr := b.Record(now, tk, o)
				if tr.Happened() && !current {
					t.Fatalf("step %d: an outcome of an earlier period moved the breaker: %v", i, tr)
				}
				if wantTrip && !tr.Happened() {
					t.Fatalf("step %d: %+v after %d counted failures in a row did not trip (policy %+v)", i, o, consec, d)
				}
				if tr.Cause == CauseConsecutive && consec < d.ConsecutiveFailures {
					t.Fatalf("step %d: tripped after %d failures in a row, policy says %d", i, consec, d.ConsecutiveFailures)
				}
				if tr.To == BreakerOpen {
					// Every open since closing is counted; a signalled delay is
					// the period (capped); a backoff never shrinks from one
					// reopen to the next (the injected u is constant).
					opens++
					if tr.Opens != opens {
						t.Fatalf("step %d: %v is open #%d, model says #%d", i, tr, tr.Opens, opens)
					}
					if o.DependencyDown && o.RetryAfter > 0 {
						if tr.OpenFor != min(o.RetryAfter, d.MaxOpen) {
							t.Fatalf("step %d: signalled %s, open for %s (MaxOpen %s)", i, o.RetryAfter, tr.OpenFor, d.MaxOpen)
						}
					} else {
						if tr.OpenFor < lastBackoff {
							t.Fatalf("step %d: reopened for %s, shorter than the previous %s", i, tr.OpenFor, lastBackoff)
						}
						lastBackoff = tr.OpenFor
					}
				}
				if tr.To == BreakerClosed {
					opens, lastBackoff = 0, 0
				}
				check(i, tr, before)
			case 2: // time passes, up to ~18h in uneven steps
				i++
				now = now.Add(time.Duration(arg) * time.Duration(arg) * time.Second)
			case 3: // the clock steps back
				i++
				now = now.Add(-time.Duration(arg) * time.Second)
			case 4: // status agrees with the model
				st := status(b)
				if st.State != state {
					t.Fatalf("step %d: status %s, model %s", i, st.State, state)
				}
				if state == BreakerOpen && st.Until.Before(until) {
					t.Fatalf("step %d: deadline moved earlier: %s < %s", i, st.Until, until)
				}
				if state == BreakerHalfOpen && (st.ProbesInFlight > d.Probes || st.ProbesSucceeded >= d.Probes) {
					t.Fatalf("step %d: status %+v with Probes %d", i, st, d.Probes)
				}
			}
		}
	})
}
