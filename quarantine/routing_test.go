package quarantine

import (
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/wire"
)

// A replay goes through the default exchange, which routes a publish to
// every queue its routing key and its CC and BCC headers name: the copy of
// a record whose message carried a producer's CC (kept as received) must
// not, or the replay would deliver it to whatever queue the producer named.
// The CC a retry into the shared tiers carried goes too: the replay names
// its queue by routing key.
func TestReplayCarriesNoCCOrBCC(t *testing.T) {
	t.Parallel()
	body := []byte(`{}`)
	r := &Record{
		Envelope:   Envelope{Source: SourceBroker, OriginalQueue: "orders"},
		Properties: Properties{MessageID: "m-1"}, Body: body, Exchange: "orders.dead",
		headers: amqp.Table{wire.HeaderCC: []any{"payments"}, wire.HeaderBCC: []any{"audit"}, "keep": "me"},
	}
	h := (&Replayer{}).message(r, body, 0, "why", "orders", nil, "run1").Headers
	for _, k := range []string{wire.HeaderCC, wire.HeaderBCC} {
		if v, has := h[k]; has {
			t.Errorf("the replay carries %s %v", k, v)
		}
	}
	if h["keep"] != "me" {
		t.Errorf("the producer's other headers were dropped: %v", h)
	}
}
