package schemas

import (
	"encoding/json"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v5"
)

// sameOutcome validates v against a and b (the same schema compiled with and
// without elideRefs) and fails unless both agree: both valid, the same
// violations in the same order, or the same other error.
func sameOutcome(t *testing.T, name string, a, b *jsonschema.Schema, v any) {
	t.Helper()
	ea, eb := a.Validate(v), b.Validate(v)
	var va, vb *jsonschema.ValidationError
	switch {
	case ea == nil && eb == nil:
	case errors.As(ea, &va) && errors.As(eb, &vb):
		fa, ta := flatten(va, "", 1000)
		fb, tb := flatten(vb, "", 1000)
		for _, fs := range [][]Violation{fa, fb} {
			for i := range fs { // lists property names in map order
				if fs[i].Keyword == "additionalProperties" {
					fs[i].Message = sortedNames(fs[i].Message)
				}
			}
		}
		if !reflect.DeepEqual(fa, fb) || ta != tb {
			t.Errorf("%s: %s:\nelided   %v\ncompiled %v", name, mustJSON(v), fa, fb)
		}
	case ea != nil && eb != nil && va == nil && vb == nil && ea.Error() == eb.Error():
	default:
		t.Errorf("%s: %s: elided %v, compiled %v", name, mustJSON(v), ea, eb)
	}
}

func sortedNames(msg string) string {
	names := strings.Split(strings.TrimSuffix(strings.TrimPrefix(msg, "additionalProperties "), " not allowed"), ", ")
	sort.Strings(names)
	return strings.Join(names, ", ")
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// mutate calls f after each of many single changes to doc: every value
// replaced by each of alts, every property dropped, an extra one added.
func mutate(doc any, alts []any, f func()) {
	var walk func(v any, set func(any))
	walk = func(v any, set func(any)) {
		for _, a := range alts {
			set(a)
			f()
		}
		set(v)
		switch x := v.(type) {
		case map[string]any:
			for _, k := range slices.Sorted(maps.Keys(x)) {
				kv := x[k]
				delete(x, k)
				f()
				x[k] = kv
				walk(kv, func(n any) { x[k] = n })
			}
			x["zz"] = json.Number("1")
			f()
			delete(x, "zz")
		case []any:
			for i := range x {
				walk(x[i], func(n any) { x[i] = n })
			}
		}
	}
	walk(doc, func(any) {})
}

var mutateAlts = []any{nil, json.Number("0"), json.Number("1.5"), json.Number("10001"), "", "x", true,
	[]any{}, map[string]any{}, []any{"x", "x"}, map[string]any{"a": "b"}, "not-a-uuid", "2026-13-01T00:00:00Z",
	"a@b", "jane doe@x.io", "EUR", "eur", "12.345", "ABC-1", strings.Repeat("x", 300), "web"}

// TestElideRefsShipped: every shipped schema gives the same violations with
// and without elideRefs, on a realistic message of each type and on many
// single mutations of it.
func TestElideRefsShipped(t *testing.T) {
	t.Parallel()
	elided, err := load(LoadOptions{}, true)
	if err != nil {
		t.Fatal(err)
	}
	plain, err := load(LoadOptions{}, false)
	if err != nil {
		t.Fatal(err)
	}
	const id, ts = `"5f1c9b4e-8d3a-4f7e-9a1b-2c3d4e5f6a7b"`, `"2026-11-29T19:13:25Z"`
	money := `{"amount":"39.90","currency":"EUR"}`
	bodies := map[string][]string{
		"orders.created": {
			`{"orderId":` + id + `,"createdAt":` + ts + `,"customer":{"id":"c","email":"a@b.io","name":"J"},"lineItems":[{"sku":"ABC","name":"n","quantity":2,"unitPrice":` + money + `},{"sku":"XYZ-1","quantity":1}],"total":` + money + `,"shippingAddress":{"line1":"l","line2":"m","city":"c","region":"r","postalCode":"1","country":"DE"},"channel":"web","note":"n"}`,
			`{"orderId":` + id + `,"createdAt":` + ts + `,"customer":{"id":"c","email":"a@b.io"},"items":[{"sku":"ABC","quantity":1}],"totalCents":3990}`,
		},
		"orders.cancelled": {
			`{"orderId":` + id + `,"cancelledAt":` + ts + `,"reason":"other","comment":"c","refund":` + money + `}`,
		},
		"notifications.email": {
			`{"notificationId":` + id + `,"to":"j@example.com","cc":["o@example.com"],"subject":"s","template":"t.x","locale":"de-DE","variables":{"a":"b","n":3}}`,
		},
		"notifications.sms": {
			`{"notificationId":` + id + `,"to":"+4915112345678","text":"t","sendAfter":` + ts + `}`,
		},
	}
	n := 0
	for _, ref := range plain.Refs() {
		a, _ := elided.Lookup(ref.Type, ref.Version)
		b, _ := plain.Lookup(ref.Type, ref.Version)
		for _, body := range bodies[ref.Type] {
			doc, derr := decodeJSON([]byte(body))
			if derr != nil {
				t.Fatal(derr)
			}
			mutate(doc, mutateAlts, func() {
				n++
				sameOutcome(t, ref.Type+" v"+ref.Version, a, b, doc)
			})
		}
	}
	if n < 1000 {
		t.Fatalf("only %d instances", n)
	}
}

// TestElideRefsEdgeCases compiles schemas where a wrapper could matter:
// chains, loops, annotations beside $ref, $ref with siblings (draft 2020 and
// draft-07), unevaluated* through allOf, and $dynamicRef. (Loops of
// wrappers do not compile.)
func TestElideRefsEdgeCases(t *testing.T) {
	t.Parallel()
	files := map[string]string{
		"chain/v1.json": `{"type":"object","properties":{
			"x":{"$ref":"#/$defs/a"},"y":{"description":"d","$ref":"#/$defs/c"},"z":{"$ref":"#/$defs/c","maxLength":3},
			"arr":{"type":"array","prefixItems":[{"$ref":"#/$defs/a"}],"items":{"$ref":"#/$defs/b"}},
			"m":{"type":"object","additionalProperties":{"$ref":"#/$defs/a"},"propertyNames":{"$ref":"#/$defs/c"}},
			"o":{"oneOf":[{"$ref":"#/$defs/a"},{"$ref":"#/$defs/int"}]},"n":{"not":{"$ref":"#/$defs/int"}},
			"i":{"if":{"$ref":"#/$defs/int"},"then":{"$ref":"#/$defs/pos"},"else":{"$ref":"#/$defs/a"}}},
			"$defs":{"a":{"$ref":"#/$defs/b"},"b":{"$ref":"#/$defs/c"},"c":{"type":"string","minLength":2},
				"int":{"type":"integer"},"pos":{"minimum":1}}}`,
		"uneval/v1.json": `{"allOf":[{"$ref":"#/$defs/ab"}],"properties":{"c":{"$ref":"#/$defs/ab2"}},"unevaluatedProperties":false,
			"$defs":{"ab":{"$ref":"#/$defs/ab1"},"ab1":{"properties":{"a":true,"b":{"$ref":"#/$defs/ab2"}}},"ab2":{"type":"integer"},
				"list":{"prefixItems":[{"$ref":"#/$defs/ab2"}]}},
			"dependentSchemas":{"d":{"$ref":"#/$defs/ab"}}}`,
		"ulist/v1.json": `{"type":"array","allOf":[{"$ref":"#/$defs/w"}],"unevaluatedItems":false,
			"$defs":{"w":{"$ref":"#/$defs/p"},"p":{"prefixItems":[{"$ref":"#/$defs/i"},{"$ref":"#/$defs/i"}]},"i":{"type":"integer"}}}`,
		"draft7/v1.json": `{"$schema":"http://json-schema.org/draft-07/schema#","properties":{
			"a":{"$ref":"#/definitions/s","type":"integer"},"b":{"items":{"$ref":"#/definitions/s"}}},
			"definitions":{"s":{"type":"string"}}}`,
		"tree/v1.json": `{"$dynamicAnchor":"node","type":"object","properties":{"data":true,
			"children":{"type":"array","items":{"$dynamicRef":"#node"}}}}`,
		"stricttree/v1.json": `{"$ref":"../tree/v1.json","$dynamicAnchor":"node","unevaluatedProperties":false}`,
		"alias/v1.json":      `{"$ref":"../stricttree/v1.json"}`,
	}
	dir := t.TempDir()
	for name, body := range files {
		if err := os.MkdirAll(filepath.Join(dir, filepath.Dir(name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	opts := LoadOptions{Dir: dir, NoEmbedded: true}
	elided, err := load(opts, true)
	if err != nil {
		t.Fatal(err)
	}
	plain, err := load(opts, false)
	if err != nil {
		t.Fatal(err)
	}
	if s, _ := elided.Lookup("chain", "1"); s.Properties["x"].Location != s.Properties["y"].Location ||
		!strings.HasSuffix(s.Properties["x"].Location, "#/$defs/c") {
		t.Errorf("chain not elided: x at %s, y at %s", s.Properties["x"].Location, s.Properties["y"].Location)
	}
	instances := []string{
		`{"x":"ab","y":"cd","z":"ef","arr":["ab","cd"],"m":{"ab":"cd"},"o":"ab","n":"ab","i":"ab"}`,
		`{"x":"a","y":"","z":"efgh","arr":["a",1],"m":{"a":"c"},"o":1.5,"n":1,"i":0}`,
		`{"a":1,"b":2,"c":3}`, `{"a":1,"b":"x","c":3,"e":1}`, `{"d":1,"a":1}`, `{"d":1,"x":1}`,
		`[1,2]`, `[1,2,3]`, `["x"]`, `{"a":1,"b":[1]}`, `{"a":"x","b":["y"]}`,
		`{"data":1,"children":[{"data":2,"children":[]}]}`, `{"data":1,"children":[{"data":2,"extra":1}]}`, `{"extra":1}`,
		`{"x":1}`, `{}`, `1`, `"x"`, `null`,
	}
	for _, ref := range plain.Refs() {
		a, _ := elided.Lookup(ref.Type, ref.Version)
		b, _ := plain.Lookup(ref.Type, ref.Version)
		for _, body := range instances {
			doc, derr := decodeJSON([]byte(body))
			if derr != nil {
				t.Fatal(derr)
			}
			sameOutcome(t, ref.Type, a, b, doc)
			mutate(doc, []any{nil, json.Number("1"), "abc", []any{json.Number("1")}, map[string]any{}}, func() {
				sameOutcome(t, ref.Type, a, b, doc)
			})
		}
	}
}

// TestIsWrapper pins which schemas count as bare "$ref" wrappers.
func TestIsWrapper(t *testing.T) {
	t.Parallel()
	for body, want := range map[string]bool{
		`{"$ref":"#/$defs/s","$defs":{"s":{"type":"string"}}}`:                                                                  true,
		`{"$ref":"#/$defs/s","title":"t","$comment":"c","$defs":{"s":{}}}`:                                                      true,
		`{"$ref":"#/$defs/s","type":"string","$defs":{"s":{}}}`:                                                                 false,
		`{"$ref":"#/$defs/s","minLength":0,"$defs":{"s":{}}}`:                                                                   false,
		`{"$ref":"#/$defs/s","unevaluatedProperties":false,"$defs":{"s":{}}}`:                                                   false,
		`{"$ref":"#/$defs/s","$dynamicAnchor":"a","$defs":{"s":{}}}`:                                                            false,
		`{"$ref":"#/$defs/s","contains":{"type":"string"},"$defs":{"s":{}}}`:                                                    false,
		`{"$ref":"#/$defs/s","format":"email","$defs":{"s":{}}}`:                                                                false,
		`{"$schema":"http://json-schema.org/draft-07/schema#","$ref":"#/definitions/s","type":"string","definitions":{"s":{}}}`: true,
		`{"type":"string"}`: false,
	} {
		c := jsonschema.NewCompiler()
		c.Draft = jsonschema.Draft2020
		c.AssertFormat = true
		if err := c.AddResource("https://example.com/s.json", strings.NewReader(body)); err != nil {
			t.Fatal(err)
		}
		s, err := c.Compile("https://example.com/s.json")
		if err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		if got := isWrapper(s); got != want {
			t.Errorf("%s: isWrapper = %v, want %v", body, got, want)
		}
	}
}
