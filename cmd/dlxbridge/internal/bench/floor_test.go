package bench

import (
	"encoding/json"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/dlxbridge/dlxbridge/internal/brokertest"
)

// The floor's acks, as the broker would take them: a multiple ack must name
// a tag still outstanding (3.10 closes the channel otherwise), a single ack
// too, no ack may cover a parked delivery whose confirm is still out, and
// once every confirm is in, every delivery is acked exactly once.
func TestFloorAcksNeverCoverAnUnconfirmedPark(t *testing.T) {
	t.Parallel()
	for seed := range uint64(200) {
		rng := rand.New(rand.NewPCG(seed, 7))
		var a floorAcks
		outstanding := map[uint64]bool{}
		unconfirmed := map[uint64]uint64{} // seq -> tag
		var seqs []uint64
		var seq uint64
		ackMultiple := func(tag uint64) {
			if !outstanding[tag] {
				t.Fatalf("seed %d: multiple ack of %d, not outstanding", seed, tag)
			}
			for t2 := range outstanding {
				if t2 <= tag {
					for _, u := range unconfirmed {
						if u == t2 {
							t.Fatalf("seed %d: multiple ack of %d covers %d, whose confirm is out", seed, tag, t2)
						}
					}
					delete(outstanding, t2)
				}
			}
		}
		ackOne := func(tag uint64) {
			if !outstanding[tag] {
				t.Fatalf("seed %d: single ack of %d, not outstanding", seed, tag)
			}
			for _, u := range unconfirmed {
				if u == tag {
					t.Fatalf("seed %d: single ack of %d, whose confirm is out", seed, tag)
				}
			}
			delete(outstanding, tag)
		}
		const n = 400
		for tag := uint64(1); tag <= n; tag++ {
			outstanding[tag] = true
			if rng.IntN(10) == 0 {
				seq++
				a.park(seq, tag)
				unconfirmed[seq] = tag
				seqs = append(seqs, seq)
			} else {
				a.settle(tag)
			}
			// Confirms arrive late, in order or not.
			for len(seqs) > 0 && rng.IntN(3) == 0 {
				k := 0
				if rng.IntN(4) == 0 {
					k = rng.IntN(len(seqs))
				}
				s := seqs[k]
				seqs = append(seqs[:k], seqs[k+1:]...)
				a.confirm(s)
				delete(unconfirmed, s)
			}
			if a.behind() >= 20 {
				for _, t := range a.spill() {
					ackOne(t)
				}
			}
			if rng.IntN(5) == 0 {
				if tag, ok := a.ackable(); ok {
					ackMultiple(tag)
				}
			}
		}
		for _, s := range seqs {
			a.confirm(s)
			delete(unconfirmed, s)
		}
		if tag, ok := a.ackable(); ok {
			ackMultiple(tag)
		}
		if len(outstanding) != 0 || !a.idle() {
			t.Fatalf("seed %d: %d deliveries never acked (idle %v)", seed, len(outstanding), a.idle())
		}
	}
}

// The floor side drains a storm: every id handled or quarantined where it
// belongs (a floor that handled an invalid message counts as misplaced),
// none lost, and the report carries its rates beside the bridge's.
func TestBenchFloorSide(t *testing.T) {
	t.Parallel()
	env := brokertest.Require(t)
	code, out, errs := runCommand(t, "--url", env.URL, "--prefix", env.Name("f"), "--count", "300", "--size", "600",
		"--prefetch", "20", "--rounds", "1", "--idle", "20s", "--floor", "--output", "json")
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errs)
	}
	var rep Report
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &rep); err != nil {
		t.Fatalf("not the JSON report: %v\n%s", err, out)
	}
	if !rep.Reconciled || rep.Lost != 0 || rep.Misplaced != 0 || rep.BadBodies != 0 || rep.FloorStormVsClean <= 0 {
		t.Errorf("report: %+v", rep)
	}
	for _, sc := range rep.Scenarios {
		if sc.Floor == nil || sc.Floor.Rate <= 0 || sc.BridgeVsFloor <= 0 {
			t.Errorf("%s: no floor figures: %+v", sc.Scenario, sc)
			continue
		}
		// A storm's parked copies waited for their confirms, on both
		// sides; a clean run publishes none.
		parks := sc.Scenario == Storm
		if (sc.Bridge.ConfirmWaitMS > 0) != parks || (sc.Floor.ConfirmWaitMS > 0) != parks {
			t.Errorf("%s: confirm waits bridge %v ms, floor %v ms", sc.Scenario, sc.Bridge.ConfirmWaitMS, sc.Floor.ConfirmWaitMS)
		}
	}
	assertNothingLeft(t, env)
}

// An id delivered twice whose message must be parked (a storm's id 0 is
// schema-invalid) is parked twice by the floor: a duplicate, counted
// apart, never a stall until the idle timeout.
func TestBenchFloorCountsDuplicatesApart(t *testing.T) {
	t.Parallel()
	env := brokertest.Require(t)
	code, out, errs := runCommand(t, "--url", env.URL, "--prefix", env.Name("fd"), "--count", "100", "--scenario", "storm",
		"--rounds", "1", "--prefetch", "10", "--idle", "5s", "--floor", "--output", "json", "--test-dup", "1")
	var rep Report
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &rep); err != nil {
		t.Fatalf("exit %d, not the JSON report: %v\n%s\n%s", code, err, out, errs)
	}
	// Only the floor's part: the bridge side stops at a quarantine depth
	// the duplicate already makes up, before its always-failing id 90
	// left the retry lanes, and reports it lost (a bug of its own).
	if strings.Contains(errs, " floor: ") || rep.Duplicates < 3 {
		t.Errorf("the floor side failed, or duplicates %d < 3 (one per side)\nstdout:\n%s\nstderr:\n%s", rep.Duplicates, out, errs)
	}
}
