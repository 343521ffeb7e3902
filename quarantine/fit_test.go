package quarantine

import (
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Sizes worked out by hand from amqp091-go's writeTable/writeField: 4-byte
// table length; per field 1+len(key) key, 1 tag, then the value.
func TestEncodedSizeFollowsTheWireEncoding(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		tbl  amqp.Table
		want int
	}{
		{"empty", amqp.Table{}, 4},
		{"string", amqp.Table{"s": "héllo"}, 4 + (1 + 1 + 1 + 4 + 6)},
		{"bytes", amqp.Table{"b": []byte{1, 2, 3}}, 4 + (1 + 1 + 1 + 4 + 3)},
		{"ints", amqp.Table{"a": int32(7), "b": int64(-9), "c": 5, "d": int16(2), "e": int8(1)}, 4 + 5*3 + 4 + 8 + 4 + 2 + 1},
		{"float bool time nil", amqp.Table{"f": 1.5, "t": true, "ts": time.Unix(1700000000, 0), "n": nil}, 4 + (3 + 8) + (3 + 1) + (4 + 8) + (3 + 0)},
		{"array of tables", amqp.Table{"x": []any{amqp.Table{"q": "a"}}}, 4 + (1 + 1 + 1) + 4 + (1 + (4 + (1 + 1 + 1 + 4 + 1)))},
		{"nested table", amqp.Table{"n": amqp.Table{"k": "v"}}, 4 + (1 + 1 + 1) + (4 + (1 + 1 + 1 + 4 + 1))},
	}
	for _, c := range cases {
		if got := EncodedSize(c.tbl); got != c.want {
			t.Errorf("%s: EncodedSize %d, want %d", c.name, got, c.want)
		}
	}
}

func TestFitHeadersDropsLargestUnprotectedFirst(t *testing.T) {
	t.Parallel()
	h := amqp.Table{
		"huge-app-header":    strings.Repeat("x", 120_000),
		"medium-app-header":  strings.Repeat("y", 20_000),
		"small":              "z",
		HeaderReason:         strings.Repeat("r", 2000),
		"dlxbridge-attempts": int64(3),
		"traceparent":        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
	}
	keep := func(k string) bool { return strings.HasPrefix(k, "dlxbridge-") || k == "traceparent" }
	budget := HeaderBudget(DefaultFrameSize)
	dropped := FitHeaders(h, budget, keep)
	if len(dropped) != 1 || dropped[0] != "huge-app-header" {
		t.Fatalf("dropped %v, want just the huge header", dropped)
	}
	if EncodedSize(h) > budget || h["medium-app-header"] == nil || h[HeaderReason] == nil {
		t.Fatalf("size %d > %d or kept the wrong ones: %v", EncodedSize(h), budget, dropped)
	}
	if FitHeaders(h, budget, keep) != nil {
		t.Fatal("a table that fits lost headers")
	}
}
