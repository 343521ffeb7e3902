package schemas_test

import (
	"encoding/json"
	"errors"
	"sync"
	"testing"

	"github.com/dlxbridge/dlxbridge/schemas"
)

var (
	regOnce sync.Once
	reg     *schemas.Registry
	regErr  error
)

// registry loads the embedded registry once per test binary.
func registry(t testing.TB) *schemas.Registry {
	t.Helper()
	regOnce.Do(func() { reg, regErr = schemas.Load(schemas.LoadOptions{}) })
	if regErr != nil {
		t.Fatalf("load embedded registry: %v", regErr)
	}
	return reg
}

// asValidation asserts err is a *schemas.ValidationError.
func asValidation(t testing.TB, err error) *schemas.ValidationError {
	t.Helper()
	var ve *schemas.ValidationError
	if !errors.As(err, &ve) {
		t.Fatalf("want *schemas.ValidationError, got %T: %v", err, err)
	}
	return ve
}

// orderV2 is a realistic orders.created v2 body of about 1 KB.
const orderV2 = `{
  "orderId": "5f1c9b4e-8d3a-4f7e-9a1b-2c3d4e5f6a7b",
  "createdAt": "2026-11-29T19:13:25.123Z",
  "customer": {"id": "cus_8842", "email": "jane.doe@example.com", "name": "Jane Doe"},
  "lineItems": [
    {"sku": "BOOK-0042", "name": "The Go Programming Language", "quantity": 1, "unitPrice": {"amount": "39.90", "currency": "EUR"}},
    {"sku": "MUG-0007", "name": "Gopher mug", "quantity": 2, "unitPrice": {"amount": "12.50", "currency": "EUR"}},
    {"sku": "STICKER-0101", "name": "Sticker pack", "quantity": 3, "unitPrice": {"amount": "2.99", "currency": "EUR"}},
    {"sku": "TSHIRT-0013", "name": "T-shirt, size M", "quantity": 1, "unitPrice": {"amount": "24.00", "currency": "EUR"}},
    {"sku": "CABLE-0555", "name": "USB-C cable, 2 m", "quantity": 2, "unitPrice": {"amount": "9.99", "currency": "EUR"}}
  ],
  "total": {"amount": "117.85", "currency": "EUR"},
  "shippingAddress": {"line1": "Hauptstraße 1", "line2": "3. OG", "city": "Berlin", "region": "BE", "postalCode": "10115", "country": "DE"},
  "channel": "web",
  "note": "Please leave the parcel with the neighbour at number 3 if nobody answers the door."
}`

const orderV1 = `{
  "orderId": "5f1c9b4e-8d3a-4f7e-9a1b-2c3d4e5f6a7b",
  "createdAt": "2026-11-29T19:13:25Z",
  "customer": {"id": "cus_8842", "email": "jane.doe@example.com"},
  "items": [{"sku": "BOOK-0042", "quantity": 1}],
  "totalCents": 3990
}`

type jsonNumber = json.Number

// dataOf is m.Data(), which must not fail on a message from the gate.
func dataOf(t testing.TB, m *schemas.Message) any {
	t.Helper()
	v, err := m.Data()
	if err != nil {
		t.Fatalf("Data: %v", err)
	}
	return v
}
