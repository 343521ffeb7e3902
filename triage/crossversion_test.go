package triage

import (
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"
)

// The same message failing on every delivery must be counted, delayed and
// quarantined identically whether the broker keeps and increments the
// client's x-death (3.10) or replaces it with fresh history (4.x).
func TestCrossVersionEquivalence(t *testing.T) {
	t.Parallel()

	tiers := []time.Duration{time.Second, 5 * time.Second, 30 * time.Second, 2 * time.Minute}
	tests := []struct {
		name    string
		policy  Policy
		class   Class
		upgrade hopShape // a third scenario compared with the other two
		wantEnd string
		wantLen int // deliveries until quarantine
	}{
		{
			name:    "default policy, four lanes",
			policy:  Policy{Tiers: tiers, Lanes: 4, Jitter: 0.2, MaxAttempts: 5, MaxElapsed: 15 * time.Minute},
			class:   ClassTransient,
			wantEnd: "attempt budget exhausted (5/5)",
			wantLen: 5,
		},
		{
			name:    "one lane, last tier reused: 3.10 counts 1→2→3… on one entry",
			policy:  Policy{Tiers: []time.Duration{time.Second, 5 * time.Second}, Lanes: 1, Jitter: 0, MaxAttempts: 8},
			class:   ClassPanic,
			wantEnd: "attempt budget exhausted (8/8)",
			wantLen: 8,
		},
		{
			name:    "time budget ends it",
			policy:  Policy{Tiers: tiers, Lanes: 3, Jitter: 0.5, MaxAttempts: 50, MaxElapsed: 5 * time.Minute},
			class:   ClassTimeout,
			wantEnd: "time budget exhausted",
		},
		{
			name:    "many attempts on the last tier",
			policy:  Policy{Tiers: tiers[:2], Lanes: 2, Jitter: 1, MaxAttempts: 40},
			class:   ClassTransient,
			wantEnd: "attempt budget exhausted (40/40)",
			wantLen: 40,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			run := func(s hopShape) ([]step, table) {
				return simulate(tt.policy, tt.class, s, false, rand.New(rand.NewPCG(1, 2)), t0, 1000)
			}
			runStripped := func(s hopShape) []step {
				log, _ := simulate(tt.policy, tt.class, s, true, rand.New(rand.NewPCG(1, 2)), t0, 1000)
				return log
			}
			old, oldH := run(always(shape310))
			cur, curH := run(always(shape4x))
			upgraded, _ := run(func(hop int) shape {
				if hop < 2 {
					return shape310
				}
				return shape4x
			})

			if !reflect.DeepEqual(old, cur) {
				for i := range min(len(old), len(cur)) {
					if !reflect.DeepEqual(old[i], cur[i]) {
						t.Fatalf("step %d differs:\n3.10: %+v\n4.x:  %+v", i, old[i], cur[i])
					}
				}
				t.Fatalf("3.10 took %d deliveries, 4.x %d", len(old), len(cur))
			}
			if !reflect.DeepEqual(old, upgraded) {
				t.Fatalf("a mid-flight upgrade changed the verdicts:\n%+v\n%+v", old, upgraded)
			}
			for _, s := range []shape{shape310, shape4x} {
				if got := runStripped(always(s)); !reflect.DeepEqual(old, got) {
					t.Fatalf("%s with x-death stripped on republish differs:\n%+v\n%+v", s, old, got)
				}
			}

			for i, s := range old {
				if s.Failed != i || s.Verdict.Attempt != i+1 {
					t.Errorf("delivery %d: Failed=%d Attempt=%d", i+1, s.Failed, s.Verdict.Attempt)
				}
				if i > 0 && !s.FirstFailure.Equal(t0) {
					t.Errorf("delivery %d: FirstFailure=%v, want %v", i+1, s.FirstFailure, t0)
				}
			}
			last := old[len(old)-1].Verdict
			if last.Action != ActionQuarantine || !contains(last.Reason, tt.wantEnd) {
				t.Errorf("last verdict = %+v, want quarantine %q", last, tt.wantEnd)
			}
			if tt.wantLen > 0 && (len(old) != tt.wantLen || last.Attempt != tt.policy.MaxAttempts) {
				t.Errorf("%d deliveries, last attempt %d; want %d, %d", len(old), last.Attempt, tt.wantLen, tt.policy.MaxAttempts)
			}

			// The shapes really differ: 3.10 kept counting, 4.x restarted.
			laneCounts := func(h table) (sum, maxEntry int64) {
				for _, d := range HistoryOf(h).Deaths {
					sum += d.Count
					maxEntry = max(maxEntry, d.Count)
				}
				return sum, maxEntry
			}
			oldSum, oldMax := laneCounts(oldH)
			curSum, curMax := laneCounts(curH)
			if int(oldSum) != len(old)-1 || curSum != 1 || curMax != 1 {
				t.Errorf("fixtures: 3.10 sum %d (want %d), 4.x sum %d max %d (want 1, 1)", oldSum, len(old)-1, curSum, curMax)
			}
			if tt.policy.Lanes == 1 && oldMax < 3 {
				t.Errorf("3.10 fixture never incremented one entry past 2: max count %d", oldMax)
			}
			t.Logf("%d deliveries; 3.10 x-death sum %d (largest entry %d), 4.x x-death sum %d; end: %s",
				len(old), oldSum, oldMax, curSum, last.Reason)
		})
	}
}

// Delays grow across tiers on both shapes, as the integration test measures.
func TestCrossVersionDelaysGrow(t *testing.T) {
	t.Parallel()

	p := Policy{Tiers: []time.Duration{time.Second, 5 * time.Second, 30 * time.Second}, Lanes: 4, Jitter: 0.2, MaxAttempts: 4}
	for _, s := range []shape{shape310, shape4x} {
		log, _ := simulate(p, ClassTransient, always(s), false, rand.New(rand.NewPCG(7, 7)), t0, 100)
		var prev time.Duration
		for i, st := range log[:len(log)-1] {
			d := st.Verdict.Delay
			lo, hi := p.Tiers[i], time.Duration(float64(p.Tiers[i])*1.2)
			if d < lo || d > hi || d <= prev {
				t.Errorf("%s retry %d: delay %s, want in [%s, %s] and > %s", s, i+1, d, lo, hi, prev)
			}
			prev = d
		}
	}
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }
