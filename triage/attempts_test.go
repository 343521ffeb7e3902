package triage

import (
	"encoding/json"
	"math"
	"testing"
	"time"
)

func laneEntry(q string, count any, at time.Time) table {
	return table{"queue": q, "reason": "expired", "count": count, "time": at}
}

func TestCountAttempts(t *testing.T) {
	t.Parallel()

	now := t0.Add(10 * time.Minute)
	l1, l5 := laneQueue(time.Second, 0), laneQueue(5*time.Second, 2)

	tests := []struct {
		name       string
		headers    table
		failed     int
		fromHeader int
		fromXDeath int
		first      time.Time
		notes      []string
	}{
		{name: "first delivery", headers: nil},
		{name: "first delivery with unrelated headers", headers: table{"content-type": "x"}},
		{
			name:    "3.10 after 3 retries: header and kept x-death agree",
			headers: table{HeaderAttempts: int64(3), "x-death": []any{laneEntry(l5, int64(2), t0.Add(2*time.Second)), laneEntry(l1, int64(1), t0.Add(time.Second))}},
			failed:  3, fromHeader: 3, fromXDeath: 3, first: t0.Add(time.Second),
		},
		{
			name:    "4.x after 3 retries: fresh x-death, header carries the count",
			headers: table{HeaderAttempts: int64(3), HeaderFirstFailure: t0.Format(time.RFC3339Nano), "x-death": []any{laneEntry(l5, int64(1), t0.Add(8*time.Second))}},
			failed:  3, fromHeader: 3, fromXDeath: 1, first: t0,
		},
		{
			name:    "header lost on 3.10: x-death still counts",
			headers: table{"x-death": []any{laneEntry(l5, int64(4), t0)}},
			failed:  4, fromXDeath: 4, first: t0,
		},
		{
			name: "only retry-lane expirations count",
			headers: table{"x-death": []any{
				laneEntry(l5, int64(2), t0),
				table{"queue": l1, "reason": "rejected", "count": int64(7)},
				laneEntry("billing.retry.5s.l0", int64(9), t0),
				laneEntry(workQueue, int64(9), t0),
			}},
			failed: 2, fromXDeath: 2, first: t0,
		},
		{
			name:    "header in any integer type",
			headers: table{HeaderAttempts: int32(2)},
			failed:  2, fromHeader: 2,
		},
		{
			name:    "header as integral float or json.Number",
			headers: table{HeaderAttempts: json.Number("4")},
			failed:  4, fromHeader: 4,
		},
		{
			name:    "first-failure as unix millis",
			headers: table{HeaderAttempts: int64(1), HeaderFirstFailure: t0.UnixMilli()},
			failed:  1, fromHeader: 1, first: t0,
		},
		{
			name:    "first-failure as time.Time",
			headers: table{HeaderAttempts: int64(1), HeaderFirstFailure: t0},
			failed:  1, fromHeader: 1, first: t0,
		},
		{
			name:    "first-failure in the future ignored, falls back to x-death",
			headers: table{HeaderAttempts: int64(1), HeaderFirstFailure: now.Add(time.Hour).Format(time.RFC3339Nano), "x-death": []any{laneEntry(l1, int64(1), t0)}},
			failed:  1, fromHeader: 1, fromXDeath: 1, first: t0,
			notes: []string{"dlxbridge-first-failure-at 2026-03-01T13:10:00Z ignored: in the future"},
		},
		{
			name:    "first-failure within clock skew kept",
			headers: table{HeaderAttempts: int64(1), HeaderFirstFailure: now.Add(30 * time.Second).Format(time.RFC3339Nano)},
			failed:  1, fromHeader: 1, first: now.Add(30 * time.Second),
		},
		{
			name:    "first-failure before 2000 ignored",
			headers: table{HeaderAttempts: int64(1), HeaderFirstFailure: "1970-01-01T00:00:01Z"},
			failed:  1, fromHeader: 1,
			notes: []string{"ignored: before 2000"},
		},
		{
			name:    "first-failure garbage ignored",
			headers: table{HeaderAttempts: int64(1), HeaderFirstFailure: "yesterday"},
			failed:  1, fromHeader: 1,
			notes: []string{"dlxbridge-first-failure-at of type string ignored: not a time"},
		},
		{
			name:    "first-failure later than x-death: the earlier wins",
			headers: table{HeaderAttempts: int64(2), HeaderFirstFailure: t0.Add(5 * time.Minute).Format(time.RFC3339Nano), "x-death": []any{laneEntry(l1, int64(2), t0)}},
			failed:  2, fromHeader: 2, fromXDeath: 2, first: t0,
			notes: []string{"is later than x-death"},
		},
		{
			name:    "x-death time in the future ignored",
			headers: table{"x-death": []any{laneEntry(l1, int64(1), now.Add(time.Hour))}},
			failed:  1, fromXDeath: 1,
			notes: []string{"x-death time of orders.retry.1s.l0 2026-03-01T13:10:00Z ignored: in the future"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			a := CountAttempts(AttemptInput{Headers: tt.headers, IsRetryQueue: isLane, Now: now})
			if a.Failed != tt.failed || a.FromHeader != tt.fromHeader || a.FromXDeath != tt.fromXDeath {
				t.Errorf("Failed/FromHeader/FromXDeath = %d/%d/%d, want %d/%d/%d (notes %q)",
					a.Failed, a.FromHeader, a.FromXDeath, tt.failed, tt.fromHeader, tt.fromXDeath, a.Notes)
			}
			if !a.FirstFailure.Equal(tt.first) {
				t.Errorf("FirstFailure = %v, want %v (notes %q)", a.FirstFailure, tt.first, a.Notes)
			}
			for _, want := range tt.notes {
				if !containsNote(a.Notes, want) {
					t.Errorf("notes %q lack %q", a.Notes, want)
				}
			}
			if tt.notes == nil && len(a.Notes) != 0 {
				t.Errorf("unexpected notes %q", a.Notes)
			}
		})
	}
}

func TestCountAttemptsNilIsRetryQueue(t *testing.T) {
	t.Parallel()

	a := CountAttempts(AttemptInput{Headers: table{HeaderAttempts: int64(2), "x-death": []any{laneEntry("q", int64(9), t0)}}})
	if a.Failed != 2 || a.FromXDeath != 0 {
		t.Errorf("nil IsRetryQueue: %+v", a)
	}
}

// Forged values can neither buy infinite retries nor lower the count.
func TestCountAttemptsForgery(t *testing.T) {
	t.Parallel()

	now := t0.Add(time.Minute)
	lane := laneQueue(5*time.Second, 0)
	p := Policy{Tiers: []time.Duration{time.Second, 5 * time.Second}, Lanes: 2, Jitter: 0.2, MaxAttempts: 5}

	tests := []struct {
		name   string
		h      table
		failed int
		action Action
		note   string
	}{
		{name: "negative header", h: table{HeaderAttempts: int64(-3)}, failed: 0, action: ActionRetry, note: "dlxbridge-attempts=-3 ignored: negative"},
		{name: "negative header cannot hide x-death", h: table{HeaderAttempts: int64(-100), "x-death": []any{laneEntry(lane, int64(4), t0)}}, failed: 4, action: ActionQuarantine, note: "negative"},
		{name: "lower header cannot lower x-death", h: table{HeaderAttempts: int64(0), "x-death": []any{laneEntry(lane, int64(4), t0)}}, failed: 4, action: ActionQuarantine},
		{name: "forged x-death 1 cannot lower the header", h: table{HeaderAttempts: int64(4), "x-death": []any{laneEntry(lane, int64(1), t0)}}, failed: 4, action: ActionQuarantine},
		{name: "forged x-death 0 cannot lower the header", h: table{HeaderAttempts: int64(3), "x-death": []any{laneEntry(lane, int64(0), t0)}}, failed: 3, action: ActionRetry},
		{name: "forged x-death count 99", h: table{HeaderAttempts: int64(1), "x-death": []any{laneEntry(lane, int64(99), t0)}}, failed: 99, action: ActionQuarantine},
		{name: "forged x-death count huge", h: table{"x-death": []any{laneEntry(lane, int64(99_999_999), t0)}}, failed: MaxAttemptsCeiling, action: ActionQuarantine, note: "x-death retry count 99999999 clamped to 10000"},
		{name: "forged x-death negative", h: table{HeaderAttempts: int64(2), "x-death": []any{laneEntry(lane, int64(-5), t0)}}, failed: 2, action: ActionRetry, note: "count -5 negative; read as 0"},
		{name: "many forged entries saturate, then clamp", h: table{"x-death": []any{laneEntry(lane+"a", int64(MaxCount), t0), laneEntry(lane+"b", int64(MaxCount), t0), laneEntry(lane+"c", uint64(math.MaxUint64), t0)}}, failed: MaxAttemptsCeiling, action: ActionQuarantine, note: "clamped to 10000"},
		{name: "huge header", h: table{HeaderAttempts: int64(math.MaxInt64)}, failed: MaxAttemptsCeiling, action: ActionQuarantine, note: "clamped to 10000 (MaxAttemptsCeiling): the message will not be retried"},
		{name: "huge unsigned header", h: table{HeaderAttempts: uint64(math.MaxUint64)}, failed: MaxAttemptsCeiling, action: ActionQuarantine, note: "clamped"},
		{name: "string header", h: table{HeaderAttempts: "1"}, failed: 0, action: ActionRetry, note: "dlxbridge-attempts of type string ignored"},
		{name: "string header falls back to x-death", h: table{HeaderAttempts: "0", "x-death": []any{laneEntry(lane, int64(4), t0)}}, failed: 4, action: ActionQuarantine, note: "of type string ignored"},
		{name: "fractional header", h: table{HeaderAttempts: 2.5}, failed: 0, action: ActionRetry, note: "of type float64 ignored"},
		{name: "NaN header", h: table{HeaderAttempts: math.NaN()}, failed: 0, action: ActionRetry, note: "of type float64 ignored"},
		{name: "infinite header", h: table{HeaderAttempts: math.Inf(-1)}, failed: 0, action: ActionRetry, note: "ignored"},
		{name: "bool header", h: table{HeaderAttempts: true}, failed: 0, action: ActionRetry, note: "of type bool ignored"},
		{name: "table header", h: table{HeaderAttempts: table{"n": int64(1)}}, failed: 0, action: ActionRetry, note: "of type triage.table ignored"},
		{name: "nil header", h: table{HeaderAttempts: nil}, failed: 0, action: ActionRetry},
		{name: "x-death a string", h: table{HeaderAttempts: int64(2), "x-death": "forged"}, failed: 2, action: ActionRetry, note: "want an array of tables"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			a := CountAttempts(AttemptInput{Headers: tt.h, IsRetryQueue: isLane, Now: now})
			if a.Failed != tt.failed {
				t.Errorf("Failed = %d, want %d (notes %q)", a.Failed, tt.failed, a.Notes)
			}
			if tt.note != "" && !containsNote(a.Notes, tt.note) {
				t.Errorf("notes %q lack %q", a.Notes, tt.note)
			}
			v := Decide(p, Failure{Class: ClassTransient, Attempts: a, Now: now}, fixedRand(0.5))
			if v.Action != tt.action {
				t.Errorf("Decide = %s (%s), want %s", v.Action, v.Reason, tt.action)
			}
		})
	}
}

// fixedRand always returns u.
type fixedRand float64

func (r fixedRand) Float64() float64 { return float64(r) }
