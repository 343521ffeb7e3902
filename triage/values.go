package triage

import (
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"strconv"
	"time"
)

// Header values arrive from the wire (amqp091-go decodes integers as int8,
// int16, int32 or int64, tables as the named map type amqp.Table, arrays as
// []interface{}), from JSON (float64, json.Number), or from a forger. The
// helpers here normalize them without importing the AMQP client: named map,
// slice and numeric types are handled by reflection. None of them panics.

// maxDeref bounds how many pointers/interfaces are followed.
const maxDeref = 4

// deref follows pointers and interfaces; it returns nil for a nil pointer.
func deref(v any) any {
	for range maxDeref {
		rv := reflect.ValueOf(v)
		switch rv.Kind() {
		case reflect.Pointer, reflect.Interface:
			if rv.IsNil() {
				return nil
			}
			v = rv.Elem().Interface()
		default:
			return v
		}
	}
	return v
}

// asTable returns v as a map[string]any if it is any map with string keys
// (map[string]any, amqp.Table, or another named map type).
func asTable(v any) (map[string]any, bool) {
	v = deref(v)
	if m, ok := v.(map[string]any); ok {
		return m, true
	}
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Map || rv.Type().Key().Kind() != reflect.String {
		return nil, false
	}
	m := make(map[string]any, rv.Len())
	iter := rv.MapRange()
	for iter.Next() {
		m[iter.Key().String()] = iter.Value().Interface()
	}
	return m, true
}

// asList returns v as a []any if it is a slice or array other than a byte
// string.
func asList(v any) ([]any, bool) {
	v = deref(v)
	switch s := v.(type) {
	case []any:
		return s, true
	case []byte, string:
		return nil, false
	}
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Slice && rv.Kind() != reflect.Array {
		return nil, false
	}
	out := make([]any, rv.Len())
	for i := range out {
		out[i] = rv.Index(i).Interface()
	}
	return out, true
}

// asString returns v as a string if it is a string, a []byte (AMQP byte
// arrays) or a named string type. json.Number is not a string here.
func asString(v any) (string, bool) {
	v = deref(v)
	switch s := v.(type) {
	case string:
		return s, true
	case []byte:
		return string(s), true
	case json.Number:
		return "", false
	}
	rv := reflect.ValueOf(v)
	if rv.Kind() == reflect.String {
		return rv.String(), true
	}
	return "", false
}

// intResult says how asInt read a value.
type intResult int

const (
	intOK        intResult = iota
	intAbsent              // nil
	intWrongType           // not an integer: string, bool, table, fractional or non-finite float
	intOverflow            // an integer outside int64; n holds the saturated value
)

// asInt reads any Go integer type (named types included), an integral
// float, or a json.Number holding an integer. Out-of-range values saturate
// to math.MinInt64/MaxInt64 and report intOverflow.
func asInt(v any) (int64, intResult) {
	v = deref(v)
	if v == nil {
		return 0, intAbsent
	}
	if n, ok := v.(json.Number); ok {
		if i, err := strconv.ParseInt(string(n), 10, 64); err == nil {
			return i, intOK
		}
		f, err := strconv.ParseFloat(string(n), 64)
		if err != nil {
			return 0, intWrongType
		}
		return floatToInt(f)
	}
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return rv.Int(), intOK
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		u := rv.Uint()
		if u > math.MaxInt64 {
			return math.MaxInt64, intOverflow
		}
		return int64(u), intOK
	case reflect.Float32, reflect.Float64:
		return floatToInt(rv.Float())
	}
	return 0, intWrongType
}

func floatToInt(f float64) (int64, intResult) {
	switch {
	case math.IsNaN(f) || math.IsInf(f, 0) || f != math.Trunc(f):
		return 0, intWrongType
	case f >= math.MaxInt64:
		return math.MaxInt64, intOverflow
	case f < math.MinInt64:
		return math.MinInt64, intOverflow
	}
	return int64(f), intOK
}

// Sane time window for broker and header timestamps.
var (
	minSaneTime = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)
	maxSaneTime = time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC)
)

// asTime reads a time.Time, an integer number of unix units (unit is
// time.Second for AMQP timestamps, time.Millisecond for the bridge's
// header), or an RFC 3339 string. ok is false for anything else or a value
// outside year 0..9999.
func asTime(v any, unit time.Duration) (time.Time, bool) {
	v = deref(v)
	if t, ok := v.(time.Time); ok {
		return t.UTC(), t.Year() >= 0 && !t.After(maxSaneTime)
	}
	if s, ok := asString(v); ok {
		t, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			return time.Time{}, false
		}
		return t.UTC(), !t.After(maxSaneTime)
	}
	n, res := asInt(v)
	if res != intOK {
		return time.Time{}, false
	}
	maxUnits := maxSaneTime.Unix() * int64(time.Second/unit)
	if n < 0 || n > maxUnits {
		return time.Time{}, false
	}
	switch unit {
	case time.Millisecond:
		return time.UnixMilli(n).UTC(), true
	default:
		return time.Unix(n, 0).UTC(), true
	}
}

// typeName describes v for notes without printing a forger's payload.
func typeName(v any) string {
	if v == nil {
		return "nil"
	}
	return fmt.Sprintf("%T", v)
}

// shortValue shows a (possibly forged) scalar for notes, bounded: strings
// truncated, integers and times as such, anything else by its type.
func shortValue(v any) string {
	if s, ok := asString(v); ok {
		return fmt.Sprintf("%q", short(s))
	}
	if n, res := asInt(v); res == intOK || res == intOverflow {
		return fmt.Sprint(n)
	}
	if t, ok := deref(v).(time.Time); ok {
		return t.UTC().Format(time.RFC3339)
	}
	return "(" + typeName(v) + ")"
}

// notes collects bounded diagnostics: a hostile header must not make the
// notes themselves unbounded.
type notes struct {
	list    []string
	dropped int
}

const maxNotes = 32

func (n *notes) add(format string, args ...any) {
	if len(n.list) >= maxNotes {
		n.dropped++
		return
	}
	n.list = append(n.list, fmt.Sprintf(format, args...))
}

func (n *notes) result() []string {
	if n.dropped > 0 {
		return append(n.list, fmt.Sprintf("%d more notes omitted", n.dropped))
	}
	return n.list
}
