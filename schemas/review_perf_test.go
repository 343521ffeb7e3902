package schemas

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/santhosh-tekuri/jsonschema/v5"

	"github.com/dlxbridge/dlxbridge/internal/jsonscan"
)

// TestPropIndexHostileNames: objects whose property names collide under
// propHash (same length and first, middle and last bytes), differ only in
// case or Unicode normalization, are empty, or number past 255, validated
// on the stream path and by jsonschema, with members named exactly, named
// by escapes, duplicated, and named by colliding strangers. The verdicts
// must agree; each schema must keep its fast path.
func TestPropIndexHostileNames(t *testing.T) {
	t.Parallel()
	collide := func(n int) []string { // same length, first, middle and last byte
		var out []string
		for i := 0; len(out) < n; i++ {
			out = append(out, fmt.Sprintf("a%c%cm%c%cz", 'A'+i%26, 'A'+i/26%26, 'a'+i%26, 'a'+i/26%26))
		}
		return out
	}
	many := func(n int) []string {
		var out []string
		for i := range n {
			out = append(out, "p"+strconv.Itoa(i))
		}
		return out
	}
	spread := func(n int) []string { // distinct first, middle and last bytes: an index is built
		var out []string
		for i := range n {
			out = append(out, fmt.Sprintf("%c_x_%c_y_%c", 'A'+i%58, 'a'+(i*7)%26, '0'+(i*3)%43))
		}
		return out
	}
	sets := [][]string{
		spread(3), spread(12), spread(50),
		{""},
		{"", "a"},
		{"a", "A", "é", "e\u0301", "\u00c9"},
		{"ab", "ba", "aab", "abb", "a b", "a\u0000b"},
		collide(2), collide(9), collide(40),
		append(collide(5), many(5)...),
		many(8), many(17), many(255), many(256), many(300),
	}
	for si, names := range sets {
		props := map[string]any{}
		for i, n := range names {
			if i%2 == 0 {
				props[n] = map[string]any{"const": i}
			} else {
				props[n] = map[string]any{"type": "integer"} // takes a stranger's 0, were it taken for n
			}
		}
		req := names
		if len(req) > 3 {
			req = req[:3]
		}
		schema, _ := json.Marshal(map[string]any{"type": "object", "properties": props, "required": req, "additionalProperties": false})
		r, err := loadOne(t, string(schema))
		if err != nil {
			t.Fatal(err)
		}
		s, _ := r.Lookup("t", "1")
		c := fastCase{fmt.Sprintf("set %d", si), s, r.fast[s]}
		if c.fast == nil {
			t.Fatalf("set %d: no fast path: %v", si, r.noFast[s])
		}
		if si < 3 && c.fast.propIndex == nil {
			t.Fatalf("set %d: no property index", si)
		}
		strangers := []string{"", "A", "a", "zz", "e\u0301", "\u00e9", "ab ", " ab", "aXXmxxz", "aZZmzzz", "p", "P0", "p0 ", "p300", "p 1"}
		var bodies []string
		key := func(n string) string { return string(bytes.TrimSpace(encode(t, n))) } // no HTML escapes: an escaped key takes the tree path
		escaped := func(n string) string {                                            // every byte as \u00XX where ASCII
			var b strings.Builder
			b.WriteByte('"')
			for _, r := range n {
				if r < 0x80 {
					fmt.Fprintf(&b, `\u%04x`, r)
				} else {
					b.WriteRune(r)
				}
			}
			b.WriteByte('"')
			return b.String()
		}
		var all, allEsc, wrong bytes.Buffer
		for i, n := range names {
			sep := ","
			if i == 0 {
				sep = ""
			}
			fmt.Fprintf(&all, "%s%s:%d", sep, key(n), i)
			fmt.Fprintf(&allEsc, "%s%s:%d", sep, escaped(n), i)
			fmt.Fprintf(&wrong, "%s%s:%d", sep, key(n), i+1)
		}
		bodies = append(bodies, "{"+all.String()+"}", "{"+allEsc.String()+"}", "{"+wrong.String()+"}")
		for i, n := range names {
			if i > 12 && i%37 != 0 {
				continue
			}
			bodies = append(bodies,
				"{"+all.String()+","+key(n)+":"+strconv.Itoa(i)+"}",     // duplicate
				"{"+all.String()+","+escaped(n)+":"+strconv.Itoa(i)+"}", // duplicate by escapes
				"{"+key(n)+":"+strconv.Itoa(i)+"}",
				"{"+escaped(n)+":"+strconv.Itoa(i+1)+"}",
			)
		}
		for _, cn := range collide(45) {
			strangers = append(strangers, cn)
		}
		near := 0
		for _, n := range names { // same length, first, middle and last byte: another byte changed
			if len(n) >= 4 && near < 40 {
				near++
				b := []byte(n)
				b[1] = "XY"[b[1]&1] // printable: an escaped key takes the tree path
				strangers = append(strangers, string(b))
			}
		}
		for _, x := range strangers {
			bodies = append(bodies, "{"+all.String()+","+key(x)+":0}", "{"+key(x)+":0}")
		}
		for _, b := range bodies {
			agreeStream(t, c, []byte(b))
		}
	}
}

// TestFormatEdgesAgree: uuid and date-time values at the edges of what
// jsonschema's checkers take, each as a member of an object on the stream
// path against jsonschema, and in an escaped spelling.
func TestFormatEdgesAgree(t *testing.T) {
	t.Parallel()
	r, err := loadOne(t, `{"type":"object","properties":{"u":{"type":"string","format":"uuid"},"d":{"type":"string","format":"date-time"}}}`)
	if err != nil {
		t.Fatal(err)
	}
	s, _ := r.Lookup("t", "1")
	c := fastCase{"formats", s, r.fast[s]}
	if c.fast == nil {
		t.Fatal(r.noFast[s])
	}
	uuids := []string{"5f1c9b4e-8d3a-4f7e-9a1b-2c3d4e5f6a7b", "5F1C9B4E-8D3A-4F7E-9A1B-2C3D4E5F6A7B", "{5f1c9b4e-8d3a-4f7e-9a1b-2c3d4e5f6a7b}",
		"5f1c9b4e8d3a-4f7e-9a1b-2c3d4e5f6a7b-", "5f1c9b4e-8d3a4-f7e-9a1b-2c3d4e5f6a7b", "5f1c9b4e-8d3a-4f7e-9a1b-2c3d4e5f6a7", "5f1c9b4e-8d3a-4f7e-9a1b-2c3d4e5f6a7bb",
		"5f1c9b4g-8d3a-4f7e-9a1b-2c3d4e5f6a7b", "5f1c9b4e_8d3a_4f7e_9a1b_2c3d4e5f6a7b", "urn:uuid:5f1c9b4e-8d3a-4f7e-9a1b-2c3d4e5f6a7b", "", "5f1c9b4e-8d3a-4f7e-9a1b-2c3d4e5f6a7\u00e9"}
	dates := []string{"2016-12-31T23:59:60Z", "2016-12-31T23:59:60+00:00", "2017-06-30T23:59:60Z", "2015-02-29T00:00:00Z", "2016-02-29T00:00:00Z",
		"1900-02-29T00:00:00Z", "2000-02-29T00:00:00Z", "0000-01-01T00:00:00Z", "0000-02-29T00:00:00Z", "9999-12-31T23:59:59Z",
		"2026-11-29T19:13:25+24:00", "2026-11-29T19:13:25+23:59", "2026-11-29t19:13:25z", "2026-11-29T19:13:25z", "2026-11-29t19:13:25Z",
		"2026-11-29T19:13:25.Z", "2026-11-29T19:13:25.0Z", "2026-11-29T19:13:25.123456789123Z", "2026-11-29T24:00:00Z", "2026-11-29T23:60:00Z",
		"2026-11-29T19:13:25", "2026-11-29 19:13:25Z", "2026-13-01T00:00:00Z", "2026-00-01T00:00:00Z", "2026-04-31T00:00:00Z", "2026-11-00T00:00:00Z",
		"+2026-11-29T19:13:25Z", "2026-11-29T+1:13:25Z", "2026-11-29T19:13:25ZZ", "2026-11-29T19:13:25.5+01:00", "2026-1-29T19:13:25Z", "２０２６-11-29T19:13:25Z"}
	// The oracle is jsonschema's own checkers: the compiled schema's
	// checkers ask the plain checks first, so they cannot judge them.
	ownUUID, ownDateTime := jsonschema.Formats["uuid"], jsonschema.Formats["date-time"]
	for _, u := range uuids {
		for _, d := range dates {
			want := ownUUID(u) && ownDateTime(d)
			for _, body := range []string{`{"u":` + mustJSON(u) + `,"d":` + mustJSON(d) + `}`, `{"u":"` + escapeAll(u) + `","d":"` + escapeAll(d) + `"}`} {
				tok, valid := streamVerdict(c, []byte(body))
				if !tok {
					t.Fatalf("%s: not tokenized", body)
				}
				doc, derr := decodeJSON([]byte(body))
				if derr != nil {
					t.Fatal(derr)
				}
				if tree := c.slow.Validate(doc) == nil; valid != want || tree != want {
					t.Errorf("%s: stream path valid=%v, tree path %v, jsonschema's own checkers %v", body, valid, tree, want)
				}
			}
		}
	}
}

// escapeAll spells every ASCII character of s as a \u escape.
func escapeAll(s string) string {
	var b strings.Builder
	for _, r := range s {
		if r < 0x80 {
			fmt.Fprintf(&b, `\u%04x`, r)
		} else {
			b.WriteRune(r)
		}
	}
	return b.String()
}

// TestContentTypeEdges: the shortcut for "application/json" changes no
// verdict of checkContentType on spellings next to it.
func TestContentTypeEdges(t *testing.T) {
	t.Parallel()
	for ct, ok := range map[string]bool{
		"application/json": true, "APPLICATION/JSON": true, "application/json ": true, " application/json": true,
		"application/jsonx": false, "application/json; charset=latin1": false, "application/json; charset=utf-8": true,
		"application/json;charset=UTF8": true, "application/json;": true, "application/json\x00": false, "application/vnd.x+json": true,
		"application/json; charset=utf-8; charset=latin1": false, "text/json": false, "": true, " ": true,
	} {
		if got := checkContentType(ct) == nil; got != ok {
			t.Errorf("checkContentType(%q) accepts=%v, want %v", ct, got, ok)
		}
	}
}

// TestTokenStringsAtEveryOffset: strings of 0 to 24 bytes with one hostile
// byte or escape at every offset (control characters, '"', '\\', DEL,
// continuation and lead bytes, overlong and surrogate encodings, lone and
// paired \u surrogates), ending at the buffer's end or just before it, as
// a whole body and as a key and a value of an object. The oracle is
// independent of jsonscan (which decodeJSON uses too): encoding/json for
// syntax and text, utf8.Valid, and unpaired surrogate escapes refused. The
// tokenizer and decodeJSON take exactly what it takes, and read each
// string as encoding/json does.
func TestTokenStringsAtEveryOffset(t *testing.T) {
	t.Parallel()
	specials := []struct {
		s    string
		lone bool // an unpaired surrogate escape, which strict decoding refuses
	}{{"\x00", false}, {"\x1f", false}, {" ", false}, {`"`, false}, {`\`, false}, {"\x7f", false}, {"\x80", false}, {"\xbf", false},
		{"\xc0\x80", false}, {"\xc1\xbf", false}, {"\xc3\xa9", false}, {"\xe0\x80\x80", false}, {"\xed\xa0\x80", false}, {"\xef\xbf\xbf", false},
		{"\xf0\x9f\x98\x80", false}, {"\xf4\x90\x80\x80", false}, {"\xff", false}, {`\"`, false}, {`\\`, false}, {`\/`, false},
		{`\u00e9`, false}, {`\ud800`, true}, {`\udc00`, true}, {`\ud83d\ude00`, false}, {`\ud800\u0041`, true}, {`\u0000`, false},
		{`\x`, false}, {`\u12`, false}, {"\t", false}, {"\n", false}}
	n := 0
	for size := 0; size <= 24; size++ {
		for k := 0; k <= size; k++ {
			for _, sp := range specials {
				s := strings.Repeat("a", k) + sp.s + strings.Repeat("b", size-k)
				for _, body := range []string{`"` + s + `"`, `"` + s, `{"` + s + `":"` + s + `"}`, `["` + s + `"]`, `"` + s + `" `} {
					n += checkTokenString(t, []byte(body), sp.lone)
				}
			}
		}
	}
	if n < 10000 {
		t.Fatalf("only %d bodies tokenized: the test proves little", n)
	}
}

// checkTokenString checks body (a string, or an array or object of
// strings all alike) against the oracle; it returns 1 if it tokenized.
func checkTokenString(t *testing.T, body []byte, lone bool) int {
	t.Helper()
	var ref any
	want := json.Unmarshal(body, &ref) == nil && utf8.Valid(body) && !lone
	_, derr := decodeJSON(body)
	d := getTokDoc()
	defer d.release()
	tok := d.tokenize(body)
	if (derr == nil) != want || tok && !want {
		t.Fatalf("%q: decodeJSON error %v, tokenized %v; the oracle takes it: %v", body, derr, tok, want)
	}
	if !tok {
		return 0 // the tree path decides
	}
	var text string
	switch v := ref.(type) {
	case string:
		text = v
	case []any:
		text = v[0].(string)
	case map[string]any:
		for k := range v {
			text = k
		}
	}
	for i := range d.toks {
		if k := d.toks[i].kind; k == jsonscan.String || k == jsonscan.Key {
			if got := d.str(int32(i)); got != text {
				t.Fatalf("%q: token %d reads %q, encoding/json %q", body, i, got, text)
			}
		}
	}
	return 1
}
