package schemas_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/dlxbridge/dlxbridge/schemas"
)

// FuzzGateCheck feeds arbitrary bytes, types and versions to a gate in each
// identity mode. The gate must never panic, and must return either a message
// and no error or no message and a *ValidationError; CheckReport always
// returns a message, and an error exactly when Check does.
func FuzzGateCheck(f *testing.F) {
	for _, seed := range []struct{ body, typ, version string }{
		{orderV2, "orders.created", "2"},
		{orderV1, "orders.created", "1"},
		{orderV1, "orders.created", "v2"},
		{`{"type":"notifications.sms","schemaVersion":"1","data":` + smsData + `}`, "", ""},
		{`{"type":"notifications.email","dataschema":"x/v1.json","data":{}}`, "", ""},
		{`{"type":"orders.cancelled","schemaVersion":1,"orderId":"x"}`, "", ""},
		{`{"a":1,"a":2}`, "orders.cancelled", "1"},
		{"\"\xff\"", "orders.created", "1"},
		{`[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]`, "orders.created", "1"},
		{`{"totalCents":1e999999}`, "orders.created", "1"},
		{`{"totalCents":123456789012345678901234567890}`, "orders.created", "1"},
		{``, "", ""},
	} {
		f.Add([]byte(seed.body), seed.typ, seed.version)
	}
	reg := registry(f)
	var gates []*schemas.Gate
	for _, id := range []schemas.Identity{
		{From: schemas.FromProperties},
		{From: schemas.FromEnvelope},
		{From: schemas.FromPointer},
	} {
		g, err := schemas.NewGate(schemas.GateConfig{Registry: reg, Identity: id, MaxViolations: 5})
		if err != nil {
			f.Fatal(err)
		}
		gates = append(gates, g)
	}
	f.Fuzz(func(t *testing.T, body []byte, typ, version string) {
		in := schemas.Input{ContentType: "application/json", Type: typ, Headers: map[string]any{"schema-version": version}, Body: body}
		for _, g := range gates {
			msg, err := g.Check(in)
			if rm, rerr := g.CheckReport(in); rm == nil || (rerr == nil) != (err == nil) {
				t.Fatalf("CheckReport: message %v, error %v; Check's error %v", rm, rerr, err)
			}
			if err == nil {
				if msg == nil || msg.Type == "" || msg.Version == "" {
					t.Fatalf("no error and message %+v", msg)
				}
				continue
			}
			var ve *schemas.ValidationError
			if msg != nil || !errors.As(err, &ve) {
				t.Fatalf("got message %v and error %T %v", msg, err, err)
			}
			if strings.HasPrefix(ve.Detail, "validator panicked") {
				t.Fatalf("validator panicked: %v", ve)
			}
			if ve.Reason == "" || len(ve.Violations) > 5 || (ve.Truncated && len(ve.Violations) != 5) {
				t.Fatalf("malformed error %+v", ve)
			}
			_ = ve.Error()
		}
	})
}
