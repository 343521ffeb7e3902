package schemas

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/dlxbridge/dlxbridge/internal/jsonscan"
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
// both directions), so only the failing branches cost anything. Like the
// gate, this path trusts only the fast path's "valid" (now also of the
// subschemas and of the own copies, which are compiled the same way): a
// wrong "invalid" makes jsonschema find nothing, and the full validation
// decides. A node that
// is a boolean schema, or whose "type" fails (jsonschema then reports that
// alone), is handed to jsonschema whole; so is every applicator not listed
// above (anyOf, oneOf, not, if/then/else, dependent schemas, contains,
// propertyNames), as part of the node's own keywords, unchanged. A schema
// without a fast path, a value the decoder did not make, a panic, or any
// disagreement between the fast path and jsonschema falls back to the full
// validation (validate), which TestViolationsAgree and FuzzViolationsAgree
// also use as the oracle. jsonschema writes every message.
//
// It reads a value decoded, or as the stream path's tokens (vdoc): with
// FromProperties the gate then never decodes an invalid body whole, only
// the values it hands to jsonschema.
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

	props      []vchild       // properties, by name
	propIndex  map[string]int // index in props
	patterns   []vpattern
	additional *vnode // additionalProperties as a schema
	itemsAll   *vnode // items as one schema (before 2020-12)
	tuple      []*vnode
	tupleAdd   *vnode // additionalItems as a schema
	prefix     []*vnode
	items      *vnode // items (2020-12)
	ref        *vnode
	allOf      []*vnode

	// pattern is s's own "pattern", which the own copy leaves out: the
	// walk matches it itself (once per value, and stoppable: see
	// match.go) and writes jsonschema's leaf for it.
	pattern *pattern
	// ownInsts is the largest pattern program jsonschema may run
	// validating own (0: none); see vwalk.js.
	ownInsts int
}

type vchild struct {
	name, esc string // esc: the name as jsonschema escapes it
	seg       string // "properties/" + esc
	n         *vnode
}

type vpattern struct {
	re  *pattern
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
	if s.Pattern != nil {
		n.pattern = newPattern(s.Pattern)
		own.Pattern = nil
		stripped = true
	}
	if len(s.Properties) > 0 {
		names := make([]string, 0, len(s.Properties))
		for name := range s.Properties {
			names = append(names, name)
		}
		sort.Strings(names)
		own.Properties = make(map[string]*jsonschema.Schema, len(names))
		n.propIndex = make(map[string]int, len(names))
		for _, name := range names {
			esc := escapeToken(name)
			n.props = append(n.props, vchild{name: name, esc: esc, seg: "properties/" + esc, n: one(s.Properties[name])})
			n.propIndex[name] = len(n.props) - 1
			own.Properties[name] = alwaysTrue
		}
		stripped = true
	}
	if len(s.PatternProperties) > 0 {
		own.PatternProperties = make(map[*regexp.Regexp]*jsonschema.Schema, len(s.PatternProperties))
		for re, sub := range s.PatternProperties {
			n.patterns = append(n.patterns, vpattern{re: newPattern(re), seg: "patternProperties/" + escapeToken(re.String()), n: one(sub)})
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
		// Removed, not "true": jsonschema would still visit every
		// element, and nothing of the own copy reads what items
		// evaluated (additionalItems needs a tuple; unevaluatedItems has
		// no fast path).
		n.itemsAll = one(items)
		own.Items = nil
		stripped = true
	case []*jsonschema.Schema:
		// Not nil even when empty (which the meta-schemas forbid):
		// additionalItems would then apply to every element.
		n.tuple = make([]*vnode, 0, len(items))
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
		own.Items2020 = nil // as items above
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
	n.ownInsts = patternBound(n.own)
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

// maxInvalidCalls bounds the jsonschema calls of one invalid path walk.
// Each failing value costs one (and, on the tokens, a decode of that
// value): a body with many failing values (a thousand empty line items)
// cost more than the one full validation it replaces. Past the bound the
// walk gives up and the full validation runs instead, once: a message
// breaking a schema in a few places (a storm's usual case) takes one to
// three calls.
const maxInvalidCalls = 8

// errOverBudget: the walk made maxInvalidCalls calls and more were due.
var errOverBudget = fmt.Errorf("%w: over %d jsonschema calls", errFallBack, maxInvalidCalls)

// violations is validate for a value the decoder made, through the
// invalid path when the schema has one (see above): the same
// *ValidationError, or nil.
func (r *Registry) violations(schema *jsonschema.Schema, data any, prefix string, maxViolations int) *ValidationError {
	return r.violationsAfter(nil, schema, data, prefix, maxViolations, false)
}

// violationsAfter is violations; overBudget says a walk on the body's
// tokens already gave up (errOverBudget): the same walk on the tree would
// too, so the full validation runs at once.
//
// run is the check's pattern work (nil: none, and nothing stops). When
// it stopped, the answer is void: the caller returns run's error.
func (r *Registry) violationsAfter(run *run, schema *jsonschema.Schema, data any, prefix string, maxViolations int, overBudget bool) *ValidationError {
	if n := r.inv[schema]; n != nil && !overBudget {
		if leaves, err := n.leaves(run, data, maxInvalidCalls); err == nil && len(leaves) > 0 {
			vs, truncated := leafViolations(leaves, prefix, maxViolations)
			return &ValidationError{Reason: ReasonInvalid, Violations: vs, Truncated: truncated}
		}
	}
	if run.stopped() {
		return &ValidationError{Reason: ReasonInvalid}
	}
	if costlyFor(r.bound[schema], data) {
		if r.fast[schema] != nil {
			// The fast path found data invalid; jsonschema would run
			// a costly pattern again, and nothing could stop it.
			vs, _ := leafViolations([]vleaf{{kw: "/", msg: notListed}}, prefix, maxViolations)
			return &ValidationError{Reason: ReasonInvalid, Violations: vs}
		}
		return validateUnstoppable(run, schema, data, prefix, maxViolations)
	}
	return validate(schema, data, prefix, maxViolations)
}

// unstoppable counts the validations validateUnstoppable left running
// (tests wait for them).
var unstoppable sync.WaitGroup

// validateUnstoppable is validate for a schema without a fast path, whose
// jsonschema validation may run a costly pattern that nothing can stop: it
// runs on a goroutine of its own, and when run's context ends first, the
// check returns without it (the validation finishes in the background).
func validateUnstoppable(run *run, schema *jsonschema.Schema, data any, prefix string, maxViolations int) *ValidationError {
	if run == nil || run.done == nil && !run.hasDeadline {
		return validate(schema, data, prefix, maxViolations)
	}
	done := make(chan *ValidationError, 1)
	unstoppable.Add(1)
	go func() {
		defer unstoppable.Done()
		done <- validate(schema, data, prefix, maxViolations)
	}()
	var deadline <-chan time.Time
	if run.hasDeadline {
		t := time.NewTimer(time.Until(run.deadline))
		defer t.Stop()
		deadline = t.C
	}
	select {
	case verr := <-done:
		return verr
	case <-run.done:
	case <-deadline:
	}
	if !run.stopped() {
		run.err = fmt.Errorf("%w: %w", ErrStopped, context.DeadlineExceeded)
	}
	return &ValidationError{Reason: ReasonInvalid}
}

// leaves lists the leaves of jsonschema's error tree for data, which the
// fast path finds invalid, or fails.
func (n *vnode) leaves(r *run, data any, maxCalls int) ([]vleaf, error) {
	return leavesOf(n, treeVals{r}, data, maxCalls)
}

// leavesOf walks data with at most maxCalls jsonschema calls (the gate's
// is maxInvalidCalls; tests lift it to compare every walk with the full
// validation).
func leavesOf[V any, D vdoc[V]](n *vnode, d D, data V, maxCalls int) (out []vleaf, err error) {
	defer func() {
		if r := recover(); r != nil {
			out, err = nil, fmt.Errorf("%w: panic: %v", errFallBack, r)
		}
	}()
	w := vwalk{maxCalls: maxCalls, r: d.run()}
	if err := collectLeaves(n, d, data, "", "", &w); err != nil {
		return nil, err
	}
	return w.out, nil
}

// vwalk is what one walk collects: the leaves, and its jsonschema calls.
type vwalk struct {
	out             []vleaf
	calls, maxCalls int
	r               *run
}

// notListed is the message of a leaf that stands for what jsonschema
// would have listed, when asking it would run a pattern that is costly on
// the value (see vwalk.js).
const notListed = "fails this schema; the keywords it fails are not listed, as listing them would run a pattern that is costly on this value again"

// js runs jsLeaves within the walk's budget. jsonschema matches patterns
// with the regexp package, which no deadline stops, and would run again
// what the fast path ran: when a pattern it may run (insts, the largest
// program s holds) is costly on the value's longest string or member name,
// the walk writes one leaf for the whole value at s instead (the fast path
// found it invalid, so the verdict stands).
func (w *vwalk) js(s *jsonschema.Schema, insts int, v func() any, inst, kw string) error {
	if w.r.stopped() {
		return w.r.err
	}
	if w.calls++; w.calls > w.maxCalls {
		return errOverBudget
	}
	x := v()
	if costlyFor(insts, x) {
		// keyword() of a location ending in "/" is "schema": the leaf
		// is about the schema at kw as a whole.
		w.out = append(w.out, vleaf{inst: inst, kw: kw + "/", msg: notListed})
		return nil
	}
	return jsLeaves(s, x, inst, kw, &w.out)
}

// costlyFor reports whether a pattern program of insts instructions may be
// costly (costlyMatch) on the longest string or member name in v.
func costlyFor(insts int, v any) bool {
	return insts > 0 && insts*(longestString(v)+1) > costlyMatch
}

// longestString is the length of the longest string or member name in v,
// a value as decodeJSON returns it.
func longestString(v any) int {
	switch x := v.(type) {
	case string:
		return len(x)
	case map[string]any:
		n := 0
		for k, e := range x {
			n = max(n, len(k), longestString(e))
		}
		return n
	case []any:
		n := 0
		for _, e := range x {
			n = max(n, longestString(e))
		}
		return n
	}
	return 0
}

// vdoc is how collectLeaves reads a value of type V: a decoded value (treeVals)
// or a token of a tokenized body (tokVals), which is decoded only where
// jsonschema is asked about it.
type vdoc[V any] interface {
	// valid is f's fast path on v; typeOK its "type" keyword (which is
	// jsonschema's, exactly).
	valid(f *fastSchema, v V) bool
	typeOK(f *fastSchema, v V) bool
	// tree is v decoded, for jsonschema.
	tree(v V) any
	// members calls f with each member of v if it is an object, and
	// elements with each element if it is an array, until f fails.
	members(v V, f func(name string, mv V) error) error
	elements(v V, f func(i int, e V) error) error
	// str is v if it is a string.
	str(v V) (string, bool)
	// run is the check's pattern work; match matches p through it.
	run() *run
	match(p *pattern, s string) bool
}

// collectLeaves appends the leaves of v, which n's fast path finds invalid, at
// instance location inst and keyword location kw.
func collectLeaves[V any, D vdoc[V]](n *vnode, d D, v V, inst, kw string, w *vwalk) error {
	tree := func() any { return d.tree(v) }
	if n.whole || !d.typeOK(n.f, v) {
		// A boolean schema, or a failing "type", which jsonschema
		// reports before any other keyword: no pattern runs.
		return w.js(n.s, 0, tree, inst, kw)
	}
	found := len(w.out)
	if !d.valid(n.ownF, v) {
		if err := w.js(n.own, n.ownInsts, tree, inst, kw); err != nil {
			return err
		}
	}
	if n.pattern != nil {
		if s, ok := d.str(v); ok && !d.match(n.pattern, s) {
			if w.r.stopped() {
				return w.r.err
			}
			w.out = append(w.out, vleaf{inst: inst, kw: kw + "/pattern", msg: "does not match pattern " + jsQuote(n.pattern.re.String())})
		}
	}
	// sub descends into c at v when c's fast path finds v invalid, at
	// instance location inst/tok and keyword location kw/seg; the
	// locations are only built then.
	sub := func(c *vnode, v V, tok, seg string) error {
		if d.valid(c.f, v) {
			return nil
		}
		return collectLeaves(c, d, v, joinInst(inst, tok), kw+"/"+seg, w)
	}
	if n.props != nil || n.patterns != nil || n.additional != nil {
		err := d.members(v, func(name string, mv V) error {
			p, evaluated := n.propIndex[name]
			if evaluated {
				if err := sub(n.props[p].n, mv, n.props[p].esc, n.props[p].seg); err != nil {
					return err
				}
			}
			for _, pp := range n.patterns {
				if d.match(pp.re, name) {
					evaluated = true
					if err := sub(pp.n, mv, escapeToken(name), pp.seg); err != nil {
						return err
					}
				}
			}
			if !evaluated && n.additional != nil {
				return sub(n.additional, mv, escapeToken(name), "additionalProperties")
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	if n.itemsAll != nil || n.tuple != nil || n.prefix != nil || n.items != nil {
		// item is sub for element i; indexed: the keyword location
		// names i too (a tuple's items, prefixItems).
		item := func(c *vnode, e V, i int, seg string, indexed bool) error {
			if d.valid(c.f, e) {
				return nil
			}
			if indexed {
				seg += "/" + strconv.Itoa(i)
			}
			return collectLeaves(c, d, e, inst+"/"+strconv.Itoa(i), kw+"/"+seg, w)
		}
		err := d.elements(v, func(i int, e V) error {
			if n.itemsAll != nil {
				if err := item(n.itemsAll, e, i, "items", false); err != nil {
					return err
				}
			}
			if n.tuple != nil {
				switch {
				case i < len(n.tuple):
					if err := item(n.tuple[i], e, i, "items", true); err != nil {
						return err
					}
				case n.tupleAdd != nil:
					if err := item(n.tupleAdd, e, i, "additionalItems", false); err != nil {
						return err
					}
				}
			}
			switch {
			case i < len(n.prefix):
				return item(n.prefix[i], e, i, "prefixItems", true)
			case n.items != nil:
				return item(n.items, e, i, "items", false)
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	if n.ref != nil {
		if err := sub(n.ref, v, "", "$ref"); err != nil {
			return err
		}
	}
	for i, a := range n.allOf {
		if err := sub(a, v, "", "allOf/"+strconv.Itoa(i)); err != nil {
			return err
		}
	}
	if len(w.out) == found {
		// The fast path found v invalid, and jsonschema nothing wrong.
		return fmt.Errorf("%w: no leaves at %q", errFallBack, inst)
	}
	return nil
}

// treeVals reads decoded values.
type treeVals struct{ r *run }

func (t treeVals) valid(f *fastSchema, v any) bool { return f.valid(t.r, v) }
func (treeVals) tree(v any) any                    { return v }

func (treeVals) typeOK(s *fastSchema, v any) bool {
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

func (treeVals) str(v any) (string, bool) {
	s, ok := v.(string)
	return s, ok
}

func (t treeVals) run() *run                       { return t.r }
func (t treeVals) match(p *pattern, s string) bool { return t.r.match(p, s) }

func (treeVals) members(v any, f func(string, any) error) error {
	m, _ := v.(map[string]any)
	for name, mv := range m {
		if err := f(name, mv); err != nil {
			return err
		}
	}
	return nil
}

func (treeVals) elements(v any, f func(int, any) error) error {
	a, _ := v.([]any)
	for i, e := range a {
		if err := f(i, e); err != nil {
			return err
		}
	}
	return nil
}

// tokVals reads the tokens of a body the stream path tokenized (so its
// keys have no escapes, and any value's text decodes).
type tokVals struct{ d *tokDoc }

func (t tokVals) valid(f *fastSchema, i int32) bool { return f.validTok(t.d, i) }
func (t tokVals) tree(i int32) any                  { return t.d.tree(i) }

func (t tokVals) typeOK(s *fastSchema, i int32) bool {
	switch t.d.toks[i].kind {
	case jsonscan.BeginObject:
		return s.allows(typeObject)
	case jsonscan.BeginArray:
		return s.allows(typeArray)
	case jsonscan.String:
		return s.allows(typeString)
	case jsonscan.True, jsonscan.False:
		return s.allows(typeBoolean)
	case jsonscan.Null:
		return s.allows(typeNull)
	case jsonscan.Number:
		return s.allows(typeNumber) || s.allows(typeInteger) && isInteger(t.d.num(i))
	}
	panic(fmt.Sprintf("schemas: invalid path got token %v", t.d.toks[i].kind))
}

func (t tokVals) str(i int32) (string, bool) {
	if t.d.toks[i].kind != jsonscan.String {
		return "", false
	}
	return t.d.str(i), true
}

func (t tokVals) run() *run                       { return &t.d.run }
func (t tokVals) match(p *pattern, s string) bool { return t.d.run.match(p, s) }

func (t tokVals) members(i int32, f func(string, int32) error) error {
	d := t.d
	if d.toks[i].kind != jsonscan.BeginObject {
		return nil
	}
	for j := i + 1; d.toks[j].kind == jsonscan.Key; j = d.toks[j+1].next {
		if err := f(d.str(j), j+1); err != nil {
			return err
		}
	}
	return nil
}

func (t tokVals) elements(i int32, f func(int, int32) error) error {
	d := t.d
	if d.toks[i].kind != jsonscan.BeginArray {
		return nil
	}
	idx := 0
	for j := i + 1; d.toks[j].kind != jsonscan.EndArray; j, idx = d.toks[j].next, idx+1 {
		if err := f(idx, j); err != nil {
			return err
		}
	}
	return nil
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

// jsQuote quotes s as jsonschema's messages do.
func jsQuote(s string) string {
	s = fmt.Sprintf("%q", s)
	s = strings.ReplaceAll(s, `\"`, `"`)
	s = strings.ReplaceAll(s, `'`, `\'`)
	return "'" + s[1:len(s)-1] + "'"
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
