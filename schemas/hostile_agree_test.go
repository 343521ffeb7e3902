package schemas

import (
	"bytes"
	"math/rand"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// hostileNames are property names of the hostile schemas in
// testdata/hostile, and some they do not name.
var hostileNames = []string{"", "~", "/", "~1", "%25", "é", "a b", "x1", "x2", "x~", "%a", "a/", "forbidden",
	"Zed", "p", "q", "c", "u", "n", "o", "k", "t", "f", "a", "r", "d", "x", "y", "z", "bad", "i", "m", "b",
	"0", "12", "l", "s", "af", "rf", "nt", "nf", "e", "cst", "zz"}

var hostileNums = []string{"0", "-0", "1", "1.0", "2", "3", "5", "7", "10", "-1", "1e400", "1e2", "0.1", "0.3",
	"9007199254740993", "18446744073709551616", "18446744073709551617", "1.5", "1e-400", "2.0", "-0.0", "1000", "1001"}

var hostileStrs = []string{``, `a`, `ab`, `abc`, `Zed`, `é`, `ééé`, `x`, `1`, `\u00e9`, `\ud83d\ude00`, `bad`}

func hostileValue(r *rand.Rand, b *bytes.Buffer, depth int) {
	k := r.Intn(10)
	if depth >= 5 && k >= 7 {
		k = r.Intn(7)
	}
	switch k {
	case 0, 1:
		b.WriteString(hostileNums[r.Intn(len(hostileNums))])
	case 2, 3:
		b.WriteString(`"` + hostileStrs[r.Intn(len(hostileStrs))] + `"`)
	case 4:
		b.WriteString([]string{"true", "false"}[r.Intn(2)])
	case 5:
		b.WriteString("null")
	case 6, 7:
		b.WriteByte('[')
		for i, n := 0, r.Intn(6); i < n; i++ {
			if i > 0 {
				b.WriteByte(',')
			}
			hostileValue(r, b, depth+1)
		}
		b.WriteByte(']')
	default:
		hostileObject(r, b, depth)
	}
}

func hostileObject(r *rand.Rand, b *bytes.Buffer, depth int) {
	b.WriteByte('{')
	seen := map[string]bool{}
	for i, n := 0, r.Intn(7); i < n; i++ {
		name := hostileNames[r.Intn(len(hostileNames))]
		if seen[name] && r.Intn(8) != 0 {
			continue
		}
		seen[name] = true
		if i > 0 {
			b.WriteByte(',')
		}
		key := strconv.Quote(name)
		if r.Intn(20) == 0 && name != "" { // an escaped key
			key = `"\u` + strconv.FormatInt(int64(name[0])+0x10000, 16)[1:] + name[1:] + `"`
		}
		b.WriteString(key + ":")
		hostileValue(r, b, depth+1)
	}
	b.WriteByte('}')
}

// TestHostileSchemasAgreeWithFullValidation: random bodies against the hostile schemas in
// testdata/hostile; the gate and the invalid path must give the full
// validation's error exactly.
func TestHostileSchemasAgreeWithFullValidation(t *testing.T) {
	t.Parallel()
	reg, err := Load(LoadOptions{Dir: filepath.Join("testdata", "hostile"), NoEmbedded: true})
	if err != nil {
		t.Fatal(err)
	}
	var cases []violationsCase
	for _, ref := range reg.Refs() {
		s, _ := reg.Lookup(ref.Type, ref.Version)
		if reg.inv[s] == nil {
			t.Errorf("%s: no invalid path: %v", ref.Type, reg.noFast[s])
			continue
		}
		cases = append(cases, violationsCase{ref.Type, 2, reg, s})
	}
	var gates []*Gate
	for _, c := range []gateVariant{{FromProperties, 1, false}, {FromProperties, 0, false}, {FromProperties, 2, true}, {FromEnvelope, 3, false}} {
		gates = append(gates, c.gate(t, reg))
	}
	r := rand.New(rand.NewSource(4))
	n := 20000
	if testing.Short() || raceEnabled {
		n = 3000
	}
	invalid, multi := 0, 0
	for i := 0; i < n; i++ {
		var b bytes.Buffer
		if r.Intn(6) == 0 {
			hostileValue(r, &b, 0)
		} else {
			hostileObject(r, &b, 0)
		}
		body := b.Bytes()
		for _, c := range cases {
			for _, g := range gates {
				full := *g
				full.fullValidate = true
				in := Input{ContentType: "application/json", Type: c.name, Headers: map[string]any{"schema-version": "1"}, Body: body}
				if g.id.From == FromEnvelope {
					in = Input{ContentType: "application/json", Body: []byte(`{"type":"` + c.name + `","schemaVersion":"1","data":` + string(body) + `}`)}
				}
				got, want := gateErr(g, in), gateErr(&full, in)
				if !sameViolations(got, want) {
					t.Fatalf("gate %s %+v max %d: %s:\ninvalid path %s\nfull         %s", c.name, g.id, g.maxViolations, body, mustJSON(got), mustJSON(want))
				}
			}
			doc, derr := decodeJSON(body)
			if derr != nil {
				continue
			}
			switch violationsAgreeText(t, c, doc, body) {
			case 0:
			case 1:
				invalid++
			default:
				invalid++
				multi++
			}
			if t.Failed() {
				t.FailNow()
			}
		}
	}
	t.Logf("%d bodies x %d schemas: %d invalid, %d with several violations", n, len(cases), invalid, multi)
}

// TestGateInvalidPathNoAmplification: a 3 KB orders.created v2 body of
// 1000 empty line items (2000 leaves) must not cost the invalid path more
// allocations than the full validation it replaces (it took 1.8 times as
// many, and about twice the CPU: a jsonschema call, a decode and fast-path
// rechecks per failing item).
func TestGateInvalidPathNoAmplification(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector drops pooled token lists at random")
	}
	g, full := gateAndOracle(t, LoadOptions{})
	body := []byte(`{"orderId":"x","lineItems":[` + strings.TrimSuffix(strings.Repeat(`{},`, 1000), ",") + `]}`)
	in := Input{ContentType: "application/json", Type: "orders.created", Headers: map[string]any{"schema-version": "2"}, Body: body}
	if got, want := gateErr(g, in), gateErr(full, in); want == nil || !sameViolations(got, want) {
		t.Fatalf("invalid path %s, full %s", mustJSON(got), mustJSON(want))
	}
	fast := testing.AllocsPerRun(5, func() { _, _ = g.Check(in) })
	slow := testing.AllocsPerRun(5, func() { _, _ = full.Check(in) })
	t.Logf("%.0f allocations per Check (full validation %.0f)", fast, slow)
	if fast > slow*1.1 {
		t.Errorf("%.0f allocations per Check, more than the full validation's %.0f", fast, slow)
	}
}
