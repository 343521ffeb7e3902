package quarantine

import (
	"errors"
	"math"
	"reflect"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// everyType holds one value of every type amqp091-go reads off the wire,
// nested in arrays and tables the way x-death is.
func everyType() amqp.Table {
	return amqp.Table{
		"s": "text", "empty": "", "bytes": []byte{0, 1, 0xff}, "nobytes": []byte{},
		"t": true, "f": false, "u8": uint8(255), "i8": int8(-128), "i16": int16(-32768),
		"i32": int32(math.MinInt32), "i64": int64(math.MaxInt64),
		"f32": float32(1.5), "f64": 0.1, "nan": math.NaN(), "inf": math.Inf(-1), "f32nan": float32(math.NaN()),
		"dec": amqp.Decimal{Scale: 2, Value: -12345}, "ts": time.Unix(1700000000, 0), "nil": nil,
		"x-death": []any{amqp.Table{"count": int64(3), "reason": "rejected", "queue": "q",
			"time": time.Unix(1700000001, 0), "routing-keys": []any{"a", "b"}}},
		"nested":      amqp.Table{"deeper": amqp.Table{"arr": []any{int16(1), []any{}, amqp.Table{}}}},
		"ünïcode key": "värde",
	}
}

func TestCodecRoundTripKeepsEveryType(t *testing.T) {
	t.Parallel()
	in := everyType()
	b, err := marshalTable(in)
	if err != nil {
		t.Fatal(err)
	}
	out, err := unmarshalTable(b)
	if err != nil {
		t.Fatal(err)
	}
	if !sameValue(in, out) {
		t.Fatalf("round trip changed the table:\n in %#v\nout %#v", in, out)
	}
	// An int, which amqp091-go writes as a 32-bit field, reads back as one.
	b, _ = marshalTable(amqp.Table{"n": 7})
	out, _ = unmarshalTable(b)
	if v, ok := out["n"].(int32); !ok || v != 7 {
		t.Fatalf("int: got %#v", out["n"])
	}
}

func TestCodecRefusesBadInput(t *testing.T) {
	t.Parallel()
	for _, s := range []string{
		``, `[]`, `{"a":1}`, `{"a":["u8",256]}`, `{"a":["i8",1.5]}`, `{"a":["zz",1]}`, `{"a":["bytes","%%"]}`,
		`{"a":["dec",[1]]}`, `{"a":["time","yesterday"]}`, `{"a":["tab",null]}`, `{"a":["nil",1]}`, `{} {}`,
	} {
		if _, err := unmarshalTable([]byte(s)); !errors.Is(err, errCodec) {
			t.Errorf("%q: err %v, want errCodec", s, err)
		}
	}
	if _, err := marshalTable(amqp.Table{"c": complex(1, 2)}); !errors.Is(err, errCodec) {
		t.Errorf("complex: err %v", err)
	}
	deep := amqp.Table{}
	cur := deep
	for range maxCodecDepth + 2 {
		next := amqp.Table{}
		cur["d"] = next
		cur = next
	}
	if _, err := marshalTable(deep); !errors.Is(err, errCodec) {
		t.Errorf("deep: err %v", err)
	}
}

// FuzzDecodeTable: decoding never panics, and whatever decodes re-encodes
// to something that decodes to the same table.
func FuzzDecodeTable(f *testing.F) {
	seed, _ := marshalTable(everyType())
	f.Add(seed)
	f.Add([]byte(`{"a":["arr",[["f32","NaN"],["dec",[255,-1]]]]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		tab, err := unmarshalTable(b)
		if err != nil {
			return
		}
		again, err := marshalTable(tab)
		if err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		back, err := unmarshalTable(again)
		if err != nil {
			t.Fatalf("decode re-encoded: %v", err)
		}
		if !sameValue(tab, back) {
			t.Fatalf("not stable:\n%#v\n%#v", tab, back)
		}
	})
}

// sameValue is reflect.DeepEqual that compares times by instant and floats
// by bits (NaN is a value a header can carry).
func sameValue(a, b any) bool {
	switch x := a.(type) {
	case time.Time:
		y, ok := b.(time.Time)
		return ok && x.Equal(y)
	case float64:
		y, ok := b.(float64)
		return ok && math.Float64bits(x) == math.Float64bits(y)
	case float32:
		y, ok := b.(float32)
		return ok && (math.Float32bits(x) == math.Float32bits(y) || (x != x && y != y))
	case amqp.Table:
		y, ok := b.(amqp.Table)
		if !ok || len(x) != len(y) {
			return false
		}
		for k, v := range x {
			w, ok := y[k]
			if !ok || !sameValue(v, w) {
				return false
			}
		}
		return true
	case []any:
		y, ok := b.([]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for i := range x {
			if !sameValue(x[i], y[i]) {
				return false
			}
		}
		return true
	}
	return reflect.DeepEqual(a, b)
}
