package schemas

import (
	"os"
	"path/filepath"
	"testing"
)

// loadOne loads body as the only schema (type t, version 1) of a registry.
func loadOne(t *testing.T, body string) (*Registry, error) {
	t.Helper()
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "t"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "t", "v1.json"), []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return Load(LoadOptions{Dir: dir, NoEmbedded: true})
}

// TestFastPathDoubts: the places where a compiled fast path most easily
// says "valid" where jsonschema says "invalid" (which would let an invalid
// message reach its handler), each with instances on both sides of the
// line. Every schema must have a fast path, and the fast path must agree
// with jsonschema and with the verdict written here.
func TestFastPathDoubts(t *testing.T) {
	t.Parallel()
	type inst struct {
		doc   string
		valid bool
	}
	for _, c := range []struct {
		name, schema string
		insts        []inst
	}{
		{"minLength counts code points", `{"type":"string","minLength":3}`,
			[]inst{{`"äö"`, false}, {`"äöü"`, true}, {`"\u00e4\u00f6"`, false}, {`"😀😀"`, false}, {`"😀😀😀"`, true}}},
		{"maxLength counts code points", `{"type":"string","maxLength":2}`,
			[]inst{{`"😀😀"`, true}, {`"😀😀😀"`, false}, {`"abc"`, false}, {`"\ud83d\ude00\u00e4"`, true}}},
		{"big integers against int64 bounds", `{"type":"integer","minimum":-9223372036854775808,"maximum":9223372036854775807}`,
			[]inst{{`9223372036854775807`, true}, {`9223372036854775808`, false}, {`-9223372036854775809`, false},
				{`99999999999999999999`, false}, {`1e19`, false}, {`9.223372036854775807e18`, true}}},
		{"integer type takes 1.0, not 1.5", `{"type":"integer"}`,
			[]inst{{`1.0`, true}, {`1e0`, true}, {`10e-1`, true}, {`-0`, true}, {`1.5`, false}, {`1e-1`, false},
				{`123456789012345678901.5`, false}, {`123456789012345678901.0`, true}}},
		{"multipleOf with fractions is exact", `{"multipleOf":0.1}`,
			[]inst{{`0.3`, true}, {`19.9`, true}, {`0.35`, false}, {`1e-1`, true}, {`1e-2`, false}, {`-0.7`, true}}},
		{"multipleOf with integers and huge values", `{"multipleOf":3}`,
			[]inst{{`9`, true}, {`-9`, true}, {`10`, false}, {`1e20`, false}, {`3e20`, true}, {`300000000000000000000`, true},
				{`300000000000000000001`, false}, {`4.5`, false}}},
		{"exclusive bounds on fractions", `{"exclusiveMinimum":0.5,"exclusiveMaximum":1}`,
			[]inst{{`0.5`, false}, {`0.50000000000000000001`, true}, {`1`, false}, {`1.0`, false}, {`0.99999999999999999999`, true}}},
		{"additionalProperties false with patternProperties",
			`{"properties":{"a":{}},"patternProperties":{"^x-":{"type":"string"}},"additionalProperties":false}`,
			[]inst{{`{"a":1,"x-b":"s"}`, true}, {`{"x-b":1}`, false}, {`{"b":1}`, false}, {`{"a":1,"b":1}`, false}, {`{}`, true}}},
		{"additionalProperties schema skips pattern and named members",
			`{"properties":{"a":{"type":"integer"}},"patternProperties":{"^x-":{"type":"string"}},"additionalProperties":{"type":"boolean"}}`,
			[]inst{{`{"a":1,"x-b":"s","c":true}`, true}, {`{"x-b":true}`, false}, {`{"c":"s"}`, false}, {`{"a":true}`, false}}},
		{"a member matched by two patterns meets both",
			`{"patternProperties":{"^x":{"type":"string"},"y$":{"minLength":2}},"additionalProperties":false}`,
			[]inst{{`{"xy":"ab"}`, true}, {`{"xy":"a"}`, false}, {`{"y":"a"}`, false}, {`{"y":1}`, true}}},
		{"enum compares numbers by value, deeply", `{"enum":[1.0,{"a":[1,"x"]},[0.5],null]}`,
			[]inst{{`1`, true}, {`1e0`, true}, {`"1"`, false}, {`{"a":[1.0,"x"]}`, true}, {`{"a":[1,"x"],"b":1}`, false},
				{`{"a":["x",1]}`, false}, {`[5e-1]`, true}, {`[0.5,0.5]`, false}, {`null`, true}, {`false`, false}}},
		{"const with big and negative-zero numbers", `{"const":{"n":1e30,"z":0}}`,
			[]inst{{`{"n":1000000000000000000000000000000,"z":-0}`, true}, {`{"n":1e30,"z":0.0}`, true},
				{`{"n":1000000000000000000000000000001,"z":0}`, false}, {`{"n":1e30}`, false}}},
		{"const null is not absence", `{"properties":{"a":{"const":null}},"required":["a"]}`,
			[]inst{{`{"a":null}`, true}, {`{"a":0}`, false}, {`{"a":""}`, false}, {`{}`, false}}},
		{"required", `{"required":["a","b"]}`,
			[]inst{{`{"a":1,"b":2}`, true}, {`{"a":1}`, false}, {`{"a":1,"a1":2}`, false}}},
		{"uniqueItems over 20 elements compares by value", `{"uniqueItems":true}`,
			[]inst{{`[0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,1e30,1000000000000000000000000000000]`, false},
				{`[0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,-1,{"a":-0.0},{"a":0}]`, false},
				{`[0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,-1,{"a":1,"b":2},{"a":2,"b":1}]`, true}}},
		{"format date-time and email asserted", `{"properties":{"t":{"format":"date-time"},"e":{"format":"email"}}}`,
			[]inst{{`{"t":"2026-11-30T12:00:00Z","e":"a@b.io"}`, true}, {`{"t":"2026-11-30 12:00:00"}`, false},
				{`{"t":"2026-02-30T12:00:00Z"}`, false}, {`{"e":"a@b-.io"}`, false}, {`{"e":"a..b@c"}`, false},
				{`{"t":5,"e":true}`, true}}},
		{"pattern is a search, not a full match", `{"pattern":"^[a-z]+$","type":"string"}`,
			[]inst{{`"abc"`, true}, {`"abc\n"`, false}, {`"ab1"`, false}, {`"ä"`, false}}},
		{"recursion through $ref on a child", `{"$defs":{"n":{"type":"object","properties":{"c":{"$ref":"#/$defs/n"}},"additionalProperties":false}},"$ref":"#/$defs/n"}`,
			[]inst{{`{"c":{"c":{}}}`, true}, {`{"c":{"c":{"d":1}}}`, false}, {`{"c":{"c":1}}`, false}}},
	} {
		r, err := loadOne(t, c.schema)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		s, _ := r.Lookup("t", "1")
		if r.fast[s] == nil {
			t.Errorf("%s: no fast path: %v", c.name, r.noFast[s])
			continue
		}
		fc := fastCase{c.name, s, r.fast[s]}
		for _, in := range c.insts {
			doc, derr := decodeJSON([]byte(in.doc))
			if derr != nil {
				t.Fatalf("%s: %s: %v", c.name, in.doc, derr)
			}
			agree(t, fc, doc)
			if got := s.Validate(doc) == nil; got != in.valid {
				t.Errorf("%s: %s: jsonschema says valid=%v, the test expects %v", c.name, in.doc, got, in.valid)
			}
		}
	}
}

// TestFastPathRefCycle: a $ref cycle that applies a schema to the same
// value is refused when the registry loads, or left without a fast path, so
// jsonschema (which reports it as an infinite loop) decides.
func TestFastPathRefCycle(t *testing.T) {
	t.Parallel()
	for _, body := range []string{
		`{"$ref":"#/$defs/a","$defs":{"a":{"$ref":"#/$defs/b"},"b":{"$ref":"#/$defs/a"}}}`,
		`{"$defs":{"a":{"anyOf":[{"type":"string"},{"$ref":"#/$defs/a"}]}},"properties":{"x":{"$ref":"#/$defs/a"}}}`,
		`{"$defs":{"a":{"not":{"$ref":"#/$defs/a"}}},"properties":{"x":{"$ref":"#/$defs/a"}}}`,
	} {
		r, err := loadOne(t, body)
		if err != nil {
			continue // refused at load: fine
		}
		s, _ := r.Lookup("t", "1")
		if r.fast[s] != nil {
			t.Errorf("%s: a fast path for a schema that applies itself to the same value", body)
		}
	}
}

// TestDuplicateKeysNeverReachTheValidator: a body with a repeated key is
// refused by the decoder, so neither path sees "required" satisfied by one
// copy and the handler reads the other; a schema whose "required" repeats a
// name is refused when it loads.
func TestDuplicateKeysNeverReachTheValidator(t *testing.T) {
	t.Parallel()
	if _, err := loadOne(t, `{"required":["a","a"]}`); err == nil {
		t.Error(`a schema with "required":["a","a"] loaded`)
	}
	for _, body := range []string{`{"a":1,"a":2}`, `{"b":{"a":1,"a":"x"}}`, `[{"a":1,"a":1}]`, `{"a":1,"\u0061":2}`} {
		if _, derr := decodeJSON([]byte(body)); derr == nil {
			t.Errorf("%s decoded", body)
		}
	}
}
