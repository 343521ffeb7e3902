package consumer

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/config"
	"github.com/dlxbridge/dlxbridge/quarantine"
	"github.com/dlxbridge/dlxbridge/schemas"
	"github.com/dlxbridge/dlxbridge/triage"
	"github.com/dlxbridge/dlxbridge/wire"
)

// redriveChildEnv names the config of a runtime process for the automatic
// redrive kill test; redriveDownEnv the Unix time in ms until which its
// handler's dependency is down.
const (
	redriveChildEnv = "DLXBRIDGE_TEST_REDRIVE_CHILD"
	redriveDownEnv  = "DLXBRIDGE_TEST_REDRIVE_DOWN_UNTIL"
)

// redriveChild is a runtime with automatic redrive, in a process of its
// own, that says what its handler does ("handled ID JOB UNIXNANO", JOB
// "-" for a message no replay sent; "failed ID") and how each redrive
// ends ("redrive RUN stopped=BOOL sent=N"). It runs until SIGKILL or
// SIGTERM.
func redriveChild() int {
	fail := func(err error) int { fmt.Fprintln(os.Stderr, "redrive child:", err); return 2 }
	raw, err := os.ReadFile(os.Getenv(redriveChildEnv))
	if err != nil {
		return fail(err)
	}
	var file config.Config
	if err := json.Unmarshal(raw, &file); err != nil {
		return fail(err)
	}
	registry, err := schemas.Load(schemas.LoadOptions{Dir: file.Schemas.Dir})
	if err != nil {
		return fail(err)
	}
	ms, _ := strconv.ParseInt(os.Getenv(redriveDownEnv), 10, 64)
	downUntil := time.UnixMilli(ms)
	var out sync.Mutex
	say := func(format string, args ...any) {
		out.Lock()
		defer out.Unlock()
		fmt.Fprintf(os.Stdout, format+"\n", args...)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	cfg := &Config{
		URL: os.Getenv("RABBITMQ_URL"), File: &file, Registry: registry,
		ConnectionName: os.Getenv("DLXBRIDGE_TEST_CRASH_NAME"),
		SigningKey:     []byte(testSigningKey),
		Logger:         slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})),
		DrainTimeout:   2 * time.Second,
		hooks: &testHooks{keeper: true, redrive: func(_ string, res *quarantine.ReplayResult, err error) {
			if res != nil {
				say("redrive %s stopped=%v sent=%d", res.Run, res.Stopped, len(res.Sent))
			}
		}},
	}
	c, err := New(cfg)
	if err != nil {
		return fail(err)
	}
	if err := c.Handle(file.Queues[0].Name, testType, HandlerFunc(func(ctx context.Context, m *Message) error {
		if time.Now().Before(downUntil) {
			say("failed %s", m.MessageID)
			time.Sleep(100 * time.Millisecond)
			return triage.DependencyDown(0, fmt.Errorf("payments API: 503"))
		}
		job, _ := m.Headers[wire.HeaderReplayJob].(string)
		if job == "" {
			job = "-"
		}
		say("handled %s %s %d", m.MessageID, job, time.Now().UnixNano())
		return nil
	})); err != nil {
		return fail(err)
	}
	if err := c.Run(ctx); err != nil {
		return fail(err)
	}
	return 0
}

// The kill test: the runtime that redrives an outage is killed
// with SIGKILL during the ramp and a new one started. The window is on the
// broker: the new runtime finds it not redriven, and replays the records
// the dead one had not sent: no window lost, no record replayed twice
// (the message in flight at the kill may be handled twice: at least once),
// every message handled.
func TestAutoRedriveSurvivesAKilledRuntime(t *testing.T) {
	if testing.Short() {
		t.Skip("starts and SIGKILLs runtime processes: skipped in -short")
	}
	t.Parallel()
	const n = 60
	b := setup(t, autoRedriveQueue)
	cfgPath := childConfig(t, b)
	for i := range n {
		b.publishJSON(map[string]any{"id": fmt.Sprint(i)}, amqp.Publishing{MessageId: fmt.Sprintf("m-%02d", i)})
	}

	type handled struct {
		id, job string
		at      time.Time
	}
	var all []handled
	// run starts a runtime process whose dependency is down until
	// downUntil, and reads what it says until until says to stop: then it
	// SIGKILLs it (kill) or SIGTERMs it.
	run := func(name string, downUntil time.Time, kill bool, until func(h []handled, line string) bool) {
		c := startChild(t, redriveChildEnv+"="+cfgPath, "RABBITMQ_URL="+b.env.URL,
			redriveDownEnv+"="+strconv.FormatInt(downUntil.UnixMilli(), 10),
			"DLXBRIDGE_TEST_CRASH_NAME="+b.env.Prefix+"/"+name)
		defer func() {
			sig := syscall.SIGTERM
			if kill {
				sig = syscall.SIGKILL
			}
			_ = c.stop(sig)
		}()
		timeout := time.After(120 * time.Second)
		for {
			select {
			case l, ok := <-c.lines:
				if !ok {
					t.Fatalf("%s ended by itself", name)
				}
				if f := strings.Fields(l); len(f) == 4 && f[0] == "handled" {
					ns, _ := strconv.ParseInt(f[3], 10, 64)
					all = append(all, handled{id: f[1], job: f[2], at: time.Unix(0, ns)})
				}
				if until(all, l) {
					return
				}
			case <-timeout:
				t.Fatalf("%s: not done within 120s (%d handled)", name, len(all))
			}
		}
	}
	replayedIn := func(h []handled) int {
		k := 0
		for _, x := range h {
			if x.job != "-" {
				k++
			}
		}
		return k
	}
	// The first runtime: the dependency is down for 10 s; killed at the
	// third message its redrive sent.
	run("first", time.Now().Add(10*time.Second), true, func(h []handled, _ string) bool { return replayedIn(h) >= 3 })
	killedAt := len(all)
	// The second: the dependency is up. Done once every message was
	// handled and a redrive of its own finished.
	finished := false
	run("second", time.Time{}, false, func(h []handled, line string) bool {
		finished = finished || strings.HasPrefix(line, "redrive ") && strings.Contains(line, "stopped=false")
		ids := map[string]bool{}
		for _, x := range h {
			ids[x.id] = true
		}
		return finished && len(ids) == n
	})

	signer, err := triage.NewSigner([]byte(testSigningKey))
	must(t, err)
	in := &quarantine.Inspector{Conn: b.env.Dial("inspector"), Config: b.file, Verifier: signer, OmitBodies: true}
	events, err := in.Events(context.Background())
	must(t, err)
	replayedBy := map[string]string{}
	for _, e := range events {
		if e.Kind == quarantine.EventReplayed {
			for _, id := range e.IDs {
				if prev, dup := replayedBy[id]; dup {
					t.Errorf("record %s replayed twice (jobs %s and %s)", id, prev, e.Run)
				}
				replayedBy[id] = e.Run
			}
		}
	}
	if ended, ongoing := quarantine.PendingWindows(events, b.queue.Name); len(ended)+len(ongoing) != 0 {
		t.Errorf("windows left: ended %v, ongoing %v", ended, ongoing)
	}
	jobs, err := in.Jobs(context.Background())
	must(t, err)
	byJob := map[string][]handled{}
	times := map[string]int{}
	for _, x := range all {
		times[x.id]++
		if x.job != "-" {
			byJob[x.job] = append(byJob[x.job], x)
		}
	}
	twice := 0
	for id, k := range times {
		if k > 1 {
			twice++
			t.Logf("%s handled %d times", id, k)
		}
	}
	if len(times) != n || twice > 1 {
		t.Errorf("%d of %d messages handled, %d more than once (at most the one in flight at the kill may be)", len(times), n, twice)
	}
	var states []string
	for _, j := range jobs {
		if j.By != quarantine.AutoBy || j.Sent == 0 {
			continue
		}
		states = append(states, j.State)
		var stamps []string
		for _, x := range byJob[j.ID] {
			stamps = append(stamps, fmt.Sprintf("%.2f", x.at.Sub(byJob[j.ID][0].at).Seconds()))
		}
		t.Logf("job %s on %s: %s (%s), selected %d sent %d confirmed %d handled %d; handler times (s): %v",
			j.ID, b.env.ServerVersion, j.State, j.Stop, j.Selected, j.Sent, j.Confirmed, j.Handled, stamps)
	}
	// Newest first: the second runtime's done, the killed one's stopped.
	if len(states) != 2 || states[0] != quarantine.JobDone || states[1] != quarantine.JobStopped {
		t.Errorf("automatic redrive jobs: %v, want [done stopped]", states)
	}
	t.Logf("%d handled before the kill, %d in all", killedAt, len(all))
}
