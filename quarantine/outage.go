package quarantine

import (
	"context"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/dlxbridge/dlxbridge/internal/amqpx"
	"github.com/dlxbridge/dlxbridge/triage"
)

// Automatic redrive (docs/quarantine.md): the runtime writes an
// outage-started event when a queue's breaker opens from closed and an
// outage-ended event when it closes again, into the queue's events
// stream; then it replays the queue's open transient and timeout records
// whose failure fell inside the outages not yet redriven (Replayer.Redrive).
// The windows live on the broker, so a runtime that restarts neither loses
// one nor replays one twice, and replicas share them: a redrive reads them
// under the quarantine's replay lock, up to its claim.

// AutoBy is who an automatic redrive is in the audit trail.
const AutoBy = "auto:breaker"

// OutageWindow is one outage of a queue: from when its breaker opened
// (less the lookback, see Redrive) to when it closed (zero while open).
type OutageWindow struct {
	ID    string    `json:"id"`
	Queue string    `json:"queue"`
	From  time.Time `json:"from"`
	Until time.Time `json:"until,omitzero"`
}

// PendingWindows are queue's outages that have ended and that no finished
// (not stopped) automatic redrive covered up to their end, oldest first,
// and those still going on (Until zero). Only events that verified count:
// anyone who may publish to the default exchange can write an event, and
// a forged window would make the runtime replay. An outage ended twice
// (two replicas, or a restart) ends at the later end. It is pure.
//
// A finished automatic redrive covers what it read: every window of the
// queue, up to the end it had, whose end precedes the redrive's claim in
// the stream (a redrive reads the events up to its claim). Its events
// name at most a few of them (eventWindows): a flapping breaker leaves a
// window per flap, and events that listed them all would grow the stream
// with the square of the flaps. Windows an event does name (as the first
// version of automatic redrive wrote them all) count as covered too.
func PendingWindows(events []Event, queue string) (ended, ongoing []OutageWindow) {
	byID := map[string]*OutageWindow{}
	var order []string
	covered := map[string]time.Time{}
	type end struct {
		at    int // index in events
		until time.Time
	}
	ends := map[string][]end{}  // window id -> its ends, in stream order
	claimed := map[string]int{} // run -> index of its claim, for this queue's automatic redrives
	filter := autoFilter(queue)
	for i := range events {
		e := &events[i]
		if !e.Verified {
			continue
		}
		switch e.Kind {
		case EventClaimed:
			if _, seen := claimed[e.Run]; !seen && e.By == AutoBy && e.Filter == filter {
				claimed[e.Run] = i
			}
		case EventOutageStarted, EventOutageEnded:
			w := e.Window
			if w == nil || w.ID == "" || w.Queue != queue {
				continue
			}
			cur, ok := byID[w.ID]
			if !ok {
				cp := *w
				byID[w.ID], cur = &cp, &cp
				order = append(order, w.ID)
			}
			// An end carries the whole window: a start lost (a crash
			// before it was written) loses nothing.
			if !w.From.IsZero() && (cur.From.IsZero() || w.From.Before(cur.From)) {
				cur.From = w.From
			}
			if w.Until.After(cur.Until) {
				cur.Until = w.Until
			}
			if !w.Until.IsZero() {
				ends[w.ID] = append(ends[w.ID], end{i, w.Until})
			}
		case EventReplayFinished:
			if e.By != AutoBy || e.Counts["stopped"] != 0 {
				continue
			}
			for _, w := range e.Windows {
				if w.Queue == queue && w.Until.After(covered[w.ID]) {
					covered[w.ID] = w.Until
				}
			}
			c, ok := claimed[e.Run]
			if !ok {
				continue
			}
			for id, es := range ends {
				for _, x := range es {
					if x.at < c && x.until.After(covered[id]) {
						covered[id] = x.until
					}
				}
			}
		}
	}
	for _, id := range order {
		w := *byID[id]
		switch {
		case w.From.IsZero():
			// No start to bound it with.
		case w.Until.IsZero():
			ongoing = append(ongoing, w)
		case covered[id].Before(w.Until):
			ended = append(ended, w)
		}
	}
	slices.SortStableFunc(ended, func(a, b OutageWindow) int { return a.From.Compare(b.From) })
	return ended, ongoing
}

// autoFilter is the filter an automatic redrive of queue writes into its
// events (its claim among them).
func autoFilter(queue string) string { return "auto: outages of " + queue }

// eventWindows is how many of its windows an automatic redrive names in
// its events (the job shows them); Counts["windows"] says how many it
// covers.
const eventWindows = 10

// named are the first eventWindows of windows.
func named(windows []OutageWindow) []OutageWindow {
	return windows[:min(len(windows), eventWindows)]
}

// redriveClasses are the classes an outage explains: a dependency signal
// (triage.DependencyDown) is classed transient. Never permanent, schema,
// crash-loop, panic or a broker dead letter's.
var redriveClasses = []triage.Class{triage.ClassTransient, triage.ClassTimeout}

// inWindows reports whether automatic redrive may replay r for queue: an
// open record of the queue, its envelope the runtime's (verified, source
// bridge), its class transient or timeout, and its last failure (else its
// quarantine time) inside one of windows, whose start is moved back by
// lookback (the failures that opened the breaker came just before it). It
// is pure.
func inWindows(r *Record, queue string, windows []OutageWindow, lookback time.Duration) bool {
	env := &r.Envelope
	if r.State != StateOpen || r.Queue != queue || !env.Verified || env.Source != SourceBridge ||
		!slices.Contains(redriveClasses, env.Class) || env.PayloadOmitted != nil {
		return false
	}
	at := env.LastFailureAt
	if at.IsZero() {
		at = r.Seen()
	}
	for _, w := range windows {
		if !at.Before(w.From.Add(-lookback)) && !at.After(w.Until) {
			return true
		}
	}
	return false
}

// ramp paces an automatic redrive: a second at each of rampSteps' rates
// below max, then max. At sends message n (from 0) no earlier than start
// plus At(n). Pure.
type ramp struct{ max float64 }

// rampSteps are the rates, messages per second, a ramp climbs through.
var rampSteps = []float64{1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000}

// At is when message n may leave, from the start. Within each step of
// rate r (for a second, at least one message) messages leave 1/r apart.
func (rm ramp) At(n int) time.Duration {
	var t float64 // seconds
	for _, r := range rampSteps {
		if r >= rm.max {
			break
		}
		k := int(r) // messages in this one-second step
		if n < k {
			return secs(t + float64(n)/r)
		}
		n -= k
		t++
	}
	return secs(t + float64(n)/rm.max)
}

func secs(s float64) time.Duration {
	if s > math.MaxInt64/float64(time.Second) {
		return math.MaxInt64
	}
	return time.Duration(s * float64(time.Second))
}

// rampPacer waits for each message's time on its ramp.
type rampPacer struct {
	ramp  ramp
	start time.Time
	n     int
}

func (p *rampPacer) wait(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if p.start.IsZero() {
		p.start = time.Now()
	}
	d := time.Until(p.start.Add(p.ramp.At(p.n)))
	p.n++
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// RedriveOptions say which queue's outages an automatic redrive replays.
type RedriveOptions struct {
	// Queue is the work queue. Required.
	Queue string
	// DryRun plans and sends nothing (and takes no lock).
	DryRun bool
	// Rate is the ramp's highest pace, messages per second. Required.
	Rate float64
	// Lookback moves each window's start back (the failures that opened
	// the breaker came before it opened): the queue's breaker window.
	Lookback time.Duration
	// Started, when set, is called with the job's id once it starts
	// sending (not in a dry run), so that the caller can watch its
	// messages' outcomes and end ctx (context.WithCancelCause: the cause
	// is written as the job's stop) when failures return.
	Started func(run string)
}

// Redrive replays queue's open records that inWindows selects for the
// outages PendingWindows finds (read under the quarantine's replay lock,
// up to this run's claim: two replicas never redrive one window twice),
// through every replay rule (schema check, leaving out what fails it;
// redrive budget; audit events by AutoBy, the windows written into its
// replay-started and replay-finished events), paced on the ramp up to
// opts.Rate. A finished run marks its windows redriven; a stopped one
// (ctx ended, its cause the stop) leaves them pending, and the records it
// did not send open. A lock held elsewhere returns ErrLocked at once.
func (rp *Replayer) Redrive(ctx context.Context, opts RedriveOptions) (*ReplayResult, error) {
	if opts.Queue == "" || math.IsNaN(opts.Rate) || opts.Rate < MinRate {
		return nil, fmt.Errorf("redrive: a queue and a rate of at least %g messages per second are required", MinRate)
	}
	auto := &autoSelect{queue: opts.Queue, lookback: opts.Lookback}
	return rp.Replay(ctx, ReplayOptions{
		Filter: Filter{Queue: opts.Queue}, DryRun: opts.DryRun, SkipInvalid: true,
		Reason:  "automatic redrive: the circuit breaker of " + opts.Queue + " closed after an outage",
		Started: func(r *ReplayResult) { startedRun(opts.Started, r) },
		auto:    auto, ramp: &ramp{max: opts.Rate},
	})
}

func startedRun(f func(string), r *ReplayResult) {
	if f != nil {
		f(r.Run)
	}
}

// autoSelect is an automatic redrive's selection, made under the lock.
type autoSelect struct {
	queue    string
	lookback time.Duration
	// windows: the ended windows it covers, set by pick.
	windows []OutageWindow
}

func (a *autoSelect) pick(snap *Snapshot) []*Record {
	a.windows, _ = PendingWindows(snap.Events, a.queue)
	var out []*Record
	if len(a.windows) == 0 {
		return out
	}
	for _, r := range snap.Records {
		if inWindows(r, a.queue, a.windows, a.lookback) {
			out = append(out, r)
		}
	}
	return out
}

// Outage writes w's outage-started (ended false) or outage-ended event
// into the events stream of queue's quarantine, signed. It needs the
// Signer: an unsigned window counts for no reader.
func (rp *Replayer) Outage(ctx context.Context, w OutageWindow, ended bool) error {
	if rp.Signer == nil {
		return fmt.Errorf("outage: no signing key")
	}
	qc, ok := rp.Config.QueueByName(w.Queue)
	if !ok {
		return fmt.Errorf("outage: queue %q is not in the config", w.Queue)
	}
	pub, err := amqpx.NewPublisher(rp.Conn)
	if err != nil {
		return err
	}
	defer pub.Close()
	kind := EventOutageStarted
	if ended {
		kind = EventOutageEnded
	}
	e := Event{Kind: kind, At: rp.now().UTC(), By: rp.by(), Run: w.ID, Window: &w}
	return publishEvent(ctx, pub, rp.Signer, qc.Quarantine.EventsStream(), e)
}
