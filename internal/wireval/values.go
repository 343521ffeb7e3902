// Package wireval reads header values hardened against their senders: the
// values of the headers package wire names, which come from producers and
// brokers the bridge does not control.
package wireval

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
// []interface{}, byte arrays as []byte), from JSON (float64, json.Number),
// or from a forger. The readers here normalize them without importing the
// AMQP client: named map, slice and numeric types are handled by
// reflection. None of them panics, and none allocates more than its input.

// maxDeref bounds how many pointers/interfaces are followed.
const maxDeref = 4

// Deref follows pointers and interfaces (at most four); it returns nil for a
// nil pointer.
func Deref(v any) any {
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

// Table returns v as a map[string]any if it is any map with string keys
// (map[string]any, amqp.Table, or another named map type). A map of
// interface values (amqp.Table: every table amqp091-go decodes) is v
// itself, not a copy: read it, never write to it. Other maps are copied.
func Table(v any) (map[string]any, bool) {
	v = Deref(v)
	if m, ok := v.(map[string]any); ok {
		return m, true
	}
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Map || rv.Type().Key().Kind() != reflect.String {
		return nil, false
	}
	if rv.Type().ConvertibleTo(stringAnyMap) {
		// The same underlying type: the conversion shares the map.
		return rv.Convert(stringAnyMap).Interface().(map[string]any), true
	}
	m := make(map[string]any, rv.Len())
	iter := rv.MapRange()
	for iter.Next() {
		m[iter.Key().String()] = iter.Value().Interface()
	}
	return m, true
}

var stringAnyMap = reflect.TypeFor[map[string]any]()

// List returns v as a []any if it is a slice or array other than a byte
// string.
func List(v any) ([]any, bool) {
	v = Deref(v)
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

// String returns v as a string if it is a string, a []byte (AMQP byte
// arrays; 4.x streams also return them as strings) or a named string type.
// json.Number is not a string here.
func String(v any) (string, bool) {
	v = Deref(v)
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

// Str returns header k of h as a string (see String), or "".
func Str(h map[string]any, k string) string {
	s, _ := String(h[k])
	return s
}

// StringList reads a JSON array of strings held in a string header value,
// as the bridge writes its notes, redactions and dropped lists. ok is false
// for anything else.
func StringList(v any) ([]string, bool) {
	s, ok := String(v)
	if !ok {
		return nil, false
	}
	var out []string
	if json.Unmarshal([]byte(s), &out) != nil {
		return nil, false
	}
	return out, true
}

// IntResult says how Int read a value.
type IntResult int

const (
	IntOK        IntResult = iota
	IntAbsent              // nil
	IntWrongType           // not an integer: string, bool, table, fractional or non-finite float
	IntOverflow            // an integer outside int64; the value is saturated
)

// Int reads any Go integer type (named types included), an integral float,
// or a json.Number holding an integer. Out-of-range values saturate to
// math.MinInt64/MaxInt64 and report IntOverflow.
func Int(v any) (int64, IntResult) {
	v = Deref(v)
	if v == nil {
		return 0, IntAbsent
	}
	if n, ok := v.(json.Number); ok {
		if i, err := strconv.ParseInt(string(n), 10, 64); err == nil {
			return i, IntOK
		}
		f, err := strconv.ParseFloat(string(n), 64)
		if err != nil {
			return 0, IntWrongType
		}
		return floatToInt(f)
	}
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return rv.Int(), IntOK
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		u := rv.Uint()
		if u > math.MaxInt64 {
			return math.MaxInt64, IntOverflow
		}
		return int64(u), IntOK
	case reflect.Float32, reflect.Float64:
		return floatToInt(rv.Float())
	}
	return 0, IntWrongType
}

func floatToInt(f float64) (int64, IntResult) {
	switch {
	case math.IsNaN(f) || math.IsInf(f, 0) || f != math.Trunc(f):
		return 0, IntWrongType
	case f >= math.MaxInt64:
		return math.MaxInt64, IntOverflow
	case f < math.MinInt64:
		return math.MinInt64, IntOverflow
	}
	return int64(f), IntOK
}

// IntOrDecimal reads an integer of any width (see Int, saturated) or a
// decimal string, for display; 0 for anything else.
func IntOrDecimal(v any) int64 {
	n, res := Int(v)
	if res == IntWrongType {
		if s, ok := String(v); ok {
			n, _ = strconv.ParseInt(s, 10, 64)
		}
	}
	return n
}

// maxSaneTime bounds times read from headers.
var maxSaneTime = time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC)

// Time reads a time.Time, an RFC 3339 string, or (unit > 0) an integer
// number of unix units: time.Second for AMQP timestamps, time.Millisecond
// for the bridge's first-failure header. ok is false for anything else or a
// value after year 9999.
func Time(v any, unit time.Duration) (time.Time, bool) {
	v = Deref(v)
	if t, ok := v.(time.Time); ok {
		return t.UTC(), t.Year() >= 0 && !t.After(maxSaneTime)
	}
	if s, ok := String(v); ok {
		t, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			return time.Time{}, false
		}
		return t.UTC(), !t.After(maxSaneTime)
	}
	if unit <= 0 {
		return time.Time{}, false
	}
	n, res := Int(v)
	if res != IntOK {
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

// TypeName describes v for notes without printing a forger's payload.
func TypeName(v any) string {
	if v == nil {
		return "nil"
	}
	return fmt.Sprintf("%T", v)
}
