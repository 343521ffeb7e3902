package sidecar

import (
	"bytes"
	"context"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/dlxbridge/dlxbridge/quarantine"
)

// TestScreenshots is scripts/screenshots, not a check: with
// DLXBRIDGE_SCREENSHOTS naming a directory it seeds a quarantine like an
// incident's (on the test broker, under the test's prefix, deleted at the
// end), replays part of one group through the page, and saves the
// overview, a group and a record at 1280 × 900 as PNGs there
// (docs/images for the docs). Without the variable it skips.
func TestScreenshots(t *testing.T) {
	dir := os.Getenv("DLXBRIDGE_SCREENSHOTS")
	if dir == "" {
		t.Skip("saves the docs' screenshots when DLXBRIDGE_SCREENSHOTS names a directory (scripts/screenshots)")
	}
	br := startBrowser(t)
	b := setupPageQueues(t, pageQueue{"orders", ownerPayments}, pageQueue{"billing", ownerBilling})
	orders, billing := &b.cfg.Queues[0], &b.cfg.Queues[1]
	spread := func(n int, over time.Duration) func(int) time.Duration {
		return func(i int) time.Duration {
			return over - time.Duration(i)*over/time.Duration(n) + time.Duration(i*i%7)*time.Minute
		}
	}
	b.seed(orders, seedSpec{N: 14, Fingerprint: "5f0c1d7e9a42", Class: "schema", Reason: "schema test.job v1",
		Error:     "additionalProperties 'amountCents' not allowed",
		Body:      func(i int) string { return fmt.Sprintf(`{"id":"order-%d","amountCents":%d}`, 4100+i, 1200+i*35) },
		MessageID: func(i int) string { return fmt.Sprintf("order-%d", 4100+i) }, Ago: spread(14, 95*time.Minute)})
	b.seed(orders, seedSpec{N: 4, Fingerprint: "a3e81f04c6d2", Error: "422 Unprocessable Entity: customer is flagged bad",
		Body: func(i int) string {
			return fmt.Sprintf(`{"id":"order-%d","customer":{"id":"c-%d","flags":["bad","manual-review"]},"lines":[{"sku":"BK-204","qty":1}]}`, 3990+i%3, 17+i)
		},
		MessageID: func(i int) string { return fmt.Sprintf("order-%d", 3990+i%3) }, Ago: spread(4, 5*time.Hour)})
	b.seed(orders, seedSpec{N: 3, Fingerprint: "0b77c2e5d913", Class: "schema", Reason: "no schema version",
		Error:     "the message has no schema-version header; test.job accepts versions 1",
		Body:      func(i int) string { return fmt.Sprintf(`{"id":"order-%d"}`, 4200+i) },
		MessageID: func(i int) string { return fmt.Sprintf("order-%d", 4200+i) }, Ago: spread(3, 20*time.Minute)})
	b.seed(billing, seedSpec{N: 8, Fingerprint: "c40d9e2b7f18", Class: "transient", Reason: "retries exhausted",
		Error:     "503 Service Unavailable from payments-gateway (Retry-After: 30)",
		Body:      func(i int) string { return fmt.Sprintf(`{"id":"inv-%d"}`, 800+i) },
		MessageID: func(i int) string { return fmt.Sprintf("inv-%d", 800+i) }, Ago: spread(8, 6*time.Hour)})
	b.seed(billing, seedSpec{N: 2, Fingerprint: "91ab3c6e0d57", Class: "timeout", Reason: "handler timeout",
		Error: "the handler did not answer within 30s", Body: func(i int) string { return fmt.Sprintf(`{"id":"inv-%d"}`, 700+i) },
		MessageID: func(i int) string { return fmt.Sprintf("inv-%d", 700+i) }, Ago: spread(2, 26*time.Hour)})
	b.keep(31)

	// Part of the gateway group replayed, as after the gateway came back.
	var gateway []string
	for _, r := range b.snapshot().Records {
		if r.Envelope.Fingerprint == "c40d9e2b7f18" && len(gateway) < 3 {
			gateway = append(gateway, r.ID)
		}
	}
	conn := b.env.Dial("screenshots-replay")
	rp := &quarantine.Replayer{Conn: conn, Config: b.cfg, Registry: b.reg, By: "web:alice", LockWait: 10 * time.Second}
	if _, err := rp.Replay(context.Background(), quarantine.ReplayOptions{Filter: quarantine.Filter{Queue: billing.Name, IDs: gateway},
		Reason: "payments-gateway is back"}); err != nil {
		t.Fatal(err)
	}
	conn.Close()

	srv := b.server("0123456789abcdef-operator")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	save := func(name string) {
		t.Helper()
		br.fitsWidth(name)
		raw := br.screenshot()
		img, err := png.Decode(bytes.NewReader(raw))
		if err != nil {
			t.Fatal(err)
		}
		if s := img.Bounds().Size(); s != (image.Point{1280, 900}) {
			t.Errorf("%s: %v, want 1280×900", name, s)
		}
		var out bytes.Buffer
		if err := (&png.Encoder{CompressionLevel: png.BestCompression}).Encode(&out, paletted(img)); err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, name+".png")
		if err := os.WriteFile(path, out.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: %d bytes", path, out.Len())
	}
	br.open(srv.URL + "/quarantine")
	save("console-overview")
	br.open(srv.URL + "/quarantine/group?" + groupQuery(orders.Name, "permanent", "a3e81f04c6d2").Encode())
	for i, id := range br.all(`#records input[name="id"]`) {
		if i < 2 {
			br.do("POST", "/element/"+id+"/click", map[string]any{}, nil)
		}
	}
	save("console-group")
	var twice *quarantine.Record
	snap := b.snapshot()
	for _, r := range snap.Records {
		if r.Envelope.Fingerprint == "a3e81f04c6d2" && len(snap.History(r)) > 0 && strings.Contains(string(r.Body), "order-3990") {
			twice = r
		}
	}
	if twice == nil {
		t.Fatal("no record with a history")
	}
	br.open(srv.URL + "/quarantine/record/" + twice.ID)
	save("console-record")
}

// paletted maps img onto its 256 most frequent colours, each pixel to the
// nearest of them (no dithering: a page is flat colours and antialiased
// text, which keeps its shape), so that the committed PNGs stay small.
func paletted(img image.Image) *image.Paletted {
	b := img.Bounds()
	count := map[color.RGBA]int{}
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			count[color.RGBAModel.Convert(img.At(x, y)).(color.RGBA)]++
		}
	}
	colors := make([]color.RGBA, 0, len(count))
	for c := range count {
		colors = append(colors, c)
	}
	sort.Slice(colors, func(i, j int) bool {
		if count[colors[i]] != count[colors[j]] {
			return count[colors[i]] > count[colors[j]]
		}
		ci, cj := colors[i], colors[j]
		return uint32(ci.R)<<24|uint32(ci.G)<<16|uint32(ci.B)<<8|uint32(ci.A) < uint32(cj.R)<<24|uint32(cj.G)<<16|uint32(cj.B)<<8|uint32(cj.A)
	})
	pal := make(color.Palette, 0, 256)
	for _, c := range colors[:min(256, len(colors))] {
		pal = append(pal, c)
	}
	out := image.NewPaletted(b, pal)
	index := map[color.RGBA]uint8{}
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			c := color.RGBAModel.Convert(img.At(x, y)).(color.RGBA)
			i, ok := index[c]
			if !ok {
				i = uint8(pal.Index(c))
				index[c] = i
			}
			out.SetColorIndex(x, y, i)
		}
	}
	return out
}
