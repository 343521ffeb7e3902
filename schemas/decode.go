package schemas

import (
	"encoding/json"

	"strconv"
	"strings"

	"github.com/dlxbridge/dlxbridge/internal/jsonscan"
)

// maxDepth is the deepest nesting of arrays and objects accepted: nesting
// drives recursion in the validator. A number literal may have at most 128
// bytes and an exponent of at most ±1000 (math/big's work in the validator).
const maxDepth = 64

// decodeError is why a body is not acceptable JSON: the scanner's error or a
// duplicate key, and rpath, the location of the problem, innermost segment
// last once reversed (built only when an error happens, so the happy path
// pays nothing for it).
type decodeError struct {
	jsonscan.Problem
	rpath []string // reversed JSON pointer segments, already escaped
}

func (e *decodeError) pointer() string {
	var b strings.Builder
	for i := len(e.rpath) - 1; i >= 0; i-- {
		b.WriteByte('/')
		b.WriteString(e.rpath[i])
	}
	return b.String()
}

func (e *decodeError) Error() string {
	if p := e.pointer(); p != "" {
		return e.Msg + " at " + p
	}
	return e.Problem.Error()
}

// decodeJSON decodes data in one pass into the values encoding/json produces
// with UseNumber (map[string]any, []any, string, json.Number, bool, nil),
// and rejects what encoding/json lets through silently: invalid UTF-8 and
// unpaired surrogate escapes (it would substitute U+FFFD), duplicate object
// keys (it would keep the last), nesting deeper than maxDepth, and number
// literals beyond maxNumberLen or maxExponent.
//
// Strings without escapes and numbers are substrings of one copy of data
// made up front: one allocation for all of them instead of one each. They
// keep that copy (the size of the body) alive as long as any is referenced.
func decodeJSON(data []byte) (any, *decodeError) {
	d := decoder{sc: jsonscan.Strict(data, maxDepth), src: string(data)}
	d.frames = make([]frame, 0, 8)
	return d.decode()
}

// decodeJSONMember is decodeJSON that also returns the text of the member
// key of the top-level object (an envelope's "data"), a subslice of data;
// nil if there is none.
func decodeJSONMember(data []byte, key string) (any, []byte, *decodeError) {
	d := decoder{sc: jsonscan.Strict(data, maxDepth), src: string(data), member: key}
	d.frames = make([]frame, 0, 8)
	v, err := d.decode()
	if err != nil {
		return nil, nil, err
	}
	return v, d.memberText, nil
}

// decoder builds values from the scanner's tokens, with an explicit stack of
// the arrays and objects being built.
type decoder struct {
	sc     jsonscan.Scanner
	src    string // string(data): unescaped strings and numbers slice it
	frames []frame
	elems  []any // array elements being decoded, innermost array last

	member     string // decodeJSONMember's key
	valueAt    int    // where the top-level object's current member value starts
	memberText []byte // the member's value
}

// frame is an array or object being decoded.
type frame struct {
	m      map[string]any // nil for an array
	base   int            // an array's first element on decoder.elems
	key    string         // the member being decoded
	keyAt  int
	hasKey bool
}

func (d *decoder) decode() (any, *decodeError) {
	for {
		t, err := d.sc.Next()
		if err != nil {
			return nil, d.fail(err)
		}
		if d.member != "" && len(d.frames) == 1 {
			d.valueAt = t.Start // a member value's first token, or its key
		}
		var v any
		switch t.Kind {
		case jsonscan.BeginObject:
			d.frames = append(d.frames, frame{m: make(map[string]any)})
			continue
		case jsonscan.BeginArray:
			if d.elems == nil {
				d.elems = make([]any, 0, 16)
			}
			d.frames = append(d.frames, frame{base: len(d.elems)})
			continue
		case jsonscan.Key:
			f := &d.frames[len(d.frames)-1]
			f.key, f.keyAt, f.hasKey = d.text(t), t.Start, true
			continue
		case jsonscan.EndObject:
			v = d.frames[len(d.frames)-1].m
			d.frames = d.frames[:len(d.frames)-1]
		case jsonscan.EndArray:
			// Elements are copied once into a slice of the exact length:
			// no growing, no spare capacity.
			base := d.frames[len(d.frames)-1].base
			a := make([]any, len(d.elems)-base)
			copy(a, d.elems[base:])
			clear(d.elems[base:])
			d.elems = d.elems[:base]
			d.frames = d.frames[:len(d.frames)-1]
			v = a
		case jsonscan.String:
			v = d.text(t)
		case jsonscan.Number:
			v = json.Number(d.src[t.Start:t.End])
		case jsonscan.True:
			v = true
		case jsonscan.False:
			v = false
		case jsonscan.Null:
		}
		if len(d.frames) == 0 {
			if _, err := d.sc.Next(); err != nil { // anything but the end
				return nil, d.fail(err)
			}
			return v, nil
		}
		f := &d.frames[len(d.frames)-1]
		if f.m == nil {
			d.elems = append(d.elems, v)
			continue
		}
		// One hash operation per member: a key already present leaves the
		// length unchanged.
		n := len(f.m)
		if f.m[f.key] = v; len(f.m) == n {
			return nil, d.fail(nil)
		}
		if d.member != "" && len(d.frames) == 1 && f.key == d.member {
			d.memberText = d.sc.Data()[d.valueAt:t.End]
		}
		f.hasKey = false
	}
}

func (d *decoder) text(t jsonscan.Token) string {
	if !t.Escaped {
		return d.src[t.Start+1 : t.End-1]
	}
	return string(d.sc.Text(t))
}

// fail locates err (nil: a duplicate key was just stored). A member whose key
// repeats an earlier one is reported as the duplicate, the outermost one
// first: the key came before whatever went wrong inside its value.
func (d *decoder) fail(err *jsonscan.Problem) *decodeError {
	for i := range d.frames {
		if f := &d.frames[i]; f.m != nil && f.hasKey {
			if _, dup := f.m[f.key]; dup {
				return &decodeError{Problem: jsonscan.Problem{Msg: "duplicate object key", Offset: f.keyAt}, rpath: d.rpath(i + 1)}
			}
		}
	}
	n := len(d.frames)
	if !err.InValue {
		n-- // located at its array or object, not at a member
	}
	return &decodeError{Problem: *err, rpath: d.rpath(n)}
}

// rpath is the reversed pointer of the member or element being decoded in
// frames[n-1] (nil for n <= 0).
func (d *decoder) rpath(n int) []string {
	if n <= 0 {
		return nil
	}
	rpath := make([]string, 0, n)
	end := len(d.elems) // one past the last element of the innermost array
	for i := len(d.frames) - 1; i >= 0; i-- {
		f := &d.frames[i]
		if i < n {
			if f.m != nil {
				rpath = append(rpath, escapePointer(f.key))
			} else {
				rpath = append(rpath, strconv.Itoa(end-f.base))
			}
		}
		if f.m == nil {
			end = f.base
		}
	}
	return rpath
}

// escapePointer escapes one JSON pointer reference token (RFC 6901).
func escapePointer(s string) string {
	if !strings.ContainsAny(s, "~/") {
		return s
	}
	return strings.ReplaceAll(strings.ReplaceAll(s, "~", "~0"), "/", "~1")
}
