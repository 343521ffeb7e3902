package quarantine

import (
	"bytes"
	"fmt"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
)

func TestRedactionScrubsHeadersAndFields(t *testing.T) {
	t.Parallel()
	r := Redaction{Headers: []string{"Authorization"}, Fields: []string{"/customer/email", "/items/1/card", "/a~1b", "/missing"}}
	h := amqp.Table{"authorization": "Bearer s3cret", "other": "kept"}
	body := []byte(`{"customer":{"email":"ada@example.com","id":"c1"},"items":[{"card":"1"},{"card":"4111"}],"a/b":"x","big":12345678901234567890}`)
	res := r.Apply(h, body)
	if res.Headers["authorization"] != Redacted || res.Headers["other"] != "kept" || h["authorization"] != "Bearer s3cret" {
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
