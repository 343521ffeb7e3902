package schemas

import (
	"reflect"
	"runtime"

	"github.com/santhosh-tekuri/jsonschema/v5"
)

// registerFormats gives the compiler faster checkers for formats the shipped
// schemas assert on every message. Each accepts at once only values that
// are plainly valid (plainFormats) and hands everything else to jsonschema's
// own checker, so a value is valid exactly when it was before. They are
// registered per compiler; jsonschema.Formats, which the whole process
// shares, is only read. A checker the process put in jsonschema.Formats in
// place of jsonschema's own is left alone: a plain check vouches only for
// what jsonschema's own accepts, and taking it first would let through
// what a stricter replacement refuses.
func registerFormats(c *jsonschema.Compiler) {
	for name, plain := range plainFormats {
		if slow := jsonschema.Formats[name]; slow != nil && ownChecker(name, slow) {
			c.Formats[name] = func(v any) bool {
				if s, ok := v.(string); ok && plain(s) {
					return true
				}
				return slow(v)
			}
		}
	}
}

// ownCheckers names jsonschema's own checker of each format in plainFormats.
var ownCheckers = map[string]string{"email": "isEmail", "uuid": "isUUID", "date-time": "isDateTime"}

// ownChecker reports whether fn, jsonschema.Formats[name], is still
// jsonschema's own checker, by its function's name: function values do
// not compare, and a copy taken at init could already be a replacement.
func ownChecker(name string, fn func(any) bool) bool {
	f := runtime.FuncForPC(reflect.ValueOf(fn).Pointer())
	return f != nil && f.Name() == reflect.TypeFor[jsonschema.Schema]().PkgPath()+"."+ownCheckers[name]
}

// plainFormats are the plain checks of registerFormats. The fast path calls
// them on a string itself: passing it to a checker as an any allocated a
// copy of its header for every format checked.
var plainFormats = map[string]func(string) bool{"email": plainEmail, "uuid": plainUUID, "date-time": plainDateTime}

// plainUUID reports whether s is 8-4-4-4-12 hex digits, as jsonschema's
// uuid check wants.
func plainUUID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		default:
			if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F') {
				return false
			}
		}
	}
	return true
}

// plainDateTime reports whether s is YYYY-MM-DDThh:mm:ss, optionally a
// fraction of a second, then Z, a day that its month has (as time.Parse
// counts them) and no leap second: every such string passes jsonschema's
// date-time check. A false result says nothing (an offset, a lower-case t
// or z, a leap second): the caller asks jsonschema.
func plainDateTime(s string) bool {
	if len(s) < 20 || s[4] != '-' || s[7] != '-' || s[10] != 'T' || s[13] != ':' || s[16] != ':' || s[len(s)-1] != 'Z' {
		return false
	}
	two := func(i int, lo, hi byte) bool {
		a, b := s[i], s[i+1]
		if a < '0' || a > '9' || b < '0' || b > '9' {
			return false
		}
		n := (a-'0')*10 + b - '0'
		return n >= lo && n <= hi
	}
	if !two(0, 0, 99) || !two(2, 0, 99) || !two(5, 1, 12) || !two(8, 1, 31) || !two(11, 0, 23) || !two(14, 0, 59) || !two(17, 0, 59) {
		return false
	}
	num := func(i, n int) int {
		v := 0
		for _, c := range []byte(s[i : i+n]) {
			v = v*10 + int(c-'0')
		}
		return v
	}
	year, month, day := num(0, 4), num(5, 2), num(8, 2)
	days := [13]int{0, 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31}[month]
	if month == 2 && year%4 == 0 && (year%100 != 0 || year%400 == 0) {
		days = 29
	}
	if day > days {
		return false
	}
	frac := s[19 : len(s)-1]
	if frac == "" {
		return true
	}
	if len(frac) < 2 || frac[0] != '.' {
		return false
	}
	for i := 1; i < len(frac); i++ {
		if frac[i] < '0' || frac[i] > '9' {
			return false
		}
	}
	return true
}

// plainEmail reports whether s is local@domain with a dot-atom local part of
// letters, digits and ._%+- (1 to 64 bytes) and a domain of dot-separated
// labels of letters, digits and '-' (1 to 63 bytes each, not starting or
// ending with '-'), at most 254 bytes in all. Every such address passes
// jsonschema's email check (its length and hostname rules, then
// net/mail.ParseAddress, which takes it as an addr-spec of two dot-atoms);
// it spares the common case the parser's allocations. A false result says
// nothing: the caller asks jsonschema.
func plainEmail(s string) bool {
	if len(s) > 254 {
		return false
	}
	at := -1
	for i := 0; i < len(s); i++ {
		if s[i] == '@' {
			if at >= 0 {
				return false
			}
			at = i
		}
	}
	if at < 1 || at > 64 || at == len(s)-1 {
		return false
	}
	prev := byte('.') // no leading dot
	for i := 0; i < at; i++ {
		c := s[i]
		switch {
		case c == '.':
			if prev == '.' {
				return false
			}
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9',
			c == '_', c == '%', c == '+', c == '-':
		default:
			return false
		}
		prev = c
	}
	if prev == '.' {
		return false
	}
	label := 0
	prev = '.'
	for i := at + 1; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '.':
			if label == 0 || prev == '-' {
				return false
			}
			label = 0
		case c == '-':
			if label == 0 {
				return false
			}
			label++
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
			label++
		default:
			return false
		}
		if label > 63 {
			return false
		}
		prev = c
	}
	return label > 0 && prev != '-'
}
