package schemas

import (
	"fmt"
	"strconv"

	"github.com/santhosh-tekuri/jsonschema/v5"
)

// preflightMinBody is the body size from which the gate runs preflight.
// Below it, even the worst case costs little.
const preflightMinBody = 32 << 10

// preflight looks for arrays and objects beyond their schema's maxItems or
// maxProperties before the full validation runs. jsonschema validates every
// element of an oversized array anyway and builds an error for each one that
// fails: half a million bad elements in a 1 MiB body cost ~500 MB of
// garbage. Following properties, items, prefixItems, $ref and allOf is
// enough to find the limits a schema states; anything subtler is left to the
// validator. It returns the first violation found, or nil.
func preflight(s *jsonschema.Schema, v any, depth int) *preflightViolation {
	if s == nil || depth > 4*maxDepth { // $ref chains add depth
		return nil
	}
	if s.Ref != nil {
		if pv := preflight(s.Ref, v, depth+1); pv != nil {
			return pv
		}
	}
	for _, sub := range s.AllOf {
		if pv := preflight(sub, v, depth+1); pv != nil {
			return pv
		}
	}
	switch x := v.(type) {
	case []any:
		if s.MaxItems >= 0 && len(x) > s.MaxItems {
			return &preflightViolation{keyword: "maxItems", msg: fmt.Sprintf("maximum %d items required, but found %d items", s.MaxItems, len(x))}
		}
		for i, e := range x {
			sub := s.Items2020
			if i < len(s.PrefixItems) {
				sub = s.PrefixItems[i]
			}
			if pv := preflight(sub, e, depth+1); pv != nil {
				pv.rpath = append(pv.rpath, strconv.Itoa(i))
				return pv
			}
		}
	case map[string]any:
		if s.MaxProperties >= 0 && len(x) > s.MaxProperties {
			return &preflightViolation{keyword: "maxProperties", msg: fmt.Sprintf("maximum %d properties allowed, but found %d properties", s.MaxProperties, len(x))}
		}
		for k, sub := range s.Properties {
			if e, ok := x[k]; ok {
				if pv := preflight(sub, e, depth+1); pv != nil {
					pv.rpath = append(pv.rpath, escapePointer(k))
					return pv
				}
			}
		}
	}
	return nil
}

// preflightViolation is a violation whose pointer is built while unwinding.
type preflightViolation struct {
	keyword, msg string
	rpath        []string
}

func (pv *preflightViolation) violation(prefix string) Violation {
	p := prefix
	for i := len(pv.rpath) - 1; i >= 0; i-- {
		p += "/" + pv.rpath[i]
	}
	return Violation{Pointer: p, Keyword: pv.keyword, Message: pv.msg}
}
