package schemas

import (
	"slices"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/santhosh-tekuri/jsonschema/v5"
)

// Reason classifies why a message failed the gate. Every reason is a schema
// failure: the message can never become valid by retrying it, so it goes
// straight to quarantine. The values are stable and safe for headers and
// metric labels.
type Reason string

// Reasons. The gate checks size, content type and encoding first; then, with
// FromProperties, the identity before decoding, otherwise after.
const (
	ReasonTooLarge       Reason = "too_large"       // body larger than MaxBodyBytes
	ReasonContentType    Reason = "content_type"    // not JSON (or not UTF-8)
	ReasonEncoding       Reason = "encoding"        // content-encoding other than identity
	ReasonMissingType    Reason = "missing_type"    // the message names no type
	ReasonMissingVersion Reason = "missing_version" // the message names no schema version
	ReasonDecode         Reason = "decode"          // not acceptable JSON (syntax, UTF-8, duplicate key, depth, number)
	ReasonUnknownType    Reason = "unknown_type"    // type not in the registry
	ReasonUnknownVersion Reason = "unknown_version" // version of a known type not in the registry
	ReasonNotAccepted    Reason = "not_accepted"    // in the registry, but this queue does not take it
	ReasonInvalid        Reason = "invalid"         // fails its schema; see Violations
)

// ValidationError is the gate's only error. Type and Version are filled in as
// far as the gate got (either may be empty).
type ValidationError struct {
	Type    string `json:"type,omitempty"`
	Version string `json:"version,omitempty"`
	Reason  Reason `json:"reason"`
	// Detail says what was wrong in words, for every reason but
	// ReasonInvalid, whose details are the Violations.
	Detail string `json:"detail,omitempty"`
	// Violations lists the schema violations (ReasonInvalid), or the
	// location of a decode problem such as a duplicate key, at most
	// GateConfig.MaxViolations of them.
	Violations []Violation `json:"violations,omitempty"`
	// Truncated is true when there were more violations than listed.
	Truncated bool `json:"truncated,omitempty"`
}

// Violation is one failed schema keyword.
type Violation struct {
	// Pointer is the JSON pointer of the offending value in the message
	// body ("" is the whole body).
	Pointer string `json:"pointer"`
	// Keyword is the schema keyword that failed, e.g. "required".
	Keyword string `json:"keyword"`
	// Message says what is wrong. It never quotes the offending value
	// (which may be personal data; the pointer names its location, key
	// names included), and is at most 200 bytes.
	Message string `json:"message"`
}

// maxMessageLen caps Violation.Message and ValidationError.Detail.
const maxMessageLen = 200

func (e *ValidationError) Error() string {
	var b strings.Builder
	b.WriteString("schema failure")
	if e.Type != "" {
		b.WriteString(" for ")
		b.WriteString(e.Type)
		if e.Version != "" {
			b.WriteString(" v")
			b.WriteString(e.Version)
		}
	}
	b.WriteString(": ")
	b.WriteString(string(e.Reason))
	if e.Detail != "" {
		b.WriteString(": ")
		b.WriteString(e.Detail)
	}
	if len(e.Violations) > 0 {
		v := e.Violations[0]
		b.WriteString(": ")
		b.WriteString(v.String())
		if n := len(e.Violations) - 1; n > 0 || e.Truncated {
			b.WriteString(" (and ")
			b.WriteString(strconv.Itoa(n))
			if e.Truncated {
				b.WriteString("+")
			}
			b.WriteString(" more)")
		}
	}
	return b.String()
}

// String renders the violation as "pointer keyword: message", with the
// whole body shown as "(root)".
func (v Violation) String() string {
	p := v.Pointer
	if p == "" {
		p = "(root)"
	}
	return p + " " + v.Keyword + ": " + v.Message
}

// flatten turns jsonschema's error tree into its leaves, sorted by pointer
// and keyword so the same message always yields the same list, at most max
// of them, each pointer prefixed with prefix (the location of the validated
// value in the body). It reports whether leaves were left out.
func flatten(ve *jsonschema.ValidationError, prefix string, max int) ([]Violation, bool) {
	var leaves []vleaf
	appendLeaves(ve, "", "", &leaves)
	return leafViolations(leaves, prefix, max)
}

// leafViolations sorts leaves (in place) by instance location, then
// keyword location, keeps at most max and makes them violations, each
// pointer prefixed with prefix. It reports whether leaves were left out.
func leafViolations(leaves []vleaf, prefix string, max int) ([]Violation, bool) {
	sort.SliceStable(leaves, func(i, j int) bool {
		a, b := leaves[i], leaves[j]
		if a.inst != b.inst {
			return a.inst < b.inst
		}
		return a.kw < b.kw
	})
	truncated := len(leaves) > max
	if truncated {
		leaves = leaves[:max]
	}
	out := make([]Violation, len(leaves))
	for i, e := range leaves {
		kw := keyword(e.kw)
		msg := e.msg
		if kw == "additionalProperties" {
			msg = sortNames(msg)
		}
		out[i] = Violation{
			Pointer: prefix + e.inst,
			Keyword: kw,
			Message: capLen(redactMessage(kw, msg)),
		}
	}
	return out, truncated
}

// sortNames puts the names of jsonschema's "additionalProperties 'b', 'a'
// not allowed" in one order: jsonschema lists them in map order, so the
// same message would read differently from one check to the next (in the
// envelope, the error header, the logs). Each name is quoted as jsonschema
// quotes it ('…', with \ and \' escaped); a message of any other shape is
// returned as it is.
func sortNames(msg string) string {
	const head, tail = "additionalProperties ", " not allowed"
	if !strings.HasPrefix(msg, head) || !strings.HasSuffix(msg, tail) || len(msg) < len(head)+len(tail) {
		return msg
	}
	rest := msg[len(head) : len(msg)-len(tail)]
	var names []string
	for len(rest) > 0 {
		if rest[0] != '\'' {
			return msg
		}
		end := -1
		for i := 1; i < len(rest); i++ {
			if rest[i] == '\\' {
				i++ // an escaped byte, a quote too
				continue
			}
			if rest[i] == '\'' {
				end = i
				break
			}
		}
		if end < 0 {
			return msg
		}
		names = append(names, rest[:end+1])
		rest = rest[end+1:]
		if len(rest) > 0 {
			if !strings.HasPrefix(rest, ", ") {
				return msg
			}
			rest = rest[2:]
		}
	}
	if len(names) < 2 {
		return msg
	}
	slices.Sort(names)
	return head + strings.Join(names, ", ") + tail
}

// keyword is the last segment of a keyword location.
func keyword(loc string) string {
	if i := strings.LastIndexByte(loc, '/'); i >= 0 {
		loc = loc[i+1:]
	}
	if loc == "" {
		return "schema"
	}
	return strings.ReplaceAll(strings.ReplaceAll(loc, "~1", "/"), "~0", "~")
}

// redactMessage drops the offending value that jsonschema quotes in the
// messages of some keywords ("'jane@x' is not valid 'email'", "must be >= 1
// but found 0", "7 not multipleOf 2"): violations travel into quarantine
// envelopes, error headers, fingerprints and logs, and the value may be
// personal data. The schema-side part (format name, pattern, bound) stays.
// A message of such a keyword that does not read as expected is replaced
// whole.
func redactMessage(kw, msg string) string {
	var marker string
	switch kw {
	case "format":
		marker = " is not valid "
	case "pattern":
		if strings.HasPrefix(msg, "does not match pattern ") { // quotes no value
			return msg
		}
		marker = " does not match pattern "
	case "multipleOf":
		marker = " not multipleOf "
	case "minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum":
		if i := strings.LastIndex(msg, " but found "); i >= 0 {
			return msg[:i]
		}
		return "value out of range (" + kw + ")"
	default:
		return msg
	}
	if i := strings.LastIndex(msg, marker); i >= 0 {
		return "value" + msg[i:]
	}
	return "value fails " + kw
}

// capLen cuts s to maxMessageLen bytes on a rune boundary.
func capLen(s string) string {
	if len(s) <= maxMessageLen {
		return s
	}
	cut := maxMessageLen - len("…")
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}
