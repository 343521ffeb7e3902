package schemas

import (
	"os"
	"strings"
	"testing"
)

// Hand-picked hostile edits of a valid orders.created v2 (BOM, trailing
// bytes, NUL, 1.0/-0/1e400 integers, duplicate and escaped keys, lone
// surrogates, invalid UTF-8, maxLength in code points, envelope identity
// tricks): the stream path agrees with jsonschema and the tree path.
func TestStreamAgreesOnHostileEdits(t *testing.T) {
	t.Parallel()
	base, err := os.ReadFile("testdata/examples/orders.created/v2.json")
	if err != nil {
		t.Fatal(err)
	}
	b := string(base)
	rep := func(old, new string) string { return strings.Replace(b, old, new, 1) }
	bodies := []string{
		"\ufeff" + b, b + " x", b + "\x00", b + " {}", b + "\n",
		rep(`"quantity": 1,`, `"quantity": 1.0,`), rep(`"quantity": 1,`, `"quantity": -0,`), rep(`"quantity": 1,`, `"quantity": 1e0,`),
		rep(`"quantity": 1,`, `"quantity": 10000.0000000000000001,`), rep(`"quantity": 1,`, `"quantity": 1e400,`),
		rep(`"quantity": 1,`, `"quantity": 0.99999999999999999999,`), rep(`"quantity": 1,`, `"quantity": 10000.00000000000001,`),
		rep(`"quantity": 1,`, `"quantity": 1, "quantity": 2,`), rep(`"quantity": 1,`, `"quantity": 1, "quant\u0069ty": 2,`),
		rep(`"channel": "web"`, `"channel": "w\u0065b"`), rep(`"channel": "web"`, `"channel": "web\u0000"`),
		rep(`"channel": "web"`, `"channel": "\ud800"`), rep(`"note": "Please`, `"note": "\ud83d\ude00Please`),
		rep(`"note": "Please`, `"note": "\udc00\ud83dPlease`), rep(`"note": "Please`, `"note": "`+"\xff"+`Please`),
		rep(`"currency": "EUR"}}`, `"currency": "EUR", "x": 1}}`),
		rep(`"orderId"`, `"order\u0049d"`), rep(`"createdAt": "2026-11-29T19:13:25.123Z"`, `"createdAt": "2026-11-29T19:13:25.123z"`),
		rep(`"createdAt": "2026-11-29T19:13:25.123Z"`, `"createdAt": "2026-02-30T19:13:25Z"`),
		rep(`"createdAt": "2026-11-29T19:13:25.123Z"`, `"createdAt": "2026-11-29T23:59:60Z"`),
		rep(`"email": "jane.doe@example.com"`, `"email": "jane.doe@ex\u0061mple.com"`),
		rep(`"note": "Please leave`, `"note": "`+strings.Repeat("é", 499)+`Please leave`),
		rep(`"note": "Please leave the parcel with the neighbour at number 3 if nobody answers the door."`, `"note": "`+strings.Repeat("\\u00e9", 500)+`"`),
		rep(`"note": "Please leave the parcel with the neighbour at number 3 if nobody answers the door."`, `"note": "`+strings.Repeat("😀", 500)+`"`),
		rep(`"note": "Please leave the parcel with the neighbour at number 3 if nobody answers the door."`, `"note": "`+strings.Repeat("😀", 501)+`"`),
		rep(`"note": "Please leave the parcel with the neighbour at number 3 if nobody answers the door."`, `"note": "`+strings.Repeat("\\ud83d\\ude00", 500)+`"`),
		rep(`"note": "Please leave the parcel with the neighbour at number 3 if nobody answers the door."`, `"note": "`+strings.Repeat("\\ud83d\\ude00", 501)+`"`),
		rep(`"note": "Please leave the parcel with the neighbour at number 3 if nobody answers the door."`, `"note": "`+strings.Repeat("e\u0301", 300)+`"`),
		rep(`"amount": "117.85"`, `"amount": "117.850"`), rep(`"amount": "117.85"`, `"amount": "-0.00"`), rep(`"amount": "117.85"`, `"amount": 117.85`),
		rep(`"postalCode": "10115"`, `"postalCode": "1011５"`), rep(`"country": "DE"`, `"country": "D\u0045"`),
	}
	cases := fastPathCases(t)
	stream, tree := gateTwins(t)
	for _, body := range bodies {
		for _, c := range cases {
			agreeStream(t, c, []byte(body))
		}
		env := `{"type":"orders.created","schemaVersion":"2","data":` + body + `}`
		envs := []string{env, `{"type":"orders.created","schemaVersion":2,"data":` + body + `}`,
			`{"type":"orders.created","schemaVersion":"2","data":` + body + `,"data":{}}`,
			`{"type":"orders.created","schemaVersion":"2","dataschema":"x/v2.json","data":` + body + `}`,
			`{"type":"orders.created","schemaVersion":"02","data":` + body + `}`,
			`{"type":"orders.cre\u0061ted","schemaVersion":"2","data":` + body + `}`,
			`{"type":"orders.created","type":"orders.cancelled","schemaVersion":"2","data":` + body + `}`,
		}
		for _, bb := range append([]string{body}, envs...) {
			in := Input{ContentType: "application/json", Type: "orders.created", Headers: map[string]any{"schema-version": "2"}, Body: []byte(bb)}
			for i := range stream {
				sameCheck(t, stream[i], tree[i], in)
			}
		}
	}
}
