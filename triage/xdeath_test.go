package triage

import (
	"encoding/json"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

type myInt int32
type myList []table

func TestParseXDeath(t *testing.T) {
	t.Parallel()

	lane5 := "orders.retry.5s.l2"
	lane1 := "orders.retry.1s.l0"
	entry := func(q, reason string, count any) table {
		return table{"queue": q, "reason": reason, "count": count, "time": t0,
			"exchange": "orders.retry", "routing-keys": []any{q}}
	}
	death := func(q, reason string, count int64) Death {
		return Death{Queue: q, Reason: reason, Count: count, Time: t0,
			Exchange: "orders.retry", RoutingKeys: []string{q}}
	}
	cyclic := map[string]any{}
	cyclic["self"] = cyclic
	var loop any
	loop = &loop

	tests := []struct {
		name   string
		in     any
		want   []Death // nil: only check counts below
		counts []int64
		notes  []string // substrings, in order of appearance not required
	}{
		{name: "nil", in: nil, want: []Death{}},
		{
			name: "3.10 shape after three retries on the same lane",
			in: []any{
				entry(lane5, "expired", int64(3)),
				entry(lane1, "expired", int64(1)),
			},
			want: []Death{death(lane5, "expired", 3), death(lane1, "expired", 1)},
		},
		{
			name: "4.x shape: fresh entry every hop",
			in:   []any{entry(lane5, "expired", int64(1))},
			want: []Death{death(lane5, "expired", 1)},
		},
		{
			name:   "plain map[string]any entries",
			in:     []any{map[string]any{"queue": "q", "reason": "rejected", "count": int64(2)}},
			counts: []int64{2},
		},
		{
			name:   "named slice of named maps",
			in:     myList{{"queue": "q", "reason": "expired", "count": int32(4)}},
			counts: []int64{4},
		},
		{
			name:   "pointer to an array",
			in:     &[]any{table{"queue": "q", "reason": "expired", "count": int64(1)}},
			counts: []int64{1},
		},
		{
			name: "mixed integer types",
			in: []any{
				table{"queue": "a", "reason": "expired", "count": int8(1)},
				table{"queue": "b", "reason": "expired", "count": int16(2)},
				table{"queue": "c", "reason": "expired", "count": int32(3)},
				table{"queue": "d", "reason": "expired", "count": uint8(4)},
				table{"queue": "e", "reason": "expired", "count": uint32(5)},
				table{"queue": "f", "reason": "expired", "count": uint64(6)},
				table{"queue": "g", "reason": "expired", "count": float64(7)},
				table{"queue": "h", "reason": "expired", "count": float32(8)},
				table{"queue": "i", "reason": "expired", "count": json.Number("9")},
				table{"queue": "j", "reason": "expired", "count": myInt(10)},
				table{"queue": "k", "reason": "expired", "count": 11},
			},
			counts: []int64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11},
		},
		{
			name: "byte-string queue and reason",
			in:   []any{table{"queue": []byte("q"), "reason": []byte("maxlen"), "count": int64(1)}},
			want: []Death{{Queue: "q", Reason: "maxlen", Count: 1}},
		},
		{
			name: "times as time.Time, unix seconds, RFC 3339 and garbage",
			in: []any{
				table{"queue": "a", "reason": "expired", "count": int64(1), "time": t0},
				table{"queue": "b", "reason": "expired", "count": int64(1), "time": t0.Unix()},
				table{"queue": "c", "reason": "expired", "count": int64(1), "time": t0.Format(time.RFC3339)},
				table{"queue": "d", "reason": "expired", "count": int64(1), "time": true},
				table{"queue": "e", "reason": "expired", "count": int64(1), "time": int64(-5)},
			},
			want: []Death{
				{Queue: "a", Reason: "expired", Count: 1, Time: t0},
				{Queue: "b", Reason: "expired", Count: 1, Time: t0},
				{Queue: "c", Reason: "expired", Count: 1, Time: t0},
				{Queue: "d", Reason: "expired", Count: 1},
				{Queue: "e", Reason: "expired", Count: 1},
			},
			notes: []string{"x-death[3] {d, expired}: time is malformed (bool)", "x-death[4] {e, expired}: time is malformed (int64)"},
		},
		{
			name: "odd counts",
			in: []any{
				table{"queue": "missing", "reason": "expired"},
				table{"queue": "string", "reason": "expired", "count": "7"},
				table{"queue": "negative", "reason": "expired", "count": int64(-3)},
				table{"queue": "huge", "reason": "expired", "count": int64(99_999_999_999)},
				table{"queue": "uint-max", "reason": "expired", "count": uint64(math.MaxUint64)},
				table{"queue": "fraction", "reason": "expired", "count": 1.5},
				table{"queue": "nan", "reason": "expired", "count": math.NaN()},
				table{"queue": "bool", "reason": "expired", "count": true},
				table{"queue": "table", "reason": "expired", "count": table{"n": 1}},
			},
			counts: []int64{1, 1, 0, maxCount, maxCount, 1, 1, 1, 1},
			notes: []string{
				"{missing, expired}: count missing; read as 1",
				"{string, expired}: count is string, not an integer; read as 1",
				"{negative, expired}: count -3 negative; read as 0",
				"{huge, expired}: count 99999999999 clamped to 2147483647",
				"{uint-max, expired}: count 9223372036854775807 clamped",
			},
		},
		{
			name: "malformed entries are skipped",
			in: []any{
				"not a table",
				nil,
				42,
				table{"reason": "expired", "count": int64(1)},
				table{"queue": "q", "count": int64(1)},
				table{"queue": 17, "reason": "expired"},
				map[int]any{1: "x"},
				table{"queue": "ok", "reason": "expired", "count": int64(2)},
			},
			counts: []int64{2},
			notes: []string{
				"x-death[0]: want a table, got string; skipped",
				"x-death[1]: want a table, got nil; skipped",
				"x-death[2]: want a table, got int; skipped",
				"x-death[3]: missing queue or reason; skipped",
				"x-death[6]: want a table, got map[int]interface {}; skipped",
			},
		},
		{
			name:  "a string instead of an array",
			in:    "x-death",
			want:  []Death{},
			notes: []string{"want an array of tables, got string"},
		},
		{
			name:  "bytes instead of an array",
			in:    []byte("x-death"),
			want:  []Death{},
			notes: []string{"want an array of tables, got []uint8"},
		},
		{
			name:   "a single table instead of an array",
			in:     table{"queue": "q", "reason": "expired", "count": int64(2)},
			counts: []int64{2},
			notes:  []string{"a single table instead of an array"},
		},
		{
			name:   "duplicate {queue, reason}",
			in:     []any{entry("q", "expired", int64(5)), entry("q", "expired", int64(1))},
			counts: []int64{5, 1},
			notes:  []string{"x-death[1]: duplicate entry for {q, expired}"},
		},
		{
			name: "deeply weird values",
			in: []any{
				cyclic,
				loop,
				[]any{[]any{table{"queue": "nested"}}},
				func() {},
				make(chan int),
				table{"queue": "q", "reason": "expired", "count": int64(1), "routing-keys": "not-a-list"},
				table{"queue": "r", "reason": "expired", "count": int64(1), "routing-keys": []any{1, "k", nil}},
			},
			counts: []int64{1, 1},
		},
		{name: "a channel", in: make(chan int), want: []Death{}, notes: []string{"got chan int"}},
		{name: "a pointer loop", in: loop, want: []Death{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := ParseXDeath(tt.in)
			if tt.want != nil {
				if len(tt.want) == 0 && len(h.Deaths) == 0 {
					// equal
				} else if !reflect.DeepEqual(h.Deaths, tt.want) {
					t.Errorf("Deaths =\n%+v\nwant\n%+v", h.Deaths, tt.want)
				}
			}
			if tt.counts != nil {
				var got []int64
				for _, d := range h.Deaths {
					got = append(got, d.Count)
				}
				if !reflect.DeepEqual(got, tt.counts) {
					t.Errorf("counts = %v, want %v", got, tt.counts)
				}
			}
			for _, want := range tt.notes {
				if !containsNote(h.Notes, want) {
					t.Errorf("notes %q lack %q", h.Notes, want)
				}
			}
			if tt.notes == nil && tt.name == "nil" && len(h.Notes) != 0 {
				t.Errorf("nil x-death produced notes %q", h.Notes)
			}
		})
	}
}

func containsNote(notes []string, sub string) bool {
	for _, n := range notes {
		if strings.Contains(n, sub) {
			return true
		}
	}
	return false
}

func TestParseXDeathBounds(t *testing.T) {
	t.Parallel()

	many := make([]any, 5000)
	for i := range many {
		many[i] = "junk"
	}
	h := ParseXDeath(many)
	if len(h.Notes) > maxNotes+1 {
		t.Errorf("%d notes, want at most %d", len(h.Notes), maxNotes+1)
	}
	if !containsNote(h.Notes, "5000 entries, only the first 256 read") || !containsNote(h.Notes, "more notes omitted") {
		t.Errorf("notes = %q", h.Notes)
	}

	long := strings.Repeat("q", 10_000)
	h = ParseXDeath([]any{table{"queue": long, "reason": "expired", "count": int64(-1)}})
	for _, n := range h.Notes {
		if len(n) > 200 {
			t.Errorf("note of %d bytes echoes the forged queue name", len(n))
		}
	}
}

func TestHistoryLookups(t *testing.T) {
	t.Parallel()

	h := ParseXDeath([]any{
		table{"queue": "orders", "reason": "delivery_limit", "count": int64(1), "time": t0.Add(time.Hour)},
		table{"queue": "orders.retry.5s.l0", "reason": "expired", "count": int64(3), "time": t0.Add(time.Minute)},
		table{"queue": "orders.retry.1s.l1", "reason": "expired", "count": int64(1), "time": t0},
		table{"queue": "orders", "reason": "rejected", "count": int64(maxCount)},
		table{"queue": "other", "reason": "rejected", "count": int64(maxCount)},
	})

	if d, ok := h.Find("orders.retry.5s.l0", "expired"); !ok || d.Count != 3 {
		t.Errorf("Find lane = %+v, %v", d, ok)
	}
	if _, ok := h.Find("orders.retry.5s.l0", "rejected"); ok {
		t.Error("Find matched on queue alone")
	}
	if _, ok := h.Find("orders", "expired"); ok {
		t.Error("Find matched on reason alone")
	}
	if got := h.CountWhere(func(d Death) bool { return d.Reason == "expired" && isLane(d.Queue) }); got != 4 {
		t.Errorf("lane count = %d, want 4", got)
	}
	if got := h.CountWhere(nil); got != 4+1+2*maxCount {
		t.Errorf("CountWhere(nil) = %d", got)
	}
	sat := History{Deaths: []Death{{Count: math.MaxInt64}, {Count: math.MaxInt64}}}
	if got := sat.CountWhere(nil); got != math.MaxInt64 {
		t.Errorf("CountWhere does not saturate: %d", got)
	}
	if got, ok := h.Earliest(); !ok || !got.Equal(t0) {
		t.Errorf("Earliest = %v, %v", got, ok)
	}
	if _, ok := (History{}).Earliest(); ok {
		t.Error("Earliest of empty history reported a time")
	}
}
