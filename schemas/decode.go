package schemas

import (
	"encoding/json"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// Decoder limits. They bound the work one hostile body can cause beyond its
// size: nesting drives recursion (here and in the validator), and huge
// number literals drive math/big in the validator.
const (
	// MaxDepth is the deepest nesting of arrays and objects accepted.
	MaxDepth = 64
	// maxNumberLen caps the length of one number literal in bytes.
	maxNumberLen = 128
	// maxExponent caps the magnitude of a number's decimal exponent; 1e400
	// is fine (the validator compares exactly), 1e999999 is a denial of
	// service against math/big.
	maxExponent = 1000
)

// decodeError is why a body is not acceptable JSON. path is the location of
// the problem, innermost segment last once reversed (built while unwinding,
// so the happy path pays nothing for it).
type decodeError struct {
	msg    string
	offset int
	rpath  []string // reversed JSON pointer segments, already escaped
	syntax bool     // plain syntax error (encoding/json would reject it too)
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
		return e.msg + " at " + p
	}
	return e.msg + " at offset " + strconv.Itoa(e.offset)
}

// decodeJSON decodes data in one pass into the values encoding/json produces
// with UseNumber (map[string]any, []any, string, json.Number, bool, nil),
// and rejects what encoding/json lets through silently: invalid UTF-8 and
// unpaired surrogate escapes (it would substitute U+FFFD), duplicate object
// keys (it would keep the last), nesting deeper than MaxDepth, and number
// literals beyond maxNumberLen or maxExponent.
//
// Strings without escapes and numbers are substrings of one copy of data
// made up front: one allocation for all of them instead of one each. They
// keep that copy (the size of the body) alive as long as any is referenced.
func decodeJSON(data []byte) (any, *decodeError) {
	d := decoder{data: data, src: string(data)}
	d.skipSpace()
	if d.pos == len(d.data) {
		return nil, &decodeError{msg: "empty body", syntax: true}
	}
	v, err := d.value(0)
	if err != nil {
		return nil, err
	}
	d.skipSpace()
	if d.pos != len(d.data) {
		return nil, d.syntaxErr("unexpected data after the top-level value")
	}
	return v, nil
}

type decoder struct {
	data  []byte
	src   string // string(data): unescaped strings and numbers slice it
	pos   int
	buf   []byte // scratch for strings with escapes
	stack []any  // array elements being decoded, innermost array last
}

func (d *decoder) syntaxErr(msg string) *decodeError {
	if d.pos >= len(d.data) {
		return &decodeError{msg: "unexpected end of JSON input", offset: d.pos, syntax: true}
	}
	return &decodeError{msg: msg, offset: d.pos, syntax: true}
}

func (d *decoder) skipSpace() {
	for d.pos < len(d.data) {
		switch d.data[d.pos] {
		case ' ', '\t', '\n', '\r':
			d.pos++
		default:
			return
		}
	}
}

func (d *decoder) value(depth int) (any, *decodeError) {
	if d.pos >= len(d.data) {
		return nil, d.syntaxErr("")
	}
	switch c := d.data[d.pos]; {
	case c == '{':
		return d.object(depth + 1)
	case c == '[':
		return d.array(depth + 1)
	case c == '"':
		s, err := d.str()
		if err != nil {
			return nil, err
		}
		return s, nil
	case c == '-' || (c >= '0' && c <= '9'):
		return d.number()
	case c == 't':
		return true, d.literal("true")
	case c == 'f':
		return false, d.literal("false")
	case c == 'n':
		return nil, d.literal("null")
	default:
		return nil, d.syntaxErr("invalid character " + strconv.QuoteRune(rune(c)) + " looking for beginning of value")
	}
}

func (d *decoder) literal(lit string) *decodeError {
	if len(d.data)-d.pos < len(lit) || string(d.data[d.pos:d.pos+len(lit)]) != lit {
		return d.syntaxErr("invalid literal, want " + lit)
	}
	d.pos += len(lit)
	return nil
}

func (d *decoder) tooDeep() *decodeError {
	return &decodeError{msg: "nesting too deep (more than " + strconv.Itoa(MaxDepth) + " levels)", offset: d.pos}
}

func (d *decoder) object(depth int) (any, *decodeError) {
	if depth > MaxDepth {
		return nil, d.tooDeep()
	}
	d.pos++ // '{'
	m := make(map[string]any)
	d.skipSpace()
	if d.pos < len(d.data) && d.data[d.pos] == '}' {
		d.pos++
		return m, nil
	}
	for {
		if d.pos >= len(d.data) || d.data[d.pos] != '"' {
			return nil, d.syntaxErr("expected a string object key")
		}
		keyAt := d.pos
		k, err := d.str()
		if err != nil {
			return nil, err
		}
		d.skipSpace()
		if d.pos >= len(d.data) || d.data[d.pos] != ':' {
			if _, dup := m[k]; dup { // the key came first: report it
				return nil, dupKey(k, keyAt)
			}
			return nil, d.syntaxErr("expected ':' after object key")
		}
		d.pos++
		d.skipSpace()
		v, err := d.value(depth)
		if err != nil {
			if _, dup := m[k]; dup { // the key came first: report it
				return nil, dupKey(k, keyAt)
			}
			err.rpath = append(err.rpath, escapePointer(k))
			return nil, err
		}
		// One hash operation per member: a key already present leaves the
		// length unchanged.
		n := len(m)
		if m[k] = v; len(m) == n {
			return nil, dupKey(k, keyAt)
		}
		d.skipSpace()
		if d.pos >= len(d.data) {
			return nil, d.syntaxErr("")
		}
		switch d.data[d.pos] {
		case ',':
			d.pos++
			d.skipSpace()
		case '}':
			d.pos++
			return m, nil
		default:
			return nil, d.syntaxErr("expected ',' or '}' after object value")
		}
	}
}

func dupKey(k string, offset int) *decodeError {
	return &decodeError{msg: "duplicate object key", offset: offset, rpath: []string{escapePointer(k)}}
}

func (d *decoder) array(depth int) (any, *decodeError) {
	if depth > MaxDepth {
		return nil, d.tooDeep()
	}
	d.pos++ // '['
	d.skipSpace()
	if d.pos < len(d.data) && d.data[d.pos] == ']' {
		d.pos++
		return []any{}, nil
	}
	// Elements go on the shared stack and are copied once into a slice of
	// the exact length: no growing, no spare capacity.
	if d.stack == nil {
		d.stack = make([]any, 0, 16)
	}
	base := len(d.stack)
	for n := 0; ; n++ {
		v, err := d.value(depth)
		if err != nil {
			err.rpath = append(err.rpath, strconv.Itoa(n))
			return nil, err
		}
		d.stack = append(d.stack, v)
		d.skipSpace()
		if d.pos >= len(d.data) {
			return nil, d.syntaxErr("")
		}
		switch d.data[d.pos] {
		case ',':
			d.pos++
			d.skipSpace()
		case ']':
			d.pos++
			a := make([]any, len(d.stack)-base)
			copy(a, d.stack[base:])
			clear(d.stack[base:])
			d.stack = d.stack[:base]
			return a, nil
		default:
			return nil, d.syntaxErr("expected ',' or ']' after array element")
		}
	}
}

// number scans a JSON number and returns it as json.Number.
func (d *decoder) number() (any, *decodeError) {
	start := d.pos
	p := d.pos
	data := d.data
	if data[p] == '-' {
		p++
	}
	switch {
	case p < len(data) && data[p] == '0':
		p++
	case p < len(data) && data[p] >= '1' && data[p] <= '9':
		for p < len(data) && data[p] >= '0' && data[p] <= '9' {
			p++
		}
	default:
		d.pos = p
		return nil, d.syntaxErr("invalid number")
	}
	if p < len(data) && data[p] == '.' {
		p++
		if p >= len(data) || data[p] < '0' || data[p] > '9' {
			d.pos = p
			return nil, d.syntaxErr("invalid number: no digit after the decimal point")
		}
		for p < len(data) && data[p] >= '0' && data[p] <= '9' {
			p++
		}
	}
	if p < len(data) && (data[p] == 'e' || data[p] == 'E') {
		p++
		if p < len(data) && (data[p] == '+' || data[p] == '-') {
			p++
		}
		if p >= len(data) || data[p] < '0' || data[p] > '9' {
			d.pos = p
			return nil, d.syntaxErr("invalid number: no digit in the exponent")
		}
		exp := 0
		for p < len(data) && data[p] >= '0' && data[p] <= '9' {
			if exp <= maxExponent {
				exp = exp*10 + int(data[p]-'0')
			}
			p++
		}
		if exp > maxExponent {
			return nil, &decodeError{msg: "number exponent beyond ±" + strconv.Itoa(maxExponent), offset: start}
		}
	}
	if p-start > maxNumberLen {
		return nil, &decodeError{msg: "number literal longer than " + strconv.Itoa(maxNumberLen) + " bytes", offset: start}
	}
	d.pos = p
	return json.Number(d.src[start:p]), nil
}

// str scans a string starting at its opening quote. The common case, no
// escapes, is one scan and no allocation (a substring of d.src).
func (d *decoder) str() (string, *decodeError) {
	d.pos++ // '"'
	start := d.pos
	data := d.data
	for p := start; p < len(data); {
		c := data[p]
		switch {
		case c == '"':
			d.pos = p + 1
			return d.src[start:p], nil
		case c == '\\':
			d.pos = p
			return d.strEscaped(start)
		case c < 0x20:
			d.pos = p
			return "", d.syntaxErr("invalid control character in string")
		case c < utf8.RuneSelf:
			p++
		default:
			r, size := utf8.DecodeRune(data[p:])
			if r == utf8.RuneError && size == 1 {
				return "", &decodeError{msg: "invalid UTF-8 in string", offset: p}
			}
			p += size
		}
	}
	d.pos = len(data)
	return "", d.syntaxErr("")
}

// strEscaped finishes a string that has escapes; d.pos is at the first
// backslash and start is just after the opening quote.
func (d *decoder) strEscaped(start int) (string, *decodeError) {
	data := d.data
	b := append(d.buf[:0], data[start:d.pos]...)
	p := d.pos
	for p < len(data) {
		c := data[p]
		switch {
		case c == '"':
			d.pos = p + 1
			d.buf = b
			return string(b), nil
		case c == '\\':
			if p+1 >= len(data) {
				d.pos = len(data)
				return "", d.syntaxErr("")
			}
			p++
			switch data[p] {
			case '"', '\\', '/':
				b = append(b, data[p])
			case 'b':
				b = append(b, '\b')
			case 'f':
				b = append(b, '\f')
			case 'n':
				b = append(b, '\n')
			case 'r':
				b = append(b, '\r')
			case 't':
				b = append(b, '\t')
			case 'u':
				r, next, err := d.unicodeEscape(p - 1)
				if err != nil {
					return "", err
				}
				b = utf8.AppendRune(b, r)
				p = next
				continue
			default:
				d.pos = p
				return "", d.syntaxErr("invalid escape in string")
			}
			p++
		case c < 0x20:
			d.pos = p
			return "", d.syntaxErr("invalid control character in string")
		case c < utf8.RuneSelf:
			b = append(b, c)
			p++
		default:
			r, size := utf8.DecodeRune(data[p:])
			if r == utf8.RuneError && size == 1 {
				return "", &decodeError{msg: "invalid UTF-8 in string", offset: p}
			}
			b = append(b, data[p:p+size]...)
			p += size
		}
	}
	d.pos = len(data)
	return "", d.syntaxErr("")
}

// unicodeEscape decodes \uXXXX (and a following low surrogate) at p, the
// backslash. It returns the rune and the offset after the escape(s).
func (d *decoder) unicodeEscape(p int) (rune, int, *decodeError) {
	r, ok := hex4(d.data, p+2)
	if !ok {
		d.pos = p
		return 0, 0, d.syntaxErr("invalid \\u escape in string")
	}
	p += 6
	if !utf16.IsSurrogate(r) {
		return r, p, nil
	}
	if r < 0xDC00 && p+1 < len(d.data) && d.data[p] == '\\' && d.data[p+1] == 'u' {
		r2, ok := hex4(d.data, p+2)
		if !ok {
			d.pos = p
			return 0, 0, d.syntaxErr("invalid \\u escape in string")
		}
		if dec := utf16.DecodeRune(r, r2); dec != utf8.RuneError {
			return dec, p + 6, nil
		}
	}
	return 0, 0, &decodeError{msg: "unpaired UTF-16 surrogate escape in string", offset: p - 6}
}

func hex4(data []byte, p int) (rune, bool) {
	if p+4 > len(data) {
		return 0, false
	}
	var r rune
	for _, c := range data[p : p+4] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c = c - 'a' + 10
		case c >= 'A' && c <= 'F':
			c = c - 'A' + 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	return r, true
}

// escapePointer escapes one JSON pointer reference token (RFC 6901).
func escapePointer(s string) string {
	if !strings.ContainsAny(s, "~/") {
		return s
	}
	return strings.ReplaceAll(strings.ReplaceAll(s, "~", "~0"), "/", "~1")
}
