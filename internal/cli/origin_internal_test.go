package cli

import (
	"testing"

	"github.com/dlxbridge/dlxbridge/quarantine"
)

// show names the default exchange instead of leaving a gap that makes the
// routing key read as an exchange.
func TestOriginTextNamesTheDefaultExchange(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		e    quarantine.Envelope
		want string
	}{
		{quarantine.Envelope{}, ""},
		{quarantine.Envelope{OriginalRouting: "ncx.orders", OriginalQueue: "ncx.orders"}, "(default exchange) ncx.orders ncx.orders"},
		{quarantine.Envelope{OriginalExchange: "ncx", OriginalRouting: "order.created", OriginalQueue: "ncx.orders"}, "ncx order.created ncx.orders"},
	} {
		if got := originText(c.e); got != c.want {
			t.Errorf("originText(%+v) = %q, want %q", c.e, got, c.want)
		}
	}
}
