package quarantine

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"time"
	"unicode/utf8"

	amqp "github.com/rabbitmq/amqp091-go"
)

// A stream drops header values that are arrays or tables over AMQP 0-9-1
// (3.10.8 also drops x-death; 4.0.5 turns a byte array into a string), so a
// record keeps its original header table in a typed encoding of its own:
// JSON in which every value is a two-element array [tag, payload]. The tag
// keeps the AMQP field type, so int widths, byte arrays, decimals,
// timestamps and nested tables and arrays come back exactly as received.
//
//	"str" string          "bytes" base64        "bool" true|false
//	"u8" "i8" "i16" "i32" "i64" JSON number     "f32" "f64" decimal string (NaN, +Inf, -Inf too)
//	"dec" [scale, value]  "time" RFC 3339 UTC   "arr" [values...]   "tab" {name: value}   "nil" null
//
// marshalTable and unmarshalTable are exact inverses for every value amqp091-go
// reads off the wire (an int, which it writes as a 32-bit field, comes back
// as int32), but a string that is not valid UTF-8, which JSON cannot hold:
// it is kept as "bytes" and comes back a byte array of the same bytes. A
// header name that is not valid UTF-8 is not kept exactly.

// errCodec: a typed header encoding that cannot be decoded.
var errCodec = errors.New("quarantine: bad typed header encoding")

// maxCodecDepth bounds nesting, as a producer's table could be deep.
const maxCodecDepth = 64

// marshalTable returns the typed encoding of t.
func marshalTable(t amqp.Table) ([]byte, error) {
	v, err := encodeTable(t, 0)
	if err != nil {
		return nil, err
	}
	return json.Marshal(v)
}

func encodeTable(t amqp.Table, depth int) (map[string]any, error) {
	out := make(map[string]any, len(t))
	for k, v := range t {
		e, err := encodeValue(v, depth+1)
		if err != nil {
			return nil, fmt.Errorf("header %q: %w", k, err)
		}
		out[k] = e
	}
	return out, nil
}

func encodeValue(v any, depth int) ([]any, error) {
	if depth > maxCodecDepth {
		return nil, fmt.Errorf("%w: nested deeper than %d", errCodec, maxCodecDepth)
	}
	switch x := v.(type) {
	case nil:
		return []any{"nil", nil}, nil
	case string:
		if !utf8.ValidString(x) {
			// JSON would turn the bytes into U+FFFD. As a byte array they
			// come back byte for byte (the envelope signature reads both
			// alike), and readers of every version decode it.
			return []any{"bytes", base64.StdEncoding.EncodeToString([]byte(x))}, nil
		}
		return []any{"str", x}, nil
	case []byte:
		return []any{"bytes", base64.StdEncoding.EncodeToString(x)}, nil
	case bool:
		return []any{"bool", x}, nil
	case uint8:
		return []any{"u8", x}, nil
	case int8:
		return []any{"i8", x}, nil
	case int16:
		return []any{"i16", x}, nil
	case int:
		return []any{"i32", int32(x)}, nil
	case int32:
		return []any{"i32", x}, nil
	case int64:
		return []any{"i64", x}, nil
	case float32:
		return []any{"f32", strconv.FormatFloat(float64(x), 'g', -1, 32)}, nil
	case float64:
		return []any{"f64", strconv.FormatFloat(x, 'g', -1, 64)}, nil
	case amqp.Decimal:
		return []any{"dec", []any{x.Scale, x.Value}}, nil
	case time.Time:
		return []any{"time", x.UTC().Format(time.RFC3339Nano)}, nil
	case []any:
		arr := make([]any, len(x))
		for i, e := range x {
			ev, err := encodeValue(e, depth+1)
			if err != nil {
				return nil, err
			}
			arr[i] = ev
		}
		return []any{"arr", arr}, nil
	case amqp.Table:
		t, err := encodeTable(x, depth)
		if err != nil {
			return nil, err
		}
		return []any{"tab", t}, nil
	case map[string]any:
		return encodeValue(amqp.Table(x), depth)
	}
	return nil, fmt.Errorf("%w: unsupported value type %T", errCodec, v)
}

// unmarshalTable reads a typed encoding back into a table. It never panics on
// bad input; it returns an error wrapping errCodec. The JSON is parsed once
// and then walked (readers decode every record of a stream).
func unmarshalTable(b []byte) (amqp.Table, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var raw map[string]any
	if err := dec.Decode(&raw); err != nil || raw == nil {
		return nil, fmt.Errorf("%w: want an object", errCodec)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("%w: trailing data", errCodec)
	}
	return decodeTable(raw, 0)
}

func decodeTable(raw map[string]any, depth int) (amqp.Table, error) {
	t := make(amqp.Table, len(raw))
	for k, r := range raw {
		v, err := decodeValue(r, depth+1)
		if err != nil {
			return nil, fmt.Errorf("header %q: %w", k, err)
		}
		t[k] = v
	}
	return t, nil
}

func decodeValue(r any, depth int) (any, error) {
	if depth > maxCodecDepth {
		return nil, fmt.Errorf("%w: nested deeper than %d", errCodec, maxCodecDepth)
	}
	pair, ok := r.([]any)
	if !ok || len(pair) != 2 {
		return nil, fmt.Errorf("%w: want [tag, value]", errCodec)
	}
	tag, ok := pair[0].(string)
	if !ok {
		return nil, fmt.Errorf("%w: tag is not a string", errCodec)
	}
	p := pair[1]
	bad := func(what string) error { return fmt.Errorf("%w: %s: want %s", errCodec, tag, what) }
	switch tag {
	case "nil":
		if p != nil {
			return nil, bad("null")
		}
		return nil, nil
	case "str":
		s, ok := p.(string)
		if !ok {
			return nil, bad("a string")
		}
		return s, nil
	case "bytes":
		s, ok := p.(string)
		if !ok {
			return nil, bad("base64")
		}
		b, err := base64.StdEncoding.DecodeString(s)
		if err != nil {
			return nil, bad("base64")
		}
		return b, nil
	case "bool":
		x, ok := p.(bool)
		if !ok {
			return nil, bad("true or false")
		}
		return x, nil
	case "u8", "i8", "i16", "i32", "i64":
		return decodeInt(tag, p)
	case "f32", "f64":
		s, ok := p.(string)
		if !ok {
			return nil, bad("a decimal string")
		}
		bits := 64
		if tag == "f32" {
			bits = 32
		}
		f, err := strconv.ParseFloat(s, bits)
		if err != nil && !math.IsInf(f, 0) {
			return nil, bad("a decimal string")
		}
		if bits == 32 {
			return float32(f), nil
		}
		return f, nil
	case "dec":
		sv, ok := p.([]any)
		if !ok || len(sv) != 2 {
			return nil, bad("[scale, value]")
		}
		scale, err := decodeInt("u8", sv[0])
		if err != nil {
			return nil, err
		}
		value, err := decodeInt("i32", sv[1])
		if err != nil {
			return nil, err
		}
		return amqp.Decimal{Scale: scale.(uint8), Value: value.(int32)}, nil
	case "time":
		s, ok := p.(string)
		if !ok {
			return nil, bad("an RFC 3339 time")
		}
		t, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			return nil, bad("an RFC 3339 time")
		}
		return t, nil
	case "arr":
		items, ok := p.([]any)
		if !ok {
			return nil, bad("an array")
		}
		arr := make([]any, len(items))
		for i, it := range items {
			v, err := decodeValue(it, depth+1)
			if err != nil {
				return nil, err
			}
			arr[i] = v
		}
		return arr, nil
	case "tab":
		raw, ok := p.(map[string]any)
		if !ok {
			return nil, bad("an object")
		}
		return decodeTable(raw, depth)
	}
	return nil, fmt.Errorf("%w: unknown tag %q", errCodec, tag)
}

func decodeInt(tag string, p any) (any, error) {
	n, ok := p.(json.Number)
	if !ok {
		return nil, fmt.Errorf("%w: %s: want a number", errCodec, tag)
	}
	bits := map[string]int{"u8": 8, "i8": 8, "i16": 16, "i32": 32, "i64": 64}[tag]
	if tag == "u8" {
		u, err := strconv.ParseUint(n.String(), 10, bits)
		if err != nil {
			return nil, fmt.Errorf("%w: %s: %v", errCodec, tag, err)
		}
		return uint8(u), nil
	}
	i, err := strconv.ParseInt(n.String(), 10, bits)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", errCodec, tag, err)
	}
	switch tag {
	case "i8":
		return int8(i), nil
	case "i16":
		return int16(i), nil
	case "i32":
		return int32(i), nil
	}
	return i, nil
}
