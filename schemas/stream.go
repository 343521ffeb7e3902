package schemas

import (
	"encoding/json"
	"math"
	"strconv"
	"strings"
	"sync"
	"unsafe"

	"github.com/dlxbridge/dlxbridge/internal/jsonscan"
)

// The gate's tree-free path. Building the map[string]any tree of a message
// (decodeJSON) cost more than validating it, and most handlers never read
// the tree: they Bind the text. So for a message the gate passes, it
// tokenizes the body once into a flat, pooled list of tokens (each
// container knowing where it ends), checks everything decodeJSON checks
// (syntax, UTF-8, surrogates, depth, number size, duplicate keys), and runs
// the fast path over the tokens: a schema applied in place (allOf, not, if,
// $ref...) just reads the same tokens again.
//
// Like the fast path it only ever says "valid": anything else (a syntax
// error, a duplicate key, an identity it cannot read, an invalid verdict, a
// body shape it does not handle) sends the gate down the tree path, which
// gives the verdict and the error exactly as before; only an invalid
// verdict with FromProperties, where the tree path would validate this
// same body against this same schema, gets its error here, from the
// invalid path on the tokens (see vnode). So it must never pass
// a message the tree path refuses; FuzzStreamAgrees checks that against the
// tree path and jsonschema on every registry schema.
//
// The few keywords that look at a whole object or array (enum, const,
// uniqueItems, a format applied to a container) decode just that value with
// decodeJSON, from its text.

// maxStreamMembers bounds an object's members on this path: duplicate keys
// are found by comparing each key with the earlier ones. A wider object
// takes the tree path (a map).
const maxStreamMembers = 64

// maxStreamTokens bounds the tokens of a body on this path, so that a huge
// body the tree path will refuse anyway (half a million array elements
// where the schema allows 500) costs little memory here first. A valid
// body with more takes the tree path, as before.
const maxStreamTokens = 1 << 15

// stok is one token of a tokenized document. A key is followed by its
// value; a container's members or elements follow it, then its end token.
type stok struct {
	kind    jsonscan.Kind
	escaped bool
	// start, end: the token's bytes; for an array or object, the whole
	// value's.
	start, end int32
	// next is the index of the token after this value (after a
	// container's end token).
	next int32
	// n is a container's number of members or elements.
	n int32
}

// tokDoc is a body tokenized by tokenize.
type tokDoc struct {
	data  []byte
	src   string // data as a string, without a copy: read only during Check
	toks  []stok
	stack []int32
	// run is the check's pattern work (see match.go), for every path
	// of the check, tokens or tree.
	run run
}

var tokDocs = sync.Pool{New: func() any { return &tokDoc{toks: make([]stok, 0, 256), stack: make([]int32, 0, 16)} }}

func getTokDoc() *tokDoc { return tokDocs.Get().(*tokDoc) }

// release returns d to the pool; nothing of it may be used after.
func (d *tokDoc) release() {
	if cap(d.toks) > maxStreamTokens {
		return // an unusually large body: let it go
	}
	d.data, d.src, d.toks, d.stack = nil, "", d.toks[:0], d.stack[:0]
	d.run.reset()
	tokDocs.Put(d)
}

// tokenize reads data as decodeJSON would, and reports whether decodeJSON
// accepts it and this path can handle it (no escaped key, no object wider
// than maxStreamMembers). On true, d holds its tokens.
func (d *tokDoc) tokenize(data []byte) bool {
	if len(data) >= math.MaxInt32 {
		return false
	}
	d.data, d.toks, d.stack = data, d.toks[:0], d.stack[:0]
	d.src = unsafe.String(unsafe.SliceData(data), len(data))
	sc := jsonscan.Strict(data, maxDepth)
	for {
		t, err := sc.Next()
		if err != nil {
			return false
		}
		i := int32(len(d.toks))
		if i >= maxStreamTokens {
			return false
		}
		switch t.Kind {
		case jsonscan.EOF:
			return len(d.toks) > 0 && len(d.stack) == 0
		case jsonscan.BeginObject, jsonscan.BeginArray:
			d.toks = append(d.toks, stok{kind: t.Kind, start: int32(t.Start)})
			d.stack = append(d.stack, i)
			continue
		case jsonscan.EndObject, jsonscan.EndArray:
			top := d.stack[len(d.stack)-1]
			d.stack = d.stack[:len(d.stack)-1]
			d.toks = append(d.toks, stok{kind: t.Kind, start: int32(t.Start), end: int32(t.End), next: i + 1})
			c := &d.toks[top]
			c.end, c.next = int32(t.End), i+1
		case jsonscan.Key:
			if t.Escaped {
				return false
			}
			obj := d.stack[len(d.stack)-1]
			if d.toks[obj].n >= maxStreamMembers {
				return false
			}
			key := data[t.Start:t.End]
			for j := obj + 1; j < i; j = d.toks[j+1].next {
				k := &d.toks[j]
				if int(k.end-k.start) == len(key) && string(data[k.start:k.end]) == string(key) {
					return false // a duplicate key: the tree path says so
				}
			}
			d.toks = append(d.toks, stok{kind: jsonscan.Key, start: int32(t.Start), end: int32(t.End), next: i + 1})
			continue
		default:
			d.toks = append(d.toks, stok{kind: t.Kind, escaped: t.Escaped, start: int32(t.Start), end: int32(t.End), next: i + 1})
		}
		// A value ended: count it in its container.
		if len(d.stack) > 0 {
			d.toks[d.stack[len(d.stack)-1]].n++
		}
	}
}

// text is the bytes of the value at i.
func (d *tokDoc) text(i int32) []byte {
	t := &d.toks[i]
	return d.data[t.start:t.end]
}

// str is the content of the string or key at i. Without escapes it is a
// view of the body, valid only during Check.
func (d *tokDoc) str(i int32) string {
	t := &d.toks[i]
	if !t.escaped {
		return d.src[t.start+1 : t.end-1]
	}
	sc := jsonscan.New(d.data[t.start:t.end])
	tk, _ := sc.Next()
	return string(sc.Text(tk))
}

// num is the number at i, a view of the body.
func (d *tokDoc) num(i int32) json.Number {
	t := &d.toks[i]
	return json.Number(d.src[t.start:t.end])
}

// tree decodes the value at i as decodeJSON does (its text was accepted
// already).
func (d *tokDoc) tree(i int32) any {
	v, err := decodeJSON(d.text(i))
	if err != nil {
		panic("schemas: tokenized text does not decode: " + err.Error())
	}
	return v
}

// scalar is the scalar at i as decodeJSON returns it; for a container, its
// tree.
func (d *tokDoc) value(i int32) any {
	switch d.toks[i].kind {
	case jsonscan.String, jsonscan.Key:
		return strings.Clone(d.str(i))
	case jsonscan.Number:
		return json.Number(strings.Clone(string(d.num(i))))
	case jsonscan.True:
		return true
	case jsonscan.False:
		return false
	case jsonscan.Null:
		return nil
	}
	return d.tree(i)
}

// member finds the value of the top-level object member key in the object
// at i: its token index, or -1.
func (d *tokDoc) member(i int32, key string) int32 {
	for j := i + 1; d.toks[j].kind == jsonscan.Key; j = d.toks[j+1].next {
		if d.str(j) == key {
			return j + 1
		}
	}
	return -1
}

// pointer resolves a JSON pointer as lookupPointer does; -1 if it does not.
func (d *tokDoc) pointer(ptr string) int32 {
	if ptr == "" {
		return 0
	}
	if ptr[0] != '/' {
		return -1
	}
	i := int32(0)
	for _, tok := range strings.Split(ptr[1:], "/") {
		tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
		switch d.toks[i].kind {
		case jsonscan.BeginObject:
			if i = d.member(i, tok); i < 0 {
				return -1
			}
		case jsonscan.BeginArray:
			// As lookupPointer reads an index.
			n, err := strconv.Atoi(tok)
			if err != nil || n < 0 || n >= int(d.toks[i].n) || (len(tok) > 1 && tok[0] == '0') {
				return -1
			}
			j := i + 1
			for ; n > 0; n-- {
				j = d.toks[j].next
			}
			i = j
		default:
			return -1
		}
	}
	return i
}

// validTok is valid for the value at token i.
func (s *fastSchema) validTok(d *tokDoc, i int32) bool {
	if s.always != 0 {
		return s.always > 0
	}
	switch d.toks[i].kind {
	case jsonscan.BeginObject:
		if !s.allows(typeObject) || !s.validObjectTok(d, i) {
			return false
		}
	case jsonscan.BeginArray:
		if !s.allows(typeArray) || !s.validArrayTok(d, i) {
			return false
		}
	case jsonscan.String, jsonscan.Key:
		if !s.allows(typeString) || !s.validString(&d.run, d.str(i)) {
			return false
		}
	case jsonscan.Number:
		x := d.num(i)
		if !s.allows(typeNumber) && !(s.allows(typeInteger) && isInteger(x)) || !s.validNumber(x) {
			return false
		}
	case jsonscan.True, jsonscan.False:
		if !s.allows(typeBoolean) {
			return false
		}
	case jsonscan.Null:
		if !s.allows(typeNull) {
			return false
		}
	default:
		panic("schemas: stream path at a non-value token")
	}
	if s.hasConst && !d.equal(i, s.constant) {
		return false
	}
	if s.enum != nil {
		ok := false
		for _, e := range s.enum {
			if d.equal(i, e) {
				ok = true
				break
			}
		}
		if !ok {
			return false
		}
	}
	if s.format != nil && !s.formatTok(d, i) {
		return false
	}
	return s.validInPlaceTok(d, i)
}

// formatTok is s.format of the value at i: a string its plain check
// accepts is valid without passing it as an any.
func (s *fastSchema) formatTok(d *tokDoc, i int32) bool {
	if k := d.toks[i].kind; s.plainFormat != nil && (k == jsonscan.String || k == jsonscan.Key) && s.plainFormat(d.str(i)) {
		return true
	}
	return s.format(d.formatArg(i))
}

// formatArg is the value at i as a format checker gets it from the tree
// path. A string is a view of the body: the checkers (jsonschema's and this
// package's) do not keep it.
func (d *tokDoc) formatArg(i int32) any {
	switch d.toks[i].kind {
	case jsonscan.String, jsonscan.Key:
		return d.str(i)
	case jsonscan.Number:
		return d.num(i)
	}
	return d.value(i)
}

// equal is jsonEqual of the value at i and c.
func (d *tokDoc) equal(i int32, c any) bool {
	switch d.toks[i].kind {
	case jsonscan.String, jsonscan.Key:
		y, ok := c.(string)
		return ok && d.str(i) == y
	case jsonscan.Number:
		y, ok := c.(json.Number)
		return ok && numEqual(d.num(i), y)
	case jsonscan.True:
		y, ok := c.(bool)
		return ok && y
	case jsonscan.False:
		y, ok := c.(bool)
		return ok && !y
	case jsonscan.Null:
		return c == nil
	case jsonscan.BeginObject:
		if y, ok := c.(map[string]any); !ok || len(y) != int(d.toks[i].n) {
			return false
		}
	case jsonscan.BeginArray:
		if y, ok := c.([]any); !ok || len(y) != int(d.toks[i].n) {
			return false
		}
	}
	return jsonEqual(d.tree(i), c)
}

func (s *fastSchema) validInPlaceTok(d *tokDoc, i int32) bool {
	if s.ref == nil && s.not == nil && s.allOf == nil && s.anyOf == nil && s.oneOf == nil && s.ifS == nil {
		return true
	}
	return s.inPlace(func(sub *fastSchema) bool { return sub.validTok(d, i) })
}

// prop finds name in s.props (sorted by name): at one place of s.propIndex
// if it has one, else by binary search.
func (s *fastSchema) prop(name string) *fastProp {
	if s.propIndex != nil {
		if j := s.propIndex[propHash(name, s.propMul, s.propShift)]; j != 0 && s.props[j-1].name == name {
			return &s.props[j-1]
		}
		return nil
	}
	lo, hi := 0, len(s.props)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if s.props[m].name < name {
			lo = m + 1
		} else {
			hi = m
		}
	}
	if lo < len(s.props) && s.props[lo].name == name {
		return &s.props[lo]
	}
	return nil
}

func (s *fastSchema) validObjectTok(d *tokDoc, i int32) bool {
	n := int(d.toks[i].n)
	if s.minProps >= 0 && n < s.minProps || s.maxProps >= 0 && n > s.maxProps {
		return false
	}
	if !s.requiredInProps {
		for _, name := range s.required {
			if d.member(i, name) < 0 {
				return false
			}
		}
	}
	required := 0 // required members met (keys are unique)
	for j := i + 1; d.toks[j].kind == jsonscan.Key; j = d.toks[j+1].next {
		k := d.str(j)
		p := s.prop(k)
		if p != nil {
			if p.required {
				required++
			}
			if !p.schema.validTok(d, j+1) {
				return false
			}
		}
		evaluated := p != nil
		for _, pp := range s.patternProps {
			if d.run.match(pp.re, k) {
				evaluated = true
				if !pp.schema.validTok(d, j+1) {
					return false
				}
			}
		}
		if !evaluated && (s.noAdditional || s.additional != nil && !s.additional.validTok(d, j+1)) {
			return false
		}
		if s.propertyNames != nil && !s.propertyNames.validTok(d, j) {
			return false
		}
	}
	if s.requiredInProps && required != s.nRequired {
		return false
	}
	for _, dr := range s.depRequired {
		if d.member(i, dr.name) >= 0 {
			for _, name := range dr.required {
				if d.member(i, name) < 0 {
					return false
				}
			}
		}
	}
	for _, ds := range s.depSchemas {
		if d.member(i, ds.name) >= 0 && !ds.schema.validTok(d, i) {
			return false
		}
	}
	return true
}

func (s *fastSchema) validArrayTok(d *tokDoc, i int32) bool {
	n := int(d.toks[i].n)
	if s.minItems >= 0 && n < s.minItems || s.maxItems >= 0 && n > s.maxItems {
		return false
	}
	if s.tupleNoAdditional && s.tuple != nil && n > len(s.tuple) {
		return false
	}
	contained := 0
	idx := 0
	for j := i + 1; d.toks[j].kind != jsonscan.EndArray; j, idx = d.toks[j].next, idx+1 {
		if s.itemsAll != nil && !s.itemsAll.validTok(d, j) {
			return false
		}
		if s.tuple != nil {
			switch {
			case idx < len(s.tuple):
				if !s.tuple[idx].validTok(d, j) {
					return false
				}
			case s.tupleAdditional != nil:
				if !s.tupleAdditional.validTok(d, j) {
					return false
				}
			}
		}
		sub := s.items
		if idx < len(s.prefix) {
			sub = s.prefix[idx]
		}
		if sub != nil && !sub.validTok(d, j) {
			return false
		}
		if s.contains != nil && (s.minContains != -1 || s.maxContains != -1) && s.contains.validTok(d, j) {
			contained++
		}
	}
	if s.contains != nil && (s.minContains != -1 || s.maxContains != -1) {
		if s.minContains != -1 && contained < s.minContains || s.maxContains != -1 && contained > s.maxContains {
			return false
		}
	}
	if s.unique && n > 1 {
		a, _ := d.tree(i).([]any)
		if hasDuplicate(a) {
			return false
		}
	}
	return true
}

// envelope reads the identity of a FromEnvelope body as fromEnvelope does,
// and the index of its "data" member; false wherever fromEnvelope fails.
func (d *tokDoc) envelope() (typ, version string, data int32, ok bool) {
	if d.toks[0].kind != jsonscan.BeginObject {
		return "", "", 0, false
	}
	ti := d.member(0, "type")
	if ti < 0 || d.toks[ti].kind != jsonscan.String {
		return "", "", 0, false
	}
	if typ = d.value(ti).(string); strings.TrimSpace(typ) == "" {
		return "", "", 0, false
	}
	sv, ds := d.member(0, "schemaVersion"), d.member(0, "dataschema")
	if sv < 0 && ds < 0 {
		return "", "", 0, false
	}
	if sv >= 0 {
		if version, ok = versionString(d.value(sv)); !ok {
			return "", "", 0, false
		}
	}
	if ds >= 0 {
		if d.toks[ds].kind != jsonscan.String {
			return "", "", 0, false
		}
		dv, ok := versionFromDataschema(d.str(ds))
		if !ok || sv >= 0 && dv != version {
			return "", "", 0, false
		}
		version = strings.Clone(dv)
	}
	if data = d.member(0, "data"); data < 0 {
		return "", "", 0, false
	}
	return typ, version, data, true
}

// identity reads a FromPointer body's type and version as
// Gate.fromPointer does; false wherever that fails.
func (d *tokDoc) identity(typePtr, versionPtr string) (typ, version string, ok bool) {
	ti := d.pointer(typePtr)
	if ti < 0 || d.toks[ti].kind != jsonscan.String {
		return "", "", false
	}
	if typ = d.value(ti).(string); strings.TrimSpace(typ) == "" {
		return "", "", false
	}
	vi := d.pointer(versionPtr)
	if vi < 0 {
		return "", "", false
	}
	version, ok = versionString(d.value(vi))
	return typ, version, ok
}
