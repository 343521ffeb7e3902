package schemas

import (
	"reflect"

	"github.com/santhosh-tekuri/jsonschema/v5"
)

// Shared definitions are reached through schemas that say nothing but
// "$ref": {"orderId": {"$ref": "../common/v1.json#/$defs/uuid"}}. jsonschema
// validates such a wrapper as a schema of its own: a recursive call, its
// scope entry, closures and, for an object, a set of its property names, and
// then the same again for the target. On a typical message a quarter of all
// schema evaluations are wrappers.
//
// elideRefs points every applicator at a wrapper's final target instead, once
// at load time. Validating against a schema that asserts nothing but "$ref"
// is validating against its target (the wrapper adds no constraint, no
// annotation the validator uses, and no dynamic scope), so exactly the same
// instances pass and fail with the same leaf errors: same instance location,
// keyword and message. Only jsonschema's KeywordLocation of an error loses
// the wrapper's "/$ref" step (".../properties/orderId/format" rather than
// ".../properties/orderId/$ref/format"); violations never show it.

// wrapperFields are the Schema fields a pure "$ref" wrapper may set; every
// other field must hold its zero value (or the -1/1 defaults below). A field
// added by a later jsonschema version is therefore assumed to matter, and a
// schema setting it is left alone.
var wrapperFields = map[string]bool{
	"Location": true, "Draft": true, "meta": true, "vocab": true, "Ref": true,
	// Read only together with Contains, which must be nil.
	"ContainsEval": true,
	// Annotations, only filled in with Compiler.ExtractAnnotations;
	// validation never reads them.
	"Title": true, "Description": true, "Default": true, "Comment": true,
	"ReadOnly": true, "WriteOnly": true, "Examples": true, "Deprecated": true,
}

// wrapperDefaults are the non-zero values newSchema gives unset keywords.
var wrapperDefaults = map[string]int64{
	"MinProperties": -1, "MaxProperties": -1, "MinItems": -1, "MaxItems": -1,
	"MinContains": 1, "MaxContains": -1, "MinLength": -1, "MaxLength": -1,
}

// isWrapper reports whether s asserts nothing but its "$ref".
func isWrapper(s *jsonschema.Schema) bool {
	if s == nil || s.Ref == nil {
		return false
	}
	v := reflect.ValueOf(s).Elem()
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		name := t.Field(i).Name
		if wrapperFields[name] {
			continue
		}
		f := v.Field(i)
		if def, ok := wrapperDefaults[name]; ok {
			if f.Kind() != reflect.Int || f.Int() != def {
				return false
			}
			continue
		}
		switch f.Kind() {
		case reflect.Slice, reflect.Map:
			if f.Len() != 0 {
				return false
			}
		default:
			if !f.IsZero() {
				return false
			}
		}
	}
	return true
}

// target follows a chain of wrappers to the first schema that is not one. A
// chain that loops is returned as it is, for the validator to report.
func target(s *jsonschema.Schema) *jsonschema.Schema {
	seen := map[*jsonschema.Schema]bool{}
	t := s
	for isWrapper(t) {
		if seen[t] {
			return s
		}
		seen[t] = true
		t = t.Ref
	}
	return t
}

// elideRefs rewrites, in every schema reachable from roots, each subschema
// that is a wrapper to its target. Dynamic references ($recursiveRef,
// $dynamicRef) are left as they are.
func elideRefs(roots []*jsonschema.Schema) {
	seen := map[*jsonschema.Schema]bool{}
	var walk func(s *jsonschema.Schema)
	one := func(p **jsonschema.Schema) {
		if *p != nil {
			*p = target(*p)
			walk(*p)
		}
	}
	all := func(ss []*jsonschema.Schema) {
		for i := range ss {
			one(&ss[i])
		}
	}
	inMap := func(m map[string]*jsonschema.Schema) {
		for k, sub := range m {
			one(&sub)
			m[k] = sub
		}
	}
	iface := func(p *interface{}) {
		switch x := (*p).(type) {
		case *jsonschema.Schema:
			one(&x)
			*p = x
		case []*jsonschema.Schema:
			all(x)
		}
	}
	walk = func(s *jsonschema.Schema) {
		if s == nil || seen[s] {
			return
		}
		seen[s] = true
		if s.Ref != nil && !isWrapper(s) {
			one(&s.Ref)
		} else if s.Ref != nil {
			// A wrapper still reachable (a root, or a loop) keeps its
			// own $ref, shortened to the end of the chain.
			if t := target(s.Ref); t != s {
				s.Ref = t
			}
			walk(s.Ref)
		}
		walk(s.RecursiveRef)
		walk(s.DynamicRef)
		one(&s.Not)
		all(s.AllOf)
		all(s.AnyOf)
		all(s.OneOf)
		one(&s.If)
		one(&s.Then)
		one(&s.Else)
		inMap(s.Properties)
		one(&s.PropertyNames)
		for re, sub := range s.PatternProperties {
			one(&sub)
			s.PatternProperties[re] = sub
		}
		iface(&s.AdditionalProperties)
		for k, d := range s.Dependencies {
			if sub, ok := d.(*jsonschema.Schema); ok {
				one(&sub)
				s.Dependencies[k] = sub
			}
		}
		inMap(s.DependentSchemas)
		one(&s.UnevaluatedProperties)
		iface(&s.Items)
		iface(&s.AdditionalItems)
		all(s.PrefixItems)
		one(&s.Items2020)
		one(&s.Contains)
		one(&s.UnevaluatedItems)
		one(&s.ContentSchema)
	}
	for _, r := range roots {
		walk(r)
	}
}
