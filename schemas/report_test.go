package schemas_test

import (
	"fmt"
	"testing"

	"github.com/dlxbridge/dlxbridge/schemas"
	"github.com/dlxbridge/dlxbridge/triage"
)

// The gate's error is a schema failure to triage.Classify, wrapped or not:
// every failure class takes the same path through the runtime.
func TestValidationErrorClassifiesAsSchema(t *testing.T) {
	t.Parallel()
	_, err := ordersGate(t).Check(orderInput("orders.created", "2", orderV1))
	if err == nil {
		t.Fatal("a v1 body passed as v2")
	}
	for _, e := range []error{err, fmt.Errorf("handler: %w", err), triage.Permanent(err)} {
		if class, _ := triage.Classify(e); class != triage.ClassSchema {
			t.Errorf("Classify(%v) = %q, want %q", e, class, triage.ClassSchema)
		}
	}
}

// CheckReport returns what Check returns, and on a failure also what the
// gate could read of the message.
func TestCheckReport(t *testing.T) {
	t.Parallel()
	orders, notes := ordersGate(t), notificationsGate(t)
	tests := []struct {
		name          string
		gate          *schemas.Gate
		in            schemas.Input
		reason        schemas.Reason // "" = valid
		typ, version  string
		dataHas       string // a member Data must have; "" = Data nil
		dataMustBeNil bool
	}{
		{"valid", orders, orderInput("orders.created", "2", orderV2), "", "orders.created", "2", "orderId", false},
		{"invalid", orders, orderInput("orders.created", "2", orderV1), schemas.ReasonInvalid, "orders.created", "2", "orderId", false},
		{"unknown type", orders, orderInput("orders.shipped", "1", orderV2), schemas.ReasonUnknownType, "orders.shipped", "1", "orderId", false},
		{"missing type", orders, orderInput("", "2", orderV2), schemas.ReasonMissingType, "", "", "orderId", false},
		{"not json", orders, orderInput("orders.created", "2", `{"orderId": `), schemas.ReasonDecode, "orders.created", "2", "", true},
		{"gzip", orders, func() schemas.Input {
			in := orderInput("orders.created", "2", orderV2)
			in.ContentEncoding = "gzip"
			return in
		}(), schemas.ReasonEncoding, "", "", "", true},
		{"envelope data", notes, schemas.Input{Body: []byte(`{"type":"notifications.sms","schemaVersion":"1","data":{"to":"x"}}`)},
			schemas.ReasonInvalid, "notifications.sms", "1", "to", false},
		{"envelope without data", notes, schemas.Input{Body: []byte(`{"type":"notifications.sms","schemaVersion":"1"}`)},
			schemas.ReasonInvalid, "notifications.sms", "1", "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			msg, err := tt.gate.CheckReport(tt.in)
			if msg == nil {
				t.Fatalf("no message (error %v)", err)
			}
			if tt.reason == "" {
				if err != nil {
					t.Fatalf("want valid, got %v", err)
				}
			} else if ve := asValidation(t, err); ve.Reason != tt.reason {
				t.Fatalf("reason %q, want %q (%v)", ve.Reason, tt.reason, ve)
			}
			if msg.Type != tt.typ || msg.Version != tt.version {
				t.Errorf("message is %q v%q, want %q v%q", msg.Type, msg.Version, tt.typ, tt.version)
			}
			if tt.dataMustBeNil {
				if dataOf(t, msg) != nil {
					t.Errorf("Data = %#v, want nil", dataOf(t, msg))
				}
				return
			}
			if _, ok := dataOf(t, msg).(map[string]any)[tt.dataHas]; !ok {
				t.Errorf("Data has no %q: %#v", tt.dataHas, dataOf(t, msg))
			}
		})
	}
}

func TestReadProperties(t *testing.T) {
	t.Parallel()
	long := string(make([]byte, 300))
	tests := []struct {
		name         string
		in           schemas.Input
		header       string
		typ, version string
	}{
		{"both", orderInput(" orders.created ", "v2", ""), "", "orders.created", "2"},
		{"int version", orderInput("t", int64(3), ""), "schema-version", "t", "3"},
		{"other header", schemas.Input{Type: "t", Headers: map[string]any{"v": []byte("4")}}, "v", "t", "4"},
		{"nothing", schemas.Input{}, "", "", ""},
		{"odd version", orderInput("t", map[string]any{"x": 1}, ""), "", "t", ""},
		{"hostile type", schemas.Input{Type: long}, "", long[:197] + "…", ""},
	}
	for _, tt := range tests {
		typ, version := schemas.ReadProperties(tt.in, tt.header)
		if typ != tt.typ || version != tt.version {
			t.Errorf("%s: %q v%q, want %q v%q", tt.name, typ, version, tt.typ, tt.version)
		}
	}
}
