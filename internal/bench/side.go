package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/dlxbridge/dlxbridge/consumer"
	"github.com/dlxbridge/dlxbridge/schemas"
	"github.com/dlxbridge/dlxbridge/triage"
)

// Sides.
const (
	Raw    = "raw"    // plain amqp091-go: consume, json.Unmarshal, ack, one at a time
	Bridge = "bridge" // the dlxbridge runtime with a handler that binds the body
)

// sideSpec is what one side's process is told: where its queue is and what
// is in it.
type sideSpec struct {
	URL         string          `json:"url"`
	Side        string          `json:"side"`
	Scenario    string          `json:"scenario"`
	Prefix      string          `json:"prefix"`
	Count       int             `json:"count"`
	Size        int             `json:"size"`
	Prefetch    int             `json:"prefetch"`
	Concurrency int             `json:"concurrency"`
	Idle        time.Duration   `json:"idle"`            // give up after this long without progress
	Tiers       []time.Duration `json:"tiers,omitempty"` // retry tiers; empty: the defaults
}

// sideResult is what one side reports: timings, and per id how often a
// handler succeeded (the bridge) or the message was acked (raw).
type sideResult struct {
	Seconds    float64 `json:"seconds"`     // first consume to the last settlement seen
	CPUSeconds float64 `json:"cpu_seconds"` // user+sys of the process over the same span
	MaxRSSKB   int64   `json:"max_rss_kb"`  // the process's peak resident set
	Handled    []byte  `json:"handled"`     // per index: successes (raw: acks), capped at 255
	BadBodies  []int   `json:"bad_bodies"`  // indexes whose body differed from what was published
	Unknown    int     `json:"unknown"`     // deliveries whose message id is no bench id
	TimedOut   bool    `json:"timed_out"`   // stopped for lack of progress
}

// expectation says what a side must see before it is done: successes
// (distinct ids) and messages in the quarantine.
func expectation(s *sideSpec) (handled, quarantined int) {
	for i := range s.Count {
		if s.Side == Bridge && KindOf(s.Scenario, i).Quarantined() {
			quarantined++
		} else {
			handled++
		}
	}
	return handled, quarantined
}

// ledger counts successes per id, safely from concurrent handlers: 8 bytes
// per message (part of each side's peak RSS, the same on both).
type ledger struct {
	size     int      // every body has this size
	crcs     []uint32 // CRC-32C of each published body
	counts   []atomic.Uint32
	distinct atomic.Int64
	bad      chan int
	unknown  atomic.Int64
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func newLedger(s *sideSpec) *ledger {
	l := &ledger{size: s.Size, crcs: make([]uint32, s.Count), counts: make([]atomic.Uint32, s.Count), bad: make(chan int, 1024)}
	for i := range s.Count {
		l.crcs[i] = crc32.Checksum(Body(i, s.Size, KindOf(s.Scenario, i)), castagnoli)
	}
	return l
}

// index checks id and body (its length and CRC-32C: comparing bytes would
// mean holding every body) and returns the id's index, or -1.
func (l *ledger) index(id string, body []byte) int {
	i := Index(id)
	if i < 0 || i >= len(l.counts) {
		l.unknown.Add(1)
		return -1
	}
	if len(body) != l.size || crc32.Checksum(body, castagnoli) != l.crcs[i] {
		select {
		case l.bad <- i:
		default:
		}
	}
	return i
}

func (l *ledger) success(i int) {
	if l.counts[i].Add(1) == 1 {
		l.distinct.Add(1)
	}
}

func (l *ledger) result(r *sideResult) {
	r.Handled = make([]byte, len(l.counts))
	for i := range l.counts {
		r.Handled[i] = byte(min(l.counts[i].Load(), 255))
	}
	close(l.bad)
	for i := range l.bad {
		r.BadBodies = append(r.BadBodies, i)
	}
	r.Unknown = int(l.unknown.Load())
}

// usage is the process's CPU time (user+sys).
func usage() (cpu time.Duration) {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// peakRSS is the process's peak resident set in KiB: VmHWM, the high-water
// mark of its own address space. Not getrusage's ru_maxrss: Linux carries
// that across exec, so a side started by the parent would report the
// parent's peak (Go starts children with vfork semantics, sharing the
// parent's memory until exec). -1 where unknown.
func peakRSS() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			var kb int64
			if _, err := fmt.Sscan(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), &kb); err == nil {
				return kb
			}
		}
	}
	return -1
}

// runSide drains one side's queue and writes its sideResult as one JSON line.
func runSide(ctx context.Context, s *sideSpec, stdout, stderr io.Writer) error {
	l := newLedger(s)
	wantHandled, wantQuarantined := expectation(s)
	var r sideResult
	var err error
	switch s.Side {
	case Raw:
		err = drainRaw(ctx, s, l, wantHandled, &r)
	case Bridge:
		err = drainBridge(ctx, s, l, wantHandled, wantQuarantined, &r, stderr)
	default:
		err = fmt.Errorf("unknown side %q", s.Side)
	}
	if err != nil {
		return err
	}
	l.result(&r)
	r.MaxRSSKB = peakRSS()
	return json.NewEncoder(stdout).Encode(&r)
}

// stopwatch measures wall and CPU time from the first message a side sees
// (connection setup is not part of a drain) to the last settlement.
type stopwatch struct {
	once sync.Once
	t0   time.Time
	cpu0 time.Duration
}

// start starts the clock the first time it is called.
func (w *stopwatch) start() {
	w.once.Do(func() { w.cpu0 = usage(); w.t0 = time.Now() })
}

// stop records the span in r.
func (w *stopwatch) stop(r *sideResult) {
	w.start() // nothing arrived: a zero span
	cpu := usage()
	r.Seconds = time.Since(w.t0).Seconds()
	r.CPUSeconds = (cpu - w.cpu0).Seconds()
}

// drainRaw is the baseline a hand-written consumer would be: one channel,
// the same prefetch, each delivery decoded with json.Unmarshal and acked,
// one at a time. It has no failure handling, so in a storm it acks every
// message, the invalid and failing ones too.
func drainRaw(ctx context.Context, s *sideSpec, l *ledger, want int, r *sideResult) error {
	conn, err := dial(s.URL, s.Prefix+"/raw")
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	if err := ch.Qos(s.Prefetch, 0, false); err != nil {
		return err
	}
	deliveries, err := ch.Consume(s.Prefix+".work", "", false, false, false, false, nil)
	if err != nil {
		return err
	}
	idle := time.NewTimer(s.Idle)
	defer idle.Stop()
	var clock stopwatch
	defer func() {
		// An ack sent just before its channel closes can be lost on 3.10
		// (the message is delivered again later); give the last acks a
		// moment to reach the broker. Not part of the measurement.
		time.Sleep(50 * time.Millisecond)
	}()
	for l.distinct.Load() < int64(want) {
		select {
		case d, ok := <-deliveries:
			if !ok {
				return errors.New("the raw consumer's channel closed")
			}
			clock.start()
			var o Order
			_ = json.Unmarshal(d.Body, &o) // its error is not handled: raw has no failure path
			if i := l.index(d.MessageId, d.Body); i >= 0 {
				l.success(i)
			}
			if err := d.Ack(false); err != nil {
				return err
			}
			idle.Reset(s.Idle)
		case <-idle.C:
			r.TimedOut = true
			clock.stop(r)
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	clock.stop(r)
	return nil
}

var (
	errTransient = errors.New("bench: transient failure")
	errAlways    = errors.New("bench: this message always fails")
)

// drainBridge runs the dlxbridge runtime with a handler that binds the body
// and fails as the message's kind says, until every id expected to succeed
// has succeeded and the quarantine holds every id expected there.
func drainBridge(ctx context.Context, s *sideSpec, l *ledger, wantHandled, wantQuarantined int, r *sideResult, stderr io.Writer) error {
	cfg, err := s.config()
	if err != nil {
		return err
	}
	registry, err := schemas.Load(schemas.LoadOptions{})
	if err != nil {
		return err
	}
	c, err := consumer.New(&consumer.Config{
		URL: s.URL, File: cfg, Registry: registry,
		ConnectionName: s.Prefix + "/bridge",
		// Errors only: the runtime logs each quarantine as a warning, which
		// in a storm would be thousands of lines.
		Logger:       slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelError})),
		DrainTimeout: 10 * time.Second,
		// The reconciliation reads the quarantine queue itself.
		KeepQuarantineIntake: true,
	})
	if err != nil {
		return err
	}
	queue := cfg.Queues[0]
	var clock stopwatch
	err = c.HandleVersion(queue.Name, MessageType, MessageVersion, consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error {
		clock.start()
		var o Order
		if err := m.Bind(&o); err != nil {
			return triage.Permanent(err)
		}
		i := l.index(m.MessageID, m.Body)
		if i < 0 {
			return triage.Permanent(fmt.Errorf("unknown message id %q", m.MessageID))
		}
		switch KindOf(s.Scenario, i) {
		case TransientOnce:
			if m.Attempt == 1 {
				return errTransient
			}
		case AlwaysFailing:
			return errAlways
		}
		l.success(i)
		return nil
	}))
	if err != nil {
		return err
	}
	// A second connection watches the quarantine's depth: its messages
	// are confirmed there before their originals are acked.
	watch, err := dial(s.URL, s.Prefix+"/bridge-watch")
	if err != nil {
		return err
	}
	defer watch.Close()

	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	lastChange, last := time.Now(), int64(-1)
	for {
		select {
		case err := <-done:
			return fmt.Errorf("the runtime stopped: %v", err)
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
		q, err := Depth(watch, queue.Quarantine.Queue)
		if err != nil {
			return err
		}
		handled := l.distinct.Load()
		if handled >= int64(wantHandled) && q >= wantQuarantined {
			break
		}
		if progress := handled + int64(q); progress != last {
			last, lastChange = progress, time.Now()
		} else if time.Since(lastChange) > s.Idle {
			r.TimedOut = true
			break
		}
	}
	clock.stop(r)
	stop()
	if err := <-done; err != nil {
		return fmt.Errorf("the runtime: %w", err)
	}
	return nil
}
