package schemas

import (
	"encoding/json"
	"fmt"
	"hash/maphash"
	"math/big"
	"reflect"
	"sort"
	"unicode/utf8"

	"github.com/santhosh-tekuri/jsonschema/v5"
)

// The gate's fast path. jsonschema validates a message by building, for
// every schema it applies, a set of the object's property names, a scope
// entry, closures and the JSON pointer of every value it visits, whether
// the message is valid or not: most of the gate's time. A fastSchema is a
// compiled schema that only answers valid or not, with no allocation on the
// common path.
//
// It never decides alone that a message is invalid: the gate takes its
// "valid" and otherwise asks jsonschema, which gives the verdict and the
// violations. So a message passes exactly when jsonschema passes it, as
// long as the fast path never calls an invalid message valid; and it is
// exact in both directions (a "not" or an "if" inverts it), which
// TestFastPathAgrees and FuzzFastPathAgrees check against jsonschema on every
// registry schema.
//
// It is compiled from jsonschema's own compiled schema, after elideRefs, so
// $refs are resolved, patterns are the same *regexp.Regexp and formats the
// same functions jsonschema calls. A schema that uses anything outside the
// keywords below has no fast path at all (see compileFast).

// fastSchema is one compiled schema. Zero-valued limits are spelled -1, as
// in jsonschema.Schema.
type fastSchema struct {
	always int8 // a boolean schema: +1 true, -1 false; 0 checks the keywords

	types    uint8 // set of typeX bits; 0 means any
	hasConst bool
	constant any
	enum     []any
	format   func(any) bool
	// plainFormat is format's plain check (plainFormats), which the
	// token path calls on a string before format itself.
	plainFormat func(string) bool

	// objects
	minProps, maxProps int
	required           []string
	props              []fastProp
	// requiredInProps: every required name is in props, and nRequired
	// of them are distinct, so the tokens' one pass over the members can
	// count the required ones it meets.
	requiredInProps bool
	nRequired       int
	// propIndex places each name of props at propHash(name, propMul,
	// propShift), as its index plus one (see indexProps); nil when no
	// multiplier tried separates them, and prop searches.
	propIndex     []uint8
	propMul       uint32
	propShift     uint8
	propSet       map[string]bool // names in props; only with keyPass
	patternProps  []fastPattern
	additional    *fastSchema // additionalProperties as a schema
	noAdditional  bool        // additionalProperties: false
	keyPass       bool        // additional or pattern properties need a look at every member
	propertyNames *fastSchema
	depRequired   []fastDepRequired
	depSchemas    []fastDepSchema

	// arrays
	minItems, maxItems       int
	unique                   bool
	itemsAll                 *fastSchema   // items as one schema (before 2020-12)
	tuple                    []*fastSchema // items as an array (before 2020-12)
	tupleAdditional          *fastSchema   // additionalItems as a schema
	tupleNoAdditional        bool          // additionalItems: false
	prefix                   []*fastSchema // prefixItems
	items                    *fastSchema   // items (2020-12)
	contains                 *fastSchema
	minContains, maxContains int

	// strings
	minLen, maxLen int
	pattern        *pattern
	ascii          *asciiPattern // pattern without the regexp, when it can

	// numbers
	minimum, exclusiveMinimum, maximum, exclusiveMaximum, multipleOf *fastNum

	// applied to the same value
	ref                 *fastSchema
	not                 *fastSchema
	allOf, anyOf, oneOf []*fastSchema
	ifS, thenS, elseS   *fastSchema
}

// Type bits.
const (
	typeNull uint8 = 1 << iota
	typeBoolean
	typeNumber
	typeInteger
	typeString
	typeArray
	typeObject
)

var typeBits = map[string]uint8{
	"null": typeNull, "boolean": typeBoolean, "number": typeNumber, "integer": typeInteger,
	"string": typeString, "array": typeArray, "object": typeObject,
}

type fastProp struct {
	name     string
	schema   *fastSchema
	required bool // named in required (used when requiredInProps)
}

type fastPattern struct {
	re     *pattern
	schema *fastSchema
}

type fastDepRequired struct {
	name     string
	required []string
}

type fastDepSchema struct {
	name   string
	schema *fastSchema
}

// fastNum is a bound of a numeric keyword: exact as a big.Rat, and as an
// int64 when it is an integer that fits, so integer literals compare without
// math/big.
type fastNum struct {
	rat   *big.Rat
	i     int64
	isInt bool
}

func newFastNum(r *big.Rat) *fastNum {
	if r == nil {
		return nil
	}
	n := &fastNum{rat: r}
	if r.IsInt() && r.Num().IsInt64() {
		n.i, n.isInt = r.Num().Int64(), true
	}
	return n
}

// cmp compares the number literal x with n: -1, 0 or +1.
func (n *fastNum) cmp(x json.Number) int {
	if n.isInt {
		if i, ok := plainInt(string(x)); ok {
			switch {
			case i < n.i:
				return -1
			case i > n.i:
				return 1
			}
			return 0
		}
	}
	return numRat(x).Cmp(n.rat)
}

// plainInt parses a JSON number literal that is an integer of at most 18
// digits (so it fits an int64), the common case; ok is false for any other
// literal.
func plainInt(s string) (int64, bool) {
	neg := false
	if len(s) > 0 && s[0] == '-' {
		neg, s = true, s[1:]
	}
	if len(s) == 0 || len(s) > 18 {
		return 0, false
	}
	var i int64
	for j := 0; j < len(s); j++ {
		c := s[j]
		if c < '0' || c > '9' {
			return 0, false
		}
		i = i*10 + int64(c-'0')
	}
	if neg {
		i = -i
	}
	return i, true
}

// numRat is a number literal as jsonschema sees it. The decoder only lets
// valid literals with bounded exponents through.
func numRat(x json.Number) *big.Rat {
	r, ok := new(big.Rat).SetString(string(x))
	if !ok {
		// Not a JSON number: jsonschema would panic on it; never from
		// the decoder.
		panic(fmt.Sprintf("schemas: number literal %q", capLen(string(x))))
	}
	return r
}

func isInteger(x json.Number) bool {
	if _, ok := plainInt(string(x)); ok {
		return true
	}
	return numRat(x).IsInt()
}

// valid reports whether v, a value as decodeJSON returns it, is valid.
func (s *fastSchema) valid(r *run, v any) bool {
	if s.always != 0 {
		return s.always > 0
	}
	switch x := v.(type) {
	case map[string]any:
		if !s.allows(typeObject) || !s.validObject(r, x) {
			return false
		}
	case []any:
		if !s.allows(typeArray) || !s.validArray(r, x) {
			return false
		}
	case string:
		if !s.allows(typeString) || !s.validString(r, x) {
			return false
		}
	case json.Number:
		if !s.allows(typeNumber) && !(s.allows(typeInteger) && isInteger(x)) || !s.validNumber(x) {
			return false
		}
	case bool:
		if !s.allows(typeBoolean) {
			return false
		}
	case nil:
		if !s.allows(typeNull) {
			return false
		}
	default:
		panic(fmt.Sprintf("schemas: fast path got a %T", v))
	}
	if s.hasConst && !jsonEqual(v, s.constant) {
		return false
	}
	if s.enum != nil && !s.inEnum(v) {
		return false
	}
	if s.format != nil && !s.format(v) {
		return false
	}
	return s.validInPlace(r, v)
}

// allows reports whether "type" allows the type bit t.
func (s *fastSchema) allows(t uint8) bool {
	return s.types == 0 || s.types&t != 0
}

func (s *fastSchema) inEnum(v any) bool {
	for _, e := range s.enum {
		if jsonEqual(v, e) {
			return true
		}
	}
	return false
}

// validInPlace applies the schemas that apply to v itself.
func (s *fastSchema) validInPlace(r *run, v any) bool {
	if s.ref == nil && s.not == nil && s.allOf == nil && s.anyOf == nil && s.oneOf == nil && s.ifS == nil {
		return true
	}
	return s.inPlace(func(sub *fastSchema) bool { return sub.valid(r, v) })
}

// inPlace applies the schemas that apply to a value itself, through
// valid, which applies one to that value (decoded, or tokens).
func (s *fastSchema) inPlace(valid func(*fastSchema) bool) bool {
	if s.ref != nil && !valid(s.ref) {
		return false
	}
	if s.not != nil && valid(s.not) {
		return false
	}
	for _, sub := range s.allOf {
		if !valid(sub) {
			return false
		}
	}
	if s.anyOf != nil {
		ok := false
		for _, sub := range s.anyOf {
			if valid(sub) {
				ok = true
				break
			}
		}
		if !ok {
			return false
		}
	}
	if s.oneOf != nil {
		n := 0
		for _, sub := range s.oneOf {
			if valid(sub) {
				if n++; n > 1 {
					return false
				}
			}
		}
		if n != 1 {
			return false
		}
	}
	if s.ifS != nil {
		if valid(s.ifS) {
			if s.thenS != nil && !valid(s.thenS) {
				return false
			}
		} else if s.elseS != nil && !valid(s.elseS) {
			return false
		}
	}
	return true
}

func (s *fastSchema) validObject(r *run, m map[string]any) bool {
	if s.minProps >= 0 && len(m) < s.minProps || s.maxProps >= 0 && len(m) > s.maxProps {
		return false
	}
	for _, name := range s.required {
		if _, ok := m[name]; !ok {
			return false
		}
	}
	matched := 0
	for i := range s.props {
		p := &s.props[i]
		if pv, ok := m[p.name]; ok {
			matched++
			if !p.schema.valid(r, pv) {
				return false
			}
		}
	}
	if s.noAdditional && s.patternProps == nil {
		if matched != len(m) {
			return false
		}
	} else if s.keyPass {
		for k, pv := range m {
			evaluated := s.propSet[k]
			for _, pp := range s.patternProps {
				if r.match(pp.re, k) {
					evaluated = true
					if !pp.schema.valid(r, pv) {
						return false
					}
				}
			}
			if !evaluated && (s.noAdditional || s.additional != nil && !s.additional.valid(r, pv)) {
				return false
			}
		}
	}
	if s.propertyNames != nil {
		for k := range m {
			if !s.propertyNames.valid(r, k) {
				return false
			}
		}
	}
	for _, d := range s.depRequired {
		if _, ok := m[d.name]; ok {
			for _, name := range d.required {
				if _, ok := m[name]; !ok {
					return false
				}
			}
		}
	}
	for _, d := range s.depSchemas {
		if _, ok := m[d.name]; ok && !d.schema.valid(r, m) {
			return false
		}
	}
	return true
}

func (s *fastSchema) validArray(r *run, a []any) bool {
	if s.minItems >= 0 && len(a) < s.minItems || s.maxItems >= 0 && len(a) > s.maxItems {
		return false
	}
	if s.itemsAll != nil {
		for _, e := range a {
			if !s.itemsAll.valid(r, e) {
				return false
			}
		}
	}
	if s.tuple != nil {
		for i, e := range a {
			switch {
			case i < len(s.tuple):
				if !s.tuple[i].valid(r, e) {
					return false
				}
			case s.tupleAdditional != nil:
				if !s.tupleAdditional.valid(r, e) {
					return false
				}
			}
		}
		if s.tupleNoAdditional && len(a) > len(s.tuple) {
			return false
		}
	}
	for i, e := range a {
		sub := s.items
		if i < len(s.prefix) {
			sub = s.prefix[i]
		}
		if sub == nil {
			break
		}
		if !sub.valid(r, e) {
			return false
		}
	}
	if s.contains != nil && (s.minContains != -1 || s.maxContains != -1) {
		n := 0
		for _, e := range a {
			if s.contains.valid(r, e) {
				n++
			}
		}
		if s.minContains != -1 && n < s.minContains || s.maxContains != -1 && n > s.maxContains {
			return false
		}
	}
	if s.unique && hasDuplicate(a) {
		return false
	}
	return true
}

func (s *fastSchema) validString(r *run, x string) bool {
	if s.minLen > 0 || s.maxLen >= 0 && len(x) > s.maxLen {
		// Bytes bound runes from above: count only when that is not
		// enough.
		n := utf8.RuneCountInString(x)
		if s.minLen > 0 && n < s.minLen || s.maxLen >= 0 && n > s.maxLen {
			return false
		}
	}
	if s.ascii != nil {
		return s.ascii.match(x)
	}
	return s.pattern == nil || r.match(s.pattern, x)
}

func (s *fastSchema) validNumber(x json.Number) bool {
	if s.minimum != nil && s.minimum.cmp(x) < 0 {
		return false
	}
	if s.exclusiveMinimum != nil && s.exclusiveMinimum.cmp(x) <= 0 {
		return false
	}
	if s.maximum != nil && s.maximum.cmp(x) > 0 {
		return false
	}
	if s.exclusiveMaximum != nil && s.exclusiveMaximum.cmp(x) >= 0 {
		return false
	}
	if m := s.multipleOf; m != nil {
		if i, ok := plainInt(string(x)); ok && m.isInt {
			return i%m.i == 0
		}
		return new(big.Rat).Quo(numRat(x), m.rat).IsInt()
	}
	return true
}

// jsonEqual is jsonschema's equality of decoded JSON values: numbers by
// value ("1", "1.0" and "1e0" are equal), objects regardless of order.
func jsonEqual(a, b any) bool {
	switch x := a.(type) {
	case nil:
		return b == nil
	case bool:
		y, ok := b.(bool)
		return ok && x == y
	case string:
		y, ok := b.(string)
		return ok && x == y
	case json.Number:
		y, ok := b.(json.Number)
		return ok && numEqual(x, y)
	case []any:
		y, ok := b.([]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for i := range x {
			if !jsonEqual(x[i], y[i]) {
				return false
			}
		}
		return true
	case map[string]any:
		y, ok := b.(map[string]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for k, xv := range x {
			yv, ok := y[k]
			if !ok || !jsonEqual(xv, yv) {
				return false
			}
		}
		return true
	}
	panic(fmt.Sprintf("schemas: fast path got a %T", a))
}

func numEqual(x, y json.Number) bool {
	if x == y {
		return true
	}
	i, xok := plainInt(string(x))
	j, yok := plainInt(string(y))
	if xok && yok {
		return i == j
	}
	return numRat(x).Cmp(numRat(y)) == 0
}

// hasDuplicate reports whether two elements of a are jsonEqual. Up to 20
// elements are compared pairwise; beyond that, by hash (jsonschema's own
// split), so a huge array costs linear time.
func hasDuplicate(a []any) bool {
	if len(a) <= 20 {
		for i := 1; i < len(a); i++ {
			for j := 0; j < i; j++ {
				if jsonEqual(a[i], a[j]) {
					return true
				}
			}
		}
		return false
	}
	seed := maphash.MakeSeed()
	seen := make(map[uint64][]int, len(a))
	for i, e := range a {
		h := jsonHash(seed, e)
		for _, j := range seen[h] {
			if jsonEqual(a[j], e) {
				return true
			}
		}
		seen[h] = append(seen[h], i)
	}
	return false
}

// jsonHash hashes a decoded JSON value so that jsonEqual values hash alike.
func jsonHash(seed maphash.Seed, v any) uint64 {
	const (
		tagNull = iota + 0x9e3779b97f4a7c15
		tagFalse
		tagTrue
		tagArray
		tagObject
	)
	switch x := v.(type) {
	case nil:
		return tagNull
	case bool:
		if x {
			return tagTrue
		}
		return tagFalse
	case string:
		return maphash.String(seed, x)
	case json.Number:
		// The canonical form: an integer literal without "-0", else
		// the exact fraction ("7/2"), which is "3" for "3.0".
		if i, ok := plainInt(string(x)); ok {
			return mix(uint64(i) ^ tagNull)
		}
		r := numRat(x)
		if r.IsInt() && r.Num().IsInt64() {
			return mix(uint64(r.Num().Int64()) ^ tagNull)
		}
		return maphash.String(seed, "#"+r.RatString())
	case []any:
		h := uint64(tagArray)
		for _, e := range x {
			h = mix(h ^ jsonHash(seed, e))
		}
		return h
	case map[string]any:
		// A sum of per-member hashes: independent of order.
		h := uint64(tagObject)
		for k, e := range x {
			h += mix(maphash.String(seed, k) ^ mix(jsonHash(seed, e)))
		}
		return h
	}
	panic(fmt.Sprintf("schemas: fast path got a %T", v))
}

// mix is the splitmix64 finalizer.
func mix(h uint64) uint64 {
	h ^= h >> 30
	h *= 0xbf58476d1ce4e5b9
	h ^= h >> 27
	h *= 0x94d049bb133111eb
	return h ^ h>>31
}

// compileFast compiles each root for the fast path. A root that uses a
// keyword the fast path does not implement, or that jsonschema would report
// as an infinite loop, maps to nil, with the reason in why (for tests).
func compileFast(roots []*jsonschema.Schema, formats map[string]func(any) bool) (fast map[*jsonschema.Schema]*fastSchema, why map[*jsonschema.Schema]error) {
	fast = map[*jsonschema.Schema]*fastSchema{}
	why = map[*jsonschema.Schema]error{}
	for _, root := range roots {
		c := fastCompiler{done: map[*jsonschema.Schema]*fastSchema{}, formats: formats}
		f, err := c.compile(root)
		if err == nil {
			err = inPlaceLoop(root)
		}
		if err != nil {
			why[root] = err
			continue
		}
		fast[root] = f
	}
	return fast, why
}

type fastCompiler struct {
	done    map[*jsonschema.Schema]*fastSchema
	formats map[string]func(any) bool
}

// fastFields are the jsonschema.Schema fields the fast path implements or
// that cannot change a verdict without one it rejects. Every other field
// must hold its zero value: a field added by a later jsonschema version is
// assumed to matter.
var fastFields = map[string]bool{
	"Location": true, "Draft": true, "meta": true, "vocab": true,
	// Only $dynamicRef and $recursiveRef, which are rejected, read these.
	"dynamicAnchors": true, "RecursiveAnchor": true, "DynamicAnchor": true, "dynamicRefAnchor": true,
	"Format": true, "format": true, "Always": true, "Ref": true, "Types": true, "Constant": true,
	"Enum": true, "enumError": true, "Not": true, "AllOf": true, "AnyOf": true, "OneOf": true,
	"If": true, "Then": true, "Else": true,
	"MinProperties": true, "MaxProperties": true, "Required": true, "Properties": true,
	"PropertyNames": true, "PatternProperties": true, "AdditionalProperties": true,
	"Dependencies": true, "DependentRequired": true, "DependentSchemas": true,
	"MinItems": true, "MaxItems": true, "UniqueItems": true, "Items": true, "AdditionalItems": true,
	"PrefixItems": true, "Items2020": true, "Contains": true, "MinContains": true, "MaxContains": true,
	// Only unevaluatedItems, which is rejected, reads it.
	"ContainsEval": true,
	"MinLength":    true, "MaxLength": true, "Pattern": true,
	// Asserted only through decoder and mediaType, which must be nil.
	"ContentEncoding": true, "ContentMediaType": true, "ContentSchema": true,
	"Minimum": true, "ExclusiveMinimum": true, "Maximum": true, "ExclusiveMaximum": true, "MultipleOf": true,
	"Title": true, "Description": true, "Default": true, "Comment": true,
	"ReadOnly": true, "WriteOnly": true, "Examples": true, "Deprecated": true,
}

// unsupported names the first field of s the fast path does not implement
// and that is set, or "".
func unsupported(s *jsonschema.Schema) string {
	v := reflect.ValueOf(s).Elem()
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		name := t.Field(i).Name
		if !fastFields[name] && !v.Field(i).IsZero() {
			return name
		}
	}
	return ""
}

func (c *fastCompiler) compile(s *jsonschema.Schema) (*fastSchema, error) {
	if s == nil {
		return nil, nil
	}
	if f, ok := c.done[s]; ok {
		return f, nil // compiled, or being compiled higher up (recursion)
	}
	if name := unsupported(s); name != "" {
		return nil, fmt.Errorf("%s: %s is not on the fast path", s.Location, name)
	}
	f := &fastSchema{
		minProps: s.MinProperties, maxProps: s.MaxProperties,
		minItems: s.MinItems, maxItems: s.MaxItems, unique: s.UniqueItems,
		minContains: s.MinContains, maxContains: s.MaxContains,
		minLen: s.MinLength, maxLen: s.MaxLength, ascii: newASCIIPattern(s.Pattern),
		minimum: newFastNum(s.Minimum), exclusiveMinimum: newFastNum(s.ExclusiveMinimum),
		maximum: newFastNum(s.Maximum), exclusiveMaximum: newFastNum(s.ExclusiveMaximum),
		multipleOf: newFastNum(s.MultipleOf),
	}
	if s.Pattern != nil {
		f.pattern = newPattern(s.Pattern)
	}
	c.done[s] = f
	if s.Always != nil {
		f.always = -1
		if *s.Always {
			f.always = 1
		}
		return f, nil
	}
	var err error
	one := func(sub *jsonschema.Schema) *fastSchema {
		var fs *fastSchema
		if err == nil {
			fs, err = c.compile(sub)
		}
		return fs
	}
	all := func(subs []*jsonschema.Schema) []*fastSchema {
		if subs == nil {
			return nil
		}
		out := make([]*fastSchema, len(subs))
		for i, sub := range subs {
			out[i] = one(sub)
		}
		return out
	}

	for _, t := range s.Types {
		bit, ok := typeBits[t]
		if !ok {
			return nil, fmt.Errorf("%s: type %q", s.Location, t)
		}
		f.types |= bit
	}
	if len(s.Constant) > 0 {
		if !decoded(s.Constant[0]) {
			return nil, fmt.Errorf("%s: const of %T", s.Location, s.Constant[0])
		}
		f.hasConst, f.constant = true, s.Constant[0]
	}
	if len(s.Enum) > 0 {
		for _, e := range s.Enum {
			if !decoded(e) {
				return nil, fmt.Errorf("%s: enum value of %T", s.Location, e)
			}
		}
		f.enum = s.Enum
	}
	if err := c.compileFormat(s, f); err != nil {
		return nil, err
	}
	if s.MultipleOf != nil && s.MultipleOf.Sign() == 0 {
		return nil, fmt.Errorf("%s: multipleOf 0", s.Location)
	}

	// objects
	f.required = s.Required
	names := make([]string, 0, len(s.Properties))
	for name := range s.Properties {
		names = append(names, name)
	}
	sort.Strings(names) // a stable layout; the verdict does not depend on it
	req := map[string]bool{}
	for _, name := range s.Required {
		req[name] = true
	}
	for _, name := range names {
		f.props = append(f.props, fastProp{name: name, schema: one(s.Properties[name]), required: req[name]})
		delete(req, name)
	}
	f.indexProps()
	f.requiredInProps, f.nRequired = len(req) == 0, len(f.required)
	if f.requiredInProps {
		f.nRequired = 0
		for _, p := range f.props {
			if p.required {
				f.nRequired++
			}
		}
	}
	for re, sub := range s.PatternProperties {
		f.patternProps = append(f.patternProps, fastPattern{re: newPattern(re), schema: one(sub)})
	}
	forbid, sub, ok := boolOrSchema(s.AdditionalProperties)
	if !ok {
		return nil, fmt.Errorf("%s: additionalProperties of %T", s.Location, s.AdditionalProperties)
	}
	f.noAdditional, f.additional = forbid, one(sub)
	if f.patternProps != nil || f.additional != nil {
		f.keyPass = true
		f.propSet = make(map[string]bool, len(names))
		for _, name := range names {
			f.propSet[name] = true
		}
	}
	f.propertyNames = one(s.PropertyNames)
	for name, d := range s.Dependencies {
		switch d := d.(type) {
		case []string:
			f.depRequired = append(f.depRequired, fastDepRequired{name, d})
		case *jsonschema.Schema:
			f.depSchemas = append(f.depSchemas, fastDepSchema{name, one(d)})
		default:
			return nil, fmt.Errorf("%s: dependency of %T", s.Location, d)
		}
	}
	for name, req := range s.DependentRequired {
		f.depRequired = append(f.depRequired, fastDepRequired{name, req})
	}
	for name, sub := range s.DependentSchemas {
		f.depSchemas = append(f.depSchemas, fastDepSchema{name, one(sub)})
	}

	// arrays
	switch items := s.Items.(type) {
	case nil:
	case *jsonschema.Schema:
		f.itemsAll = one(items)
	case []*jsonschema.Schema:
		f.tuple = all(items)
		if f.tuple == nil {
			f.tuple = []*fastSchema{}
		}
		forbid, sub, ok := boolOrSchema(s.AdditionalItems)
		if !ok {
			return nil, fmt.Errorf("%s: additionalItems of %T", s.Location, s.AdditionalItems)
		}
		f.tupleNoAdditional, f.tupleAdditional = forbid, one(sub)
	default:
		return nil, fmt.Errorf("%s: items of %T", s.Location, items)
	}
	f.prefix = all(s.PrefixItems)
	f.items = one(s.Items2020)
	f.contains = one(s.Contains)

	// applied to the same value
	f.ref = one(s.Ref)
	f.not = one(s.Not)
	f.allOf = all(s.AllOf)
	f.anyOf = all(s.AnyOf)
	f.oneOf = all(s.OneOf)
	f.ifS, f.thenS, f.elseS = one(s.If), one(s.Then), one(s.Else)
	if err != nil {
		return nil, err
	}
	return f, nil
}

// indexProps builds s.propIndex: a table of a power of two places, two to
// eight per property, where each property's name hashes to a place of its
// own (a perfect hash), so that finding a member's property is one hash and
// one comparison, where a binary search compared strings several times for
// every member of every object. The hash reads a name's length and three of
// its bytes; names it cannot tell apart leave s without a table.
func (s *fastSchema) indexProps() {
	n := len(s.props)
	if n == 0 || n > 255 {
		return
	}
	bits := uint8(1)
	for 1<<bits < 2*n {
		bits++
	}
	for size := bits; size <= bits+2; size++ {
		table := make([]uint8, 1<<size)
	next:
		for k := uint32(0); k < 64; k++ {
			mul := propMuls[k%uint32(len(propMuls))] + 2*(k/uint32(len(propMuls)))*0x10001
			clear(table)
			for i := range s.props {
				h := propHash(s.props[i].name, mul, 32-size)
				if table[h] != 0 {
					continue next
				}
				table[h] = uint8(i + 1)
			}
			s.propIndex, s.propMul, s.propShift = table, mul, 32-size
			return
		}
	}
}

// propMuls are odd multipliers for propHash to try.
var propMuls = [...]uint32{0x9e3779b1, 0x85ebca77, 0xc2b2ae3d, 0x27d4eb2f, 0x165667b1, 0xd3a2646d, 0xfd7046c5, 0xb55a4f09}

// propHash is the place of name in a table of 1<<(32-shift) places: its
// length and its first, middle and last bytes, multiplied by mul, top bits.
func propHash(name string, mul uint32, shift uint8) uint32 {
	x := uint32(len(name))
	if n := len(name); n > 0 {
		x ^= uint32(name[0])<<8 | uint32(name[n/2])<<16 | uint32(name[n-1])<<24
	}
	return (x * mul) >> shift
}

// boolOrSchema reads additionalProperties or additionalItems: nil, false
// (forbid) or a schema; ok is false for anything else.
func boolOrSchema(x any) (forbid bool, sub *jsonschema.Schema, ok bool) {
	switch x := x.(type) {
	case nil:
		return false, nil, true
	case bool:
		return !x, nil, true
	case *jsonschema.Schema:
		return false, x, true
	}
	return false, nil, false
}

// compileFormat takes the same checker jsonschema compiled into s: the
// compiler's own for the name, else jsonschema.Formats'. If s asserts a
// format the fast path cannot find, it has no fast path.
func (c *fastCompiler) compileFormat(s *jsonschema.Schema, f *fastSchema) error {
	asserted := !reflect.ValueOf(s).Elem().FieldByName("format").IsNil()
	if !asserted {
		return nil
	}
	fn := c.formats[s.Format]
	if fn != nil {
		// registerFormats' checker, which asks plainFormats first.
		f.plainFormat = plainFormats[s.Format]
	}
	if fn == nil {
		fn = jsonschema.Formats[s.Format]
	}
	if fn == nil {
		return fmt.Errorf("%s: format %q has no checker here", s.Location, s.Format)
	}
	f.format = fn
	return nil
}

// decoded reports whether v holds only the types decodeJSON produces, which
// jsonEqual compares exactly as jsonschema does.
func decoded(v any) bool {
	switch x := v.(type) {
	case nil, bool, string, json.Number:
		return true
	case []any:
		for _, e := range x {
			if !decoded(e) {
				return false
			}
		}
		return true
	case map[string]any:
		for _, e := range x {
			if !decoded(e) {
				return false
			}
		}
		return true
	}
	return false
}

// inPlaceLoop finds a schema that applies itself to the same value through
// $ref, allOf, anyOf, oneOf, not, if/then/else or dependent schemas:
// jsonschema reports that as an infinite loop, which the fast path does not
// imitate. A schema reached again through a property or an item is applied
// to a smaller value: that is recursion, not a loop.
func inPlaceLoop(root *jsonschema.Schema) error {
	// Every schema reachable from root, through any keyword.
	var all []*jsonschema.Schema
	seen := map[*jsonschema.Schema]bool{}
	var reach func(s *jsonschema.Schema)
	reach = func(s *jsonschema.Schema) {
		if s == nil || seen[s] {
			return
		}
		seen[s] = true
		all = append(all, s)
		inPlace, child := subschemas(s)
		for _, sub := range inPlace {
			reach(sub)
		}
		for _, sub := range child {
			reach(sub)
		}
	}
	reach(root)

	// A cycle of in-place edges only.
	const (
		visiting = 1
		done     = 2
	)
	state := map[*jsonschema.Schema]int{}
	var visit func(s *jsonschema.Schema) error
	visit = func(s *jsonschema.Schema) error {
		switch state[s] {
		case visiting:
			return fmt.Errorf("%s applies itself to the same value", s.Location)
		case done:
			return nil
		}
		state[s] = visiting
		inPlace, _ := subschemas(s)
		for _, sub := range inPlace {
			if err := visit(sub); err != nil {
				return err
			}
		}
		state[s] = done
		return nil
	}
	for _, s := range all {
		if err := visit(s); err != nil {
			return err
		}
	}
	return nil
}

// subschemas lists the non-nil schemas s applies to the same value and to
// its members or elements.
func subschemas(s *jsonschema.Schema) (inPlace, child []*jsonschema.Schema) {
	add := func(list *[]*jsonschema.Schema, subs ...*jsonschema.Schema) {
		for _, sub := range subs {
			if sub != nil {
				*list = append(*list, sub)
			}
		}
	}
	add(&inPlace, s.Ref, s.Not, s.If, s.Then, s.Else)
	add(&inPlace, s.AllOf...)
	add(&inPlace, s.AnyOf...)
	add(&inPlace, s.OneOf...)
	for _, d := range s.Dependencies {
		if sub, ok := d.(*jsonschema.Schema); ok {
			add(&inPlace, sub)
		}
	}
	for _, sub := range s.DependentSchemas {
		add(&inPlace, sub)
	}
	for _, sub := range s.Properties {
		add(&child, sub)
	}
	for _, sub := range s.PatternProperties {
		add(&child, sub)
	}
	add(&child, s.PropertyNames, s.Items2020, s.Contains)
	add(&child, s.PrefixItems...)
	for _, x := range []any{s.AdditionalProperties, s.Items, s.AdditionalItems} {
		switch x := x.(type) {
		case *jsonschema.Schema:
			add(&child, x)
		case []*jsonschema.Schema:
			add(&child, x...)
		}
	}
	return inPlace, child
}
