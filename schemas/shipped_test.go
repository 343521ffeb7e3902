package schemas_test

import (
	"encoding/json"
	"errors"
	"sort"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v5"
)

// TestShippedSchemas runs valid and invalid instances of every shipped
// schema. want lists the "pointer keyword" pairs of the violations expected
// (order ignored); an empty want means valid.
func TestShippedSchemas(t *testing.T) {
	t.Parallel()
	r := registry(t)
	const (
		uuid  = `"5f1c9b4e-8d3a-4f7e-9a1b-2c3d4e5f6a7b"`
		nowTS = `"2026-11-29T19:13:25Z"`
	)
	tests := []struct {
		name, typ, version, body string
		want                     []string
	}{
		// orders.created v1
		{"v1 valid", "orders.created", "1", orderV1, nil},
		{"v1 missing total", "orders.created", "1", strings.Replace(orderV1, `"totalCents": 3990`, `"x": 1`, 1), []string{" required", " additionalProperties"}},
		{"v1 total not integer", "orders.created", "1", strings.Replace(orderV1, `3990`, `39.9`, 1), []string{"/totalCents type"}},
		{"v1 bad uuid", "orders.created", "1", strings.Replace(orderV1, `5f1c9b4e-8d3a`, `not-a-uuid`, 1), []string{"/orderId format"}},
		{"v1 bad date-time", "orders.created", "1", strings.Replace(orderV1, `2026-11-29T19:13:25Z`, `29/11/2026`, 1), []string{"/createdAt format"}},
		{"v1 bad email", "orders.created", "1", strings.Replace(orderV1, `jane.doe@example.com`, `jane.doe`, 1), []string{"/customer/email format"}},
		{"v1 empty items", "orders.created", "1", strings.Replace(orderV1, `[{"sku": "BOOK-0042", "quantity": 1}]`, `[]`, 1), []string{"/items minItems"}},
		{"v1 zero quantity", "orders.created", "1", strings.Replace(orderV1, `"quantity": 1`, `"quantity": 0`, 1), []string{"/items/0/quantity minimum"}},
		{"v2 body against v1", "orders.created", "1", orderV2, []string{" required", " additionalProperties"}},

		// orders.created v2
		{"v2 valid", "orders.created", "2", orderV2, nil},
		{"v2 minimal", "orders.created", "2", `{"orderId":` + uuid + `,"createdAt":` + nowTS + `,"customer":{"id":"c1","email":"a@b.io"},"lineItems":[{"sku":"ABC","quantity":1,"unitPrice":{"amount":"1","currency":"USD"}}],"total":{"amount":"1","currency":"USD"}}`, nil},
		{"v1 body against v2", "orders.created", "2", orderV1, []string{" required", " additionalProperties"}},
		{"v2 float amount", "orders.created", "2", strings.Replace(orderV2, `"amount": "117.85"`, `"amount": 117.85`, 1), []string{"/total/amount type"}},
		{"v2 lowercase currency", "orders.created", "2", strings.Replace(orderV2, `"amount": "117.85", "currency": "EUR"`, `"amount": "117.85", "currency": "eur"`, 1), []string{"/total/currency pattern"}},
		{"v2 unknown channel", "orders.created", "2", strings.Replace(orderV2, `"channel": "web"`, `"channel": "fax"`, 1), []string{"/channel enum"}},
		{"v2 bad country", "orders.created", "2", strings.Replace(orderV2, `"country": "DE"`, `"country": "Germany"`, 1), []string{"/shippingAddress/country pattern"}},
		{"v2 extra money field", "orders.created", "2", strings.Replace(orderV2, `"amount": "39.90", "currency": "EUR"`, `"amount": "39.90", "currency": "EUR", "fx": 1`, 1), []string{"/lineItems/0/unitPrice additionalProperties"}},

		// orders.cancelled v1
		{"cancelled valid", "orders.cancelled", "1", `{"orderId":` + uuid + `,"cancelledAt":` + nowTS + `,"reason":"customer_request","refund":{"amount":"39.90","currency":"EUR"}}`, nil},
		{"cancelled other with comment", "orders.cancelled", "1", `{"orderId":` + uuid + `,"cancelledAt":` + nowTS + `,"reason":"other","comment":"duplicate order"}`, nil},
		{"cancelled other without comment", "orders.cancelled", "1", `{"orderId":` + uuid + `,"cancelledAt":` + nowTS + `,"reason":"other"}`, []string{" required"}},
		{"cancelled unknown reason", "orders.cancelled", "1", `{"orderId":` + uuid + `,"cancelledAt":` + nowTS + `,"reason":"bored"}`, []string{"/reason enum"}},
		{"cancelled not an object", "orders.cancelled", "1", `[1,2,3]`, []string{" type"}},

		// notifications.email v1
		{"email valid", "notifications.email", "1", `{"notificationId":` + uuid + `,"to":"jane@example.com","cc":["ops@example.com"],"subject":"Your order","template":"order.confirmation","locale":"de-DE","variables":{"orderNo":"A-1","items":3,"gift":false}}`, nil},
		{"email bad to", "notifications.email", "1", `{"notificationId":` + uuid + `,"to":"jane at example","template":"t","locale":"en"}`, []string{"/to format"}},
		{"email duplicate cc", "notifications.email", "1", `{"notificationId":` + uuid + `,"to":"a@b.io","cc":["c@d.io","c@d.io"],"template":"t","locale":"en"}`, []string{"/cc uniqueItems"}},
		{"email nested variable", "notifications.email", "1", `{"notificationId":` + uuid + `,"to":"a@b.io","template":"t","locale":"en","variables":{"x":{"y":1}}}`, []string{"/variables/x type"}},
		{"email bad variable name", "notifications.email", "1", `{"notificationId":` + uuid + `,"to":"a@b.io","template":"t","locale":"en","variables":{"1x":"y"}}`, []string{"/variables/1x pattern"}},

		// notifications.sms v1
		{"sms valid", "notifications.sms", "1", `{"notificationId":` + uuid + `,"to":"+4915112345678","text":"Your parcel is on its way.","sendAfter":` + nowTS + `}`, nil},
		{"sms local number", "notifications.sms", "1", `{"notificationId":` + uuid + `,"to":"015112345678","text":"hi"}`, []string{"/to pattern"}},
		{"sms empty text", "notifications.sms", "1", `{"notificationId":` + uuid + `,"to":"+4915112345678","text":""}`, []string{"/text minLength"}},
		{"sms too long", "notifications.sms", "1", `{"notificationId":` + uuid + `,"to":"+4915112345678","text":"` + strings.Repeat("x", 1601) + `"}`, []string{"/text maxLength"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s, ok := r.Lookup(tt.typ, tt.version)
			if !ok {
				t.Fatalf("no schema %s v%s", tt.typ, tt.version)
			}
			dec := json.NewDecoder(strings.NewReader(tt.body))
			dec.UseNumber()
			var v any
			if err := dec.Decode(&v); err != nil {
				t.Fatalf("test body is not JSON: %v", err)
			}
			got := leaves(s.Validate(v))
			sort.Strings(got)
			sort.Strings(tt.want)
			if strings.Join(got, ",") != strings.Join(tt.want, ",") {
				t.Errorf("violations = %q, want %q", got, tt.want)
			}
		})
	}
}

// leaves lists "instance-location keyword" of each leaf error.
func leaves(err error) []string {
	var ve *jsonschema.ValidationError
	if !errors.As(err, &ve) {
		if err != nil {
			return []string{err.Error()}
		}
		return nil
	}
	var out []string
	var walk func(*jsonschema.ValidationError)
	walk = func(e *jsonschema.ValidationError) {
		if len(e.Causes) == 0 {
			kw := e.KeywordLocation[strings.LastIndex(e.KeywordLocation, "/")+1:]
			out = append(out, e.InstanceLocation+" "+kw)
		}
		for _, c := range e.Causes {
			walk(c)
		}
	}
	walk(ve)
	return out
}
