package schemas

import (
	"encoding/json"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// Decoder limits. They bound the work one hostile body can cause beyond its
// size: nesting drives recursion in the validator, and huge number literals
// drive math/big in the validator.
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
// the problem, innermost segment last once reversed (built only when an
// error happens, so the happy path pays nothing for it).
type decodeError struct {
	msg    string
	offset int
	rpath  []string // reversed JSON pointer segments, already escaped
	syntax bool     // plain syntax error (encoding/json would reject it too)
	// inValue: raised where a value was expected (so located at that value),
	// rather than in the structure of the enclosing array or object.
	inValue bool
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

// TokenKind is the kind of a Token.
type TokenKind uint8

// Token kinds.
const (
	TokenEOF         TokenKind = iota // end of the input, after the last value
	TokenBeginObject                  // {
	TokenEndObject                    // }
	TokenBeginArray                   // [
	TokenEndArray                     // ]
	TokenKey                          // an object member's name, with its quotes
	TokenString                       // a string value, with its quotes
	TokenNumber
	TokenTrue
	TokenFalse
	TokenNull
)

// Token is one JSON token: its kind and its bytes, input[Start:End].
type Token struct {
	Kind       TokenKind
	Start, End int
	// Escaped is true for a string or key with escapes; see Scanner.Text.
	Escaped bool
}

// Scanner splits JSON into tokens in one pass over a byte slice, without
// recursion and without building values: it keeps one bit per open array or
// object and a scratch buffer for the text of an escaped string. It is the
// one JSON parser of the package; the gate's decoder builds values from its
// tokens.
//
// A Scanner from NewScanner reads a sequence of values separated by optional
// whitespace, as encoding/json's Decoder does, and accepts exactly the syntax
// encoding/json accepts, at any nesting depth: the gate's own limits (depth,
// UTF-8, surrogate escapes, number size) are not applied, and duplicate keys
// are the caller's business. Invalid UTF-8 is kept as it is in Text.
type Scanner struct {
	data  []byte
	pos   int
	state scanState
	buf   []byte // the unescaped text of the last escaped string
	// open has one bit per open container, outermost first: 1 for an
	// object. The first 64 levels live in open0.
	open0 uint64
	open  []uint64
	depth int
	err   *decodeError // the first error; every later call returns it

	// The gate's decoder sets these: one value only, and its limits.
	single   bool
	strict   bool // reject invalid UTF-8, unpaired surrogates, huge numbers
	maxDepth int  // 0: no limit
}

type scanState uint8

const (
	stStart       scanState = iota // before the first value
	stDone                         // after a top-level value
	stArrayFirst                   // a value or ']'
	stObjectFirst                  // a key or '}'
	stColon                        // ':' then a value
	stNext                         // ',' then a key or value, or the container's end
)

// NewScanner returns a Scanner over data, which it does not copy or modify.
func NewScanner(data []byte) *Scanner { return &Scanner{data: data} }

// Depth is the number of arrays and objects open after the last token.
func (s *Scanner) Depth() int { return s.depth }

// Text is the content of a TokenString or TokenKey (nil for other tokens):
// the bytes between its quotes, or for an escaped one the unescaped text,
// which is only valid until the next call to Next.
func (s *Scanner) Text(t Token) []byte {
	if t.Kind != TokenString && t.Kind != TokenKey {
		return nil
	}
	if t.Escaped {
		return s.buf
	}
	return s.data[t.Start+1 : t.End-1]
}

// Next returns the next token: TokenEOF once the input holds nothing but
// whitespace after the last value, or an error that says why and where the
// input is not JSON (and keeps being returned).
func (s *Scanner) Next() (Token, error) {
	t, err := s.next()
	if err != nil {
		return t, err
	}
	return t, nil
}

func (s *Scanner) next() (Token, *decodeError) {
	if s.err != nil {
		return Token{}, s.err
	}
	t, err := s.scan()
	if err != nil {
		s.err = err
	}
	return t, err
}

func (s *Scanner) scan() (Token, *decodeError) {
	s.skipSpace()
	switch s.state {
	case stStart:
		if s.pos == len(s.data) {
			if s.single {
				return Token{}, &decodeError{msg: "empty body", syntax: true}
			}
			return Token{Kind: TokenEOF, Start: s.pos, End: s.pos}, nil
		}
		return s.value()
	case stDone:
		if s.pos == len(s.data) {
			return Token{Kind: TokenEOF, Start: s.pos, End: s.pos}, nil
		}
		if s.single {
			return Token{}, s.syntaxErr("unexpected data after the top-level value")
		}
		return s.value()
	case stArrayFirst:
		if s.pos < len(s.data) && s.data[s.pos] == ']' {
			return s.close(TokenEndArray), nil
		}
		return s.value()
	case stObjectFirst:
		if s.pos < len(s.data) && s.data[s.pos] == '}' {
			return s.close(TokenEndObject), nil
		}
		return s.key()
	case stColon:
		if s.pos >= len(s.data) || s.data[s.pos] != ':' {
			return Token{}, s.syntaxErr("expected ':' after object key")
		}
		s.pos++
		s.skipSpace()
		return s.value()
	default: // stNext
		if s.pos >= len(s.data) {
			return Token{}, s.syntaxErr("")
		}
		obj := s.inObject()
		switch c := s.data[s.pos]; {
		case c == ',':
			s.pos++
			s.skipSpace()
			if obj {
				return s.key()
			}
			return s.value()
		case c == '}' && obj:
			return s.close(TokenEndObject), nil
		case c == ']' && !obj:
			return s.close(TokenEndArray), nil
		case obj:
			return Token{}, s.syntaxErr("expected ',' or '}' after object value")
		default:
			return Token{}, s.syntaxErr("expected ',' or ']' after array element")
		}
	}
}

func (s *Scanner) syntaxErr(msg string) *decodeError {
	if s.pos >= len(s.data) {
		return &decodeError{msg: "unexpected end of JSON input", offset: s.pos, syntax: true}
	}
	return &decodeError{msg: msg, offset: s.pos, syntax: true}
}

func (s *Scanner) skipSpace() {
	for s.pos < len(s.data) {
		switch s.data[s.pos] {
		case ' ', '\t', '\n', '\r':
			s.pos++
		default:
			return
		}
	}
}

func (s *Scanner) inObject() bool {
	i := s.depth - 1
	if i < 64 {
		return s.open0&(1<<i) != 0
	}
	i -= 64
	return s.open[i/64]&(1<<(i%64)) != 0
}

func (s *Scanner) push(obj bool) {
	i := s.depth
	s.depth++
	var w *uint64
	if i < 64 {
		w = &s.open0
	} else {
		i -= 64
		if i/64 == len(s.open) {
			s.open = append(s.open, 0)
		}
		w = &s.open[i/64]
	}
	if obj {
		*w |= 1 << (i % 64)
	} else {
		*w &^= 1 << (i % 64)
	}
}

// close ends the innermost container, whose closing byte is at pos.
func (s *Scanner) close(kind TokenKind) Token {
	s.pos++
	s.depth--
	s.afterValue()
	return Token{Kind: kind, Start: s.pos - 1, End: s.pos}
}

func (s *Scanner) afterValue() {
	if s.depth == 0 {
		s.state = stDone
	} else {
		s.state = stNext
	}
}

// value scans the value (or the start of the container) at pos.
func (s *Scanner) value() (Token, *decodeError) {
	t, err := s.scanValue()
	if err != nil {
		err.inValue = true
	}
	return t, err
}

func (s *Scanner) scanValue() (Token, *decodeError) {
	start := s.pos
	if start >= len(s.data) {
		return Token{}, s.syntaxErr("")
	}
	kind := TokenNull
	switch c := s.data[start]; {
	case c == '{' || c == '[':
		if s.maxDepth > 0 && s.depth >= s.maxDepth {
			return Token{}, &decodeError{msg: "nesting too deep (more than " + strconv.Itoa(s.maxDepth) + " levels)", offset: start}
		}
		s.pos++
		s.push(c == '{')
		if c == '{' {
			s.state = stObjectFirst
			return Token{Kind: TokenBeginObject, Start: start, End: s.pos}, nil
		}
		s.state = stArrayFirst
		return Token{Kind: TokenBeginArray, Start: start, End: s.pos}, nil
	case c == '"':
		escaped, err := s.str()
		if err != nil {
			return Token{}, err
		}
		s.afterValue()
		return Token{Kind: TokenString, Start: start, End: s.pos, Escaped: escaped}, nil
	case c == '-' || (c >= '0' && c <= '9'):
		if err := s.number(); err != nil {
			return Token{}, err
		}
		kind = TokenNumber
	case c == 't':
		kind = TokenTrue
	case c == 'f':
		kind = TokenFalse
	case c == 'n':
	default:
		return Token{}, s.syntaxErr("invalid character " + strconv.QuoteRune(rune(c)) + " looking for beginning of value")
	}
	if kind != TokenNumber {
		lit := literals[kind]
		if len(s.data)-start < len(lit) || string(s.data[start:start+len(lit)]) != lit {
			return Token{}, s.syntaxErr("invalid literal, want " + lit)
		}
		s.pos += len(lit)
	}
	s.afterValue()
	return Token{Kind: kind, Start: start, End: s.pos}, nil
}

var literals = [...]string{TokenTrue: "true", TokenFalse: "false", TokenNull: "null"}

// key scans an object member's name at pos; a ':' must follow.
func (s *Scanner) key() (Token, *decodeError) {
	start := s.pos
	if start >= len(s.data) || s.data[start] != '"' {
		return Token{}, s.syntaxErr("expected a string object key")
	}
	escaped, err := s.str()
	if err != nil {
		return Token{}, err
	}
	s.state = stColon
	return Token{Kind: TokenKey, Start: start, End: s.pos, Escaped: escaped}, nil
}

// number scans a JSON number at pos.
func (s *Scanner) number() *decodeError {
	start := s.pos
	p := s.pos
	data := s.data
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
		s.pos = p
		return s.syntaxErr("invalid number")
	}
	if p < len(data) && data[p] == '.' {
		p++
		if p >= len(data) || data[p] < '0' || data[p] > '9' {
			s.pos = p
			return s.syntaxErr("invalid number: no digit after the decimal point")
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
			s.pos = p
			return s.syntaxErr("invalid number: no digit in the exponent")
		}
		exp := 0
		for p < len(data) && data[p] >= '0' && data[p] <= '9' {
			if exp <= maxExponent {
				exp = exp*10 + int(data[p]-'0')
			}
			p++
		}
		if s.strict && exp > maxExponent {
			return &decodeError{msg: "number exponent beyond ±" + strconv.Itoa(maxExponent), offset: start}
		}
	}
	if s.strict && p-start > maxNumberLen {
		return &decodeError{msg: "number literal longer than " + strconv.Itoa(maxNumberLen) + " bytes", offset: start}
	}
	s.pos = p
	return nil
}

// str scans a string starting at its opening quote and reports whether it
// has escapes (its text is then in buf). The common case, no escapes, is one
// scan and no copy.
func (s *Scanner) str() (bool, *decodeError) {
	s.pos++ // '"'
	start := s.pos
	data := s.data
	for p := start; p < len(data); {
		c := data[p]
		switch {
		case c == '"':
			s.pos = p + 1
			return false, nil
		case c == '\\':
			s.pos = p
			return true, s.strEscaped(start)
		case c < 0x20:
			s.pos = p
			return false, s.syntaxErr("invalid control character in string")
		case c < utf8.RuneSelf || !s.strict:
			p++
		default:
			r, size := utf8.DecodeRune(data[p:])
			if r == utf8.RuneError && size == 1 {
				return false, &decodeError{msg: "invalid UTF-8 in string", offset: p}
			}
			p += size
		}
	}
	s.pos = len(data)
	return false, s.syntaxErr("")
}

// strEscaped finishes a string that has escapes into buf; pos is at the
// first backslash and start is just after the opening quote.
func (s *Scanner) strEscaped(start int) *decodeError {
	data := s.data
	b := append(s.buf[:0], data[start:s.pos]...)
	p := s.pos
	for p < len(data) {
		c := data[p]
		switch {
		case c == '"':
			s.pos = p + 1
			s.buf = b
			return nil
		case c == '\\':
			if p+1 >= len(data) {
				s.pos = len(data)
				return s.syntaxErr("")
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
				r, next, err := s.unicodeEscape(p - 1)
				if err != nil {
					return err
				}
				b = utf8.AppendRune(b, r)
				p = next
				continue
			default:
				s.pos = p
				return s.syntaxErr("invalid escape in string")
			}
			p++
		case c < 0x20:
			s.pos = p
			return s.syntaxErr("invalid control character in string")
		case c < utf8.RuneSelf || !s.strict:
			b = append(b, c)
			p++
		default:
			r, size := utf8.DecodeRune(data[p:])
			if r == utf8.RuneError && size == 1 {
				return &decodeError{msg: "invalid UTF-8 in string", offset: p}
			}
			b = append(b, data[p:p+size]...)
			p += size
		}
	}
	s.pos = len(data)
	return s.syntaxErr("")
}

// unicodeEscape decodes \uXXXX (and a following low surrogate) at p, the
// backslash. It returns the rune and the offset after the escape(s). An
// unpaired surrogate is an error in strict mode, else U+FFFD (as
// encoding/json decodes it).
func (s *Scanner) unicodeEscape(p int) (rune, int, *decodeError) {
	r, ok := hex4(s.data, p+2)
	if !ok {
		s.pos = p
		return 0, 0, s.syntaxErr("invalid \\u escape in string")
	}
	p += 6
	if !utf16.IsSurrogate(r) {
		return r, p, nil
	}
	if r < 0xDC00 && p+1 < len(s.data) && s.data[p] == '\\' && s.data[p+1] == 'u' {
		r2, ok := hex4(s.data, p+2)
		if !ok && s.strict {
			s.pos = p
			return 0, 0, s.syntaxErr("invalid \\u escape in string")
		}
		if dec := utf16.DecodeRune(r, r2); ok && dec != utf8.RuneError {
			return dec, p + 6, nil
		}
	}
	if !s.strict {
		return utf8.RuneError, p, nil
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
	d := decoder{sc: Scanner{data: data, single: true, strict: true, maxDepth: MaxDepth}, src: string(data)}
	d.frames = make([]frame, 0, 8)
	return d.decode()
}

// decodeJSONMember is decodeJSON that also returns the text of the member
// key of the top-level object (an envelope's "data"), a subslice of data;
// nil if there is none.
func decodeJSONMember(data []byte, key string) (any, []byte, *decodeError) {
	d := decoder{sc: Scanner{data: data, single: true, strict: true, maxDepth: MaxDepth}, src: string(data), member: key}
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
	sc     Scanner
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
		t, err := d.sc.next()
		if err != nil {
			return nil, d.fail(err)
		}
		if d.member != "" && len(d.frames) == 1 {
			d.valueAt = t.Start // a member value's first token, or its key
		}
		var v any
		switch t.Kind {
		case TokenBeginObject:
			d.frames = append(d.frames, frame{m: make(map[string]any)})
			continue
		case TokenBeginArray:
			if d.elems == nil {
				d.elems = make([]any, 0, 16)
			}
			d.frames = append(d.frames, frame{base: len(d.elems)})
			continue
		case TokenKey:
			f := &d.frames[len(d.frames)-1]
			f.key, f.keyAt, f.hasKey = d.text(t), t.Start, true
			continue
		case TokenEndObject:
			v = d.frames[len(d.frames)-1].m
			d.frames = d.frames[:len(d.frames)-1]
		case TokenEndArray:
			// Elements are copied once into a slice of the exact length:
			// no growing, no spare capacity.
			base := d.frames[len(d.frames)-1].base
			a := make([]any, len(d.elems)-base)
			copy(a, d.elems[base:])
			clear(d.elems[base:])
			d.elems = d.elems[:base]
			d.frames = d.frames[:len(d.frames)-1]
			v = a
		case TokenString:
			v = d.text(t)
		case TokenNumber:
			v = json.Number(d.src[t.Start:t.End])
		case TokenTrue:
			v = true
		case TokenFalse:
			v = false
		case TokenNull:
		}
		if len(d.frames) == 0 {
			if _, err := d.sc.next(); err != nil { // anything but the end
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
			d.memberText = d.sc.data[d.valueAt:t.End]
		}
		f.hasKey = false
	}
}

func (d *decoder) text(t Token) string {
	if !t.Escaped {
		return d.src[t.Start+1 : t.End-1]
	}
	return string(d.sc.buf)
}

// fail locates err (nil: a duplicate key was just stored). A member whose key
// repeats an earlier one is reported as the duplicate, the outermost one
// first: the key came before whatever went wrong inside its value.
func (d *decoder) fail(err *decodeError) *decodeError {
	for i := range d.frames {
		if f := &d.frames[i]; f.m != nil && f.hasKey {
			if _, dup := f.m[f.key]; dup {
				return &decodeError{msg: "duplicate object key", offset: f.keyAt, rpath: d.rpath(i + 1)}
			}
		}
	}
	n := len(d.frames)
	if !err.inValue {
		n-- // located at its array or object, not at a member
	}
	err.rpath = d.rpath(n)
	return err
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
