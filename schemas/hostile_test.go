package schemas_test

import (
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dlxbridge/dlxbridge/schemas"
)

// Hostile inputs. Each must end in a classified ValidationError (or be valid
// where it legitimately is) within a bounded time and memory. These tests are
// not parallel so the allocation figures are their own.

// bounded runs check and fails if it takes longer than maxTime or allocates
// more than maxAlloc bytes. The limits are generous (the race detector
// slows things down by an order of magnitude); they catch blow-ups, not
// regressions.
// bounded runs check and fails when it allocates more than maxAlloc bytes:
// the allocation count is what bounds the gate's work on hostile input, and
// unlike elapsed time it does not depend on how busy the machine is. Time is
// only logged, and checked against hangGuard, far above any honest run.
const hangGuard = time.Minute

func bounded(t *testing.T, maxAlloc uint64, check func()) {
	t.Helper()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	start := time.Now()
	check()
	took := time.Since(start)
	runtime.ReadMemStats(&after)
	alloc := after.TotalAlloc - before.TotalAlloc
	t.Logf("took %v, allocated %d KiB", took, alloc>>10)
	if took > hangGuard {
		t.Errorf("took %v: the gate hung on hostile input (guard %v)", took, hangGuard)
	}
	if alloc > maxAlloc {
		t.Errorf("allocated %d bytes, limit %d", alloc, maxAlloc)
	}
}

func wantReason(t *testing.T, err error, want schemas.Reason) *schemas.ValidationError {
	t.Helper()
	ve := asValidation(t, err)
	if ve.Reason != want {
		t.Fatalf("reason %s, want %s: %v", ve.Reason, want, ve)
	}
	return ve
}

func TestHostileDeepNesting(t *testing.T) {
	g := ordersGate(t)
	for _, body := range []string{
		strings.Repeat("[", 500_000) + strings.Repeat("]", 500_000),
		strings.Repeat(`{"a":`, 170_000) + "1" + strings.Repeat("}", 170_000),
		`{"note":` + strings.Repeat("[", 1_000_000), // unterminated
	} {
		in := orderInput("orders.created", "2", body)
		bounded(t, 1<<20, func() {
			_, err := g.Check(in)
			ve := wantReason(t, err, schemas.ReasonDecode)
			if !strings.Contains(ve.Detail, "nesting too deep") {
				t.Errorf("detail %q", ve.Detail)
			}
		})
	}
}

func TestHostileHugeArray(t *testing.T) {
	g := ordersGate(t)
	// ~1 MiB: half a million numbers where objects are expected, far beyond
	// maxItems.
	items := strings.TrimSuffix(strings.Repeat("0,", 520_000), ",")
	body := strings.Replace(orderV1, `[{"sku": "BOOK-0042", "quantity": 1}]`, "["+items+"]", 1)
	in := orderInput("orders.created", "1", body)
	bounded(t, 64<<20, func() {
		_, err := g.Check(in)
		ve := wantReason(t, err, schemas.ReasonInvalid)
		if len(ve.Violations) != 1 || ve.Violations[0].Pointer != "/items" || ve.Violations[0].Keyword != "maxItems" {
			t.Errorf("violations %v", ve.Violations)
		}
	})
	// Within maxItems, every element wrong: the violations are capped.
	items = strings.TrimSuffix(strings.Repeat(`{"sku":"-","quantity":0},`, 500), ",")
	in = orderInput("orders.created", "1", strings.Replace(orderV1, `[{"sku": "BOOK-0042", "quantity": 1}]`, "["+items+"]", 1))
	bounded(t, 64<<20, func() {
		_, err := g.Check(in)
		ve := wantReason(t, err, schemas.ReasonInvalid)
		if len(ve.Violations) != schemas.DefaultMaxViolations || !ve.Truncated {
			t.Errorf("%d violations, truncated %v", len(ve.Violations), ve.Truncated)
		}
	})
}

func TestHostileTenMegabytes(t *testing.T) {
	body := strings.Replace(orderV2, `"Please leave`, `"`+strings.Repeat("A", 10<<20), 1)
	in := orderInput("orders.created", "2", body)
	t.Run("default limit", func(t *testing.T) {
		g := ordersGate(t)
		bounded(t, 64<<10, func() {
			_, err := g.Check(in)
			wantReason(t, err, schemas.ReasonTooLarge)
		})
	})
	t.Run("no limit", func(t *testing.T) {
		g, err := schemas.NewGate(schemas.GateConfig{Registry: registry(t), MaxBodyBytes: -1})
		if err != nil {
			t.Fatal(err)
		}
		bounded(t, 64<<20, func() {
			_, err := g.Check(in)
			ve := wantReason(t, err, schemas.ReasonInvalid)
			if len(ve.Violations) != 1 || ve.Violations[0].Pointer != "/note" || ve.Violations[0].Keyword != "maxLength" {
				t.Errorf("violations %v", ve.Violations)
			}
		})
	})
}

func TestHostileInvalidUTF8(t *testing.T) {
	g := ordersGate(t)
	for _, body := range []string{
		strings.Replace(orderV2, "Hauptstraße", "Hauptstra\xdfe", 1), // Latin-1 ß
		strings.Replace(orderV2, `"note"`, "\"no\xffte\"", 1),        // in a key
		strings.Replace(orderV2, "Berlin", `Berlin\udc00`, 1),        // lone surrogate escape
		"\xff\xfe{}",
	} {
		bounded(t, 1<<20, func() {
			_, err := g.Check(orderInput("orders.created", "2", body))
			wantReason(t, err, schemas.ReasonDecode)
		})
	}
}

func TestHostileDuplicateKeys(t *testing.T) {
	g := ordersGate(t)
	tests := map[string]string{
		// The classic smuggling case: a validator sees one value, a handler
		// decoding differently sees the other.
		strings.Replace(orderV2, `"total": {`, `"total": {"amount": "0.01", "currency": "EUR"}, "total": {`, 1): "/total",
		strings.Replace(orderV2, `"city": "Berlin"`, `"city": "Berlin", "city": "Bonn"`, 1):                     "/shippingAddress/city",
	}
	for body, pointer := range tests {
		bounded(t, 1<<20, func() {
			_, err := g.Check(orderInput("orders.created", "2", body))
			ve := wantReason(t, err, schemas.ReasonDecode)
			if len(ve.Violations) != 1 || ve.Violations[0].Pointer != pointer {
				t.Errorf("violations %v, want pointer %s", ve.Violations, pointer)
			}
		})
	}
	// Many distinct keys are fine for the decoder (and additionalProperties
	// catches them), and do not go quadratic.
	var b strings.Builder
	b.WriteString(strings.TrimSuffix(orderV2, "}"))
	for i := 0; i < 50_000; i++ {
		b.WriteString(`,"k` + strconv.Itoa(i) + `":1`)
	}
	b.WriteString(`}`)
	in := orderInput("orders.created", "2", b.String())
	bounded(t, 64<<20, func() {
		_, err := g.Check(in)
		ve := wantReason(t, err, schemas.ReasonInvalid)
		if len(ve.Violations) != 1 || ve.Violations[0].Keyword != "additionalProperties" || len(ve.Violations[0].Message) > 200 {
			t.Errorf("violations %v", ve.Violations)
		}
	})
}

func TestHostileBigNumbers(t *testing.T) {
	g := ordersGate(t)
	tests := []struct {
		name, from, to string
		reason         schemas.Reason // "" = valid
	}{
		// Beyond float64 (and int64) precision, but a non-negative integer
		// exactly as the schema says: valid, and kept exactly.
		{"huge integer", `3990`, `123456789012345678901234567890123`, ""},
		{"integral float", `3990`, `3990.000000000000000000000001`, schemas.ReasonInvalid},
		{"1.0 is an integer", `3990`, `3990.0`, ""},
		{"beyond float64 range", `"quantity": 1`, `"quantity": 1e400`, schemas.ReasonInvalid},
		{"tiny", `3990`, `1e-400`, schemas.ReasonInvalid},
		{"exponent bomb", `3990`, `1e999999999`, schemas.ReasonDecode},
		{"long literal", `3990`, strings.Repeat("9", 5000), schemas.ReasonDecode},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bounded(t, 4<<20, func() {
				msg, err := g.Check(orderInput("orders.created", "1", strings.Replace(orderV1, tt.from, tt.to, 1)))
				if tt.reason == "" {
					if err != nil {
						t.Fatalf("want valid: %v", err)
					}
					return
				}
				if msg != nil {
					t.Fatal("got a message")
				}
				wantReason(t, err, tt.reason)
			})
		})
	}
	msg, err := g.Check(orderInput("orders.created", "1", strings.Replace(orderV1, `3990`, `123456789012345678901234567890123`, 1)))
	if err != nil {
		t.Fatal(err)
	}
	if got := dataOf(t, msg).(map[string]any)["totalCents"]; got != any(jsonNumber("123456789012345678901234567890123")) {
		t.Errorf("totalCents = %#v, want the exact json.Number", got)
	}
}
