package quarantine

import (
	"encoding/binary"
	"encoding/json"
	"testing"
	"time"

	"github.com/dlxbridge/dlxbridge/config"
)

// Layout 1 (JSON meta) predates envelope signatures: no keeper ever
// checked one for it, so its records read as unverified whatever the JSON
// says (the docs promise "layouts 1 and 2 ... marked not verified"). A
// "verified": true in a layout-1 meta is someone's claim.
func TestLayout1RecordIsNeverVerified(t *testing.T) {
	t.Parallel()
	d := fullDelivery()
	id, err := RecordID(d)
	if err != nil {
		t.Fatal(err)
	}
	headers, err := EncodeTable(d.Headers)
	if err != nil {
		t.Fatal(err)
	}
	env, _ := Read(d)
	env.Verified = true
	meta, err := json.Marshal(recordMeta{ID: id, Intake: "q.quarantine", StoredAt: time.Now().UTC(), Exchange: d.Exchange,
		RoutingKey: d.RoutingKey, Props: propertiesOf(d), Headers: headers, Envelope: &env})
	if err != nil {
		t.Fatal(err)
	}
	body := append([]byte(recordMagic), binary.BigEndian.AppendUint32(nil, uint32(len(meta)))...)
	body = append(append(body, meta...), d.Body...)
	set := &quarantineSet{cfg: &config.Queue{Name: "q", Quarantine: config.Quarantine{Queue: "q.quarantine"}}}
	r, err := recordFrom(body, 1, set)
	if err != nil {
		t.Fatal(err)
	}
	if r.Envelope.Verified {
		t.Error("a layout-1 record reads as verified")
	}
}
