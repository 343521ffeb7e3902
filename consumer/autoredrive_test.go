package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/config"
	"github.com/dlxbridge/dlxbridge/internal/brokertest"
	"github.com/dlxbridge/dlxbridge/quarantine"
	"github.com/dlxbridge/dlxbridge/triage"
	"github.com/dlxbridge/dlxbridge/wire"
)

func TestStopRule(t *testing.T) {
	r := stopRule{ratio: 0.2, minSample: stopRuleSample}
	cases := []struct {
		handled, failed int
		want            bool
	}{
		{0, 0, false},
		{0, 1, true}, // one failure among the first five is a share of 1/5
		{3, 1, true},
		{4, 1, true},
		{5, 1, false}, // 1 of 6
		{8, 2, true},
		{9, 2, false},
		{100, 0, false},
	}
	for _, c := range cases {
		if got := r.stop(c.handled, c.failed); got != c.want {
			t.Errorf("stop(%d handled, %d failed) = %v, want %v", c.handled, c.failed, got, c.want)
		}
	}
	if (stopRule{ratio: 1, minSample: 5}).stop(1, 4) {
		t.Error("ratio 1 stopped with a success among five")
	}
}

func FuzzStopRule(f *testing.F) {
	f.Add(0.2, 3, 1)
	f.Fuzz(func(t *testing.T, ratio float64, handled, failed int) {
		if !(ratio > 0 && ratio <= 1) || handled < 0 || failed < 0 || handled > 1e6 || failed > 1e6 {
			t.Skip()
		}
		r := stopRule{ratio: ratio, minSample: stopRuleSample}
		if failed == 0 && r.stop(handled, failed) {
			t.Fatal("stopped without a failure")
		}
		// More failures never un-stop it; more successes never stop it.
		if r.stop(handled, failed) && !r.stop(handled, failed+1) {
			t.Fatal("one more failure un-stopped it")
		}
		if !r.stop(handled, failed) && r.stop(handled+1, failed) {
			t.Fatal("one more success stopped it")
		}
	})
}

// snapshotUntil reads the quarantine until ok says its snapshot is the
// one awaited (a stream has no event to wait on: this polls the broker).
func snapshotUntil(t *testing.T, in *quarantine.Inspector, within time.Duration, ok func(*quarantine.Snapshot) bool) *quarantine.Snapshot {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		snap, err := in.Snapshot(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if ok(snap) {
			return snap
		}
		if time.Now().After(deadline) {
			t.Fatalf("the quarantine did not reach the awaited state within %s: %d records", within, len(snap.Records))
		}
		time.Sleep(200 * time.Millisecond) // polling the broker
	}
}

func openOf(snap *quarantine.Snapshot, queue string) []*quarantine.Record {
	return snap.List(quarantine.Filter{Queue: queue})
}

// A replay job's per-message outcomes are what the handler saw: 100
// quarantined messages replayed; the handler succeeds for most, fails 10
// for good (quarantined again) and 10 for now (a retry lane holds them a
// minute: pending). The job, read back from the events stream, says
// exactly that per record, and its counts add up.
func TestReplayJobOutcomesMatchTheHandler(t *testing.T) {
	t.Parallel()
	const n = 100
	off := false
	b := setup(t, func(q *config.Queue) {
		q.Breaker.Enabled = &off
		q.Retry.Tiers = []time.Duration{time.Minute}
		q.Retry.MaxAttempts = 2
		q.Consumer.Concurrency = 4
	})
	b.cfg.hooks.keeper = true
	b.cfg.Logger = quietLogger(t)
	var mu sync.Mutex
	replayed := false
	saw := map[string]string{} // message id -> what the handler did after the replay
	settledAfter := make(chan Settled, 2*n)
	b.cfg.OnSettled = func(s Settled) {
		mu.Lock()
		after := replayed
		mu.Unlock()
		if after {
			settledAfter <- s
		}
	}
	for i := range n {
		b.publishJSON(map[string]any{"id": fmt.Sprint(i)}, amqp.Publishing{MessageId: fmt.Sprintf("m-%03d", i)})
	}
	b.start(func(c *Consumer) {
		must(t, c.Handle(b.queue.Name, testType, HandlerFunc(func(_ context.Context, m *Message) error {
			mu.Lock()
			defer mu.Unlock()
			if !replayed {
				return triage.Permanent(errors.New("first time: parked"))
			}
			var i int
			fmt.Sscanf(m.MessageID, "m-%d", &i)
			switch i % 10 {
			case 0:
				saw[m.MessageID] = quarantine.JobQuarantinedAgain
				return triage.Permanent(errors.New("fails again for good"))
			case 1:
				saw[m.MessageID] = quarantine.JobPending
				return errors.New("fails again for now")
			}
			saw[m.MessageID] = quarantine.JobHandled
			return nil
		})))
	})
	signer, err := triage.NewSigner([]byte(testSigningKey))
	must(t, err)
	conn := b.env.Dial("replayer")
	in := &quarantine.Inspector{Conn: conn, Config: b.file, Verifier: signer, OmitBodies: true}
	snapshotUntil(t, in, 60*time.Second, func(s *quarantine.Snapshot) bool { return len(openOf(s, b.queue.Name)) == n })

	mu.Lock()
	replayed = true
	mu.Unlock()
	rp := &quarantine.Replayer{Conn: conn, Config: b.file, Registry: b.registry, Signer: signer, By: "test"}
	var started string
	res, err := rp.Replay(context.Background(), quarantine.ReplayOptions{Filter: quarantine.Filter{Queue: b.queue.Name},
		Reason: "job outcome test", Started: func(r *quarantine.ReplayResult) { started = r.Run }})
	must(t, err)
	if len(res.Sent) != n || started != res.Run {
		t.Fatalf("sent %d of %d, started %q, run %q", len(res.Sent), n, started, res.Run)
	}
	for range n {
		select {
		case <-settledAfter:
		case <-time.After(60 * time.Second):
			t.Fatal("not every replayed message was settled")
		}
	}
	byRecord := map[string]string{} // record id -> message id
	snap, err := in.Snapshot(context.Background())
	must(t, err)
	for _, r := range snap.Records {
		byRecord[r.ID] = r.Properties.MessageID
	}
	// The runtime writes outcomes every 200 ms: read until the 90 final
	// ones are in.
	var job *quarantine.Job
	deadline := time.Now().Add(30 * time.Second)
	for {
		jobs, err := in.Jobs(context.Background())
		must(t, err)
		job, err = quarantine.FindJob(jobs, res.Run)
		must(t, err)
		if job.Handled+job.QuarantinedAgain >= n-n/10 || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond) // polling the broker
	}
	mu.Lock()
	defer mu.Unlock()
	if len(saw) != n {
		t.Fatalf("the handler saw %d replayed messages, want %d", len(saw), n)
	}
	mismatch := 0
	for _, m := range job.Messages {
		if want := saw[byRecord[m.ID]]; m.Outcome != want {
			mismatch++
			t.Errorf("record %s (%s): job says %s, the handler saw %s", m.ID, byRecord[m.ID], m.Outcome, want)
		}
	}
	t.Logf("job %s: state %s, selected %d sent %d confirmed %d refused %d, handled %d quarantined again %d pending %d",
		job.ID, job.State, job.Selected, job.Sent, job.Confirmed, job.Refused, job.Handled, job.QuarantinedAgain, job.Pending)
	if job.State != quarantine.JobDone || job.Selected != n || job.Sent != n || job.Confirmed != n || job.Refused != 0 ||
		job.Handled != 80 || job.QuarantinedAgain != 10 || job.Pending != 10 || len(job.Messages) != n || mismatch != 0 || job.Unverified {
		t.Errorf("job %+v", *job)
	}
}

// quietLogger logs errors only: a test that quarantines on purpose makes a
// warning per message.
func quietLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelError}))
}

// A producer who copies the job headers onto a message of its own cannot
// make a record read as handled: without the replay's signature the
// runtime records nothing.
func TestForgedJobHeadersRecordNothing(t *testing.T) {
	signer, err := triage.NewSigner([]byte(testSigningKey))
	must(t, err)
	jr := newJobRecorder(signer)
	forged := &amqp.Delivery{MessageId: "m", Body: []byte(`{}`), Headers: amqp.Table{
		wire.HeaderReplayJob: "job1", wire.HeaderReplayRecord: "rec1"}}
	jr.settled("q", forged, OutcomeAcked)
	if len(jr.take()) != 0 {
		t.Fatal("an unsigned job header was recorded")
	}
	genuine := &amqp.Delivery{MessageId: "m", Body: []byte(`{}`), Headers: amqp.Table{
		wire.HeaderReplayJob: "job1", wire.HeaderReplayRecord: "rec1"}}
	genuine.Headers[wire.HeaderReplayJobSignature] = signer.SignReplayJob("q", "m", genuine.Body, genuine.Headers)
	jr.settled("q", genuine, OutcomeAcked)
	// Another body under the same signature: refused.
	copied := &amqp.Delivery{MessageId: "m", Body: []byte(`{"x":1}`), Headers: genuine.Headers}
	jr.settled("q", copied, OutcomeAcked)
	got := jr.take()
	if len(got) != 1 || len(got[jobKey{"q", "job1", quarantine.JobHandled}]) != 1 {
		t.Fatalf("recorded %v, want the one genuine outcome", got)
	}
}

// dependency is a handler's dependency that is down for a while, and can
// go down again.
type dependency struct {
	mu        sync.Mutex
	downUntil time.Time
	start     time.Time
	outage    time.Duration
	// calls are the handler's calls, in order.
	calls []depCall
	// onReplayed, if set, is told each replayed message's call (n from 1),
	// under mu; it may set downUntil.
	onReplayed func(n int, now time.Time)
	replayedN  int
	handled    map[string]int
}

type depCall struct {
	at       time.Time
	id       string
	job      string
	ok       bool
	redrives int
}

func newDependency(outage time.Duration) *dependency {
	return &dependency{outage: outage, handled: map[string]int{}}
}

func (d *dependency) handle(_ context.Context, m *Message) error {
	if err := d.call(m); err != nil {
		// A failing call takes a while (a timeout, say): the other
		// workers' messages are in hand when the breaker opens, and
		// spend their one attempt too.
		time.Sleep(100 * time.Millisecond)
		return err
	}
	return nil
}

func (d *dependency) call(m *Message) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	now := time.Now()
	if d.start.IsZero() {
		d.start, d.downUntil = now, now.Add(d.outage)
	}
	c := depCall{at: now, id: m.MessageID}
	c.job, _ = m.Headers[wire.HeaderReplayJob].(string)
	if c.job != "" {
		d.replayedN++
		if d.onReplayed != nil {
			d.onReplayed(d.replayedN, now)
		}
	}
	c.ok = !now.Before(d.downUntil)
	d.calls = append(d.calls, c)
	if !c.ok {
		return triage.DependencyDown(0, errors.New("payments API: 503"))
	}
	d.handled[m.MessageID]++
	return nil
}

// replayedCalls are the calls of messages a replay sent, by job.
func (d *dependency) replayedCalls() map[string][]depCall {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := map[string][]depCall{}
	for _, c := range d.calls {
		if c.job != "" {
			out[c.job] = append(out[c.job], c)
		}
	}
	return out
}

// rampAt20 is when the ramp to 20 a second sends message k (from 0): a
// second at 1, 2, 5 and 10 a second, then 20.
func rampAt20(k int) time.Duration {
	s := 0.0
	for _, step := range []struct{ n, rate float64 }{{1, 1}, {2, 2}, {5, 5}, {10, 10}} {
		if float64(k) < step.n {
			return time.Duration((s + float64(k)/step.rate) * float64(time.Second))
		}
		k -= int(step.n)
		s++
	}
	return time.Duration((s + float64(k)/20) * float64(time.Second))
}

func autoRedriveQueue(q *config.Queue) {
	q.Retry.MaxAttempts = 1 // a failure spends the budget: parked at once
	q.Consumer.Concurrency = 8
	q.Consumer.Prefetch = 10
	q.Breaker.MinOpen = time.Second
	q.Breaker.MaxOpen = 2 * time.Second
	delay := 300 * time.Millisecond
	q.Quarantine.AutoRedrive = config.AutoRedrive{Mode: config.RedriveOn, Rate: 20, StopRatio: 0.2, Delay: &delay}
}

// The scenario, in process: a handler's dependency is down for 10
// s with the breaker on; the messages in hand and the probes spend their
// one attempt and are quarantined; the dependency comes back, the breaker
// closes, and automatic redrive replays every one of them on its ramp
// (1, 2, 5, 10, then 20 a second), each handled. In the second case the
// dependency fails again at the third replayed message: the breaker
// reopens, the redrive stops with the rest open, and once the dependency
// is back for good the next close redrives the rest: every message is
// handled in the end.
func TestAutoRedriveAfterAnOutage(t *testing.T) {
	t.Parallel()
	for _, fails := range []bool{false, true} {
		name := "recovers"
		if fails {
			name = "failures-return"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			const n = 60
			b := setup(t, autoRedriveQueue)
			b.cfg.hooks.keeper = true
			b.cfg.Logger = slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelInfo}))
			dep := newDependency(10 * time.Second)
			if fails {
				dep.onReplayed = func(k int, now time.Time) {
					if k == 3 {
						dep.downUntil = now.Add(3 * time.Second)
					}
				}
			}
			var mu sync.Mutex
			var ends []*quarantine.ReplayResult
			ended := make(chan struct{}, 16)
			b.cfg.hooks.redrive = func(_ string, res *quarantine.ReplayResult, err error) {
				if err != nil {
					t.Logf("redrive: %v", err)
				}
				mu.Lock()
				ends = append(ends, res)
				mu.Unlock()
				ended <- struct{}{}
			}
			b.cfg.hooks.breaker = func(queue string, tr triage.Transition) { t.Logf("%s: %s", queue, tr) }
			allHandled := make(chan struct{})
			var once sync.Once
			b.cfg.OnSettled = func(s Settled) {
				dep.mu.Lock()
				done := len(dep.handled) == n
				dep.mu.Unlock()
				if done {
					once.Do(func() { close(allHandled) })
				}
			}
			for i := range n {
				b.publishJSON(map[string]any{"id": fmt.Sprint(i)}, amqp.Publishing{MessageId: fmt.Sprintf("m-%02d", i)})
			}
			b.start(func(c *Consumer) { must(t, c.Handle(b.queue.Name, testType, HandlerFunc(dep.handle))) })
			select {
			case <-allHandled:
			case <-time.After(120 * time.Second):
				dep.mu.Lock()
				defer dep.mu.Unlock()
				t.Fatalf("%d of %d messages handled", len(dep.handled), n)
			}
			signer, err := triage.NewSigner([]byte(testSigningKey))
			must(t, err)
			in := &quarantine.Inspector{Conn: b.env.Dial("inspector"), Config: b.file, Verifier: signer, OmitBodies: true}
			// The runtime writes outcomes every 200 ms: read until the
			// jobs have none pending.
			var jobs []quarantine.Job
			for deadline := time.Now().Add(20 * time.Second); ; {
				jobs, err = in.Jobs(context.Background())
				must(t, err)
				pending := 0
				for _, j := range jobs {
					pending += j.Pending
				}
				if pending == 0 || time.Now().After(deadline) {
					break
				}
				time.Sleep(200 * time.Millisecond) // polling the broker
			}
			events, err := in.Events(context.Background())
			must(t, err)
			// Every record replayed once: no replayed event names one twice.
			replayedBy := map[string]string{}
			for _, e := range events {
				if e.Kind == quarantine.EventReplayed {
					for _, id := range e.IDs {
						if prev, dup := replayedBy[id]; dup {
							t.Errorf("record %s replayed twice (runs %s and %s)", id, prev, e.Run)
						}
						replayedBy[id] = e.Run
					}
				}
			}
			calls := dep.replayedCalls()
			var auto []quarantine.Job
			for _, j := range jobs {
				if j.By == quarantine.AutoBy && j.Sent > 0 {
					auto = append([]quarantine.Job{j}, auto...) // oldest first
				}
			}
			if len(auto) == 0 {
				t.Fatal("no automatic redrive sent anything")
			}
			for _, j := range auto {
				cs := calls[j.ID]
				var stamps []string
				for _, c := range cs {
					stamps = append(stamps, fmt.Sprintf("%.2f", c.at.Sub(cs[0].at).Seconds()))
				}
				t.Logf("job %s on %s: %s, selected %d sent %d handled %d again %d pending %d, stop %q; handler times (s): %v",
					j.ID, b.env.ServerVersion, j.State, j.Selected, j.Sent, j.Handled, j.QuarantinedAgain, j.Pending, j.Stop, stamps)
				// The ramp: the k-th message is not sent before At(k); the
				// handler's times can only be later (a few hundred ms of
				// delivery jitter allowed at the first).
				if k := len(cs) - 1; k > 0 && j.State == quarantine.JobDone {
					if span, floor := cs[k].at.Sub(cs[0].at), (rampAt20(k) - 300*time.Millisecond); span < floor {
						t.Errorf("job %s: %d messages in %v, faster than the ramp (%v)", j.ID, k+1, span, floor)
					}
				}
			}
			first := auto[0]
			if !fails {
				if len(auto) != 1 || first.State != quarantine.JobDone || first.Handled != first.Sent || first.Sent != first.Selected {
					t.Errorf("want one redrive, done, every message handled: %+v", first)
				}
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if first.State != quarantine.JobStopped || first.Sent >= first.Selected {
				t.Errorf("the first redrive: %s, sent %d of %d; want stopped with the rest open", first.State, first.Sent, first.Selected)
			}
			if len(ends) == 0 || !ends[0].Stopped {
				t.Fatalf("the first redrive did not stop: %+v", ends)
			}
			// What it did not send, it left open: a later job sent it.
			sent := map[string]bool{}
			for _, id := range ends[0].Sent {
				sent[id] = true
			}
			for _, p := range ends[0].Plan {
				if !sent[p.ID] && replayedBy[p.ID] == ends[0].Run {
					t.Errorf("record %s: not sent by %s, yet marked replayed by it", p.ID, ends[0].Run)
				}
				if !sent[p.ID] && replayedBy[p.ID] == "" {
					t.Errorf("record %s: left open by the stopped redrive and never redriven", p.ID)
				}
			}
		})
	}
}

// In dry-run mode the runtime plans the redrive when the breaker closes
// and sends nothing; the plan holds the outage's transient records and
// never a permanent one quarantined in the same window.
func TestAutoRedriveDryRunSendsNothing(t *testing.T) {
	t.Parallel()
	const n = 20
	b := setup(t, func(q *config.Queue) {
		autoRedriveQueue(q)
		q.Quarantine.AutoRedrive.Mode = config.RedriveDryRun
	})
	b.cfg.hooks.keeper = true
	b.cfg.Logger = quietLogger(t)
	dep := newDependency(3 * time.Second)
	plans := make(chan *quarantine.ReplayResult, 4)
	b.cfg.hooks.redrive = func(_ string, res *quarantine.ReplayResult, err error) {
		if err != nil {
			t.Errorf("dry run: %v", err)
		}
		plans <- res
	}
	var mu sync.Mutex
	quarantined := map[string]triage.Class{}
	b.cfg.OnSettled = func(s Settled) {
		if s.Outcome == OutcomeQuarantined {
			mu.Lock()
			quarantined[s.MessageID] = s.Class
			mu.Unlock()
		}
	}
	b.publishJSON(map[string]any{"id": "perm"}, amqp.Publishing{MessageId: "m-perm"})
	for i := range n {
		b.publishJSON(map[string]any{"id": fmt.Sprint(i)}, amqp.Publishing{MessageId: fmt.Sprintf("m-%02d", i)})
	}
	b.start(func(c *Consumer) {
		must(t, c.Handle(b.queue.Name, testType, HandlerFunc(func(ctx context.Context, m *Message) error {
			if m.MessageID == "m-perm" {
				return triage.Permanent(errors.New("never valid"))
			}
			return dep.handle(ctx, m)
		})))
	})
	var plan *quarantine.ReplayResult
	select {
	case plan = <-plans:
	case <-time.After(60 * time.Second):
		t.Fatal("no dry run within 60s")
	}
	signer, err := triage.NewSigner([]byte(testSigningKey))
	must(t, err)
	in := &quarantine.Inspector{Conn: b.env.Dial("inspector"), Config: b.file, Verifier: signer}
	snap, err := in.Snapshot(context.Background())
	must(t, err)
	byID := map[string]*quarantine.Record{}
	for _, r := range snap.Records {
		byID[r.ID] = r
	}
	mu.Lock()
	defer mu.Unlock()
	transient := 0
	for _, c := range quarantined {
		if c == triage.ClassTransient {
			transient++
		}
	}
	if !plan.DryRun || len(plan.Sent) != 0 || len(plan.Plan) != transient || transient == 0 {
		t.Errorf("dry run: %+v; want a plan of the %d transient records, nothing sent", plan, transient)
	}
	for _, p := range plan.Plan {
		r := byID[p.ID]
		if r == nil || r.Envelope.Class != triage.ClassTransient || r.Properties.MessageID == "m-perm" {
			t.Errorf("planned %s: %+v", p.ID, r)
		}
	}
	for _, e := range snap.Events {
		if e.Kind == quarantine.EventReplayed || e.Kind == quarantine.EventClaimed {
			t.Errorf("a dry run wrote %s", e.Kind)
		}
	}
	if _, ok := quarantined["m-perm"]; !ok {
		t.Error("the permanent failure was not quarantined")
	}
}

// Two replicas of the runtime on one queue: each breaker opens and closes,
// each writes its outage, and both try to redrive. The replay lock lets one
// at a time; what the first replayed is no longer open for the second:
// every record is replayed once between them, and both windows end
// covered.
func TestAutoRedriveTwoReplicasReplayOnce(t *testing.T) {
	t.Parallel()
	const n = 60
	b := setup(t, autoRedriveQueue)
	b.cfg.hooks.keeper = true
	b.cfg.Logger = quietLogger(t)
	dep := newDependency(8 * time.Second)
	allHandled := make(chan struct{})
	var once sync.Once
	settled := func(Settled) {
		dep.mu.Lock()
		done := len(dep.handled) == n
		dep.mu.Unlock()
		if done {
			once.Do(func() { close(allHandled) })
		}
	}
	b.cfg.OnSettled = settled
	for i := range n {
		b.publishJSON(map[string]any{"id": fmt.Sprint(i)}, amqp.Publishing{MessageId: fmt.Sprintf("m-%02d", i)})
	}
	second := *b.cfg
	second.ConnectionName += "-2"
	second.Registerer = prometheus.NewRegistry()
	second.hooks = &testHooks{keeper: true}
	c2, err := New(&second)
	must(t, err)
	must(t, c2.Handle(b.queue.Name, testType, HandlerFunc(dep.handle)))
	brokertest.Run(t, 15*time.Second, c2.Run)
	b.start(func(c *Consumer) { must(t, c.Handle(b.queue.Name, testType, HandlerFunc(dep.handle))) })
	select {
	case <-allHandled:
	case <-time.After(120 * time.Second):
		t.Fatal("not every message was handled")
	}
	signer, err := triage.NewSigner([]byte(testSigningKey))
	must(t, err)
	in := &quarantine.Inspector{Conn: b.env.Dial("inspector"), Config: b.file, Verifier: signer, OmitBodies: true}
	var events []quarantine.Event
	for deadline := time.Now().Add(60 * time.Second); ; {
		events, err = in.Events(context.Background())
		must(t, err)
		ended, ongoing := quarantine.PendingWindows(events, b.queue.Name)
		if len(ended)+len(ongoing) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("windows still pending: ended %v, ongoing %v", ended, ongoing)
		}
		time.Sleep(500 * time.Millisecond) // polling the broker: the second replica looks again after 10 s
	}
	windows, replays := map[string]bool{}, map[string]string{}
	for _, e := range events {
		switch e.Kind {
		case quarantine.EventOutageStarted:
			windows[e.Window.ID] = true
		case quarantine.EventReplayed:
			for _, id := range e.IDs {
				if prev, dup := replays[id]; dup {
					t.Errorf("record %s replayed twice (jobs %s and %s)", id, prev, e.Run)
				}
				replays[id] = e.Run
			}
		}
	}
	t.Logf("%d outage windows written, %d records replayed", len(windows), len(replays))
	if len(windows) < 2 || len(replays) == 0 {
		t.Errorf("%d windows, %d replayed: want one window per replica and something replayed", len(windows), len(replays))
	}
}
