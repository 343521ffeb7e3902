package quarantine

import (
	"bytes"
	"fmt"
	"runtime"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
)

func TestRedactionScrubsHeadersAndFields(t *testing.T) {
	t.Parallel()
	r := Redaction{Headers: []string{"Authorization"}, Fields: []string{"/customer/email", "/items/1/card", "/a~1b", "/missing"}}
	h := amqp.Table{"authorization": "Bearer s3cret", "other": "kept"}
	body := []byte(`{"customer":{"email":"ada@example.com","id":"c1"},"items":[{"card":"1"},{"card":"4111"}],"a/b":"x","big":12345678901234567890}`)
	res := r.Apply(h, body)
	if res.Headers["authorization"] != redactedValue || res.Headers["other"] != "kept" || h["authorization"] != "Bearer s3cret" {
		t.Fatalf("headers %v (input %v)", res.Headers, h)
	}
	for _, leak := range []string{"ada@example.com", "4111", `"x"`} {
		if bytes.Contains(res.Body, []byte(leak)) {
			t.Errorf("body still holds %s: %s", leak, res.Body)
		}
	}
	// Big numbers survive re-encoding exactly (json.Number).
	if !bytes.Contains(res.Body, []byte("12345678901234567890")) || !bytes.Contains(res.Body, []byte(`"card":"1"`)) {
		t.Errorf("body lost data it should keep: %s", res.Body)
	}
	want := []string{"header:authorization", "body:/customer/email", "body:/items/1/card", "body:/a~1b"}
	if fmt.Sprint(res.Changed) != fmt.Sprint(want) || res.Failed != "" {
		t.Fatalf("changed %v failed %q; want %v", res.Changed, res.Failed, want)
	}
}

func TestRedactionKeepsBytesWhenNothingMatches(t *testing.T) {
	t.Parallel()
	body := []byte("{ \"id\" : 1 }")
	res := Redaction{Fields: []string{"/customer/email"}}.Apply(nil, body)
	if !bytes.Equal(res.Body, body) || len(res.Changed) != 0 {
		t.Fatalf("body %q changed %v", res.Body, res.Changed)
	}
	res = Redaction{Fields: []string{"/x"}}.Apply(nil, []byte("not json"))
	if string(res.Body) != "not json" || res.Failed == "" {
		t.Fatalf("non-JSON body: %q failed %q", res.Body, res.Failed)
	}
}

func ExampleRedaction_Apply() {
	r := Redaction{Headers: []string{"authorization"}, Fields: []string{"/customer/email"}}
	res := r.Apply(amqp.Table{"authorization": "Bearer t0ken"}, []byte(`{"customer":{"email":"ada@example.com"},"total":"9.99"}`))
	fmt.Println(string(res.Body))
	fmt.Println(res.Headers["authorization"], res.Changed)
	// Output:
	// {"customer":{"email":"[redacted]"},"total":"9.99"}
	// [redacted] [header:authorization body:/customer/email]
}

// Redaction rewrites the redacted values and nothing else: key order,
// whitespace, escapes and the spelling of numbers stay as received.
func TestRedactionKeepsEveryOtherByte(t *testing.T) {
	t.Parallel()
	r := Redaction{Fields: []string{"/customer/email", "/cards/1", "/x~1y", "/customer/phones"}}
	body := "\n { \"z\" :1.0e+10,\t\"customer\": {\"name\":\"Ad\\u00e9 \\ud83d\\ude00\", \"em\\u0061il\" : \"ada@example.com\" ,\r\n" +
		"  \"phones\": [ \"+44 1\", {\"a\":[]} ], \"email\":\"dup@example.com\"}, \"cards\":[\"4111\", {\"n\":\"4222\"},-0.5E-3],\n" +
		"  \"x/y\":null, \"n\":[1E2,true,false,null,\"\\\"\\\\\"] } \n"
	want := "\n { \"z\" :1.0e+10,\t\"customer\": {\"name\":\"Ad\\u00e9 \\ud83d\\ude00\", \"em\\u0061il\" : \"[redacted]\" ,\r\n" +
		"  \"phones\": \"[redacted]\", \"email\":\"[redacted]\"}, \"cards\":[\"4111\", \"[redacted]\",-0.5E-3],\n" +
		"  \"x/y\":\"[redacted]\", \"n\":[1E2,true,false,null,\"\\\"\\\\\"] } \n"
	res := r.Apply(nil, []byte(body))
	if string(res.Body) != want || res.Failed != "" {
		t.Fatalf("failed %q; body\n%s\nwant\n%s", res.Failed, res.Body, want)
	}
	wantChanged := []string{"body:/customer/email", "body:/cards/1", "body:/x~1y", "body:/customer/phones"}
	if fmt.Sprint(res.Changed) != fmt.Sprint(wantChanged) {
		t.Fatalf("changed %v, want %v", res.Changed, wantChanged)
	}
}

// Every JSON value of a body with trailing data is redacted, each from its
// own root; a body that is not JSON, or over MaxBodyBytes, is kept as
// received with a note; nesting deeper than the gate allows is still JSON.
func TestRedactionOfOddBodies(t *testing.T) {
	t.Parallel()
	deep := strings.Repeat(`{"a":[`, 20000) + strings.Repeat(`]}`, 20000)
	for _, c := range []struct {
		name, body, want, failed string
	}{
		{"trailing value", `{"id":1} {"customer":{"email":"ada@example.com"}}`, `{"id":1} {"customer":{"email":"[redacted]"}}`, ""},
		{"values back to back", `{"customer":{"email":"a@x"}}{"customer":{"email":"b@x"}}`, `{"customer":{"email":"[redacted]"}}{"customer":{"email":"[redacted]"}}`, ""},
		{"deep nesting", `{"deep":` + deep + `,"customer":{"email":"ada@example.com"}}`, `{"deep":` + deep + `,"customer":{"email":"[redacted]"}}`, ""},
		{"deep redacted value", `{"customer":{"email":` + deep + `}}`, `{"customer":{"email":"[redacted]"}}`, ""},
		{"not JSON", `{"customer":{"email":"ada@example.com"}`, "", "not redacted: body is not JSON"},
		{"trailing garbage", `{"customer":{"email":"ada@example.com"}} x`, "", "not redacted: body is not JSON"},
		{"over max_body_bytes", `{"customer":{"email":"ada@example.com"}, "pad":"` + strings.Repeat("x", 100) + `"}`, "", "not redacted: body over max_body_bytes (150 > 100 bytes)"},
		{"empty", ``, ``, ""},
	} {
		res := Redaction{Fields: []string{"/customer/email"}, MaxBodyBytes: 100}.Apply(nil, []byte(c.body))
		if c.name == "deep nesting" || c.name == "deep redacted value" {
			res = Redaction{Fields: []string{"/customer/email"}}.Apply(nil, []byte(c.body))
		}
		want := c.want
		if c.failed != "" {
			want = c.body // kept as received
		}
		if string(res.Body) != want || !strings.HasPrefix(res.Failed, c.failed) || (c.failed == "") != (res.Failed == "") {
			t.Errorf("%s: failed %q (want %q), body %.120q", c.name, res.Failed, c.failed, res.Body)
		}
	}
}

// Redacting a 30 MB body allocates about one copy of it (the output), and
// nothing at all when no field is present or the body is over the limit.
// Not parallel: it reads the process's allocation counter.
func TestRedactionMemoryIsBoundedByTheBody(t *testing.T) {
	const size = 30 << 20
	array := make([]byte, 0, size)
	array = append(array, "[1"...)
	for len(array) < size-1 {
		array = append(array, ",1"...)
	}
	array = append(array, ']')
	object := append(append([]byte(`{"customer":{"email":"ada@example.com"},"items":`), array...), '}')
	r := Redaction{Fields: []string{"/customer/email", "/items/7/x"}}
	for _, c := range []struct {
		name     string
		r        Redaction
		body     []byte
		maxAlloc uint64
		changed  int
	}{
		{"array, nothing to redact", r, array, 1 << 20, 0},
		{"object with a redacted field", r, object, uint64(len(object)) + 1<<20, 1},
		{"over max_body_bytes", Redaction{Fields: r.Fields, MaxBodyBytes: 1 << 20}, object, 1 << 20, 0},
	} {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		res := c.r.Apply(nil, c.body)
		runtime.ReadMemStats(&after)
		if got := after.TotalAlloc - before.TotalAlloc; got > c.maxAlloc {
			t.Errorf("%s: allocated %d bytes for a %d-byte body, want at most %d", c.name, got, len(c.body), c.maxAlloc)
		}
		if len(res.Changed) != c.changed {
			t.Errorf("%s: changed %v (failed %q)", c.name, res.Changed, res.Failed)
		}
	}
}

// A header name to redact is redacted as a key of a table nested in a
// header too (AMQP tables nest, and a producer may put a token there), in
// a copy: the input is not changed.
func TestRedactionScrubsNestedHeaderTables(t *testing.T) {
	t.Parallel()
	r := Redaction{Headers: []string{"token"}}
	inner := amqp.Table{"Token": "s3cret", "user": "ada"}
	h := amqp.Table{
		"auth":  inner,
		"list":  []any{"a", amqp.Table{"token": "s3cret-2"}},
		"plain": "kept",
	}
	res := r.Apply(h, nil)
	if got := fmt.Sprint(res.Headers); strings.Contains(got, "s3cret") {
		t.Fatalf("a nested secret survived: %v", got)
	}
	if res.Headers["auth"].(amqp.Table)["user"] != "ada" || res.Headers["plain"] != "kept" {
		t.Errorf("kept values lost: %v", res.Headers)
	}
	if inner["Token"] != "s3cret" || h["list"].([]any)[1].(amqp.Table)["token"] != "s3cret-2" {
		t.Errorf("the input was changed: %v", h)
	}
	want := []string{"header:auth.Token", "header:list[1].token"}
	if fmt.Sprint(res.Changed) != fmt.Sprint(want) {
		t.Errorf("changed %v, want %v", res.Changed, want)
	}
}

// A table nested deeper than the walk goes cannot be shown free of a
// redacted name: it is replaced whole, not published as received (the
// quarantine publish goes to Q.dead before the record drops deep values).
func TestRedactionReplacesTablesNestedTooDeep(t *testing.T) {
	t.Parallel()
	r := Redaction{Headers: []string{"token"}}
	var v any = amqp.Table{"token": "s3cret"}
	for range maxRedactDepth + 5 {
		v = amqp.Table{"n": v}
	}
	res := r.Apply(amqp.Table{"deep": v, "plain": "kept"}, nil)
	if got := fmt.Sprint(res.Headers); strings.Contains(got, "s3cret") {
		t.Fatalf("a secret nested too deep to check survived: %.200s", got)
	}
	if res.Headers["plain"] != "kept" || len(res.Changed) != 1 || !strings.HasPrefix(res.Changed[0], "header:deep.n.n") {
		t.Errorf("headers %.200v, changed %.200v", res.Headers, res.Changed)
	}
	if !strings.Contains(fmt.Sprint(v), "s3cret") {
		t.Error("the input was changed")
	}
}

// One header frame (128 KiB) can hold 60 tables under 255-byte keys with
// 7000 small tables holding a redacted key below them: a path string per
// value, and one listed per hit, cost about 250 MB for that one delivery.
// Paths are built for hits only, and past maxNestedChanged hits are
// counted, not listed.
func TestRedactionOfAWideDeepHeaderIsBounded(t *testing.T) {
	arr := make([]any, 7000)
	for i := range arr {
		arr[i] = amqp.Table{"token": true}
	}
	var v any = arr
	k := strings.Repeat("k", 255)
	for range 60 {
		v = amqp.Table{k: v}
	}
	r := Redaction{Headers: []string{"token"}}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	res := r.Apply(amqp.Table{"h": v}, nil)
	runtime.ReadMemStats(&after)
	if mb := (after.TotalAlloc - before.TotalAlloc) >> 20; mb > 16 {
		t.Errorf("redacting one header frame allocated %d MB", mb)
	}
	if n := len(res.Changed); n != maxNestedChanged+1 || res.Changed[n-1] != "header:(and 6900 more nested)" {
		t.Errorf("changed has %d entries, last %.80q", n, res.Changed[n-1])
	}
	if strings.Contains(fmt.Sprint(res.Headers), "true") {
		t.Error("a nested value past the listed hits was not redacted")
	}
}
