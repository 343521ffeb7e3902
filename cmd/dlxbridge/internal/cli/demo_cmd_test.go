package cli_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dlxbridge/dlxbridge/cmd/dlxbridge/internal/cli"
	"github.com/dlxbridge/dlxbridge/config"
	"github.com/dlxbridge/dlxbridge/internal/brokertest"
)

// The demo runs to the end on the real broker, its final table matches
// what it published, and it deletes what it declared.
func TestDemoEndsWhereItPublished(t *testing.T) {
	t.Parallel()
	env := brokertest.Require(t)
	b := &topoBundle{env: env}
	start := time.Now()
	out, errOut := b.mustRunAll(t, cli.ExitOK, "demo", "--prefix", env.Prefix)
	took := time.Since(start)
	final := out[strings.LastIndex(out, "final, after"):]
	final, tail, _ := strings.Cut(final, "\n$ dlxbridge quarantine stats")
	want := map[string]string{
		"demo-valid-1": "handled", "demo-valid-6": "handled",
		"demo-flaky-1": "handled", "demo-flaky-2": "handled",
		"demo-permanent-1": "quarantined (permanent)", "demo-crash-1": "quarantined (panic)",
		"demo-invalid-1": "quarantined (schema)", "demo-invalid-2": "quarantined (schema)",
	}
	// A quarantined message shows its record's count, as quarantine show
	// does: a schema failure's one attempt is the gate's.
	attempts := map[string]string{"demo-valid-1": "1", "demo-flaky-1": "2", "demo-flaky-2": "3",
		"demo-permanent-1": "1", "demo-crash-1": "3", "demo-invalid-1": "1"}
	rows := 0
	for _, line := range strings.Split(final, "\n") {
		f := strings.Fields(line)
		if len(f) < 4 || !strings.HasPrefix(f[0], "demo-") {
			continue
		}
		rows++
		where := strings.Join(f[3:], " ")
		if w, ok := want[f[0]]; ok && where != w {
			t.Errorf("%s ended %q, want %q", f[0], where, w)
		}
		if a, ok := attempts[f[0]]; ok && f[2] != a {
			t.Errorf("%s took %s attempts, want %s", f[0], f[2], a)
		}
	}
	if rows != 12 {
		t.Errorf("final table has %d rows, want the 12 published:\n%s", rows, final)
	}
	for _, s := range []string{
		"published 12: handled 8, quarantined 4 (panic 1, permanent 1, schema 2); the runtime counted 8 acked, 5 retried, 4 quarantined",
		"waiting in retry tier 0 (1s)", "waiting in retry tier 1 (2s)", "deleted the demo's queues and exchanges",
	} {
		if !strings.Contains(out, s) {
			t.Errorf("output lacks %q:\n%s\n%s", s, out, errOut)
		}
	}
	// The stats view lists the quarantined groups; the replay moves the
	// permanent group (one record) and nothing else, and its handler takes
	// it; the stats view after it says so.
	before, after, ok := strings.Cut(tail, "\n$ dlxbridge quarantine stats")
	if !ok {
		t.Fatalf("the demo does not end with two quarantine stats views:\n%s", out)
	}
	if got, want := demoStats(before), "panic=1/0 permanent=1/0 schema=2/0"; got != want {
		t.Errorf("stats before the replay: %s, want %s (class=open/replayed)", got, want)
	}
	if got, want := demoStats(after), "panic=1/0 permanent=0/1 schema=2/0"; got != want {
		t.Errorf("stats after the replay: %s, want %s (class=open/replayed)", got, want)
	}
	for _, s := range []string{"total: 4 open, 0 replayed", "--class permanent", "replayed 1 of 1 selected",
		"demo-permanent-1: handled after the replay", "total: 3 open, 1 replayed"} {
		if !strings.Contains(tail, s) {
			t.Errorf("the quarantine part lacks %q:\n%s", s, tail)
		}
	}
	if n := strings.Count(tail, "\nsend "); n != 1 {
		t.Errorf("the replay sent %d records, want 1:\n%s", n, tail)
	}
	if took > time.Minute {
		t.Errorf("the demo took %s, want under a minute", took)
	}
	t.Logf("demo took %s:\n%s", took.Round(time.Millisecond), out)
}

// demoStats sums a `quarantine stats` table's OPEN and REPLAYED columns by
// class: "class=open/replayed ...", classes sorted.
func demoStats(view string) string {
	open, replayed := map[string]int{}, map[string]int{}
	for _, line := range strings.Split(view, "\n") {
		f := strings.Fields(line)
		if len(f) < 5 || f[0] == "QUEUE" || !strings.HasSuffix(f[0], ".orders") {
			continue
		}
		o, _ := strconv.Atoi(f[2]) // QUEUE CLASS OPEN REPLAYED …
		r, _ := strconv.Atoi(f[3])
		open[f[1]] += o
		replayed[f[1]] += r
	}
	var parts []string
	for c := range open {
		parts = append(parts, fmt.Sprintf("%s=%d/%d", c, open[c], replayed[c]))
	}
	sort.Strings(parts)
	return strings.Join(parts, " ")
}

// With --keep the demo leaves its queues and writes its config, which the
// quarantine commands then read: a newcomer can look at what it kept.
// (The harness deletes the kept objects at the end of the test.)
func TestDemoKeepWritesAConfigTheQuarantineCommandsRead(t *testing.T) {
	t.Parallel()
	env := brokertest.Require(t)
	b := &topoBundle{env: env}
	out := b.mustRun(t, cli.ExitOK, "demo", "--keep", "--prefix", env.Prefix)
	if strings.Contains(out, "deleted the demo's queues") {
		t.Errorf("--keep deleted the demo's queues:\n%s", out)
	}
	_, rest, ok := strings.Cut(out, "its config is ")
	if !ok {
		t.Fatalf("--keep names no config file:\n%s", out)
	}
	path, _, _ := strings.Cut(rest, ":\n")
	t.Cleanup(func() { os.Remove(path) })
	if want := "quarantine stats --config " + path; !strings.Contains(out, want) {
		t.Errorf("output lacks %q:\n%s", want, out)
	}
	stats := b.mustRun(t, cli.ExitOK, "quarantine", "stats", "--config", path)
	if !strings.Contains(stats, "total: 3 open, 1 replayed") {
		t.Errorf("quarantine stats on the kept demo:\n%s", stats)
	}
	// The show and replay lines it prints work as printed.
	if want := "quarantine show <an ID from list> --config " + path; !strings.Contains(out, want) {
		t.Errorf("output lacks %q:\n%s", want, out)
	}
	if want := `quarantine replay --class panic --reason "tried it" --dry-run --config ` + path; !strings.Contains(out, want) {
		t.Errorf("output lacks %q:\n%s", want, out)
	}
	plan := b.mustRun(t, cli.ExitOK, "quarantine", "replay", "--class", "panic", "--reason", "tried it", "--dry-run", "--config", path)
	if !strings.Contains(plan, "1 selected, 1 would be sent") {
		t.Errorf("the printed replay --dry-run on the kept demo:\n%s", plan)
	}
}

// `dlxbridge demo | head -20`: stdout, fd 1, is a pipe whose reader went
// away. The demo must not die of SIGPIPE (which a write to fd 1 raises)
// with its topology left on the broker: it runs to the end unseen, exits
// 0 and deletes what it declared. It runs in a child process (this test
// binary), since only fd 1 and 2 kill a Go program on a broken pipe.
func TestDemoSurvivesAClosedStdout(t *testing.T) {
	if args := os.Getenv("DLXBRIDGE_DEMO_CHILD"); args != "" {
		os.Exit(cli.Main(context.Background(), strings.Split(args, " "), &cli.Env{Stdout: os.Stdout, Stderr: os.Stderr, Stdin: os.Stdin}))
	}
	t.Parallel()
	env := brokertest.Require(t)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	_ = r.Close() // the reader is gone before the first line
	defer w.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^TestDemoSurvivesAClosedStdout$")
	cmd.Env = append(os.Environ(), "DLXBRIDGE_DEMO_CHILD=demo --prefix "+env.Prefix+" --url "+env.URL)
	var stderr strings.Builder
	cmd.Stdout, cmd.Stderr = w, &stderr
	err = cmd.Run()
	if err != nil {
		t.Errorf("demo with a closed stdout: %v (%s)\nstderr:\n%s", err, cmd.ProcessState, stderr.String())
	}
	look := env.Dial("look")
	for _, q := range []string{env.Prefix + ".orders", env.Prefix + ".orders" + config.QuarantineSuffix} {
		ch, err := look.Channel() // a 404 closes it
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ch.QueueDeclarePassive(q, true, false, false, false, nil); err == nil {
			t.Errorf("queue %s is left on the broker", q)
			_ = ch.Close()
		}
	}
}

// A --prefix the demo cannot name its queues with is bad usage (exit 2),
// said of --prefix, before any broker is dialled (port 1 answers nothing).
func TestDemoRefusesABadPrefix(t *testing.T) {
	t.Parallel()
	for _, p := range []string{"bad name!", "-dash-first", "a/b", "amq.demo", strings.Repeat("p", 101)} {
		code, _, stderr := runWith("amqp://127.0.0.1:1/", "demo", "--prefix", p)
		if code != cli.ExitUsage || !strings.Contains(stderr, "--prefix") || strings.Contains(stderr, "queues[0]") {
			t.Errorf("demo --prefix %q: exit %d, stderr %q; want %d naming --prefix", p, code, stderr, cli.ExitUsage)
		}
	}
}
