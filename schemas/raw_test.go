package schemas_test

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"

	"github.com/dlxbridge/dlxbridge/schemas"
)

// TestMessageRawIsTheTextOfData: in every identity mode, and from Check and
// CheckReport, Message.Raw is the JSON text Data was decoded from, so a
// struct decodes from it in one pass.
func TestMessageRawIsTheTextOfData(t *testing.T) {
	t.Parallel()
	r := registry(t)
	sms := `{"notificationId":"5f1c9b4e-8d3a-4f7e-9a1b-2c3d4e5f6a7b","to":"+4915112345678","text":"data \"data\": {}"}`
	tests := []struct {
		name string
		id   schemas.Identity
		in   schemas.Input
		want string // Raw, exactly
	}{
		{"properties", schemas.Identity{From: schemas.FromProperties}, orderInput("notifications.sms", "1", " "+sms+"\n"), " " + sms + "\n"},
		{"pointer", schemas.Identity{From: schemas.FromPointer, TypePointer: "/meta/type", VersionPointer: "/meta/v"},
			orderInput("", nil, `{"meta":{"type":"common","v":1},"data":{"x":1}}`), `{"meta":{"type":"common","v":1},"data":{"x":1}}`},
		{"envelope, data last", schemas.Identity{From: schemas.FromEnvelope},
			orderInput("", nil, `{"type":"notifications.sms","schemaVersion":"1","data": `+sms+` }`), sms},
		{"envelope, data first", schemas.Identity{From: schemas.FromEnvelope},
			orderInput("", nil, "{\"data\":\t"+sms+",\n\"type\":\"notifications.sms\",\"dataschema\":\"https://x/v1.json\"}"), sms},
		{"envelope, data not an object", schemas.Identity{From: schemas.FromEnvelope},
			orderInput("", nil, `{"type":"common","schemaVersion":1,"data":[{"data":2}]}`), `[{"data":2}]`},
	}
	for _, tt := range tests {
		g, err := schemas.NewGate(schemas.GateConfig{Registry: r, Identity: tt.id})
		if err != nil {
			t.Fatal(err)
		}
		m, err := g.Check(tt.in)
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		if string(m.Raw) != tt.want {
			t.Errorf("%s: Raw = %q, want %q", tt.name, m.Raw, tt.want)
		}
		sameValue(t, tt.name, m)
	}

	// A message CheckReport hands on despite its failure has them too.
	g, err := schemas.NewGate(schemas.GateConfig{Registry: r, Identity: schemas.Identity{From: schemas.FromEnvelope}})
	if err != nil {
		t.Fatal(err)
	}
	bad := `{"notificationId":"x","text":""}`
	m, err := g.CheckReport(orderInput("", nil, `{"type":"notifications.sms","schemaVersion":"1","data":`+bad+`}`))
	if err == nil || m == nil || string(m.Raw) != bad {
		t.Fatalf("CheckReport: %v, Raw %q, want %q", err, m.Raw, bad)
	}
	sameValue(t, "report", m)
}

// sameValue fails unless m.Raw decodes to m.Data.
func sameValue(t *testing.T, name string, m *schemas.Message) {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(m.Raw))
	dec.UseNumber()
	var again any
	if err := dec.Decode(&again); err != nil || !reflect.DeepEqual(again, dataOf(t, m)) {
		t.Errorf("%s: Raw decodes to %v (%v), Data is %v", name, again, err, dataOf(t, m))
	}
}
