package consumer

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/config"
	"github.com/dlxbridge/dlxbridge/quarantine"
	"github.com/dlxbridge/dlxbridge/triage"
	"github.com/dlxbridge/dlxbridge/wire"
)

// Replay jobs and automatic redrive, the runtime's part (docs/quarantine.md):
//   - jobRecorder: when the runtime settles a message a replay sent (its
//     job headers signed with the key), it records what became of it in
//     that job: a signed replay-outcome event, written in batches.
//   - redriver: each queue whose quarantine.auto_redrive is on or dry-run
//     writes its breaker's outages as outage-started and outage-ended
//     events, and once the breaker has stayed closed for the delay, replays
//     what the outages parked (quarantine.Replayer.Redrive), stopping it
//     when the breaker reopens or replayed messages fail again.

// flushEvery is how often the job recorder writes what it has.
const flushEvery = 200 * time.Millisecond

// jobKey groups recorded outcomes into one event.
type jobKey struct{ queue, run, outcome string }

// jobRecorder keeps the outcomes of replayed messages until they are
// written. Safe for concurrent use.
type jobRecorder struct {
	v *triage.Signer

	mu      sync.Mutex
	pending map[jobKey][]string
	// watch, by run: an automatic redrive of this process counting its
	// messages' outcomes (failed: anything but handled).
	watch map[string]func(failed bool)
}

func newJobRecorder(v *triage.Signer) *jobRecorder {
	if v == nil {
		return nil // nothing to verify the evidence with, nor to sign with
	}
	return &jobRecorder{v: v, pending: map[jobKey][]string{}, watch: map[string]func(bool){}}
}

// settled records what became of d, settled on queue as result, if a
// replay with the key sent it. The success path pays a header lookup.
func (jr *jobRecorder) settled(queue string, d *amqp.Delivery, result Outcome) {
	if jr == nil || d == nil {
		return
	}
	if _, ok := d.Headers[wire.HeaderReplayJob]; !ok {
		return
	}
	var outcome string
	failed := true
	switch result {
	case OutcomeAcked:
		outcome, failed = quarantine.JobHandled, false
	case OutcomeQuarantined, OutcomeDeadLettered:
		outcome = quarantine.JobQuarantinedAgain
	case OutcomeRetried:
		// Still pending in the job; a failure for the stop rule.
	default:
		return
	}
	if !jr.v.VerifyReplayJob(queue, d.MessageId, d.Body, d.Headers).Valid {
		return
	}
	run, _ := d.Headers[wire.HeaderReplayJob].(string)
	rec, _ := d.Headers[wire.HeaderReplayRecord].(string)
	if run == "" || rec == "" {
		return
	}
	jr.mu.Lock()
	if outcome != "" {
		k := jobKey{queue, run, outcome}
		jr.pending[k] = append(jr.pending[k], rec)
	}
	w := jr.watch[run]
	jr.mu.Unlock()
	if w != nil {
		w(failed)
	}
}

// take removes and returns what waits to be written.
func (jr *jobRecorder) take() map[jobKey][]string {
	jr.mu.Lock()
	defer jr.mu.Unlock()
	if len(jr.pending) == 0 {
		return nil
	}
	out := jr.pending
	jr.pending = map[jobKey][]string{}
	return out
}

// putBack returns what could not be written, for the next try.
func (jr *jobRecorder) putBack(m map[jobKey][]string) {
	jr.mu.Lock()
	defer jr.mu.Unlock()
	for k, ids := range m {
		jr.pending[k] = append(ids, jr.pending[k]...)
	}
}

func (jr *jobRecorder) setWatch(run string, f func(failed bool)) {
	jr.mu.Lock()
	defer jr.mu.Unlock()
	if f == nil {
		delete(jr.watch, run)
	} else {
		jr.watch[run] = f
	}
}

// flush writes each pending group as one signed replay-outcome event.
func (jr *jobRecorder) flush(ctx context.Context, rp *quarantine.Replayer) error {
	m := jr.take()
	var err error
	for k, ids := range m {
		if err != nil {
			continue
		}
		if err = rp.RecordOutcome(ctx, k.queue, k.run, k.outcome, ids); err == nil {
			delete(m, k)
		}
	}
	if len(m) > 0 {
		jr.putBack(m)
	}
	return err
}

// startJobRecorder writes the recorded outcomes over conn every flushEvery
// until the session ends, then once more. The returned stop waits for it.
func (c *Consumer) startJobRecorder(ctx context.Context, conn *amqp.Connection) (stop func()) {
	jr := c.deps.jobs
	if jr == nil {
		return func() {}
	}
	rp := &quarantine.Replayer{Conn: conn, Config: c.cfg.File, Now: c.cfg.Now, Signer: c.deps.verifier, By: "runtime@" + c.deps.host}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		timer := time.NewTimer(flushEvery)
		defer timer.Stop()
		var retry flushRetry
		for {
			select {
			case <-ctx.Done():
				fctx, fcancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
				_ = jr.flush(fctx, rp)
				fcancel()
				return
			case <-timer.C:
				err := jr.flush(ctx, rp)
				if ctx.Err() != nil {
					continue
				}
				wait, warn, recovered := retry.next(err)
				switch {
				case warn:
					c.log.Warn("replay jobs: could not record outcomes; trying again, less often while it fails", "error", err)
				case recovered:
					c.log.Info("replay jobs: recording outcomes again")
				}
				timer.Reset(wait)
			}
		}
	}()
	return func() { cancel(); <-done }
}

// flushMaxWait is the longest the job recorder waits between writes while
// they fail.
const flushMaxWait = 30 * time.Second

// flushRetry paces the job recorder's writes: every flushEvery while they
// succeed; after a failure twice the last wait, up to flushMaxWait, with a
// warning at the first failure of a run only. A write that cannot succeed
// (its events stream deleted) would otherwise log a warning, and open and
// close a channel, five times a second for as long as it lasts. Pure.
type flushRetry struct {
	wait    time.Duration
	failing bool
}

// next takes a write's error and returns the wait before the next, whether
// to warn (the first failure of a run), and whether writing recovered.
func (f *flushRetry) next(err error) (wait time.Duration, warn, recovered bool) {
	if err == nil {
		recovered, f.failing, f.wait = f.failing, false, flushEvery
		return flushEvery, false, recovered
	}
	warn = !f.failing
	f.failing = true
	f.wait = min(max(2*f.wait, 2*flushEvery), flushMaxWait)
	return f.wait, warn, false
}

// stopRule decides when an automatic redrive stops because its messages
// fail again: once failed is at least ratio of what was settled, counting
// at least minSample settled (so that one failure among the first few
// stops it). Pure.
type stopRule struct {
	ratio     float64
	minSample int
}

// stopRuleSample is how many settled messages the stop rule counts at
// least.
const stopRuleSample = 5

func (s stopRule) stop(handled, failed int) bool {
	n := max(handled+failed, s.minSample)
	return failed > 0 && float64(failed) >= s.ratio*float64(n)
}

// queueOutage is one queue's automatic redrive state in this process.
type queueOutage struct {
	cfg *config.Queue
	qb  *queueBreaker
	// current is the outage this process is in (its window's start
	// written), nil when none.
	current *quarantine.OutageWindow
	// due is when to redrive (the breaker closed, plus the delay); zero
	// when nothing is due.
	due time.Time
	// pending: an ended outage may hold records not yet redriven (one
	// ended, or a redrive stopped or failed), until a redrive finishes.
	pending bool
	// running: a redrive of the queue runs; cancel ends it with a cause.
	running bool
	cancel  context.CancelCauseFunc
	// dryRunLast: the digest of the last dry run's plan logged.
	dryRunLast [sha256.Size]byte
}

// dryRunNew reports whether plan is one to log: not empty, and not the
// one logged last. In dry-run mode no window is ever covered, so each
// trigger plans every record of every window so far: it keeps a digest of
// the last plan, not every plan (which grew with the square of the
// records).
func (qo *queueOutage) dryRunNew(plan []quarantine.Planned) bool {
	if len(plan) == 0 {
		return false
	}
	h := sha256.New()
	for _, p := range plan {
		fmt.Fprintf(h, "%s\x00%s\x00%d\x00%s\n", p.ID, p.ToQueue, p.Redrives, p.Refused)
	}
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	if sum == qo.dryRunLast {
		return false
	}
	qo.dryRunLast = sum
	return true
}

// dryRunRetained is how many bytes dryRunNew keeps.
func (qo *queueOutage) dryRunRetained() int { return len(qo.dryRunLast) }

// outageWrite is an outage event waiting to be written.
type outageWrite struct {
	w     quarantine.OutageWindow
	ended bool
}

// redriver carries out automatic redrive for the queues that have it on.
// Breaker transitions reach it from any goroutine (transition); a
// goroutine per session writes their events and starts the redrives.
type redriver struct {
	d     *deps
	jobs  *jobRecorder
	kick  chan struct{}
	mu    sync.Mutex
	q     map[string]*queueOutage
	write []outageWrite
}

func newRedriver(d *deps, jobs *jobRecorder, queues map[string]*queueRuntime) *redriver {
	rd := &redriver{d: d, jobs: jobs, kick: make(chan struct{}, 1), q: map[string]*queueOutage{}}
	for name, qr := range queues {
		if qr.cfg.Quarantine.AutoRedrive.On() && qr.breaker != nil { // config refuses it without one
			rd.q[name] = &queueOutage{cfg: qr.cfg, qb: qr.breaker}
		}
	}
	if len(rd.q) == 0 {
		return nil
	}
	if jobs == nil {
		d.log.Warn("quarantine.auto_redrive is on, but no signing key is configured (security.signing_key_env): nothing is redriven automatically")
		return nil
	}
	return rd
}

func (rd *redriver) wake() {
	select {
	case rd.kick <- struct{}{}:
	default:
	}
}

// transition takes a breaker transition of queue at now: an open from
// closed starts an outage, a close ends it and makes a redrive due after
// the delay, and any open stops a redrive that runs.
func (rd *redriver) transition(queue string, t triage.Transition, now time.Time) {
	if rd == nil {
		return
	}
	rd.mu.Lock()
	defer rd.mu.Unlock()
	qo := rd.q[queue]
	if qo == nil {
		return
	}
	switch t.To {
	case triage.BreakerOpen:
		qo.due = time.Time{}
		if qo.running && qo.cancel != nil {
			qo.cancel(errors.New("the circuit breaker reopened"))
		}
		if qo.current == nil {
			w := quarantine.OutageWindow{ID: rand.Text()[:12], Queue: queue, From: now.UTC()}
			qo.current = &w
			rd.write = append(rd.write, outageWrite{w: w})
		}
	case triage.BreakerHalfOpen:
		// A queue with nothing left to probe with stays half-open: a
		// redrive of an earlier outage that failures stopped starts
		// again, its first message the probe (one a second on the ramp).
		// If the dependency is still down the probe fails, the breaker
		// reopens and the redrive stops after that one message.
		if qo.pending && !qo.running {
			qo.due = now
		}
	case triage.BreakerClosed:
		if qo.current != nil {
			w := *qo.current
			w.Until = now.UTC()
			rd.write = append(rd.write, outageWrite{w: w, ended: true})
			qo.current = nil
		}
		qo.pending = true
		qo.due = now.Add(qo.cfg.Quarantine.AutoRedrive.DelayValue())
	}
	rd.wake()
}

// run writes outage events and starts the redrives that are due, over
// conn, until ctx ends. At its start it reads the windows on the broker:
// an outage some process started and nobody ended (a runtime killed in
// it, or another replica's) is ended now if this process's breaker is
// closed (the breaker's state was not kept; the ramp and the stop rule
// guard a dependency still down), else adopted as the current outage; an
// ended one not yet redriven makes a redrive due.
func (rd *redriver) run(ctx context.Context, conn *amqp.Connection) {
	rp := &quarantine.Replayer{Conn: conn, Config: rd.d.cfg.File, Registry: rd.d.cfg.Registry, Now: rd.d.cfg.Now,
		Signer: rd.d.verifier, By: quarantine.AutoBy, TracerProvider: rd.d.cfg.TracerProvider}
	// The windows are read again until a read succeeds: until then, an
	// outage that ended before this session and was not redriven, or that
	// a killed runtime never ended, waits for the breaker's next close.
	adoptWait := redriveFailedWait
	if h := rd.d.cfg.hooks; h != nil && h.redriveAfterFailedAdopt > 0 {
		adoptWait = h.redriveAfterFailedAdopt
	}
	var adoptAt time.Time // zero once read
	adopt := func() {
		err := rd.adopt(ctx, rp)
		if h := rd.d.cfg.hooks; h != nil && h.adopted != nil {
			h.adopted(err)
		}
		adoptAt = time.Time{}
		if err != nil && ctx.Err() == nil {
			adoptAt = time.Now().Add(adoptWait)
			rd.d.log.Warn("automatic redrive: could not read the outage windows; trying again", "in", adoptWait, "error", err)
		}
	}
	adopt()
	var redrives sync.WaitGroup
	defer redrives.Wait()
	retry := time.NewTimer(time.Hour)
	defer retry.Stop()
	for {
		if !adoptAt.IsZero() && !time.Now().Before(adoptAt) {
			adopt()
		}
		next := rd.step(ctx, rp, &redrives)
		if !adoptAt.IsZero() && (next.IsZero() || adoptAt.Before(next)) {
			next = adoptAt
		}
		if !next.IsZero() {
			retry.Reset(max(time.Until(next), time.Millisecond))
		}
		select {
		case <-ctx.Done():
			return
		case <-rd.kick:
		case <-retry.C:
		}
	}
}

// adopt reads the windows on the broker (see run).
func (rd *redriver) adopt(ctx context.Context, rp *quarantine.Replayer) error {
	in := &quarantine.Inspector{Conn: rp.Conn, Config: rp.Config, Verifier: rp.Signer, OmitBodies: true}
	events, err := in.Events(ctx)
	if err != nil {
		return err
	}
	now := rd.d.cfg.Now()
	rd.mu.Lock()
	defer rd.mu.Unlock()
	for name, qo := range rd.q {
		ended, ongoing := quarantine.PendingWindows(events, name)
		state, _, _ := qo.qb.b.Status()
		for _, w := range ongoing {
			if qo.current != nil && qo.current.ID == w.ID {
				continue
			}
			if state == triage.BreakerClosed {
				w.Until = now.UTC()
				rd.write = append(rd.write, outageWrite{w: w, ended: true})
				ended = append(ended, w)
			} else if qo.current == nil {
				cp := w
				qo.current = &cp
			}
		}
		if len(ended) > 0 {
			qo.pending = true
			if state == triage.BreakerClosed && qo.due.IsZero() {
				qo.due = now.Add(qo.cfg.Quarantine.AutoRedrive.DelayValue())
			}
		}
	}
	return nil
}

// step writes the waiting outage events, then starts each redrive that is
// due. It returns when to look again (zero: at the next kick).
func (rd *redriver) step(ctx context.Context, rp *quarantine.Replayer, redrives *sync.WaitGroup) time.Time {
	rd.mu.Lock()
	writes := rd.write
	rd.write = nil
	rd.mu.Unlock()
	for i, ow := range writes {
		if err := rp.Outage(ctx, ow.w, ow.ended); err != nil {
			if ctx.Err() == nil {
				rd.d.log.Warn("automatic redrive: could not write an outage event; trying again", "queue", ow.w.Queue, "error", err)
			}
			rd.mu.Lock()
			rd.write = append(writes[i:], rd.write...)
			rd.mu.Unlock()
			return time.Now().Add(time.Second)
		}
	}
	now := rd.d.cfg.Now()
	var next time.Time
	rd.mu.Lock()
	defer rd.mu.Unlock()
	for name, qo := range rd.q {
		if qo.due.IsZero() || qo.running {
			continue
		}
		state, _, _ := qo.qb.b.Status()
		if state == triage.BreakerOpen {
			continue // its half-open or close makes it due again
		}
		if state == triage.BreakerHalfOpen && !workQueueEmpty(rp.Conn, name) {
			// The queue's own messages probe; its close makes it due.
			qo.due = time.Time{}
			continue
		}
		if qo.due.After(now) {
			if next.IsZero() || qo.due.Before(next) {
				next = qo.due
			}
			continue
		}
		qo.due, qo.running = time.Time{}, true
		rctx, cancel := context.WithCancelCause(ctx)
		qo.cancel = cancel
		redrives.Add(1)
		go func() {
			defer redrives.Done()
			again, finished := rd.redrive(rctx, rp, name, qo)
			cancel(nil)
			rd.mu.Lock()
			qo.running, qo.cancel = false, nil
			if finished && qo.current == nil && qo.due.IsZero() {
				qo.pending = false
			}
			if !again.IsZero() && qo.due.IsZero() {
				qo.due = again
			}
			rd.mu.Unlock()
			rd.wake()
		}()
	}
	return next
}

// redrive runs one automatic redrive of queue; it returns when to try
// again (zero: at the next half-open or close) and whether it finished
// (nothing left of the windows it read).
func (rd *redriver) redrive(ctx context.Context, rp *quarantine.Replayer, queue string, qo *queueOutage) (again time.Time, finished bool) {
	ar := qo.cfg.Quarantine.AutoRedrive
	log := rd.d.log.With("queue", queue)
	rule := stopRule{ratio: ar.StopRatio, minSample: stopRuleSample}
	var run string
	var mu sync.Mutex
	handled, failed := 0, 0
	cancel := qo.cancel
	opts := quarantine.RedriveOptions{Queue: queue, DryRun: ar.Mode == config.RedriveDryRun, Rate: ar.Rate,
		Lookback: qo.cfg.Breaker.Window,
		Started: func(r string) {
			run = r
			log.Info("automatic redrive started", "job", r)
			rd.jobs.setWatch(r, func(f bool) {
				mu.Lock()
				defer mu.Unlock()
				if f {
					failed++
				} else {
					handled++
				}
				if rule.stop(handled, failed) {
					cancel(fmt.Errorf("failures returned: %d of %d replayed messages settled so far failed again (stop_ratio %g)", failed, handled+failed, ar.StopRatio))
				}
			})
		}}
	res, err := rp.Redrive(ctx, opts)
	if run != "" {
		rd.jobs.setWatch(run, nil)
	}
	if h := rd.d.cfg.hooks; h != nil && h.redrive != nil {
		h.redrive(queue, res, err)
	}
	wait, finished := redriveAgain(res, err, ctx.Err() != nil)
	if wait > 0 {
		again = time.Now().Add(wait)
	}
	switch {
	case errors.Is(err, quarantine.ErrLocked):
		return again, finished
	case err != nil && res == nil:
		if ctx.Err() == nil {
			log.Warn("automatic redrive failed; trying again", "in", wait, "error", err)
		}
		return again, finished
	}
	if opts.DryRun {
		if qo.dryRunNew(res.Plan) {
			ids := make([]string, 0, len(res.Plan))
			for _, p := range res.Plan {
				ids = append(ids, p.ID)
			}
			log.Info("automatic redrive (dry run): would replay", "selected", res.Selected, "ids", ids)
		}
		return time.Time{}, true
	}
	attrs := []any{"job", res.Run, "selected", res.Selected, "sent", len(res.Sent), "refused", len(res.Invalid) + len(res.OverBudget)}
	switch {
	case err != nil && wait > 0:
		log.Warn("automatic redrive failed; the rest stay open, trying again", append(attrs, "in", wait, "error", err)...)
	case res.Stopped:
		log.Warn("automatic redrive stopped; the rest stay open until the breaker closes again", append(attrs, "why", res.Stop)...)
	case res.Selected > 0:
		log.Info("automatic redrive done", attrs...)
	}
	return again, finished
}

// Waits before an automatic redrive is tried again without a breaker
// transition.
const (
	// redriveLockedWait: another replica (or an operator) holds the lock;
	// the windows it covers are then redriven.
	redriveLockedWait = 10 * time.Second
	// redriveFailedWait: it failed (to read, or to send: the work queue
	// full, a publish refused) while the dependency was fine.
	redriveFailedWait = 30 * time.Second
)

// redriveAgain decides, from how an automatic redrive ended (ctxDone: its
// context ended, by a stop or the session's end), how long to wait before
// trying again without a breaker transition (0: not until the next
// half-open or close) and whether it finished (nothing left of the
// windows it read). A redrive that ended with an error while nobody
// stopped it is tried again: its records are open, and the next outage
// may be weeks away. Pure.
func redriveAgain(res *quarantine.ReplayResult, err error, ctxDone bool) (time.Duration, bool) {
	switch {
	case errors.Is(err, quarantine.ErrLocked):
		return redriveLockedWait, false
	case err != nil && ctxDone:
		return 0, false
	case err != nil:
		return redriveFailedWait, false
	case res == nil:
		return 0, false
	}
	return 0, !res.Stopped
}

// startRedriver runs the redriver over conn, the publishing connection (it
// publishes outage events and replays: during a resource alarm the broker
// stops reading from a connection once it publishes, and on the consuming
// connection that would stall every ack), until the session ends. The
// returned stop waits for it and for the redrives it started.
func (c *Consumer) startRedriver(ctx context.Context, conn *amqp.Connection) (stop func()) {
	rd := c.deps.redrive
	if rd == nil {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		rd.run(ctx, conn)
	}()
	return func() { cancel(); <-done }
}

// workQueueEmpty reports whether queue holds no ready message (a failed
// check counts as not empty: the redrive then waits for the close).
func workQueueEmpty(conn *amqp.Connection, queue string) bool {
	ch, err := conn.Channel()
	if err != nil {
		return false
	}
	defer ch.Close()
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	return err == nil && q.Messages == 0
}
