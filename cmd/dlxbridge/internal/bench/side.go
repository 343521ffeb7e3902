package bench

import (
	"bufio"
	"context"
	"encoding/binary"
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

	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/consumer"
	"github.com/dlxbridge/dlxbridge/schemas"
	"github.com/dlxbridge/dlxbridge/triage"
)

// Sides.
const (
	Raw    = "raw"    // plain amqp091-go: consume, json.Unmarshal, ack, one at a time
	Bridge = "bridge" // the dlxbridge runtime with a handler that binds the body
	Floor  = "floor"  // hand-written, the least failure handling that loses nothing (see drainFloor)
	// Shared is the bridge side's runtime and handler, retrying through
	// shared delay tiers (retry.tier_queues: shared) instead of per-queue
	// lanes (see Options.Shared).
	Shared = "shared"
	// Fair is hand-written too, retrying through one TTL queue on the
	// broker as the bridge does (see drainFair): the floor of a consumer
	// with delayed retries.
	Fair = "fair"
	// C1 ends the name of a bridge or shared side run at concurrency 1
	// beside the one at --concurrency (see Options.AlsoC1).
	C1 = "-c1"
)

// base is the kind of side name: a C1 side is its base side.
func base(name string) string { return strings.TrimSuffix(name, C1) }

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
	// ImmediateRetries is the bridge's queues[].retry.immediate_retries.
	ImmediateRetries int `json:"immediate_retries,omitempty"`
}

// sideResult is what one side reports on stdout: timings and scalars. What
// it saw per id went to the parent as records while it ran (see reporter),
// so the side holds no per-message state and its peak RSS is the
// consumer's own; the parent fills Handled and BadBodies from them.
type sideResult struct {
	Seconds    float64 `json:"seconds"`     // first consume to the last settlement seen
	CPUSeconds float64 `json:"cpu_seconds"` // user+sys of the process over the same span
	MaxRSSKB   int64   `json:"max_rss_kb"`  // the process's peak resident set
	Records    int64   `json:"records"`     // records written to the parent: it checks it read as many
	Unknown    int     `json:"unknown"`     // deliveries whose message id is no bench id
	TimedOut   bool    `json:"timed_out"`   // stopped for lack of progress
	// Writes and Reads are the process's write and read system calls
	// over the same span (/proc/self/io syscw and syscr), less its writes
	// of records to the parent: what it wrote to and read from its broker
	// connections, and a few to its log. Each socket write on loopback
	// also pays the kernel's receive path for the broker. -1 where unknown.
	Writes int64 `json:"writes"`
	Reads  int64 `json:"reads"`
	// ConfirmWaitMS is how long, on average, a parked (or retried)
	// message's copy waited for the broker's confirm: the bridge's
	// dlxbridge_publish_confirm_seconds, the floor's own clock. The
	// delivery holds prefetch meanwhile.
	ConfirmWaitMS float64 `json:"confirm_wait_ms,omitempty"`

	Handled   []byte `json:"-"` // per index: successes (raw: acks), capped at 255; from the records
	BadBodies int    `json:"-"` // records whose body differed from what was published
}

// parks reports whether the side parks the messages that can never
// succeed (raw acks them all).
func (s *sideSpec) parks() bool { return s.Side != Raw }

// expectation says what a side must see before it is done: successes
// (distinct ids) and messages in the quarantine.
func expectation(s *sideSpec) (handled, quarantined int) {
	for i := range s.Count {
		if s.parks() && KindOf(s.Scenario, i).Quarantined() {
			quarantined++
		} else {
			handled++
		}
	}
	return handled, quarantined
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// A record is what a side tells the parent about one delivery its handler
// saw (raw: every delivery it acks): the id's index, the body's length and
// CRC-32C (computed in the side, the same work on both sides), and whether
// it counts as a success. Fixed size, little-endian.
const (
	recordSize    = 13
	recordSuccess = 1 // flag: a success (raw: acked)
)

// File descriptors of a side's two pipes to the parent (exec's ExtraFiles
// start at 3): records out, and the parent's "every id expected to succeed
// has" in (closed by the parent).
const (
	recordsFD = 3
	enoughFD  = 4
)

// recordFlushEvery bounds how long a record waits in the side's buffer, and
// so how late the parent can see the last one.
const recordFlushEvery = 2 * time.Millisecond

// reporter streams a side's records to the parent through one buffered
// writer, safely from concurrent handlers.
type reporter struct {
	count     int
	mu        sync.Mutex
	w         *bufio.Writer
	buf       [recordSize]byte
	err       error // the first write error
	records   int64
	successes atomic.Int64 // not distinct: progress only
	unknown   atomic.Int64
	stop      chan struct{}
	flushed   chan struct{}
}

func newReporter(count int, w io.Writer) *reporter {
	r := &reporter{count: count, w: bufio.NewWriterSize(countingWriter{w}, 64<<10), stop: make(chan struct{}), flushed: make(chan struct{})}
	go r.flushLoop()
	return r
}

func (r *reporter) flushLoop() {
	defer close(r.flushed)
	t := time.NewTicker(recordFlushEvery)
	defer t.Stop()
	for {
		select {
		case <-r.stop:
			return
		case <-t.C:
		}
		r.mu.Lock()
		if r.w.Buffered() > 0 && r.err == nil {
			r.err = r.w.Flush()
		}
		r.mu.Unlock()
	}
}

// index is id's index, or -1 (counted as unknown).
func (r *reporter) index(id string) int {
	i := Index(id)
	if i < 0 || i >= r.count {
		r.unknown.Add(1)
		return -1
	}
	return i
}

// report records that index i's delivery carried body, a success or not.
func (r *reporter) report(i int, body []byte, success bool) {
	crc := crc32.Checksum(body, castagnoli)
	if success {
		r.successes.Add(1)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	binary.LittleEndian.PutUint32(r.buf[0:], uint32(i))
	binary.LittleEndian.PutUint32(r.buf[4:], uint32(len(body)))
	binary.LittleEndian.PutUint32(r.buf[8:], crc)
	r.buf[12] = 0
	if success {
		r.buf[12] = recordSuccess
	}
	if _, err := r.w.Write(r.buf[:]); err != nil && r.err == nil {
		r.err = err
	}
	r.records++
}

// close flushes what is left and fills res's counters.
func (r *reporter) close(res *sideResult) error {
	close(r.stop)
	<-r.flushed
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err == nil {
		r.err = r.w.Flush()
	}
	res.Records = r.records
	res.Unknown = int(r.unknown.Load())
	if r.err != nil {
		return fmt.Errorf("write records to the parent: %w", r.err)
	}
	return nil
}

// ledger is the parent's side of the records: the CRC-32C of every
// published body, and per id how many successes it was told of. One
// goroutine applies records to it.
type ledger struct {
	size     int
	crcs     []uint32 // CRC-32C of each published body
	counts   []byte   // successes per index, capped at 255
	want     int      // distinct successes the side must see
	distinct int
	bad      int
	records  int64
	enough   func() // called once distinct reaches want
}

// bodyCRCs is the CRC-32C of every body a scenario publishes.
func bodyCRCs(scenario string, count, size int) []uint32 {
	crcs := make([]uint32, count)
	for i := range count {
		crcs[i] = crc32.Checksum(Body(i, size, KindOf(scenario, i)), castagnoli)
	}
	return crcs
}

func newLedger(s *sideSpec, crcs []uint32, enough func()) *ledger {
	want, _ := expectation(s)
	l := &ledger{size: s.Size, crcs: crcs, counts: make([]byte, s.Count), want: want, enough: enough}
	if want == 0 {
		enough()
	}
	return l
}

// apply applies one record.
func (l *ledger) apply(rec []byte) error {
	i := int(binary.LittleEndian.Uint32(rec[0:]))
	n := int(binary.LittleEndian.Uint32(rec[4:]))
	crc := binary.LittleEndian.Uint32(rec[8:])
	if i >= len(l.counts) {
		return fmt.Errorf("record %d: index %d out of range", l.records, i)
	}
	l.records++
	if n != l.size || crc != l.crcs[i] {
		l.bad++
	}
	if rec[12]&recordSuccess == 0 {
		return nil
	}
	if l.counts[i] < 255 {
		l.counts[i]++
	}
	if l.counts[i] == 1 {
		l.distinct++
		if l.distinct == l.want {
			l.enough()
		}
	}
	return nil
}

// read applies every record from r until EOF.
func (l *ledger) read(r io.Reader) error {
	br := bufio.NewReaderSize(r, 64<<10)
	var rec [recordSize]byte
	for {
		if _, err := io.ReadFull(br, rec[:]); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return fmt.Errorf("read records: %w", err) // a torn record too
		}
		if err := l.apply(rec[:]); err != nil {
			return err
		}
	}
}

// result fills what the side reported through its records into res, and
// checks that every record it wrote arrived.
func (l *ledger) result(res *sideResult) error {
	if l.records != res.Records {
		return fmt.Errorf("read %d records, the side wrote %d", l.records, res.Records)
	}
	res.Handled, res.BadBodies = l.counts, l.bad
	return nil
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

// runSide drains one side's queue, streaming its records to recordsOut,
// until enough (the parent saw every id expected to succeed succeed) and,
// for the bridge, the quarantine holds what it should; then it writes its
// sideResult as one JSON line.
func runSide(ctx context.Context, s *sideSpec, recordsOut io.Writer, enough <-chan struct{}, stdout, stderr io.Writer) error {
	rep := newReporter(s.Count, recordsOut)
	_, wantQuarantined := expectation(s)
	var r sideResult
	var err error
	switch base(s.Side) {
	case Raw:
		err = drainRaw(ctx, s, rep, enough, &r)
	case Bridge, Shared:
		err = drainBridge(ctx, s, rep, enough, wantQuarantined, &r, stderr)
	case Floor:
		err = drainFloor(ctx, s, rep, enough, wantQuarantined, &r)
	case Fair:
		err = drainFair(ctx, s, rep, enough, wantQuarantined, &r)
	default:
		err = fmt.Errorf("unknown side %q", s.Side)
	}
	if cerr := rep.close(&r); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	r.MaxRSSKB = peakRSS()
	return json.NewEncoder(stdout).Encode(&r)
}

// closed reports whether ch is closed.
func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// recordWrites counts the side's writes of records to the parent, so that
// they can be told from its writes to the broker (see sideResult.Writes).
var recordWrites atomic.Int64

type countingWriter struct{ w io.Writer }

func (c countingWriter) Write(p []byte) (int, error) {
	recordWrites.Add(1)
	return c.w.Write(p)
}

// ioCalls is the process's read and write system calls so far
// (/proc/self/io), or -1s where unknown.
func ioCalls() (reads, writes int64) {
	reads, writes = -1, -1
	b, err := os.ReadFile("/proc/self/io")
	if err != nil {
		return
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, _ := strings.Cut(line, ": ")
		var n int64
		if _, err := fmt.Sscan(v, &n); err != nil {
			continue
		}
		switch k {
		case "syscr":
			reads = n
		case "syscw":
			writes = n
		}
	}
	return
}

// stopwatch measures wall and CPU time, and read and write system calls,
// from the first message a side sees (connection setup is not part of a
// drain) to the last settlement.
type stopwatch struct {
	once            sync.Once
	t0              time.Time
	cpu0            time.Duration
	reads0, writes0 int64
	records0        int64
}

// start starts the clock the first time it is called.
func (w *stopwatch) start() {
	w.once.Do(func() {
		w.reads0, w.writes0 = ioCalls()
		w.records0 = recordWrites.Load()
		w.cpu0 = usage()
		w.t0 = time.Now()
	})
}

// stop records the span in r.
func (w *stopwatch) stop(r *sideResult) {
	w.start() // nothing arrived: a zero span
	cpu := usage()
	r.Seconds = time.Since(w.t0).Seconds()
	r.CPUSeconds = (cpu - w.cpu0).Seconds()
	reads, writes := ioCalls()
	r.Reads, r.Writes = -1, -1
	if reads >= 0 && w.reads0 >= 0 {
		r.Reads = reads - w.reads0
	}
	if writes >= 0 && w.writes0 >= 0 {
		r.Writes = writes - w.writes0 - (recordWrites.Load() - w.records0)
	}
}

// consume opens a hand-written side's connection (named after the side)
// and consumes its work queue with the bench's prefetch. The caller closes
// conn, also after an error.
func consume(s *sideSpec) (conn *amqp.Connection, ch *amqp.Channel, deliveries <-chan amqp.Delivery, err error) {
	if conn, err = dial(s.URL, s.Prefix+"/"+s.Side); err != nil {
		return nil, nil, nil, err
	}
	if ch, err = conn.Channel(); err == nil {
		if err = ch.Qos(s.Prefetch, 0, false); err == nil {
			deliveries, err = ch.Consume(s.Prefix+".work", "", false, false, false, false, nil)
		}
	}
	return conn, ch, deliveries, err
}

// drainRaw is the baseline a hand-written consumer would be: one channel,
// the same prefetch, each delivery decoded with json.Unmarshal and acked,
// one at a time. It has no failure handling, so in a storm it acks every
// message, the invalid and failing ones too.
func drainRaw(ctx context.Context, s *sideSpec, rep *reporter, enough <-chan struct{}, r *sideResult) error {
	conn, _, deliveries, err := consume(s)
	if conn != nil {
		defer conn.Close()
	}
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
	for {
		select {
		case d, ok := <-deliveries:
			if !ok {
				return errors.New("the raw consumer's channel closed")
			}
			clock.start()
			var o Order
			_ = json.Unmarshal(d.Body, &o) // its error is not handled: raw has no failure path
			if i := rep.index(d.MessageId); i >= 0 {
				rep.report(i, d.Body, true)
			}
			if err := d.Ack(false); err != nil {
				return err
			}
			idle.Reset(s.Idle)
		case <-enough:
			clock.stop(r)
			return nil
		case <-idle.C:
			r.TimedOut = true
			clock.stop(r)
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

var (
	errTransient = errors.New("bench: transient failure")
	errAlways    = errors.New("bench: this message always fails")
)

// drainBridge runs the dlxbridge runtime with a handler that binds the body
// and fails as the message's kind says, until every id expected to succeed
// has succeeded and the quarantine holds every id expected there.
func drainBridge(ctx context.Context, s *sideSpec, rep *reporter, enough <-chan struct{}, wantQuarantined int, r *sideResult, stderr io.Writer) error {
	cfg, err := s.config()
	if err != nil {
		return err
	}
	registry, err := schemas.Load(schemas.LoadOptions{})
	if err != nil {
		return err
	}
	metrics := prometheus.NewRegistry()
	c, err := consumer.New(&consumer.Config{
		URL: s.URL, File: cfg, Registry: registry,
		ConnectionName: s.Prefix + "/bridge",
		// Errors only: the runtime logs each quarantine as a warning, which
		// in a storm would be thousands of lines.
		Logger:       slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelError})),
		DrainTimeout: 10 * time.Second,
		// The reconciliation reads the quarantine queue itself.
		KeepQuarantineIntake: true,
		Registerer:           metrics,
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
		i := rep.index(m.MessageID)
		if i < 0 {
			return triage.Permanent(fmt.Errorf("unknown message id %q", m.MessageID))
		}
		switch KindOf(s.Scenario, i) {
		case TransientOnce:
			if m.Attempt == 1 {
				rep.report(i, m.Body, false)
				return errTransient
			}
		case AlwaysFailing:
			rep.report(i, m.Body, false)
			return errAlways
		}
		rep.report(i, m.Body, true)
		return nil
	}))
	if err != nil {
		return err
	}
	// A second connection watches the quarantine's depth: its messages
	// are confirmed there before their originals are acked. One channel
	// for every look: a channel's open and close cost the broker more
	// than the declare, every 20 ms of the drain.
	watch, err := dial(s.URL, s.Prefix+"/bridge-watch")
	if err != nil {
		return err
	}
	defer watch.Close()
	watchCh, err := watch.Channel()
	if err != nil {
		return err
	}

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
		dq, err := watchCh.QueueDeclarePassive(queue.Quarantine.Queue, true, false, false, false, nil)
		if err != nil {
			return err
		}
		q := dq.Messages
		if closed(enough) && q >= wantQuarantined {
			break
		}
		handled := rep.successes.Load()
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
	r.ConfirmWaitMS = confirmWaitMS(metrics)
	return nil
}

// confirmWaitMS is the mean of the dlxbridge_publish_confirm_seconds
// histograms in reg, in milliseconds; 0 without a sample.
func confirmWaitMS(reg prometheus.Gatherer) float64 {
	mfs, err := reg.Gather()
	if err != nil {
		return 0
	}
	var sum float64
	var n uint64
	for _, mf := range mfs {
		if mf.GetName() != "dlxbridge_publish_confirm_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			sum += m.GetHistogram().GetSampleSum()
			n += m.GetHistogram().GetSampleCount()
		}
	}
	if n == 0 {
		return 0
	}
	return sum / float64(n) * 1000
}
