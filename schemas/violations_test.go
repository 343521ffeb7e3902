package schemas

import (
	"encoding/json"
	"errors"
	"math"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v5"
)

// violationsCase is one schema with an invalid path.
type violationsCase struct {
	name  string
	group int // 0: the registry, 1: testdata/fastpath, 2: testdata/violations
	reg   *Registry
	s     *jsonschema.Schema
}

var (
	violationsOnce  sync.Once
	violationsCases []violationsCase
	violationsErr   error
)

// violationsCases loads the embedded registry, testdata/fastpath and
// testdata/violations; every schema in them must have an invalid path.
func allViolationsCases(t testing.TB) []violationsCase {
	t.Helper()
	violationsOnce.Do(func() {
		for group, opts := range []LoadOptions{{},
			{Dir: filepath.Join("testdata", "fastpath"), NoEmbedded: true},
			{Dir: filepath.Join("testdata", "violations"), NoEmbedded: true},
		} {
			r, err := Load(opts)
			if err != nil {
				violationsErr = err
				return
			}
			for _, ref := range r.Refs() {
				s, _ := r.Lookup(ref.Type, ref.Version)
				if r.inv[s] == nil {
					violationsErr = &LoadError{Files: []FileError{{ref.Source, r.noFast[s]}}}
					return
				}
				violationsCases = append(violationsCases, violationsCase{ref.Type + " v" + ref.Version, group, r, s})
			}
		}
	})
	if violationsErr != nil {
		t.Fatalf("a schema has no invalid path: %v", violationsErr)
	}
	return violationsCases
}

// violationsAgree fails unless the invalid path and the full validation
// give the same error for doc, with several caps and prefixes. It returns
// the number of violations (0: doc is valid).
func violationsAgree(t testing.TB, c violationsCase, doc any) int {
	t.Helper()
	return violationsAgreeText(t, c, doc, []byte(mustJSON(doc)))
}

// violationsAgreeText is violationsAgree, with body the text of doc, which
// the invalid path also reads as tokens, as the gate does.
func violationsAgreeText(t testing.TB, c violationsCase, doc any, body []byte) int {
	t.Helper()
	if c.reg.fastValid(nil, c.s, doc) {
		return 0
	}
	// The leaves themselves, keyword locations included (which only
	// order the violations, so a wrong one could hide in the lists).
	if err := c.s.Validate(doc); err != nil {
		var ve *jsonschema.ValidationError
		if !errors.As(err, &ve) {
			t.Fatalf("%s: %s: %v", c.name, mustJSON(doc), err)
		}
		var want []vleaf
		appendLeaves(ve, "", "", &want)
		got, err := c.reg.inv[c.s].leaves(nil, doc, math.MaxInt)
		if err != nil {
			t.Errorf("%s: %s: invalid path: %v", c.name, mustJSON(doc), err)
		}
		if !reflect.DeepEqual(sortedLeaves(got), sortedLeaves(want)) {
			t.Errorf("%s: %s:\ninvalid path leaves %q\nfull               %q", c.name, mustJSON(doc), sortedLeaves(got), sortedLeaves(want))
		}
		d := getTokDoc()
		if d.tokenize(body) {
			got, err := leavesOf(c.reg.inv[c.s], tokVals{d}, 0, math.MaxInt)
			if err != nil {
				t.Errorf("%s: %s: invalid path on tokens: %v", c.name, body, err)
			}
			if !reflect.DeepEqual(sortedLeaves(got), sortedLeaves(want)) {
				t.Errorf("%s: %s:\ninvalid path leaves on tokens %q\nfull                          %q", c.name, body, sortedLeaves(got), sortedLeaves(want))
			}
		}
		d.release()
	}
	n := 0
	for _, o := range []struct {
		max    int
		prefix string
	}{{1, ""}, {3, "/data"}, {DefaultMaxViolations, ""}} {
		want := validate(c.s, doc, o.prefix, o.max)
		got := c.reg.violations(c.s, doc, o.prefix, o.max)
		if !sameViolations(got, want) {
			t.Errorf("%s: max %d, prefix %q: %s:\ninvalid path %s\nfull         %s", c.name, o.max, o.prefix, mustJSON(doc), mustJSON(got), mustJSON(want))
		}
		if want != nil {
			n = len(want.Violations)
		}
	}
	return n
}

// sortedLeaves sorts leaves by instance and keyword location (then
// message), with additionalProperties messages normalized as in
// sameViolations.
func sortedLeaves(leaves []vleaf) []vleaf {
	out := append([]vleaf(nil), leaves...)
	for i, l := range out {
		if keyword(l.kw) == "additionalProperties" && strings.Contains(l.msg, ", ") {
			out[i].msg = sortedNames(l.msg)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.inst != b.inst {
			return a.inst < b.inst
		}
		if a.kw != b.kw {
			return a.kw < b.kw
		}
		return a.msg < b.msg
	})
	return out
}

// sameViolations compares two gate errors. jsonschema lists the names in an
// additionalProperties message in map order, so a message naming two or
// more differs from run to run, on either path: those are compared with
// the names sorted.
func sameViolations(a, b *ValidationError) bool {
	norm := func(e *ValidationError) *ValidationError {
		if e == nil {
			return nil
		}
		c := *e
		c.Violations = append([]Violation(nil), e.Violations...)
		for i, v := range c.Violations {
			if v.Keyword == "additionalProperties" && strings.Contains(v.Message, ", ") {
				c.Violations[i].Message = sortedNames(v.Message)
			}
		}
		return &c
	}
	return reflect.DeepEqual(norm(a), norm(b))
}

// violationsDocs are instances for testdata/violations (the fastpath and
// registry ones come from fastInstances and the examples).
var violationsDocs = []string{
	`{"":1,"a/b":"abc","t~x":2.5,"sp ace":[0,1],"ü%":["s",true,false],"deep":{"x y":{"~":1}},"int":2.0,"typed":{"k":"v"},"p/d":"2026-01-02","q~":1,"extra":"s","z":1}`,
	`{"":1.5,"a/b":"a","t~x":101.3,"sp ace":[-1,"x",2,3,4],"ü%":[1,"x",true,true],"never":1,"deep":{"x y":{"~":3}},"p/d":"2026-02-30","q~":4,"extra":"x","e2":[]}`,
	`{"a/b":"abcdef","t~x":-1,"sp ace":{},"ü%":"s","p/":5,"~":"s","deep":{"x y":[]},"int":-1.5,"typed":"s"}`,
	`{"":"s","a/b":7,"t~x":"n","sp ace":[1,2,3,4],"p/x":null,"%~":10}`,
	`{"all":[1,2,0,-1,"x"],"tuple":["a",0,true,1],"closed":["a","b"],"refd":6}`,
	`{"all":[1],"tuple":[1,"x"],"closed":[1],"refd":0}`,
	`{"tuple":["a",1]}`, `{"all":[1,2,3,4,5]}`, `{"refd":5.5}`,
	`[]`, `"s"`, `null`, `{}`,
}

// violationsAlts replace values, one or two at a time: wrong types and
// values out of range for most schemas here.
var violationsAlts = []any{nil, json.Number("0"), json.Number("-1"), json.Number("2.5"), json.Number("1e40"),
	"", "x", "not-a-uuid", strings.Repeat("ü", 300), true, []any{}, map[string]any{},
	[]any{"x", "x"}, map[string]any{"a": "b", "zz": json.Number("1")}}

// TestViolationsAgree: on every registry schema, every schema in
// testdata/fastpath and testdata/violations, the invalid path gives exactly
// the full validation's error (violations, order, truncation) for each
// example message (on the registry), each instance in fastInstances (on
// testdata/fastpath) and above (on testdata/violations), each of many
// single mutations of them (every value replaced, every member removed, one
// added), and each of many double mutations (two values replaced: several
// violations at once, and at one pointer from different keywords).
func TestViolationsAgree(t *testing.T) {
	t.Parallel()
	cases := allViolationsCases(t)
	type doc struct {
		body  string
		alts  []any
		group int // the schemas it is written for
	}
	var docs []doc
	for _, ex := range examples(t) {
		docs = append(docs, doc{string(ex.Body), mutateAlts, 0})
	}
	for _, body := range fastInstances {
		docs = append(docs, doc{body, mutateMore, 1})
	}
	for _, body := range violationsDocs {
		docs = append(docs, doc{body, violationsAlts, 2})
	}
	n, invalid, multi := 0, 0, 0
	var d doc
	check := func(v any) {
		for _, c := range cases {
			if c.group != d.group {
				continue // FuzzViolationsAgree mixes them
			}
			n++
			switch violationsAgree(t, c, v) {
			case 0:
			case 1:
				invalid++
			default:
				invalid++
				multi++
			}
		}
	}
	for _, d = range docs {
		v, derr := decodeJSON([]byte(d.body))
		if derr != nil {
			t.Fatalf("%s: %v", d.body, derr)
		}
		mutate(v, d.alts, func() { check(v) })
		// Two values replaced: pairs of positions (every other j; every
		// seventh under -short or the race detector), each pair with
		// replacements taken in turn from violationsAlts.
		values := countValues(v)
		step := 2
		if testing.Short() || raceEnabled {
			step = 7
		}
		for i := 1; i < values; i++ {
			for j := i + 1; j < values; j += step {
				a, b := violationsAlts[(i+j)%len(violationsAlts)], violationsAlts[(3*i+j+5)%len(violationsAlts)]
				w, _ := decodeJSON([]byte(d.body))
				seen := 0
				w = replaceNth(w, i, a, &seen)
				seen = 0
				w = replaceNth(w, j, b, &seen)
				check(w)
			}
		}
		if t.Failed() {
			return
		}
	}
	// A test that never sees an invalid instance, or never several
	// violations, proves little.
	t.Logf("%d checks, %d invalid, %d with several violations", n, invalid, multi)
	if invalid < n/4 || multi < invalid/10 {
		t.Errorf("only %d of %d checks invalid, %d with several violations", invalid, n, multi)
	}
}

// countValues counts doc's values, doc included (replaceNth's numbering).
func countValues(doc any) int {
	n := 1
	switch x := doc.(type) {
	case map[string]any:
		for _, v := range x {
			n += countValues(v)
		}
	case []any:
		for _, v := range x {
			n += countValues(v)
		}
	}
	return n
}

// TestGateViolationsAgree: a gate gives exactly the error it gave with the
// full validation, in each identity mode (FromEnvelope prefixes "/data"),
// with and without the stream path, on the registry's examples and single
// mutations of them.
func TestGateViolationsAgree(t *testing.T) {
	t.Parallel()
	reg, err := Load(LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	type pair struct{ fast, full *Gate }
	var gates []pair
	for _, c := range []gateVariant{{FromProperties, 1, false}, {FromProperties, 0, true}, {FromEnvelope, 3, false}, {FromEnvelope, 0, true}} {
		g := c.gate(t, reg)
		full := *g
		full.fullValidate = true
		gates = append(gates, pair{g, &full})
	}
	n, invalid := 0, 0
	for _, ex := range examples(t) {
		doc, derr := decodeJSON(ex.Body)
		if derr != nil {
			t.Fatal(derr)
		}
		mutate(doc, mutateAlts, func() {
			data, _ := json.Marshal(doc)
			props := Input{ContentType: "application/json", Type: ex.Type, Headers: map[string]any{"schema-version": ex.Version}, Body: data}
			env := Input{ContentType: "application/json", Body: []byte(`{"type":"` + ex.Type + `","schemaVersion":"` + ex.Version + `","data":` + string(data) + `}`)}
			for _, p := range gates {
				in := props
				if p.fast.id.From == FromEnvelope {
					in = env
				}
				n++
				got := gateErr(p.fast, in)
				want := gateErr(p.full, in)
				if want != nil {
					invalid++
				}
				if !sameViolations(got, want) {
					t.Fatalf("%s v%s, %+v: %s:\ninvalid path %s\nfull         %s", ex.Type, ex.Version, p.fast.id, data, mustJSON(got), mustJSON(want))
				}
			}
		})
	}
	t.Logf("%d checks, %d invalid", n, invalid)
	if invalid < n/4 {
		t.Errorf("only %d of %d checks invalid", invalid, n)
	}
}

// gateErr is the error g.check gives on in.
func gateErr(g *Gate, in Input) *ValidationError {
	d := getTokDoc()
	defer d.release()
	_, verr := g.check(d, in)
	return verr
}

// FuzzViolationsAgree runs the gate on arbitrary bytes as each registry type
// and checks it gives the error it gives with the full validation. Then it
// decodes the bytes as the gate does, replaces up
// to two of its values (the at-th and at2-th in document order, see
// replaceNth) by alt and alt2, and checks that the invalid path gives
// exactly the full validation's error on every schema TestViolationsAgree
// uses, on the decoded value and on the tokens.
func FuzzViolationsAgree(f *testing.F) {
	alts := []string{`null`, `0`, `-1.5e3`, `""`, `"x"`, `[]`, `{}`, `[1,1]`, `{"a":"b"}`, `"2026-11-29T19:13:25Z"`}
	for i, ex := range examples(f) {
		f.Add(ex.Body, uint16(3*i+1), []byte(alts[i%len(alts)]), uint16(5*i+2), []byte(alts[(i+3)%len(alts)]))
	}
	for i, inst := range append(append([]string(nil), fastInstances...), violationsDocs...) {
		f.Add([]byte(inst), uint16(i), []byte(alts[i%len(alts)]), uint16(i+2), []byte(alts[(i+5)%len(alts)]))
	}
	cases := allViolationsCases(f)
	reg := cases[0].reg // the embedded registry
	var gates []*Gate
	for _, max := range []int{2, 0} {
		g, err := NewGate(GateConfig{Registry: reg, MaxViolations: max})
		if err != nil {
			f.Fatal(err)
		}
		gates = append(gates, g)
	}
	exs := examples(f)
	f.Fuzz(func(t *testing.T, body []byte, at uint16, alt []byte, at2 uint16, alt2 []byte) {
		// The gate, on the body as it is, as each registry type.
		for _, g := range gates {
			full := *g
			full.fullValidate = true
			for _, ex := range exs {
				in := Input{Type: ex.Type, Headers: map[string]any{"schema-version": ex.Version}, Body: body}
				if got, want := gateErr(g, in), gateErr(&full, in); !sameViolations(got, want) {
					t.Fatalf("gate, %s v%s: %q:\ninvalid path %s\nfull         %s", ex.Type, ex.Version, body, mustJSON(got), mustJSON(want))
				}
			}
		}
		doc, derr := decodeJSON(body)
		if derr != nil {
			return
		}
		for _, c := range cases {
			violationsAgreeText(t, c, doc, body)
		}
		for _, r := range []struct {
			at  uint16
			alt []byte
		}{{at, alt}, {at2, alt2}} {
			v, derr := decodeJSON(r.alt)
			if derr != nil {
				return
			}
			n := 0
			doc = replaceNth(doc, int(r.at), v, &n)
			for _, c := range cases {
				violationsAgree(t, c, doc)
			}
		}
	})
}

// TestGateCheckInvalidAllocs: on an orders.created v2 message with one bad
// line item quantity (the storm's invalid message), the invalid path makes
// at most a third of the allocations of the full validation, and the same
// error.
func TestGateCheckInvalidAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector drops pooled token lists at random")
	}
	g, full := gateAndOracle(t, LoadOptions{})
	var body []byte
	for _, ex := range examples(t) {
		if ex.Type == "orders.created" && ex.Version == "2" {
			doc, derr := decodeJSON(ex.Body)
			if derr != nil {
				t.Fatal(derr)
			}
			doc.(map[string]any)["lineItems"].([]any)[0].(map[string]any)["quantity"] = json.Number("0")
			body = []byte(mustJSON(doc))
		}
	}
	in := Input{ContentType: "application/json", Type: "orders.created", Headers: map[string]any{"schema-version": "2"}, Body: body}
	got, want := gateErr(g, in), gateErr(full, in)
	if want == nil || len(want.Violations) != 1 || want.Violations[0].Pointer != "/lineItems/0/quantity" || !reflect.DeepEqual(got, want) {
		t.Fatalf("invalid path %s, full validation %s", mustJSON(got), mustJSON(want))
	}
	fast := testing.AllocsPerRun(50, func() { _, _ = g.Check(in) })
	slow := testing.AllocsPerRun(50, func() { _, _ = full.Check(in) })
	t.Logf("%.0f allocations per Check (full validation %.0f)", fast, slow)
	if fast > slow/3 {
		t.Errorf("%.0f allocations per Check, want at most a third of the full validation's %.0f", fast, slow)
	}
}

// gateAndOracle is a gate on the registry opts loads, with identity from
// properties, and its twin that takes the full validation (the oracle of
// the invalid path).
func gateAndOracle(tb testing.TB, opts LoadOptions) (g, full *Gate) {
	tb.Helper()
	reg, err := Load(opts)
	if err != nil {
		tb.Fatal(err)
	}
	if g, err = NewGate(GateConfig{Registry: reg}); err != nil {
		tb.Fatal(err)
	}
	twin := *g
	twin.fullValidate = true
	return g, &twin
}

// gateVariant is a gate's identity source, violation cap and whether it
// takes the tree path instead of the token stream.
type gateVariant struct {
	from     string
	max      int
	noStream bool
}

func (c gateVariant) gate(t testing.TB, reg *Registry) *Gate {
	t.Helper()
	g, err := NewGate(GateConfig{Registry: reg, Identity: Identity{From: c.from}, MaxViolations: c.max})
	if err != nil {
		t.Fatal(err)
	}
	g.noStream = c.noStream
	return g
}
