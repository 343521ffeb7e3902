package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlxbridge/dlxbridge/internal/brokertest"
	"github.com/dlxbridge/dlxbridge/schemas"
)

// The bench runs its sides by running its own executable again: here, this
// test binary, which then runs one side and exits.
func TestMain(m *testing.M) {
	if code, ran := RunSideFromEnv(); ran {
		os.Exit(code)
	}
	os.Exit(m.Run())
}

// Body pads to the exact size asked, and the registry's gate takes a valid
// body and refuses an invalid one for the reason meant.
func TestBodyIsExactAndValidAsMeant(t *testing.T) {
	t.Parallel()
	reg, err := schemas.Load(schemas.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s, ok := reg.Lookup(MessageType, MessageVersion)
	if !ok {
		t.Fatalf("no %s v%s in the registry", MessageType, MessageVersion)
	}
	for _, size := range []int{MinSize, MinSize + 1, 500, 1024, 1024 + 37, 4096, 65536, MaxSize} {
		for _, kind := range []Kind{OK, Invalid} {
			b := Body(size, size, kind)
			if len(b) != size {
				t.Errorf("Body(size %d, %s) is %d bytes", size, kind, len(b))
			}
			var v any
			if err := json.Unmarshal(b, &v); err != nil {
				t.Fatalf("Body(size %d, %s) is not JSON: %v", size, kind, err)
			}
			verr := s.Validate(v)
			if (verr == nil) != (kind == OK) {
				t.Errorf("Body(size %d, %s): validation error %v", size, kind, verr)
			}
		}
	}
}

// The storm's mix is what the command's help says.
func TestStormMix(t *testing.T) {
	t.Parallel()
	n := map[Kind]int{}
	for i := range 1000 {
		n[KindOf(Storm, i)]++
	}
	if n[Invalid] != 100 || n[TransientOnce] != 200 || n[AlwaysFailing] != 10 {
		t.Errorf("storm mix of 1000: %v, want 100 invalid, 200 transient once, 10 always failing", n)
	}
}

// tally tells losses, misplacements and duplicates apart.
func TestTally(t *testing.T) {
	t.Parallel()
	// In a storm of 100, id 0 is schema-invalid ((0*37)%100 = 0) and id 2
	// must succeed (74).
	if KindOf(Storm, 0) != Invalid || KindOf(Storm, 2) != OK {
		t.Fatalf("kinds: %s %s", KindOf(Storm, 0), KindOf(Storm, 2))
	}
	s := &sideSpec{Side: Bridge, Scenario: Storm, Count: 100}
	handled, quarantined, left := make([]byte, 100), make([]int, 100), make([]int, 100)
	for i := range 100 {
		if KindOf(Storm, i).Quarantined() {
			quarantined[i] = 1
		} else {
			handled[i] = 1
		}
	}
	var r sideReport
	tally(&r, s, handled, quarantined, left)
	if r.failed() || r.Duplicates != 0 || r.Handled+r.Quarantined != 100 {
		t.Fatalf("all accounted: %+v", r)
	}
	handled[2], left[3] = 0, 1 // 2 lost; 3 handled and a copy left: a duplicate
	handled[0] = 1             // an invalid message handled
	quarantined[5] = 2         // quarantined twice: misplaced if 5 must succeed
	r = sideReport{}
	tally(&r, s, handled, quarantined, left)
	wantMisplaced := 1
	if !KindOf(Storm, 5).Quarantined() {
		wantMisplaced++
	}
	if r.Lost != 1 || r.LostIDs[0] != ID(2) || r.Misplaced != wantMisplaced || r.Duplicates < 3 || !r.failed() {
		t.Errorf("got %+v; want 1 lost (%s), %d misplaced, at least 3 duplicates", r, ID(2), wantMisplaced)
	}
}

// What handlers report in the side reaches the parent's ledger whole:
// every success counted per id (a duplicate apart from a loss), a body that
// differs from the published one flagged, "enough" said exactly once, when
// the last distinct id expected to succeed has, and a side that skipped an
// id leaves it lost.
func TestRecordsReachTheLedger(t *testing.T) {
	t.Parallel()
	s := &sideSpec{Side: Bridge, Scenario: Storm, Count: 200, Size: 600}
	crcs := bodyCRCs(s.Scenario, s.Count, s.Size)
	run := func(skip int) (*ledger, *sideResult, int) {
		t.Helper()
		var buf bytes.Buffer
		rep := newReporter(s.Count, &buf)
		var wg sync.WaitGroup
		for w := range 4 { // concurrent handlers, as in the runtime
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := w; i < s.Count; i += 4 {
					body := Body(i, s.Size, KindOf(s.Scenario, i))
					if i == skip || KindOf(s.Scenario, i).Quarantined() {
						continue
					}
					if KindOf(s.Scenario, i) == TransientOnce {
						rep.report(i, body, false) // a first attempt that failed
					}
					rep.report(i, body, true)
				}
			}()
		}
		wg.Wait()
		rep.report(2, Body(2, s.Size, OK), true) // a redelivery
		altered := Body(4, s.Size, OK)
		altered[100] ^= 1
		rep.report(4, altered, false)
		if i := rep.index("not-a-bench-id"); i != -1 {
			t.Fatalf("index of a foreign id: %d", i)
		}
		var res sideResult
		if err := rep.close(&res); err != nil {
			t.Fatal(err)
		}
		enough := 0
		l := newLedger(s, crcs, func() { enough++ })
		if err := l.read(&buf); err != nil {
			t.Fatal(err)
		}
		if err := l.result(&res); err != nil {
			t.Fatal(err)
		}
		return l, &res, enough
	}

	_, res, enough := run(-1)
	if enough != 1 || res.BadBodies != 1 || res.Unknown != 1 {
		t.Errorf("enough said %d times, %d bad bodies, %d unknown; want 1, 1, 1", enough, res.BadBodies, res.Unknown)
	}
	quarantined, left := make([]int, s.Count), make([]int, s.Count)
	for i := range s.Count {
		if KindOf(s.Scenario, i).Quarantined() {
			quarantined[i] = 1
		}
	}
	var r sideReport
	tally(&r, s, res.Handled, quarantined, left)
	if r.Lost != 0 || r.Misplaced != 0 || r.Duplicates != 1 || res.Handled[2] != 2 {
		t.Errorf("every id reported once, id 2 twice: %+v, id 2 handled %d times", r, res.Handled[2])
	}

	_, res, enough = run(7) // 7 must succeed ((7*37)%100 = 59)
	r = sideReport{}
	tally(&r, s, res.Handled, quarantined, left)
	if enough != 0 || r.Lost != 1 || r.LostIDs[0] != ID(7) {
		t.Errorf("id 7 never reported: enough said %d times, %+v", enough, r)
	}

	// A record the parent never read is an error, not a silent loss.
	l := newLedger(s, crcs, func() {})
	if err := l.result(&sideResult{Records: 1}); err == nil {
		t.Error("a side that wrote a record the parent did not read: no error")
	}
	if err := l.read(bytes.NewReader(make([]byte, recordSize+1))); err == nil {
		t.Error("a torn record: no error")
	}
}

func runCommand(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = Command(context.Background(), args, &out, &errb, func(string) string { return "" })
	return code, out.String(), errb.String()
}

// A small run against the broker: both scenarios, both sides, exit 0, a
// JSON line that parses and says every id was reconciled, and nothing left
// on the broker.
func TestBenchReconcilesEveryID(t *testing.T) {
	t.Parallel()
	env := brokertest.Require(t)
	code, out, errs := runCommand(t, "--url", env.URL, "--prefix", env.Name("b"), "--count", "200", "--size", "600",
		"--prefetch", "20", "--rounds", "2", "--idle", "20s")
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errs)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	var rep Report
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &rep); err != nil {
		t.Fatalf("the last line is not the JSON report: %v\n%s", err, out)
	}
	if !rep.Reconciled || rep.Lost != 0 || rep.Misplaced != 0 || rep.BadBodies != 0 {
		t.Errorf("report: %+v", rep)
	}
	if len(rep.Scenarios) != 2 || rep.StormVsClean <= 0 {
		t.Fatalf("scenarios: %+v", rep.Scenarios)
	}
	for _, sc := range rep.Scenarios {
		if len(sc.Ratios) != 2 || sc.Raw.Rate <= 0 || sc.Bridge.Rate <= 0 || sc.Bridge.MaxRSSKB <= 0 || sc.Bridge.CPUPerMsgUS <= 0 {
			t.Errorf("%s: %+v", sc.Scenario, sc)
		}
		// Every side writes to its broker (acks at least) and reads from it.
		for name, side := range sc.Sides {
			for i, w := range side.WritesPerMsgRounds {
				if w <= 0 || side.ReadsPerMsgRounds[i] <= 0 {
					t.Errorf("%s %s round %d: %v writes, %v reads per message", sc.Scenario, name, i+1, w, side.ReadsPerMsgRounds[i])
				}
			}
		}
	}
	if !strings.Contains(out, "reconciled: every id") {
		t.Errorf("text output lacks the reconciliation line:\n%s", out)
	}
	t.Logf("\n%s", out)
	assertNothingLeft(t, env)
}

// A message taken off the bridge's queue behind its back is a loss: the
// command says which id and exits 1.
func TestBenchMismatchExitsNonZero(t *testing.T) {
	t.Parallel()
	env := brokertest.Require(t)
	code, out, errs := runCommand(t, "--url", env.URL, "--prefix", env.Name("b"), "--count", "50", "--scenario", "clean",
		"--rounds", "1", "--prefetch", "10", "--idle", "3s", "--output", "json", "--test-drop", "1")
	if code != 1 {
		t.Fatalf("exit %d, want 1\nstdout:\n%s\nstderr:\n%s", code, out, errs)
	}
	var rep Report
	if err := json.Unmarshal([]byte(strings.TrimSpace(out)), &rep); err != nil {
		t.Fatalf("--output json: not one JSON line: %v\n%s", err, out)
	}
	if rep.Reconciled || rep.Lost != 1 {
		t.Errorf("reconciled %v, lost %d; want false, 1", rep.Reconciled, rep.Lost)
	}
	if !strings.Contains(errs, "reconciliation failed") || !strings.Contains(errs, "m-0000000") {
		t.Errorf("stderr does not name the lost id:\n%s", errs)
	}
	assertNothingLeft(t, env)
}

// Ids delivered twice (their first copies published ahead of the rest)
// reach the parent through each side's records as duplicates, never as
// losses, and the run still reconciles.
func TestBenchCountsDuplicatesApart(t *testing.T) {
	t.Parallel()
	env := brokertest.Require(t)
	const dups = 3
	code, out, errs := runCommand(t, "--url", env.URL, "--prefix", env.Name("b"), "--count", "60", "--scenario", "clean",
		"--rounds", "1", "--prefetch", "10", "--idle", "20s", "--output", "json", "--test-dup", fmt.Sprint(dups))
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errs)
	}
	var rep Report
	if err := json.Unmarshal([]byte(strings.TrimSpace(out)), &rep); err != nil {
		t.Fatalf("--output json: not one JSON line: %v\n%s", err, out)
	}
	if !rep.Reconciled || rep.Lost != 0 || rep.Duplicates != 2*dups {
		t.Errorf("reconciled %v, lost %d, duplicates %d; want true, 0, %d (each side)", rep.Reconciled, rep.Lost, rep.Duplicates, 2*dups)
	}
	assertNothingLeft(t, env)
}

// assertNothingLeft checks that the bench deleted every object it
// declared (the harness would delete them anyway, so look first).
func assertNothingLeft(t *testing.T, env *brokertest.Env) {
	t.Helper()
	conn := env.Dial("leftovers")
	for _, name := range []string{"clean-r1-raw.work", "clean-r1-bridge.work", "clean-r1-bridge.quarantine", "storm-r2-bridge.work"} {
		ch, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ch.QueueDeclarePassive(env.Name("b")+"-"+name, true, false, false, false, nil); err == nil {
			t.Errorf("queue %s is still on the broker", name)
			_ = ch.Close()
		}
	}
}

// --retry-tiers sets the bridge's two retry delays, in the parent's topology
// and in what a side is told; anything but two positive durations is a
// usage error.
func TestRetryTiersFlag(t *testing.T) {
	t.Parallel()
	getenv := func(string) string { return "" }
	var errs bytes.Buffer
	o, _, ok := parseFlags([]string{"--retry-tiers", "20ms, 40ms"}, &errs, getenv)
	if !ok {
		t.Fatalf("refused: %s", errs.String())
	}
	cfg, err := (&sideSpec{Prefix: "p", Prefetch: o.Prefetch, Tiers: o.Tiers}).config()
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.Queues[0].Retry.Tiers; len(got) != 2 || got[0] != 20*time.Millisecond || got[1] != 40*time.Millisecond {
		t.Errorf("tiers %v, want [20ms 40ms]", got)
	}
	o, _, _ = parseFlags(nil, &errs, getenv)
	if cfg, err := (&sideSpec{Prefix: "p", Prefetch: o.Prefetch, Tiers: o.Tiers}).config(); err != nil || !slices.Equal(cfg.Queues[0].Retry.Tiers, defaultTiers) {
		t.Errorf("default tiers %v (%v), want %v", cfg.Queues[0].Retry.Tiers, err, defaultTiers)
	}
	for _, bad := range []string{"20ms", "20ms,40ms,80ms", "20ms,-1s", "soon,40ms"} {
		if _, code, ok := parseFlags([]string{"--retry-tiers", bad}, &errs, getenv); ok || code != exitUsage {
			t.Errorf("--retry-tiers %q: ok %v, exit %d; want a usage error", bad, ok, code)
		}
	}
}

// --immediate-retries reaches the bridge's config (0 by default, as the
// config's own default); a negative count is a usage error; -h lists it.
func TestImmediateRetriesFlag(t *testing.T) {
	t.Parallel()
	getenv := func(string) string { return "" }
	var errs bytes.Buffer
	for _, n := range []int{0, 2} {
		o, _, ok := parseFlags([]string{"--immediate-retries", strconv.Itoa(n)}, &errs, getenv)
		if !ok {
			t.Fatalf("refused: %s", errs.String())
		}
		cfg, err := (&sideSpec{Prefix: "p", Prefetch: o.Prefetch, ImmediateRetries: o.ImmediateRetries}).config()
		if err != nil {
			t.Fatal(err)
		}
		if got := cfg.Queues[0].Policy().ImmediateRetries; got != n {
			t.Errorf("--immediate-retries %d: the policy has %d", n, got)
		}
	}
	if o, _, _ := parseFlags(nil, &errs, getenv); o.ImmediateRetries != 0 {
		t.Errorf("default %d, want 0", o.ImmediateRetries)
	}
	if _, code, ok := parseFlags([]string{"--immediate-retries", "-1"}, &errs, getenv); ok || code != exitUsage {
		t.Errorf("--immediate-retries -1: ok %v, exit %d; want a usage error", ok, code)
	}
	errs.Reset()
	if _, code, ok := parseFlags([]string{"-h"}, &errs, getenv); ok || code != exitOK || !strings.Contains(errs.String(), "--immediate-retries") {
		t.Errorf("-h: exit %d, does not list --immediate-retries:\n%s", code, errs.String())
	}
}

// The broker's CPU time is read from /proc for the process BrokerPIDEnv
// names (here: this one, which has used some), and is unknown without it.
func TestBrokerCPU(t *testing.T) {
	t.Setenv(BrokerPIDEnv, "")
	if got := brokerCPU(); got != -1 {
		t.Errorf("without %s: %v, want -1", BrokerPIDEnv, got)
	}
	t.Setenv(BrokerPIDEnv, strconv.Itoa(os.Getpid()))
	for usage() < 30*time.Millisecond { // have used a few clock ticks of CPU
	}
	if got := brokerCPU(); got <= 0 {
		t.Errorf("this process's CPU time: %v, want > 0", got)
	}
}

// A run that stops before it is done (interrupted, here before its first
// round) exits 1 and its report does not claim a reconciliation it never
// made: a script reading the JSON line, or someone the text, would take
// "reconciled: true, 0 lost" for a clean run.
func TestBenchInterruptedIsNotReconciled(t *testing.T) {
	t.Parallel()
	env := brokertest.Require(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var out, errb bytes.Buffer
	code := Command(ctx, []string{"--url", env.URL, "--prefix", env.Name("b"), "--count", "50", "--rounds", "1"}, &out, &errb, func(string) string { return "" })
	if code != 1 {
		t.Fatalf("exit %d, want 1\nstdout:\n%s\nstderr:\n%s", code, out.String(), errb.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	var rep Report
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &rep); err != nil {
		t.Fatalf("the last line is not the JSON report: %v\n%s", err, out.String())
	}
	if rep.Reconciled || rep.Error == "" {
		t.Errorf("interrupted run: reconciled %v, error %q; want false and the error", rep.Reconciled, rep.Error)
	}
	if strings.Contains(out.String(), "reconciled: every id") {
		t.Errorf("interrupted run claims a reconciliation:\n%s", out.String())
	}
	assertNothingLeft(t, env)
}

// A declaration that fails part way (interrupted) still hands back what it
// was declaring, so the round deletes it: an interrupted bench left the
// queue and exchanges it had declared so far, and said nothing of them.
func TestDeclareFailureReturnsTheTopology(t *testing.T) {
	t.Parallel()
	env := brokertest.Require(t)
	conn := env.Dial("declare")
	defer conn.Close()
	cfg, err := Config(env.Name("d"), 10, 1)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	topo, err := Declare(ctx, conn, cfg)
	if err == nil {
		t.Fatal("declared under a cancelled context")
	}
	if topo == nil {
		t.Fatal("a failed declaration returned no topology: what it declared cannot be deleted")
	}
	if err := Delete(env.URL, conn, topo); err != nil {
		t.Errorf("delete what a failed declaration may have left: %v", err)
	}
}

// --shared-tiers adds a side "shared" to every round, rotating with the
// others: the bridge's config with retry.tier_queues shared and tiers named
// from the side's own prefix (declared and deleted with the round); the
// bridge side keeps per-queue lanes. Its summary is read against the
// bridge's rounds.
func TestSharedTiersFlag(t *testing.T) {
	t.Parallel()
	var errs bytes.Buffer
	o, _, ok := parseFlags([]string{"--shared-tiers"}, &errs, func(string) string { return "" })
	if !ok || !o.Shared {
		t.Fatalf("refused or ignored: %s", errs.String())
	}
	for r := range 3 {
		if order := sideOrder(o, r); len(order) != 3 || !slices.Contains(order, Shared) || order[0] == sideOrder(o, r+1)[0] {
			t.Errorf("round %d: order %v", r, order)
		}
	}
	shared, err := (&sideSpec{Side: Shared, Prefix: "p-shared"}).config()
	if err != nil {
		t.Fatal(err)
	}
	if q := shared.Queues[0]; !q.Retry.Shared() || shared.SharedTiers.Prefix != "p-shared" {
		t.Errorf("shared side's config: %+v, prefix %q", q.Retry, shared.SharedTiers.Prefix)
	}
	if own, _ := (&sideSpec{Side: Bridge, Prefix: "p"}).config(); own.Queues[0].Retry.Shared() {
		t.Error("the bridge side retries through shared tiers")
	}
	sc := &scenarioReport{rounds: []*roundResult{
		{Sides: map[string]*sideReport{Bridge: {Rate: 100}, Shared: {Rate: 110}}},
		{Sides: map[string]*sideReport{Bridge: {Rate: 200}, Shared: {Rate: 180}}},
		{Sides: map[string]*sideReport{Bridge: {Rate: 100}, Shared: {Rate: 100}}},
	}}
	sc.finishShared()
	if sc.Shared == nil || !slices.Equal(sc.SharedRatios, []float64{1.1, 0.9, 1}) || sc.SharedVsBridge != 1 || sc.Shared.Rate != 110 {
		t.Errorf("shared summary %+v, ratios %v, median %v", sc.Shared, sc.SharedRatios, sc.SharedVsBridge)
	}
}

// A delete that closes the connection (3.10.8 once answered a quorum
// queue's delete with a connection-level INTERNAL_ERROR) must not leave the
// rest of the round's queues behind: Delete dials again for them.
func TestDeleteDialsAgainAfterTheConnectionClosed(t *testing.T) {
	t.Parallel()
	env := brokertest.Require(t)
	cfg, err := (&sideSpec{Side: Bridge, Prefix: env.Name("del"), Prefetch: 10}).config()
	if err != nil {
		t.Fatal(err)
	}
	conn := env.Dial("declare")
	topo, err := Declare(context.Background(), conn, cfg)
	if err != nil {
		t.Fatal(err)
	}
	_ = conn.Close()
	if err := Delete(env.URL, conn, topo); err != nil {
		t.Fatalf("Delete on a closed connection: %v", err)
	}
	check := env.Dial("check")
	for _, q := range topo.Queues {
		ch, err := check.Channel()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ch.QueueDeclarePassive(q.Name, true, false, false, false, nil); err == nil {
			t.Errorf("queue %s is still there", q.Name)
			_ = ch.Close()
		}
	}
}
