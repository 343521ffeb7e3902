package faulttest

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/cmd/dlxbridge/internal/bench"
	"github.com/dlxbridge/dlxbridge/internal/brokertest"
)

// The end-to-end run on the broker under test (RABBITMQ_URL: the shared
// 3.10.8, 4.0.5 or 4.3.6 node), with DLXBRIDGE_FAULTS=full only: a
// publisher of the test's own (amqp091-go, not the bridge's publisher)
// sends e2eN mixed messages (the storm's mix, some with forged
// x-delivery-count or x-death headers), while the runtime runs in a child
// process that is SIGKILLed three times and crashes (os.Exit) on every
// delivery of the crash-loop ids, and is started again each time. Every
// id must end handled or quarantined; the crash-loop ids as crash loops.
// Each handler success is recorded with the process that ran it, and every
// id handled twice by one process is checked against that process's own
// log: a duplicate with no lost session behind it is a settlement bug.
const e2eN = 2200

// e2eCrash are the ids whose handler crashes the process.
var e2eCrash = []int{601, 1501}

// e2eForged says what a foreign producer put in message i's headers.
func e2eForged(i int) amqp.Table {
	switch {
	case i%50 == 7:
		return amqp.Table{"x-delivery-count": int64(50)}
	case i%70 == 11:
		return amqp.Table{"x-death": []any{amqp.Table{"queue": "anything", "reason": "delivery_limit", "count": int64(99)}}}
	}
	return nil
}

// success is one handler success as a child recorded it.
type success struct {
	id, pid  int
	at       time.Time
	attempt  int
	counts   string // x-delivery-count/x-acquired-count as received
	childLog string // the process's log file
}

func TestEndToEndKillsAndCrashLoops(t *testing.T) {
	skipShort(t)
	if !full() {
		t.Skip("the end-to-end run runs with DLXBRIDGE_FAULTS=full")
	}
	env := brokertest.Require(t)
	cfg, err := faultConfig(env.Prefix)
	if err != nil {
		t.Fatal(err)
	}
	w := &world{t: t, env: env, cfg: cfg, queue: &cfg.Queues[0], n: e2eN, ledger: newLedger(e2eN),
		consumerURL: env.URL, publishURL: env.URL, readerURL: env.URL}
	w.declare()
	dir := t.TempDir()
	successFile := filepath.Join(dir, "successes")
	crash := map[int]bool{}
	for _, i := range e2eCrash {
		crash[i] = true
	}
	spec, _ := json.Marshal(childSpec{URL: env.URL, Prefix: env.Prefix, SuccessFile: successFile, Crash: e2eCrash, Detail: true})
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}

	var mu sync.Mutex
	var child *exec.Cmd
	logs := map[int]string{} // pid -> its log file
	starts, crashes := 0, 0
	exited := make(chan *exec.Cmd, 1)
	start := func() {
		mu.Lock()
		defer mu.Unlock()
		starts++
		logFile := filepath.Join(dir, fmt.Sprintf("child-%d.log", starts))
		f, err := os.Create(logFile)
		if err != nil {
			t.Fatal(err)
		}
		c := exec.Command(exe, "-test.run=^$")
		c.Env = append(os.Environ(), childEnv+"="+string(spec))
		c.Stdout, c.Stderr = f, f
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		logs[c.Process.Pid] = logFile
		child = c
		go func() { _ = c.Wait(); _ = f.Close(); exited <- c }()
	}
	killed := map[*exec.Cmd]bool{}
	stopping := false
	// The keeper of the child: a child that exited on its own crashed
	// (a crash-loop id) and is started again at once.
	keeperDone := make(chan struct{})
	go func() {
		defer close(keeperDone)
		for c := range exited {
			mu.Lock()
			own := killed[c]
			stop := stopping
			if !own && !stop {
				crashes++
			}
			how := map[bool]string{true: "SIGKILLed", false: "exited by itself"}[own]
			if lf, err := os.OpenFile(logs[c.Process.Pid], os.O_APPEND|os.O_WRONLY, 0); err == nil {
				fmt.Fprintf(lf, "time=%s parent: the process %s (%v) every message id: m-\n", time.Now().Format(time.RFC3339Nano), how, c.ProcessState)
				_ = lf.Close()
			}
			mu.Unlock()
			if stop {
				return
			}
			if !own {
				start()
			}
		}
	}()
	refresh := func() []success {
		l, err := readSuccesses(successFile, logs, &mu)
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		w.ledger.mu.Lock()
		clear(w.ledger.successes)
		for _, s := range l {
			w.ledger.successes[s.id]++
		}
		w.ledger.mu.Unlock()
		return l
	}

	w.readQuarantine()
	p := &brokertest.Publisher{URL: env.URL, Name: env.Prefix + "/foreign-publisher", Exchange: w.queue.Exchange.Name, Pace: 3 * time.Millisecond}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	published := make(chan error, 1)
	go func() {
		published <- p.PublishAll(ctx, e2eN, func(i int) (string, amqp.Publishing) {
			m := bench.Publishing(i, bench.Body(i, bodySize, bench.KindOf(scenario, i)))
			if h := e2eForged(i); h != nil {
				m.Headers = amqp.Table{}
				for k, v := range bench.Publishing(i, nil).Headers {
					m.Headers[k] = v
				}
				for k, v := range h {
					m.Headers[k] = v
				}
			}
			return bench.RoutingKey, m
		})
	}()
	start()
	for k := 1; k <= 3; k++ {
		deadline := time.Now().Add(120 * time.Second)
		for refresh(); w.ledger.successCount() < k*e2eN/4; refresh() {
			if time.Now().After(deadline) {
				t.Fatalf("only %d ids succeeded within 120s, want %d", w.ledger.successCount(), k*e2eN/4)
			}
			time.Sleep(50 * time.Millisecond) // another process's file: no event to wait on
		}
		mu.Lock()
		c := child
		killed[c] = true
		mu.Unlock()
		_ = c.Process.Signal(syscall.SIGKILL)
		time.Sleep(100 * time.Millisecond) // the keeper sees it exit
		t.Logf("SIGKILL %d at %d successes, %d published", k, w.ledger.successCount(), p.Confirmed())
		start()
	}
	if err := <-published; err != nil {
		t.Fatalf("publisher: %v", err)
	}
	deadline := time.Now().Add(180 * time.Second)
	for refresh(); time.Now().Before(deadline); refresh() {
		w.ledger.mu.Lock()
		done := w.ledger.accounted(e2eN) == e2eN
		w.ledger.mu.Unlock()
		if done {
			break
		}
		time.Sleep(100 * time.Millisecond) // another process's file: no event to wait on
	}
	w.waitDrained(10 * time.Second)
	mu.Lock()
	stopping = true
	c := child
	mu.Unlock()
	_ = c.Process.Signal(syscall.SIGTERM)
	<-keeperDone
	all := refresh()
	t.Logf("foreign publisher: %d confirmed, %d sent again; %d processes, %d of them crashed (crash-loop ids), 3 SIGKILLed", p.Confirmed(), p.Resent(), starts, crashes)

	// Every id handled twice by one process, and what that process's log
	// says happened between the two.
	byID := map[int][]success{}
	for _, s := range all {
		byID[s.id] = append(byID[s.id], s)
	}
	unexplained := 0
	for id, ss := range byID {
		for a := 0; a < len(ss); a++ {
			for b := a + 1; b < len(ss); b++ {
				if ss[a].pid != ss[b].pid {
					continue
				}
				why := sessionLosses(ss[a].childLog, ss[a].at, ss[b].at)
				why = append(why, diedAfterCall(logs, bench.ID(id), ss[a].pid, ss[a].at)...)
				t.Logf("every handler call of %s, in every process:\n%s", bench.ID(id), strings.Join(callsOf(logs, bench.ID(id)), "\n"))
				t.Logf("DUPLICATE in one process: %s handled twice by pid %d, %s apart (attempts %d, %d; counts %s, %s); explained by: %v",
					bench.ID(id), ss[a].pid, ss[b].at.Sub(ss[a].at).Round(time.Millisecond), ss[a].attempt, ss[b].attempt, ss[a].counts, ss[b].counts, why)
				if len(why) == 0 {
					unexplained++
				}
			}
		}
	}
	r := w.verify(time.Second, false)
	for _, i := range e2eCrash {
		w.ledger.mu.Lock()
		classes := w.ledger.classes[i]
		w.ledger.mu.Unlock()
		if !slices.Contains(classes, "crash-loop") {
			t.Errorf("crash-loop id %s ended as %v, want quarantined as crash-loop", bench.ID(i), classes)
		}
	}
	t.Logf("end-to-end result: broker %s | %d ids | handled %d | quarantined %d | lost %d | duplicates %d (%d handled twice, %d quarantined twice, %d both) | innocents %d (%d crash-loop or over budget) | same-process duplicates without a lost session: %d",
		env.ServerVersion, r.n, r.handled, r.quarantined, r.lost, r.duplicates, r.dupHandled, r.dupQuarantined, r.both, r.innocents, r.crashLoopOrBudget, unexplained)
	if unexplained > 0 {
		t.Errorf("%d ids handled twice by one process with no lost session in between", unexplained)
	}
}

// readSuccesses reads the detailed success lines children wrote: "ID PID
// UNIXNANO ATTEMPT COUNTS".
func readSuccesses(path string, logs map[int]string, mu *sync.Mutex) ([]success, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	mu.Lock()
	defer mu.Unlock()
	var out []success
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) < 5 {
			continue // a line a SIGKILL cut short
		}
		id := bench.Index(fs[0])
		pid, _ := strconv.Atoi(fs[1])
		ns, _ := strconv.ParseInt(fs[2], 10, 64)
		attempt, _ := strconv.Atoi(fs[3])
		if id < 0 {
			continue
		}
		out = append(out, success{id: id, pid: pid, at: time.Unix(0, ns), attempt: attempt, counts: fs[4], childLog: logs[pid]})
	}
	sort.Slice(out, func(a, b int) bool { return out[a].at.Before(out[b].at) })
	return out, sc.Err()
}

// sessionLosses lists the lines of a child's log between from and to (by
// their time= field) that say a session, connection or channel ended.
func sessionLosses(logFile string, from, to time.Time) []string {
	b, err := os.ReadFile(logFile)
	if err != nil {
		return []string{err.Error()}
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		ts, _, ok := strings.Cut(strings.TrimPrefix(line, "time="), " ")
		if !ok {
			continue
		}
		at, err := time.Parse(time.RFC3339Nano, ts)
		if err != nil || at.Before(from.Add(-time.Second)) || at.After(to) {
			continue
		}
		if strings.Contains(line, "lost") || strings.Contains(line, "reconnect") || strings.Contains(line, "channel") || strings.Contains(line, "closed") || strings.Contains(line, "requeue") {
			out = append(out, line)
		}
	}
	return out
}

// callsOf lists every child's log lines about id (its handler calls, a
// crash on it), each with the child's pid, in time order.
func callsOf(logs map[int]string, id string) []string {
	var out []string
	for pid, f := range logs {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			if strings.Contains(line, id) || strings.Contains(line, "parent: the process") {
				out = append(out, line+" pid="+strconv.Itoa(pid))
			}
		}
	}
	sort.Strings(out) // each begins with its time
	return out
}

// diedAfterCall lists the other processes that called the handler on id
// before the time before and died (SIGKILLed or crashed) after that call:
// a process that dies between its retry copy's confirm and the original's
// ack leaves the original to be redelivered, and both its copy and the
// redelivery's go on (at-least-once).
func diedAfterCall(logs map[int]string, id string, pid int, before time.Time) []string {
	var out []string
	for other, f := range logs {
		if other == pid {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		var call, died time.Time
		var how string
		for _, line := range strings.Split(string(b), "\n") {
			ts, rest, ok := strings.Cut(strings.TrimPrefix(line, "time="), " ")
			if !ok {
				continue
			}
			at, err := time.Parse(time.RFC3339Nano, ts)
			if err != nil {
				continue
			}
			switch {
			case strings.HasPrefix(rest, "child: call "+id+" ") && at.Before(before):
				call = at
			case strings.HasPrefix(rest, "parent: the process "):
				died, how = at, strings.TrimPrefix(rest, "parent: the process ")
			}
		}
		if !call.IsZero() && died.After(call) && died.Before(before) {
			how, _, _ = strings.Cut(how, " every")
			out = append(out, fmt.Sprintf("pid %d called it at %s and %s %s later", other, call.Format("15:04:05.000"), how, died.Sub(call).Round(time.Millisecond)))
		}
	}
	return out
}
