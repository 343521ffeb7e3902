package triage

import (
	"encoding/json"
	"math"
	"testing"
	"time"

	"github.com/dlxbridge/dlxbridge/wire"
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
		first      time.Time
		notes      []string
	}{
		{name: "first delivery", headers: nil},
		{name: "first delivery with unrelated headers", headers: table{"content-type": "x"}},
		{
			name:    "after 3 retries: the signed header counts",
			headers: signed(testSigner, table{wire.HeaderAttempts: int64(3), wire.HeaderFirstFailureAt: t0.Format(time.RFC3339Nano), "x-death": []any{laneEntry(l5, int64(1), t0.Add(8*time.Second))}}),
			failed:  3, fromHeader: 3, first: t0,
		},
		{
			name:    "3.10 kept x-death counting: noted, not counted",
			headers: signed(testSigner, table{wire.HeaderAttempts: int64(3), "x-death": []any{laneEntry(l5, int64(2), t0.Add(2*time.Second)), laneEntry(l1, int64(1), t0.Add(time.Second))}}),
			failed:  3, fromHeader: 3,
			notes: []string{"x-death {orders.retry.5s.l2, expired} count 2 not counted"},
		},
		{
			name:    "header in any integer type",
			headers: signed(testSigner, table{wire.HeaderAttempts: int32(2)}),
			failed:  2, fromHeader: 2,
		},
		{
			name:    "header as json.Number",
			headers: signed(testSigner, table{wire.HeaderAttempts: json.Number("4")}),
			failed:  4, fromHeader: 4,
		},
		{
			name:    "first-failure as unix millis",
			headers: signed(testSigner, table{wire.HeaderAttempts: int64(1), wire.HeaderFirstFailureAt: t0.UnixMilli()}),
			failed:  1, fromHeader: 1, first: t0,
		},
		{
			// The wire contract's first failure is an RFC 3339 string; a
			// signature cannot vouch for an AMQP timestamp (see Sign).
			name:    "first-failure as time.Time is not vouched for",
			headers: signed(testSigner, table{wire.HeaderAttempts: int64(1), wire.HeaderFirstFailureAt: t0}),
			notes: []string{"dlxbridge-attempts=1 ignored: dlxbridge-signature cannot vouch for a signed header that is neither a string nor an integer",
				"dlxbridge-first-failure-at=2026-03-01T12:00:00Z ignored: dlxbridge-signature cannot vouch for a signed header that is neither a string nor an integer"},
		},
		{
			name:    "first-failure in the future ignored",
			headers: signed(testSigner, table{wire.HeaderAttempts: int64(1), wire.HeaderFirstFailureAt: now.Add(time.Hour).Format(time.RFC3339Nano)}),
			failed:  1, fromHeader: 1,
			notes: []string{"dlxbridge-first-failure-at 2026-03-01T13:10:00Z ignored: in the future"},
		},
		{
			name:    "first-failure within clock skew kept",
			headers: signed(testSigner, table{wire.HeaderAttempts: int64(1), wire.HeaderFirstFailureAt: now.Add(30 * time.Second).Format(time.RFC3339Nano)}),
			failed:  1, fromHeader: 1, first: now.Add(30 * time.Second),
		},
		{
			name:    "first-failure before 2000 ignored",
			headers: signed(testSigner, table{wire.HeaderAttempts: int64(1), wire.HeaderFirstFailureAt: "1970-01-01T00:00:01Z"}),
			failed:  1, fromHeader: 1,
			notes: []string{"ignored: before 2000"},
		},
		{
			name:    "first-failure garbage ignored",
			headers: signed(testSigner, table{wire.HeaderAttempts: int64(1), wire.HeaderFirstFailureAt: "yesterday"}),
			failed:  1, fromHeader: 1,
			notes: []string{"dlxbridge-first-failure-at of type string ignored: not a time"},
		},
		{
			name:    "a lane expiry without the bridge's signature counts nothing",
			headers: table{"x-death": []any{laneEntry(l1, int64(1), t0)}},
			notes:   []string{"x-death {orders.retry.1s.l0, expired} count 1 not counted"},
		},
		{
			name:    "other queues' x-death entries are not attempts",
			headers: table{"x-death": []any{table{"queue": "billing", "reason": "rejected", "count": int64(7)}, laneEntry("billing.retry.5s.l0", int64(9), t0)}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			a := CountAttempts(AttemptInput{Headers: tt.headers, Signature: verify(tt.headers), IsRetryQueue: isLane, Now: now})
			if a.Failed != tt.failed || a.FromHeader != tt.fromHeader {
				t.Errorf("Failed/FromHeader = %d/%d, want %d/%d (notes %q)", a.Failed, a.FromHeader, tt.failed, tt.fromHeader, a.Notes)
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

// Issue 7, item 7: a producer must not make a valid message lose its retry
// budget. Each forgery is published as is (or signed with another key, or
// moved from another message): the count and the time budget proceed as if
// the forged header were absent, and a note says what was ignored.
func TestCountAttemptsForgeriesAreIgnored(t *testing.T) {
	t.Parallel()

	now := t0.Add(time.Minute)
	lane := laneQueue(5*time.Second, 0)
	p := Policy{Tiers: []time.Duration{time.Second, 5 * time.Second}, Lanes: 2, Jitter: 0.2, MaxAttempts: 5, MaxElapsed: 15 * time.Minute}
	other := mustSigner("another key, 32 bytes long......")
	moved := func(sub Subject, h table) table {
		out := table{}
		for k, v := range h {
			out[k] = v
		}
		out[wire.HeaderSignature] = testSigner.Sign(sub, out, signedFields)
		return out
	}

	tests := []struct {
		name string
		h    table
		note string
	}{
		{name: "dlxbridge-attempts 999999", h: table{wire.HeaderAttempts: int64(999_999)}, note: "dlxbridge-attempts=999999 ignored: no dlxbridge-signature"},
		{name: "dlxbridge-attempts 999999 signed with another key", h: signed(other, table{wire.HeaderAttempts: int64(999_999)}), note: "dlxbridge-attempts=999999 ignored: dlxbridge-signature does not match"},
		{name: "signature moved from another queue", h: moved(Subject{Queue: "billing", MessageID: testSubject.MessageID, Body: testSubject.Body}, table{wire.HeaderAttempts: int64(4)}), note: "does not match"},
		{name: "signature moved from another message", h: moved(Subject{Queue: workQueue, MessageID: "m-2", Body: testSubject.Body}, table{wire.HeaderAttempts: int64(4)}), note: "does not match"},
		{name: "signature moved to another body", h: moved(Subject{Queue: workQueue, MessageID: testSubject.MessageID, Body: []byte(`{}`)}, table{wire.HeaderAttempts: int64(4)}), note: "does not match"},
		{name: "signed value raised afterwards", h: func() table {
			h := signed(testSigner, table{wire.HeaderAttempts: int64(1)})
			h[wire.HeaderAttempts] = int64(4)
			return h
		}(), note: "dlxbridge-attempts=4 ignored: dlxbridge-signature does not match"},
		{name: "signature garbage", h: table{wire.HeaderAttempts: int64(4), wire.HeaderSignature: "v1:!!"}, note: "dlxbridge-signature is malformed"},
		{name: "signature of another type", h: table{wire.HeaderAttempts: int64(4), wire.HeaderSignature: int64(7)}, note: "malformed"},
		{name: "x-death for a real lane with count 10^9", h: table{"x-death": []any{laneEntry(lane, int64(1_000_000_000), t0)}}, note: "x-death {orders.retry.5s.l0, expired} count 1000000000 not counted"},
		{name: "x-death for a real lane, huge count, with a signed header", h: signed(testSigner, table{"x-death": []any{laneEntry(lane, int64(1_000_000_000), t0)}}), note: "count 1000000000 not counted"},
		{name: "dlxbridge-first-failure-at 2001-01-01", h: table{wire.HeaderFirstFailureAt: "2001-01-01T00:00:00Z"}, note: `dlxbridge-first-failure-at="2001-01-01T00:00:00Z" ignored: no dlxbridge-signature`},
		{name: "x-death lane time 2001-01-01", h: table{"x-death": []any{laneEntry(lane, int64(1), time.Date(2001, 1, 1, 0, 0, 0, 0, time.UTC))}}, note: "not counted"},
		{name: "negative header", h: table{wire.HeaderAttempts: int64(-3)}, note: "dlxbridge-attempts=-3 ignored"},
		{name: "huge unsigned header", h: table{wire.HeaderAttempts: uint64(math.MaxUint64)}, note: "dlxbridge-attempts=9223372036854775807 ignored"},
		{name: "string header", h: table{wire.HeaderAttempts: "1"}, note: `dlxbridge-attempts="1" ignored`},
		{name: "table header", h: table{wire.HeaderAttempts: table{"n": int64(1)}}, note: "dlxbridge-attempts=(triage.table) ignored"},
		{name: "x-death a string", h: table{"x-death": "forged"}, note: "want an array of tables"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			a := CountAttempts(AttemptInput{Headers: tt.h, Signature: verify(tt.h), IsRetryQueue: isLane, Now: now})
			if a.Failed != 0 || !a.FirstFailure.IsZero() {
				t.Errorf("Failed = %d, FirstFailure = %v; want 0 and unknown, as if absent (notes %q)", a.Failed, a.FirstFailure, a.Notes)
			}
			if !containsNote(a.Notes, tt.note) {
				t.Errorf("notes %q lack %q", a.Notes, tt.note)
			}
			v := Decide(p, Failure{Class: ClassTransient, Attempts: a, Now: now}, fixedRand(0.5))
			if v.Action != ActionRetry || v.Attempt != 1 || v.Tier != 0 {
				t.Errorf("Decide = %s attempt %d tier %d (%s), want the first retry", v.Action, v.Attempt, v.Tier, v.Reason)
			}
		})
	}
}

// Signed values are still checked: the bridge's own header can't be read
// as more than the ceiling, and a signed but malformed value counts nothing.
func TestCountAttemptsSignedValuesAreStillValidated(t *testing.T) {
	t.Parallel()

	p := Policy{Tiers: []time.Duration{time.Second}, Lanes: 1, MaxAttempts: 5}
	tests := []struct {
		name   string
		h      table
		failed int
		action Action
		note   string
		// unsigned: the value cannot be signed, so the header does not count.
		unsigned bool
	}{
		{name: "huge", h: signed(testSigner, table{wire.HeaderAttempts: int64(math.MaxInt64)}), failed: maxAttemptsCeiling, action: ActionQuarantine, note: "clamped to 10000 (maxAttemptsCeiling)"},
		{name: "negative", h: signed(testSigner, table{wire.HeaderAttempts: int64(-3)}), failed: 0, action: ActionRetry, note: "dlxbridge-attempts=-3 ignored: negative"},
		// Neither a string nor an integer: no signature vouches for it.
		{name: "fractional", h: signed(testSigner, table{wire.HeaderAttempts: 2.5}), failed: 0, action: ActionRetry, note: "cannot vouch", unsigned: true},
		{name: "NaN", h: signed(testSigner, table{wire.HeaderAttempts: math.NaN()}), failed: 0, action: ActionRetry, note: "cannot vouch", unsigned: true},
		{name: "nil", h: signed(testSigner, table{wire.HeaderAttempts: nil}), failed: 0, action: ActionRetry, note: "cannot vouch", unsigned: true},
	}
	for _, tt := range tests {
		a := CountAttempts(AttemptInput{Headers: tt.h, Signature: verify(tt.h), Now: t0})
		if a.Signed == tt.unsigned || a.Failed != tt.failed {
			t.Errorf("%s: Signed %v Failed %d, want %v %d (notes %q)", tt.name, a.Signed, a.Failed, !tt.unsigned, tt.failed, a.Notes)
		}
		if tt.note != "" && !containsNote(a.Notes, tt.note) {
			t.Errorf("%s: notes %q lack %q", tt.name, a.Notes, tt.note)
		}
		if v := Decide(p, Failure{Class: ClassTransient, Attempts: a, Now: t0}, fixedRand(0.5)); v.Action != tt.action {
			t.Errorf("%s: Decide = %s, want %s", tt.name, v.Action, tt.action)
		}
	}
}

// A caller that never verified (zero Verification) trusts nothing.
func TestCountAttemptsUnverifiedTrustsNothing(t *testing.T) {
	t.Parallel()

	h := signed(testSigner, table{wire.HeaderAttempts: int64(2)})
	a := CountAttempts(AttemptInput{Headers: h})
	if a.Failed != 0 || a.Signed || !containsNote(a.Notes, "dlxbridge-attempts=2 ignored: no valid dlxbridge-signature") {
		t.Errorf("%+v", a)
	}
}

// fixedRand always returns u.
type fixedRand float64

func (r fixedRand) Float64() float64 { return float64(r) }
