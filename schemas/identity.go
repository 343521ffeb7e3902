package schemas

import (
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/dlxbridge/dlxbridge/wire"
)

// Identity modes: where a message names its type and schema version.
const (
	// FromProperties: the AMQP type property names the type and a header
	// (Identity.VersionHeader) the version; the whole body is the data.
	FromProperties = "properties"
	// FromEnvelope: the body is a CloudEvents-style envelope
	// {"type", "schemaVersion" or "dataschema", "data"}; only "data" is
	// validated and returned.
	FromEnvelope = "envelope"
	// FromPointer: JSON pointers into the body name the type and the
	// version; the whole body is validated.
	FromPointer = "pointer"
)

// Identity defaults.
const (
	DefaultTypePointer    = "/type"
	DefaultVersionPointer = "/schemaVersion"
)

// Identity says how a message names its type and schema version.
type Identity struct {
	// From is FromProperties, FromEnvelope or FromPointer. Defaults to
	// FromProperties.
	From string
	// VersionHeader is the AMQP header holding the version (FromProperties).
	// Defaults to "schema-version".
	VersionHeader string
	// TypePointer is the JSON pointer of the type in the body (FromPointer).
	// Defaults to "/type".
	TypePointer string
	// VersionPointer is the JSON pointer of the version in the body
	// (FromPointer). Defaults to "/schemaVersion".
	VersionPointer string
}

// WithDefaults returns id with every unset field at its default.
func (id Identity) WithDefaults() Identity {
	if id.From == "" {
		id.From = FromProperties
	}
	if id.VersionHeader == "" {
		id.VersionHeader = wire.DefaultVersionHeader
	}
	if id.TypePointer == "" {
		id.TypePointer = DefaultTypePointer
	}
	if id.VersionPointer == "" {
		id.VersionPointer = DefaultVersionPointer
	}
	return id
}

// IdentityProblem is one rule an Identity breaks. The config layer reports
// these under its own field paths, so each rule is written here only.
type IdentityProblem struct {
	// Field is "From", "TypePointer" or "VersionPointer".
	Field string
	// Rule says what is wrong, e.g. `"type" is not a JSON pointer (it starts with '/')`.
	Rule string
}

func (p IdentityProblem) Error() string { return "Identity." + p.Field + ": " + p.Rule }

// Problems lists every rule a defaulted id breaks; nil when it is valid.
func (id Identity) Problems() []IdentityProblem {
	var out []IdentityProblem
	switch id.From {
	case FromProperties, FromEnvelope, FromPointer:
	default:
		out = append(out, IdentityProblem{"From", fmt.Sprintf("must be %s, %s or %s, not %q", FromProperties, FromEnvelope, FromPointer, id.From)})
	}
	for _, p := range []struct{ field, ptr string }{{"TypePointer", id.TypePointer}, {"VersionPointer", id.VersionPointer}} {
		if !strings.HasPrefix(p.ptr, "/") {
			out = append(out, IdentityProblem{p.field, fmt.Sprintf("%q is not a JSON pointer (it starts with '/')", p.ptr)})
		}
	}
	return out
}

// withDefaults fills in defaults and checks the result.
func (id Identity) withDefaults() (Identity, error) {
	id = id.WithDefaults()
	if probs := id.Problems(); len(probs) > 0 {
		return id, probs[0]
	}
	return id, nil
}

// NormalizeVersion trims v and drops a leading "v" or "V" before a digit, so
// "v2", "V2" and " 2 " all become "2".
func NormalizeVersion(v string) string {
	v = strings.TrimSpace(v)
	if len(v) > 1 && (v[0] == 'v' || v[0] == 'V') && v[1] >= '0' && v[1] <= '9' {
		return v[1:]
	}
	return v
}

// versionString turns a version as found in a header or a JSON body into its
// normalized string form. AMQP tables carry strings, byte slices and
// integers of every width; JSON carries strings and json.Number. ok is false
// for anything else (or a non-integral number).
func versionString(v any) (string, bool) {
	var s string
	switch x := v.(type) {
	case string:
		s = x
	case []byte:
		s = string(x)
	case json.Number:
		for _, c := range []byte(x) {
			if c < '0' || c > '9' {
				return "", false // a version number is a non-negative integer
			}
		}
		s = string(x)
	case int:
		s = strconv.FormatInt(int64(x), 10)
	case int8:
		s = strconv.FormatInt(int64(x), 10)
	case int16:
		s = strconv.FormatInt(int64(x), 10)
	case int32:
		s = strconv.FormatInt(int64(x), 10)
	case int64:
		s = strconv.FormatInt(x, 10)
	case uint:
		s = strconv.FormatUint(uint64(x), 10)
	case uint8:
		s = strconv.FormatUint(uint64(x), 10)
	case uint16:
		s = strconv.FormatUint(uint64(x), 10)
	case uint32:
		s = strconv.FormatUint(uint64(x), 10)
	case uint64:
		s = strconv.FormatUint(x, 10)
	case float32:
		return floatVersion(float64(x))
	case float64:
		return floatVersion(x)
	default:
		return "", false
	}
	s = NormalizeVersion(s)
	return s, s != ""
}

func floatVersion(f float64) (string, bool) {
	if f != math.Trunc(f) || f < 0 || f > 1e9 {
		return "", false
	}
	return strconv.FormatInt(int64(f), 10), true
}

// versionFromDataschema takes the version from a dataschema URL ending in
// "/v<N>.json" or "v<N>".
func versionFromDataschema(u string) (string, bool) {
	u = strings.TrimSuffix(u, ".json")
	i := strings.LastIndexAny(u, "/:#")
	seg := u[i+1:]
	if len(seg) < 2 || (seg[0] != 'v' && seg[0] != 'V') {
		return "", false
	}
	for _, c := range seg[1:] {
		if c < '0' || c > '9' {
			return "", false
		}
	}
	return seg[1:], true
}

// lookupPointer resolves a JSON pointer (RFC 6901) in a decoded value.
func lookupPointer(v any, ptr string) (any, bool) {
	if ptr == "" {
		return v, true
	}
	if ptr[0] != '/' {
		return nil, false
	}
	for _, tok := range strings.Split(ptr[1:], "/") {
		tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
		switch x := v.(type) {
		case map[string]any:
			var ok bool
			if v, ok = x[tok]; !ok {
				return nil, false
			}
		case []any:
			i, err := strconv.Atoi(tok)
			if err != nil || i < 0 || i >= len(x) || (len(tok) > 1 && tok[0] == '0') {
				return nil, false
			}
			v = x[i]
		default:
			return nil, false
		}
	}
	return v, true
}
