// Package jsonscan is the JSON tokenizer of the schema gate's decoder and of
// the quarantine's redaction: one pass over a byte slice, no recursion, no
// values built.
package jsonscan

import (
	"encoding/binary"
	"math/bits"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// Strict mode's number limits: huge literals drive math/big in a
// validator. 1e400 is fine (it compares exactly), 1e999999 is a denial of
// service.
const (
	MaxNumberLen = 128  // bytes of one number literal
	MaxExponent  = 1000 // magnitude of a decimal exponent
)

// Problem is why the input is not JSON (Syntax: encoding/json would refuse
// it too) or not acceptable to a Strict scanner, at Offset. InValue says it
// was raised where a value was expected (so located at that value), rather
// than in the structure of the enclosing array or object.
type Problem struct {
	Msg     string
	Offset  int
	Syntax  bool
	InValue bool
}

func (e *Problem) Error() string { return e.Msg + " at offset " + strconv.Itoa(e.Offset) }

// Kind is the kind of a Token.
type Kind uint8

// Token kinds.
const (
	EOF         Kind = iota // end of the input, after the last value
	BeginObject             // {
	EndObject               // }
	BeginArray              // [
	EndArray                // ]
	Key                     // an object member's name, with its quotes
	String                  // a string value, with its quotes
	Number
	True
	False
	Null
)

// Token is one JSON token: its kind and its bytes, input[Start:End].
type Token struct {
	Kind       Kind
	Start, End int
	// Escaped is true for a string or key with escapes; see Scanner.Text.
	Escaped bool
}

// Scanner splits JSON into tokens in one pass over a byte slice, without
// recursion and without building values: it keeps one bit per open array or
// object and a scratch buffer for the text of an escaped string.
//
// A Scanner from New reads a sequence of values separated by optional
// whitespace, as encoding/json's Decoder does, and accepts exactly the syntax
// encoding/json accepts, at any nesting depth: Strict's limits (depth,
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
	err   *Problem // the first error; every later call returns it

	// Set by Strict: one value only, and its limits.
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

// New returns a Scanner over data, which it does not copy or modify.
func New(data []byte) *Scanner { return &Scanner{data: data} }

// Strict is a Scanner over data, by value, for one JSON value and nothing
// after it, that also refuses what encoding/json lets through: invalid
// UTF-8, unpaired surrogate escapes, nesting deeper than maxDepth (0: no
// limit), number literals longer than MaxNumberLen bytes or with an
// exponent beyond ±MaxExponent. Duplicate keys stay the caller's business.
func Strict(data []byte, maxDepth int) Scanner {
	return Scanner{data: data, single: true, strict: true, maxDepth: maxDepth}
}

// Data is the input.
func (s *Scanner) Data() []byte { return s.data }

// Depth is the number of arrays and objects open after the last token.
func (s *Scanner) Depth() int { return s.depth }

// Text is the content of a String or Key (nil for other tokens):
// the bytes between its quotes, or for an escaped one the unescaped text,
// which is only valid until the next call to Next.
func (s *Scanner) Text(t Token) []byte {
	if t.Kind != String && t.Kind != Key {
		return nil
	}
	if t.Escaped {
		return s.buf
	}
	return s.data[t.Start+1 : t.End-1]
}

// Next returns the next token: EOF once the input holds nothing but
// whitespace after the last value, or an error that says why and where the
// input is not JSON (and keeps being returned). The error is a *Problem, nil
// when there is none: compare it with nil before storing it in an error.
func (s *Scanner) Next() (Token, *Problem) {
	if s.err != nil {
		return Token{}, s.err
	}
	t, err := s.scan()
	if err != nil {
		s.err = err
	}
	return t, err
}

func (s *Scanner) scan() (Token, *Problem) {
	s.skipSpace()
	switch s.state {
	case stStart:
		if s.pos == len(s.data) {
			if s.single {
				return Token{}, &Problem{Msg: "empty body", Syntax: true}
			}
			return Token{Kind: EOF, Start: s.pos, End: s.pos}, nil
		}
		return s.value()
	case stDone:
		if s.pos == len(s.data) {
			return Token{Kind: EOF, Start: s.pos, End: s.pos}, nil
		}
		if s.single {
			return Token{}, s.syntaxErr("unexpected data after the top-level value")
		}
		return s.value()
	case stArrayFirst:
		if s.pos < len(s.data) && s.data[s.pos] == ']' {
			return s.close(EndArray), nil
		}
		return s.value()
	case stObjectFirst:
		if s.pos < len(s.data) && s.data[s.pos] == '}' {
			return s.close(EndObject), nil
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
			return s.close(EndObject), nil
		case c == ']' && !obj:
			return s.close(EndArray), nil
		case obj:
			return Token{}, s.syntaxErr("expected ',' or '}' after object value")
		default:
			return Token{}, s.syntaxErr("expected ',' or ']' after array element")
		}
	}
}

func (s *Scanner) syntaxErr(msg string) *Problem {
	if s.pos >= len(s.data) {
		return &Problem{Msg: "unexpected end of JSON input", Offset: s.pos, Syntax: true}
	}
	return &Problem{Msg: msg, Offset: s.pos, Syntax: true}
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
func (s *Scanner) close(kind Kind) Token {
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
func (s *Scanner) value() (Token, *Problem) {
	t, err := s.scanValue()
	if err != nil {
		err.InValue = true
	}
	return t, err
}

func (s *Scanner) scanValue() (Token, *Problem) {
	start := s.pos
	if start >= len(s.data) {
		return Token{}, s.syntaxErr("")
	}
	kind := Null
	switch c := s.data[start]; {
	case c == '{' || c == '[':
		if s.maxDepth > 0 && s.depth >= s.maxDepth {
			return Token{}, &Problem{Msg: "nesting too deep (more than " + strconv.Itoa(s.maxDepth) + " levels)", Offset: start}
		}
		s.pos++
		s.push(c == '{')
		if c == '{' {
			s.state = stObjectFirst
			return Token{Kind: BeginObject, Start: start, End: s.pos}, nil
		}
		s.state = stArrayFirst
		return Token{Kind: BeginArray, Start: start, End: s.pos}, nil
	case c == '"':
		escaped, err := s.str()
		if err != nil {
			return Token{}, err
		}
		s.afterValue()
		return Token{Kind: String, Start: start, End: s.pos, Escaped: escaped}, nil
	case c == '-' || (c >= '0' && c <= '9'):
		if err := s.number(); err != nil {
			return Token{}, err
		}
		kind = Number
	case c == 't':
		kind = True
	case c == 'f':
		kind = False
	case c == 'n':
	default:
		return Token{}, s.syntaxErr("invalid character " + strconv.QuoteRune(rune(c)) + " looking for beginning of value")
	}
	if kind != Number {
		lit := literals[kind]
		if len(s.data)-start < len(lit) || string(s.data[start:start+len(lit)]) != lit {
			return Token{}, s.syntaxErr("invalid literal, want " + lit)
		}
		s.pos += len(lit)
	}
	s.afterValue()
	return Token{Kind: kind, Start: start, End: s.pos}, nil
}

var literals = [...]string{True: "true", False: "false", Null: "null"}

// key scans an object member's name at pos; a ':' must follow.
func (s *Scanner) key() (Token, *Problem) {
	start := s.pos
	if start >= len(s.data) || s.data[start] != '"' {
		return Token{}, s.syntaxErr("expected a string object key")
	}
	escaped, err := s.str()
	if err != nil {
		return Token{}, err
	}
	s.state = stColon
	return Token{Kind: Key, Start: start, End: s.pos, Escaped: escaped}, nil
}

// number scans a JSON number at pos.
func (s *Scanner) number() *Problem {
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
			if exp <= MaxExponent {
				exp = exp*10 + int(data[p]-'0')
			}
			p++
		}
		if s.strict && exp > MaxExponent {
			return &Problem{Msg: "number exponent beyond ±" + strconv.Itoa(MaxExponent), Offset: start}
		}
	}
	if s.strict && p-start > MaxNumberLen {
		return &Problem{Msg: "number literal longer than " + strconv.Itoa(MaxNumberLen) + " bytes", Offset: start}
	}
	s.pos = p
	return nil
}

// str scans a string starting at its opening quote and reports whether it
// has escapes (its text is then in buf). The common case, no escapes, is one
// scan and no copy.
func (s *Scanner) str() (bool, *Problem) {
	s.pos++ // '"'
	start := s.pos
	data := s.data
	for p := start; p < len(data); {
		p = plainRun(data, p)
		if p >= len(data) {
			break
		}
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
				return false, &Problem{Msg: "invalid UTF-8 in string", Offset: p}
			}
			p += size
		}
	}
	s.pos = len(data)
	return false, s.syntaxErr("")
}

// strEscaped finishes a string that has escapes into buf; pos is at the
// first backslash and start is just after the opening quote.
func (s *Scanner) strEscaped(start int) *Problem {
	data := s.data
	b := append(s.buf[:0], data[start:s.pos]...)
	p := s.pos
	for p < len(data) {
		if q := plainRun(data, p); q > p {
			b = append(b, data[p:q]...)
			if p = q; p >= len(data) {
				break
			}
		}
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
				return &Problem{Msg: "invalid UTF-8 in string", Offset: p}
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
func (s *Scanner) unicodeEscape(p int) (rune, int, *Problem) {
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
	return 0, 0, &Problem{Msg: "unpaired UTF-16 surrogate escape in string", Offset: p - 6}
}

// plainRun skips, eight bytes at a time, the bytes from p on that a string
// takes as they are: printable ASCII other than '"' and '\\'. It returns
// the offset of the first other byte (which the caller looks at alone), or
// of the last few bytes, fewer than eight, which it leaves to the caller.
// Strings in messages are mostly such runs, and a byte at a time was most
// of the tokenizer's time.
func plainRun(data []byte, p int) int {
	const (
		ones  = 0x0101010101010101
		highs = 0x8080808080808080
	)
	for p+8 <= len(data) {
		w := binary.LittleEndian.Uint64(data[p:])
		// A byte's high bit is set in special when the byte is a
		// control character (below 0x20), '"', '\\' or not ASCII.
		// Every such byte is flagged; a borrow may also flag a byte
		// after one, never before, so the lowest flag is the first
		// such byte.
		quote, backslash := w^(ones*'"'), w^(ones*'\\')
		special := (w-ones*0x20)&^w | (quote-ones)&^quote | (backslash-ones)&^backslash | w
		if special &= highs; special != 0 {
			return p + bits.TrailingZeros64(special)/8
		}
		p += 8
	}
	return p
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
