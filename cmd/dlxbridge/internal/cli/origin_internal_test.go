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

// show prints a violation of the whole document as validate does.
func TestViolationTextNamesTheRoot(t *testing.T) {
	t.Parallel()
	if got, want := violationText(quarantine.Violation{Keyword: "required", Message: "missing properties: 'orderId'"}), "(root) required: missing properties: 'orderId'"; got != want {
		t.Errorf("root: %q, want %q", got, want)
	}
	if got, want := violationText(quarantine.Violation{Pointer: "/total", Keyword: "type", Message: "expected object"}), "/total type: expected object"; got != want {
		t.Errorf("pointer: %q, want %q", got, want)
	}
}
