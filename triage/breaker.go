package triage

import (
	"errors"
	"fmt"
	"math"
	"sync"
	"time"
)

// BreakerState is a breaker's state.
type BreakerState string

const (
	// BreakerClosed delivers normally and counts outcomes.
	BreakerClosed BreakerState = "closed"
	// BreakerOpen delivers nothing until its deadline.
	BreakerOpen BreakerState = "open"
	// BreakerHalfOpen delivers at most Probes probe messages at a time.
	BreakerHalfOpen BreakerState = "half-open"
)

// BreakerCause says why a transition happened. The runtime uses it as a
// metric label, so the set is small and fixed.
type BreakerCause string

const (
	// CauseConsecutive: ConsecutiveFailures counted failures in a row.
	CauseConsecutive BreakerCause = "consecutive"
	// CauseRatio: the failure ratio over the window reached FailureRatio.
	CauseRatio BreakerCause = "ratio"
	// CauseSignal: an explicit dependency signal (DependencyDown).
	CauseSignal BreakerCause = "signal"
	// CauseTimer: the open period ended (open → half-open).
	CauseTimer BreakerCause = "timer"
	// CauseProbeFailed: a probe failed (half-open → open).
	CauseProbeFailed BreakerCause = "probe-failed"
	// CauseProbesSucceeded: every probe succeeded (half-open → closed).
	CauseProbesSucceeded BreakerCause = "probes-succeeded"
)

// Breaker defaults, exported so docs, config and tests can name them.
const (
	defaultBreakerWindow     = 30 * time.Second
	defaultBreakerWindowSize = 100
	defaultBreakerMinVolume  = 20
	defaultBreakerMinOpen    = 5 * time.Second
	defaultBreakerMaxOpen    = 5 * time.Minute
	defaultBreakerJitter     = 0.2
	defaultBreakerProbes     = 1
	// maxBreakerWindowSize bounds the outcomes a breaker remembers.
	maxBreakerWindowSize = 10000
	// maxBreakerProbes bounds the probes of one half-open period.
	maxBreakerProbes = 1000
)

// BreakerPolicy configures a Breaker. The zero value is valid: it trips only
// on explicit dependency signals (the counting triggers are off by default;
// docs/breaker.md says why).
type BreakerPolicy struct {
	// ConsecutiveFailures opens the breaker after this many counted failures
	// in a row (a success resets the run). 0 disables the trigger. Must be
	// >= 0. Defaults to 0 (off).
	ConsecutiveFailures int
	// FailureRatio opens the breaker when, among the outcomes in the window
	// (at most WindowSize outcomes, none older than Window), at least
	// MinVolume are present and counted failures make up at least this
	// share. 0 disables the trigger. Must be in [0, 1]. Defaults to 0 (off).
	FailureRatio float64
	// Window is how far back the ratio looks. Must be >= 0. Defaults to 30s.
	Window time.Duration
	// WindowSize is how many of the latest outcomes the ratio looks at.
	// Must be in [0, maxBreakerWindowSize]. Defaults to 100.
	WindowSize int
	// MinVolume is how many outcomes the window must hold before the ratio
	// can trip; it must be <= WindowSize (else the ratio could never trip).
	// Must be >= 0. Defaults to 20.
	MinVolume int
	// MinOpen is the first open period when no Retry-After was signalled;
	// each consecutive reopen doubles it, up to MaxOpen. Must be >= 0 and
	// <= MaxOpen. Defaults to 5s.
	MinOpen time.Duration
	// MaxOpen bounds every open period, a signalled Retry-After included.
	// Must be >= 0. Defaults to 5m.
	MaxOpen time.Duration
	// Jitter spreads a backoff period d over [d, d*(1+Jitter)] (then capped
	// by MaxOpen), so that consumers of one queue don't probe in step. A
	// signalled Retry-After is not jittered. Must be in [0, 1] or negative
	// (no jitter). Defaults to 0.2.
	Jitter float64
	// Probes is how many messages a half-open breaker lets through at once,
	// and how many must succeed in a row to close it. Must be in [0,
	// maxBreakerProbes]. Defaults to 1.
	Probes int
}

// Validate reports the first invalid field, by name (the Go field name, in
// the message and in (*BreakerPolicyError).Field).
func (p BreakerPolicy) Validate() error {
	bad := func(field, format string, args ...any) error {
		return &BreakerPolicyError{Field: field, Msg: fmt.Sprintf(format, args...)}
	}
	switch {
	case p.ConsecutiveFailures < 0:
		return bad("ConsecutiveFailures", "%d must be >= 0 (0 disables it)", p.ConsecutiveFailures)
	case !(p.FailureRatio >= 0 && p.FailureRatio <= 1): // also rejects NaN
		return bad("FailureRatio", "%v must be in [0, 1] (0 disables it)", p.FailureRatio)
	case p.Window < 0:
		return bad("Window", "%s must be >= 0", p.Window)
	case p.WindowSize < 0 || p.WindowSize > maxBreakerWindowSize:
		return bad("WindowSize", "%d must be in [0, %d]", p.WindowSize, maxBreakerWindowSize)
	case p.MinVolume < 0:
		return bad("MinVolume", "%d must be >= 0", p.MinVolume)
	case p.MinOpen < 0:
		return bad("MinOpen", "%s must be >= 0", p.MinOpen)
	case p.MaxOpen < 0:
		return bad("MaxOpen", "%s must be >= 0", p.MaxOpen)
	case p.Jitter != p.Jitter || p.Jitter > 1: // NaN, or too much
		return bad("Jitter", "%v must be in [0, 1], or negative for none", p.Jitter)
	case p.Probes < 0 || p.Probes > maxBreakerProbes:
		return bad("Probes", "%d must be in [0, %d]", p.Probes, maxBreakerProbes)
	}
	d := p.withDefaults()
	switch {
	case d.FailureRatio > 0 && d.MinVolume > d.WindowSize:
		return bad("MinVolume", "%d must be <= WindowSize (%d), or the ratio can never trip", d.MinVolume, d.WindowSize)
	case d.MinOpen > d.MaxOpen:
		return bad("MinOpen", "%s must be <= MaxOpen (%s)", d.MinOpen, d.MaxOpen)
	}
	return nil
}

// BreakerPolicyError is a BreakerPolicy.Validate failure.
type BreakerPolicyError struct {
	// Field is the BreakerPolicy field's Go name, e.g. "MinOpen".
	Field string
	// Msg says what is wrong with it.
	Msg string
}

func (e *BreakerPolicyError) Error() string {
	return "triage: BreakerPolicy." + e.Field + ": " + e.Msg
}

// withDefaults fills zero fields with their documented defaults.
func (p BreakerPolicy) withDefaults() BreakerPolicy {
	if p.Window == 0 {
		p.Window = defaultBreakerWindow
	}
	if p.WindowSize == 0 {
		p.WindowSize = defaultBreakerWindowSize
	}
	if p.MinVolume == 0 {
		p.MinVolume = defaultBreakerMinVolume
	}
	if p.MinOpen == 0 {
		p.MinOpen = defaultBreakerMinOpen
	}
	if p.MaxOpen == 0 {
		p.MaxOpen = defaultBreakerMaxOpen
	}
	switch {
	case p.Jitter == 0:
		p.Jitter = defaultBreakerJitter
	case p.Jitter < 0:
		p.Jitter = 0
	}
	if p.Probes == 0 {
		p.Probes = defaultBreakerProbes
	}
	return p
}

// WithDefaults returns p with every zero field set to its default, as a
// Breaker uses it.
func (p BreakerPolicy) WithDefaults() BreakerPolicy { return p.withDefaults() }

// DependencyDown marks err as an explicit signal that the dependency behind
// the handler is down or rate-limiting, with its Retry-After d (d <= 0: no
// delay given). For the message it is RetryAfter(d, err): Classify returns
// ClassTransient (or ClassTimeout) with the hint d. For a Breaker it trips
// the breaker at once (CauseSignal) and sets the open period to d. The
// sidecar returns it for HTTP 429 and 503.
// DependencyDown(d, nil) is a non-nil error.
func DependencyDown(d time.Duration, err error) error {
	return &dependencyDownError{err: &retryAfterError{err: orDefault(err, "dependency down"), after: d}}
}

// IsDependencyDown reports whether err carries a DependencyDown signal, and
// its Retry-After (0 if none was given).
func IsDependencyDown(err error) (time.Duration, bool) {
	dd, ok := errors.AsType[*dependencyDownError](err)
	if !ok {
		return 0, false
	}
	return max(dd.err.after, 0), true
}

type dependencyDownError struct{ err *retryAfterError }

func (e *dependencyDownError) Error() string { return e.err.Error() }
func (e *dependencyDownError) Unwrap() error { return e.err }

// Outcome is what became of one admitted message, as the breaker sees it.
type Outcome struct {
	// Class of the failure (see Classify); "" is a success.
	Class Class
	// DependencyDown is an explicit signal (IsDependencyDown) and
	// RetryAfter its delay, 0 if none.
	DependencyDown bool
	RetryAfter     time.Duration
	// Abandoned: the message never reached a verdict (its channel closed,
	// the process is stopping, the handler was cancelled). It counts for
	// nothing and frees its probe slot.
	Abandoned bool
}

// OutcomeOf is the Outcome of a handler's error (nil is a success).
func OutcomeOf(err error) Outcome {
	class, _ := Classify(err)
	d, down := IsDependencyDown(err)
	return Outcome{Class: class, DependencyDown: down, RetryAfter: d}
}

// Success reports whether o is a success.
func (o Outcome) Success() bool { return !o.Abandoned && o.Class == "" && !o.DependencyDown }

// Counted reports whether o is a failure the breaker counts: a dependency
// signal, or a transient or timeout failure.
func (o Outcome) Counted() bool {
	if o.Abandoned {
		return false
	}
	return o.DependencyDown || o.Class == ClassTransient || o.Class == ClassTimeout
}

// AdmitVerdict is what the runtime does with the next delivery.
type AdmitVerdict string

const (
	// AdmitDeliver: closed; hand the message to the handler.
	AdmitDeliver AdmitVerdict = "deliver"
	// AdmitProbe: half-open; hand this one message to the handler as a
	// probe, and Record its outcome with the Admission's Ticket.
	AdmitProbe AdmitVerdict = "probe"
	// AdmitPause: open; take no message until Until (cancel the
	// subscription), then Admit again.
	AdmitPause AdmitVerdict = "pause"
	// AdmitHold: half-open with every probe slot taken; take no message
	// until a probe's outcome is recorded, then Admit again.
	AdmitHold AdmitVerdict = "hold"
)

// Ticket ties an outcome to the breaker period its message was admitted
// in. Outcomes of an earlier period (messages in hand when the breaker
// opened) count for nothing, except that a dependency signal still extends
// an open period.
type Ticket struct {
	period uint64
	probe  bool
}

// Probe reports whether the ticket is a probe's.
func (t Ticket) Probe() bool { return t.probe }

// Admission is the answer to Admit.
type Admission struct {
	Verdict AdmitVerdict
	// Until is the end of the open period (AdmitPause).
	Until time.Time
	// Ticket goes with the outcome to Record (AdmitDeliver, AdmitProbe).
	Ticket Ticket
	// Transition is the open → half-open transition this Admit made, if
	// any.
	Transition Transition
}

// Transition is a change of state; the zero value is no change.
type Transition struct {
	From, To BreakerState
	Cause    BreakerCause
	At       time.Time
	// OpenFor is the open period (To == BreakerOpen).
	OpenFor time.Duration
	// Opens counts the open periods since the breaker last closed, this
	// one included (To == BreakerOpen).
	Opens int
}

// Happened reports whether t is a transition.
func (t Transition) Happened() bool { return t.From != t.To }

// String is for log lines.
func (t Transition) String() string {
	if !t.Happened() {
		return "no transition"
	}
	s := fmt.Sprintf("breaker %s → %s (%s)", t.From, t.To, t.Cause)
	if t.To == BreakerOpen {
		s += fmt.Sprintf(" for %s, open #%d", t.OpenFor, t.Opens)
	}
	return s
}

// Breaker pauses a work queue while the dependency its handlers call is
// down, so that messages wait in the queue untouched instead of spending
// their attempt and time budgets on an outage. It is a pure state machine:
// the clock is an argument, randomness is injected, and every answer is a
// value (an Admission or a Transition) that the runtime carries out.
//
//	closed ──(trip: consecutive | ratio | signal)──▶ open
//	open ──(deadline reached, on the next Admit)──▶ half-open
//	half-open ──(Probes probes succeeded)──▶ closed
//	half-open ──(a probe failed, or a signal)──▶ open again
//
// Only these four edges exist. Each reopen without closing backs off
// longer, unless the dependency signalled its own Retry-After. What counts (Counted): a failure of class
// transient or timeout, and any explicit dependency signal (DependencyDown).
// Permanent, schema, crash-loop, broker dead-letter classes and handler
// panics are neutral: they say something about the message or the code, not
// the dependency, so they neither trip nor reset the breaker. A success
// resets the run of consecutive failures.
//
// A Breaker is safe for concurrent use (one mutex). The runtime holds one
// per queue. Build it with NewBreaker.
type Breaker struct {
	mu     sync.Mutex
	p      BreakerPolicy // defaulted
	rnd    Rand
	state  BreakerState
	period uint64    // incremented on every transition
	last   time.Time // latest time seen; time never runs backwards here
	until  time.Time // end of the open period
	opens  int       // open periods since last closed

	consecutive int
	window      []sample // ring of the latest outcomes, oldest at head
	head        int

	probesOut, probesOK int
}

type sample struct {
	at     time.Time
	failed bool
}

// NewBreaker builds a closed breaker. rnd jitters the backoff; nil uses
// math/rand/v2's global source.
func NewBreaker(p BreakerPolicy, rnd Rand) (*Breaker, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	return &Breaker{p: p.withDefaults(), rnd: rnd, state: BreakerClosed}, nil
}

// clock returns now, or the latest time already seen if now is earlier: an
// injected clock that steps back can't shorten an open period.
func (b *Breaker) clock(now time.Time) time.Time {
	if now.Before(b.last) {
		return b.last
	}
	b.last = now
	return now
}

// Admit says what to do with the next delivery at now. An open breaker
// whose deadline has passed turns half-open here (Admission.Transition).
func (b *Breaker) Admit(now time.Time) Admission {
	b.mu.Lock()
	defer b.mu.Unlock()
	now = b.clock(now)
	a := Admission{Transition: b.tick(now)}
	switch b.state {
	case BreakerClosed:
		a.Verdict, a.Ticket = AdmitDeliver, Ticket{period: b.period}
	case BreakerOpen:
		a.Verdict, a.Until = AdmitPause, b.until
	case BreakerHalfOpen:
		if b.probesOut >= b.p.Probes {
			a.Verdict = AdmitHold
			break
		}
		b.probesOut++
		a.Verdict, a.Ticket = AdmitProbe, Ticket{period: b.period, probe: true}
	}
	return a
}

// Tick turns an open breaker whose period is over half-open (CauseTimer),
// as Admit does, without admitting anything: for a queue that has no
// delivery to admit, so that its state does not read open past its period.
// It returns the transition, if any.
func (b *Breaker) Tick(now time.Time) Transition {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.tick(b.clock(now))
}

func (b *Breaker) tick(now time.Time) Transition {
	if b.state == BreakerOpen && !now.Before(b.until) {
		return b.move(now, BreakerHalfOpen, CauseTimer, 0)
	}
	return Transition{}
}

// Record takes the outcome of a message admitted with t and returns the
// transition it caused, if any.
func (b *Breaker) Record(now time.Time, t Ticket, o Outcome) Transition {
	b.mu.Lock()
	defer b.mu.Unlock()
	now = b.clock(now)
	if t.period != b.period {
		// A message of an earlier period. Only a signal still matters: the
		// dependency says it is down for longer than the breaker thought.
		if b.state == BreakerOpen && o.DependencyDown && !o.Abandoned && o.RetryAfter > 0 {
			if end := now.Add(min(o.RetryAfter, b.p.MaxOpen)); end.After(b.until) {
				b.until = end
			}
		}
		return Transition{}
	}
	switch b.state {
	case BreakerClosed:
		return b.recordClosed(now, o)
	case BreakerHalfOpen:
		if !t.probe {
			return Transition{}
		}
		b.probesOut = max(b.probesOut-1, 0)
		switch {
		case o.Counted() && (o.DependencyDown || b.countsFailures()):
			cause := CauseProbeFailed
			if o.DependencyDown {
				cause = CauseSignal
			}
			return b.open(now, cause, o)
		case o.Success():
			b.probesOK++
			if b.probesOK >= b.p.Probes {
				return b.move(now, BreakerClosed, CauseProbesSucceeded, 0)
			}
		}
	}
	return Transition{}
}

// countsFailures reports whether plain transient failures mean the
// dependency: only when a counting trigger is on. With signals alone, a
// probe that fails for a reason of its own (a transient failure that is
// not a signal) says nothing about the dependency, as in the closed state,
// and is neutral: otherwise a queue holding a few such messages would
// reopen, for longer each time, on every probe that meets one.
func (b *Breaker) countsFailures() bool {
	return b.p.ConsecutiveFailures > 0 || b.p.FailureRatio > 0
}

func (b *Breaker) recordClosed(now time.Time, o Outcome) Transition {
	if o.Success() {
		b.consecutive = 0
		b.push(now, false)
		return Transition{}
	}
	if !o.Counted() {
		return Transition{}
	}
	b.consecutive++
	b.push(now, true)
	switch {
	case o.DependencyDown:
		return b.open(now, CauseSignal, o)
	case b.p.ConsecutiveFailures > 0 && b.consecutive >= b.p.ConsecutiveFailures:
		return b.open(now, CauseConsecutive, o)
	case b.p.FailureRatio > 0:
		total, failed := b.count(now)
		if total >= b.p.MinVolume && total > 0 && float64(failed) >= b.p.FailureRatio*float64(total) {
			return b.open(now, CauseRatio, o)
		}
	}
	return Transition{}
}

// push adds an outcome to the window, dropping the oldest when full.
func (b *Breaker) push(now time.Time, failed bool) {
	s := sample{at: now, failed: failed}
	if len(b.window) < b.p.WindowSize {
		b.window = append(b.window, s)
		return
	}
	b.window[b.head] = s
	b.head = (b.head + 1) % len(b.window)
}

// count returns the outcomes in the window no older than Window, and how
// many of them failed.
func (b *Breaker) count(now time.Time) (total, failed int) {
	from := now.Add(-b.p.Window)
	for _, s := range b.window {
		if s.at.Before(from) {
			continue
		}
		total++
		if s.failed {
			failed++
		}
	}
	return total, failed
}

// open moves to BreakerOpen for the period o signals, else for the backoff
// of this open: MinOpen × 2^(opens-1) × (1 + Jitter×u), capped at MaxOpen.
func (b *Breaker) open(now time.Time, cause BreakerCause, o Outcome) Transition {
	opens := b.opens + 1
	var d time.Duration
	if o.DependencyDown && o.RetryAfter > 0 {
		d = min(o.RetryAfter, b.p.MaxOpen)
	} else {
		d = b.backoff(opens)
	}
	t := b.move(now, BreakerOpen, cause, d)
	b.opens = opens
	b.until = now.Add(d)
	t.Opens = opens
	return t
}

func (b *Breaker) backoff(opens int) time.Duration {
	base := scale(b.p.MinOpen, math.Pow(2, float64(min(opens-1, 62))))
	base = min(base, b.p.MaxOpen)
	d := addDur(base, scale(base, b.p.Jitter*unitFloat(b.rnd)))
	return min(max(d, 0), b.p.MaxOpen)
}

// move changes state, starts a new period and resets what belongs to the
// old one.
func (b *Breaker) move(now time.Time, to BreakerState, cause BreakerCause, openFor time.Duration) Transition {
	t := Transition{From: b.state, To: to, Cause: cause, At: now, OpenFor: openFor}
	b.state = to
	b.period++
	b.consecutive = 0
	b.window, b.head = b.window[:0], 0
	b.probesOut, b.probesOK = 0, 0
	b.until = time.Time{}
	if to == BreakerClosed {
		b.opens = 0
	}
	return t
}

// Status is a snapshot of the breaker: its state, the end of the open
// period (BreakerOpen) and the open periods since it last closed. It does
// not move the breaker: an open breaker past its deadline stays open until
// the next Admit or Tick.
func (b *Breaker) Status() (state BreakerState, until time.Time, opens int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.state, b.until, b.opens
}

// State is Status's state alone.
func (b *Breaker) State() BreakerState {
	st, _, _ := b.Status()
	return st
}

// Probes are the probes in flight and those that succeeded
// (BreakerHalfOpen).
func (b *Breaker) Probes() (inFlight, succeeded int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.probesOut, b.probesOK
}
