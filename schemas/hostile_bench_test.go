package schemas

import (
	"path/filepath"
	"strings"
	"testing"
)

// hostileBodies are hostile invalid bodies: name, registry dir ("" for the
// embedded one), type, body.
func hostileBodies() []struct{ name, dir, typ, body string } {
	// recur: 62 nested levels, none with the required "n", a 30 KB
	// string at the bottom: every level's own copy fails.
	deep := strings.Repeat(`{"c":`, 62) + `{"s":"` + strings.Repeat("x", 30000) + `"}` + strings.Repeat(`}`, 62)
	// the same, each level valid but the bottom.
	deepOK := strings.Repeat(`{"n":1,"c":`, 62) + `{"s":"` + strings.Repeat("x", 30000) + `"}` + strings.Repeat(`}`, 62)
	// many small invalid nodes in a list at depth
	var list strings.Builder
	list.WriteString(strings.Repeat(`{"c":`, 30) + `{"l":[`)
	for i := 0; i < 2500; i++ {
		if i > 0 {
			list.WriteByte(',')
		}
		list.WriteString(`{"n":-1}`)
	}
	list.WriteString(`]}` + strings.Repeat(`}`, 30))
	// orders.created v2: no total, 1000 empty line items
	items := strings.TrimSuffix(strings.Repeat(`{},`, 1000), ",")
	orders := `{"orderId":"x","lineItems":[` + items + `]}`
	return []struct{ name, dir, typ, body string }{
		{"recur-deep-missing", "hostile", "recur", deep},
		{"recur-deep-bottom", "hostile", "recur", deepOK},
		{"recur-list", "hostile", "recur", list.String()},
		{"orders-empty-items", "", "orders.created", orders},
		{"orders-10k-empty-items", "", "orders.created", `{"orderId":"x","lineItems":[` + strings.TrimSuffix(strings.Repeat(`{},`, 10000), ",") + `]}`},
	}
}

func BenchmarkHostileInvalid(b *testing.B) {
	for _, c := range hostileBodies() {
		opts := LoadOptions{}
		version := "2"
		if c.dir != "" {
			opts = LoadOptions{Dir: filepath.Join("testdata", c.dir), NoEmbedded: true}
			version = "1"
		}
		g, full := gateAndOracle(b, opts)
		in := Input{ContentType: "application/json", Type: c.typ, Headers: map[string]any{"schema-version": version}, Body: []byte(c.body)}
		got, want := gateErr(g, in), gateErr(full, in)
		if want == nil || !sameViolations(got, want) {
			b.Fatalf("%s (%d bytes): invalid path %s, full %s", c.name, len(c.body), mustJSON(got), mustJSON(want))
		}
		for _, p := range []struct {
			name string
			g    *Gate
		}{{"new", g}, {"full", full}} {
			b.Run(c.name+"/"+p.name, func(b *testing.B) {
				b.ReportAllocs()
				for i := 0; i < b.N; i++ {
					_, _ = p.g.Check(in)
				}
			})
		}
	}
}
