package schemas

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
)

// streamVerdict runs the tree-free path of c on body: whether it tokenized
// it (else the gate takes the tree path) and then its verdict.
func streamVerdict(c fastCase, body []byte) (tokenized, valid bool) {
	d := getTokDoc()
	defer d.release()
	if !d.tokenize(body) {
		return false, false
	}
	return true, c.fast.validTok(d, 0)
}

// agreeStream fails unless the tree-free path agrees with the tree path on
// body: it tokenizes only what decodeJSON accepts, and then says valid
// exactly when jsonschema does (exact in both directions, as "not" and
// "if" need).
func agreeStream(t testing.TB, c fastCase, body []byte) {
	t.Helper()
	doc, derr := decodeJSON(body)
	tok, valid := streamVerdict(c, body)
	if derr != nil {
		if tok {
			t.Fatalf("%s: %q: tokenized a body decodeJSON refuses (%v)", c.name, body, derr)
		}
		return
	}
	if !tok {
		return // the tree path decides: allowed
	}
	if want := c.slow.Validate(doc) == nil; valid != want {
		t.Errorf("%s: %s: stream path says valid=%v, jsonschema %v", c.name, body, valid, want)
	}
}

// encode is doc as JSON, without HTML escapes (which would make every key
// with '<' escaped, a case the stream path leaves to the tree).
func encode(t testing.TB, doc any) []byte {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(doc); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// TestStreamAgrees: on every registry schema and every schema in
// testdata/fastpath, the stream path agrees with jsonschema on each example
// message, each fast-path instance, and their single mutations.
func TestStreamAgrees(t *testing.T) {
	t.Parallel()
	cases := fastPathCases(t)
	var bodies [][]byte
	for _, ex := range examples(t) {
		bodies = append(bodies, ex.Body)
	}
	for _, inst := range fastInstances {
		bodies = append(bodies, []byte(inst))
	}
	n, streamed := 0, 0
	for _, body := range bodies {
		doc, derr := decodeJSON(body)
		if derr != nil {
			t.Fatal(derr)
		}
		for _, c := range cases {
			agreeStream(t, c, body)
		}
		mutate(doc, append(mutateAlts[:len(mutateAlts):len(mutateAlts)], mutateMore...), func() {
			b := encode(t, doc)
			for _, c := range cases {
				n++
				if tok, _ := streamVerdict(c, b); tok {
					streamed++
				}
				agreeStream(t, c, b)
			}
		})
	}
	t.Logf("%d checks, %d on the stream path", n, streamed)
	if streamed < n*9/10 {
		t.Errorf("only %d of %d checks took the stream path", streamed, n)
	}
}

// TestStreamTakesValidExamples: every example message passes on the stream
// path (else the gate would build the tree for it after all).
func TestStreamTakesValidExamples(t *testing.T) {
	t.Parallel()
	r, err := Load(LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, ex := range examples(t) {
		s, _ := r.Lookup(ex.Type, ex.Version)
		tok, valid := streamVerdict(fastCase{ex.Type, s, r.fast[s]}, ex.Body)
		if !tok || !valid {
			t.Errorf("%s v%s: tokenized %v, valid %v", ex.Type, ex.Version, tok, valid)
		}
	}
}

// TestStreamEdges: bodies the tree path treats specially.
func TestStreamEdges(t *testing.T) {
	t.Parallel()
	cases := fastPathCases(t)
	for _, body := range []string{
		`{"a":1,"a":1}`, `{"a":1,"b":{"c":1,"c":2}}`, `{"a\u0062":1,"ab":2}`, `{"\u0061":1}`,
		`{"s":"\u00e9\n"}`, `"\ud800"`, "\"\xff\"", `1e1001`, `[` + strings.Repeat("1,", 40000) + `1]`,
		strings.Repeat("[", 65) + strings.Repeat("]", 65), strings.Repeat("[", 64) + strings.Repeat("]", 64),
		`{"a":1} x`, ``, ` `, `{"x":[]}  `, `1.0`, `-0`, `1E400`,
		`{` + strings.TrimSuffix(strings.Repeat(`"k":1,`, 1), ",") + `}`,
	} {
		for _, c := range cases {
			agreeStream(t, c, []byte(body))
		}
	}
	// Up to maxStreamMembers members on the stream path, and no further.
	var b strings.Builder
	for i := 0; i <= maxStreamMembers; i++ {
		d := getTokDoc()
		ok := d.tokenize([]byte("{" + b.String() + "}"))
		d.release()
		if ok != (i <= maxStreamMembers) {
			t.Errorf("%d members: tokenized %v", i, ok)
		}
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`"k` + strings.Repeat("x", i) + `":1`)
	}
}

// gateTwins are a gate per identity mode, each with and without the stream
// path.
func gateTwins(t testing.TB) (stream, tree []*Gate) {
	r, err := Load(LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []Identity{{From: FromProperties}, {From: FromEnvelope}, {From: FromPointer}} {
		for _, off := range []bool{false, true} {
			g, err := NewGate(GateConfig{Registry: r, Identity: id, MaxViolations: 5})
			if err != nil {
				t.Fatal(err)
			}
			g.noStream = off
			if off {
				tree = append(tree, g)
			} else {
				stream = append(stream, g)
			}
		}
	}
	return stream, tree
}

// sameCheck fails unless the two gates give the same result for in: the
// same error, or messages with the same identity, text and value.
func sameCheck(t testing.TB, stream, tree *Gate, in Input) {
	t.Helper()
	m1, err1 := stream.Check(in)
	m2, err2 := tree.Check(in)
	if !sameError(err1, err2) {
		t.Fatalf("%s %q: stream path error %v, tree path %v", stream.id.From, in.Body, err1, err2)
	}
	if err1 != nil {
		return
	}
	d1, e1 := m1.Data()
	d2, e2 := m2.Data()
	if m1.Type != m2.Type || m1.Version != m2.Version || !bytes.Equal(m1.Raw, m2.Raw) || e1 != nil || e2 != nil || !reflect.DeepEqual(d1, d2) {
		t.Fatalf("%s %q: stream path %+v (%v), tree path %+v (%v)", stream.id.From, in.Body, m1, e1, m2, e2)
	}
	// Data is decoded once and kept.
	if again, _ := m1.Data(); !sameRef(again, d1) {
		t.Fatalf("Data decoded again")
	}
}

// sameError compares two gate errors but for jsonschema's messages, some of
// which list property names in map order.
func sameError(a, b error) bool {
	var x, y *ValidationError
	if !errors.As(a, &x) || !errors.As(b, &y) {
		return a == nil && b == nil
	}
	if x.Type != y.Type || x.Version != y.Version || x.Reason != y.Reason || x.Truncated != y.Truncated || len(x.Violations) != len(y.Violations) {
		return false
	}
	if x.Reason != ReasonInvalid && x.Detail != y.Detail {
		return false
	}
	for i := range x.Violations {
		if x.Violations[i].Pointer != y.Violations[i].Pointer || x.Violations[i].Keyword != y.Violations[i].Keyword {
			return false
		}
	}
	return true
}

// sameRef reports whether a and b are the same map or slice (or equal
// scalars).
func sameRef(a, b any) bool {
	switch x := a.(type) {
	case map[string]any:
		y, ok := b.(map[string]any)
		return ok && reflect.ValueOf(x).UnsafePointer() == reflect.ValueOf(y).UnsafePointer()
	case []any:
		y, ok := b.([]any)
		return ok && len(x) == len(y) && (len(x) == 0 || &x[0] == &y[0])
	}
	return a == b
}

// FuzzStreamAgrees: the tree-free path against the tree path and
// jsonschema. For arbitrary bytes (and for the document with its at-th
// value replaced by alt, re-encoded, which reaches values deep inside
// valid messages), every registry and testdata/fastpath schema's stream
// verdict equals jsonschema's whenever the body tokenizes, a body only
// tokenizes when decodeJSON accepts it, and a gate in each identity mode
// returns the same message or error with the stream path as without it.
func FuzzStreamAgrees(f *testing.F) {
	alts := []string{`null`, `0`, `-1.5e3`, `""`, `"x"`, `[]`, `{}`, `[1,1]`, `{"a":"b"}`, `"2026-11-29T19:13:25Z"`, `"\u00e9"`, `1.0`}
	for i, ex := range examples(f) {
		f.Add(ex.Body, uint16(3*i+1), []byte(alts[i%len(alts)]), ex.Type, ex.Version)
		env := `{"type":"` + ex.Type + `","schemaVersion":"` + ex.Version + `","data":` + string(ex.Body) + `}`
		f.Add([]byte(env), uint16(i+5), []byte(alts[(i+3)%len(alts)]), "", "")
		ptr := strings.Replace(string(ex.Body), "{", `{"type":"`+ex.Type+`","schemaVersion":`+ex.Version+`,`, 1)
		f.Add([]byte(ptr), uint16(i+7), []byte(alts[(i+5)%len(alts)]), ex.Type, "v"+ex.Version)
	}
	for i, inst := range fastInstances {
		f.Add([]byte(inst), uint16(i), []byte(alts[i%len(alts)]), "orders.created", "2")
	}
	cases := fastPathCases(f)
	stream, tree := gateTwins(f)
	f.Fuzz(func(t *testing.T, body []byte, at uint16, alt []byte, typ, version string) {
		check := func(body []byte) {
			for _, c := range cases {
				agreeStream(t, c, body)
			}
			in := Input{ContentType: "application/json", Type: typ, Headers: map[string]any{"schema-version": version}, Body: body}
			for i := range stream {
				sameCheck(t, stream[i], tree[i], in)
			}
		}
		check(body)
		doc, derr := decodeJSON(body)
		if derr != nil {
			return
		}
		v, derr := decodeJSON(alt)
		if derr != nil {
			return
		}
		n := 0
		check(encode(t, replaceNth(doc, int(at), v, &n)))
	})
}

// TestGateCheckAllocs holds the gate's happy path to a few allocations
// per message: the tree is not built.
func TestGateCheckAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector drops pooled token lists at random")
	}
	stream, tree := gateTwins(t)
	for _, ex := range examples(t) {
		in := Input{ContentType: "application/json", Type: ex.Type, Headers: map[string]any{"schema-version": ex.Version}, Body: ex.Body}
		if _, err := stream[0].Check(in); err != nil {
			t.Fatal(err)
		}
		got := testing.AllocsPerRun(50, func() { _, _ = stream[0].Check(in) })
		old := testing.AllocsPerRun(50, func() { _, _ = tree[0].Check(in) })
		t.Logf("%s v%s: %.0f allocations per Check (tree path %.0f)", ex.Type, ex.Version, got, old)
		// The Message, and for a format value its plain check does not
		// take, the string boxed and what jsonschema's checker allocates
		// (notifications.email has three addresses its plain check
		// leaves to jsonschema).
		if got > old/2 || ex.Type == "orders.created" && got > 1 {
			t.Errorf("%s v%s: %.0f allocations per Check, want at most half the tree path's (and 1 for orders.created)", ex.Type, ex.Version, got)
		}
	}
}

// TestMessageData: Data decodes Raw once, to what the tree path decodes.
func TestMessageData(t *testing.T) {
	t.Parallel()
	m := &Message{Raw: []byte(`{"n":1.0,"a":[1e400]}`)}
	v, err := m.Data()
	want := map[string]any{"n": json.Number("1.0"), "a": []any{json.Number("1e400")}}
	if err != nil || !reflect.DeepEqual(v, want) {
		t.Fatalf("Data = %#v, %v", v, err)
	}
	if again, _ := m.Data(); !sameRef(again, v) {
		t.Error("decoded twice")
	}
	if v, err := (&Message{}).Data(); v != nil || err != nil {
		t.Errorf("no Raw: %v, %v", v, err)
	}
	var derr *decodeError
	if _, err := (&Message{Raw: []byte(`{"a":1,"a":2}`)}).Data(); !errors.As(err, &derr) {
		t.Errorf("duplicate key: %v", err)
	}
}

// TestGateResolve: resolve says what known says, and on nil gives the
// schema Lookup gives and its fast path, for types and versions accepted,
// not accepted, unknown, and spelled otherwise ("v2", " 2").
func TestGateResolve(t *testing.T) {
	t.Parallel()
	r, err := Load(LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var gates []*Gate
	for _, accepts := range []map[string][]string{nil, {"orders.created": {"v2"}, "orders.cancelled": {"1"}}} {
		g, err := NewGate(GateConfig{Registry: r, Accepts: accepts})
		if err != nil {
			t.Fatal(err)
		}
		gates = append(gates, g)
	}
	for _, g := range gates {
		for _, typ := range []string{"orders.created", "orders.cancelled", "notifications.sms", "common", "nope", "", "orders.created "} {
			for _, version := range []string{"1", "2", "3", "v2", "V1", " 2", "2 ", "", "02"} {
				rt, got := g.resolve(typ, version)
				want := g.known(typ, version)
				if !reflect.DeepEqual(got, want) {
					t.Errorf("%q v%q: resolve says %v, known %v", typ, version, got, want)
					continue
				}
				schema, _ := r.Lookup(typ, version)
				if got == nil && (rt.schema != schema || rt.fast != r.fast[schema] || schema == nil) {
					t.Errorf("%q v%q: resolve gives %p (fast %p), Lookup %p (fast %p)", typ, version, rt.schema, rt.fast, schema, r.fast[schema])
				}
			}
		}
	}
}
