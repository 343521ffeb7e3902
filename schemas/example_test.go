package schemas_test

import (
	"errors"
	"fmt"

	"github.com/dlxbridge/dlxbridge/schemas"
)

func ExampleGate_Check() {
	reg, err := schemas.Load(schemas.LoadOptions{})
	if err != nil {
		panic(err)
	}
	gate, err := schemas.NewGate(schemas.GateConfig{
		Registry: reg,
		Identity: schemas.Identity{From: schemas.FromEnvelope},
		Accepts:  map[string][]string{"notifications.sms": {"1"}},
	})
	if err != nil {
		panic(err)
	}

	msg, err := gate.Check(schemas.Input{
		ContentType: "application/cloudevents+json",
		Body: []byte(`{"type": "notifications.sms", "schemaVersion": "1", "data": {
			"notificationId": "5f1c9b4e-8d3a-4f7e-9a1b-2c3d4e5f6a7b",
			"to": "+4915112345678", "text": "Your parcel is on its way."}}`),
	})
	data, _ := msg.Data() // decoded on first use; handlers that Bind never pay for it
	fmt.Println(msg.Type, msg.Version, data.(map[string]any)["text"], err)

	_, err = gate.Check(schemas.Input{
		ContentType: "application/cloudevents+json",
		Body: []byte(`{"type": "notifications.sms", "schemaVersion": "1", "data": {
			"notificationId": "not-a-uuid", "to": "+4915112345678", "text": ""}}`),
	})
	var verr *schemas.ValidationError
	if errors.As(err, &verr) {
		fmt.Println(verr.Reason)
		for _, v := range verr.Violations {
			fmt.Println(v)
		}
	}

	_, err = gate.Check(schemas.Input{Body: []byte(`{"type": "notifications.sms", "schemaVersion": "7", "data": {}}`)})
	fmt.Println(err)
	// Output:
	// notifications.sms 1 Your parcel is on its way. <nil>
	// invalid
	// /data/notificationId format: value is not valid 'uuid'
	// /data/text minLength: length must be >= 1, but got 0
	// schema failure for notifications.sms v7: unknown_version: version "7" of notifications.sms is not in the schema registry
}
