package faulttest

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dlxbridge/dlxbridge/cmd/dlxbridge/internal/bench"
	"github.com/dlxbridge/dlxbridge/consumer"
	"github.com/dlxbridge/dlxbridge/internal/amqpx"
	"github.com/dlxbridge/dlxbridge/triage"
	"github.com/dlxbridge/dlxbridge/wire"
)

// childEnv, when set, makes this test binary a consumer process for
// TestConsumerKilledAndRestarted: it holds the childSpec.
const childEnv = "DLXBRIDGE_FAULTTEST_CHILD"

type childSpec struct {
	URL         string `json:"url"`
	Prefix      string `json:"prefix"`
	SuccessFile string `json:"success_file"` // one id a line, appended before the handler returns nil
	// Crash lists ids whose every delivery ends the process (os.Exit 3),
	// as a poison message crashes a service. Detail adds the pid, the time,
	// the attempt and the delivery counts to each success line, and logs
	// the runtime's warnings (lost sessions) to stderr.
	Crash  []int `json:"crash,omitempty"`
	Detail bool  `json:"detail,omitempty"`
}

func TestMain(m *testing.M) {
	if spec := os.Getenv(childEnv); spec != "" {
		os.Exit(runChild(spec))
	}
	os.Exit(m.Run())
}

// runChild runs the runtime until SIGTERM, recording each success in the
// spec's file: a record written before the handler returns survives a
// SIGKILL (it is in the kernel), so the parent knows what was handled.
func runChild(raw string) int {
	var s childSpec
	if err := json.Unmarshal([]byte(raw), &s); err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 2
	}
	cfg, err := faultConfig(s.Prefix)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 2
	}
	f, err := os.OpenFile(s.SuccessFile, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 2
	}
	defer f.Close()
	var mu sync.Mutex
	level := slog.LevelError
	if s.Detail {
		level = slog.LevelWarn
	}
	crash := map[int]bool{}
	for _, i := range s.Crash {
		crash[i] = true
	}
	c, err := newConsumer(consumerSpec{url: s.URL, name: s.Prefix + "/child-consumer", cfg: cfg, logTo: os.Stderr, logLevel: level,
		onCall: func(m *consumer.Message) {
			if s.Detail {
				sig, _ := m.Headers[wire.HeaderSignature].(string)
				fmt.Fprintf(os.Stderr, "time=%s child: call %s attempt %d counts %v/%v attempts-header %v first-failure %v signature %.12s x-death %d\n",
					time.Now().Format(time.RFC3339Nano), m.MessageID, m.Attempt, m.Headers["x-delivery-count"], m.Headers["x-acquired-count"],
					m.Headers[wire.HeaderAttempts], m.Headers[wire.HeaderFirstFailureAt], sig, len(triage.HistoryOf(m.Headers).Deaths))
			}
			if crash[bench.Index(m.MessageID)] {
				fmt.Fprintf(os.Stderr, "time=%s child: crashing on %s\n", time.Now().Format(time.RFC3339Nano), m.MessageID)
				os.Exit(3)
			}
		},
		okMsg: func(i int, m *consumer.Message) error {
			line := bench.ID(i)
			if s.Detail {
				line = fmt.Sprintf("%s %d %d %d %v/%v", line, os.Getpid(), time.Now().UnixNano(), m.Attempt, m.Headers["x-delivery-count"], m.Headers["x-acquired-count"])
			}
			mu.Lock()
			defer mu.Unlock()
			_, err := f.WriteString(line + "\n") // failing to record is a transient failure: retried
			return err
		}})
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := c.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "child: Run:", err)
		return 1
	}
	return 0
}

func skipShort(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("fault injection on a private broker node: skipped in -short")
	}
}

// The consumer process is SIGKILLed twice mid-stream (handlers running,
// prefetched deliveries unacked, the publisher still sending) and started
// again each time. Every id must end handled or quarantined.
func TestConsumerKilledAndRestarted(t *testing.T) {
	skipShort(t)
	const n = 600
	w := newWorld(t, n)
	successFile := filepath.Join(t.TempDir(), "successes")
	spec, _ := json.Marshal(childSpec{URL: w.node.URL, Prefix: w.env.Prefix, SuccessFile: successFile})
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	var child *exec.Cmd
	start := func() {
		child = exec.Command(exe, "-test.run=^$")
		child.Env = append(os.Environ(), childEnv+"="+string(spec))
		child.Stdout, child.Stderr = os.Stderr, os.Stderr
		if err := child.Start(); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		if child != nil && child.ProcessState == nil {
			_ = child.Process.Kill()
			_ = child.Wait()
		}
	})
	// refresh reads what the child recorded so far.
	refresh := func() {
		if err := w.ledger.readSuccessFile(successFile); err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
	}
	waitSuccesses := func(k int, within time.Duration) {
		t.Helper()
		deadline := time.Now().Add(within)
		for refresh(); w.ledger.successCount() < k; refresh() {
			if time.Now().After(deadline) {
				t.Fatalf("only %d ids succeeded within %s, want %d", w.ledger.successCount(), within, k)
			}
			time.Sleep(50 * time.Millisecond) // another process's file: no event to wait on
		}
	}

	w.readQuarantine()
	pub, published := w.publish(5 * time.Millisecond)
	start()
	for k := 1; k <= 2; k++ {
		waitSuccesses(k*n/4, 90*time.Second)
		if err := child.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		_ = child.Wait()
		refresh()
		t.Logf("SIGKILL %d: %d ids succeeded, %d published", k, w.ledger.successCount(), pub.Confirmed())
		start()
	}
	if err := published(); err != nil {
		t.Fatalf("publisher: %v", err)
	}
	deadline := time.Now().Add(120 * time.Second)
	for refresh(); time.Now().Before(deadline); refresh() {
		w.ledger.mu.Lock()
		done := w.ledger.accounted(n) == n
		w.ledger.mu.Unlock()
		if done {
			break
		}
		time.Sleep(100 * time.Millisecond) // another process's file: no event to wait on
	}
	w.waitDrained(10 * time.Second)
	_ = child.Process.Signal(syscall.SIGTERM)
	if err := child.Wait(); err != nil {
		t.Errorf("the last consumer process: %v", err)
	}
	refresh()
	t.Logf("publisher: %d confirmed, %d sent again", pub.Confirmed(), pub.Resent())
	w.verify(time.Second, false)
}

// The node's application is stopped and started (rabbitmqctl stop_app,
// start_app) while the publisher sends and handlers run.
func TestNodeStopAppStartApp(t *testing.T) {
	skipShort(t)
	const n = 600
	w := newWorld(t, n)
	w.readQuarantine()
	w.runConsumer(nil, nil)
	pub, published := w.publish(10 * time.Millisecond)
	if !w.ledger.waitFor(func() bool { return len(w.ledger.successes) >= n/4 }, 90*time.Second) {
		t.Fatalf("only %d ids succeeded before the fault", w.ledger.successCount())
	}
	t0 := time.Now()
	at, sent := w.ledger.successCount(), pub.Confirmed()
	w.node.StopApp()
	down := time.Since(t0)
	w.node.StartApp()
	t.Logf("stop_app at %d successes, %d published: down after %s, up after %s", at, sent, down.Round(time.Millisecond), time.Since(t0).Round(time.Millisecond))
	if err := published(); err != nil {
		t.Fatalf("publisher: %v", err)
	}
	w.verify(120*time.Second, false)
}

// Every connection on the node (the runtime's, the publisher's, the
// quarantine reader's) is force-closed every 2-5 s while messages flow:
// for 12 s by default, for a minute with DLXBRIDGE_FAULTS=full.
func TestConnectionsForceClosedRepeatedly(t *testing.T) {
	skipShort(t)
	n, span := 400, 12*time.Second
	if full() {
		n, span = 2000, 60*time.Second
	}
	w := newWorld(t, n)
	w.readQuarantine()
	w.runConsumer(nil, nil)
	pub, published := w.publish(span / time.Duration(n))
	if !w.ledger.waitFor(func() bool { return len(w.ledger.successes) >= 10 }, 60*time.Second) {
		t.Fatal("no handler success before the faults")
	}
	closes := 0
	// Two rounds at least: on a loaded machine one rabbitmqctl call can
	// take most of the span (seen: 1 round in 12 s at load 25).
	for end := time.Now().Add(span); time.Now().Before(end) || closes < 2; {
		if err := w.node.CloseAllConnections("dlxbridge fault test"); err != nil {
			t.Fatal(err)
		}
		closes++
		// The fault's rhythm, not a wait for a condition.
		time.Sleep(2*time.Second + rand.N(3*time.Second))
	}
	t.Logf("%d rounds of close_all_connections over %s; %d ids succeeded, %d published meanwhile", closes, span, w.ledger.successCount(), pub.Confirmed())
	if err := published(); err != nil {
		t.Fatalf("publisher: %v", err)
	}
	w.verify(120*time.Second, false)
	t.Logf("publisher: %d sent again", pub.Resent())
}

// The quarantine queue is deleted mid-stream, so that the runtime's
// quarantine publishes hit no queue (Q.dead still exists: a mandatory
// return): the runtime must requeue those deliveries, never ack them. Then
// the topology is applied again and everything drains.
func TestQuarantineDeletedMidStream(t *testing.T) {
	skipShort(t)
	const n = 600
	w := newWorld(t, n)
	reg := prometheus.NewRegistry()
	w.readQuarantine()
	w.runConsumer(reg, nil)
	_, published := w.publish(5 * time.Millisecond)
	if !w.ledger.waitFor(func() bool { return len(w.ledger.quarantined) >= 10 }, 90*time.Second) {
		t.Fatal("nothing reached the quarantine before the fault")
	}
	deleteQuarantine(t, w)
	deleted := time.Now()
	failures := func() float64 { return counter(t, reg, "dlxbridge_publish_failures_total", "kind", "quarantine") }
	deadline := time.Now().Add(60 * time.Second)
	for failures() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no quarantine publish failed within 60s of deleting the quarantine")
		}
		time.Sleep(20 * time.Millisecond) // a metric: no event to wait on
	}
	t.Logf("first quarantine publish refused %s after the queue was deleted", time.Since(deleted).Round(time.Millisecond))
	time.Sleep(time.Second) // let more quarantines meet the missing queue
	w.declare()
	t.Logf("topology applied again %s after the delete; %.0f quarantine publishes had failed", time.Since(deleted).Round(time.Millisecond), failures())
	if err := published(); err != nil {
		t.Fatalf("publisher: %v", err)
	}
	w.verify(120*time.Second, false)
}

// A memory alarm goes off while handlers fail and their retries are being
// published, and clears again: every retry must go through after it, every
// message that fails once must then succeed (none quarantined), and
// nothing is lost.
func TestMemoryAlarmWhileRetriesArePublished(t *testing.T) {
	skipShort(t)
	const n = 400
	w := newWorld(t, n)
	w.readQuarantine()
	_, published := w.publish(0) // all of them first: the alarm would block this publisher too
	if err := published(); err != nil {
		t.Fatalf("publisher: %v", err)
	}
	var alarm atomic.Bool
	var failures, duringAlarm atomic.Int64
	// After the first 10, handlers about to fail wait for the alarm, so
	// that their retries are published while it is on.
	alarmRaised := make(chan struct{})
	var release sync.Once
	alarmOn := false
	t.Cleanup(func() {
		if alarmOn {
			w.node.ClearMemoryAlarm()
		}
	})
	reg := prometheus.NewRegistry()
	retried := func() float64 { return counter(t, reg, "dlxbridge_deliveries_total", "outcome", "retried") }
	w.runConsumer(reg, func() {
		if failures.Add(1) > 10 {
			<-alarmRaised
		}
		if alarm.Load() {
			duringAlarm.Add(1)
		}
		w.ledger.notify()
	})
	// If the test ends early, parked handlers go on before the runtime
	// stops (cleanups run last registered first).
	t.Cleanup(func() { release.Do(func() { close(alarmRaised) }) })
	if !w.ledger.waitFor(func() bool { return failures.Load() > 10 }, 60*time.Second) {
		t.Fatalf("only %d transient failures before the alarm", failures.Load())
	}
	w.node.RaiseMemoryAlarm()
	alarmOn = true
	alarm.Store(true)
	retriedBefore := retried()
	release.Do(func() { close(alarmRaised) })
	if !w.ledger.waitFor(func() bool { return duringAlarm.Load() >= 1 }, 30*time.Second) {
		t.Fatal("no handler failed (no retry to publish) during the alarm")
	}
	time.Sleep(3 * time.Second) // hold the alarm while retries wait to be published
	retriedDuring := retried() - retriedBefore
	alarm.Store(false)
	w.node.ClearMemoryAlarm()
	alarmOn = false
	t.Logf("alarm raised after 10 transient failures; %d more failed while it was on, and %.0f retries were confirmed during it (the broker blocks publishing connections)",
		duringAlarm.Load(), retriedDuring)
	w.verify(120*time.Second, true)
}

// deleteQuarantine deletes the quarantine queue without losing what is in
// it to the test's own hand: first it is unbound from Q.dead (from then on
// the runtime's quarantine publishes are returned: nothing is bound), then
// the reader empties it, then it is deleted.
func deleteQuarantine(t *testing.T, w *world) {
	t.Helper()
	conn, err := amqpx.Dial(w.node.URL, w.env.Prefix+"/delete")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	q := w.queue.Quarantine.Queue
	unbound := 0
	for _, b := range w.topo.Bindings {
		if b.Queue == q {
			if err := ch.QueueUnbind(q, b.Key, b.Exchange, nil); err != nil {
				t.Fatalf("unbind %s from %s: %v", q, b.Exchange, err)
			}
			unbound++
		}
	}
	if unbound == 0 {
		t.Fatalf("the topology binds nothing to %s", q)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		d, err := bench.Depth(conn, q)
		if err != nil {
			t.Fatal(err)
		}
		if d == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the reader left %d messages in %s for 30s", d, q)
		}
		time.Sleep(20 * time.Millisecond) // the reader empties it
	}
	purged, err := ch.QueueDelete(q, false, false, false)
	if err != nil {
		t.Fatalf("delete %s: %v", q, err)
	}
	if purged != 0 {
		t.Fatalf("deleted %s with %d messages in it", q, purged)
	}
}

// counter sums the counter name's samples whose label has value.
func counter(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label && lp.GetValue() == value {
					sum += m.GetCounter().GetValue()
				}
			}
		}
	}
	return sum
}
