package schemas_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/dlxbridge/dlxbridge/schemas"
)

// ordersGate is the orders queue from config.yaml.
func ordersGate(t testing.TB) *schemas.Gate {
	t.Helper()
	g, err := schemas.NewGate(schemas.GateConfig{
		Registry: registry(t),
		Identity: schemas.Identity{From: schemas.FromProperties},
		Accepts:  map[string][]string{"orders.created": {"1", "2"}, "orders.cancelled": {"1"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// notificationsGate is the notifications queue from config.yaml.
func notificationsGate(t testing.TB) *schemas.Gate {
	t.Helper()
	g, err := schemas.NewGate(schemas.GateConfig{
		Registry: registry(t),
		Identity: schemas.Identity{From: schemas.FromEnvelope},
		Accepts:  map[string][]string{"notifications.email": {"v1"}, "notifications.sms": {"1"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func orderInput(typ string, version any, body string) schemas.Input {
	h := map[string]any{}
	if version != nil {
		h["schema-version"] = version
	}
	return schemas.Input{ContentType: "application/json", Type: typ, Headers: h, Body: []byte(body)}
}

const smsData = `{"notificationId":"5f1c9b4e-8d3a-4f7e-9a1b-2c3d4e5f6a7b","to":"+4915112345678","text":"hi"}`

func TestNewGateChecksConfig(t *testing.T) {
	t.Parallel()
	r := registry(t)
	for name, cfg := range map[string]schemas.GateConfig{
		"no registry":     {},
		"unknown type":    {Registry: r, Accepts: map[string][]string{"nope": {"1"}}},
		"unknown version": {Registry: r, Accepts: map[string][]string{"orders.created": {"1", "9"}}},
		"no versions":     {Registry: r, Accepts: map[string][]string{"orders.created": {}}},
		"bad mode":        {Registry: r, Identity: schemas.Identity{From: "headers"}},
		"bad pointer":     {Registry: r, Identity: schemas.Identity{From: schemas.FromPointer, TypePointer: "type"}},
		"bad max body":    {Registry: r, MaxBodyBytes: -5},
	} {
		if _, err := schemas.NewGate(cfg); err == nil {
			t.Errorf("%s: NewGate accepted it", name)
		} else {
			t.Logf("%s: %v", name, err)
		}
	}
}

func TestGateProperties(t *testing.T) {
	t.Parallel()
	g := ordersGate(t)
	tests := []struct {
		name    string
		in      schemas.Input
		reason  schemas.Reason // "" = valid
		version string
	}{
		{"v2 valid", orderInput("orders.created", "2", orderV2), "", "2"},
		{"v-prefixed version", orderInput("orders.created", "v2", orderV2), "", "2"},
		{"bytes version", orderInput("orders.created", []byte("1"), orderV1), "", "1"},
		{"int32 version", orderInput("orders.created", int32(1), orderV1), "", "1"},
		{"int64 version", orderInput("orders.created", int64(2), orderV2), "", "2"},
		{"float version", orderInput("orders.created", 2.5, orderV2), schemas.ReasonMissingVersion, ""},
		{"content type with charset", func() schemas.Input {
			in := orderInput("orders.created", "2", orderV2)
			in.ContentType = "application/json; charset=utf-8"
			return in
		}(), "", "2"},
		{"vendor json", func() schemas.Input {
			in := orderInput("orders.created", "2", orderV2)
			in.ContentType = "application/vnd.acme.order+json"
			return in
		}(), "", "2"},
		{"no content type", func() schemas.Input {
			in := orderInput("orders.created", "2", orderV2)
			in.ContentType = ""
			return in
		}(), "", "2"},
		{"v1 body as v2", orderInput("orders.created", "2", orderV1), schemas.ReasonInvalid, "2"},
		{"missing type", orderInput("", "2", orderV2), schemas.ReasonMissingType, ""},
		{"missing version", orderInput("orders.created", nil, orderV2), schemas.ReasonMissingVersion, ""},
		{"garbage version", orderInput("orders.created", true, orderV2), schemas.ReasonMissingVersion, ""},
		{"unknown type", orderInput("orders.shipped", "1", orderV2), schemas.ReasonUnknownType, "1"},
		{"future version", orderInput("orders.created", "3", orderV2), schemas.ReasonUnknownVersion, "3"},
		{"type of another queue", orderInput("notifications.sms", "1", smsData), schemas.ReasonNotAccepted, "1"},
		{"xml", func() schemas.Input {
			in := orderInput("orders.created", "2", `<order/>`)
			in.ContentType = "application/xml"
			return in
		}(), schemas.ReasonContentType, ""},
		{"latin-1", func() schemas.Input {
			in := orderInput("orders.created", "2", orderV2)
			in.ContentType = "application/json; charset=iso-8859-1"
			return in
		}(), schemas.ReasonContentType, ""},
		{"gzip", func() schemas.Input {
			in := orderInput("orders.created", "2", orderV2)
			in.ContentEncoding = "gzip"
			return in
		}(), schemas.ReasonEncoding, ""},
		{"not json", orderInput("orders.created", "2", `{"orderId": `), schemas.ReasonDecode, "2"},
		{"empty body", orderInput("orders.created", "2", ``), schemas.ReasonDecode, "2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			msg, err := g.Check(tt.in)
			if tt.reason == "" {
				if err != nil {
					t.Fatalf("want valid, got %v", err)
				}
				if msg.Type != tt.in.Type || msg.Version != tt.version {
					t.Errorf("message is %s v%s, want %s v%s", msg.Type, msg.Version, tt.in.Type, tt.version)
				}
				if _, ok := dataOf(t, msg).(map[string]any)["orderId"]; !ok {
					t.Errorf("Data has no orderId: %#v", dataOf(t, msg))
				}
				return
			}
			if msg != nil {
				t.Errorf("got a message with an error")
			}
			ve := asValidation(t, err)
			if ve.Reason != tt.reason || ve.Version != tt.version {
				t.Errorf("got %s (version %q), want %s (version %q): %v", ve.Reason, ve.Version, tt.reason, tt.version, ve)
			}
		})
	}
}

func TestGateViolations(t *testing.T) {
	t.Parallel()
	g := ordersGate(t)
	body := strings.NewReplacer(
		`"jane.doe@example.com"`, `"jane.doe-secret"`,
		`"amount": "117.85"`, `"amount": 117.85`,
		`"channel": "web"`, `"channel": "fax", "coupon": "X"`,
	).Replace(orderV2)
	_, err := g.Check(orderInput("orders.created", "2", body))
	ve := asValidation(t, err)
	got := map[string]string{}
	for _, v := range ve.Violations {
		got[v.Pointer+" "+v.Keyword] = v.Message
	}
	for _, want := range []string{"/customer/email format", "/total/amount type", "/channel enum", " additionalProperties"} {
		if _, ok := got[want]; !ok {
			t.Errorf("missing violation %q in %v", want, got)
		}
	}
	if strings.Contains(ve.Error(), "jane.doe-secret") || strings.Contains(got["/customer/email format"], "secret") {
		t.Errorf("a violation quotes the offending value: %v", got)
	}
	if ve.Type != "orders.created" || ve.Version != "2" || ve.Truncated {
		t.Errorf("type/version/truncated = %s/%s/%v", ve.Type, ve.Version, ve.Truncated)
	}
	if b, err := json.Marshal(ve.Violations[0]); err != nil || !strings.Contains(string(b), `"pointer":`) {
		t.Errorf("violation JSON = %s, %v", b, err)
	}
	t.Log(ve)
}

func TestGateCapsViolations(t *testing.T) {
	t.Parallel()
	g, err := schemas.NewGate(schemas.GateConfig{Registry: registry(t), MaxViolations: 3})
	if err != nil {
		t.Fatal(err)
	}
	items := strings.TrimSuffix(strings.Repeat(`{"sku":"x","quantity":0},`, 50), ",")
	body := strings.Replace(orderV1, `[{"sku": "BOOK-0042", "quantity": 1}]`, "["+items+"]", 1)
	_, err = g.Check(orderInput("orders.created", "1", body))
	ve := asValidation(t, err)
	if len(ve.Violations) != 3 || !ve.Truncated {
		t.Fatalf("got %d violations (truncated %v), want 3 and truncated", len(ve.Violations), ve.Truncated)
	}
	if !strings.Contains(ve.Error(), "more)") {
		t.Errorf("Error() does not say there is more: %s", ve)
	}
}

func TestGateEnvelope(t *testing.T) {
	t.Parallel()
	g := notificationsGate(t)
	tests := []struct {
		name, body string
		reason     schemas.Reason
		pointer    string
	}{
		{"schemaVersion string", `{"type":"notifications.sms","schemaVersion":"1","data":` + smsData + `}`, "", ""},
		{"schemaVersion number", `{"type":"notifications.sms","schemaVersion":1,"data":` + smsData + `}`, "", ""},
		{"dataschema URL", `{"specversion":"1.0","type":"notifications.sms","dataschema":"https://dlxbridge.dev/schemas/notifications.sms/v1.json","data":` + smsData + `}`, "", ""},
		{"dataschema short", `{"type":"notifications.sms","dataschema":"urn:sms:v1","data":` + smsData + `}`, "", ""},
		{"both agree", `{"type":"notifications.sms","schemaVersion":"v1","dataschema":"x/v1.json","data":` + smsData + `}`, "", ""},
		{"both disagree", `{"type":"notifications.sms","schemaVersion":"1","dataschema":"x/v2.json","data":` + smsData + `}`, schemas.ReasonUnknownVersion, ""},
		{"no type", `{"schemaVersion":"1","data":` + smsData + `}`, schemas.ReasonMissingType, ""},
		{"type not a string", `{"type":7,"schemaVersion":"1","data":` + smsData + `}`, schemas.ReasonMissingType, ""},
		{"not an object", `[1]`, schemas.ReasonMissingType, ""},
		{"no version", `{"type":"notifications.sms","data":` + smsData + `}`, schemas.ReasonMissingVersion, ""},
		{"bad dataschema", `{"type":"notifications.sms","dataschema":"https://x/latest","data":` + smsData + `}`, schemas.ReasonMissingVersion, ""},
		{"future version", `{"type":"notifications.sms","schemaVersion":"2","data":` + smsData + `}`, schemas.ReasonUnknownVersion, ""},
		{"orders type", `{"type":"orders.created","schemaVersion":"2","data":` + orderV2 + `}`, schemas.ReasonNotAccepted, ""},
		{"no data", `{"type":"notifications.sms","schemaVersion":"1"}`, schemas.ReasonInvalid, ""},
		{"invalid data", `{"type":"notifications.sms","schemaVersion":"1","data":{"notificationId":"5f1c9b4e-8d3a-4f7e-9a1b-2c3d4e5f6a7b","to":"+49151","text":"hi"}}`, schemas.ReasonInvalid, "/data/to"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			msg, err := g.Check(schemas.Input{ContentType: "application/cloudevents+json", Body: []byte(tt.body)})
			if tt.reason == "" {
				if err != nil {
					t.Fatalf("want valid, got %v", err)
				}
				if msg.Type != "notifications.sms" || msg.Version != "1" {
					t.Errorf("got %s v%s", msg.Type, msg.Version)
				}
				if _, ok := dataOf(t, msg).(map[string]any)["text"]; !ok {
					t.Errorf("Data is not the envelope's data: %#v", dataOf(t, msg))
				}
				return
			}
			ve := asValidation(t, err)
			if ve.Reason != tt.reason {
				t.Fatalf("reason %s, want %s: %v", ve.Reason, tt.reason, ve)
			}
			if tt.pointer != "" && (len(ve.Violations) == 0 || ve.Violations[0].Pointer != tt.pointer) {
				t.Errorf("violations %v, want pointer %s", ve.Violations, tt.pointer)
			}
		})
	}
}

func TestGatePointer(t *testing.T) {
	t.Parallel()
	g, err := schemas.NewGate(schemas.GateConfig{
		Registry: registry(t),
		Identity: schemas.Identity{From: schemas.FromPointer, TypePointer: "/meta/type", VersionPointer: "/meta/v"},
		Accepts:  map[string][]string{"common": {"1"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	msg, err := g.Check(schemas.Input{Body: []byte(`{"meta":{"type":"common","v":1},"x":[1]}`)})
	if err != nil || msg.Type != "common" || msg.Version != "1" {
		t.Fatalf("got %+v, %v", msg, err)
	}
	for body, want := range map[string]schemas.Reason{
		`{"meta":{"v":1}}`:                           schemas.ReasonMissingType,
		`{"meta":{"type":"common"}}`:                 schemas.ReasonMissingVersion,
		`{"meta":{"type":"common","v":1.5}}`:         schemas.ReasonMissingVersion,
		`{"meta":{"type":"common","v":"v7"}}`:        schemas.ReasonUnknownVersion,
		`{"meta":{"type":"orders.created","v":"1"}}`: schemas.ReasonNotAccepted,
		`"common"`: schemas.ReasonMissingType,
	} {
		_, err := g.Check(schemas.Input{Body: []byte(body)})
		if ve := asValidation(t, err); ve.Reason != want {
			t.Errorf("%s: %s, want %s", body, ve.Reason, want)
		}
	}
}

// No violation quotes an instance value, whichever keyword failed, through
// the gate or through Registry.Validate (which checks upcasters' output):
// violations end up in quarantine headers, fingerprints and logs.
func TestViolationsNeverQuoteValues(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeFile(t, dir, "test.pii/v1.json", `{"type":"object","properties":{
		"email":{"type":"string","format":"email"},
		"code":{"type":"string","pattern":"^[A-Z]+$"},
		"salary":{"type":"number","minimum":100000000},
		"age":{"type":"integer","exclusiveMaximum":3},
		"pin":{"type":"integer","multipleOf":1000000},
		"keys":{"type":"object","propertyNames":{"format":"email"}}}}`)
	reg, err := schemas.Load(schemas.LoadOptions{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	body := `{"email":"ada-secret-1","code":"secret-2","salary":98765432,"age":47113,"pin":4711987,"keys":{"secret-3":1}}`
	// Key names are locations, not values: /keys/secret-3 stays a pointer.
	secrets := []string{"ada-secret-1", "secret-2", "98765432", "47113", "4711987", "'secret-3'"}
	g, err := schemas.NewGate(schemas.GateConfig{Registry: reg, Accepts: map[string][]string{"test.pii": {"1"}}})
	if err != nil {
		t.Fatal(err)
	}
	_, gateErr := g.Check(orderInput("test.pii", "1", body))
	var data any
	if err := json.Unmarshal([]byte(body), &data); err != nil {
		t.Fatal(err)
	}
	for name, err := range map[string]error{"gate": gateErr, "Registry.Validate": reg.Validate("test.pii", "1", data)} {
		ve := asValidation(t, err)
		text := ve.Error()
		for _, v := range ve.Violations {
			text += "\n" + v.String()
		}
		if len(ve.Violations) != 6 {
			t.Errorf("%s: %d violations, want 6:\n%s", name, len(ve.Violations), text)
		}
		for _, s := range secrets {
			if strings.Contains(text, s) {
				t.Errorf("%s: a violation quotes %q:\n%s", name, s, text)
			}
		}
		for _, schemaSide := range []string{"'email'", "^[A-Z]+$", ">= 1e+08", "< 3", "multipleOf 1e+06"} {
			if !strings.Contains(text, schemaSide) {
				t.Errorf("%s: the schema's side %q is gone:\n%s", name, schemaSide, text)
			}
		}
	}
	if err := reg.Validate("test.pii", "1", map[string]any{}); err != nil {
		t.Errorf("valid data: %v", err)
	}
	if ve := asValidation(t, reg.Validate("test.pii", "9", data)); ve.Reason != schemas.ReasonUnknownVersion {
		t.Errorf("unknown version: %v", ve)
	}
}

// jsonschema names the extra properties of an additionalProperties
// violation in map order: the same message gave a different text from call
// to call, in the envelope's violations, the error header and the logs. The
// gate sorts them.
func TestAdditionalPropertiesNamesInOneOrder(t *testing.T) {
	t.Parallel()
	g := ordersGate(t)
	body := strings.Replace(orderV2, `"channel": "web",`,
		`"channel": "web", "zeta": 1, "alpha": 2, "it's": 3, "back\\slash": 4, "a, b": 5, "mid": 6,`, 1)
	in := orderInput("orders.created", "2", body)
	const want = `additionalProperties 'a, b', 'alpha', 'back\\slash', 'it\'s', 'mid', 'zeta' not allowed`
	for range 40 {
		_, err := g.Check(in)
		var verr *schemas.ValidationError
		if !errors.As(err, &verr) || len(verr.Violations) != 1 {
			t.Fatalf("got %v", err)
		}
		if got := verr.Violations[0].Message; got != want {
			t.Fatalf("message\n%s\nwant\n%s", got, want)
		}
	}
}
