package consumer

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"testing"

	"github.com/dlxbridge/dlxbridge/schemas"
)

// decodeAsBefore is what Message.Data held before it became lazy: the value
// encoding/json decodes with UseNumber.
func decodeAsBefore(t *testing.T, text string) any {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader([]byte(text)))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

// gatedMessage is m as runHandler builds it from what the gate returned.
func gatedMessage(gm *schemas.Message, gerr error, body []byte) *Message {
	m := &Message{Type: gm.Type, Version: gm.Version, OriginalVersion: gm.Version, text: gm.Raw, gated: *gm, Body: body}
	var verr *schemas.ValidationError
	if errors.As(gerr, &verr) {
		m.GateError = verr
	}
	return m
}

// TestDataIsDecodedOnDemandOnce: Data decodes the gate's text on its first
// call, to the value Data held when the gate built it up front, and returns
// that same value after; in report mode it is the data as far as the gate
// read them, or an error wrapping GateError; after an upcast, the
// upcasters' result, which the upcasters got decoded.
func TestDataIsDecodedOnDemandOnce(t *testing.T) {
	t.Parallel()
	reg, err := schemas.Load(schemas.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	const data = `{"notificationId":"5f1c9b4e-8d3a-4f7e-9a1b-2c3d4e5f6a7b","to":"+4915112345678","text":"Your parcel\u00a0is on its way.","n":[1.0,1e400]}`
	const valid = `{"notificationId":"5f1c9b4e-8d3a-4f7e-9a1b-2c3d4e5f6a7b","to":"+4915112345678","text":"Your parcel\u00a0is on its way."}`
	props := func(body string) schemas.Input {
		return schemas.Input{Type: "notifications.sms", Headers: map[string]any{"schema-version": "1"}, Body: []byte(body)}
	}
	for _, from := range []string{schemas.FromProperties, schemas.FromEnvelope} {
		g, err := schemas.NewGate(schemas.GateConfig{Registry: reg, Identity: schemas.Identity{From: from}})
		if err != nil {
			t.Fatal(err)
		}
		in := func(body string) schemas.Input {
			if from == schemas.FromEnvelope {
				return schemas.Input{Body: []byte(`{"type":"notifications.sms","schemaVersion":"1","data":` + body + `}`)}
			}
			return props(body)
		}

		gm, err := g.Check(in(valid))
		if err != nil {
			t.Fatal(err)
		}
		m := gatedMessage(gm, nil, in(valid).Body)
		v, err := m.Data()
		if err != nil || !reflect.DeepEqual(v, decodeAsBefore(t, valid)) {
			t.Fatalf("%s: Data = %#v, %v", from, v, err)
		}
		v.(map[string]any)["text"] = "changed by the handler"
		if again, _ := m.Data(); again.(map[string]any)["text"] != "changed by the handler" {
			t.Errorf("%s: Data decoded again", from)
		}

		// Report mode: an invalid message's data as far as the gate read
		// them (numbers as json.Number, exact).
		gm, gerr := g.CheckReport(in(data))
		if gerr == nil {
			t.Fatalf("%s: %s passed", from, data)
		}
		m = gatedMessage(gm, gerr, in(data).Body)
		if v, err := m.Data(); err != nil || !reflect.DeepEqual(v, decodeAsBefore(t, data)) {
			t.Errorf("%s: report mode: Data = %#v, %v", from, v, err)
		}
		gm, gerr = g.CheckReport(in(`{"text":`))
		m = gatedMessage(gm, gerr, in(`{"text":`).Body)
		if v, err := m.Data(); v != nil || err == nil || !errors.Is(err, m.GateError) {
			t.Errorf("%s: report mode, not JSON: Data = %#v, %v; want an error wrapping GateError", from, v, err)
		}
	}

	// An upcaster gets the decoded value; Data is then its result.
	g, err := schemas.NewGate(schemas.GateConfig{Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	gm, err := g.Check(props(valid))
	if err != nil {
		t.Fatal(err)
	}
	m := gatedMessage(gm, nil, props(valid).Body)
	var got any
	upcast := upcaster{to: "1", fn: func(d any) (any, error) {
		got = d
		out := map[string]any{}
		for k, v := range d.(map[string]any) {
			out[k] = v
		}
		out["text"] = "upcast"
		return out, nil
	}}
	qr := &queueRuntime{deps: &deps{cfg: &Config{Registry: reg}}}
	if err := qr.upcast(m, []upcaster{upcast}); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, decodeAsBefore(t, valid)) {
		t.Errorf("the upcaster got %#v", got)
	}
	if v, err := m.Data(); err != nil || v.(map[string]any)["text"] != "upcast" {
		t.Errorf("after the upcast: Data = %#v, %v", v, err)
	}
	var s bindSMS
	if err := m.Bind(&s); err != nil || s.Text != "upcast" {
		t.Errorf("after the upcast: Bind = %+v, %v", s, err)
	}
}
