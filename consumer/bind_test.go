package consumer

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/dlxbridge/dlxbridge/schemas"
)

type bindSMS struct {
	NotificationID string `json:"notificationId"`
	To             string `json:"to"`
	Text           string `json:"text"`
}

// TestBindDecodesTheValidatedTextOnce: Bind decodes the text the gate
// validated (the body, or an envelope's "data") in one json.Unmarshal, with
// no more allocations than that; after an upcast it decodes the new Data.
// Not parallel: testing.AllocsPerRun refuses to run in a parallel test.
func TestBindDecodesTheValidatedTextOnce(t *testing.T) {
	reg, err := schemas.Load(schemas.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	const data = `{"notificationId":"5f1c9b4e-8d3a-4f7e-9a1b-2c3d4e5f6a7b","to":"+4915112345678","text":"Your parcel is on its way."}`
	want := bindSMS{"5f1c9b4e-8d3a-4f7e-9a1b-2c3d4e5f6a7b", "+4915112345678", "Your parcel is on its way."}
	for _, tt := range []struct {
		from string
		in   schemas.Input
	}{
		{schemas.FromProperties, schemas.Input{Type: "notifications.sms", Headers: map[string]any{"schema-version": "1"}, Body: []byte(data)}},
		{schemas.FromEnvelope, schemas.Input{Body: []byte(`{"type":"notifications.sms","schemaVersion":"1","data":` + data + `}`)}},
	} {
		g, err := schemas.NewGate(schemas.GateConfig{Registry: reg, Identity: schemas.Identity{From: tt.from}})
		if err != nil {
			t.Fatal(err)
		}
		gm, verr := g.Check(tt.in)
		if verr != nil {
			t.Fatal(verr)
		}
		// As runHandler builds it.
		m := &Message{Type: gm.Type, Version: gm.Version, text: gm.Raw, gated: *gm, Body: tt.in.Body}
		var got bindSMS
		if err := m.Bind(&got); err != nil || got != want {
			t.Fatalf("%s: Bind = %+v, %v; want %+v", tt.from, got, err, want)
		}
		one := testing.AllocsPerRun(50, func() {
			var s bindSMS
			_ = json.Unmarshal([]byte(data), &s)
		})
		bind := testing.AllocsPerRun(50, func() {
			var s bindSMS
			_ = m.Bind(&s)
		})
		if bind > one {
			t.Errorf("%s: Bind makes %.0f allocations, one json.Unmarshal %.0f", tt.from, bind, one)
		}
	}

	// An upcaster's result has no text: Bind sees it, not the old body.
	qr := &queueRuntime{deps: &deps{cfg: &Config{Registry: reg}}}
	m := &Message{Type: "notifications.sms", Version: "1", OriginalVersion: "0", text: []byte(`{"text":"old"}`), data: map[string]any{}, hasData: true}
	upcast := upcaster{to: "1", fn: func(any) (any, error) {
		return map[string]any{"notificationId": want.NotificationID, "to": want.To, "text": want.Text}, nil
	}}
	if err := qr.upcast(m, []upcaster{upcast}); err != nil {
		t.Fatal(err)
	}
	var got bindSMS
	if err := m.Bind(&got); err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("after an upcast: Bind = %+v, %v; want %+v", got, err, want)
	}
}
