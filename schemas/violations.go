package schemas

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v5"
)

// The gate's invalid path. jsonschema validating a whole message to list
// what is wrong with it cost ~15 times a valid message's check, most of it
// spent on the parts that are fine. Its violations are the leaves of its
// error tree, and for the keywords below a leaf depends only on the schema
// node that states the keyword and the value at that node: jsonschema
// applies a property's, an item's or a $ref's schema to that value alone,
// and lists its errors under the node's instance location and keyword
// location. So the violations of the whole are the union of:
//
//   - the node's own keywords: jsonschema run on the node with the
//     decomposed applicators below replaced by "true" (so an
//     additionalProperties: false or additionalItems still sees the same
//     evaluated names and count), when that copy's fast path finds
//     anything wrong;
//   - for each decomposed applicator (properties, patternProperties,
//     additionalProperties, items, additionalItems, prefixItems, $ref,
//     allOf) whose fast path finds its value invalid, the same again one
//     level down, with jsonschema's instance and keyword locations
//     extended as jsonschema extends them.
//
// A value whose fast path passes has no leaves (the fast path is exact in
// both directions), so only the failing branches cost anything. A node that
// is a boolean schema, or whose "type" fails (jsonschema then reports that
// alone), is handed to jsonschema whole; so is every applicator not listed
// above (anyOf, oneOf, not, if/then/else, dependent schemas, contains,
// propertyNames), as part of the node's own keywords, unchanged. A schema
// without a fast path, a value the decoder did not make, a panic, or any
// disagreement between the fast path and jsonschema falls back to the full
// validation (validate), which TestViolationsAgree and FuzzViolationsAgree
// also use as the oracle. jsonschema writes every message.
//
// The leaves are then sorted by (instance location, keyword location) and
// cut as flatten does; that key identifies a leaf (one keyword location is
// one path through the schema, one instance location one path through the
// value), so the order does not depend on the order they were found in.

// vnode is one schema node of the invalid path, built at load time.
type vnode struct {
	s *jsonschema.Schema
	f *fastSchema
	// own is s with the decomposed applicators replaced by "true" (or
	// removed: $ref, allOf), and ownF its fast path; own is s itself when
	// s has none. whole: hand s to jsonschema whole (a boolean schema).
	own   *jsonschema.Schema
	ownF  *fastSchema
	whole bool

	props      []vchild // properties
	patterns   []vpattern
	additional *vnode // additionalProperties as a schema
	itemsAll   *vnode // items as one schema (before 2020-12)
	tuple      []*vnode
	tupleAdd   *vnode // additionalItems as a schema
	prefix     []*vnode
	items      *vnode // items (2020-12)
	ref        *vnode
	allOf      []*vnode
}

type vchild struct {
	name, esc string // esc: the name as jsonschema escapes it
	n         *vnode
}

type vpattern struct {
	re  *regexp.Regexp
	seg string // "patternProperties/" + the escaped pattern
	n   *vnode
}

// vleaf is one leaf error of jsonschema's tree, with its full locations.
type vleaf struct {
	inst, kw, msg string
}

// alwaysTrue is the "true" schema that stands in for a decomposed
// applicator in a node's own copy.
var alwaysTrue = func() *jsonschema.Schema {
	t := true
	return &jsonschema.Schema{Always: &t}
}()

// buildInvalidPath builds the vnodes of every root that has a fast path.
// A root it cannot build has none: the gate then validates it whole.
func buildInvalidPath(fast map[*jsonschema.Schema]*fastSchema, formats map[string]func(any) bool) map[*jsonschema.Schema]*vnode {
	out := map[*jsonschema.Schema]*vnode{}
	for root, f := range fast {
		b := vbuilder{done: map[*jsonschema.Schema]*vnode{}, c: fastCompiler{done: map[*jsonschema.Schema]*fastSchema{}, formats: formats}}
		n, err := b.build(root)
		if err != nil || n.f == nil || f == nil {
			continue
		}
		out[root] = n
	}
	return out
}

type vbuilder struct {
	done map[*jsonschema.Schema]*vnode
	c    fastCompiler
}

func (b *vbuilder) build(s *jsonschema.Schema) (*vnode, error) {
	if s == nil {
		return nil, nil
	}
	if n, ok := b.done[s]; ok {
		return n, nil
	}
	n := &vnode{s: s}
	b.done[s] = n
	var err error
	if n.f, err = b.c.compile(s); err != nil {
		return nil, err
	}
	if s.Always != nil {
		n.whole = true
		return n, nil
	}
	one := func(sub *jsonschema.Schema) *vnode {
		var v *vnode
		if err == nil {
			v, err = b.build(sub)
		}
		return v
	}
	own := *s
	stripped := false
	if len(s.Properties) > 0 {
		names := make([]string, 0, len(s.Properties))
		for name := range s.Properties {
			names = append(names, name)
		}
		sort.Strings(names)
		own.Properties = make(map[string]*jsonschema.Schema, len(names))
		for _, name := range names {
			n.props = append(n.props, vchild{name: name, esc: escapeToken(name), n: one(s.Properties[name])})
			own.Properties[name] = alwaysTrue
		}
		stripped = true
	}
	if len(s.PatternProperties) > 0 {
		own.PatternProperties = make(map[*regexp.Regexp]*jsonschema.Schema, len(s.PatternProperties))
		for re, sub := range s.PatternProperties {
			n.patterns = append(n.patterns, vpattern{re: re, seg: "patternProperties/" + escapeToken(re.String()), n: one(sub)})
			own.PatternProperties[re] = alwaysTrue
		}
		stripped = true
	}
	if sub, ok := s.AdditionalProperties.(*jsonschema.Schema); ok {
		n.additional = one(sub)
		own.AdditionalProperties = alwaysTrue
		stripped = true
	}
	switch items := s.Items.(type) {
	case *jsonschema.Schema:
		n.itemsAll = one(items)
		own.Items = alwaysTrue
		stripped = true
	case []*jsonschema.Schema:
		trues := make([]*jsonschema.Schema, len(items))
		for i, sub := range items {
			n.tuple = append(n.tuple, one(sub))
			trues[i] = alwaysTrue
		}
		own.Items = trues
		if sub, ok := s.AdditionalItems.(*jsonschema.Schema); ok {
			n.tupleAdd = one(sub)
			own.AdditionalItems = alwaysTrue
		}
		stripped = true
	}
	if len(s.PrefixItems) > 0 {
		own.PrefixItems = make([]*jsonschema.Schema, len(s.PrefixItems))
		for i, sub := range s.PrefixItems {
			n.prefix = append(n.prefix, one(sub))
			own.PrefixItems[i] = alwaysTrue
		}
		stripped = true
	}
	if s.Items2020 != nil {
		n.items = one(s.Items2020)
		own.Items2020 = alwaysTrue
		stripped = true
	}
	if s.Ref != nil {
		n.ref = one(s.Ref)
		own.Ref = nil
		stripped = true
	}
	if len(s.AllOf) > 0 {
		for _, sub := range s.AllOf {
			n.allOf = append(n.allOf, one(sub))
		}
		own.AllOf = nil
		stripped = true
	}
	if err != nil {
		return nil, err
	}
	n.own, n.ownF = s, n.f
	if stripped {
		n.own = &own
		c := fastCompiler{done: map[*jsonschema.Schema]*fastSchema{}, formats: b.c.formats}
		if n.ownF, err = c.compile(n.own); err != nil {
			return nil, err
		}
	}
	return n, nil
}

// escapeToken is jsonschema's escape of a location's reference token.
func escapeToken(token string) string {
	token = strings.ReplaceAll(token, "~", "~0")
	token = strings.ReplaceAll(token, "/", "~1")
	return url.PathEscape(token)
}

// errFallBack says the invalid path cannot answer: validate decides.
var errFallBack = errors.New("schemas: invalid path falls back")

// violations is validate for a value the decoder made, through the
// invalid path when the schema has one (see above): the same
// *ValidationError, or nil.
func (r *Registry) violations(schema *jsonschema.Schema, data any, prefix string, maxViolations int) *ValidationError {
	if n := r.inv[schema]; n != nil {
		if leaves, err := n.leaves(data); err == nil && len(leaves) > 0 {
			vs, truncated := leafViolations(leaves, prefix, maxViolations)
			return &ValidationError{Reason: ReasonInvalid, Violations: vs, Truncated: truncated}
		}
	}
	return validate(schema, data, prefix, maxViolations)
}

// leaves lists the leaves of jsonschema's error tree for data, which the
// fast path finds invalid, or fails.
func (n *vnode) leaves(data any) (out []vleaf, err error) {
	defer func() {
		if r := recover(); r != nil {
			out, err = nil, fmt.Errorf("%w: panic: %v", errFallBack, r)
		}
	}()
	if err := n.collect(data, "", "", &out); err != nil {
		return nil, err
	}
	return out, nil
}

// collect appends the leaves of v, which n's fast path finds invalid, at
// instance location inst and keyword location kw.
func (n *vnode) collect(v any, inst, kw string, out *[]vleaf) error {
	if n.whole || !n.typeOK(v) {
		return jsLeaves(n.s, v, inst, kw, out)
	}
	found := len(*out)
	if !n.ownF.valid(v) {
		if err := jsLeaves(n.own, v, inst, kw, out); err != nil {
			return err
		}
	}
	sub := func(c *vnode, v any, inst, kw string) error {
		if c.f.valid(v) {
			return nil
		}
		return c.collect(v, inst, kw, out)
	}
	switch x := v.(type) {
	case map[string]any:
		for _, p := range n.props {
			if pv, ok := x[p.name]; ok {
				if err := sub(p.n, pv, joinInst(inst, p.esc), kw+"/properties/"+p.esc); err != nil {
					return err
				}
			}
		}
		if n.patterns != nil || n.additional != nil {
			for name, pv := range x {
				evaluated := false
				for _, p := range n.props {
					if p.name == name {
						evaluated = true
						break
					}
				}
				for _, pp := range n.patterns {
					if pp.re.MatchString(name) {
						evaluated = true
						if err := sub(pp.n, pv, joinInst(inst, escapeToken(name)), kw+"/"+pp.seg); err != nil {
							return err
						}
					}
				}
				if !evaluated && n.additional != nil {
					if err := sub(n.additional, pv, joinInst(inst, escapeToken(name)), kw+"/additionalProperties"); err != nil {
						return err
					}
				}
			}
		}
	case []any:
		for i, e := range x {
			ei := joinInst(inst, strconv.Itoa(i))
			if n.itemsAll != nil {
				if err := sub(n.itemsAll, e, ei, kw+"/items"); err != nil {
					return err
				}
			}
			if n.tuple != nil || n.tupleAdd != nil {
				switch {
				case i < len(n.tuple):
					if err := sub(n.tuple[i], e, ei, kw+"/items/"+strconv.Itoa(i)); err != nil {
						return err
					}
				case n.tupleAdd != nil:
					if err := sub(n.tupleAdd, e, ei, kw+"/additionalItems"); err != nil {
						return err
					}
				}
			}
			switch {
			case i < len(n.prefix):
				if err := sub(n.prefix[i], e, ei, kw+"/prefixItems/"+strconv.Itoa(i)); err != nil {
					return err
				}
			case n.items != nil:
				if err := sub(n.items, e, ei, kw+"/items"); err != nil {
					return err
				}
			}
		}
	}
	if n.ref != nil {
		if err := sub(n.ref, v, inst, kw+"/$ref"); err != nil {
			return err
		}
	}
	for i, a := range n.allOf {
		if err := sub(a, v, inst, kw+"/allOf/"+strconv.Itoa(i)); err != nil {
			return err
		}
	}
	if len(*out) == found {
		// The fast path found v invalid, and jsonschema nothing wrong.
		return fmt.Errorf("%w: no leaves at %q", errFallBack, inst)
	}
	return nil
}

// typeOK is jsonschema's "type" check (the fast path's, which is exact).
func (n *vnode) typeOK(v any) bool {
	s := n.f
	switch x := v.(type) {
	case map[string]any:
		return s.allows(typeObject)
	case []any:
		return s.allows(typeArray)
	case string:
		return s.allows(typeString)
	case bool:
		return s.allows(typeBoolean)
	case nil:
		return s.allows(typeNull)
	case json.Number:
		return s.allows(typeNumber) || s.allows(typeInteger) && isInteger(x)
	}
	panic(fmt.Sprintf("schemas: invalid path got a %T", v))
}

// joinInst extends an instance location as jsonschema does: an empty
// token (the member named "") leaves it as it is.
func joinInst(inst, tok string) string {
	if tok == "" {
		return inst
	}
	return inst + "/" + tok
}

// jsLeaves runs jsonschema on s and v, which must fail, and appends its
// leaves, their locations prefixed with inst and kw.
func jsLeaves(s *jsonschema.Schema, v any, inst, kw string, out *[]vleaf) error {
	err := s.Validate(v)
	var ve *jsonschema.ValidationError
	if err == nil || !errors.As(err, &ve) {
		return fmt.Errorf("%w: jsonschema says %v at %q", errFallBack, err, inst)
	}
	appendLeaves(ve, inst, kw, out)
	return nil
}

// appendLeaves appends the leaves of e's tree in depth-first order, their
// locations prefixed with inst and kw.
func appendLeaves(e *jsonschema.ValidationError, inst, kw string, out *[]vleaf) {
	if len(e.Causes) == 0 {
		*out = append(*out, vleaf{inst: inst + e.InstanceLocation, kw: kw + e.KeywordLocation, msg: e.Message})
	}
	for _, c := range e.Causes {
		appendLeaves(c, inst, kw, out)
	}
}
