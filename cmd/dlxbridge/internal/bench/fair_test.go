package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/config"
	"github.com/dlxbridge/dlxbridge/internal/brokertest"
)

// The fair floor's handler retries a transient failure once and an
// always-failing message until its last attempt, then quarantines it, and
// quarantines a schema-invalid message at once; every call is reported.
func TestFairHandleAttempts(t *testing.T) {
	t.Parallel()
	kinds := map[Kind]int{}
	for i := 0; len(kinds) < 4; i++ {
		if _, ok := kinds[KindOf(Storm, i)]; !ok {
			kinds[KindOf(Storm, i)] = i
		}
	}
	want := map[Kind][]fairOutcome{
		OK:            {fairOK},
		Invalid:       {fairQuarantine},
		TransientOnce: {fairRetry, fairOK},
		AlwaysFailing: {fairRetry, fairRetry, fairQuarantine},
	}
	for kind, i := range kinds {
		var buf bytes.Buffer
		rep := newReporter(100, &buf)
		body := Body(i, 600, kind)
		var got []fairOutcome
		h := amqp.Table{}
		for range 5 {
			out := fairHandle(Storm, i, fairAttempt(h), body, rep)
			got = append(got, out)
			if out != fairRetry {
				break
			}
			h = amqp.Table{fairAttemptHeader: int32(fairAttempt(h) + 1)}
		}
		var res sideResult
		if err := rep.close(&res); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, want[kind]) || res.Records != int64(len(got)) {
			t.Errorf("%s: outcomes %v, %d records; want %v, one record per call", kind, got, res.Records, want[kind])
		}
	}
	if fairAttempt(amqp.Table{fairAttemptHeader: int64(3)}) != 3 || fairAttempt(amqp.Table{fairAttemptHeader: "2"}) != 1 || fairAttempt(nil) != 1 {
		t.Error("fairAttempt reads the header wrong")
	}
}

// runJSON runs the command and returns its exit code and JSON report.
func runJSON(t *testing.T, args ...string) (int, *Report, string) {
	t.Helper()
	code, out, errs := runCommand(t, append(args, "--output", "json")...)
	var rep Report
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &rep); err != nil {
		t.Fatalf("exit %d, not the JSON report: %v\nstdout:\n%s\nstderr:\n%s", code, err, out, errs)
	}
	return code, &rep, errs
}

// The fair side drains a storm through its TTL queue and back: every id
// handled or in the quarantine, where it belongs, nothing left in the TTL
// queue, and the runtime's sides read against it. Then a message taken off
// its queue behind its back must show as lost: the count is of what
// arrived, not of what the side believes it did.
func TestBenchFairFloorCountsEveryMessage(t *testing.T) {
	t.Parallel()
	env := brokertest.Require(t)
	const n = 300
	var errb bytes.Buffer
	o, _, ok := parseFlags([]string{"--url", env.URL, "--prefix", env.Name("ff"), "--count", "300", "--size", "600",
		"--prefetch", "20", "--rounds", "1", "--idle", "20s", "--fair-floor"}, &errb, func(string) string { return "" })
	if !ok {
		t.Fatal(errb.String())
	}
	rep, err := run(context.Background(), o, &errb)
	if err != nil || !rep.Reconciled || rep.Lost != 0 || rep.Misplaced != 0 || rep.BadBodies != 0 {
		t.Fatalf("%v, report %+v\nstderr:\n%s", err, rep, errb.String())
	}
	for _, sc := range rep.Scenarios {
		f := sc.rounds[0].Sides[Fair]
		if f == nil {
			t.Fatalf("%s: no fair side", sc.Scenario)
		}
		wantQ := 0
		for i := range n {
			if KindOf(sc.Scenario, i).Quarantined() {
				wantQ++
			}
		}
		if f.Handled != n-wantQ || f.Quarantined != wantQ || f.Lost != 0 || f.Left != 0 || f.Duplicates != 0 {
			t.Errorf("%s: fair side handled %d, quarantined %d, lost %d, left %d, duplicates %d; want %d, %d, 0, 0, 0",
				sc.Scenario, f.Handled, f.Quarantined, f.Lost, f.Left, f.Duplicates, n-wantQ, wantQ)
		}
		if sum := sc.Sides[Fair]; sum == nil || sum.Rate <= 0 || len(sum.Rates) != 1 {
			t.Errorf("%s: no fair side figures: %+v", sc.Scenario, sc.Sides)
		}
		if sc.Scenario == Storm {
			if v := sc.Versus[Bridge]; v == nil || v.Ref != Fair || v.CPU <= 0 || v.Rate <= 0 {
				t.Errorf("storm: the bridge is not read against the fair floor: %+v", sc.Versus)
			}
			if sc.Sides[Fair].ConfirmWaitMS <= 0 {
				t.Error("storm: the fair side's retries waited for no confirm")
			}
		}
	}
	code, rep, errs := runJSON(t, "--url", env.URL, "--prefix", env.Name("fl"), "--count", "100", "--size", "600",
		"--scenario", "storm", "--prefetch", "10", "--rounds", "1", "--idle", "3s", "--fair-floor",
		"--test-drop", "1", "--test-drop-side", Fair)
	if code != 1 || rep.Reconciled || rep.Lost != 1 {
		t.Errorf("a message dropped from the fair side's queue: exit %d, reconciled %v, lost %d; want 1, false, 1\nstderr:\n%s", code, rep.Reconciled, rep.Lost, errs)
	}
	// The bench deleted what it declared, the fair side's TTL queue too
	// (look before the harness deletes what is left anyway).
	conn := env.Dial("fair-leftovers")
	for _, prefix := range []string{env.Name("ff") + "-storm-r1-fair", env.Name("fl") + "-storm-r1-fair"} {
		work := prefix + ".work"
		for _, q := range []string{work, prefix + ".quarantine", config.RetryQueueName(work, defaultTiers[0], 0)} {
			ch, err := conn.Channel()
			if err != nil {
				t.Fatal(err)
			}
			if _, err := ch.QueueDeclarePassive(q, true, false, false, false, nil); err == nil {
				t.Errorf("queue %s is still on the broker", q)
				_ = ch.Close()
			}
		}
	}
}
