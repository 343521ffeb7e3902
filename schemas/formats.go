package schemas

import "github.com/santhosh-tekuri/jsonschema/v5"

// registerFormats gives the compiler faster checkers for formats the shipped
// schemas assert on every message. Each accepts at once only values that
// are plainly valid and hands everything else to jsonschema's own checker,
// so a value is valid exactly when it was before. They are registered per
// compiler; jsonschema.Formats, which the whole process shares, is only read.
func registerFormats(c *jsonschema.Compiler) {
	if slow := jsonschema.Formats["email"]; slow != nil {
		c.Formats["email"] = func(v any) bool {
			if s, ok := v.(string); ok && plainEmail(s) {
				return true
			}
			return slow(v)
		}
	}
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
