package wireval

import (
	"encoding/json"
	"math"
	"testing"
	"time"
)

type namedTable map[string]any
type namedString string
type namedInt int16

// A named table type of interface values, which amqp091-go decodes every
// table into, is read in place: x-death is read on every delivery that has
// one, twice.
// Not parallel: testing.AllocsPerRun refuses to run in a parallel test.
func TestTableSharesANamedMap(t *testing.T) {
	named := namedTable{"k": 1, "l": "two"}
	m, _ := Table(named)
	m["k"] = 2
	if named["k"] != 2 {
		t.Error("Table(named) copied the map")
	}
	if got := testing.AllocsPerRun(100, func() { _, _ = Table(named) }); got > 0 {
		t.Errorf("Table(named) made %.0f allocations", got)
	}
}

func TestReaders(t *testing.T) {
	t.Parallel()
	s := "ptr"
	var nilPtr *string
	if got, ok := String(&s); !ok || got != "ptr" {
		t.Errorf("String(&s) = %q, %v", got, ok)
	}
	for _, v := range []any{nil, nilPtr, json.Number("1"), 7, []string{"a"}} {
		if _, ok := String(v); ok {
			t.Errorf("String(%#v) ok", v)
		}
	}
	if got, _ := String([]byte("b")); got != "b" {
		t.Errorf("String([]byte) = %q", got)
	}
	if got, _ := String(namedString("n")); got != "n" {
		t.Errorf("String(named) = %q", got)
	}
	if m, ok := Table(namedTable{"k": 1}); !ok || m["k"] != 1 {
		t.Errorf("Table(named) = %v, %v", m, ok)
	}
	if m, ok := Table(map[namedString]int{"k": 1}); !ok || m["k"] != 1 {
		t.Errorf("Table(map[named]int) = %v, %v", m, ok)
	}

	if _, ok := Table(map[int]any{1: 1}); ok {
		t.Error("Table(map[int]any) ok")
	}
	if l, ok := List([]string{"a", "b"}); !ok || len(l) != 2 {
		t.Errorf("List([]string) = %v, %v", l, ok)
	}
	if _, ok := List([]byte("ab")); ok {
		t.Error("List([]byte) ok")
	}

	ints := []struct {
		v    any
		want int64
		res  IntResult
	}{
		{int8(-3), -3, IntOK}, {int32(7), 7, IntOK}, {namedInt(9), 9, IntOK},
		{uint64(math.MaxUint64), math.MaxInt64, IntOverflow},
		{float64(1e300), math.MaxInt64, IntOverflow}, {-1e300, math.MinInt64, IntOverflow},
		{2.5, 0, IntWrongType}, {math.NaN(), 0, IntWrongType}, {"3", 0, IntWrongType},
		{json.Number("12"), 12, IntOK}, {json.Number("1e3"), 1000, IntOK}, {json.Number("x"), 0, IntWrongType},
		{nil, 0, IntAbsent}, {true, 0, IntWrongType},
	}
	for _, c := range ints {
		if got, res := Int(c.v); got != c.want || res != c.res {
			t.Errorf("Int(%#v) = %d, %v; want %d, %v", c.v, got, res, c.want, c.res)
		}
	}
	if IntOrDecimal("42") != 42 || IntOrDecimal(int16(5)) != 5 || IntOrDecimal("x") != 0 || IntOrDecimal(nil) != 0 {
		t.Error("IntOrDecimal")
	}

	t0 := time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)
	times := []struct {
		v    any
		unit time.Duration
		want time.Time
		ok   bool
	}{
		{t0, 0, t0, true},
		{t0.Format(time.RFC3339Nano), 0, t0, true},
		{[]byte(t0.Format(time.RFC3339Nano)), 0, t0, true},
		{t0.UnixMilli(), 0, time.Time{}, false}, // integers only with a unit
		{t0.UnixMilli(), time.Millisecond, t0.Truncate(time.Millisecond), true},
		{t0.Unix(), time.Second, t0.Truncate(time.Second), true},
		{int64(-1), time.Second, time.Time{}, false},
		{int64(math.MaxInt64), time.Millisecond, time.Time{}, false},
		{"yesterday", 0, time.Time{}, false},
	}
	for _, c := range times {
		got, ok := Time(c.v, c.unit)
		if ok != c.ok || (ok && !got.Equal(c.want)) {
			t.Errorf("Time(%#v, %s) = %v, %v; want %v, %v", c.v, c.unit, got, ok, c.want, c.ok)
		}
	}

	if l, ok := StringList(`["a","b"]`); !ok || len(l) != 2 {
		t.Errorf("StringList = %v, %v", l, ok)
	}
	for _, v := range []any{`[1]`, `{}`, 3, nil} {
		if _, ok := StringList(v); ok {
			t.Errorf("StringList(%#v) ok", v)
		}
	}
	if TypeName(nil) != "nil" || TypeName(int32(1)) != "int32" {
		t.Error("TypeName")
	}
}

// FuzzReaders: no reader panics on any shape a producer can send.
func FuzzReaders(f *testing.F) {
	f.Add("x", int64(1), 1.5)
	f.Fuzz(func(t *testing.T, s string, n int64, x float64) {
		for _, v := range []any{s, []byte(s), n, x, json.Number(s), []any{s, n}, map[string]any{s: n}, &s} {
			String(v)
			Int(v)
			IntOrDecimal(v)
			Time(v, time.Millisecond)
			Time(v, time.Second)
			StringList(v)
			List(v)
			Table(v)
		}
	})
}
