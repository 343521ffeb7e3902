package schemas

import (
	"encoding/json"
	"maps"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v5"
)

// fastCase is one schema with a fast path, and jsonschema's compiled form.
type fastCase struct {
	name string
	slow *jsonschema.Schema
	fast *fastSchema
}

var (
	fastOnce  sync.Once
	fastCases []fastCase
	fastErr   error
)

// fastPathCases loads the embedded registry and testdata/fastpath (schemas
// that use every keyword the fast path implements) and returns every schema
// of both. Each must have a fast path.
func fastPathCases(t testing.TB) []fastCase {
	t.Helper()
	fastOnce.Do(func() {
		for _, opts := range []LoadOptions{{}, {Dir: filepath.Join("testdata", "fastpath"), NoEmbedded: true}} {
			r, err := Load(opts)
			if err != nil {
				fastErr = err
				return
			}
			for _, ref := range r.Refs() {
				s, _ := r.Lookup(ref.Type, ref.Version)
				fastCases = append(fastCases, fastCase{ref.Type + " v" + ref.Version, s, r.fast[s]})
				if r.fast[s] == nil {
					fastErr = r.noFast[s]
					return
				}
			}
		}
	})
	if fastErr != nil {
		t.Fatalf("a schema has no fast path: %v", fastErr)
	}
	return fastCases
}

// agree fails unless the fast path and jsonschema agree on doc.
func agree(t testing.TB, c fastCase, doc any) {
	t.Helper()
	want := c.slow.Validate(doc) == nil
	if got := c.fast.valid(nil, doc); got != want {
		t.Errorf("%s: %s: fast path says valid=%v, jsonschema %v", c.name, mustJSON(doc), got, want)
	}
}

// fastInstances exercise testdata/fastpath; each is checked against every
// schema along with many single mutations of it.
var fastInstances = []string{
	`{"any":"abc","one":4,"not":"y","all":"abc","cond":{"kind":"b","b":1},"refd":"xy","yes":[1]}`,
	`{"any":12,"one":9,"not":1,"all":"ab","cond":{"kind":"a"},"refd":"x"}`,
	`{"any":5,"one":6,"not":0,"all":"a","cond":{"kind":"a","b":1},"refd":"xyzw","no":1}`,
	`{"any":10.0,"one":3.0,"not":{},"cond":{"b":2},"refd":"y"}`,
	`{"a":1,"b":"s","c":true,"x-a":"v","x-n":"ab","n1":1.5,"k":false}`,
	`{"a":1,"x-n":"a","z9":null,"other":"s"}`,
	`{"b":"s","c":false,"bad":true}`, `{"longname1":true}`, `{}`, `[]`,
	`{"tuple":["a",1,true,false],"open":[1,"x"],"has":["a",1,"b"],"none":[1,2],"unique":[1,"1",[1],{"a":1},{"a":2}],"bounded":[null,null]}`,
	`{"tuple":[1],"open":[2],"has":["a","b","c","d"],"none":["a","b"],"unique":[1,1.0],"bounded":[null]}`,
	`{"unique":[{"a":1,"b":[2]},{"b":[2],"a":1.0}]}`,
	`{"unique":[0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,2.0e0]}`,
	`{"unique":[0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,"2",[2],{"2":2},null,true,false,0.5]}`,
	`{"unique":[[],{},"",0,-0.0,1]}`,
	`{"int":1.0,"range":-1,"big":1e20,"step":2.75,"istep":-14,"const":1,"obj":{"b":{"c":false},"a":[1.0,"x",null]},"enum":2.5}`,
	`{"int":1e2,"range":99.75,"big":99999999999999999999,"step":0.1,"istep":7.5,"const":1.5,"obj":{"a":[1],"b":{}},"enum":"2.50"}`,
	`{"int":1.5,"range":100,"big":1000000000000000000001,"step":-0.25,"istep":0,"const":10e-1,"enum":{"one":1.0}}`,
	`{"int":-0,"range":-1.25,"big":1.1e30,"istep":123456789012345678901,"enum":[1e0]}`,
	`{"date":"2026-02-28","time":"19:13:25Z","ipv4":"10.0.0.1","host":"example.com","uri":"https://x.io/a","dur":"P1D","unknown":"?","runes":"äöü"}`,
	`{"date":"2026-02-30","time":"25:00:00Z","ipv4":"10.0.0","host":"-x","uri":"no scheme","dur":"1D","runes":"äöüß"}`,
	`{"date":1,"runes":"ä"}`,
	`{"name":"root","children":[{"name":"a"},{"name":"b","children":[{"name":"c","children":[]}]}]}`,
	`{"name":"root","children":[{"name":"a","x":1}]}`, `{"children":[]}`,
	`{"tuple":["a",1],"tuple2":["a",1,2],"all":[1,2],"refd":"s"}`,
	`{"tuple":["a",1,2],"tuple2":["a","b"],"all":[1.5],"refd":1}`,
	`{"tuple2":["a"]}`, `{"tuple":["a",1,2],"all":[1]}`, `{"tuple":["a",1],"all":[1]}`,
	`{"range":-1.5}`, `{"range":100}`, `{"range":-1.49}`, `{"range":99.999}`,
}

// mutateMore are the replacement values for fastInstances.
var mutateMore = []any{nil, json.Number("0"), json.Number("-1"), json.Number("1.0"), json.Number("2.5"), json.Number("1e2"),
	json.Number("100"), json.Number("1e40"), "", "x", "ab", "äöü", true, false,
	[]any{}, map[string]any{}, []any{"x", json.Number("1")}, []any{json.Number("1"), json.Number("1")},
	map[string]any{"kind": "b"}, map[string]any{"a": []any{json.Number("1"), "x", nil}, "b": map[string]any{"c": false}}}

// TestFastPathAgrees: on every registry schema and every schema in
// testdata/fastpath, the fast path says valid exactly when jsonschema does,
// for each example message, each instance above, and many single mutations
// of each.
func TestFastPathAgrees(t *testing.T) {
	t.Parallel()
	cases := fastPathCases(t)
	type doc struct {
		body string
		alts []any
	}
	var docs []doc
	for _, ex := range examples(t) {
		docs = append(docs, doc{string(ex.Body), mutateAlts})
	}
	for _, body := range fastInstances {
		docs = append(docs, doc{body, mutateMore})
	}
	n, valid := 0, 0
	for _, d := range docs {
		doc, derr := decodeJSON([]byte(d.body))
		if derr != nil {
			t.Fatalf("%s: %v", d.body, derr)
		}
		mutate(doc, d.alts, func() {
			for _, c := range cases {
				n++
				if c.slow.Validate(doc) == nil {
					valid++
				}
				agree(t, c, doc)
			}
		})
	}
	// A test that only ever sees invalid instances proves little.
	t.Logf("%d checks, %d valid", n, valid)
	if valid < n/50 {
		t.Errorf("only %d of %d checks valid", valid, n)
	}
}

// TestFastPathFallsBack: a schema using anything the fast path does not
// implement has no fast path; recursion through a child value is fine.
func TestFastPathFallsBack(t *testing.T) {
	t.Parallel()
	for body, wantFast := range map[string]bool{
		`{"type":"object","unevaluatedProperties":false}`:                                             false,
		`{"type":"array","unevaluatedItems":false}`:                                                   false,
		`{"$dynamicAnchor":"n","properties":{"c":{"$dynamicRef":"#n"}}}`:                              false,
		`{"contentMediaType":"application/json","contentEncoding":"base64"}`:                          true, // annotations in 2020-12
		`{"$schema":"http://json-schema.org/draft-07/schema#","contentEncoding":"base64"}`:            false,
		`{"$schema":"http://json-schema.org/draft-07/schema#","contentMediaType":"application/json"}`: false,
		`{"properties":{"a":{"$ref":"#/$defs/x"}},"$defs":{"x":{"allOf":[{"$ref":"#"}]}}}`:            true,
		`{"format":"no-such-format","type":"string"}`:                                                 true,
		`{"$comment":"c","title":"t","description":"d","examples":[1],"default":2}`:                   true,
		`{"$schema":"http://json-schema.org/draft-04/schema#","minimum":1,"exclusiveMinimum":true}`:   true,
	} {
		r, err := loadOne(t, body)
		if err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		s, _ := r.Lookup("t", "1")
		if got := r.fast[s] != nil; got != wantFast {
			t.Errorf("%s: fast path %v, want %v (%v)", body, got, wantFast, r.noFast[s])
		}
		if r.fast[s] != nil {
			for _, inst := range []string{`{}`, `{"a":{}}`, `{"a":1}`, `0`, `1`, `"x"`, `null`, `[1]`} {
				doc, _ := decodeJSON([]byte(inst))
				agree(t, fastCase{body, s, r.fast[s]}, doc)
			}
		}
	}
}

// TestInPlaceLoop: a schema that applies itself to the same value has no
// fast path (jsonschema's compiler refuses the ones it sees; this is the
// fast path's own guard).
func TestInPlaceLoop(t *testing.T) {
	t.Parallel()
	leaf := &jsonschema.Schema{Location: "leaf"}
	a := &jsonschema.Schema{Location: "a"}
	b := &jsonschema.Schema{Location: "b", Not: a}
	a.AnyOf = []*jsonschema.Schema{leaf, b}
	root := &jsonschema.Schema{Location: "root", Properties: map[string]*jsonschema.Schema{"x": a}}
	if err := inPlaceLoop(root); err == nil {
		t.Error("no loop found through anyOf and not")
	}
	tree := &jsonschema.Schema{Location: "tree"}
	tree.Items2020 = &jsonschema.Schema{Location: "node", Ref: tree}
	tree.AllOf = []*jsonschema.Schema{leaf, leaf}
	if err := inPlaceLoop(tree); err != nil {
		t.Errorf("recursion through items called a loop: %v", err)
	}
	if _, why := compileFast([]*jsonschema.Schema{root}, nil); why[root] == nil {
		t.Error("compileFast compiled a loop")
	}
}

// FuzzFastPathAgrees decodes arbitrary bytes as the gate does and checks
// that the fast path of every registry schema, and of every schema in
// testdata/fastpath, says valid exactly when jsonschema does; then again
// with the at-th value of the document (in document order, members by
// name) replaced by alt, decoded. Mutating alt and at explores values deep
// inside otherwise valid messages, which byte mutations of one body rarely
// reach.
func FuzzFastPathAgrees(f *testing.F) {
	alts := []string{`null`, `0`, `-1.5e3`, `""`, `"x"`, `[]`, `{}`, `[1,1]`, `{"a":"b"}`, `"2026-11-29T19:13:25Z"`}
	for i, ex := range examples(f) {
		f.Add(ex.Body, uint16(3*i+1), []byte(alts[i%len(alts)]))
	}
	for i, inst := range fastInstances {
		f.Add([]byte(inst), uint16(i), []byte(alts[i%len(alts)]))
	}
	cases := fastPathCases(f)
	f.Fuzz(func(t *testing.T, body []byte, at uint16, alt []byte) {
		doc, derr := decodeJSON(body)
		if derr != nil {
			return
		}
		for _, c := range cases {
			agree(t, c, doc)
		}
		v, derr := decodeJSON(alt)
		if derr != nil {
			return
		}
		n := 0
		doc = replaceNth(doc, int(at), v, &n)
		for _, c := range cases {
			agree(t, c, doc)
		}
	})
}

// replaceNth returns doc with its nth value in document order (doc itself
// is the 0th; object members by name, for a stable order) replaced by v,
// counting from *seen. An n beyond the last value changes nothing.
func replaceNth(doc any, n int, v any, seen *int) any {
	if *seen == n {
		*seen++
		return v
	}
	*seen++
	switch x := doc.(type) {
	case map[string]any:
		for _, k := range slices.Sorted(maps.Keys(x)) {
			x[k] = replaceNth(x[k], n, v, seen)
		}
	case []any:
		for i := range x {
			x[i] = replaceNth(x[i], n, v, seen)
		}
	}
	return doc
}

// TestPropLookup: prop finds exactly the properties of every object schema
// of the registry and testdata/fastpath, and nothing else, whether
// indexProps gave it a table or not (names the hash cannot tell apart, and
// more than fit a table).
func TestPropLookup(t *testing.T) {
	t.Parallel()
	var objects []*fastSchema
	seen := map[*fastSchema]bool{}
	var walk func(f *fastSchema)
	walk = func(f *fastSchema) {
		if f == nil || seen[f] {
			return
		}
		seen[f] = true
		if len(f.props) > 0 {
			objects = append(objects, f)
		}
		for _, p := range f.props {
			walk(p.schema)
		}
		for _, sub := range slices.Concat([]*fastSchema{f.additional, f.itemsAll, f.items, f.contains, f.ref, f.not, f.ifS, f.thenS, f.elseS, f.tupleAdditional, f.propertyNames},
			f.allOf, f.anyOf, f.oneOf, f.tuple, f.prefix) {
			walk(sub)
		}
		for _, pp := range f.patternProps {
			walk(pp.schema)
		}
		for _, d := range f.depSchemas {
			walk(d.schema)
		}
	}
	for _, c := range fastPathCases(t) {
		walk(c.fast)
	}
	indexed := 0
	for _, f := range objects {
		if f.propIndex != nil {
			indexed++
		}
	}
	if indexed == 0 || indexed < len(objects)*9/10 {
		t.Errorf("%d of %d object schemas have a property table", indexed, len(objects))
	}
	// Same length, first, middle and last byte: one hash for any multiplier.
	alike := &fastSchema{}
	for _, name := range []string{"aXbXc", "aYbYc", "id", "name"} {
		alike.props = append(alike.props, fastProp{name: name})
	}
	many := &fastSchema{}
	for i := range 300 {
		many.props = append(many.props, fastProp{name: strconv.Itoa(i)})
	}
	for _, f := range []*fastSchema{alike, many} {
		slices.SortFunc(f.props, func(a, b fastProp) int { return strings.Compare(a.name, b.name) })
		f.indexProps()
		if f.propIndex != nil {
			t.Errorf("%d properties (%s...) got a table", len(f.props), f.props[0].name)
		}
	}
	objects = append(objects, alike, many)
	for _, f := range objects {
		for i := range f.props {
			name := f.props[i].name
			if got := f.prop(name); got != &f.props[i] {
				t.Fatalf("prop(%q) = %v, want property %d of %d", name, got, i, len(f.props))
			}
			for _, other := range []string{name + "x", "x" + name, name[:len(name)/2], strings.ToUpper(name), name + "\x00", ""} {
				want := slices.IndexFunc(f.props, func(p fastProp) bool { return p.name == other })
				if got := f.prop(other); (got == nil) != (want < 0) || want >= 0 && got != &f.props[want] {
					t.Fatalf("prop(%q) = %v, want property %d", other, got, want)
				}
			}
		}
	}
}
